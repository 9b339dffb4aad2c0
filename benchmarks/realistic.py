"""Figure 7: the checks on realistic models, counted in work. Three projects, each against its floor (the
same conftest.py building its objects plus one training step: forward, backward and the optimizer's step),
with the work the checks caused — forward and backward passes through the models, optimizer steps, per
check — beside the time ratio:

- ``realistic``: examples/llm's clean SFT project with a ~100M-parameter Llama built from a config (the
  memory figure's project), ``--dlcheck=train,ckpt,smoke``;
- ``realistic-loop``: the same Llama and data trained by a hand-written loop (the plain-loop roles
  ``dlcheck_make_training``, ``dlcheck_dataloader``, ``dlcheck_train_step``, the checkpoint functions),
  ``--dlcheck=train,ckpt,smoke``;
- ``realistic-vision``: a torchvision ResNet-50 (``resnet50(weights=None)``'s shape) on examples/vision's
  shapes at 64×64, ``--dlcheck=vision,train,ckpt,smoke``.

Beside them, ``realistic-memory`` counts memory in training states: the peak RSS of
``--dlcheck=train,ckpt,smoke`` on a plain loop of an 18.9M-parameter MLP with AdamW (one training state =
weights + gradients + the optimizer's moments = 289 MiB) over the floor's, at most one state over it.

The budgets (issue 20) are counted in work: the whole train/ckpt/smoke set at most 60 optimizer steps of
the user's model, and every data domain (llm, vision, diffusion, rl, vlm) at most 10 forward passes —
judged here on the vision project and, by :func:`domain_budget_row`, on every example's active row — and
at most one extra copy of the trainable state in memory: the memory figure judges it on ``--dlcheck=llm``,
these rows on the training checks (peak RSS over the floor's, whose step holds the model, its gradients
and the optimizer's state).

    .venv/bin/python benchmarks/run.py --only realistic,realistic-loop,realistic-vision
    .venv/bin/python benchmarks/run.py --only realistic-loop --small-model     # the same on small models
    .venv/bin/python benchmarks/run.py --only realistic-memory                  # training states over the floor"""

from __future__ import annotations

from dataclasses import asdict
from typing import Any

from benchmarks import measure, projects
from benchmarks.measure import Summary
from benchmarks.rows import (
    Row,
    broken,
    fmt_by_check,
    fmt_outcomes,
    fmt_ratios,
    fmt_time,
    median_run,
    not_measured,
    outcomes,
    passes,
    peak_item,
    time_split,
    work_by_check,
    work_by_domain,
)

#: the budgets: optimizer steps of the user's model over the whole train/ckpt/smoke set; forward passes of
#: a data domain's checks
REALISTIC_MAX_STEPS = 60
DOMAIN_MAX_FORWARD = 10
#: peak RSS over the floor's, in training states (weights, gradients and optimizer moments of the trainable
#: parameters, as the floor's step holds them: the budget's "copy of the trainable state")
MAX_COPIES = 1.0
TRAINING_DOMAINS = ("train", "ckpt", "smoke")
DATA_DOMAINS = ("llm", "vision", "diffusion", "rl", "vlm")
SELECTION = "train,ckpt,smoke"


# ---- one realistic row ------------------------------------------------------------------------------------


def bench_project(ctx: Any, section: str, project: Any, selection: str, figure: str, repeats: int, model: str) -> Any:
    """``--dlcheck=<selection>`` on ``project`` against its floor: time ratio, the work per check, and the
    budgets: train/ckpt/smoke ≤ 60 optimizer steps, each data domain of the selection ≤ 10 forward passes,
    peak RSS ≤ the floor's plus one copy of the trainable state."""
    env = ctx.env(DLBENCH_FLOOR_OPTIMIZER="1", DLBENCH_RSS="1")  # VmHWM after each check: where the peak was
    active = [f"--dlcheck={selection}", project.target, f"--ignore={project.floor_test}"]
    data_domains = [d for d in selection.split(",") if d in DATA_DOMAINS]
    budget = (
        f"≤ {REALISTIC_MAX_STEPS} steps"
        + (f"; ≤ {DOMAIN_MAX_FORWARD} fwd per {'/'.join(data_domains)}" if data_domains else "")
        + f"; RSS ≤ +{MAX_COPIES:g} copy"
    )
    try:
        runs = measure_against_floor(ctx, project, active, env, repeats)
    except measure.CommandFailed as exc:
        return not_measured(section, figure, budget, exc)
    a, b = Summary.of(runs["active"]), Summary.of(runs["floor"])
    text, chosen = fmt_ratios(runs["active"], runs["floor"], ctx.metric)
    mid = median_run(runs["active"], ctx.metric)
    work = passes(mid)
    by_check = work_by_check(mid)
    by_domain = work_by_domain(mid)
    steps = sum(by_domain.get(d, {}).get("optimizer_steps", 0) for d in TRAINING_DOMAINS)
    forward = {d: by_domain.get(d, {}).get("forward", 0) for d in data_domains}
    floor = median_run(runs["floor"], ctx.metric).info.get("floor", {})
    floor_step = "1 forward, 1 backward, 1 optimizer step" if floor.get("optimizer_step") else "1 forward, 1 backward"
    problem = next((broken(m) for m in runs["active"] if broken(m)), "")
    trainable = floor.get("trainable_bytes", 0) / 2**20
    # the unit of the budget: one training state as the floor's step holds it (trainable weights, their
    # gradients and the optimizer's per-parameter tensors); the weights alone when the floor could not say
    state = floor.get("training_state_bytes", 0) / 2**20
    unit = state or trainable
    what = f"the {state:.0f} MiB training state" if state else f"the {trainable:.0f} MiB trainable weights"
    extra = a.max_rss_mb - b.max_rss_mb
    copies = extra / unit if unit else float("inf")
    over = [f"{steps} optimizer steps over {REALISTIC_MAX_STEPS}"] if steps > REALISTIC_MAX_STEPS else []
    over += [f"{d}: {n} forward passes over {DOMAIN_MAX_FORWARD}" for d, n in forward.items() if n > DOMAIN_MAX_FORWARD]
    if copies > MAX_COPIES:
        over.append(f"peak RSS {extra:+.0f} MiB over the floor's = {copies:.1f} copies of {what}")
    note = (
        f"model: {model}; checks: {fmt_outcomes(outcomes(mid))}; work: {work['forward']} forward, "
        f"{work['backward']} backward passes, {work['optimizer_steps']} optimizer steps (floor: {floor_step}); "
        f"train/ckpt/smoke: {steps} optimizer steps"
        + "".join(f"; {d}: {n} forward passes" for d, n in forward.items())
        + f"; by check: {fmt_by_check(by_check)}; time {fmt_time(a)} vs floor {fmt_time(b)} ({text}); "
        + (  # the checks' time: the user's work and the plugin's own (its share)
            f"the plugin's share of the checks' {split['checks']:.1f} s: {split['share']:.0%} "
            f"(user {split['user']:.1f} s, plugin {split['plugin']:.1f} s); "
            if (split := time_split(mid))["checks"]
            else ""
        )
        + f"peak RSS {a.max_rss_mb:.0f} MiB vs floor {b.max_rss_mb:.0f} MiB ({extra:+.0f} MiB = {copies:+.2f} copies "
        f"of {what})" + (f"; the peak was reached during {at_peak[0]}" if (at_peak := peak_item(mid)) else "")
    )
    if over:
        note = "OVER BUDGET: " + "; ".join(over) + "; " + note
    if problem:
        note = f"NOT CLEAN: {problem}; " + note
    measured = f"{fmt_time(a)}; {steps} steps, {work['forward']} fwd, {work['backward']} bwd" + "".join(
        f", {d} {n} fwd" for d, n in forward.items()
    )
    return Row(
        section,
        figure,
        measured,
        f"{fmt_time(b)}; 1 step",
        text,
        budget,
        not over and not problem,
        note,
        {
            "active": asdict(a),
            "floor": asdict(b),
            "ratio": chosen,
            "passes": work,
            "training_steps": steps,
            "forward_by_data_domain": forward,
            "work_by_domain": by_domain,
            "work_by_check": by_check,
            "steps_by_check": {c: w["optimizer_steps"] for c, w in by_check.items()},
            "floor_step": floor,
            "trainable_mib": trainable,
            "training_state_mib": state,
            "extra_rss_mib": extra,
            "copies": copies,
            "outcomes": outcomes(mid),
        },
    )


def measure_against_floor(ctx: Any, project: Any, active: list[str], env: dict[str, str], repeats: int) -> Any:
    """The project's checks (``active``) and its floor, interleaved ``repeats`` times (raises
    ``measure.CommandFailed`` when a run fails)."""
    return ctx.measure(
        {
            "active": ctx.pytest(project.root, active, env, ok_codes=(0, 1)),
            "floor": ctx.pytest(project.root, project.floor_args(), env, floor=True),
        },
        repeats,
    )


def bench_realistic(ctx: Any, size: dict, repeats: int) -> Any:
    """The SFTTrainer project (the memory figure's) with ``--dlcheck=train,ckpt,smoke``."""
    project = projects.memory_project(ctx.workdir / "realistic", size)
    n = projects.llama_parameters(320, **size)
    row = bench_project(
        ctx,
        "realistic",
        project,
        SELECTION,
        f"--dlcheck={SELECTION} on a {n / 1e6:.0f}M SFTTrainer project / floor",
        repeats,
        f"Llama from a config, {n / 1e6:.0f}M parameters, TRL SFTTrainer",
    )
    row.data["parameters"] = n
    return row


def bench_realistic_loop(ctx: Any, size: dict, repeats: int) -> Any:
    """The same Llama and data trained by a hand-written loop, ``--dlcheck=train,ckpt,smoke``."""
    project = projects.loop_project(ctx.workdir / "realistic", size)
    n = projects.llama_parameters(320, **size)
    row = bench_project(
        ctx,
        "realistic-loop",
        project,
        SELECTION,
        f"--dlcheck={SELECTION} on a {n / 1e6:.0f}M plain-loop project / floor",
        repeats,
        f"Llama from a config, {n / 1e6:.0f}M parameters, a hand loop (AdamW, warmup, clipping)",
    )
    row.data["parameters"] = n
    return row


def bench_realistic_vision(ctx: Any, size: dict, repeats: int) -> Any:
    """A ResNet-50 (quick mode: a small Bottleneck ResNet) with ``--dlcheck=vision,train,ckpt,smoke``."""
    project = projects.vision_project(ctx.workdir / "realistic", size)
    n = projects.resnet_parameters(**size)
    selection = "vision," + SELECTION
    name = "ResNet-50" if size == projects.RESNET50 else f"ResNet {size['layers']}"
    row = bench_project(
        ctx,
        "realistic-vision",
        project,
        selection,
        f"--dlcheck={selection} on a {name} ({n / 1e6:.1f}M) project / floor",
        repeats,
        f"torchvision {name}, {n / 1e6:.1f}M parameters, {size['image']}×{size['image']} images, batch "
        f"{size['batch']}, SGD with momentum",
    )
    row.data["parameters"] = n
    return row


# ---- memory: training states over the floor ------------------------------------------------------------


def bench_realistic_memory(ctx: Any, size: dict, repeats: int) -> Any:
    """Peak RSS of ``--dlcheck=train,ckpt,smoke`` on a plain loop of an MLP (18.9M parameters, AdamW) against
    the floor's (the conftest's objects and one whole training step), counted in training states: the
    weights, their gradients and the optimizer's moments, as the floor's step holds them. Budget: at most one
    training state over the floor."""
    project = projects.mlp_project(ctx.workdir / "realistic", size)
    n = projects.mlp_parameters(**size)
    figure = f"peak RSS, --dlcheck={SELECTION} on a {n / 1e6:.1f}M MLP plain loop / floor"
    budget = f"≤ +{MAX_COPIES:g} training state"
    env = ctx.env(DLBENCH_RSS="1")
    active = [f"--dlcheck={SELECTION}", project.target, f"--ignore={project.floor_test}"]
    try:
        runs = measure_against_floor(ctx, project, active, env, repeats)
    except measure.CommandFailed as exc:
        return not_measured("realistic-memory", figure, budget, exc)
    a, b = Summary.of(runs["active"]), Summary.of(runs["floor"])
    mid = median_run(runs["active"], "rss")
    floor = median_run(runs["floor"], "rss").info.get("floor", {})
    state = floor.get("training_state_bytes", 0) / 2**20
    extra = a.max_rss_mb - b.max_rss_mb
    states = extra / state if state else float("inf")
    problem = next((broken(m) for m in runs["active"] if broken(m)), "")
    at_peak = peak_item(mid)
    weights = floor.get("trainable_bytes", 0) / 2**20
    note = (
        f"model: MLP 64 -> {size['width']} x {size['depth']} -> 4, {n / 1e6:.1f}M parameters, AdamW; one training "
        f"state (weights {weights:.0f} MiB + gradients + the optimizer's moments, as the floor's step holds them) "
        f"= {state:.0f} MiB; checks: {fmt_outcomes(outcomes(mid))}; peak RSS {a.max_rss_mb:.0f} MiB vs "
        f"floor {b.max_rss_mb:.0f} MiB ({extra:+.0f} MiB = {states:+.2f} training states)"
        + (f"; the peak was reached during {at_peak[0]}" if at_peak else "")
        + f"; time {fmt_time(a)} vs floor {fmt_time(b)}"
    )
    if states > MAX_COPIES:
        note = f"OVER BUDGET: {states:.2f} training states over the floor; " + note
    if problem:
        note = f"NOT CLEAN: {problem}; " + note
    return Row(
        "realistic-memory",
        figure,
        f"{a.max_rss_mb:.0f} MiB",
        f"{b.max_rss_mb:.0f} MiB",
        f"{extra:+.0f} MiB = {states:+.2f} states",
        budget + (f" ({state * MAX_COPIES:.0f} MiB)" if state else ""),
        states <= MAX_COPIES and not problem,
        note,
        {
            "active": asdict(a),
            "floor": asdict(b),
            "parameters": n,
            "training_state_mib": state,
            "trainable_mib": weights,
            "extra_rss_mib": extra,
            "states": states,
            "peak_check": at_peak[0] if at_peak else None,
            "floor_step": floor,
            "outcomes": outcomes(mid),
        },
    )


# ---- the data-domain budget on the example projects --------------------------------------------------------


def domain_budget_row(rows: list[Any]) -> Any | None:
    """One row judging the data domains' forward passes (≤ 10 each) from the active rows' work (their
    ``forward_by_domain``), or None when no data domain's example was measured."""
    counts, routines = {}, {}
    for r in rows:
        if r.section == "active" and r.data.get("forward_by_domain") is not None:
            domain = r.data.get("domain")
            if domain in DATA_DOMAINS:
                # the checks' own passes; those inside the user's shared routine (one call of
                # dlcheck_sample_images, as many passes as the user's num_inference_steps) are shown beside
                routine = (r.data.get("routine_by_domain") or {}).get(domain, 0)
                counts[domain] = r.data["forward_by_domain"].get(domain, 0) - routine
                routines[domain] = routine
    if not counts:
        return None
    over = {d: n for d, n in counts.items() if n > DOMAIN_MAX_FORWARD}
    per = ", ".join(
        f"{d} {n}" + (f" (+{routines[d]} in one call of your sampling routine)" if routines.get(d) else "")
        for d, n in counts.items()
    )
    spenders = {}
    for r in rows:
        if r.section == "active" and r.data.get("domain") in over:
            checks = r.data.get("work_by_check") or {}
            ranked = sorted(
                ((c, w["forward"]) for c, w in checks.items() if w.get("domain") == r.data["domain"] and w["forward"]),
                key=lambda cw: -cw[1],
            )
            spenders[r.data["domain"]] = ", ".join(f"{c} {n}" for c, n in ranked)
    note = (
        "forward passes through the models caused by each data domain's checks on examples/<domain>/clean "
        "(the active rows' runs; a shared forward counted once; the passes inside one call of the user's own "
        "sampling routine, shared by the checks that read it, are shown apart)"
        + (f"; OVER BUDGET: {', '.join(f'{d} {n}' for d, n in over.items())}" if over else "")
        + "".join(f"; {d} by check: {who}" for d, who in spenders.items() if who)
    )
    return Row(
        "domains",
        "forward passes per data domain, examples/<domain>/clean",
        per,
        "-",
        f"max {max(counts.values())}",
        f"≤ {DOMAIN_MAX_FORWARD} each",
        not over,
        note,
        {"forward_by_domain": counts, "in_user_routines": routines, "over": over, "forward_by_check": spenders},
    )
