"""T10 on a transformers Trainer under gradient accumulation: the Trainer leaves the division by the accumulated
batch to a model whose forward takes **kwargs (model_accepts_loss_kwargs), handing it num_items_in_batch. A head
that takes **kwargs and ignores num_items_in_batch (Wav2Vec2ForCTC under run_speech_recognition_ctc.py, found
blind, set 13; transformers issue #47688) is divided by neither: every optimizer step's gradient is
gradient_accumulation_steps times the full batch's. T10 calls the Trainer's compute_loss with two item counts."""

import pytest
import tiny_train as tt

HEAD = """
    import pytest, tiny, torch
    from torch import nn
    from transformers import DataCollatorForLanguageModeling, Trainer

    class Head(nn.Module):  # a custom causal head whose loss is its own per-batch token mean
        def __init__(self, vocab):
            super().__init__()
            self.emb, self.out = nn.Embedding(vocab, 16), nn.Linear(16, vocab)

        def forward(self, input_ids=None, attention_mask=None, labels=None{kwargs}):
            logits = self.out(self.emb(input_ids))
            loss = nn.functional.cross_entropy(
                logits[:, :-1].reshape(-1, logits.shape[-1]), labels[:, 1:].reshape(-1), ignore_index=-100
            )
            return {{"loss": loss, "logits": logits}}

    @pytest.fixture(scope="session")
    def dlcheck_trainer(tmp_path_factory):
        tok = tiny.tokenizer()
        model = {model}
        args = tiny.trainer_args(tmp_path_factory.mktemp("o"), max_steps=2, gradient_accumulation_steps={accum})
        return Trainer(model=model, args=args, train_dataset=tiny.tokenized(tok),
                       data_collator=DataCollatorForLanguageModeling(tok, mlm=False))
"""


def conftest(model: str = "Head(len(tok))", kwargs: str = ", **kwargs", accum: int = 2) -> str:
    return HEAD.format(model=model, kwargs=kwargs, accum=accum)


def test_a_head_that_takes_kwargs_and_ignores_num_items_in_batch_fails(project):
    project.conftest(conftest())
    run = project.run("--dlcheck=T10")
    run.assert_outcome("T10", "failed")
    text = tt.section(run, "T10")
    assert (
        "the loss does not read num_items_in_batch nor divide by the accumulation, and the Trainer does not divide it by"
        in text
    )
    assert "gradient_accumulation_steps=2 because Head.forward takes **kwargs" in text
    assert "2x the full batch's" in text and "accepts_loss_kwargs = False" in text


def test_a_model_that_divides_by_num_items_in_batch_passes(project):
    project.conftest(conftest(model="tiny.llama(tok)"))
    run = project.run("--dlcheck=T10", "-rA")
    run.assert_outcome("T10", "passed")
    assert "the loss divides by num_items_in_batch, the supervised items of the whole accumulated batch" in run.text


@pytest.mark.parametrize("accum", [1, 2])
def test_a_head_without_kwargs_is_divided_by_the_trainer(project, accum):
    """No **kwargs: the Trainer divides by gradient_accumulation_steps itself (not judged further), and without
    accumulation T10 does not apply."""
    project.conftest(conftest(kwargs="", accum=accum))
    run = project.run("--dlcheck=T10", "-rA")
    if accum == 1:
        assert "does not accumulate gradients (gradient_accumulation_steps=1)" in run.text
    else:
        run.assert_outcome("T10", "skipped")
        assert "so the Trainer divides each micro-batch's loss by gradient_accumulation_steps=2 itself" in run.text
