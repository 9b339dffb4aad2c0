"""The example projects' promises under ``--dlcheck=all``, read from the one run of every example that
test_rel_no_network.py reads too (rel_background.examples: every examples/<domain>, broken and clean, in a
fresh process): the checks a newcomer's command selects give the same outcomes inside it, so the promises are
asserted there instead of in runs of their own."""

from __future__ import annotations

import json

import pytest
import rel_background

#: the tests that read the examples' background run share one worker under xdist (scripts/test: loadgroup)
pytestmark = pytest.mark.xdist_group("examples")

#: examples/train: `pytest --dlcheck=train,ckpt,smoke examples/train` passes the clean projects and fails the
#: broken ones with exactly the failures their conftest.py promises
TRAIN_PROMISED = {
    "clean": set(),
    "clean_trainer": set(),
    "broken": {"T3", "T6", "T8", "C1", "C2"},
    "broken_trainer": {"T6", "T8", "C1"},
}


@pytest.fixture(scope="module")
def results(tmp_path_factory) -> list[dict]:
    *_, files = rel_background.examples_outcomes(tmp_path_factory.mktemp("background"))
    return json.loads(files["json"].read_text())["results"]


def _project(result: dict) -> tuple[str, str]:
    """(domain directory, project) of a result's nodeid ``<domain>/<project>/conftest.py::<item>``."""
    domain, project, _ = result["nodeid"].split("/", 2)
    return domain, project


def test_the_train_example_fails_what_it_promises(results):
    """The train, ckpt and smoke checks on examples/train (the selection its README runs): the promised
    failures, none on the clean projects."""
    failed: dict[str, set[str]] = {name: set() for name in TRAIN_PROMISED}
    for r in results:
        domain, project = _project(r)
        if (
            domain == "train"
            and r["domain"] in ("train", "ckpt", "smoke")
            and r["pytest_outcome"] in ("failed", "error")
        ):
            failed.setdefault(project, set()).add(r["id"])
    assert failed == TRAIN_PROMISED


def test_vlm_example_under_every_domain_fails_its_root_causes_only(results):
    """--dlcheck=all on examples/vlm: the clean project fails nothing (its trainer resumes through
    from_pretrained, so C1 passes); on the broken one the train/ckpt/smoke checks, whose runs the cut image
    tokens make impossible, skip naming X4 instead of repeating the trainer's error."""
    vlm = [r for r in results if _project(r)[0] == "vlm"]
    failed = {f"{_project(r)[1]}:{r['id']}" for r in vlm if r["pytest_outcome"] == "failed"}
    assert failed == {"broken:L13", "broken:X1", "broken:X3", "broken:X4"}, failed
    reasons = [r["reason"] for r in vlm if _project(r)[1] == "broken"]
    assert any(
        "the model cannot run on the sampled batches: truncation cuts the image tokens (see X4)" in reason
        for reason in reasons
    ), reasons
    assert [r["pytest_outcome"] for r in vlm if r["nodeid"] == "vlm/clean/conftest.py::C1_resume"] == ["passed"]
