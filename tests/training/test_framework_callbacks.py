"""The user's callbacks and hooks in the other kinds (issue 29 item 5): a transformers Trainer's callbacks are
copied into every clone dlcheck trains (fresh per run, the user's own never called), and Accelerate's
save/load-state hooks run in dlcheck's checkpoints, because every state comes from the user's factory with its
own Accelerator (an EMA saved only through a hook, as diffusers' scripts do, comes back: C10 and C1 pass)."""

import json
import sys
from pathlib import Path

import tiny
import torch
from datasets import Dataset
from transformers import TrainerCallback
from trl import SFTConfig, SFTTrainer

from pytest_dlcheck.training.trainer import TrainerSetup

sys.path.insert(0, str(Path(__file__).parents[1] / "train"))  # tiny_train, for the in-process projects

torch.set_num_threads(1)


class Count(TrainerCallback):
    def __init__(self):
        self.steps = 0

    def on_step_end(self, args, state, control, **kwargs):
        self.steps += 1


def test_a_trainers_callbacks_run_in_every_clone_as_fresh_copies(tmp_path_factory):
    tok = tiny.tokenizer()
    mine = Count()
    trainer = SFTTrainer(
        model=tiny.llama(tok),
        args=tiny.trainer_args(tmp_path_factory.mktemp("o"), SFTConfig),
        processing_class=tok,
        train_dataset=Dataset.from_dict({"text": tiny.texts()}),
        callbacks=[mine],
    )
    setup = TrainerSetup(trainer, tmp_path_factory)
    counted = []
    for steps in (2, 1):
        _, fresh, _ = setup.smoke(steps)
        copies = [cb for cb in fresh.owner.callback_handler.callbacks if isinstance(cb, Count)]
        assert len(copies) == 1 and copies[0] is not mine
        counted.append(copies[0].steps)
    assert counted == [2, 1]  # each clone's copy starts at 0: no state carried from one run to the next
    assert mine.steps == 0


HOOKED = """
    import os
    import pytest, torch
    from torch import nn
    from torch.nn import functional as F
    from torch.optim.swa_utils import AveragedModel, get_ema_multi_avg_fn
    from torch.utils.data import DataLoader, TensorDataset
    from accelerate import Accelerator

    def data():
        g = torch.Generator().manual_seed(0)
        y = torch.randint(0, 3, (64,), generator=g)
        x = torch.tensor([[2.0, 0.0], [-2.0, 0.0], [0.0, 2.0]])[y] + 0.3 * torch.randn(64, 2, generator=g)
        return TensorDataset(x, y)

    @pytest.fixture(scope="session")
    def dlcheck_make_training():
        def make():
            acc = Accelerator(cpu=True)
            model = nn.Sequential(nn.Linear(2, 16), nn.Tanh(), nn.Linear(16, 3))
            ema = AveragedModel(model, multi_avg_fn=get_ema_multi_avg_fn(0.9))
            opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
            loader = DataLoader(data(), batch_size=8, shuffle=True)
            model, opt, loader = acc.prepare(model, opt, loader)

            # diffusers' way: the EMA is neither prepared nor registered, it is saved and loaded by state hooks
            def save_hook(models, weights, output_dir):
                torch.save(ema.state_dict(), os.path.join(output_dir, "ema.pt"))

            def load_hook(models, input_dir):
                ema.load_state_dict(torch.load(os.path.join(input_dir, "ema.pt")))

            if {hooks}:
                acc.register_save_state_pre_hook(save_hook)
                acc.register_load_state_pre_hook(load_hook)
            return {{"model": model, "optimizer": opt, "ema": ema, "accelerator": acc}}
        return make

    @pytest.fixture(scope="session")
    def dlcheck_dataloader():
        return DataLoader(data(), batch_size=8, shuffle=True)

    @pytest.fixture(scope="session")
    def dlcheck_train_step():
        def step(state, batch):
            acc, model, opt = state["accelerator"], state["model"], state["optimizer"]
            x, y = batch
            loss = F.cross_entropy(model(x), y)
            acc.backward(loss)
            opt.step()
            opt.zero_grad()
            state["ema"].update_parameters(acc.unwrap_model(model))
            return loss
        return step
"""


def _run(project, tmp_path, hooks: bool):
    project.conftest(HOOKED.format(hooks=hooks))
    out = tmp_path / "r.json"
    run = project.run("--dlcheck=C10,C1", f"--dlcheck-json={out}", "-rA")
    return run, {r["id"]: r for r in json.loads(out.read_text())["results"]}


def test_an_ema_saved_by_accelerate_state_hooks_comes_back(project, tmp_path):
    run, by = _run(project, tmp_path, hooks=True)
    assert by["C10"]["outcome"] == "passed", by["C10"]
    assert "state['ema']" in " ".join(by["C10"]["evidence"]), by["C10"]
    assert by["C1"]["outcome"] == "passed", by["C1"]
    assert any("the EMA state['ema']" in line and "bitwise" in line for line in by["C1"]["evidence"]), by["C1"]


def test_without_the_hooks_the_ema_does_not_come_back(project, tmp_path):
    run, by = _run(project, tmp_path, hooks=False)
    assert by["C10"]["outcome"] == "failed", by["C10"]
    assert "state['ema'] (AveragedModel) does not come back" in " ".join(by["C10"]["evidence"]), by["C10"]
    assert by["C1"]["outcome"] == "failed" and "EMA" in by["C1"]["cause"], by["C1"]
