"""Leave no trace: after a full ``--dlcheck=llm`` session the user's objects are exactly as before —
parameters and buffers bit for bit, requires_grad, every submodule's train/eval flag, tokenizer
settings and vocabulary, the python/numpy/torch RNG states, and a trainer's own state."""

import random

import numpy as np
import pytest
import tiny
import torch

PIPELINE = """
    import pytest, tiny

    @pytest.fixture(scope="session")
    def dlcheck_tokenizer():
        return tiny.SHARED["tokenizer"]

    @pytest.fixture(scope="session")
    def dlcheck_model():
        return tiny.SHARED["model"]

    @pytest.fixture(scope="session")
    def dlcheck_collator():
        return tiny.SHARED["collator"]

    @pytest.fixture(scope="session")
    def dlcheck_dataset():
        return tiny.SHARED["dataset"]

    @pytest.fixture(scope="session")
    def dlcheck_eval_dataset():
        return tiny.SHARED["dataset"]

    @pytest.fixture(scope="session")
    def dlcheck_compute_metrics():
        return tiny.SHARED["compute_metrics"]
"""

TRAINER = """
    import pytest, tiny

    @pytest.fixture(scope="session")
    def dlcheck_trainer():
        return tiny.SHARED["trainer"]
"""


def snapshot_model(model):
    return {
        "tensors": {k: v.detach().clone() for k, v in model.state_dict(keep_vars=True).items()},
        "requires_grad": {n: p.requires_grad for n, p in model.named_parameters()},
        "training": {n: m.training for n, m in model.named_modules()},
        "grads": {n: None if p.grad is None else p.grad.clone() for n, p in model.named_parameters()},
    }


def assert_same_model(before, after):
    assert before["tensors"].keys() == after["tensors"].keys()
    for k, v in before["tensors"].items():
        assert torch.equal(v, after["tensors"][k]), f"{k} changed"
    assert before["requires_grad"] == after["requires_grad"]
    assert before["training"] == after["training"]
    for k, g in before["grads"].items():
        other = after["grads"][k]
        assert (g is None and other is None) or torch.equal(g, other), f"grad of {k} changed"


def snapshot_tokenizer(tok):
    from pytest_dlcheck.guard import tokenizer_settings

    return {
        **tokenizer_settings(tok),
        "len": len(tok),
        "vocab": tok.get_vocab(),
        "special": dict(tok.special_tokens_map),
    }


def rng_states():
    return random.getstate(), np.random.get_state()[1].copy(), torch.random.get_rng_state().clone()


def assert_same_rng(before, after):
    assert before[0] == after[0], "python RNG state changed"
    assert np.array_equal(before[1], after[1]), "numpy RNG state changed"
    assert torch.equal(before[2], after[2]), "torch RNG state changed"


@pytest.fixture
def shared():
    tiny.SHARED = {}
    yield tiny.SHARED
    tiny.SHARED = {}


def compute_metrics(pred):
    return {"perplexity": 1.0}


def test_a_full_llm_session_leaves_a_hand_pipeline_untouched(project, shared):
    from transformers import DataCollatorForLanguageModeling

    tok = tiny.tokenizer(padding_side="left")
    model = tiny.llama(tok)
    model.train()
    model.model.layers[0].eval()  # a user's own mixed modes must survive
    model.model.embed_tokens.weight.requires_grad_(False)
    shared.update(
        tokenizer=tok,
        model=model,
        collator=DataCollatorForLanguageModeling(tok, mlm=False),
        dataset=tiny.tokenized(tok),
        compute_metrics=compute_metrics,
    )
    project.conftest(PIPELINE)
    before = snapshot_model(model), snapshot_tokenizer(tok), rng_states()
    run = project.run("--dlcheck=llm")
    assert "INTERNALERROR" not in run.text and run.result.ret in (0, 1), run.text
    assert_same_model(before[0], snapshot_model(model))
    assert snapshot_tokenizer(tok) == before[1]
    assert_same_rng(before[2], rng_states())


def test_a_full_llm_session_leaves_a_trainer_untouched(project, shared, tmp_path):
    from datasets import Dataset
    from trl import SFTConfig, SFTTrainer

    tok = tiny.tokenizer()
    model = tiny.llama(tok)
    data = Dataset.from_dict({"prompt": tiny.PROMPTS, "completion": tiny.COMPLETIONS})
    trainer = SFTTrainer(
        model=model, args=tiny.trainer_args(tmp_path, SFTConfig), processing_class=tok, train_dataset=data
    )
    shared.update(trainer=trainer)
    project.conftest(TRAINER)
    prepared = len(trainer.accelerator._dataloaders)
    before = snapshot_model(model), snapshot_tokenizer(tok), rng_states(), trainer.state.global_step
    run = project.run("--dlcheck=llm")
    assert "INTERNALERROR" not in run.text and run.result.ret in (0, 1), run.text
    assert_same_model(before[0], snapshot_model(model))
    assert snapshot_tokenizer(tok) == before[1]
    assert_same_rng(before[2], rng_states())
    assert trainer.state.global_step == before[3]
    assert len(trainer.accelerator._dataloaders) == prepared, "a dataloader was prepared on the user's accelerator"
