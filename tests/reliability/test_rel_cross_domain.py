"""No false alarm across domains, on real projects: every project of rel_projects that is not broken on
purpose runs with --dlcheck=all (the checks of all eight domains on each) and fails exactly the true
positives listed here — real mistakes these test projects make, each with its reason — so no check of one
domain reads another domain's objects as its own (a detection loader's tuples as token batches, a
VLM processor as a caption tokenizer, a trained Trainer's spent schedule as the user's)."""

from __future__ import annotations

import rel_projects
from rel_nonet import NoNetwork
from rel_runs import write_projects

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
    projects = {d: s for _, group in rel_projects.GROUPS for d, s in group.items() if "broken" not in d}
    write_projects(pytester.path, projects)
    (pytester.path / "pytest.ini").write_text("[pytest]\n")
    failures = Failures()
    result = pytester.runpytest_inprocess(
        "-p",
        "no:cacheprovider",
        "--dlcheck=all",
        "-p",
        "no:randomly",
        str(pytester.path),
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
