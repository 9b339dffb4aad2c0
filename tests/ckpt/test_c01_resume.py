"""C1: a resumed run continues exactly as the uninterrupted run."""

import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "train"))
import tiny_train as tt  # noqa: E402
from helpers import work_of  # noqa: E402

SFT = """
    import pytest, tiny
    from datasets import Dataset
    from trl import SFTConfig, SFTTrainer

    @pytest.fixture(scope="session")
    def dlcheck_trainer(tmp_path_factory):
        tok = tiny.tokenizer()
        data = Dataset.from_dict({{"prompt": tiny.PROMPTS * 2, "completion": tiny.COMPLETIONS * 2}})
        args = tiny.trainer_args(tmp_path_factory.mktemp("o"), SFTConfig, learning_rate=1e-3, {args})
        return SFTTrainer(model=tiny.llama(tok), args=args, processing_class=tok, train_dataset=data)
"""


def test_trainer_saving_the_model_only(project):
    project.conftest(SFT.format(args="save_only_model=True"))
    run = project.run("--dlcheck=C1")
    run.assert_outcome("C1", "failed")
    text = tt.section(run, "C1")
    assert "4 steps, saved after step 2 through the Trainer's checkpoint-2 directory" in text
    assert "checkpoint-2 holds: model weights file" in text and "nothing for: optimizer, lr_scheduler, rng" in text
    assert "putting back optimizer + lr_scheduler from the uninterrupted run" in text
    assert "drop save_only_model=True" in text


def test_trainer_default_checkpoints_resume_exactly(project):
    project.conftest(SFT.format(args="save_only_model=False"))
    run = project.run("--dlcheck=C1", "-rA")
    run.fnmatch(["*::C1_resume PASSED (4 steps, saved after step 2 through the Trainer's checkpoint-2 dire*"])
    run.fnmatch(
        [
            "4 steps, saved after step 2 through the Trainer's checkpoint-2 directory and "
            "train(resume_from_checkpoint=...), resumed on fresh objects: the losses, learning rates, weights of steps "
            "3-4 equal the uninterrupted run's, bitwise",
            "resumed losses: step 3: *, step 4: *",
        ]
    )


def test_trainer_ignoring_the_data_position(project):
    project.conftest(SFT.format(args="ignore_data_skip=True"))
    run = project.run("--dlcheck=C1")
    run.assert_outcome("C1", "failed")
    text = tt.section(run, "C1")
    assert "data position" in text and "ignore_data_skip=False" in text


LOOP_SAVE = """
    @pytest.fixture(scope="session")
    def dlcheck_save_checkpoint():
        return tt.{save}

    @pytest.fixture(scope="session")
    def dlcheck_load_checkpoint():
        return tt.{load}
"""


def test_plain_loop_that_does_not_save_the_scheduler(project):
    project.conftest(tt.loop_project(extra=LOOP_SAVE.format(save="save_no_scheduler", load="load_no_scheduler")))
    run = project.run("--dlcheck=C1")
    run.assert_outcome("C1", "failed")
    text = tt.section(run, "C1")
    assert "saved after step 2 through dlcheck_save_checkpoint / dlcheck_load_checkpoint" in text
    assert "learning rate" in text
    assert "putting back lr_scheduler from the uninterrupted run after the load makes the resumed run identical" in text
    assert "the LR scheduler's position" in text and "state['lr_scheduler'].state_dict()" in text


def test_plain_loop_saving_everything_passes(project):
    project.conftest(tt.loop_project(extra=LOOP_SAVE.format(save="save_all", load="load_all")))
    run = project.run("--dlcheck=C1", "-rA")
    run.assert_outcome("C1", "passed")
    run.fnmatch(
        [
            "4 steps, saved after step 2 through dlcheck_save_checkpoint / dlcheck_load_checkpoint, resumed on fresh "
            "objects: the losses, learning rates, weights of steps 3-4 equal the uninterrupted run's, bitwise",
            "resumed losses: step 3: *, step 4: *",
        ]
    )


# ---- the shared smoke run as the uninterrupted run (issue 20: no second baseline when S1-S3 run it) ----------


def _results(out: Path) -> dict:
    import json

    return {r["id"]: r for r in json.loads(out.read_text())["results"]}


def test_the_smoke_run_is_the_uninterrupted_run_when_the_session_makes_it(project, tmp_path):
    project.conftest(tt.loop_project(extra=LOOP_SAVE.format(save="save_all", load="load_all")))
    out = tmp_path / "r.json"
    run = project.run("--dlcheck=C1,S1", "-rA", f"--dlcheck-json={out}")
    run.assert_outcome("C1", "passed")
    run.assert_outcome("S1", "passed")
    run.fnmatch(
        [
            "20 steps (the shared smoke run), saved after step 18 through dlcheck_save_checkpoint / "
            "dlcheck_load_checkpoint, resumed on fresh objects: the losses, learning rates, weights of steps 19-20 "
            "equal the uninterrupted run's, bitwise",
        ]
    )
    doc = json.loads(out.read_text())
    # C1 ran first: it made the 20-step smoke run (S1 reads it for free; its steps are the run's, under
    # "shared"), then trained only the 2 resumed steps
    assert doc["shared"]["smoke run"]["cost"]["optimizer_steps"] == 20 and doc["shared"]["smoke run"]["made_by"] == "C1"
    assert work_of(doc, "C1")["optimizer_steps"] == 20 + 2, doc["shared"]
    assert work_of(doc, "S1")["optimizer_steps"] == 0


def test_a_lost_scheduler_is_found_on_the_smoke_run_too(project):
    project.conftest(tt.loop_project(extra=LOOP_SAVE.format(save="save_no_scheduler", load="load_no_scheduler")))
    run = project.run("--dlcheck=C1,S1")
    run.assert_outcome("C1", "failed")
    run.assert_outcome("S1", "passed")
    text = tt.section(run, "C1")
    assert "20 steps (the shared smoke run), saved after step 18 through dlcheck_save_checkpoint" in text
    assert "putting back lr_scheduler from the uninterrupted run after the load makes the resumed run identical" in text


def test_a_save_that_raises_leaves_the_smoke_run_whole_and_c1_reports_it_as_alone(project):
    broken = """
    @pytest.fixture(scope="session")
    def dlcheck_save_checkpoint():
        def save(state, path):
            raise OSError("No space left on device")
        return save

    @pytest.fixture(scope="session")
    def dlcheck_load_checkpoint():
        return tt.load_all
"""
    project.conftest(tt.loop_project(extra=broken))
    alone = project.run("--dlcheck=C1")
    both = project.run("--dlcheck=C1,S1")
    both.assert_outcome("S1", "passed")
    assert both.outcome("C1") == alone.outcome("C1") != "passed"
    assert "No space left on device" in tt.section(both, "C1")


def test_a_trainer_s_smoke_run_writes_the_checkpoint_c1_resumes_from(project, tmp_path):
    project.conftest(SFT.format(args="save_only_model=True"))
    out = tmp_path / "r.json"
    run = project.run("--dlcheck=C1,S1", f"--dlcheck-json={out}")
    run.assert_outcome("C1", "failed")
    run.assert_outcome("S1", "passed")
    text = tt.section(run, "C1")
    # 12 examples, 2 a batch: epochs of 6 steps, so the planned step 18 (an epoch end) moves to 17, inside the epoch
    assert "20 steps (the shared smoke run), saved after step 17 through the Trainer's checkpoint-17 directory" in text
    assert "nothing for: optimizer, lr_scheduler, rng" in text and "drop save_only_model=True" in text
    # optimizer + lr_scheduler put back together, then each dropped once (the RNG states are put back in every
    # resume of C1, not a piece it prunes: C3 judges them)
    assert "(3 diagnostic resumes)" in text
    # the smoke run's 20 steps, then the 3 resumed steps, and 3 in each diagnostic resume
    doc = json.loads(out.read_text())
    assert doc["shared"]["smoke run"]["cost"]["optimizer_steps"] == 20
    assert work_of(doc, "C1")["optimizer_steps"] == 20 + 3 + 3 * 3, doc["shared"]
    assert work_of(doc, "S1")["optimizer_steps"] == 0


# ---- a GradScaler's own state (scale, growth tracker): lost without a step of difference ------------------------

#: a plain loop with an enabled GradScaler (torch.amp.GradScaler("cpu"), dlcheck's default step scales the loss
#: with state['scaler']); the checkpoint holds the scaler's state when ``keeps`` says so. The scale does not move
#: in 4 steps (no overflow, growth_interval 2000): the losses and weights of a resume with a fresh scaler are the
#: uninterrupted run's, only the scaler's growth tracker (and its later doubling) differs
SCALER_LOOP = """
    import pytest, torch, tiny_train as tt
    from torch import nn

    @pytest.fixture(scope="session")
    def dlcheck_make_training():
        def make():
            model = tt.MLP()
            optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2)
            return {{"model": model, "optimizer": optimizer,
                     "lr_scheduler": torch.optim.lr_scheduler.LambdaLR(optimizer, tt.warmup(3)),
                     "scaler": torch.amp.GradScaler("cpu")}}
        return make

    @pytest.fixture(scope="session")
    def dlcheck_dataloader():
        return tt.loader()

    @pytest.fixture(scope="session")
    def dlcheck_loss_fn():
        return nn.CrossEntropyLoss()

    @pytest.fixture(scope="session")
    def dlcheck_save_checkpoint():
        def save(state, path):
            tt.save_all(state, path)
            if {keeps}:
                torch.save(state["scaler"].state_dict(), f"{{path}}.scaler")
        return save

    @pytest.fixture(scope="session")
    def dlcheck_load_checkpoint():
        def load(state, path):
            tt.load_all(state, path)
            if {keeps}:
                state["scaler"].load_state_dict(torch.load(f"{{path}}.scaler"))
        return load
"""


def test_a_resume_that_does_not_restore_the_gradscaler_fails_c1(project, tmp_path):
    """The scale does not move over the run, so the resumed losses and weights are the uninterrupted run's; the
    resumed scaler counts its growth interval from zero: C1 compares the scalers' states at the ends."""
    project.conftest(SCALER_LOOP.format(keeps=False))
    out = tmp_path / "r.json"
    run = project.run("--dlcheck=C1", f"--dlcheck-json={out}")
    run.assert_outcome("C1", "failed")
    text = tt.section(run, "C1")
    c1 = _results(out)["C1"]
    assert (
        "the GradScaler state['scaler'] differs from the uninterrupted run's at the end: scale 65536, growth tracker 2 "
        "resumed vs scale 65536, growth tracker 4 uninterrupted"
    ) in text
    assert "putting back scaler from the uninterrupted run after the load makes the resumed run identical" in text
    assert "the GradScaler's loss scale and growth tracker" in c1["cause"], c1
    assert "state['scaler'].state_dict()" in c1["fix"], c1["fix"]


def test_a_resume_that_restores_the_gradscaler_passes_c1(project, tmp_path):
    project.conftest(SCALER_LOOP.format(keeps=True))
    out = tmp_path / "r.json"
    run = project.run("--dlcheck=C1", f"--dlcheck-json={out}")
    run.assert_outcome("C1", "passed")
    assert "equal the uninterrupted run's, bitwise" in _results(out)["C1"]["evidence"][0]
