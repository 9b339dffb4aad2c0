"""A Trainer subclass whose batches are raw prompt strings and whose own training_step builds the model's inputs
(TRL's online DPO trainer generates from them): the train checks that compute a loss of a batch do not feed the
strings to the model (that had raised inside transformers and was reported as "your role raised"); they say
what they could not judge. The run through the trainer's own train() still judges it (S1)."""

CONFTEST = """
import pytest, tiny, torch
from transformers import Trainer


class PromptTrainer(Trainer):
    # batches of prompt strings; the step tokenizes them itself (as an online trainer builds its completions)
    def training_step(self, model, inputs, num_items_in_batch=None):
        model.train()
        enc = self.processing_class(inputs["prompt"], return_tensors="pt", padding=True)
        labels = enc["input_ids"].masked_fill(enc["attention_mask"] == 0, -100)
        loss = model(**enc, labels=labels).loss
        self.accelerator.backward(loss)
        return loss.detach()


@pytest.fixture(scope="session")
def dlcheck_trainer(tmp_path_factory):
    tok = tiny.tokenizer()
    data = [{"prompt": t} for t in tiny.texts(16)]
    args = tiny.trainer_args(tmp_path_factory.mktemp("out"), remove_unused_columns=False)
    return PromptTrainer(model=tiny.llama(tok), args=args, train_dataset=data, processing_class=tok,
                         data_collator=lambda feats: {"prompt": [f["prompt"] for f in feats]})
"""


def test_a_trainer_whose_batches_hold_no_tensor_is_not_fed_to_the_model(project):
    project.conftest(CONFTEST)
    run = project.run("--dlcheck=T2,T3,T5,S1", "-rA")
    assert "raised" not in run.text and "internal error" not in run.text, run.text
    for cid in ("T2", "T3", "T5"):
        run.assert_outcome(cid, "skipped")
    text = " ".join(run.text.split())
    assert (
        "the batches of PromptTrainer's train dataloader hold no tensor (prompt: list): PromptTrainer builds the "
        "model's inputs inside its own training step (PromptTrainer overrides Trainer.training_step)"
    ) in text
    run.assert_outcome("S1", "passed")
