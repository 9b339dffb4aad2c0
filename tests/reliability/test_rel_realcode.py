"""The real-code corpus: faithful small re-creations, written for this project, of the training scripts
people copy (tests/realcode/projects/*, each module docstring names the upstream file and what was shrunk).

Each project runs once per test run under --dlcheck=all, and EVERY check's outcome is compared with the
project's ledger (tests/realcode/projects/<name>/ledger.toml, read by tests/realcode/ledger.py): the true
findings, decided from the upstream code before the run, must fail; every other check must give the outcome
the ledger records for it (passed, partly judged, not applicable, missing role, skipped). A check that
drifts into "not applicable" shows as a diff just as a new failure does. No project may end in an internal
error. FINDINGS-*.md record how the verdicts were established."""

from __future__ import annotations

import json
import os
import shutil
import sys
from pathlib import Path

import pytest
import rel_budget
from rel_nonet import NoNetwork

REALCODE = Path(__file__).parents[1] / "realcode"
sys.path.insert(0, str(REALCODE))

import ledger  # noqa: E402

PROJECTS = ledger.PROJECTS


#: libraries whose public names load lazily (transformers' and TRL's _LazyModule): the classes a corpus project
#: pickles (its Trainer's args: RewardConfig, KTOConfig, ...) must be the ones in sys.modules
LAZY = ("transformers", "trl")


@pytest.fixture(autouse=True)
def settled_lazy_modules():
    """Each project runs in-process under pytester, which forgets the modules a run imported. A lazily exposed
    class imported during an earlier run stays cached on its package while its module was forgotten and is
    imported anew by the next run: two classes of one name, and torch.save refuses to pickle the Trainer's
    args ("it's not the same object as trl...RewardConfig"). Import the lazy classes here, before pytester takes
    its snapshot, and point each package's cache at the module sys.modules holds."""
    import importlib

    for package in LAZY:
        try:
            pkg = importlib.import_module(package)
        except ImportError:
            continue
        for name in getattr(pkg, "__all__", None) or ():
            if not (name.endswith(("Trainer", "TrainingArguments")) or package == "trl" and name.endswith("Config")):
                continue  # (transformers' thousand model configs are not what the Trainers pickle)
            try:
                cls = getattr(pkg, name)
                module = importlib.import_module(cls.__module__)
            except Exception:  # noqa: BLE001 - an optional backend's class: not the corpus's
                continue
            fresh = getattr(module, name, cls)
            if fresh is not cls:
                setattr(pkg, name, fresh)
    yield


def registry_ids() -> list[str]:
    from pytest_dlcheck.registry import load_checks

    return list(load_checks())


def run_project(pytester: pytest.Pytester, name: str) -> dict:
    shutil.copytree(PROJECTS / name, pytester.path / name, ignore=shutil.ignore_patterns("__pycache__"))
    pytester.syspathinsert(pytester.path / name)
    shutil.copy(PROJECTS / "rc_text.py", pytester.path / "rc_text.py")
    pytester.syspathinsert()
    (pytester.path / "pytest.ini").write_text("[pytest]\n")
    report = pytester.path / "dlcheck.json"
    result = pytester.runpytest_inprocess(
        "-p",
        "no:cacheprovider",
        "--dlcheck=all",
        f"--dlcheck-json={report}",
        str(pytester.path / name),
        plugins=[NoNetwork()],
    )
    text = result.stdout.str()
    assert "INTERNALERROR" not in text, text[-5000:]
    assert report.is_file(), text[-3000:]
    doc = json.loads(report.read_text())
    # the wall-time split (issue 33): every check's user and plugin seconds, at most its duration
    for r in doc["results"]:
        t = r["time"]
        assert t["user"] + t["plugin"] + t["shared"] <= r["duration"] + 1e-6, (r["id"], t, r["duration"])
    assert {"checks", "user", "plugin", "plugin_share"} <= set(doc["time"]) and isinstance(doc["shared"], dict)
    keep = os.environ.get("DLCHECK_CORPUS_REPORTS")  # the benchmark's corpus figures read these reports
    if keep:
        Path(keep).mkdir(parents=True, exist_ok=True)
        shutil.copy(report, Path(keep) / f"{name}.json")
    return doc


@pytest.mark.slow
@pytest.mark.parametrize("name", ledger.projects())
def test_every_check_on_every_corpus_project_gives_its_ledger_outcome(pytester, name):
    """The ledger's outcomes, then the budgets of issue 33 read from the same run: each data domain at most 10
    forward passes of the models (rel_budget: the checks' own, and the shared runs they read that trained
    nothing), the session's work counted once (checks + shared runs); on the cheapest and the costliest project,
    the wall-time budgets."""
    doc = run_project(pytester, name)
    results = doc["results"]
    print(rel_budget.figures(name, doc))  # -s / the captured output: where the time and the passes went
    errors = [f"{r['id']}: {r.get('error') or r.get('reason')}"[:1500] for r in results if r["outcome"] == "error"]
    assert not errors, "errors (never a ledger outcome):\n\n" + "\n\n".join(errors)
    lines = ledger.diff(name, results, registry_ids())
    assert not lines, (
        "the run differs from the ledger:\n"
        + "\n".join(lines)
        + "\n\nas the run gave it (review every line before believing it):\n"
        + ledger.render(name, results)
    )
    # the work: every pass counted once, by a check or by the shared run it was made in
    shared = [run["cost"] for run in doc["shared"].values()]
    for key in ("forward", "backward", "optimizer_steps"):
        own = sum(r["cost"].get(key, 0) for r in results)
        assert doc["cost"][key] == own + sum(c.get(key, 0) for c in shared), (key, doc["cost"])
    work = rel_budget.domain_forward(doc)
    for domain, who in work.items():
        n, known = sum(who.values()), rel_budget.KNOWN_OVER.get((name, domain))
        if known:
            assert n > rel_budget.DOMAIN_MAX_FORWARD, f"{domain} is within its budget now ({who}): drop {known!r}"
        else:
            assert n <= rel_budget.DOMAIN_MAX_FORWARD, f"{domain}: {n} forward passes over 10 on {name}: {who}"
    if name in (rel_budget.CHEAPEST, rel_budget.COSTLIEST):
        wall = rel_budget.wall_budget(doc)
        assert wall["step"] is not None, f"{name} is judged by its step time, and the run measured none"
        # the budget is in the project's own step time, measured in the same run under the same load
        assert wall["time_ok"], "issue 33 item 3, wall-time budget not met: " + rel_budget.figures(name, doc)
        if not wall["share_ok"]:
            # makemore_mlp: a 4 ms step, 0.3 s of the user's work in all; the plugin's ~1 s for 76 checks is most of
            # a 1.3 s run (within the 15 s fixed cost), so its share stays over 25 %: said, not a red run
            pytest.xfail("issue 33 item 3, plugin share over 25 %: " + rel_budget.figures(name, doc))


def test_every_corpus_project_has_a_ledger_that_names_every_check():
    """Every project directory has a ledger, and every ledger lists each check of the registry once."""
    ids = set(registry_ids())
    dirs = sorted(p.name for p in PROJECTS.iterdir() if p.is_dir() and not p.name.startswith("__"))
    assert dirs == ledger.projects(), "projects without a ledger.toml: " + ", ".join(set(dirs) - set(ledger.projects()))
    for name in ledger.projects():
        findings, outcomes = ledger.load(name)
        listed = set(findings) | set(outcomes)
        assert listed == ids, f"{name}: missing {sorted(ids - listed)}, unknown {sorted(listed - ids)}"
        assert all(len(why) > 40 for why in findings.values()), f"{name}: every finding says why it is real"
