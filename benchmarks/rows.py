"""The benchmark's rows and how they read: one row of the table (:class:`Row`), the table, and what a run's
probe says (outcomes, phases, the work each check caused, the check at the peak), formatted.

The modules import one way: ``run.py`` (the command and the figures 1-5) imports ``realistic.py`` (figure 7)
and ``watch.py`` (figure 6) and ``corpus.py`` (figure 9), which build their rows from this module; this module imports only
``measure.py``. Nothing here imports what builds the rows."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from benchmarks import measure
from benchmarks.measure import Measurement, Summary

#: the work a check causes, as pytest_dlcheck.cost counts it and the probe records it per item
KEYS = ("forward", "backward", "optimizer_steps")


@dataclass
class Row:
    """One line of the table."""

    section: str
    figure: str
    measured: str
    reference: str
    ratio: str
    budget: str
    ok: bool | None  # None: informative, or not taken
    note: str = ""
    data: dict[str, Any] = field(default_factory=dict)

    @property
    def verdict(self) -> str:
        return {True: "ok", False: "OVER BUDGET", None: "-"}[self.ok]


def not_measured(section: str, figure: str, budget: str, exc: Exception) -> Row:
    """The row of a figure whose runs failed: not ok, with the end of the failure."""
    return Row(section, figure, "-", "-", "-", budget, False, "could not measure: " + " ".join(str(exc).split())[-600:])


def table(rows: list[Row]) -> str:
    head = ["figure", "measured (median)", "reference (median)", "ratio", "budget", "verdict"]
    body = [[r.figure, r.measured, r.reference, r.ratio, r.budget, r.verdict] for r in rows]
    widths = [max(len(x) for x in col) for col in zip(head, *body)]
    line = lambda cells: "| " + " | ".join(c.ljust(w) for c, w in zip(cells, widths)) + " |"
    out = [line(head), "|" + "|".join("-" * (w + 2) for w in widths) + "|"] + [line(b) for b in body]
    notes = [f"- {r.figure}: {r.note}" for r in rows if r.note]
    return "\n".join(out + ([""] + notes if notes else []))


# ---- times and ratios ------------------------------------------------------------------------------------


def fmt_time(s: Summary) -> str:
    return f"{s.cpu:.2f} s CPU, {s.wall:.2f} s wall"


def fmt_ratios(a: list[Measurement], b: list[Measurement], metric: str) -> tuple[str, float]:
    """Median paired ratios (each run against the other variant's run beside it) of CPU and wall time;
    and the one the budgets judge."""
    r_cpu, r_wall = measure.paired_ratio(a, b, "cpu"), measure.paired_ratio(a, b, "wall")
    chosen = r_cpu if metric == "cpu" else r_wall
    return f"{r_cpu:.3f} CPU, {r_wall:.3f} wall", chosen


def median_run(ms: list[Measurement], metric: str) -> Measurement:
    ranked = sorted(ms, key=lambda m: m.value(metric))
    return ranked[(len(ranked) - 1) // 2]


# ---- what the probe recorded -----------------------------------------------------------------------------


def outcomes(m: Measurement, prefix: str = "") -> dict[str, int]:
    counts: dict[str, int] = {}
    for nodeid, item in m.info.get("probe", {}).get("items", {}).items():
        if prefix and prefix not in nodeid:
            continue
        counts[item["outcome"]] = counts.get(item["outcome"], 0) + 1
    return counts


def fmt_outcomes(counts: dict[str, int]) -> str:
    return ", ".join(f"{v} {k}" for k, v in sorted(counts.items())) or "no items"


def broken(m: Measurement) -> str:
    """On a clean project every check passes or skips: the failures and errors of a run, as pytest's short
    summary names them, else ''."""
    counts = outcomes(m)
    bad = counts.get("failed", 0) + counts.get("error", 0)
    if not bad and counts:
        return ""
    lines = [line for line in m.output.splitlines() if line.startswith(("FAILED ", "ERROR ", "E   "))]
    what = f"{bad} check(s) failed or errored" if bad else "no check ran"
    return f"{what} on a clean project: " + " | ".join(lines[:3])[:400]


def phases(m: Measurement) -> dict[str, float]:
    """Where one run's time went: start-up (interpreter, pytest, plugins, conftest imports), collection,
    the items (fixtures built in the first one's setup), and the exit."""
    p = m.info.get("probe") or {}
    if not p.get("configured_at"):
        return {}
    items = sum(i["setup"] + i["call"] + i["teardown"] for i in p["items"].values())
    return {
        "startup": p["configured_at"] - m.started_at,
        "collection": (p["collected_at"] or p["configured_at"]) - p["configured_at"],
        "items": items,
        "exit": m.started_at + m.wall - p["finished_at"],
    }


def slowest(m: Measurement, n: int = 3) -> list[tuple[str, float, float]]:
    items = (m.info.get("probe") or {}).get("items", {})
    ranked = sorted(items.items(), key=lambda kv: -(kv[1]["setup"] + kv[1]["call"]))
    return [(nodeid.split("::")[-1], i["setup"], i["call"]) for nodeid, i in ranked[:n]]


def passes(m: Measurement) -> dict[str, int]:
    """The work the checks caused (pytest_dlcheck.cost), summed over the items: forward and backward passes
    through the models, optimizer steps."""
    total = dict.fromkeys(KEYS, 0)
    for item in m.info.get("probe", {}).get("items", {}).values():
        cost = item_work(item)
        for key in total:
            total[key] += cost.get(key, 0)
    return total


def item_work(item: dict) -> dict[str, Any]:
    """One item's work: the check's own passes plus those of the shared runs it made (the plugin counts a
    shared run's passes as the run's; the budgets here charge them to the check that made the run)."""
    cost = dict(item.get("cost") or {})
    for run in ((item.get("time") or {}).get("shared_made") or {}).values():
        for key, value in (run.get("cost") or {}).items():
            if isinstance(value, dict):
                merged = dict(cost.get(key) or {})
                for name, n in value.items():
                    merged[name] = merged.get(name, 0) + n
                cost[key] = merged
            else:
                cost[key] = cost.get(key, 0) + value
    return cost


def time_split(m: Measurement) -> dict[str, float]:
    """The checks' wall time split (pytest_dlcheck.cost.timing), summed over the items: the user's work
    (forward, backward, steps, data, the user's callables and fixtures, in the checks and in the shared runs
    they made) and the plugin's own (the rest), and the plugin's share of the checks' time."""
    checks = user = 0.0
    for item in m.info.get("probe", {}).get("items", {}).values():
        t = item.get("time") or {}
        checks += item.get("setup", 0.0) + item.get("call", 0.0) + item.get("teardown", 0.0)
        user += sum((t.get("user") or {}).values())
        user += sum(sum(run.get("user", {}).values()) for run in (t.get("shared_made") or {}).values())
    user = min(user, checks)
    return {
        "checks": checks,
        "user": user,
        "plugin": checks - user,
        "share": (checks - user) / checks if checks else 0.0,
    }


def check_of(nodeid: str, item: dict) -> str:
    """The check's ID: recorded by the probe, else the test name's prefix (``T2_overfit_batch`` → T2)."""
    return item.get("check") or nodeid.rsplit("::", 1)[-1].split("_")[0]


def work_by_check(m: Any) -> dict[str, dict[str, Any]]:
    """Per check: its domain and the forward/backward passes and optimizer steps it caused (a shared run
    counted by the check that first needed it: the report keeps its passes apart, :func:`item_work` adds them back)."""
    out = {}
    for nodeid, item in (m.info.get("probe") or {}).get("items", {}).items():
        cost = item_work(item)
        out[check_of(nodeid, item)] = {
            "domain": item.get("domain"),
            **{k: cost.get(k, 0) for k in KEYS},
            # of the forward passes, those inside a routine of the user's the checks share (a validation
            # sampling loop, whose cost is the user's num_inference_steps): reported apart
            "in_user_routines": sum((cost.get("in_user_routines") or {}).values()),
        }
    return out


def work_by_domain(m: Any) -> dict[str, dict[str, int]]:
    """The same summed per domain (checks whose domain the probe did not record are left out)."""
    out: dict[str, dict[str, int]] = {}
    for work in work_by_check(m).values():
        if work["domain"]:
            total = out.setdefault(work["domain"], dict.fromkeys((*KEYS, "in_user_routines"), 0))
            for k in (*KEYS, "in_user_routines"):
                total[k] += work.get(k, 0)
    return out


def fmt_work(work: dict[str, Any]) -> str:
    return f"{work['forward']} fwd/{work['backward']} bwd/{work['optimizer_steps']} steps"


def fmt_by_check(by_check: dict[str, dict[str, Any]]) -> str:
    """The checks that did any work, the most optimizer steps first: ``T2 62 fwd/60 bwd/60 steps, …``."""
    ranked = sorted(by_check.items(), key=lambda kv: (-kv[1]["optimizer_steps"], -kv[1]["forward"], kv[0]))
    return ", ".join(f"{c} {fmt_work(w)}" for c, w in ranked if any(w[k] for k in KEYS)) or "none"


def peak_item(m: Any) -> tuple[str, float] | None:
    """(the check during which the run's peak RSS was reached, that peak in MiB) from the probe's VmHWM after
    each item (``DLBENCH_RSS``), or None when the probe recorded none."""
    seen = [
        (check_of(nodeid, item), item["memory"]["vmhwm"])
        for nodeid, item in ((m.info.get("probe") or {}).get("items") or {}).items()
        if "vmhwm" in (item.get("memory") or {})
    ]
    if not seen:
        return None
    top = max(hwm for _, hwm in seen)
    return next((check, hwm) for check, hwm in seen if hwm >= top)
