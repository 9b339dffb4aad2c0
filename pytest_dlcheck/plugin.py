"""pytest-dlcheck's hooks, registered by the entry point (:mod:`pytest_dlcheck.entry`, which owns the options
and checks the usage) only once ``--dlcheck`` turns the plugin on; importing this module imports neither
torch nor any domain library."""

from __future__ import annotations

import contextlib
import time
from pathlib import Path
from typing import Any

import pytest

from . import registry, twin
from .cost import Cost, counting, merge_run, timing
from .errors import CheckFailed, RoleError
from .isolation import CheckTimeout, as_user, check_frame, checking, hypothesis_home, time_bound
from .outcome import explain, internal_note, render_failure, render_role_error, timeout_rendered
from .property import run_property
from .report import PROPERTY, Results, partly_judged_text, payload, status_text
from .roles import ROLES
from .session import (
    ARTIFACTS_KEY,
    CHECK_KEY,
    CONTEXT_KEY,
    COST_KEY,
    DEFAULT_TIMEOUT,
    MEASURED_KEY,
    STATE_KEY,
    DlcheckState,
    session_state,
)

PROPERTY_SUFFIX = "[property]"


# --------------------------------------------------------------------------------------------------
# session state


def _int_option(config: pytest.Config, name: str, default: int) -> int:
    value = getattr(config.option, name)
    if value is not None:
        return value
    ini = config.getini(name)
    if ini:
        try:
            value = int(ini)
        except ValueError:
            raise pytest.UsageError(f"ini {name} = {ini!r}: expected a positive integer") from None
        if value < 1:
            raise pytest.UsageError(f"ini {name} = {ini!r}: expected a positive integer")
        return value
    return default


def _timeout(config: pytest.Config) -> float:
    if config.option.dlcheck_timeout is not None:
        return config.option.dlcheck_timeout
    ini = config.getini("dlcheck_timeout")
    if not ini:
        return DEFAULT_TIMEOUT
    try:
        value = float(ini)
    except ValueError:
        raise pytest.UsageError(f"ini dlcheck_timeout = {ini!r}: expected a number of seconds") from None
    if not value >= 0:
        raise pytest.UsageError(f"ini dlcheck_timeout = {ini!r}: expected a number of seconds >= 0")
    return value


def _overrides(config: pytest.Config) -> dict[tuple[str, str], Any]:
    checks = registry.load_checks()
    out = {}
    for text in list(config.getini("dlcheck_set")) + list(config.option.dlcheck_set):
        key, sep, value = text.partition("=")
        cid, dot, name = key.strip().partition(".")
        if not sep or not dot:
            raise pytest.UsageError(f"--dlcheck-set {text!r}: expected ID.NAME=VALUE, e.g. L1.atol=1e-3")
        check = checks.get(cid.upper())
        if check is None:
            raise pytest.UsageError(
                f"--dlcheck-set {text!r}: unknown check ID {cid!r}{registry.did_you_mean(cid.upper(), checks)}"
            )
        try:
            setting = check.setting(name)
            out[(check.id, name)] = setting.parse(value.strip())
        except KeyError:
            names = [s.name for s in check.settings]
            raise pytest.UsageError(registry.unknown_setting(text, check.id, name, names)) from None
        except ValueError as exc:
            raise pytest.UsageError(f"--dlcheck-set {text!r}: {exc}") from None
    return out


@pytest.hookimpl(wrapper=True)
def pytest_runtestloop(session: pytest.Session):
    """The objects alive once the tests are collected (the modules torch, transformers, TRL... and the conftest
    files imported: hundreds of thousands of them) are moved out of the garbage collector's sight for the run
    (``gc.freeze``), so that each full collection the checks make between trainings (to free a finished clone
    held in a cycle before the next is built; Accelerate's ``free_memory`` makes one too) walks only what the run
    created: 0.2 s a collection on a transformers project, about 0 after. Objects made during the run (every
    fixture, clone and spare) are collected as before; the collector is given back its objects when the loop
    ends."""
    import gc

    if gc.get_freeze_count():  # the host process froze its own objects already: its freeze is left as it is
        return (yield)
    gc.collect(1)  # the young garbage of the collection (a full collection would walk every object once more)
    gc.freeze()
    try:
        return (yield)
    finally:
        gc.unfreeze()


# --------------------------------------------------------------------------------------------------
# configuration


def configure(config: pytest.Config, spec: str, source: str) -> None:
    """The session's state from the selection ``spec`` (read from ``source``) and the settings; called by the
    entry point's pytest_configure once the plugin is on (the usage was checked there)."""
    ignore = registry.split_tokens(config.getini("dlcheck_ignore")) + registry.split_tokens(
        config.option.dlcheck_ignore
    )
    try:
        selected = registry.select(registry.split_tokens(spec), ignore)
    except ValueError as exc:
        raise pytest.UsageError(str(exc)) from None
    state = DlcheckState(
        selected=selected,
        spec=spec,
        spec_source=source,
        samples=_int_option(config, "dlcheck_samples", 8),
        batch_size=_int_option(config, "dlcheck_batch_size", 4),
        overrides=_overrides(config),
        property_examples=(
            _int_option(config, "dlcheck_property_examples", 30)
            if config.option.dlcheck_property or config.getini("dlcheck_property")
            else 0
        ),
        timeout=_timeout(config),
        twin=bool(config.option.dlcheck_twin or config.getini("dlcheck_twin")),
    )
    config.stash[STATE_KEY] = state
    twin.ACTIVE = state.twin
    twin.reset()
    config.pluginmanager.register(Results(config), "dlcheck-results")


def pytest_report_header(config: pytest.Config) -> list[str] | None:
    state = config.stash.get(STATE_KEY, None)
    if state is None:
        return None
    ids = ",".join(c.id for c in state.selected) or "none"
    mode = f", property mode: {state.property_examples} generated batches per check" if state.property_examples else ""
    return [
        f"dlcheck: {state.spec} (from {state.spec_source}) -> {len(state.selected)} checks [{ids}], "
        f"samples={state.samples}, batch_size={state.batch_size}{mode}"
    ]


def pytest_report_collectionfinish(config: pytest.Config) -> list[str] | None:
    state = config.stash.get(STATE_KEY, None)
    xdist_controller = getattr(config.option, "numprocesses", None) and not hasattr(config, "workerinput")
    if state is None or state.role_files or xdist_controller or not state.selected:
        return None
    return [NO_CHECK_COLLECTED]


#: said after collection and in the summary when --dlcheck is on and no conftest.py hands over a role
NO_CHECK_COLLECTED = (
    "dlcheck: no check collected: no conftest.py defines dlcheck_* fixtures (e.g. dlcheck_model, "
    "dlcheck_trainer); the checks are collected beside the conftest.py that defines them"
)


# --------------------------------------------------------------------------------------------------
# collection: the checks are collected beside each conftest.py that defines dlcheck_* fixtures


def _fixture_names(module: Any) -> set[str]:
    """The fixtures a module defines, named as pytest registers them: the explicit ``name=``, else the
    attribute the fixture is bound to (``dlcheck_model = pytest.fixture(build)`` is ``dlcheck_model``)."""
    names = set()
    for attr, obj in vars(module).items():
        marker = getattr(obj, "_fixture_function_marker", None)
        if marker is None and hasattr(obj, "_pytestfixturefunction"):  # pytest < 8.4
            marker = obj._pytestfixturefunction
        if marker is not None:
            names.add(getattr(marker, "name", None) or attr)
    return names


def _plugin_modules(config: pytest.Config, module: Any) -> list[Any]:
    """The modules a conftest.py brings in with ``pytest_plugins`` (their fixtures are the conftest's too)."""
    import sys

    declared = getattr(module, "pytest_plugins", ())
    names = [declared] if isinstance(declared, str) else list(declared or ())
    found = []
    for name in names:
        plugin = config.pluginmanager.get_plugin(name) if isinstance(name, str) else None
        plugin = plugin if plugin is not None else sys.modules.get(name) if isinstance(name, str) else None
        if plugin is not None:
            found.append(plugin)
    return found


def _role_fixtures(config: pytest.Config, file_path: Path) -> set[str]:
    module = config.pluginmanager.get_plugin(str(file_path))
    if module is None:
        module = next(
            (p for p in config.pluginmanager.get_plugins() if getattr(p, "__file__", None) == str(file_path)), None
        )
    if module is None:
        return set()
    names = _fixture_names(module)
    for plugin in _plugin_modules(config, module):
        names |= _fixture_names(plugin)
    return {n for n in names if n.startswith("dlcheck_")}


def _unknown_roles(names: set[str]) -> list[str]:
    """``dlcheck_*`` fixtures that are no role, each with the closest role's fixture when there is one."""
    import difflib

    known = {ROLES[r].fixture for r in ROLES}
    out = []
    for name in sorted(names - known):
        close = difflib.get_close_matches(name, sorted(known), n=1, cutoff=0.6)
        out.append(f"{name} (did you mean {close[0]}?)" if close else name)
    return out


def pytest_collect_file(file_path: Path, parent: pytest.Collector) -> pytest.Collector | None:
    state = parent.config.stash.get(STATE_KEY, None)
    if state is None or file_path.name != "conftest.py":
        return None
    if not _role_fixtures(parent.config, file_path):
        return None
    return DlcheckFile.from_parent(parent, path=file_path)


class DlcheckFile(pytest.File):
    """The checks of one directory: a conftest.py that defines roles, claimed as a collection file so
    that every check item's parent chain is the user's own directory node."""

    def collect(self):
        state = session_state(self.config)
        unknown = _unknown_roles(_role_fixtures(self.config, self.path))
        if unknown:
            raise self.CollectError(
                f"{self.path.name}: {'; '.join(unknown)}: no pytest-dlcheck role of that name (fixtures named "
                "dlcheck_* hand objects to the checks; the roles: pytest --dlcheck-list)"
            )
        state.role_files.append(str(self.path))
        for check in state.selected:
            yield CheckItem.from_parent(self, name=check.item_name, callobj=check.func)
            if check.property_mode and state.property_examples:
                yield CheckItem.from_parent(self, name=check.item_name + PROPERTY_SUFFIX, callobj=check.func)


@pytest.hookimpl(wrapper=True)
def pytest_fixture_setup(fixturedef: Any, request: Any):
    """A user's fixture set up while a check runs is built with the user's own hub settings."""
    if not checking() or str(getattr(fixturedef.func, "__module__", "")).startswith("pytest_dlcheck"):
        return (yield)
    with as_user():
        return (yield)


class CheckItem(pytest.Function):
    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        check = registry.load_checks()[self.obj.dlcheck_id]
        self.stash[CHECK_KEY] = check
        self.add_marker("dlcheck")
        self.add_marker(f"dlcheck_{check.domain}")
        self.extra_keyword_matches.add(check.id)
        self._deadline: float | None = None

    @property
    def check(self) -> registry.Check:
        return self.stash[CHECK_KEY]

    @property
    def property_mode(self) -> bool:
        return self.name.endswith(PROPERTY_SUFFIX)

    def runtest(self) -> None:
        with self._guarded(count=True):
            ctx = self.funcargs.get("dlcheck")
            if getattr(ctx, "error", None) is not None:
                raise ctx.error
            if self.property_mode:
                run_property(self.funcargs["dlcheck"], self.obj, session_state(self.config).property_examples)
            else:
                super().runtest()

    def setup(self) -> None:
        # role fixtures run here; deriving a dataloader or a batch may draw from the global RNGs
        timeout = session_state(self.config).timeout
        self._deadline = time.monotonic() + timeout if timeout else None
        with self._guarded():
            super().setup()

    @contextlib.contextmanager
    def _guarded(self, count: bool = False):
        """The check's frame, its time bound (setup and call share one budget), and the explanation of
        what escaped it: a user's object that raised becomes that role's error; a crash of the check's
        own code on an unusable object names the object and what is wrong with it. The call's work is
        counted (``count``); the setup builds the user's fixtures, which are theirs, not the check's."""
        left = None if self._deadline is None else max(self._deadline - time.monotonic(), 1e-3)
        with (
            check_frame(),
            hypothesis_home(self.config),
            counting() if count else contextlib.nullcontext(Cost()) as cost,
            timing(None if count else "fixtures") as clock,  # the setup builds the user's fixtures
        ):
            try:
                with time_bound(left, session_state(self.config).timeout):
                    try:
                        yield
                    finally:
                        total = self.stash.setdefault(COST_KEY, {})
                        for key, value in cost.to_json().items():
                            if isinstance(value, dict):
                                merged = total.setdefault(key, {})
                                for name, n in value.items():
                                    merged[name] = merged.get(name, 0) + n
                            else:
                                total[key] = total.get(key, 0) + value
                        _add_time(self.stash.setdefault(TIME_KEY, {}), clock)
            except (CheckFailed, RoleError, pytest.exit.Exception):
                raise
            except CheckTimeout as exc:
                raise CheckStopped(self, exc) from None
            except Exception as exc:
                explained = explain(self.stash.get(CONTEXT_KEY, None), exc)
                if explained is None:
                    raise
                raise explained from exc

    def repr_failure(self, excinfo: pytest.ExceptionInfo[BaseException]):
        if isinstance(excinfo.value, CheckFailed):
            return render_failure(self.check, excinfo.value)
        if isinstance(excinfo.value, RoleError):
            return render_role_error(self.check, excinfo.value)
        if isinstance(excinfo.value, CheckStopped):
            return excinfo.value.rendered
        rendered = super().repr_failure(excinfo)
        if hasattr(rendered, "addsection") and not isinstance(
            excinfo.value, (pytest.fail.Exception, pytest.exit.Exception)
        ):
            rendered.addsection(
                "pytest-dlcheck internal error",
                internal_note(self.check, self.stash.get(CONTEXT_KEY, None), excinfo.value),
            )
        return rendered

    def reportinfo(self):
        return self.path, 0, f"{self.check.id} {self.check.title}"


#: a check's wall-time accounting (pytest_dlcheck.cost.timing), over its setup and call
TIME_KEY = pytest.StashKey[dict]()


def _add_time(total: dict[str, Any], clock: Any) -> None:
    """Add a clock's seconds to the check's: the user's work per category, the shared runs it made (timed
    apart) and those it read that another check made."""
    user = total.setdefault("user", {})
    for category, seconds in clock.settled().user.items():
        user[category] = user.get(category, 0.0) + seconds
    made = total.setdefault("shared_made", {})
    for label, run in clock.made.items():
        merge_run(made, label, run, run["made_by"])
    waited = total.setdefault("shared_waited", [])
    waited.extend(label for label in clock.used if label not in made and label not in waited)


class CheckStopped(Exception):
    """A check stopped by its time bound, rendered in the house format with where it was."""

    def __init__(self, item: CheckItem, exc: CheckTimeout):
        self.rendered = timeout_rendered(item.check, item.stash.get(CONTEXT_KEY, None), exc)
        super().__init__(str(self.rendered))


# --------------------------------------------------------------------------------------------------
# reporting


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[None]):
    report = yield
    if isinstance(item, CheckItem):
        exc = call.excinfo.value if call.excinfo is not None else None
        if isinstance(exc, (RoleError, CheckFailed, CheckStopped)) and report.when != "call":
            report.longrepr = item.repr_failure(call.excinfo)
        artifacts = item.stash.get(ARTIFACTS_KEY, []) if report.when == "call" else []
        measured = item.stash.get(MEASURED_KEY, None) if report.when == "call" and report.passed else None
        if measured and (measured["evidence"] or measured.get("not_judged")):
            unjudged = [  # each unjudged part, unless the evidence says it already
                f"{p['part']}: not judged, {p['reason']}"
                for p in measured.get("not_judged", [])
                if not any(p["part"] in e and "not judged" in e for e in measured["evidence"])
            ]
            report.sections.append(("dlcheck evidence", "\n".join(measured["evidence"] + unjudged)))
        try:
            info = payload(item.check, report.when, report.outcome, exc, artifacts, measured)
            info["cost"] = dict(item.stash.get(COST_KEY, {}))
            info["time"] = dict(item.stash.get(TIME_KEY, {}))
        except Exception as err:  # noqa: BLE001 - a report must never turn into an INTERNALERROR
            info = payload(item.check, report.when, report.outcome, None, [])
            info["error"] = f"(could not record the outcome's details: {type(err).__name__})"
        report.user_properties.append((PROPERTY, info))
        _name_the_check_in_skip(item.check, report)
    return report


def _name_the_check_in_skip(check: registry.Check, report: pytest.TestReport) -> None:
    """A skip's short line (``-rs``) names the check: its location is the check item itself
    (``SKIPPED [1] conftest.py::L11_eos_supervised: reason``) rather than the conftest.py line every check there
    shares, so the reason stays as the check gave it (``-v`` already shows the item's name beside SKIPPED)."""
    if not report.skipped or hasattr(report, "wasxfail"):
        return
    longrepr = report.longrepr
    if isinstance(longrepr, tuple) and len(longrepr) == 3:
        path, _lineno, reason = longrepr
        name = report.nodeid.rsplit("::", 1)[-1]
        if not str(path).endswith(f"::{name}"):
            report.longrepr = (f"{path}::{name}", None, reason)


def pytest_report_teststatus(report: pytest.TestReport, config: pytest.Config):
    """``-v`` shows what a passing check measured, in one line, beside PASSED. A fixture that raised while a
    check ran is an ERROR, as pytest says of a fixture that raised at setup (and as the summary counts it)."""
    # a CollectReport (a test file that fails to import) has no user properties and no phase: not a check's
    info = next((v for k, v in getattr(report, "user_properties", ()) if k == PROPERTY), None)
    if getattr(report, "when", None) == "call" and report.failed and (info or {}).get("raised_fixture"):
        return "error", "E", "ERROR"
    if getattr(report, "when", None) != "call" or not report.passed:
        return None
    evidence = (info or {}).get("evidence") or []
    not_judged = (info or {}).get("not_judged") or []
    if not evidence and not not_judged:
        return None
    text = " ".join(evidence[0].split()) if evidence else ""
    tail = partly_judged_text(not_judged)  # a partly judged pass says which part it left, whatever the length
    text = status_text(text) + ("; " if tail and text else "") + tail
    return "passed", ".", (f"PASSED ({text})", {"green": True})
