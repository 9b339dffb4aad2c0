"""The real-code corpus's budgets (issue 33), read from each project's ``--dlcheck=all`` JSON report: the
``corpus`` section of the benchmark prints one row per project (tests/realcode/projects/*), and the corpus test
(tests/reliability/test_rel_realcode.py, through rel_budget) judges the same figures on its own run.

Work: each data domain (llm, vision, diffusion, rl, vlm) at most :data:`DOMAIN_MAX_FORWARD` forward passes of
the models: the domain's checks' own passes, plus those of every shared run a check of the domain read (made or
waited for) that trained nothing (a memoised forward of the sampled batches, a sampling draw); a shared training
run (the smoke run, a resumed run) is the training checks' work, budgeted in optimizer steps, which a data-domain
check only reads when those checks are selected. The passes inside one call of the user's own sampling routine
(``in_user_routines``: its cost is the user's num_inference_steps) are not the checks' own.

Wall time: the plugin's own seconds at most :data:`MAX_PLUGIN_SHARE` of the checks' seconds, and the checks'
seconds at most (60 training steps + 10 forward passes) of the project's own step time plus 15 s.

This module imports only :mod:`benchmarks.rows` (and the standard library)."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path
from typing import Any

from benchmarks.rows import Row

DATA_DOMAINS = ("llm", "vision", "diffusion", "rl", "vlm")
DOMAIN_MAX_FORWARD = 10
MAX_PLUGIN_SHARE = 0.25
BUDGET_STEPS, BUDGET_FORWARD, FIXED_S = 60, 10, 15.0
REPO = Path(__file__).resolve().parents[1]
CORPUS_TEST = "tests/reliability/test_rel_realcode.py"


def _own(cost: dict[str, Any]) -> int:
    return cost.get("forward", 0) - sum((cost.get("in_user_routines") or {}).values())


def domain_forward(doc: dict[str, Any]) -> dict[str, dict[str, int]]:
    """Per data domain that ran a check: {who: forward passes}, who a check ID or ``shared: <label>``."""
    out: dict[str, dict[str, int]] = {}
    for r in doc["results"]:
        if r["domain"] not in DATA_DOMAINS:
            continue
        mine = out.setdefault(r["domain"], {})
        if _own(r.get("cost") or {}):
            mine[r["id"]] = _own(r["cost"])
        for label in [*r["time"]["shared_made"], *r["time"]["shared_waited"]]:
            cost = (doc["shared"].get(label) or {}).get("cost") or {}
            if cost.get("optimizer_steps", 0) == 0 and _own(cost):
                mine[f"shared: {label}"] = _own(cost)
    return out


def step_seconds(doc: dict[str, Any]) -> float | None:
    """The project's own step time: the user's seconds per optimizer step in the shared smoke run (its forward,
    backward, step and data loading; the plugin's own work left out), else in the check that trained the most
    steps itself; None when nothing trained."""
    smoke = doc["shared"].get("smoke run") or {}
    if (smoke.get("cost") or {}).get("optimizer_steps"):
        return smoke["user"] / smoke["cost"]["optimizer_steps"]
    ranked = sorted(doc["results"], key=lambda r: -(r.get("cost") or {}).get("optimizer_steps", 0))
    if not ranked or not (ranked[0].get("cost") or {}).get("optimizer_steps"):
        return None
    t = ranked[0]["time"]
    return (t["user"] - t["user_by"].get("fixtures", 0.0)) / ranked[0]["cost"]["optimizer_steps"]


def wall_budget(doc: dict[str, Any]) -> dict[str, Any]:
    """The project's wall-time figures: the checks' seconds, the plugin's seconds and share, the step time,
    the budget in seconds (None without a training step) and whether each budget holds."""
    t = doc["time"]
    step = step_seconds(doc)
    budget = None if step is None else (BUDGET_STEPS + BUDGET_FORWARD) * step + FIXED_S
    return {
        "checks": t["checks"],
        "plugin": t["plugin"],
        "share": t["plugin_share"],
        "step": step,
        "budget": budget,
        "share_ok": t["plugin_share"] <= MAX_PLUGIN_SHARE,
        "time_ok": budget is None or t["checks"] <= budget,
    }


def figures(name: str, doc: dict[str, Any]) -> str:
    """One line of a project's figures, as the corpus test prints them."""
    w = wall_budget(doc)
    work = domain_forward(doc)
    domains = ", ".join(f"{d} {sum(who.values())}" for d, who in work.items() if who) or "none"
    step = "no training step" if w["step"] is None else f"step {w['step'] * 1000:.0f} ms"
    budget = "" if w["budget"] is None else f" (budget {w['budget']:.1f} s{'' if w['time_ok'] else ' OVER'})"
    return (
        f"{name}: --dlcheck=all checks {w['checks']:.1f} s{budget}, plugin {w['plugin']:.1f} s = {w['share']:.0%} "
        f"(budget {MAX_PLUGIN_SHARE:.0%}{'' if w['share_ok'] else ' OVER'}); {step}; data-domain forward passes: "
        f"{domains}; work {doc['cost']['forward']} fwd, {doc['cost']['backward']} bwd, "
        f"{doc['cost']['optimizer_steps']} optimizer steps"
    )


def corpus_row(name: str, doc: dict[str, Any]) -> Row:
    """A project's row: the checks' seconds against the wall budget, the plugin's share, the forward passes per
    data domain."""
    w = wall_budget(doc)
    work = {d: sum(who.values()) for d, who in domain_forward(doc).items() if who}
    over = [f"{d} {n} forward passes" for d, n in work.items() if n > DOMAIN_MAX_FORWARD]
    over += [] if w["share_ok"] else [f"plugin {w['share']:.0%} of the checks' time"]
    over += [] if w["time_ok"] else [f"{w['checks']:.1f} s over {w['budget']:.1f} s"]
    step = "-" if w["step"] is None else f"step {w['step'] * 1000:.0f} ms"
    limit = "70 steps' time + 15 s" if w["budget"] is None else f"{w['budget']:.1f} s"
    return Row(
        "corpus",
        f"--dlcheck=all on {name}",
        f"{w['checks']:.1f} s, plugin {w['share']:.0%}" + "".join(f", {d} {n} fwd" for d, n in work.items()),
        step,
        "-" if w["budget"] is None else f"{w['checks'] / w['budget']:.2f}x budget",
        f"plugin ≤ {MAX_PLUGIN_SHARE:.0%}; ≤ {limit}; ≤ {DOMAIN_MAX_FORWARD} fwd per data domain",
        not over,
        ("OVER BUDGET: " + "; ".join(over) + "; " if over else "") + figures(name, doc),
        {"wall": w, "forward_by_domain": work, "cost": doc["cost"]},
    )


def corpus_rows(reports: Path) -> list[Row]:
    """One row per project report (``<project>.json``) in ``reports``, sorted by the project's step time."""
    docs = {p.stem: json.loads(p.read_text()) for p in sorted(Path(reports).glob("*.json"))}
    order = sorted(docs, key=lambda n: (step_seconds(docs[n]) is None, step_seconds(docs[n]) or 0.0, n))
    return [corpus_row(n, docs[n]) for n in order]


def run_corpus(python: str, reports: Path, env: dict[str, str], selection: str = "") -> None:
    """Run the corpus once (the corpus test, which keeps each project's JSON report in ``reports``)."""
    env = dict(env, DLCHECK_CORPUS_REPORTS=str(reports))
    command = [python, "-m", "pytest", "-q", "-p", "no:cacheprovider", CORPUS_TEST, "-k", selection or "ledger_outcome"]
    subprocess.run(command, cwd=REPO, env=env, check=False, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    if not any(Path(reports).glob("*.json")):
        raise RuntimeError(f"the corpus run wrote no report to {reports} ({' '.join(command)})")


def bench_corpus(ctx: Any, reports: str | None, selection: str = "") -> list[Row]:
    """The corpus rows: from the reports in ``reports`` when given (a corpus test run with
    $DLCHECK_CORPUS_REPORTS), else from one run of the corpus made here."""
    where = Path(reports) if reports else ctx.workdir / "corpus-reports"
    if not reports:
        run_corpus(ctx.python, where, {**os.environ, **ctx.env()}, selection)
    return corpus_rows(where)
