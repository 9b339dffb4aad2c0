"""The session's state and how a user's object is called: the stash keys, the state every check
shares (selection, settings, the memo of shared work), and :func:`user_call`, which tells the user's
exception from the plugin's own. Imported by the context, the sampling and the training machinery; it
imports only the bottom of the core."""

from __future__ import annotations

import contextlib
import gc
import importlib.util
import os
import traceback
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest

from .cost import user_time
from .errors import CheckFailed, RoleError

if TYPE_CHECKING:
    from .registry import Check

STATE_KEY = pytest.StashKey["DlcheckState"]()
CHECK_KEY = pytest.StashKey["Check"]()
CONTEXT_KEY = pytest.StashKey[Any]()
ARTIFACTS_KEY = pytest.StashKey[list]()
#: what a passing check measured: {"evidence": [lines], "data": {name: number}}
MEASURED_KEY = pytest.StashKey[dict]()
COST_KEY = pytest.StashKey[dict]()

#: the reason prefixes of the outcomes that are skips in pytest's terms
MISSING_ROLE = "missing role:"
NOT_APPLICABLE = "not applicable:"

#: seconds a check may run before it is stopped and reported (a hung dataloader, an endless user loop)
DEFAULT_TIMEOUT = 300.0


def _plugin_dirs() -> tuple[str, ...]:
    """Where pytest-dlcheck's own code lives: the core, and the checks (installed as
    ``pytest_dlcheck.checks``, kept at the top of the source tree: another directory in a checkout)."""
    core = str(Path(__file__).resolve().parent)
    spec = importlib.util.find_spec("pytest_dlcheck.checks")
    extra = [str(Path(p).resolve()) for p in (spec.submodule_search_locations or [])] if spec else []
    return tuple(dict.fromkeys([core, *extra]))


#: directories of the plugin's code: a frame there is pytest-dlcheck's, not the user's
PLUGIN_DIRS = _plugin_dirs()


def in_plugin(filename: str) -> bool:
    return filename.startswith(PLUGIN_DIRS)


@dataclass
class DlcheckState:
    selected: list[Check]
    spec: str
    spec_source: str
    samples: int
    batch_size: int
    overrides: dict[tuple[str, str], Any]
    property_examples: int = 0
    #: seconds a check may run; 0: unbounded
    timeout: float = DEFAULT_TIMEOUT
    shared: dict[Any, Any] = field(default_factory=dict)
    #: strong references to the objects whose ids key ``shared`` so an id is never reused
    keep_alive: list[Any] = field(default_factory=list)
    #: the conftest.py files whose checks this process collected
    role_files: list[str] = field(default_factory=list)
    #: --dlcheck-twin: the checks run and train a tiny twin of the model (pytest_dlcheck.twin)
    twin: bool = False
    #: the keys of ``shared`` that hold spares: objects rebuilt at will, the same every time (the probe model,
    #: the smoke run's trained objects read back from disk), let go by :meth:`make_room`
    spares: set[Any] = field(default_factory=set)

    def memo(self, sources: Any, key: str, make: Callable[[], Any], spare: bool = False) -> Any:
        """Compute once per session per (source objects, key); the hub of work sharing across checks. A
        ``spare`` is kept only until the next :meth:`make_room`, then made again by whoever needs it."""
        objs = sources if isinstance(sources, tuple) else (sources,)
        k = self._key(sources, key)
        if k not in self.shared:
            self.shared[k] = make()
            self.keep_alive.append(objs)
        if spare:
            self.spares.add(k)
        return self.shared[k]

    def made(self, sources: Any, key: str) -> bool:
        """Whether :meth:`memo` already holds this work."""
        return self._key(sources, key) in self.shared

    @staticmethod
    def _key(sources: Any, key: str) -> tuple[Any, str]:
        objs = sources if isinstance(sources, tuple) else (sources,)
        return tuple(id(o) for o in objs), key

    def make_room(self) -> None:
        """Let the spares go (a check still holding one keeps it until it ends): called before a training
        state is built, so that no copy of the model kept for other checks lives beside it. A spare a
        finished check's exception still reaches (its traceback's frames: a cycle) is collected too."""
        if not self.spares:
            return
        for k in self.spares:
            self.shared.pop(k, None)
        self.spares.clear()
        collect_freed()

    def derived(self, sources: Any, key: str, make: Callable[[], Any]) -> Any:
        return self.memo(sources, "derive:" + key, make)

    def guarded_user_call(self, role: str, call: Callable[[], Any], synthetic: bool | str = False) -> Any:
        return user_call(role, call, synthetic)

    def setting(self, check: Check, name: str) -> Any:
        return self.overrides.get((check.id, name), check.setting(name).default)


def session_state(config: pytest.Config) -> DlcheckState:
    return config.stash[STATE_KEY]


def collect_freed() -> None:
    """Collect what is unreachable (a finished clone held in a cycle by its callbacks, a spare a traceback
    reaches) and hand the freed heap back to the system (glibc's ``malloc_trim``: the freed weights of one
    check otherwise stay in the process's resident memory, beneath the next check's training state)."""
    gc.collect()
    trim = _malloc_trim()
    if trim is not None:
        trim(0)


def _malloc_trim() -> Any:
    global _TRIM
    if _TRIM is False:
        try:
            import ctypes

            _TRIM = ctypes.CDLL("libc.so.6").malloc_trim
        except (OSError, AttributeError):  # not glibc (macOS, musl, Windows): nothing to hand back this way
            _TRIM = None
    return _TRIM


_TRIM: Any = False


#: the attribute of an exception the user's code raised on an input pytest-dlcheck made up: the made-up input,
#: in words (an internal error of the plugin, not the user's; see :func:`user_call`)
SYNTHETIC_ATTR = "__dlcheck_synthetic__"


def user_call(role: str, call: Callable[[], Any], synthetic: bool | str = False) -> Any:
    """Run a user's object. An exception raised in the user's code becomes a :class:`RoleError` naming
    the role and where it was raised; one raised inside the plugin itself propagates as a plugin bug.

    ``synthetic``: the user's object is handed an input pytest-dlcheck made up (a perturbed batch, a generated
    rollout, a concatenation of batches), said in words when a string. Its exception is then not the user's:
    it propagates as an internal error of the plugin, marked with what the made-up input was (the pipeline's
    own inputs may never have met that condition)."""
    try:
        with user_time(_category(role)):
            return call()
    except (RoleError, CheckFailed, pytest.skip.Exception, pytest.fail.Exception, KeyboardInterrupt):
        raise
    except Exception as exc:
        frames = traceback.extract_tb(exc.__traceback__)
        if frames and in_plugin(frames[-1].filename):
            raise
        synthetic = synthetic or (_MADE_UP[-1] if _MADE_UP else False)
        if synthetic_input(exc) is not None:  # an inner call marked it: raised on an input pytest-dlcheck made up
            raise
        if synthetic:
            what = synthetic if isinstance(synthetic, str) else "an input pytest-dlcheck made up"
            if synthetic_input(exc) is None:  # an inner call named the input already
                mark_synthetic(exc, f"dlcheck_{role} raised it on {what}")
            raise
        raise RoleError(role, f"raised {type(exc).__name__}: {_text(exc)}{where_raised(exc)}") from exc


def _category(role: str) -> str:
    """The wall-time category of a user's object (:mod:`pytest_dlcheck.cost`): its data, or its own callable."""
    return "data" if any(w in role for w in ("data", "loader", "collator", "batch")) else "calls"


#: the made-up inputs the user's code is being handed now (innermost last): see :func:`made_up`
_MADE_UP: list[str] = []


@contextlib.contextmanager
def made_up(what: str) -> Iterator[None]:
    """Every :func:`user_call` inside is handed an input pytest-dlcheck made up (``what``, in words), however
    deep in the shared machinery (a perturbed batch through a training setup's loss): its exception is an
    internal error of the plugin naming that input, not the role's."""
    _MADE_UP.append(what)
    try:
        yield
    finally:
        _MADE_UP.pop()


def mark_synthetic(exc: BaseException, what: str) -> None:
    """Mark ``exc`` as raised by the user's code on an input the plugin made up (``what``, in words)."""
    try:
        setattr(exc, SYNTHETIC_ATTR, what)
    except (AttributeError, TypeError):  # an exception type with __slots__: the attribution is lost, not the error
        pass


def synthetic_input(exc: BaseException) -> str | None:
    """What made-up input the user's code raised ``exc`` on (see :func:`user_call`), or None: marked on the
    exception itself or on the one it was raised from."""
    for one in (exc, exc.__cause__):
        what = getattr(one, SYNTHETIC_ATTR, None)
        if isinstance(what, str):
            return what
    return None


def where_raised(exc: BaseException) -> str:
    """`` (in fn at file:line)`` for the user's own frame (not a library's) where ``exc`` was raised, else
    the innermost frame outside the plugin; '' when it was raised in the plugin itself."""
    frames = traceback.extract_tb(exc.__traceback__)
    outside = [f for f in frames if not in_plugin(f.filename)]
    own = [f for f in outside if not _library(f.filename)]
    frame = (own or outside or [None])[-1]
    return "" if frame is None else f" (in {frame.name} at {_short_path(frame.filename)}:{frame.lineno})"


def _library(filename: str) -> bool:
    return "site-packages" in filename or "dist-packages" in filename or filename.startswith("<")


def _text(exc: BaseException, limit: int = 300) -> str:
    try:
        text = str(exc)
    except Exception:  # noqa: BLE001 - an exception whose __str__ fails still gets reported
        text = f"<{type(exc).__name__} whose str() failed>"
    text = " ".join(text.split())
    return text if len(text) <= limit else text[: limit - 3] + "..."


def _short_path(path: str) -> str:
    try:
        return os.path.relpath(path)
    except ValueError:
        return path
