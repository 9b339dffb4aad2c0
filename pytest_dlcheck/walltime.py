"""The wall-time split of the reports (measured by :mod:`pytest_dlcheck.cost`): per check, the seconds in the
user's work (forward, backward, optimizer step, data loading, the user's own callables and fixtures) and the
plugin's own work (the rest of its duration), the shared runs it made (timed apart, charged to the run) and
those it waited for that another check made; per session, the shared runs once each and the totals."""

from __future__ import annotations

import math
from typing import Any

from .cost import add_cost

#: the work counted per check and per shared run (pytest_dlcheck.cost.Cost)
WORK = ("forward", "backward", "optimizer_steps")

#: the user-time categories, in the order the reports show them
CATEGORIES = ("forward", "backward", "step", "data", "calls", "fixtures")


def _floor(x: float) -> float:
    """Rounded down to 0.1 ms, so that parts rounded apart still add up to at most their whole."""
    return math.floor(max(x, 0.0) * 1e4) / 1e4


def check_time(duration: float, raw: dict[str, Any]) -> dict[str, Any]:
    """A check's split: ``user`` + ``plugin`` + ``shared`` <= ``duration`` (its setup, call and teardown)."""
    made = raw.get("shared_made") or {}
    shared = min(sum(r["seconds"] for r in made.values()), duration)
    parts = {c: s for c, s in (raw.get("user") or {}).items() if s > 0}
    user = sum(parts.values())
    room = duration - shared
    if user > room:  # never more than the check's time (measured inside pytest's own windows, so at most rounding)
        scale = room / user if user else 0.0
        parts = {c: s * scale for c, s in parts.items()}
        user = room
    by = {c: _floor(parts[c]) for c in sorted(parts, key=_order)}
    return {
        "user": round(sum(by.values()), 4),  # the floored parts' sum: at most what was measured
        "user_by": by,
        "plugin": _floor(duration - shared - user),
        "shared": _floor(shared),
        "shared_made": sorted(made),
        "shared_waited": list(raw.get("shared_waited") or []),
    }


def _order(category: str) -> tuple[int, str]:
    return (CATEGORIES.index(category) if category in CATEGORIES else len(CATEGORIES), category)


def shared_runs(results: list[Any]) -> dict[str, dict[str, Any]]:
    """The shared runs of the session, once each: {label: {"seconds", "user", "plugin", "made_by", "cost"}} (cost:
    the forward/backward passes and optimizer steps made inside, the run's, not its maker's). A run of
    the same name in another directory (another project) is named with its directory."""
    out: dict[str, dict[str, Any]] = {}
    where_of: dict[str, str] = {}
    for res in results:
        where = res.nodeid.split("::")[0].rpartition("/")[0] or "."
        for label, run in ((res.time or {}).get("shared_made") or {}).items():
            key = label if where_of.setdefault(label, where) == where else f"{label} ({where})"
            have = out.setdefault(
                key, {"seconds": 0.0, "user": 0.0, "plugin": 0.0, "made_by": res.id, "cost": dict.fromkeys(WORK, 0)}
            )
            have["cost"] = add_cost(have["cost"], run.get("cost") or {})
            user = min(sum(run["user"].values()), run["seconds"])
            have["seconds"] = _floor(have["seconds"] + run["seconds"])
            have["user"] = _floor(have["user"] + user)
            have["plugin"] = _floor(max(have["seconds"] - have["user"], 0.0))
    return out


def totals(results: list[Any], shared: dict[str, dict[str, Any]]) -> dict[str, Any]:
    """The session's split: the checks' durations, the user's and the plugin's seconds in them (the shared
    runs' split included) and the plugin's share."""
    split = [r.to_json()["time"] for r in results]
    seconds = sum(r.duration for r in results)
    user = sum(t["user"] for t in split) + sum(r["user"] for r in shared.values())
    plugin = sum(t["plugin"] for t in split) + sum(r["plugin"] for r in shared.values())
    return {
        "checks": _floor(seconds),
        "user": _floor(user),
        "plugin": _floor(plugin),
        "shared": _floor(sum(r["seconds"] for r in shared.values())),
        "plugin_share": round(plugin / seconds, 4) if seconds > 0 else 0.0,
    }


def line(res: Any, shared: dict[str, dict[str, Any]]) -> str:
    """One check's line: ``S1 12.3 s: user 9.1 s (forward 3.2, backward 4.0, step 1.2, data 0.7), plugin 3.2 s,
    made the smoke run 2.0 s, waited for sampled batches (train) (made by V1)``."""
    t = res.to_json()["time"]
    by = ", ".join(f"{c} {_s(s)}" for c, s in t["user_by"].items() if s > 0)
    text = f"{res.id} {_s(res.duration)} s: user {_s(t['user'])} s" + (f" ({by})" if by else "")
    text += f", plugin {_s(t['plugin'])} s"
    made = [m for m in t["shared_made"] if shared.get(m, {}).get("seconds", 0) >= 0.05]  # worth a mention
    if made:
        text += f", made the {', '.join(made)} ({_s(t['shared'])} s, timed apart)"
    if t["shared_waited"]:
        waited = [  # the runs worth a mention (a memoised derived role costs next to nothing)
            f"{w} (made by {shared[w]['made_by']})"
            for w in t["shared_waited"]
            if shared.get(w, {}).get("seconds", 0) >= 0.05
        ]
        if waited:
            text += f", waited for {', '.join(waited)}"
    return text


def _s(seconds: float) -> str:
    return f"{seconds:.1f}" if seconds >= 1 else f"{seconds:.2f}" if seconds >= 0.1 else f"{seconds:.2g}"


def slowest(results: list[Any], n: int | None) -> list[Any]:
    """The ``n`` slowest checks (all with 0), slowest first."""
    ranked = sorted(results, key=lambda r: -r.duration)
    return ranked if n == 0 else ranked[: n or 3]
