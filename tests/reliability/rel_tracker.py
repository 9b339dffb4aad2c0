"""A pytest plugin object handed to an in-process run (``pytester.runpytest_inprocess(plugins=[...])``)
that attributes every trace to the check item that left it.

Each ``dlcheck_*`` fixture value is fingerprinted (rel_state.fingerprint) the moment its fixture returns,
before any check used it. Around each check item (its setup, where roles are derived, and its call):
the process state (RNGs, grad mode, environment, …) is compared with the one before the item, each
tracked object with its fingerprint, and the files written meanwhile outside pytest's tmp paths (an
audit hook, plus listings of the project directory — which is also $HOME in pytester — and of a
private tempfile.tempdir) are looked for. A difference is recorded under the item's nodeid, then taken
as the new reference so the next check is judged on its own.

User fixtures are the user's business: what they write is not recorded, and when one returns the
tracked objects are compared first (a check's trace is not lost) and the new value then tracked. The
project conftests build everything in one session fixture and hand out its parts, so a user fixture
never changes an object a check already saw."""

from __future__ import annotations

import os
import re
import tempfile
from collections import defaultdict
from pathlib import Path
from typing import Any

import pytest
import rel_state

from pytest_dlcheck.plugin import CheckItem
from pytest_dlcheck.roles import MISSING

CHECK_RE = re.compile(r"::([A-Z]+\d+)_")


def check_id(nodeid: str) -> str:
    m = CHECK_RE.search(nodeid)
    return m.group(1) if m else ""


def _is_user_fixture(fixturedef: Any) -> bool:
    module = getattr(fixturedef.func, "__module__", "") or ""
    return not module.startswith(("pytest_dlcheck", "_pytest", "pytest", "hypothesis", "xdist"))


def _listing(root: Path, skip: list[Path]) -> dict[str, tuple[int, int]]:
    out = {}
    if not root.exists():
        return out
    for dirpath, dirnames, filenames in os.walk(root):
        here = Path(dirpath)
        dirnames[:] = [
            d for d in dirnames if d != "__pycache__" and not any(rel_state.inside(str(here / d), [s]) for s in skip)
        ]
        for name in filenames:
            p = here / name
            try:
                st = p.stat()
            except OSError:
                continue
            out[str(p)] = (st.st_mtime_ns, st.st_size)
    return out


class Tracker:
    def __init__(self, project_dir: Path, allowed: list[Path], private_tmp: Path):
        self.project_dir = project_dir
        self.allowed = [Path(os.path.realpath(p)) for p in allowed]
        self.objects: dict[str, Any] = {}
        self.base: dict[str, dict[str, Any]] = {}
        self.traces: dict[str, list[str]] = defaultdict(list)
        self.outcomes: dict[str, str] = {}
        self.reasons: dict[str, str] = {}
        self.errors: dict[str, str] = {}
        self.files = rel_state.FileWrites()
        self.private_tmp = private_tmp
        private_tmp.mkdir(parents=True, exist_ok=True)
        self.current: Any = None
        self.depth = 0
        self.global_before: dict[str, Any] = {}
        self.listings: dict[str, dict] = {}

    # ---- objects -----------------------------------------------------------------------------------

    def track(self, name: str, value: Any) -> None:
        if value is None or value is MISSING or any(v is value for v in self.objects.values()):
            return
        key = name if name not in self.objects else f"{name}#{len(self.objects)}"
        self.objects[key] = value
        self.base[key] = rel_state.fingerprint(value, key)

    def compare(self, nodeid: str) -> None:
        for key, value in self.objects.items():
            now = rel_state.fingerprint(value, key)
            changes = rel_state.diff(self.base[key], now)
            if changes:
                self.traces[nodeid].extend(changes)
                self.base[key] = now

    # ---- hooks -------------------------------------------------------------------------------------

    @pytest.hookimpl(wrapper=True)
    def pytest_fixture_setup(self, fixturedef, request):
        user = _is_user_fixture(fixturedef)
        if user:
            self.depth += 1
            self.files.active = False
        try:
            value = yield
        finally:
            if user:
                self.depth -= 1
                self.files.active = self.current is not None and self.depth == 0
        if self.current is not None and user:
            self.compare(self.current.nodeid)
        if fixturedef.argname.startswith("dlcheck_"):
            self.track(fixturedef.argname, value)
        return value

    @pytest.hookimpl(wrapper=True)
    def pytest_runtest_setup(self, item):
        if isinstance(item, CheckItem):
            self.current = item
            self.global_before = rel_state.global_state()
            self.listings = self._listings()
            self.files.take()
            self.files.active = True
        return (yield)

    @pytest.hookimpl(wrapper=True)
    def pytest_runtest_teardown(self, item, nextitem):
        if isinstance(item, CheckItem) and self.current is item:
            self.files.active = False
            self.finish(item.nodeid)
            self.current = None
        return (yield)

    def pytest_runtest_logreport(self, report):
        if not check_id(report.nodeid):
            return
        if report.failed and report.when == "setup":
            self.outcomes[report.nodeid] = "error"
            self.errors[report.nodeid] = str(report.longrepr)
        elif report.when == "call" or (report.when == "setup" and report.skipped):
            self.outcomes.setdefault(report.nodeid, report.outcome)
            if report.skipped:
                self.reasons[report.nodeid] = (
                    report.longrepr[2] if isinstance(report.longrepr, tuple) else str(report.longrepr)
                )
            if report.failed:
                self.errors[report.nodeid] = str(report.longrepr)
        elif report.failed:
            self.outcomes[report.nodeid] = "error"
            self.errors[report.nodeid] = str(report.longrepr)

    def pytest_sessionstart(self, session):
        self._tempdir = tempfile.tempdir
        tempfile.tempdir = str(self.private_tmp)

    def pytest_sessionfinish(self, session):
        tempfile.tempdir = self._tempdir
        self.files.close()

    # ---- the comparison ----------------------------------------------------------------------------

    def _listings(self) -> dict[str, dict]:
        return {"project": _listing(self.project_dir, self.allowed), "tempdir": _listing(self.private_tmp, [])}

    def finish(self, nodeid: str) -> None:
        after = rel_state.global_state()
        for change in rel_state.diff(self.global_before, after):
            self.traces[nodeid].append(f"process state {change}")
        self.compare(nodeid)
        for path, where in dict(self.files.take()).items():
            if not rel_state.inside(path, self.allowed) and os.path.lexists(path):
                self.traces[nodeid].append(f"file left outside pytest's tmp paths: {path} (written at {where})")
        now = self._listings()
        for name, before in self.listings.items():
            for path, stamp in now[name].items():
                if before.get(path) != stamp:
                    self.traces[nodeid].append(f"file left in the {name} directory: {path}")
