"""Results of the checks, kept in the test reports (so they survive pytest-xdist) and turned into the
terminal summary, ``--dlcheck-json`` and ``--dlcheck-report`` (HTML)."""

from __future__ import annotations

import json
import platform
import sys
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from . import __version__, registry
from .errors import CheckFailed, RoleError
from .html import write_html
from .session import MISSING_ROLE, NOT_APPLICABLE

PROPERTY = "dlcheck"
#: 2: ``outcome`` tells failed / error / passed / not_applicable / missing_role / skipped apart (version 1 had
#: passed / failed / error / skipped; its value is kept as ``pytest_outcome``); ``error_kind`` says whose error
OUTCOMES = ("failed", "error", "passed", "not_applicable", "missing_role", "skipped")
SCHEMA_VERSION = 2
LABELS = {o: o.replace("_", " ") for o in OUTCOMES} | {"not_applicable": "n/a"}
ERROR_KINDS = {"internal": "internal error", "role": "your role raised", "timeout": "time bound", "setup": "setup"}
#: libraries whose versions a result names, when the run had imported them
LIBRARIES = (
    "torch",
    "transformers",
    "trl",
    "tokenizers",
    "accelerate",
    "datasets",
    "torchvision",
    "timm",
    "diffusers",
    "gymnasium",
    "stable_baselines3",
    "lightning",
    "numpy",
    "pytest",
)


@dataclass
class Result:
    """One check item's outcome, merged over its setup/call/teardown reports."""

    nodeid: str
    id: str
    domain: str
    title: str
    roles: list[str]
    outcome: str = "passed"
    pytest_outcome: str = "passed"
    error_kind: str = ""
    duration: float = 0.0
    reason: str = ""
    evidence: list[str] = field(default_factory=list)
    cause: str = ""
    fix: str = ""
    error: str = ""
    data: dict[str, Any] = field(default_factory=dict)
    artifacts: list[dict[str, Any]] = field(default_factory=list)
    #: the work the check caused (pytest_dlcheck.cost): forward/backward passes, optimizer steps, per model
    cost: dict[str, Any] = field(default_factory=dict)

    def to_json(self) -> dict[str, Any]:
        return {k: getattr(self, k) for k in self.__dataclass_fields__}


def jsonable(value: Any) -> Any:
    """Numbers, strings, lists and dicts only: tensors and numpy values become lists and floats."""
    if isinstance(value, (str, bool, int, float)) or value is None:
        return value
    if isinstance(value, dict):
        return {str(k): jsonable(v) for k, v in value.items()}
    if isinstance(value, (list, tuple, set)):
        return [jsonable(v) for v in value]
    if hasattr(value, "tolist"):
        return jsonable(value.tolist())
    return str(value)


def payload(
    check: registry.Check,
    when: str,
    outcome: str,
    exc: BaseException | None,
    artifacts: list,
    measured: dict | None = None,
) -> dict:
    """What one report carries about its check (plain JSON, so xdist can ship it to the controller)."""
    out: dict[str, Any] = {
        "id": check.id,
        "domain": check.domain,
        "title": check.title,
        "roles": list(check.roles),
        "when": when,
        "outcome": outcome,
        "artifacts": jsonable(artifacts),
    }
    if isinstance(exc, CheckFailed):
        out.update(evidence=list(exc.evidence), cause=exc.cause, fix=exc.fix, data=jsonable(exc.data))
    elif isinstance(exc, RoleError):
        out.update(error=str(exc), error_kind="role")
    elif isinstance(exc, pytest.skip.Exception):
        out.update(reason=str(exc.msg))
    elif exc is not None:
        # a check stopped by its time bound is rendered by the plugin; anything else escaping a check that is
        # not the user's object raising is ours (an internal error), or a fixture of the user's at setup
        kind = "timeout" if type(exc).__name__ == "CheckStopped" else "internal" if when == "call" else "setup"
        out.update(error=f"{type(exc).__name__}: {exc}", error_kind=kind)
    elif measured:
        out.update(evidence=list(measured["evidence"]), data=jsonable(measured["data"]))
    return out


class Results:
    """A plugin object: collects :class:`Result` per check item, prints the dlcheck terminal summary, and
    writes the JSON and HTML reports at the end of the session (on the xdist controller only)."""

    def __init__(self, config: pytest.Config) -> None:
        self.config = config
        self.results: dict[str, Result] = {}
        self.started = time.time()

    def pytest_runtest_logreport(self, report: pytest.TestReport) -> None:
        info = next((v for k, v in report.user_properties if k == PROPERTY), None)
        if info is None:
            return
        res = self.results.get(report.nodeid)
        if res is None:
            res = self.results[report.nodeid] = Result(
                report.nodeid, info["id"], info["domain"], info["title"], info["roles"]
            )
        res.duration += report.duration
        res.artifacts.extend(info.get("artifacts", []))
        if info.get("cost"):
            res.cost = info["cost"]  # cumulative over setup and call
        if report.outcome == "passed":
            for key in ("evidence", "data"):
                if info.get(key):
                    setattr(res, key, info[key])
            return
        if report.failed:
            res.pytest_outcome = "failed" if report.when == "call" else "error"
        elif res.pytest_outcome == "passed":
            res.pytest_outcome = report.outcome
        for key in ("evidence", "cause", "fix", "data", "error", "reason", "error_kind"):
            if info.get(key):
                setattr(res, key, info[key])
        res.outcome = outcome_of(res)

    def pytest_runtest_logfinish(self, nodeid: str, location) -> None:
        res = self.results.get(nodeid)
        if res is not None:
            res.outcome = outcome_of(res)

    def counts(self) -> Counter:
        return Counter((r.domain, r.outcome) for r in self.results.values())

    def pytest_terminal_summary(self, terminalreporter) -> None:
        tr = terminalreporter
        if not self.results:
            if not hasattr(self.config, "workerinput"):
                tr.write_sep("=", "dlcheck summary")
                tr.write_line(
                    "no check ran: no conftest.py defines dlcheck_* fixtures (or -k/-m deselected every check); "
                    "the checks are collected beside the conftest.py that defines them",
                    yellow=True,
                )
            return
        tr.write_sep("=", "dlcheck summary")
        by = self.counts()
        colours = {"passed": {"green": True}, "failed": {"red": True}, "error": {"red": True}}
        for domain in registry.DOMAINS:
            counts = [(o, by[(domain, o)]) for o in OUTCOMES if by[(domain, o)]]
            if counts:
                tr.write(f"{domain:<10} ")
                for i, (o, n) in enumerate(counts):
                    tr.write((", " if i else "") + f"{n} {LABELS[o]}", **colours.get(o, {"yellow": True}))
                tr.write("\n")
        failed = sorted({r.id for r in self.results.values() if r.outcome == "failed"}, key=_id_order)
        if failed:
            tr.write_line("failed:    " + " ".join(failed), red=True)
        errors = sorted(
            {
                f"{r.id} ({ERROR_KINDS.get(r.error_kind, 'error')})"
                for r in self.results.values()
                if r.outcome == "error"
            },
            key=lambda t: _id_order(t.split()[0]),
        )
        if errors:
            tr.write_line("error:     " + " ".join(errors), red=True)
        for outcome, label in (("missing_role", "skipped:  "), ("not_applicable", "n/a:      ")):
            grouped = Counter(r.reason for r in self.results.values() if r.outcome == outcome)
            for reason, n in sorted(grouped.items()):
                tr.write_line(f"{label} {reason} ({n} check{'s' if n > 1 else ''})")
        # information items (DF1, DF7, L6) skip with what they measured: shown here, not only under -rs
        infos = sorted(
            (
                (r.id, nodeid.split("::")[0], r.reason)
                for nodeid, r in self.results.items()
                if r.outcome == "skipped" and r.reason.startswith("info:")
            ),
            key=lambda x: (_id_order(x[0]), x[1]),
        )
        several = len({where for _, where, _ in infos}) > 1
        for cid, where, reason in infos:
            text = reason[len("info:") :].strip()
            text = f"{cid} ({where}) {text}" if several else f"{cid} {text}"
            tr.write_line(f"info:      {text if len(text) <= 200 else text[:199] + '…'}")
        spent = {k: sum(r.cost.get(k, 0) for r in self.results.values()) for k in ("forward", "backward")}
        steps = sum(r.cost.get("optimizer_steps", 0) for r in self.results.values())
        if spent["forward"] or steps:
            tr.write_line(
                f"cost:      {spent['forward']} forward passes, {spent['backward']} backward passes, "
                f"{steps} optimizer steps (per check in the JSON report)"
            )
        for option, label in (("dlcheck_json", "json"), ("dlcheck_report", "report")):
            path = getattr(self.config.option, option, None)
            if path:
                tr.write_line(f"{label + ':':<10} {path}")

    @pytest.hookimpl(trylast=True)
    def pytest_sessionfinish(self, session: pytest.Session) -> None:
        if hasattr(self.config, "workerinput"):
            return  # an xdist worker: the controller writes the reports
        doc = self.document()
        if self.config.option.dlcheck_json:
            write_json(Path(self.config.option.dlcheck_json), doc)
        if self.config.option.dlcheck_report:
            write_html(Path(self.config.option.dlcheck_report), doc)

    def document(self) -> dict[str, Any]:
        results = sorted(self.results.values(), key=lambda r: (_id_order(r.id), r.nodeid))
        return {
            "schema_version": SCHEMA_VERSION,
            "dlcheck_version": __version__,
            "created": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
            "duration": round(time.time() - self.started, 3),
            "python": platform.python_version(),
            "platform": platform.platform(),
            "versions": library_versions(),
            "selection": getattr(self.config.option, "dlcheck", None) or "",
            "summary": {o: sum(1 for r in results if r.outcome == o) for o in OUTCOMES},
            "cost": {k: sum(r.cost.get(k, 0) for r in results) for k in ("forward", "backward", "optimizer_steps")},
            "results": [r.to_json() for r in results],
        }


def outcome_of(res: Result) -> str:
    """The one classification every report uses: a check's finding (failed), an error that kept it from judging
    (the user's role raised, a time bound, or an internal error of pytest-dlcheck), a pass, "not applicable",
    a missing role, or another skip (undecided, or an information item)."""
    if res.pytest_outcome in ("failed", "error"):
        finding = (res.cause or res.evidence) and not res.error_kind
        return "failed" if finding or (res.pytest_outcome == "failed" and not res.error) else "error"
    if res.pytest_outcome == "skipped":
        if res.reason.startswith(MISSING_ROLE):
            return "missing_role"
        if res.reason.startswith(NOT_APPLICABLE):
            return "not_applicable"
        return "skipped"
    return "passed"


def library_versions() -> dict[str, str]:
    out = {}
    for name in LIBRARIES:
        module = sys.modules.get(name)
        version = getattr(module, "__version__", None) if module is not None else None
        if version:
            out[name] = str(version)
    return out


def write_json(path: Path, doc: dict[str, Any]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(doc, indent=1, sort_keys=False))


def schema_path() -> Path:
    return Path(__file__).parent / "report.schema.json"


def _id_order(cid: str) -> tuple:
    checks = registry.load_checks()
    return checks[cid].sort_key if cid in checks else (99, cid, 0)
