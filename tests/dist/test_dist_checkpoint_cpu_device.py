"""D5 when the user's load maps the checkpoint to ``accelerator.device`` (found blind, set 14: a diffusion Trainer
whose load is ``torch.load(path, map_location=self.accelerator.device)``).

The launch's CPU ranks are Accelerate MULTI_CPU processes, whose ``accelerator.device`` is ``cpu:0`` — as under a
real ``accelerate launch --cpu`` — and ``torch.load`` cannot map storages to an indexed CPU device. On GPU ranks the
device is ``cuda:N`` and the load works: D5 says the load was not judged on the emulated device (whether the user's
load raises it or catches it and raises its own error), never "the checkpoint lives where only one rank sees it".
The buggy twin — a checkpoint written by rank 0 under a rank-local name, so rank 1 finds no file — still fails,
with the same ``map_location``. One launch per test."""

from helpers import flat as _flat
from helpers import no_leftover_process as _no_leftover_process
from helpers import role_fixtures

CONFTEST = """
    import os
    import pytest, torch
    from torch import nn
    from torch.utils.data import DataLoader, TensorDataset
    from accelerate import Accelerator

    torch.set_num_threads(1)
    DATA = TensorDataset(torch.randn(16, 4, generator=torch.Generator().manual_seed(0)), torch.arange(16) % 2)

    def make():
        torch.manual_seed(0)
        acc = Accelerator(cpu=True)
        model = nn.Linear(4, 2)
        opt = torch.optim.SGD(model.parameters(), lr=0.1)
        model, opt, loader = acc.prepare(model, opt, DataLoader(DATA, batch_size=2))
        return {{"accelerator": acc, "model": model, "optimizer": opt, "train_dataloader": loader}}

    def step(state, batch):
        acc = state["accelerator"]
        x, y = batch
        loss = nn.functional.cross_entropy(state["model"](x), y)
        acc.backward(loss)
        state["optimizer"].step()
        state["optimizer"].zero_grad()
        return loss.detach()

    def where(path, acc):
        return {where}

    def save(state, path):
        acc = state["accelerator"]
        if acc.is_main_process:
            torch.save({{"model": acc.get_state_dict(state["model"])}}, where(path, acc))
        acc.wait_for_everyone()

    def read(state, path):
        acc = state["accelerator"]
        data = torch.load(where(path, acc), map_location=acc.device)
        acc.unwrap_model(state["model"]).load_state_dict(data["model"])

    def load(state, path):
        {load}

{fixtures}
"""

ROLES = role_fixtures(make_training="make", train_step="step", save_checkpoint="save", load_checkpoint="load")
CONFTEST = CONFTEST.replace("{fixtures}", ROLES.replace("{", "{{").replace("}", "}}"))

SHARED = "path"
RANK_LOCAL = 'f"{path}.rank{acc.process_index}"'  # rank 0 writes path.rank0; rank 1 looks for path.rank1
RAISED = "read(state, path)"
# a "newest that loads" load: the torch.load error caught, its own raised
SWALLOWED = """try:
            read(state, path)
        except Exception:
            raise FileNotFoundError(f"no loadable checkpoint at {path}")"""

EMULATED = "these ranks run on CPU as Accelerate's MULTI_CPU processes, whose accelerator.device is cpu:0"


def test_a_load_mapped_to_the_ranks_cpu_device_is_not_judged_not_blamed(project):
    project.conftest(CONFTEST.format(where=SHARED, load=RAISED))
    run = project.run("--dlcheck=D5", "-rA")
    run.assert_outcome("D5", "skipped")
    text = _flat(run.text)
    assert "whether every rank loads the checkpoint is not judged: dlcheck_load_checkpoint on rank 0" in text, text
    assert "map_location=device(type='cpu', index=0)" in text, text
    assert EMULATED in text, text
    assert "lives where only one rank sees it" not in text, text
    _no_leftover_process()


def test_a_load_that_catches_the_cpu_device_error_is_not_blamed_either(project):
    project.conftest(CONFTEST.format(where=SHARED, load=SWALLOWED))
    run = project.run("--dlcheck=D5", "-rA")
    run.assert_outcome("D5", "skipped")
    text = _flat(run.text)
    assert EMULATED in text, text
    assert "lives where only one rank sees it" not in text, text
    _no_leftover_process()


def test_a_checkpoint_under_a_rank_local_name_still_fails(project):
    project.conftest(CONFTEST.format(where=RANK_LOCAL, load=RAISED))
    run = project.run("--dlcheck=D5")
    run.assert_outcome("D5", "failed")
    text = _flat(run.section("D5"))
    # rank 0 finds its file and meets the emulated device; rank 1 finds no file: conclusive
    assert "dlcheck_load_checkpoint on rank 1 raises:" in text and "FileNotFoundError" in text, text
    assert "lives where only one rank sees it" in text, text
    _no_leftover_process()
