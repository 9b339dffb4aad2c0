"""C1: a resumed run continues exactly as the uninterrupted run."""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "train"))
import tiny_train as tt  # noqa: E402

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
