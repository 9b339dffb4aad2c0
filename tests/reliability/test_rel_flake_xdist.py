"""No flake, and pytest-xdist: the real projects of every domain (rel_projects.GROUPS) run once
in-process and once in a fresh process under ``-n 2`` — another hash seed, another order, the checks
split over two workers — with the network blocked on every worker; every check item must have the same
outcome both times. The second run also writes ``--junitxml`` and ``--dlcheck-json``, which must carry
every item with its house-format failure text."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
import xml.etree.ElementTree as ET
from pathlib import Path

import rel_projects
from rel_runs import run_group, write_projects
from rel_tracker import check_id

HERE = Path(__file__).resolve().parent
TESTS = HERE.parent

FILTER = '''
from pytest_dlcheck.plugin import CHECK_KEY

GROUPS = {groups!r}


def pytest_collection_modifyitems(config, items):
    """Each project directory runs the checks of its own group of domains, as in the in-process runs."""
    keep, drop = [], []
    for item in items:
        check = item.stash.get(CHECK_KEY, None)
        directory = item.nodeid.split("/")[0]
        (keep if check is None or check.domain in GROUPS.get(directory, ()) else drop).append(item)
    items[:] = keep
    config.hook.pytest_deselected(items=drop)
'''


def junit_outcomes(path: Path) -> dict[str, str]:
    out = {}
    for case in ET.parse(path).getroot().iter("testcase"):
        nodeid = case.get("classname").replace(".", "/") + ".py::" + case.get("name")
        kinds = {child.tag for child in case}
        out[nodeid] = ("failed" if "failure" in kinds else "error" if "error" in kinds
                       else "skipped" if "skipped" in kinds else "passed")
    return out


#: the projects run a second time under xdist: one of each kind without a Trainer (those make the run
#: minutes long), the statistical checks (DF5's binomial test, DF8's DKW test, T7's orders, R7's search)
#: among them
SECOND_RUN = ("llm_hand", "llm_broken", "vision_cls_broken", "diffusion_clean", "diffusion_broken", "rl_cleanrl",
              "train_loop")


def test_two_runs_in_two_processes_under_xdist_agree(pytester, tmp_path):
    baseline: dict[str, str] = {}
    root = tmp_path / "projects"
    groups = {}
    for domains, projects in rel_projects.GROUPS:
        chosen = {d: s for d, s in projects.items() if d in SECOND_RUN}
        if not chosen:
            continue
        tracker, _ = run_group(pytester, domains[0])
        baseline.update({n: o for n, o in tracker.outcomes.items() if n.split("/")[0] in chosen})
        write_projects(root, chosen)
        groups.update({d: domains for d in chosen})
    (root / "pytest.ini").write_text("[pytest]\n")
    (root / "conftest.py").write_text(textwrap.dedent(FILTER.format(groups=groups)))
    junit, report, log = tmp_path / "junit.xml", tmp_path / "dlcheck.json", tmp_path / "network.log"
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PYTEST_", "HF_", "TRANSFORMERS_OFFLINE"))}
    env.update(PYTHONPATH=os.pathsep.join(str(p) for p in [HERE, TESTS, *(TESTS / d for d in (
        "vision", "diffusion", "rl", "vlm", "train"))]), DLCHECK_NONET_LOG=str(log), PYTHONHASHSEED="12345")
    proc = subprocess.run(
        [sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-p", "rel_nonet", "-n", "2", "--dlcheck=all",
         f"--junitxml={junit}", f"--dlcheck-json={report}", "-q", "-p", "no:randomly", str(root)],
        cwd=root, env=env, capture_output=True, text=True, timeout=600)
    text = proc.stdout + proc.stderr
    assert proc.returncode in (0, 1), text[-5000:]
    assert "INTERNALERROR" not in text, text[-5000:]
    assert not log.exists(), "network access attempted under xdist:\n" + log.read_text()

    second = junit_outcomes(junit)
    assert second == baseline, "outcomes differ between the two runs:\n" + "\n".join(
        f"{n}: {baseline.get(n)} in-process, {second.get(n)} under -n 2" for n in sorted(baseline.keys() | second.keys())
        if baseline.get(n) != second.get(n))

    # the junit failure text is the house format, and the JSON report saw every item across the workers
    for case in ET.parse(junit).getroot().iter("testcase"):
        for failure in case.iter("failure"):
            body = failure.text or ""
            assert "pytest-dlcheck internal error" not in body, body
            assert "see       pytest --dlcheck-list" in body, body
    doc = json.loads(report.read_text())
    assert {r["nodeid"] for r in doc["results"]} == set(second), "the JSON report misses items run on a worker"
    assert all(check_id(r["nodeid"]) == r["id"] for r in doc["results"])
