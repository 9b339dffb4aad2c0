"""A tiny real Accelerate user for the dist tests: ``Accelerator(cpu=True)`` built in the factory, the model, optimizer
and a shuffled DataLoader passed to ``accelerator.prepare``, the step as Accelerate's examples write it
(``accelerator.accumulate``, ``accelerator.backward``); and two buggy twins: a step that computes the loss on
``accelerator.unwrap_model(model)`` (DDP's all-reduce bypassed) and a factory that leaves the model out of
``prepare``. Imported by the throwaway user projects (and, in their rank processes, through the fork)."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from accelerate import Accelerator
from accelerate.utils import set_seed
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

N, FEATURES, CLASSES, BATCH = 42, 4, 3, 4


class MLP(nn.Module):
    def __init__(self):
        super().__init__()
        self.hidden = nn.Linear(FEATURES, 16)
        self.drop = nn.Dropout(0.1)
        self.out = nn.Linear(16, CLASSES)

    def forward(self, x):
        return self.out(self.drop(torch.tanh(self.hidden(x))))


def data() -> TensorDataset:
    g = torch.Generator().manual_seed(0)
    y = torch.randint(0, CLASSES, (N,), generator=g)
    x = torch.randn(N, FEATURES, generator=g) + y[:, None].float()
    return TensorDataset(x, y)


def _parts():
    # as Accelerate's examples do (set_seed(seed) in every process): the same start on every rank, which an
    # unseeded script has only before torch 2.14 (2.14 seeds each fresh process from the OS)
    set_seed(0)
    model = MLP()
    return model, torch.optim.AdamW(model.parameters(), lr=1e-2), DataLoader(data(), batch_size=BATCH, shuffle=True)


def make_training():
    """Correct: everything the training touches goes through accelerator.prepare."""
    accelerator = Accelerator(cpu=True)
    model, opt, loader = accelerator.prepare(*_parts())
    return {"model": model, "optimizer": opt, "train_dataloader": loader, "accelerator": accelerator}


def make_training_model_left_out():
    """Buggy: the optimizer and the DataLoader go through accelerator.prepare, the model is left bare (no DDP:
    nothing averages the gradients of the ranks' different batches)."""
    accelerator = Accelerator(cpu=True)
    model, opt, loader = _parts()
    opt, loader = accelerator.prepare(opt, loader)
    return {"model": model, "optimizer": opt, "train_dataloader": loader, "accelerator": accelerator}


def make_training_head_after_prepare():
    """Buggy: the classifier head is attached after accelerator.prepare wrapped the backbone in DDP (the optimizer,
    built afterwards, holds it): DDP neither broadcasts nor averages the head's parameters."""
    accelerator = Accelerator(cpu=True)
    model, _, loader = _parts()
    model.out = nn.Identity()  # the backbone alone: 16 features, read as logits until the head is attached
    model, loader = accelerator.prepare(model, loader)
    accelerator.unwrap_model(model).out = nn.Linear(16, CLASSES)
    opt = accelerator.prepare(torch.optim.AdamW(model.parameters(), lr=1e-2))
    return {"model": model, "optimizer": opt, "train_dataloader": loader, "accelerator": accelerator}


def make_training_head_before_prepare():
    """Correct twin: the head attached first, then everything prepared."""
    accelerator = Accelerator(cpu=True)
    model, _, loader = _parts()
    model.out = nn.Identity()
    model.out = nn.Linear(16, CLASSES)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
    model, opt, loader = accelerator.prepare(model, opt, loader)
    return {"model": model, "optimizer": opt, "train_dataloader": loader, "accelerator": accelerator}


def make_training_local_sgd():
    """accelerate's by_feature/local_sgd.py: the prepared objects and a LocalSGD entered over the training (it
    leaves the gradients unaveraged and averages the weights every local_sgd_steps steps)."""
    from accelerate.local_sgd import LocalSGD

    state = make_training()
    local = LocalSGD(accelerator=state["accelerator"], model=state["model"], local_sgd_steps=8, enabled=True)
    state["local_sgd"] = local.__enter__()
    return state


def step_local_sgd(state, batch):
    accelerator, model, opt = state["accelerator"], state["model"], state["optimizer"]
    model.train()
    loss = loss_of(model, batch)
    accelerator.backward(loss)
    opt.step()
    opt.zero_grad()
    state["local_sgd"].step()
    return loss.detach()


def plain_loader():
    return DataLoader(data(), batch_size=BATCH, shuffle=True)


def loss_of(model, batch):
    x, y = batch
    return F.cross_entropy(model(x), y)


def step(state, batch):
    """Correct: the loss through the prepared (DDP-wrapped) model, accelerator.backward."""
    accelerator, model, opt = state["accelerator"], state["model"], state["optimizer"]
    model.train()
    with accelerator.accumulate(model):
        loss = loss_of(model, batch)
        accelerator.backward(loss)
        opt.step()
        opt.zero_grad()
    return loss.detach()


def step_unwrapped(state, batch):
    """Buggy: the forward runs on accelerator.unwrap_model(model), so DDP never all-reduces the gradients."""
    accelerator, model, opt = state["accelerator"], state["model"], state["optimizer"]
    model.train()
    with accelerator.accumulate(model):
        loss = loss_of(accelerator.unwrap_model(model), batch)
        accelerator.backward(loss)
        opt.step()
        opt.zero_grad()
    return loss.detach()


def project(make: str = "make_training", train_step: str = "step", dataloader: bool = False) -> str:
    """A user's conftest.py: the Accelerate factory and step named by the functions of this module (and
    dlcheck_dataloader, the plain loader, when ``dataloader``)."""
    loader = ["@pytest.fixture(scope='session')", "def dlcheck_dataloader():", "    return ta.plain_loader()", ""]
    return "\n".join(
        [
            "import pytest",
            "import tiny_accelerate as ta",
            "",
            "@pytest.fixture(scope='session')",
            "def dlcheck_make_training():",
            f"    return ta.{make}",
            "",
            "@pytest.fixture(scope='session')",
            "def dlcheck_train_step():",
            f"    return ta.{train_step}",
            "",
            "@pytest.fixture(scope='session')",
            "def dlcheck_compute_loss():",
            "    return ta.loss_of",
            "",
            *(loader if dataloader else []),
        ]
    )
