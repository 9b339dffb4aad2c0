"""Coverage is part of the result: each domain line says how many selected checks judged the pipeline (terminal,
JSON, HTML); a pass that judged only part of its subject says which part and is counted apart; a domain named in
--dlcheck that judged nothing is a usage error saying what to hand over; the summary stays quiet (checks of
another kind of pipeline are not applicable, domains that do not concern it fold under `all`, the same reason is
one line); a role fixture that raises is one ERROR naming it."""

import json
import re

import jsonschema
import pytest
from llm.test_clean_pipelines import TRAINERS
from llm.test_l11_eos_supervised import LM_COLLATOR
from test_report import Cards

from pytest_dlcheck.report import schema_path

MODEL = """
    @pytest.fixture(scope="session")
    def dlcheck_model(dlcheck_tokenizer):
        return tiny.gpt2(dlcheck_tokenizer)
"""
#: a clean causal-LM project: token batches from a collator, a model
TOKENS = LM_COLLATOR.format(pad="tiny.PAD", eos=True) + MODEL

#: the same tokenizer and model, but the dataloader yields tuples of tensors: no token batch any llm check can read
TUPLES = (
    """
    import pytest, torch, tiny
    from torch.utils.data import DataLoader, TensorDataset

    @pytest.fixture(scope="session")
    def dlcheck_tokenizer():
        return tiny.tokenizer()

    @pytest.fixture(scope="session")
    def dlcheck_dataloader():
        ids = torch.arange(3, 3 + 16 * 12).reshape(16, 12) % 250 + 3
        return DataLoader(TensorDataset(ids, ids.clone()), batch_size=4)
"""
    + MODEL
)


def summary(run) -> str:
    return run.text.split("dlcheck summary")[-1].split("short test summary")[0]


def reports(run_fn, tmp_path, *args):
    out_json, out_html = tmp_path / "r.json", tmp_path / "r.html"
    run = run_fn(*args, f"--dlcheck-json={out_json}", f"--dlcheck-report={out_html}")
    doc = json.loads(out_json.read_text())
    jsonschema.validate(doc, json.loads(schema_path().read_text()))
    return run, doc, out_html.read_text()


def test_llm_on_a_dataloader_of_tuples_is_a_usage_error_naming_what_to_hand_over(project, tmp_path):
    project.conftest(TUPLES)
    run, doc, page = reports(project.run, tmp_path, "--dlcheck=llm")
    # before: "1 passed, 14 skipped", exit 0, with nothing of the pipeline judged
    assert run.result.ret == pytest.ExitCode.USAGE_ERROR, run.text
    text = summary(run)
    assert re.search(r"^llm +0 of 15 judged: 1 partly judged, ", text, re.M), text
    (error,) = [line for line in text.splitlines() if line.startswith("dlcheck usage error:")]
    assert "--dlcheck=llm judged nothing of this pipeline (0 of 15 checks judged" in error
    assert "dlcheck_dataloader yields lists of tensors" in error  # why, in the checks' own words
    assert "dlcheck_dataloader (or dlcheck_collator + dlcheck_dataset) yielding mappings of input_ids" in error
    assert doc["coverage"]["llm"]["judged"] == 0 and doc["coverage"]["llm"]["selected"] == 15
    assert doc["health"] == [error.removeprefix("dlcheck usage error: ")]
    assert "usage error: --dlcheck=llm judged nothing" in page


def test_a_token_pipeline_judged_by_llm_is_not_a_usage_error_and_says_its_coverage(project, tmp_path):
    project.conftest(TOKENS)
    run, doc, page = reports(project.run, tmp_path, "--dlcheck=llm")
    assert run.result.ret == pytest.ExitCode.OK, run.text
    cov = doc["coverage"]["llm"]
    assert cov["selected"] == 15 and cov["judged"] >= 5, cov
    assert cov["judged"] == cov["failed"] + cov["passed"]
    assert sum(cov[k] for k in cov if k not in ("selected", "judged")) == cov["selected"]
    assert not doc["health"] and "usage error" not in run.text
    # the same numbers in the terminal and the HTML
    text = summary(run)
    assert re.search(rf"^llm +{cov['judged']} of 15 judged: {cov['passed']} passed, ", text, re.M), text
    row = re.search(r'<tr data-domain="llm"><td>llm</td><td>(\d+) of (\d+)</td>', page)
    assert row and row.groups() == (str(cov["judged"]), "15"), page[:3000]


def test_a_partly_judged_pass_says_what_it_left_and_is_counted_apart(project, tmp_path):
    project.conftest(TUPLES)
    run, doc, page = reports(project.run, tmp_path, "--dlcheck=L3", "-rA")
    run.assert_outcome("L3", "passed")
    run.fnmatch(
        [
            "*::L3_special_tokens PASSED (every id has an embedding row*; partly judged: the sampled batches' ids not judged)*"
        ]
    )
    run.fnmatch(["*dlcheck evidence*", "every id has an embedding row*", "*", "the sampled batches' ids: not judged*"])
    text = summary(run)
    assert re.search(r"^llm +0 of 1 judged: 1 partly judged$", text, re.M), text
    assert "partly:    L3: the sampled batches' ids not judged: not applicable: dlcheck_dataloader yields" in text
    (l3,) = doc["results"]
    assert l3["outcome"] == "passed" and [p["part"] for p in l3["not_judged"]] == ["the sampled batches' ids"]
    cov = doc["coverage"]["llm"]
    assert (cov["partly_judged"], cov["judged"], cov["passed"]) == (1, 0, 0), cov
    cards = Cards()
    cards.feed(page)
    assert "passed · partly judged" in cards.cards["L3"]["text"] and "not judged" in cards.cards["L3"]["text"]
    assert run.result.ret == pytest.ExitCode.OK  # selected by ID: not held to the domain's health check


def test_a_fully_judged_pass_is_counted_as_judged(project, tmp_path):
    project.conftest(TOKENS)
    run, doc, _ = reports(project.run, tmp_path, "--dlcheck=L3")
    run.assert_outcome("L3", "passed")
    (l3,) = doc["results"]
    assert l3["not_judged"] == [] and "partly" not in summary(run)
    assert doc["coverage"]["llm"]["judged"] == doc["coverage"]["llm"]["passed"] == 1
    assert re.search(r"^llm +1 of 1 judged: 1 passed$", summary(run), re.M), run.text


def test_c10_is_not_applicable_to_a_trainer_user(project):
    project.conftest("        import pytest, tiny\n" + TRAINERS["trainer_lm_collator_own_pad"])
    run = project.run("--dlcheck=C10", "-rs")
    run.assert_outcome("C10", "skipped")
    # before: "missing role: define fixture dlcheck_make_training", which would not make C10 judge a Trainer
    assert "missing role" not in run.text, run.text
    run.fnmatch(["*C10_*: not applicable: dlcheck_trainer is a Trainer*checkpoints its own way*C1 judges its resume*"])


def test_c10_without_any_training_asks_for_make_training(project):
    project.conftest(TOKENS)
    run = project.run("--dlcheck=C10", "-rs")
    run.assert_outcome("C10", "skipped")
    run.fnmatch(["*C10_*: missing role: define fixture dlcheck_make_training*"])


def test_under_all_the_domains_that_do_not_concern_the_pipeline_fold_into_one_line(project):
    project.conftest(TOKENS)
    run = project.run("--dlcheck=all", "--dlcheck-ignore=train,smoke,ckpt,dist")
    text = summary(run)
    run.fnmatch(["n/a        vision, diffusion, rl, vlm: 30 checks of kinds of pipeline this one is not"])
    # their reasons are not listed, and an LLM pipeline is not asked for an env or advantages (rl: n/a)
    assert "image field" not in text and "diffusion role" not in text and "vision_config" not in text, text
    assert "dlcheck_env" not in text and "dlcheck_advantage" not in text, text
    assert re.search(r"^llm +\d+ of 15 judged", text, re.M), text
    assert len(text.strip().splitlines()) <= 20, text
    assert run.result.ret == pytest.ExitCode.OK, run.text


def test_the_same_reason_is_one_line_for_all_its_checks(project):
    project.conftest(TUPLES)
    run = project.run("--dlcheck=llm")
    text = summary(run)
    reason = "not applicable: dlcheck_dataloader yields lists of tensors"
    lines = [line for line in text.splitlines() if line.startswith("n/a:") and reason in line]
    assert len(lines) == 1 and lines[0].endswith(" (7 checks)"), text


RAISING = """
    import pytest, tiny
    from transformers import DataCollatorForLanguageModeling

    @pytest.fixture(scope="session")
    def dlcheck_tokenizer():
        raise OSError("tokenizer.json not found in ./my-tokenizer")

    @pytest.fixture(scope="session")
    def dlcheck_collator(dlcheck_tokenizer):
        return DataCollatorForLanguageModeling(dlcheck_tokenizer, mlm=False)

    @pytest.fixture(scope="session")
    def dlcheck_dataset():
        return [{"input_ids": [5, 6, 7]}] * 8
"""


def test_a_raising_role_fixture_is_one_error_naming_it(project, tmp_path):
    project.conftest(RAISING)
    run, doc, _ = reports(project.run, tmp_path, "--dlcheck=llm")
    # before: 12 FAILED items (~100 lines), each with the same error, counted "error" by the summary
    counts = run.result.parseoutcomes()
    assert counts.get("errors", counts.get("error")) == 1 and "failed" not in counts, counts
    assert [c for c, outs in run.outcomes.items() if "error" in outs] == ["L1"], run.outcomes
    errors = run.text.split("= ERRORS =")[1].split("dlcheck summary")[0]
    assert errors.count("tokenizer.json not found") == 1, errors
    flat = " ".join(errors.split())
    assert "role dlcheck_tokenizer" in flat and "(in dlcheck_tokenizer at conftest.py:7)" in flat, errors
    text = summary(run)
    assert "error:     L1 (your role raised)" in text
    assert (
        "not run:   fixture dlcheck_tokenizer raised OSError (reported once: the ERROR of L1_padding_side) (12 checks)"
        in text
    ), text
    assert doc["summary"]["error"] == 1 and doc["summary"]["failed"] == 0
    # the collator that depends on it is not blamed: the fixture that raised is named
    assert "dlcheck_collator" not in errors


def test_a_fixture_raising_while_a_check_runs_is_an_error_too(project, tmp_path):
    project.conftest(
        LM_COLLATOR.format(pad="tiny.PAD", eos=True)
        + """
    @pytest.fixture(scope="session")
    def dlcheck_model():
        raise RuntimeError("checkpoint shards missing")
    """
    )
    out = tmp_path / "r.json"
    run = project.run(
        "--dlcheck=L3,L15", f"--dlcheck-json={out}"
    )  # the model is optional to both: resolved as they run
    counts = run.result.parseoutcomes()
    assert counts.get("errors", counts.get("error")) == 1 and "failed" not in counts, run.text
    assert run.text.count("checkpoint shards missing") == 1, run.text
    (error,) = [r for r in json.loads(out.read_text())["results"] if r["outcome"] == "error"]
    assert error["pytest_outcome"] == "error" and error["error_kind"] == "role", error


def test_a_reason_that_names_its_check_is_grouped_with_the_same_reason_of_other_checks(project):
    project.conftest(TOKENS)
    run = project.run("--dlcheck=diffusion")
    text = summary(run)
    # before: seven lines "not applicable: DF1 concerns diffusion training, …", "…: DF2 concerns …", each (1 check)
    lines = [line for line in text.splitlines() if line.startswith("n/a:") and "concerns diffusion training" in line]
    assert lines == [
        "n/a:       not applicable: concerns diffusion training, and no diffusion role is given (dlcheck_pipeline, "
        "dlcheck_noise_scheduler, dlcheck_vae, dlcheck_training_inputs, … or a diffusers denoiser as dlcheck_model) (7 checks)"
    ], text
    # and a diffusion selection on an LLM pipeline judged nothing: a usage error naming what diffusion needs
    assert run.result.ret == pytest.ExitCode.USAGE_ERROR
    assert "--dlcheck=diffusion judged nothing of this pipeline" in text and "dlcheck_training_inputs" in text


def test_r4_is_not_applicable_to_a_preference_trainer(project):
    """A DPO trainer has a reference model (an rl role), but no env and no running statistics: R4 is not
    applicable to it, not a missing dlcheck_normalizer."""
    project.conftest("        import pytest, tiny\n" + TRAINERS["dpo"])
    run = project.run("--dlcheck=R4", "-rs")
    run.assert_outcome("R4", "skipped")
    assert "missing role" not in run.text, run.text
    run.fnmatch(["*R4_*: not applicable: dlcheck_trainer is a DPOTrainer with no env and no SB3 algorithm*"])
