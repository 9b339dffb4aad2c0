"""The corpus ledger: every check's outcome on every project of tests/realcode/projects, kept beside the
project in ``ledger.toml``.

A project's ledger has two parts. ``[findings]`` names the checks that must fail and why the failure is
real; it is decided from the upstream script before the plugin runs on the re-creation (the module
docstring and FINDINGS-*.md say how) and never edited to match what the plugin does. ``[outcomes]`` lists
every other check of the registry under what it gives on this clean pipeline, each reviewed to be true:

    passed          judged and found correct
    partly          passed, with a part it says it did not judge (the JSON's not_judged)
    not_applicable  the check does not concern this kind of pipeline
    missing_role    a fixture the project does not define would make it run
    skipped         the check concerns the pipeline but could not decide (says why)

Two more tables keep the plugin's open defects honest instead of hiding them: ``[false_alarms]`` (check =
why its failure on this correct pipeline is wrong) and ``[missed]`` (check = [the outcome it gives now, what
the true outcome is and why]: a true finding not caught, or a pass/skip/"not applicable" in the wrong category). The test expects those outcomes until the defect is fixed, and then asks for
the entry to move to ``[findings]`` / ``[outcomes]``.

``error`` (an internal error, or a check ending in an error) is never a ledger outcome. Every check of the
registry appears exactly once, so a check that drifts into "not applicable" or "skipped" shows as a diff
just as a new failure does.
"""

from __future__ import annotations

from pathlib import Path

import tomllib

PROJECTS = Path(__file__).parent / "projects"
CLEAN = ("passed", "partly", "not_applicable", "missing_role", "skipped")


def projects() -> list[str]:
    return sorted(p.name for p in PROJECTS.iterdir() if (p / "ledger.toml").is_file())


def load(project: str) -> tuple[dict[str, str], dict[str, str]]:
    """(findings: check -> why it must fail, outcomes: check -> expected outcome) of one project; the open
    defects ([false_alarms], [missed]) are in outcomes with the outcome the plugin gives today."""
    data = tomllib.loads((PROJECTS / project / "ledger.toml").read_text())
    findings = {str(k): str(v) for k, v in data.get("findings", {}).items()}
    outcomes: dict[str, str] = {str(k): "failed" for k in data.get("false_alarms", {})}
    for cid, (now, _why) in data.get("missed", {}).items():
        outcomes[str(cid)] = str(now)
    for outcome, ids in data.get("outcomes", {}).items():
        if outcome not in CLEAN:
            raise ValueError(f"{project}/ledger.toml: unknown outcome {outcome!r} (one of {', '.join(CLEAN)})")
        for cid in ids:
            if cid in outcomes or cid in findings:  # also when listed under [false_alarms] / [missed]
                raise ValueError(f"{project}/ledger.toml: {cid} is listed twice")
            outcomes[cid] = outcome
    return findings, outcomes


def observed(results: list[dict]) -> dict[str, str]:
    """check ID -> the outcome in the ledger's words, from the JSON report's results."""
    seen: dict[str, str] = {}
    for r in results:
        outcome = r["outcome"]
        if outcome == "passed" and r.get("not_judged"):
            outcome = "partly"
        seen[r["id"]] = outcome
    return seen


def diff(project: str, results: list[dict], registry: list[str]) -> list[str]:
    """Every way the run differs from the ledger, one line each (empty when they agree)."""
    findings, outcomes = load(project)
    seen = observed(results)
    by_id = {r["id"]: r for r in results}
    lines = []
    for cid in registry:
        got = seen.get(cid, "not run")
        if cid in findings:
            if got != "failed":
                why = by_id.get(cid, {}).get("reason") or by_id.get(cid, {}).get("error") or ""
                lines.append(f"{project} {cid}: a true finding no longer caught ({got}: {why[:300]})")
        elif cid in outcomes:
            if got != outcomes[cid]:
                r = by_id.get(cid, {})
                said = r.get("error") or r.get("cause") or r.get("reason") or "; ".join(r.get("evidence", [])[:2])
                lines.append(f"{project} {cid}: ledger says {outcomes[cid]}, the run gave {got}: {said[:600]}")
        else:
            lines.append(f"{project} {cid}: not in the ledger (the run gave {got}); decide its verdict")
    for cid in sorted(set(findings) | set(outcomes)):
        if cid not in registry:
            lines.append(f"{project} {cid}: in the ledger but not in the registry")
    return lines


def render(project: str, results: list[dict]) -> str:
    """The [outcomes] part of a ledger as the run gave it, for a reviewer to check line by line (never to
    paste unread: each line is a verdict someone must be able to defend)."""
    findings, _ = load(project) if (PROJECTS / project / "ledger.toml").is_file() else ({}, {})
    seen = observed(results)
    lines = ["[outcomes]"]
    for outcome in CLEAN:
        ids = [cid for cid, got in seen.items() if got == outcome and cid not in findings]
        lines.append(f"{outcome} = {ids!r}".replace("'", '"'))
    return "\n".join(lines)
