"""No false alarm across domains, on real projects: every project of rel_projects that is not broken on
purpose runs with --dlcheck=all (the checks of all eight domains on each) and fails exactly the true
positives listed here — real mistakes these test projects make, each with its reason — so no check of one
domain reads another domain's objects as its own (a detection loader's tuples as token batches, a
VLM processor as a caption tokenizer, a trained Trainer's spent schedule as the user's).

A project's own group of domains already runs in rel_runs' in-process run of its group (made once per process
for the no-trace proof): those outcomes are read from there, and this run adds the other domains only. A
verdict does not depend on the selection (tests/test_selection_independence.py), so the two together are the
outcomes of --dlcheck=all."""

from __future__ import annotations

import textwrap

import pytest
import rel_projects
from rel_nonet import NoNetwork
from rel_runs import run_group, write_projects
from rel_tracker import check_id

#: rel_runs' in-process runs are made once per process: on the worker of test_rel_no_trace.py's
pytestmark = pytest.mark.xdist_group("rel_runs")

#: (project, check) -> why it is right to fail there
EXPECTED = {
    ("llm_hand", "T8"): "its eval set, tiny.tokenized(tok, 8), is the first 8 of its 12 training examples",
    ("llm_sft", "T8"): "the SFTTrainer is given eval_dataset=data, its training data",
    ("llm_packed", "L4"): "a hand model on DataCollatorWithFlattening with config.use_cache=True: documents attend "
    "to each other (no Trainer sets use_cache=False for it)",
    ("vision_cls", "V2"): "its eval_fn runs the model without model.eval()",
    ("vision_det", "V2"): "its eval_fn runs the model without model.eval()",
    ("vision_seg", "V2"): "its eval_fn runs the model without model.eval()",
    ("vision_det", "T8"): "train and eval ShapesDetection draw the same pictures (same seeds)",
    ("vision_seg", "T8"): "train and eval ShapesSegmentation draw the same pictures (same seeds)",
    ("vlm_trainer", "C1"): "transformers 5 resumes a LLaVA Trainer without restoring a single weight",
    ("vlm_trainer", "L11"): "tinyvlm.dataset's completions end without EOS: TRL 1.16 appends the EOS while preparing a "
    "text-only dataset only, and DataCollatorForVisionLanguageModeling appends none",
}


#: the other-domains run's conftest: each project deselects its own group's checks
OTHER_DOMAINS = """
from pytest_dlcheck.session import CHECK_KEY

OWN = {own!r}


def pytest_collection_modifyitems(config, items):
    keep, drop = [], []
    for item in items:
        check = item.stash.get(CHECK_KEY, None)
        own = OWN.get(item.nodeid.split("/")[0], ())
        (drop if check is not None and check.domain in own else keep).append(item)
    items[:] = keep
    config.hook.pytest_deselected(items=drop)
"""


class Failures:
    def __init__(self) -> None:
        self.failed: dict[tuple[str, str], str] = {}
        self.ran: set[str] = set()

    def pytest_runtest_logreport(self, report) -> None:
        if "::" not in report.nodeid:
            return
        project, item = report.nodeid.split("/")[0], report.nodeid.rsplit("::", 1)[-1]
        self.ran.add(project)
        if report.failed:
            self.failed[(project, item.split("_")[0])] = str(report.longrepr)


def test_every_domain_on_every_clean_project(pytester):
    groups = {d: domains for domains, group in rel_projects.GROUPS for d in group if "broken" not in d}
    projects = {d: s for _, group in rel_projects.GROUPS for d, s in group.items() if d in groups}
    failures = Failures()
    # the project's own domains: rel_runs' run of its group
    for domains in dict.fromkeys(groups.values()):
        tracker, _ = run_group(pytester, domains[0])
        for nodeid, outcome in tracker.outcomes.items():
            project = nodeid.split("/")[0]
            if project in projects:
                failures.ran.add(project)
                if outcome in ("failed", "error"):
                    failures.failed[(project, check_id(nodeid))] = tracker.errors.get(nodeid, "")
    # every other domain: one run, each project deselecting its own group's checks (OTHER_DOMAINS)
    root = pytester.path / "other-domains"
    write_projects(root, projects)
    (root / "pytest.ini").write_text("[pytest]\n")
    (root / "conftest.py").write_text(textwrap.dedent(OTHER_DOMAINS.format(own=groups)))
    result = pytester.runpytest_inprocess(
        "-p",
        "no:cacheprovider",
        "--dlcheck=all",
        "-p",
        "no:randomly",
        f"--rootdir={root}",
        str(root),
        plugins=[failures, NoNetwork()],
    )
    text = result.stdout.str()
    assert "INTERNALERROR" not in text, text[-5000:]
    assert failures.ran == set(projects), text[-3000:]
    unexpected = {k: v for k, v in failures.failed.items() if k not in EXPECTED}
    assert not unexpected, "false alarms:\n\n" + "\n\n".join(
        f"{p} {c}:\n{t[-2000:]}" for (p, c), t in unexpected.items()
    )
    missed = set(EXPECTED) - set(failures.failed)
    assert not missed, f"true positives no longer caught: {sorted(missed)}"
    internal = [k for k, t in failures.failed.items() if "pytest-dlcheck internal error" in t or " error " in t[:300]]
    assert not internal, internal
