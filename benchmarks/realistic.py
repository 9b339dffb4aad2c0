"""Figure 7: the training checks on a realistic model, counted in work. examples/llm's clean SFT project with
a ~100M-parameter Llama built from a config (the memory figure's project): ``--dlcheck=train,ckpt,smoke``
against the floor (building the objects plus one training step), with the work the checks caused — forward
and backward passes through the model, optimizer steps — beside the time ratio. The budget (issue 20) is
counted in optimizer steps of the user's model: the whole train/ckpt/smoke set at most 60.

    .venv/bin/python benchmarks/run.py --only realistic
    .venv/bin/python benchmarks/run.py --only realistic --small-model     # the same on a ~2M model"""

from __future__ import annotations

from dataclasses import asdict
from typing import Any

#: the budget: optimizer steps of the user's model over the whole train/ckpt/smoke set
REALISTIC_MAX_STEPS = 60
SELECTION = "train,ckpt,smoke"


def bench_realistic(ctx: Any, size: dict, repeats: int) -> Any:
    from benchmarks import measure, projects, run
    from benchmarks.measure import Summary

    project = projects.memory_project(ctx.workdir / "realistic", size)
    n_params = projects.llama_parameters(320, **size)
    env = ctx.env()
    active = [f"--dlcheck={SELECTION}", project.target, f"--ignore={project.floor_test}"]
    figure = f"--dlcheck={SELECTION} on a {n_params / 1e6:.0f}M SFTTrainer project / floor"
    try:
        runs = ctx.measure(
            {
                "active": ctx.pytest(project.root, active, env, ok_codes=(0, 1)),
                "floor": ctx.pytest(project.root, project.floor_args(), env, floor=True),
            },
            repeats,
        )
    except measure.CommandFailed as exc:
        return run.Row(
            "realistic", figure, "-", "-", "-", f"≤ {REALISTIC_MAX_STEPS} steps", False,
            "could not measure: " + " ".join(str(exc).split())[-600:],
        )  # fmt: skip
    a, b = Summary.of(runs["active"]), Summary.of(runs["floor"])
    text, chosen = run.fmt_ratios(runs["active"], runs["floor"], ctx.metric)
    mid = run.median_run(runs["active"], ctx.metric)
    work = run.passes(mid)
    per_check = {
        nodeid.rsplit("::", 1)[-1].split("_")[0]: item.get("cost", {}).get("optimizer_steps", 0)
        for nodeid, item in mid.info.get("probe", {}).get("items", {}).items()
    }
    heavy = ", ".join(f"{k} {v}" for k, v in sorted(per_check.items(), key=lambda kv: -kv[1]) if v)
    problem = next((run.broken(m) for m in runs["active"] if run.broken(m)), "")
    note = (
        f"checks: {run.fmt_outcomes(run.outcomes(mid))}; work: {work['forward']} forward, {work['backward']} "
        f"backward passes, {work['optimizer_steps']} optimizer steps (floor: 1 forward, 1 backward); optimizer "
        f"steps by check: {heavy or 'none'}; time {run.fmt_time(a)} vs floor {run.fmt_time(b)} ({text})"
    )
    if problem:
        note = f"NOT CLEAN: {problem}; " + note
    return run.Row(
        "realistic",
        figure,
        f"{work['optimizer_steps']} steps",
        "1 step",
        text,
        f"≤ {REALISTIC_MAX_STEPS} steps",
        work["optimizer_steps"] <= REALISTIC_MAX_STEPS and not problem,
        note,
        {
            "active": asdict(a),
            "floor": asdict(b),
            "ratio": chosen,
            "passes": work,
            "steps_by_check": per_check,
            "parameters": n_params,
        },
    )
