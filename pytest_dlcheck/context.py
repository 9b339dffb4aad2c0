"""The ``dlcheck`` fixture's value: what a running check uses to reach roles, settings, shared samples,
and to fail or skip in the house format."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, NoReturn

import pytest

from . import registry, twin
from .cost import shared_run, used_shared, users_work
from .errors import MISSING, CheckFailed, RoleError
from .report import NOT_RUN, jsonable
from .roles import ROLES, derive, given
from .session import (
    ARTIFACTS_KEY,
    CHECK_KEY,
    CONTEXT_KEY,
    MEASURED_KEY,
    MISSING_ROLE,
    NOT_APPLICABLE,
    DlcheckState,
    session_state,
    user_call,
    where_raised,
)


def fixture_role(request: pytest.FixtureRequest, name: str) -> Any:
    """The value of fixture ``dlcheck_<name>`` as checks may use it (None is MISSING, a value breaking
    the role's contract a RoleError). A fixture that raises is that role's error, reported at the
    user's fixture; raises FixtureLookupError when nobody defines the fixture."""
    try:
        with users_work():  # built during the check's call, it is still the user's fixture, not the check's work
            value = request.getfixturevalue(f"dlcheck_{name}")
    except pytest.FixtureLookupError as exc:
        if getattr(exc, "argname", None) in (None, f"dlcheck_{name}"):
            raise  # nobody defines it: derive it, or skip
        raise RoleError(name, f"the fixture needs fixture {exc.argname!r}, which nothing defines") from None
    except (RoleError, CheckFailed, pytest.skip.Exception, pytest.fail.Exception, KeyboardInterrupt, SystemExit):
        raise
    except Exception as exc:
        text = " ".join(str(exc).split())
        fixture = _raising_fixture(exc, f"dlcheck_{name}")
        where = getattr(request.node.parent, "nodeid", "")  # the checks of one conftest.py: another may define it too
        first = request.config.stash.setdefault(RAISED_KEY, {}).setdefault((where, fixture), request.node.name)
        if first != request.node.name:  # reported once, where it first raised (pytest's own ERROR)
            pytest.skip(
                f"{NOT_RUN} fixture {fixture} raised {type(exc).__name__} (reported once: the ERROR of {first})"
            )
        role = fixture.removeprefix("dlcheck_") if fixture.removeprefix("dlcheck_") in ROLES else name
        who = "the fixture" if fixture == f"dlcheck_{role}" else f"fixture {fixture}"
        error = RoleError(role, f"{who} raised {type(exc).__name__}: {text}{where_raised(exc)}")
        error.fixture = fixture
        raise error from exc
    return given(name, value)


#: the fixtures that raised in this session (per directory of checks), each with the check item that reported
#: it (its one ERROR)
RAISED_KEY = pytest.StashKey[dict]()
#: the roles a check resolved through the plugin's own default fixtures (derived from other roles, not given)
DEFAULTED_KEY = pytest.StashKey[set]()


def _raising_fixture(exc: BaseException, default: str) -> str:
    """The name of the fixture whose function raised ``exc``: the innermost one pytest called (a role's
    fixture may raise in a fixture it depends on)."""
    import traceback

    name = default
    for frame, _ in traceback.walk_tb(exc.__traceback__):
        if frame.f_code.co_name == "call_fixture_func":
            name = getattr(frame.f_locals.get("request"), "fixturename", None) or name
    return name


#: the roles that hold a model a check runs or trains: with --dlcheck-twin they resolve to its tiny twin
TWINNED = ("model",)


class CheckContext:
    def __init__(self, request: pytest.FixtureRequest, check: registry.Check, state: DlcheckState):
        self.request = request
        self.check = check
        self.state = state
        self._roles: dict[str, Any] = {}
        #: a required role that is unusable: raised when the check runs
        self.error: RoleError | None = None
        #: roles whose fixture returned None (skips say so rather than "define the fixture")
        self._none: set[str] = set()
        #: the results of memo() this check used, in order (samples among them), and the last values the
        #: user's objects returned through call(): what a crash of the check is diagnosed from
        self.used: list[tuple[Any, str, Any]] = []
        self.returned: list[tuple[str, Any]] = []
        #: property mode puts each generated sample here; get_sample returns it instead of the real one
        self.sample_override: Any = None

    def release(self) -> None:
        """Once the item is over (its verdict rendered), let go of what the check used and what the user's
        objects returned: the item stays for the whole session, the models it read need not (a spare let go
        by the session would otherwise stay alive here)."""
        self.used.clear()
        self.returned.clear()

    @classmethod
    def for_item(cls, request: pytest.FixtureRequest) -> CheckContext:
        check = request.node.stash.get(CHECK_KEY, None)
        if check is None:
            pytest.fail("the `dlcheck` fixture belongs to pytest-dlcheck's own check items", pytrace=False)
        ctx = cls(request, check, session_state(request.config))
        request.node.stash[CONTEXT_KEY] = ctx  # the item explains a crash with the roles it resolved
        request.addfinalizer(ctx.release)
        if ctx.state.twin and check.needs_real_weights:
            ctx.not_applicable(f"with --dlcheck-twin: {check.needs_real_weights}, not a tiny twin's")
        read = dict(ctx._roles)
        try:
            kind = registry.wrong_kind(check.domain, ctx)
        except RoleError:
            kind = None  # a role that raises is reported where the check needs it
        if not kind:
            ctx._roles = read  # what the kind rule looked at is not what the check read
        if kind:
            ctx.not_applicable(kind)
        try:
            ctx.require(*check.roles)
        except RoleError as exc:
            if getattr(exc, "fixture", None):
                raise  # a fixture that raised: pytest's own ERROR at setup, naming it (once: see fixture_role)
            # reported by the check's call as its failure (house format), not as a setup error
            ctx.error = exc
        return ctx

    # ---- roles -------------------------------------------------------------------------------------

    def role(self, name: str) -> Any:
        """The user's object for role ``name`` (given, or derived from the others), or MISSING. A role
        without a default fixture (a domain's own) is derived here when the user defines no fixture."""
        if name not in self._roles:
            try:
                value = fixture_role(self.request, name)
                if value is MISSING and self._returned_none(name):
                    self._none.add(name)
            except pytest.FixtureLookupError:
                value = user_call(name, lambda: derive(name, self.role, self.state.derived))
            if self.state.twin and name in TWINNED and value is not MISSING and self.check.id not in twin.REAL_OBJECTS:
                value = self._twin(name, value)
            self._roles[name] = value
        return self._roles[name]

    def _twin(self, name: str, model: Any) -> Any:
        """With --dlcheck-twin, the tiny twin of the user's model (pytest_dlcheck.twin); the user's own
        ``dlcheck_twin_model`` when they give one."""
        try:
            given = fixture_role(self.request, "twin_model")
        except pytest.FixtureLookupError:
            given = MISSING
        twin.USER_TWIN = None if given is MISSING or name != "model" else given
        made = twin.twin_of(model)
        if made is model and not twin.is_twin(model):
            device = next((p.device.type for p in model.parameters()), None) if hasattr(model, "parameters") else None
            if device == "meta":
                self.not_applicable(
                    f"--dlcheck-twin: no twin of {type(model).__name__} can be built from its config and its weights "
                    "are empty (meta device); define dlcheck_twin_model with a small model of the same architecture"
                )
        return made

    def _returned_none(self, name: str) -> bool:
        try:
            return self.request.getfixturevalue(f"dlcheck_{name}") is None
        except Exception:  # noqa: BLE001 - only for the wording of a skip
            return False

    def has(self, name: str) -> bool:
        return self.role(name) is not MISSING

    def given(self, name: str) -> bool:
        """The user defines fixture ``dlcheck_<name>`` themselves (not derived from their other roles)."""
        return self.has(name) and name not in self.request.node.stash.get(DEFAULTED_KEY, set())

    def optional(self, name: str) -> Any:
        """The role's object, or None when nobody provided it."""
        value = self.role(name)
        return None if value is MISSING else value

    def require(self, *names: str) -> list[Any]:
        """Resolve roles; skip with one line naming every missing fixture."""
        values = [self.role(n) for n in names]
        missing = [
            ROLES[n].hint() if n in ROLES else f"dlcheck_{n}"
            for n, v in zip(names, values)
            if v is MISSING and n not in self._none
        ]
        nones = [f"dlcheck_{n}" for n, v in zip(names, values) if v is MISSING and n in self._none]
        if missing:
            reason = registry.not_concerned(self.check.domain, self)
            if reason:
                self.not_applicable(reason)
        if missing or nones:
            parts = ([f"define fixture {'; '.join(missing)} in conftest.py"] if missing else []) + [
                f"{n} returned None" for n in nones
            ]
            pytest.skip(self._where(f"{MISSING_ROLE} {'; '.join(parts)}"))
        return values

    def _where(self, reason: str) -> str:
        """A missing role's words for where roles come from in this run: with roles named on the command
        line (``--dlcheck-trainer``, ``--dlcheck-role``) and no conftest.py, "in conftest.py" alone would
        send the user to a file they do not have."""
        if " in conftest.py" not in reason or not self.request.config.pluginmanager.has_plugin("dlcheck-builders"):
            return reason
        return reason.replace(
            " in conftest.py",
            " in conftest.py, or name it on the command line (--dlcheck-role=NAME=module:callable)",
            1,
        )

    def call(self, role: str, fn: Callable[[], Any], synthetic: bool | str = False) -> Any:
        """Run a user's object; its exceptions are reported as that role's error, not as a plugin crash.
        ``synthetic``: the object is handed an input the check made up (in words when a string: "a batch
        with one example perturbed"): its exception is then an internal error of pytest-dlcheck naming that
        input, not the role's (the pipeline's own inputs may never meet that condition)."""
        value = user_call(role, fn, synthetic)
        self.returned = self.returned[-7:] + [(role, value)]
        return value

    # ---- settings and sharing ----------------------------------------------------------------------

    def setting(self, name: str) -> Any:
        return self.state.setting(self.check, name)

    @property
    def samples(self) -> int:
        return self.state.samples

    @property
    def batch_size(self) -> int:
        return self.state.batch_size

    def memo(self, sources: Any, key: str, make: Callable[[], Any], spare: bool = False) -> Any:
        label = shared_label(key)
        if self.state.made(sources, key):
            value = self.state.memo(sources, key, make, spare)
        else:
            with shared_run(label, self.check.id):  # timed apart: the run's, not this check's
                value = self.state.memo(sources, key, make, spare)
        used_shared(label)
        self.used.append((sources, key, value))
        return value

    # ---- pictures and numbers for the reports -------------------------------------------------------

    def attach(self, kind: str, **payload: Any) -> None:
        """Record a picture's data for the HTML/JSON reports: ``tokens`` (an llm batch token by token),
        ``images`` (sample inputs with their boxes/masks and channel statistics), ``histogram``,
        ``series``. Payloads are plain data (tensors become lists)."""
        self.request.node.stash.setdefault(ARTIFACTS_KEY, []).append({"kind": kind, **jsonable(payload)})

    # ---- verdicts ----------------------------------------------------------------------------------

    def measured(self, *evidence: str, **data: Any) -> None:
        """Record what a passing check measured — counts, the numbers compared, what was looked at. A pass
        carries this evidence (``-v``/``-rA``, the JSON and the HTML report); a check that found nothing
        to judge does not pass: it skips (``not_applicable`` or a missing role) instead."""
        record = self.request.node.stash.setdefault(MEASURED_KEY, {"evidence": [], "data": {}})
        record["evidence"].extend(str(e) for e in evidence)
        record["data"].update(jsonable(data))

    def not_judged(self, part: str, reason: str) -> None:
        """Record that ``part`` of what this check judges was not judged, and why ("prompt", "the batches
        carry no chat template"). The check still passes on what it did judge; its verdict then says which
        part it left ("passed: padding; prompt not judged: ..."), and the summary counts it apart, as
        "partly judged". A check that judged none of its parts does not pass: it skips."""
        record = self.request.node.stash.setdefault(MEASURED_KEY, {"evidence": [], "data": {}})
        record.setdefault("not_judged", []).append({"part": str(part), "reason": " ".join(str(reason).split())})

    def not_applicable(self, reason: str) -> NoReturn:
        """The check does not concern this kind of pipeline (PPO has no KL reference, a pixel-space model
        has no VAE): said as such, and summarised apart from missing roles."""
        pytest.skip(f"{NOT_APPLICABLE} {reason}")

    def fail(self, evidence: list[str] | str, cause: str, fix: str, **data: Any) -> NoReturn:
        raise CheckFailed([evidence] if isinstance(evidence, str) else list(evidence), cause, fix, data)

    def skip(self, reason: str) -> NoReturn:
        """Skip saying why. A missing role of a domain that does not concern this kind of pipeline (an env
        asked of an SFT pipeline) is "not applicable" instead, as in :meth:`require`."""
        if reason.startswith(MISSING_ROLE):
            other = registry.not_concerned(self.check.domain, self)
            if other:
                self.not_applicable(other)
            reason = self._where(reason)
        pytest.skip(reason)

    def __repr__(self) -> str:
        return f"<dlcheck {self.check.id} roles={sorted(self._roles)}>"


__all__ = ["MISSING", "CheckContext"]


#: the readable names of the shared runs, by their memo key's first part (the reports' "shared")
SHARED_LABELS = {"smoke": "smoke run", "sample": "sampled batches", "derive": "derived role", "resume": "resumed run"}


def shared_label(key: str) -> str:
    """A shared run's name in the reports: "smoke run", "sampled batches (train)", else the memo key."""
    head, _, rest = key.partition(":")
    if head == "smoke":
        return "smoke run"
    if head == "sample":
        return f"sampled batches ({rest.split(':')[0]})"
    if head in SHARED_LABELS:
        return f"{SHARED_LABELS[head]} ({rest})"
    return key
