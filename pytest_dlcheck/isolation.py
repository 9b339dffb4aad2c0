"""What surrounds every check: the RNGs seeded and put back, the hub libraries offline, Hypothesis'
cache kept out of the user's repository, and a time bound. Used by the plugin's items only."""

from __future__ import annotations

import contextlib
import os
import signal
import threading
from typing import Any

import pytest

from . import guard

#: the Hugging Face switches a check runs under: offline, no telemetry (a TRL trainer a check builds
#: would otherwise ping the hub from a thread). Only modules already imported are touched.
HUB_SWITCHES = (
    ("huggingface_hub.constants", "HF_HUB_OFFLINE", True),
    ("huggingface_hub.constants", "HF_HUB_DISABLE_TELEMETRY", True),
    ("datasets.config", "HF_HUB_OFFLINE", True),
    ("datasets.config", "HF_DATASETS_OFFLINE", True),
    ("diffusers.utils.hub_utils", "HF_HUB_OFFLINE", True),
    ("diffusers.utils.hub_utils", "HF_HUB_DISABLE_TELEMETRY", True),
)
_HUB_ENV = {"HF_HUB_OFFLINE": "1", "HF_HUB_DISABLE_TELEMETRY": "1", "HF_DATASETS_OFFLINE": "1"}


@contextlib.contextmanager
def hub_switches(values: dict[tuple[str, str], Any] | None = None, env: dict[str, str | None] | None = None):
    """Set the hub switches (offline, no telemetry) — or, given ``values``/``env`` saved by an outer
    call, put the user's own back — and restore what was there afterwards."""
    import sys

    saved: list[tuple[Any, str, Any]] = []
    saved_env = {k: os.environ.get(k) for k in (env or _HUB_ENV)}
    for module, name, on in HUB_SWITCHES:
        mod = sys.modules.get(module)
        if mod is not None and isinstance(getattr(mod, name, None), bool):
            saved.append((mod, name, getattr(mod, name)))
            setattr(mod, name, on if values is None else values.get((module, name), getattr(mod, name)))
    for key, value in (env or _HUB_ENV).items():
        if value is None:
            os.environ.pop(key, None)
        else:
            os.environ[key] = value
    try:
        yield {(m.__name__, n): v for m, n, v in saved}, saved_env
    finally:
        for mod, name, value in reversed(saved):
            setattr(mod, name, value)
        for key, value in saved_env.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value


#: the user's hub switches while a check runs, so that their own fixtures are built as they configured
_USER_HUB: list[tuple[dict, dict]] = []


def checking() -> bool:
    """A check is running (its hub switches are on)."""
    return bool(_USER_HUB)


@contextlib.contextmanager
def as_user():
    """Inside a check: evaluate the user's own fixture with the user's hub settings, not the check's."""
    if not _USER_HUB:
        yield
        return
    values, env = _USER_HUB[-1]
    with hub_switches(values, env):
        yield


@contextlib.contextmanager
def hypothesis_home(config: pytest.Config):
    """Hypothesis run by a check (property mode, R7's search) caches the constants of the code it
    explores under its home directory, ``.hypothesis/`` in the user's working directory by default: point
    it at the session's tmp path while the check runs."""
    import sys

    conf = sys.modules.get("hypothesis.configuration")
    factory = getattr(config, "_tmp_path_factory", None)
    if conf is None or factory is None or not hasattr(conf, "set_hypothesis_home_dir"):
        yield
        return
    before = getattr(conf, "__hypothesis_home_directory", None)
    conf.set_hypothesis_home_dir(factory.getbasetemp() / "dlcheck-hypothesis")
    try:
        yield
    finally:
        conf.set_hypothesis_home_dir(before)


@contextlib.contextmanager
def check_frame():
    """Around a check's setup and call: the global RNGs start from a fixed seed (a check that draws
    through the user's code gives the same verdict whatever ran before it) and are put back afterwards;
    the hub libraries are offline (no download, no telemetry: pytest-dlcheck never reaches the
    network); ``torch.compile``'d modules run eagerly (a check judges what the model computes, and
    compiling under its probes — autograd transforms, many shapes — fails or only costs time); a skip is
    reported at the user's conftest.py rather than at the plugin line that raised it."""
    try:
        with guard.preserved_rng(), hub_switches() as saved, _eager_compile():
            _USER_HUB.append(saved)
            try:
                guard.seed_everything(0)
                yield
            finally:
                _USER_HUB.pop()
    except pytest.skip.Exception as exc:
        exc._use_item_location = True
        raise


def _eager_compile() -> contextlib.AbstractContextManager:
    """``torch.compiler.set_stance("force_eager")`` when torch is imported and has it (torch >= 2.6)."""
    import sys

    compiler = getattr(sys.modules.get("torch"), "compiler", None)
    stance = getattr(compiler, "set_stance", None)
    return stance("force_eager") if stance is not None else contextlib.nullcontext()


class CheckTimeout(BaseException):
    """Raised by the alarm when a check runs past ``--dlcheck-timeout``. A BaseException, so that neither
    a user's ``except Exception`` nor a check's swallows it on its way out."""

    def __init__(self, seconds: float):
        super().__init__(f"did not finish within {seconds:g} s")
        self.seconds = seconds


@contextlib.contextmanager
def time_bound(seconds: float | None, bound: float = 0.0):
    """Raise CheckTimeout(bound) in the main thread after ``seconds``; a no-op off the main thread,
    without SIGALRM (Windows), or when another plugin (pytest-timeout) already owns the alarm."""
    usable = (
        seconds is not None
        and seconds > 0
        and hasattr(signal, "setitimer")
        and threading.current_thread() is threading.main_thread()
    )
    previous = signal.getsignal(signal.SIGALRM) if usable else None
    if (
        not usable
        or previous not in (signal.SIG_DFL, signal.SIG_IGN, None)
        or signal.getitimer(signal.ITIMER_REAL)[0] > 0
    ):
        yield
        return

    def alarm(signum: int, frame: Any) -> None:
        raise CheckTimeout(bound or seconds)

    signal.signal(signal.SIGALRM, alarm)
    signal.setitimer(signal.ITIMER_REAL, max(seconds, 1e-3))
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)
