"""The two runs of tests/reliability that need a fresh process — the example projects with the network
blocked, and the real projects under pytest-xdist — started as soon as collection is over
(conftest.py), so they use the core the single-threaded in-process runs leave idle; a test that needs
one waits for it (or starts it, when nothing did: a -k selection, an xdist worker)."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import textwrap
import xml.etree.ElementTree as ET
from dataclasses import dataclass
from pathlib import Path

HERE = Path(__file__).resolve().parent
TESTS = HERE.parent
EXAMPLES = TESTS.parent / "examples"
TIMEOUT = 900


@dataclass
class Run:
    proc: subprocess.Popen
    out: Path
    files: dict[str, Path]

    def wait(self) -> tuple[int, str]:
        try:
            rc = self.proc.wait(timeout=TIMEOUT)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            rc = self.proc.wait()
        return rc, self.out.read_text(errors="replace")


_RUNS: dict[str, Run] = {}


def _env(log: Path) -> dict[str, str]:
    env = {
        k: v
        for k, v in os.environ.items()
        if not k.startswith(("PYTEST_", "HF_", "TRANSFORMERS_OFFLINE", "HYPOTHESIS_"))
    }
    env.update(
        PYTHONPATH=os.pathsep.join(
            str(p) for p in [HERE, TESTS, *(TESTS / d for d in ("vision", "diffusion", "rl", "vlm", "train"))]
        ),
        DLCHECK_NONET_LOG=str(log),
        PYTHONHASHSEED="12345",
    )
    return env


def _start(name: str, root: Path, args: list[str], extra_path: list[Path] = ()) -> Run:
    out, log, junit, report = (root.parent / f"{name}.{x}" for x in ("out", "network.log", "junit.xml", "json"))
    env = _env(log)
    env["PYTHONPATH"] = os.pathsep.join([*map(str, extra_path), env["PYTHONPATH"]])
    with open(out, "w") as f:
        proc = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "pytest",
                "-p",
                "no:cacheprovider",
                "-p",
                "rel_nonet",
                f"--junitxml={junit}",
                f"--dlcheck-json={report}",
                *args,
            ],
            cwd=root,
            env=env,
            stdout=f,
            stderr=subprocess.STDOUT,
        )
    return Run(proc, out, {"log": log, "junit": junit, "json": report})


# ---- the example projects, --dlcheck=all, network blocked, hub libraries online ---------------------


def examples(base: Path) -> Run:
    if "examples" not in _RUNS:
        root = base / "examples"
        domains = sorted(p.name for p in EXAMPLES.iterdir() if (p / "clean").is_dir())
        root.mkdir(parents=True)
        (root / "pytest.ini").write_text("[pytest]\n")  # one rootdir: nodeids start with the domain
        for domain in domains:
            shutil.copytree(
                EXAMPLES / domain,
                root / domain,
                ignore=shutil.ignore_patterns(".hypothesis", "__pycache__", ".pytest_cache", "pytest.ini"),
            )
        html = base / "examples.html"
        _RUNS["examples"] = _start(
            "examples",
            root,
            ["--dlcheck=all", "--dlcheck-timeout=120", "-q", f"--dlcheck-report={html}", *domains],
            [root / d for d in domains],
        )  # the examples' modules (their pytest.ini pythonpath)
        _RUNS["examples"].files["html"] = html
    return _RUNS["examples"]


_EXAMPLES_DONE: dict = {}


def examples_outcomes(base: Path) -> tuple[dict[str, tuple[str, str]], list[str], str, dict[str, Path]]:
    """The examples' run, waited for and read once per process: junit outcomes (nodeid -> (outcome, failure
    text)), the network attempts it logged, its terminal text and its files (junit, json, html, log). Every test
    that reads it is in the xdist group "examples", so one worker makes it."""
    if "run" not in _EXAMPLES_DONE:
        run = examples(base)
        rc, text = run.wait()
        assert rc in (0, 1) and "INTERNALERROR" not in text, text[-5000:]
        outcomes = junit_outcomes(run.files["junit"])
        log = run.files["log"]
        attempts = log.read_text().splitlines() if log.exists() else []
        _EXAMPLES_DONE["run"] = outcomes, attempts, text, run.files
    return _EXAMPLES_DONE["run"]


# ---- the real projects under -n 2 -----------------------------------------------------------------

#: the projects run a second time, under xdist: one of each kind without a Trainer (those make the run
#: minutes long), the statistical checks (DF5's binomial test, DF8's DKW test, T7's orders, R7's search)
#: among them
SECOND_RUN = ("llm_broken", "vision_cls_broken", "diffusion_clean", "rl_cleanrl", "train_loop")

FILTER = '''
from pytest_dlcheck.session import CHECK_KEY

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


def xdist_projects(base: Path) -> Run:
    if "xdist" not in _RUNS:
        import rel_projects
        from rel_runs import write_projects

        root = base / "projects"
        groups = {}
        for domains, projects in rel_projects.GROUPS:
            chosen = {d: s for d, s in projects.items() if d in SECOND_RUN}
            write_projects(root, chosen)
            groups.update({d: domains for d in chosen})
        (root / "pytest.ini").write_text("[pytest]\n")
        (root / "conftest.py").write_text(textwrap.dedent(FILTER.format(groups=groups)))
        _RUNS["xdist"] = _start("xdist", root, ["-n", "2", "--dlcheck=all", "-v", "-p", "no:randomly"])
    return _RUNS["xdist"]


def junit_outcomes(path: Path) -> dict[str, tuple[str, str]]:
    """nodeid -> (outcome, failure text) from a junit XML report."""
    out = {}
    for case in ET.parse(path).getroot().iter("testcase"):
        nodeid = case.get("classname").replace(".", "/") + ".py::" + case.get("name")
        kinds = {child.tag: child for child in case}
        outcome = (
            "failed"
            if "failure" in kinds
            else "error"
            if "error" in kinds
            else "skipped"
            if "skipped" in kinds
            else "passed"
        )
        node = kinds.get("failure", kinds.get("error"))
        out[nodeid] = (outcome, (node.text or "") if node is not None else "")
    return out
