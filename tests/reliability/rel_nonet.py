"""No network: a pytest plugin that blocks every outbound connection and DNS lookup for a session,
records who tried (the innermost pytest_dlcheck frame, else the innermost frame), and puts the
Hugging Face libraries in online mode — HF_HUB_OFFLINE and friends unset, their already-read constants
flipped — so that a call to a hub would really be attempted, and caught here.

In-process: ``pytester.runpytest_inprocess(..., plugins=[NoNetwork()])``. In a subprocess (and on every
pytest-xdist worker): ``-p rel_nonet`` with this directory on PYTHONPATH; the attempts are appended to
the file named by $DLCHECK_NONET_LOG."""

from __future__ import annotations

import os
import socket
import sys
import traceback

OFFLINE_VARS = ("HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE", "HF_DATASETS_OFFLINE", "DIFFUSERS_OFFLINE")


class Blocked(ConnectionRefusedError):
    pass


def _library(filename: str) -> bool:
    return "site-packages" in filename or "/lib/python" in filename or filename.startswith("<") or filename == __file__


def _who() -> str:
    """Whose code tried: "plugin" when the innermost frame outside the libraries is pytest_dlcheck's,
    "user" when it is the user's (their fixture building a TRL trainer pings the hub — their business),
    then where it left for the network."""
    import threading

    frames = traceback.extract_stack()[:-3]
    own = [f for f in frames if not _library(f.filename)]
    who = "plugin" if own and "pytest_dlcheck" in own[-1].filename else "user" if own else "library"
    parts = [f"{f.filename}:{f.lineno} in {f.name}" for f in own[-1:] + frames[-1:]]
    text = f"[{who}] " + " ... ".join(parts) + f" [thread {threading.current_thread().name}]"
    if os.environ.get("DLCHECK_NONET_STACKS"):
        text += "\n" + "".join(traceback.format_list(frames[-25:]))
    return text


class NoNetwork:
    def __init__(self) -> None:
        self.attempts: list[str] = []
        self._saved: list[tuple[object, str, object]] = []
        self._env: dict[str, str] = {}

    def by(self, who: str) -> list[str]:
        """The attempts made by the plugin's own code ("plugin"), the user's ("user") or a library thread."""
        return [a for a in self.attempts if f"[{who}]" in a]

    def _patch(self, owner: object, name: str, value: object) -> None:
        self._saved.append((owner, name, getattr(owner, name)))
        setattr(owner, name, value)

    def install(self) -> None:
        attempts = self.attempts

        def connect(sock, address, *args, **kwargs):
            if sock.family in (socket.AF_INET, socket.AF_INET6):
                attempts.append(f"connect to {address!r} from {_who()}")
                raise Blocked(f"outbound connection to {address!r} blocked by the no-network proof")
            return original_connect(sock, address, *args, **kwargs)

        def connect_ex(sock, address, *args, **kwargs):
            if sock.family in (socket.AF_INET, socket.AF_INET6):
                attempts.append(f"connect_ex to {address!r} from {_who()}")
                raise Blocked(f"outbound connection to {address!r} blocked by the no-network proof")
            return original_connect_ex(sock, address, *args, **kwargs)

        def getaddrinfo(host, *args, **kwargs):
            if host not in (None, "localhost", "127.0.0.1", "::1", ""):
                attempts.append(f"DNS lookup of {host!r} from {_who()}")
                raise socket.gaierror(f"DNS lookup of {host!r} blocked by the no-network proof")
            return original_getaddrinfo(host, *args, **kwargs)

        original_connect = socket.socket.connect
        original_connect_ex = socket.socket.connect_ex
        original_getaddrinfo = socket.getaddrinfo
        self._patch(socket.socket, "connect", connect)
        self._patch(socket.socket, "connect_ex", connect_ex)
        self._patch(socket, "getaddrinfo", getaddrinfo)
        telemetry = sys.modules.get("huggingface_hub.utils._telemetry")
        if telemetry is not None:  # sent from a thread, maybe after the session: caught where it is queued
            queue = telemetry._TELEMETRY_QUEUE

            def put(item, *args, **kwargs):
                attempts.append(f"hub telemetry {item.get('topic')!r} queued from {_who()}")

            self._patch(queue, "put", put)
        for var in OFFLINE_VARS:
            if var in os.environ:
                self._env[var] = os.environ.pop(var)
        for module, names in (
            ("huggingface_hub.constants", ("HF_HUB_OFFLINE",)),
            ("datasets.config", ("HF_HUB_OFFLINE", "HF_DATASETS_OFFLINE")),
            ("transformers.utils.hub", ("_is_offline_mode",)),
        ):
            mod = sys.modules.get(module)
            for name in names:
                if mod is not None and isinstance(getattr(mod, name, None), bool):
                    self._patch(mod, name, False)

    def uninstall(self) -> None:
        for owner, name, value in reversed(self._saved):
            setattr(owner, name, value)
        self._saved.clear()
        os.environ.update(self._env)
        self._env.clear()

    # an in-process run's plugin object
    def pytest_sessionstart(self, session) -> None:
        self.install()

    def pytest_sessionfinish(self, session) -> None:
        self.uninstall()


_SESSION = NoNetwork()


def pytest_configure(config) -> None:
    """``-p rel_nonet``: block for the whole process (the controller and every xdist worker). The hub
    libraries are imported here, after the offline variables are gone, so that they start online even
    when a project's module sets HF_HUB_OFFLINE later (tests/tiny.py and the examples do)."""
    import importlib

    for var in OFFLINE_VARS:
        os.environ.pop(var, None)
    for module in ("huggingface_hub.constants", "huggingface_hub.utils._telemetry", "datasets.config"):
        try:
            importlib.import_module(module)
        except ImportError:
            pass
    _SESSION.install()


def pytest_unconfigure(config) -> None:
    log = os.environ.get("DLCHECK_NONET_LOG")
    if log and _SESSION.attempts:
        with open(log, "a") as f:
            f.write("\n".join(a.replace("\n", " ") for a in _SESSION.attempts) + "\n")
    _SESSION.uninstall()
