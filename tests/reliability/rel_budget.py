"""The budgets of issue 33, read from a corpus project's JSON report (--dlcheck=all --dlcheck-json).

Work: each data domain (llm, vision, diffusion, rl, vlm) at most :data:`DOMAIN_MAX_FORWARD` forward passes of the
user's models: the domain's checks' own passes, plus those of every shared run a check of the domain read (made
or waited for) that trained nothing (a memoised forward of the sampled batches, a sampling draw); a shared
training run (the smoke run, a resumed run) is the training checks' work, budgeted in optimizer steps, which a
data-domain check only reads when those checks are selected. The passes inside one call of the user's own
sampling routine (``in_user_routines``: its cost is the user's num_inference_steps) are not the checks' own.

Wall time: the plugin's own seconds at most :data:`MAX_PLUGIN_SHARE` of the checks' seconds, and the whole
``--dlcheck=all`` at most (60 training steps + 10 forward passes) of the project's own step time plus 15 s."""

from __future__ import annotations

from typing import Any

DATA_DOMAINS = ("llm", "vision", "diffusion", "rl", "vlm")
DOMAIN_MAX_FORWARD = 10
MAX_PLUGIN_SHARE = 0.25
BUDGET_STEPS, BUDGET_FORWARD, FIXED_S = 60, 10, 15.0

#: (project, data domain) still over its forward budget, with where the passes come from (measured on the corpus
#: run): the corpus test fails when one of them comes within the budget (take it off) or another goes over
KNOWN_OVER: dict[tuple[str, str], str] = {}

#: the corpus projects with the cheapest and the costliest training step (the smoke run's user seconds per
#: optimizer step, measured on this machine: makemore_mlp ~13 ms, trl_sft_chatml ~0.3-1.3 s): the wall-time
#: budgets are judged on them
CHEAPEST, COSTLIEST = "makemore_mlp", "trl_sft_chatml"


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


def over_budget(doc: dict[str, Any]) -> dict[str, dict[str, int]]:
    """The data domains over :data:`DOMAIN_MAX_FORWARD` forward passes, with who spent them."""
    return {d: who for d, who in domain_forward(doc).items() if sum(who.values()) > DOMAIN_MAX_FORWARD}


def step_seconds(doc: dict[str, Any]) -> float | None:
    """The project's own step time: the user's seconds per optimizer step in the shared smoke run (its
    forward, backward, step and data loading, the plugin's own work left out), else in the check that trained
    the most steps itself; None when nothing trained."""
    runs = [(run.get("cost") or {}, run["user"]) for label, run in doc["shared"].items() if label == "smoke run"]
    if not runs or not runs[0][0].get("optimizer_steps"):
        runs = sorted(
            (
                ((r.get("cost") or {}), r["time"]["user"] - r["time"]["user_by"].get("fixtures", 0.0))
                for r in doc["results"]
            ),
            key=lambda cu: -cu[0].get("optimizer_steps", 0),
        )[:1]
    if not runs or not runs[0][0].get("optimizer_steps"):
        return None
    cost, user = runs[0]
    return user / cost["optimizer_steps"]


def wall_budget(doc: dict[str, Any]) -> dict[str, Any]:
    """The project's figures: the checks' seconds, the plugin's share, the step time, the budget in seconds
    (None without a training step) and whether each holds."""
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
    """One line of a project's figures, as the corpus test and the benchmark print them."""
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
