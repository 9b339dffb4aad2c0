"""T10 on a Trainer whose compute_loss normalises by the accumulation itself. TRL's GRPOTrainer declares
loss_is_scaled_for_ga=True, so the Trainer's training_step does not divide its loss by gradient_accumulation_steps;
its loss ignores the num_items_in_batch argument and divides by the trainer's current_gradient_accumulation_steps
instead (loss_type grpo, bnpo, dr_grpo; dapo, TRL 1.16's default, divides its token sum by the generation batch's
tokens rescaled to one window). T10 had failed it as a loss that 'does not read num_items_in_batch' (found blind,
set 15: examples/scripts/gspo.py, importance_sampling_level="sequence", loss_type="grpo", accumulation 2). T10
now also calls compute_loss with the accumulation set to 1: a loss that grows k times there divides by it. Buggy
twins: a trainer that declares its per-batch mean scaled (divided by nothing) and a loss that divides by
num_items_in_batch and by the accumulation again (1/k of the full batch's gradient)."""

import pytest
import tiny_train as tt

GRPO = """
    import pytest, tiny
    from datasets import Dataset
    from trl import GRPOConfig, GRPOTrainer

    def reward(completions, **kw):
        return [-abs(20 - len(c)) / 20 for c in completions]

    @pytest.fixture(scope="session")
    def dlcheck_trainer(tmp_path_factory):
        tok = tiny.tokenizer()
        args = tiny.trainer_args(tmp_path_factory.mktemp("grpo"), GRPOConfig, num_generations=2, max_completion_length=6,
                                 beta=0.0, per_device_train_batch_size=4, gradient_accumulation_steps=2{extra})
        return GRPOTrainer(model=tiny.llama(tok), reward_funcs=reward, args=args, processing_class=tok,
                           train_dataset=Dataset.from_dict({{"prompt": tiny.PROMPTS}}))
"""

OWN_LOSS = """
    import pytest, tiny
    from transformers import DataCollatorForLanguageModeling, Trainer

    class MyTrainer(Trainer):
{body}

    @pytest.fixture(scope="session")
    def dlcheck_trainer(tmp_path_factory):
        tok = tiny.tokenizer()
        args = tiny.trainer_args(tmp_path_factory.mktemp("o"), max_steps=2, gradient_accumulation_steps=2)
        return MyTrainer(model=tiny.llama(tok), args=args, train_dataset=tiny.tokenized(tok),
                         data_collator=DataCollatorForLanguageModeling(tok, mlm=False))
"""

# declares its loss scaled for the accumulation, returns the model's own per-batch token mean
DECLARED_NOT_DONE = """
        loss_is_scaled_for_ga = True

        def compute_loss(self, model, inputs, return_outputs=False, num_items_in_batch=None):
            return model(**inputs).loss
"""

# the model divides by num_items_in_batch (the whole window's tokens), then the loss is divided by k again
DIVIDED_TWICE = """
        def compute_loss(self, model, inputs, return_outputs=False, num_items_in_batch=None):
            loss = super().compute_loss(model, inputs, return_outputs, num_items_in_batch)
            return loss / self.args.gradient_accumulation_steps
"""


@pytest.mark.parametrize(
    "extra",
    [', loss_type="grpo", importance_sampling_level="sequence"', ""],
    ids=["gspo-grpo-loss", "default-loss"],
)
def test_a_loss_that_divides_by_the_accumulation_itself_passes(project, extra):
    project.conftest(GRPO.format(extra=extra))
    run = project.run("--dlcheck=T10", "-rA")
    run.assert_outcome("T10", "passed")
    assert "the loss divides by the accumulation itself" in run.text
    assert "with current_gradient_accumulation_steps=2" in run.text and "with 1" in run.text
    assert "does not read num_items_in_batch" in run.text


def test_a_trainer_that_declares_its_per_batch_mean_scaled_fails(project):
    project.conftest(OWN_LOSS.format(body=DECLARED_NOT_DONE))
    run = project.run("--dlcheck=T10")
    run.assert_outcome("T10", "failed")
    text = tt.section(run, "T10")
    assert "the loss does not read num_items_in_batch" in text
    assert "nor divide by the accumulation" in text and "MyTrainer.loss_is_scaled_for_ga=True" in text
    assert "2x the full batch's" in text


def test_a_loss_divided_by_num_items_and_by_the_accumulation_fails(project):
    project.conftest(OWN_LOSS.format(body=DIVIDED_TWICE))
    run = project.run("--dlcheck=T10")
    run.assert_outcome("T10", "failed")
    text = tt.section(run, "T10")
    assert "divides by num_items_in_batch and by the accumulation" in text
    assert "1/2 of the full batch's" in text
