"""Leave no trace: after a full train,ckpt,smoke session (runs, checkpoints, resumes, interrupted saves)
the user's trainer, model, reference model, LightningModule and datamodule are exactly as before, the
global RNGs too, and nothing was written outside pytest's tmp paths."""

import random

import numpy as np
import pytest
import tiny_lightning as tl
import tiny_train as tt
import torch

KEEP = """
    import pytest, tiny_train as tt

    @pytest.fixture(scope="session")
    def dlcheck_trainer():
        return tt.KEEP["trainer"]
"""


def snapshot(model):
    return (
        {k: v.detach().clone() for k, v in model.state_dict(keep_vars=True).items()},
        {n: p.requires_grad for n, p in model.named_parameters()},
        {n: m.training for n, m in model.named_modules()},
        {n: p.grad for n, p in model.named_parameters()},
    )


def assert_same(before, model):
    after = snapshot(model)
    for k, v in before[0].items():
        assert torch.equal(v, after[0][k]), f"{k} changed"
    assert before[1:3] == after[1:3]
    assert all(g is None for g in after[3].values())


def rng():
    return random.getstate(), np.random.get_state()[1].copy(), torch.random.get_rng_state().clone()


@pytest.fixture
def keep():
    tt.KEEP.clear()
    yield tt.KEEP
    tt.KEEP.clear()


@pytest.mark.parametrize("kind", ["sft", "dpo"])
def test_a_trainer_is_left_as_it_was(project, keep, tmp_path, kind):
    import copy

    import tiny
    from datasets import Dataset
    from trl import DPOConfig, DPOTrainer, SFTConfig, SFTTrainer

    tok = tiny.tokenizer()
    model = tiny.llama(tok)
    model.model.layers[0].eval()  # the user's own mixed modes survive
    if kind == "sft":
        data = Dataset.from_dict({"prompt": tiny.PROMPTS, "completion": tiny.COMPLETIONS})
        trainer = SFTTrainer(
            model=model,
            args=tiny.trainer_args(tmp_path / "out", SFTConfig, eval_strategy="no"),
            processing_class=tok,
            train_dataset=data,
            eval_dataset=data,
        )
    else:
        data = Dataset.from_dict(
            {
                "prompt": tiny.PROMPTS,
                "chosen": tiny.COMPLETIONS,
                "rejected": tiny.COMPLETIONS[1:] + tiny.COMPLETIONS[:1],
            }
        )
        trainer = DPOTrainer(
            model=model,
            ref_model=copy.deepcopy(model),
            processing_class=tok,
            train_dataset=data,
            args=tiny.trainer_args(tmp_path / "out", DPOConfig, max_length=64),
        )
    keep["trainer"] = trainer
    models = [m for m in (trainer.model, getattr(trainer, "ref_model", None)) if m is not None]
    before = [snapshot(m) for m in models]
    prepared, step, states = len(trainer.accelerator._dataloaders), trainer.state.global_step, rng()
    project.conftest(KEEP)
    run = project.run("--dlcheck=train,ckpt,smoke,L9")
    assert "INTERNALERROR" not in run.text and "passed" in run.text, run.text
    for snap, m in zip(before, models):
        assert_same(snap, m)
    assert trainer.optimizer is None and trainer.lr_scheduler is None
    assert trainer.state.global_step == step and len(trainer.accelerator._dataloaders) == prepared
    assert not (tmp_path / "out").exists() or not any((tmp_path / "out").iterdir()), "wrote into the user's output_dir"
    after = rng()
    assert before and after[0] == states[0] and np.array_equal(after[1], states[1]) and torch.equal(after[2], states[2])


def test_a_lightning_module_and_datamodule_are_left_as_they_were(project, keep):
    torch.manual_seed(0)
    keep["module"], keep["dm"] = tl.Classifier(dropout=0.1), tl.Blobs(shuffle=True)
    before = snapshot(keep["module"])
    project.conftest("""
    import pytest, tiny_train as tt

    @pytest.fixture(scope="session")
    def dlcheck_lightning_module():
        return tt.KEEP["module"]

    @pytest.fixture(scope="session")
    def dlcheck_datamodule():
        return tt.KEEP["dm"]
    """)
    run = project.run("--dlcheck=train,ckpt,smoke")
    assert "INTERNALERROR" not in run.text and "passed" in run.text, run.text
    assert_same(before, keep["module"])
    assert keep["module"]._trainer is None
    assert not hasattr(keep["dm"], "train_set"), "setup() ran on the user's datamodule"


def test_an_accelerate_users_own_objects_and_accelerate_state_are_left_as_they_were(project, keep):
    """The user's own Accelerator (its prepared model, its step counter, the gradient state every
    Accelerator of the process shares) is untouched by a session that trains, saves and loads fresh
    Accelerate objects from the factory."""
    from accelerate import Accelerator
    from accelerate.state import GradientState

    torch.manual_seed(0)
    acc = Accelerator(cpu=True, gradient_accumulation_steps=2)
    model = tt.MLP()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
    model, opt = acc.prepare(model, opt)
    keep.update(acc=acc, model=model)
    before = snapshot(model)
    grad_state = dict(GradientState._shared_state)
    step, models, states = acc.step, len(acc._models), rng()
    project.conftest("""
    import pytest, torch, tiny_train as tt
    from accelerate import Accelerator

    @pytest.fixture(scope="session")
    def dlcheck_make_training():
        def make():
            acc = Accelerator(cpu=True, gradient_accumulation_steps=2)
            model = tt.MLP()
            opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
            model, opt = acc.prepare(model, opt)
            return {"accelerator": acc, "model": model, "optimizer": opt}
        return make

    @pytest.fixture(scope="session")
    def dlcheck_dataloader():
        return tt.loader(shuffle=True)

    @pytest.fixture(scope="session")
    def dlcheck_loss_fn():
        return torch.nn.CrossEntropyLoss()
    """)
    run = project.run("--dlcheck=train,ckpt,smoke")
    assert "INTERNALERROR" not in run.text and "passed" in run.text and "C10" in run.text, run.text
    assert_same(before, keep["model"])
    assert acc.step == step and len(acc._models) == models
    after_state = dict(GradientState._shared_state)
    for key in ("sync_gradients", "end_of_dataloader", "remainder", "active_dataloader", "plugin_kwargs"):
        assert after_state.get(key) == grad_state.get(key), (key, grad_state.get(key), after_state.get(key))
    after = rng()
    assert after[0] == states[0] and np.array_equal(after[1], states[1]) and torch.equal(after[2], states[2])
