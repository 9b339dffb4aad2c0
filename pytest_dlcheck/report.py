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

from . import __version__, registry, walltime
from .errors import CheckFailed, RoleError
from .html import grouped_reason, write_html
from .session import MISSING_ROLE, NOT_APPLICABLE, STATE_KEY

PROPERTY = "dlcheck"
#: the reason prefix of a check not run because a fixture it needs raised, reported once as another item's ERROR
NOT_RUN = "not run:"
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
    #: the parts of its subject a passing check did not judge, each {"part", "reason"} (a partly judged pass)
    not_judged: list[dict[str, str]] = field(default_factory=list)
    #: its wall time as measured (pytest_dlcheck.cost.timing); the JSON holds the split (walltime.check_time)
    time: dict[str, Any] = field(default_factory=dict)

    @property
    def partly_judged(self) -> bool:
        return self.outcome == "passed" and bool(self.not_judged)

    def to_json(self) -> dict[str, Any]:
        out = {k: getattr(self, k) for k in self.__dataclass_fields__}
        out["time"] = walltime.check_time(self.duration, self.time)
        return out


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
        if getattr(exc, "fixture", None):
            out["raised_fixture"] = exc.fixture
    elif isinstance(exc, pytest.skip.Exception):
        out.update(reason=str(exc.msg))
    elif exc is not None:
        # a check stopped by its time bound is rendered by the plugin; anything else escaping a check that is
        # not the user's object raising is ours (an internal error), or a fixture of the user's at setup
        kind = "timeout" if type(exc).__name__ == "CheckStopped" else "internal" if when == "call" else "setup"
        out.update(error=f"{type(exc).__name__}: {exc}", error_kind=kind)
    elif measured:
        out.update(evidence=list(measured["evidence"]), data=jsonable(measured["data"]))
        if measured.get("not_judged"):
            out["not_judged"] = jsonable(measured["not_judged"])
    return out


def partly_judged_text(not_judged: list[dict[str, str]]) -> str:
    """What a partly judged pass adds to its verdict: "partly judged: prompt not judged" ('' for a full pass)."""
    if not not_judged:
        return ""
    return "partly judged: " + "; ".join(f"{p['part']} not judged" for p in not_judged)


#: what each domain's checks need handed over to judge a pipeline: said when a selected domain judged nothing
HAND_OVER = {
    "llm": "dlcheck_tokenizer and token batches: dlcheck_dataloader (or dlcheck_collator + dlcheck_dataset) yielding "
    "mappings of input_ids / labels / attention_mask, or a transformers/TRL dlcheck_trainer",
    "vision": "dlcheck_model and images: dlcheck_dataloader or dlcheck_dataset (and their eval twins), with "
    "dlcheck_train_transform / dlcheck_eval_transform",
    "diffusion": "dlcheck_pipeline (or dlcheck_unet, dlcheck_vae, dlcheck_noise_scheduler, dlcheck_inference_scheduler) "
    "and dlcheck_training_inputs",
    "rl": "dlcheck_algorithm (Stable-Baselines3), a TRL GRPO/PPO dlcheck_trainer, or dlcheck_env with "
    "dlcheck_advantage_fn",
    "vlm": "a vision-language dlcheck_model with its processor as dlcheck_tokenizer and dlcheck_dataloader",
    "train": "a training: dlcheck_trainer (transformers/TRL), dlcheck_lightning_module + dlcheck_datamodule, or "
    "dlcheck_make_training + dlcheck_dataloader",
    "ckpt": "a training: dlcheck_trainer (transformers/TRL), dlcheck_lightning_module + dlcheck_datamodule, or "
    "dlcheck_make_training + dlcheck_dataloader (+ dlcheck_save_checkpoint / dlcheck_load_checkpoint)",
    "smoke": "a training: dlcheck_trainer (transformers/TRL), dlcheck_lightning_module + dlcheck_datamodule, or "
    "dlcheck_make_training + dlcheck_dataloader",
    "dist": "dlcheck_make_training + dlcheck_dataloader (with dlcheck_dist_wrap), or a transformers/TRL "
    "dlcheck_trainer",
}
#: the counts of one domain's coverage, in the order the summary says them
COVERAGE = (
    "selected",
    "judged",
    "failed",
    "passed",
    "partly_judged",
    "error",
    "not_applicable",
    "missing_role",
    "undecided",
)


def coverage(results: list[Result]) -> dict[str, dict[str, int]]:
    """Per domain, how many selected checks judged the pipeline: ``judged`` counts the verdicts on all a check
    judges (its failures and its full passes); a pass that judged only part of its subject is ``partly_judged``,
    apart; the rest did not judge (errors, not applicable, a missing role, undecided)."""
    out: dict[str, dict[str, int]] = {}
    for r in sorted(results, key=lambda r: _id_order(r.id)):
        c = out.setdefault(r.domain, dict.fromkeys(COVERAGE, 0))
        c["selected"] += 1
        kind = "partly_judged" if r.partly_judged else "undecided" if r.outcome == "skipped" else r.outcome
        c[kind] += 1
        if kind in ("failed", "passed"):
            c["judged"] += 1
    return out


def _missing_fixtures(results: list[Result]) -> list[str]:
    """The fixtures the missing-role skips ask for, each once ("dlcheck_compute_metrics (or ...)")."""
    import re

    out: list[str] = []
    for r in results:
        m = re.match(rf"{re.escape(MISSING_ROLE)}\s*define fixture (.*?) in conftest\.py", r.reason)
        for wanted in _top_level_parts(m.group(1)) if m else []:
            if wanted and wanted not in out:
                out.append(wanted)
    return out


def _top_level_parts(text: str) -> list[str]:
    """``text`` split at the "; " outside parentheses ("a (PPO; or b); c" is "a (PPO; or b)" and "c")."""
    parts, depth, start = [], 0, 0
    for i, ch in enumerate(text):
        depth += (ch == "(") - (ch == ")")
        if ch == ";" and depth == 0:
            parts.append(text[start:i].strip())
            start = i + 1
    return [*parts, text[start:].strip()]


def judged_nothing(selection: str, results: list[Result]) -> list[str]:
    """The health check: for each domain named in ``selection`` (``--dlcheck=llm``) whose checks ran and
    judged nothing of the pipeline (no failure, no full pass, no error), a usage error saying what to hand
    over; under ``all``, one when no domain judged anything. Checks selected by ID are not held to it."""
    tokens = [t.lower() for t in registry.split_tokens(selection)]
    cov = coverage(results)
    named = [d for d in registry.DOMAINS if d in tokens and d in cov]
    if "all" in tokens and cov and not any(c["judged"] or c["error"] for c in cov.values()):
        named = ["all"]
    out = []
    for domain in named:
        mine = [r for r in results if domain in ("all", r.domain)]
        c = cov[domain] if domain != "all" else {k: sum(x[k] for x in cov.values()) for k in COVERAGE}
        if c["judged"] or c["error"]:
            continue
        counts = ", ".join(
            f"{c[k]} {label}"
            for k, label in (
                ("partly_judged", "partly judged"),
                ("not_applicable", "not applicable"),
                ("missing_role", "missing a role"),
                ("undecided", "undecided"),
            )
            if c[k]
        )
        text = f"--dlcheck={domain} judged nothing of this pipeline (0 of {c['selected']} checks judged: {counts})."
        reasons = Counter(grouped_reason(r.id, r.reason) for r in mine if r.outcome == "not_applicable")
        if reasons:
            reason, n = reasons.most_common(1)[0]
            text += f" {n} of them not applicable: {reason[len(NOT_APPLICABLE) :].strip()}."
        needs = [HAND_OVER[domain]] if domain in HAND_OVER else []
        missing = _missing_fixtures(mine)
        if needs:
            text += f" The {domain} checks judge {needs[0]}."
        if missing:
            text += f" Hand over: {'; '.join(missing)}."
        text += (
            " Or select the domains that concern it." if domain == "all" else f" Or leave {domain} out of --dlcheck."
        )
        out.append(text)
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
        if info.get("time"):
            res.time = info["time"]  # cumulative over setup and call
        if report.outcome == "passed":
            for key in ("evidence", "data", "not_judged"):
                if info.get(key):
                    setattr(res, key, info[key])
            return
        if report.failed:
            # a fixture that raised while the check ran is an ERROR to pytest too (plugin.pytest_report_teststatus)
            raised = report.when != "call" or bool(info.get("raised_fixture"))
            res.pytest_outcome = "error" if raised else "failed"
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
        results = list(self.results.values())
        cov = coverage(results)
        folded = self.folded(cov)
        colours = {"passed": {"green": True}, "failed": {"red": True}, "error": {"red": True}}
        labels = {**LABELS, "partly_judged": "partly judged", "undecided": "skipped"}
        for domain, c in cov.items():
            if domain in folded:
                continue
            tr.write(f"{domain:<10} {c['judged']} of {c['selected']} judged: ")
            counts = [(k, c[k]) for k in COVERAGE[2:] if c[k]]
            for i, (o, n) in enumerate(counts):
                tr.write((", " if i else "") + f"{n} {labels[o]}", **colours.get(o, {"yellow": True}))
            tr.write("\n")
        if folded:
            n = sum(cov[d]["selected"] for d in folded)
            tr.write_line(f"{'n/a':<10} {', '.join(folded)}: {n} checks of kinds of pipeline this one is not")
        failed = sorted({r.id for r in results if r.outcome == "failed"}, key=_id_order)
        if failed:
            tr.write_line("failed:    " + " ".join(failed), red=True)
        errors = sorted(
            {f"{r.id} ({ERROR_KINDS.get(r.error_kind, 'error')})" for r in results if r.outcome == "error"},
            key=lambda t: _id_order(t.split()[0]),
        )
        if errors:
            tr.write_line("error:     " + " ".join(errors), red=True)
        partly: dict[tuple[str, str], list[str]] = {}  # the same unjudged part and reason: one line
        for r in sorted(results, key=lambda r: _id_order(r.id)):
            for p in r.not_judged if r.partly_judged else []:
                ids = partly.setdefault((p["part"], p["reason"]), [])
                ids += [] if r.id in ids else [r.id]
        for (part, reason), ids in partly.items():
            tr.write_line(f"partly:    {' '.join(ids)}: {part} not judged: {reason}", yellow=True)
        for outcome, label in (
            ("missing_role", "skipped:  "),
            ("not_applicable", "n/a:      "),
            ("skipped", "not run:  "),
        ):
            grouped = Counter(  # the same reason, whichever check gave it, is one line
                grouped_reason(r.id, r.reason)
                for r in results
                if r.outcome == outcome
                and r.domain not in folded
                and (outcome != "skipped" or r.reason.startswith(NOT_RUN))
            )
            for reason, n in sorted(grouped.items()):
                text = reason.removeprefix(NOT_RUN).strip() if outcome == "skipped" else reason
                tr.write_line(f"{label} {text} ({n} check{'s' if n > 1 else ''})")
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
            tr.write_line(f"info:      {status_text(text, 200)}")  # cut where a clause ends, never in a word
        shared = walltime.shared_runs(results)
        spent = work_total(list(self.results.values()), shared)
        if spent["forward"] or spent["optimizer_steps"]:
            tr.write_line(
                f"cost:      {spent['forward']} forward passes, {spent['backward']} backward passes, "
                f"{spent['optimizer_steps']} optimizer steps (per check and per shared run in the JSON report)"
            )
        for res in walltime.slowest(results, getattr(self.config.option, "durations", None)):
            tr.write_line(f"time:      {walltime.line(res, shared)}")
        for option, label in (("dlcheck_json", "json"), ("dlcheck_report", "report")):
            path = getattr(self.config.option, option, None)
            if path:
                tr.write_line(f"{label + ':':<10} {path}")
        for text in self.health():
            tr.write_line(f"dlcheck usage error: {text}", red=True, bold=True)

    def selection(self) -> str:
        state = self.config.stash.get(STATE_KEY, None)
        return state.spec if state is not None else getattr(self.config.option, "dlcheck", None) or ""

    def health(self) -> list[str]:
        """A usage error per selected domain that judged nothing (see :func:`judged_nothing`)."""
        return judged_nothing(self.selection(), list(self.results.values()))

    def folded(self, cov: dict[str, dict[str, int]]) -> list[str]:
        """Under ``all``, the domains that do not concern the pipeline (every check of theirs not applicable):
        said in one line, without their reasons."""
        if "all" not in [t.lower() for t in registry.split_tokens(self.selection())]:
            return []
        return [d for d, c in cov.items() if c["not_applicable"] == c["selected"]]

    @pytest.hookimpl(trylast=True)
    def pytest_sessionfinish(self, session: pytest.Session) -> None:
        if hasattr(self.config, "workerinput"):
            return  # an xdist worker: the controller writes the reports
        if self.health() and session.exitstatus == pytest.ExitCode.OK:
            session.exitstatus = pytest.ExitCode.USAGE_ERROR  # a selected domain judged nothing: not a green run
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
            "coverage": coverage(results),
            "health": judged_nothing(self.selection(), results),
            "cost": work_total(results, shared := walltime.shared_runs(results)),
            "results": [r.to_json() for r in results],
            "shared": shared,
            "time": walltime.totals(results, shared),
        }


def work_total(results: list[Result], shared: dict[str, dict[str, Any]]) -> dict[str, int]:
    """The session's work: the checks' own passes and steps plus the shared runs' (each counted once, as the run's)."""
    return {
        k: sum(r.cost.get(k, 0) for r in results) + sum((run.get("cost") or {}).get(k, 0) for run in shared.values())
        for k in walltime.WORK
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


#: where the whole evidence of a pass is, when the -v line shows only its first clauses
MORE = "… (-rA)"


def status_text(text: str, limit: int = 160) -> str:
    """The evidence beside ``PASSED``: whole up to ``limit`` characters (the terminal wraps it), else up to the
    last clause that fits, cut where a clause ends outside parentheses ("; ", ", ", ": ", " (") and never
    inside a word, a number or a parenthesis, with a pointer to ``-rA``, which prints the whole evidence (as
    the JSON report keeps it)."""
    if len(text) <= limit:
        return text
    room = limit - len(MORE) - 1
    depth, cut = 0, 0
    for i, ch in enumerate(text[: room + 1]):
        if ch == " " and depth == 0 and (text[i - 1 : i] in (";", ",", ":") or text[i + 1 : i + 2] == "("):
            cut = i
        depth += {"(": 1, ")": -1}.get(ch, 0)
    if cut < 12:  # no clause worth showing: the pointer alone
        return "evidence: -rA"
    return f"{text[:cut].rstrip(' ,;:')} {MORE}"
