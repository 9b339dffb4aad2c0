"""The in-process runs the no-trace and no-flake proofs share: one per group of domains of
rel_projects.GROUPS, every check of the group on every project of the group, with the no-trace tracker
and the network blocked; made once per test process."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
import rel_projects
from rel_nonet import NoNetwork
from rel_tracker import Tracker

_RUNS: dict[tuple[str, ...], tuple[Tracker, pytest.RunResult]] = {}


def pytest_tmp_paths(pytester: pytest.Pytester) -> list[Path]:
    """Where an in-process run's tmp_path/tmp_path_factory live: under pytester's temproot (the inner
    session's default basetemp) or the --basetemp pytester.runpytest would give."""
    return [Path(os.environ["PYTEST_DEBUG_TEMPROOT"]), pytester.path.parent / "basetemp"]


def group_of(domain: str) -> tuple[tuple[str, ...], dict[str, str]]:
    return next(g for g in rel_projects.GROUPS if domain in g[0])


def write_projects(root: Path, projects: dict[str, str]) -> None:
    for directory, source in projects.items():
        (root / directory).mkdir(parents=True, exist_ok=True)
        (root / directory / "conftest.py").write_text(source)


def run_group(pytester: pytest.Pytester, domain: str) -> tuple[Tracker, pytest.RunResult]:
    """The run of the domain's group, in its own folder of the pytester directory; item nodeids are
    ``<project dir>/conftest.py::<item>`` (project directories are unique across groups)."""
    domains, projects = group_of(domain)
    if domains not in _RUNS:
        root = pytester.path / "-".join(domains)
        write_projects(root, projects)
        tracker = Tracker(pytester.path, pytest_tmp_paths(pytester), pytester.path.parent / "tmp-no-trace")
        result = pytester.runpytest_inprocess(
            "-p",
            "no:cacheprovider",
            f"--dlcheck={','.join(domains)}",
            "-rs",
            f"--rootdir={root}",
            str(root),
            plugins=[tracker, NoNetwork()],
        )
        _RUNS[domains] = tracker, result
    return _RUNS[domains]
