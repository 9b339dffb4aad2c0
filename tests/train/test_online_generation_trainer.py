"""A trainer that generates its completions inside the step (TRL's RLOOTrainer): the train checks hand its step what
its own train dataloader yields (a generation batch of per_device_train_batch_size x steps_per_generation rows, which
its step splits), and C1 saves where the user's save_steps puts a save in its generation cycle."""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import tiny_train as tt  # noqa: E402

RLOO = """
    import pytest, tiny
    from datasets import Dataset
    from trl import RLOOConfig, RLOOTrainer

    def reward(completions, **kw):
        return [{reward} for c in completions]

    @pytest.fixture(scope="session")
    def dlcheck_trainer(tmp_path_factory):
        tok = tiny.tokenizer()
        # one generation every 4 optimizer steps (steps_per_generation 4, no gradient accumulation)
        args = tiny.trainer_args(tmp_path_factory.mktemp("rloo"), RLOOConfig, num_generations=2, max_completion_length=4,
                                 steps_per_generation=4, beta=0.0, learning_rate=1e-3, max_steps=8,
                                 save_strategy="steps", save_steps={save_steps})
        return RLOOTrainer(model=tiny.llama(tok), reward_funcs=reward, args=args, processing_class=tok,
                           train_dataset=Dataset.from_dict({{"prompt": tiny.PROMPTS * 2}}))
"""


def test_train_checks_get_the_trainers_own_generation_batch(project):
    project.conftest(RLOO.format(save_steps=4, reward="float(len(c))"))
    run = project.run("--dlcheck=T2,T3,T5", "-rA")
    assert "internal error" not in run.text and "raised" not in run.text, run.text
    run.assert_outcome("T3", "passed")
    run.assert_outcome("T5", "passed")
    # no fixed batch to memorise: its loss is computed on completions it generates
    run.assert_outcome("T2", "skipped")
    run.fnmatch(["*not applicable: RLOOTrainer's loss is computed on completions it generates inside each step*"])


def test_equal_rewards_leave_the_gradients_unjudged(project):
    # every completion rewarded alike: every advantage is 0 and the policy loss has no gradient by construction
    project.conftest(RLOO.format(save_steps=4, reward="1.0"))
    run = project.run("--dlcheck=T3")
    run.assert_outcome("T3", "skipped")
    run.fnmatch(
        ["*cannot judge the gradients on batch 0: every advantage of the 2 completions RLOOTrainer trains first*"]
    )


def test_resume_saved_at_a_cycle_boundary_when_save_steps_is_a_multiple(project):
    project.conftest(RLOO.format(save_steps=4, reward="float(len(c))"))
    run = project.run("--dlcheck=C1", "-rA")
    run.assert_outcome("C1", "passed")
    run.fnmatch(["*6 steps, saved after step 4 through the Trainer's checkpoint-4 directory*"])
    run.fnmatch(["*RLOOTrainer generates completions once every 4 optimizer steps*"])
    run.fnmatch(["*your save_steps=4 is a multiple of 4: your run saves at a cycle boundary*"])


def test_resume_saved_inside_the_cycle_when_save_steps_is_not_a_multiple(project):
    project.conftest(RLOO.format(save_steps=6, reward="float(len(c))"))
    run = project.run("--dlcheck=C1")
    run.assert_outcome("C1", "failed")
    text = tt.section(run, "C1")
    assert "saved after step 2" in text, text
    assert "your save_steps=6 is not a multiple of 4: your run saves 2 step(s) into a generation cycle" in " ".join(
        text.split()
    ), text
    assert "the save falls inside the trainer's generation cycle" in " ".join(text.split()), text
    assert "set save_steps to a multiple of 4" in " ".join(text.split()), text
