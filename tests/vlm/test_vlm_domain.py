"""The vlm domain as a whole: a clean two-stage LLaVA setup handed over as a TRL SFTTrainer passes every
check and leaves no trace; the same trainer with a text-sized max_length fails X4 alone; the roles are
documented in --dlcheck-list; the example project shows a clean run and a real failure (under --dlcheck=all
too: tests/reliability/test_rel_examples.py reads that from the examples' one run)."""

import shutil
from pathlib import Path

import tinyvlm
from helpers import flat
from trl import SFTConfig, SFTTrainer  # noqa: F401  (imported outside the in-process runs)

EXAMPLES = Path(__file__).parent.parent.parent / "examples"

TRAINER = """
    import pytest, tiny, tinyvlm
    from trl import SFTConfig, SFTTrainer

    @pytest.fixture(scope="session")
    def dlcheck_trainer(tmp_path_factory):
        proc = tinyvlm.processor()
        model = tinyvlm.llava(proc.tokenizer)
        model.train()
        tinyvlm.SEEN.update(model=model, proc=proc, before=tinyvlm.fingerprint(model, proc))
        args = tiny.trainer_args(tmp_path_factory.mktemp("o"), SFTConfig, max_length={max_length})
        return SFTTrainer(model=model, args=args, processing_class=proc, train_dataset=tinyvlm.dataset(8))

    @pytest.fixture(scope="session")
    def dlcheck_stages():
        return tinyvlm.STAGES

    @pytest.fixture(scope="session")
    def dlcheck_stage_setup():
        return tinyvlm.setup_clean(tinyvlm.STAGES)
"""


def test_clean_two_stage_trainer_passes_the_domain_and_leaves_no_trace(project):
    tinyvlm.SEEN.clear()
    project.conftest(TRAINER.format(max_length=None))
    run = project.run("--dlcheck=vlm", "-rA")
    for cid in ("X1", "X2", "X3", "X4", "X5"):
        run.assert_outcome(cid, "passed")
    # every pass says what it measured, beside PASSED
    run.fnmatch(
        [
            "*::X1_freeze_schedule PASSED (6 tower/stage pairs agree with dlcheck_stages*",
            "*::X2_projector PASSED (projector output width 64 = the LM's hidden size 64; image tokens*",
            "*::X3_tower_lr PASSED (3 trained tower(s) in 2 stage(s) sit in param groups at their*",
            "*::X4_image_tokens PASSED (8 of 8 sampled examples carry as many <image> tokens as their images*",
            "*::X5_image_ignored PASSED (the logits at * text positions after the image move by*",
        ]
    )
    assert run.text.count("dlcheck evidence") == 5
    after = tinyvlm.fingerprint(tinyvlm.SEEN["model"], tinyvlm.SEEN["proc"])
    before = tinyvlm.SEEN["before"]
    for key in ("weights", "requires_grad", "training", "tokenizer"):
        assert after[key] == before[key], key


def test_trainer_with_a_text_max_length_cuts_the_image(project):
    project.conftest(TRAINER.format(max_length=12))
    run = project.run("--dlcheck=vlm")
    assert {cid for cid, outs in run.outcomes.items() if "failed" in outs} == {"X4"}, run.text
    text = flat(run.section("X4"))
    assert "expected 16 (1 image × 16); the example is 12 tokens long, ending on <image> (max_length=12)" in text
    assert "SFTConfig(max_length=None)" in text


def test_list_documents_the_vlm_roles_and_checks(project):
    project.conftest("")
    text = project.pytester.runpytest_inprocess("-p", "no:cacheprovider", "--dlcheck-list").stdout.str()
    for fixture in ("dlcheck_stages", "dlcheck_stage_setup", "dlcheck_stage ", "dlcheck_towers"):
        assert fixture in text, fixture
    for cid in ("X1", "X2", "X3", "X4", "X5"):
        assert f"\n{cid} " in text, cid
    detail = project.pytester.runpytest_inprocess("-p", "no:cacheprovider", "--dlcheck-list", "X5").stdout.str()
    assert "min_change" in detail and "zeroed projector" in detail and "Known problems" in detail


def test_missing_roles_skip_naming_the_fixtures(project):
    project.conftest("""
        import pytest, tinyvlm

        @pytest.fixture(scope="session")
        def dlcheck_stages():
            return tinyvlm.STAGES
    """)
    run = project.run("--dlcheck=vlm")
    for cid in ("X1", "X2", "X3", "X4", "X5"):
        run.assert_outcome(cid, "skipped")
    assert "missing role: define fixture dlcheck_model (or dlcheck_trainer)" in run.text
    assert "Error" not in run.text


def test_example_project(project):
    shutil.copytree(EXAMPLES / "vlm", project.pytester.path, dirs_exist_ok=True)
    run = project.run("--dlcheck=vlm")
    failed = {cid for cid, outs in run.outcomes.items() if "failed" in outs}
    assert failed == {"X1", "X3", "X4"}, run.text
    for line in run.text.splitlines():
        if line.startswith("clean/conftest.py::"):
            assert "PASSED" in line, run.text
    for cid in failed:
        section = run.section(cid)
        assert "evidence" in section and "cause" in section and "fix" in section
