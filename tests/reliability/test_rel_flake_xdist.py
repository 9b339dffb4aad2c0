"""No flake, and pytest-xdist: the real projects of every domain (rel_projects.GROUPS) run once
in-process and once in a fresh process under ``-n 2`` — another hash seed, another order, the checks
split over two workers — with the network blocked on every worker; every check item must have the same
outcome both times. The second run also writes ``--junitxml`` and ``--dlcheck-json``, which must carry
every item with its house-format failure text."""

from __future__ import annotations

import json

import pytest
import rel_background
import rel_projects
from rel_runs import run_group
from rel_tracker import check_id

#: its in-process baseline is rel_runs' runs, made once per process: on the worker of test_rel_no_trace.py's
pytestmark = pytest.mark.xdist_group("rel_runs")


def test_two_runs_in_two_processes_under_xdist_agree(pytester, tmp_path_factory):
    run = rel_background.xdist_projects(tmp_path_factory.mktemp("background"))
    baseline: dict[str, str] = {}
    for domains, projects in rel_projects.GROUPS:
        if any(d in rel_background.SECOND_RUN for d in projects):
            tracker, _ = run_group(pytester, domains[0])
            baseline.update({n: o for n, o in tracker.outcomes.items() if n.split("/")[0] in rel_background.SECOND_RUN})
    rc, text = run.wait()
    assert rc in (0, 1), text[-5000:]
    assert "INTERNALERROR" not in text, text[-5000:]
    assert "[gw0]" in text and "[gw1]" in text, text[:2000]  # xdist ran, on two workers (-v names each item's worker)
    log = run.files["log"]
    assert not log.exists(), "network access attempted under xdist:\n" + log.read_text()

    junit = rel_background.junit_outcomes(run.files["junit"])
    second = {n: o for n, (o, _) in junit.items()}
    assert second == baseline, "outcomes differ between the two runs:\n" + "\n".join(
        f"{n}: {baseline.get(n)} in-process, {second.get(n)} under -n 2"
        for n in sorted(baseline.keys() | second.keys())
        if baseline.get(n) != second.get(n)
    )

    # the junit failure text is the house format, and the JSON report saw every item across the workers
    for _nodeid, (outcome, body) in junit.items():
        if outcome == "failed":
            assert "pytest-dlcheck internal error" not in body, body
            assert "see       pytest --dlcheck-list" in body, body
    doc = json.loads(run.files["json"].read_text())
    assert {r["nodeid"] for r in doc["results"]} == set(second), "the JSON report misses items run on a worker"
    assert all(check_id(r["nodeid"]) == r["id"] for r in doc["results"])
