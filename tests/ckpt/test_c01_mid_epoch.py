"""C1 saves in the middle of an epoch after the first when the run's length allows: a Trainer whose
``group_by_length`` sampler draws each epoch's order from the global RNG (no set_epoch) builds the resumed epoch's
order before the Trainer restores the saved RNG states, so a mid-epoch resume in a later epoch trains other
examples (found blind: transformers' run_speech_recognition_ctc.py / run_speech_recognition_seq2seq.py). A save
at an epoch end hides it (the RNG states are loaded before the epoch's order is drawn there)."""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "train"))
import tiny_train as tt  # noqa: E402

TRAINER = """
    import pytest, tiny
    from datasets import Dataset
    from transformers import DataCollatorForLanguageModeling, Trainer

    @pytest.fixture(scope="session")
    def dlcheck_trainer(tmp_path_factory):
        tok = tiny.tokenizer()
        # 8 distinct examples of several lengths, 2 a batch: an epoch of 4 optimizer steps
        data = Dataset.from_list([tok(t + " x" * i + tok.eos_token) for i, t in enumerate(tiny.texts(8))])
        args = tiny.trainer_args(tmp_path_factory.mktemp("o"), learning_rate=1e-3, {args})
        return Trainer(
            model=tiny.llama(tok), args=args, train_dataset=data,
            data_collator=DataCollatorForLanguageModeling(tok, mlm=False),
        )
"""

GROUPED = 'train_sampling_strategy="group_by_length"'


def test_length_grouped_sampler_resumed_in_a_later_epoch_fails(project):
    project.conftest(TRAINER.format(args=GROUPED))
    run = project.run("--dlcheck=C1", "--dlcheck-set", "C1.steps=8")
    run.assert_outcome("C1", "failed")
    text = tt.section(run, "C1")
    # 8 steps planned half way (step 4, the end of epoch 1): saved in the middle of the second epoch instead
    assert "saved after step 5" in text, text
    assert "middle of epoch 2" in text, text
    assert "the rest of epoch 2 of 4 optimizer steps" in text, text
    assert "order of examples is drawn anew" in text and "before it puts the saved RNG states back" in text, text


def test_random_sampler_resumed_in_a_later_epoch_passes(project):
    project.conftest(TRAINER.format(args="seed=0"))
    run = project.run("--dlcheck=C1", "--dlcheck-set", "C1.steps=8", "-rA")
    run.assert_outcome("C1", "passed")
    assert "saved after step 5" in run.text and "middle of epoch 2" in run.text, run.text


def test_one_step_epochs_say_the_mid_epoch_resume_is_not_judged(project):
    project.conftest(TRAINER.format(args="per_device_train_batch_size=8"))
    run = project.run("--dlcheck=C1", "-rA")
    run.assert_outcome("C1", "passed")
    assert "mid-epoch resume not judged" in run.text, run.text
    assert "an epoch of your training data is one optimizer step" in run.text, run.text


def test_epoch_end_saves_say_the_mid_epoch_resume_is_not_judged(project):
    project.conftest(TRAINER.format(args=GROUPED + ', save_strategy="epoch"'))
    run = project.run("--dlcheck=C1", "--dlcheck-set", "C1.steps=8", "-rA")
    # the Trainer loads the RNG states before it draws an epoch's order when it resumes at an epoch end
    run.assert_outcome("C1", "passed")
    assert "saved after step 4" in run.text, run.text
    assert "mid-epoch resume not judged" in run.text and "save_strategy='epoch'" in run.text, run.text


def test_loop_saving_at_epoch_ends_says_the_mid_epoch_resume_is_not_judged(project):
    from test_c01_checkpoint_every import EPOCH_LOOP

    project.conftest(EPOCH_LOOP.format(plus=" + 1", every="epoch"))
    run = project.run("--dlcheck=C1", "-rA")
    run.assert_outcome("C1", "passed")
    assert "mid-epoch resume not judged" in run.text and "checkpoints at epoch ends only" in run.text, run.text
