"""Accelerate users whose DataLoader is or is not passed to ``accelerator.prepare``, for D3 in the dist launch (the
launch trains on the user's own loader, never on a stand-in it prepared itself): the model and optimizer prepared
in every twin (DDP keeps the replicas in step), the loader

- prepared with them and returned in the factory's dict (correct: Accelerate deals each rank its own batches);
- built and returned in the dict, but left out of ``prepare`` (buggy: each rank iterates the whole dataset);
- left out of the factory altogether, the script iterating its plain ``dlcheck_dataloader`` (buggy: the same).

Imported by the throwaway user projects (and, in their rank processes, through the fork)."""

from __future__ import annotations

import tiny_accelerate as ta
from accelerate import Accelerator


def make_training_prepared():
    """Correct: the DataLoader goes through accelerator.prepare with the model and the optimizer."""
    accelerator = Accelerator(cpu=True)
    model, opt, loader = accelerator.prepare(*ta._parts())
    return {"model": model, "optimizer": opt, "train_dataloader": loader, "accelerator": accelerator}


def make_training_loader_unprepared():
    """Buggy: the model and the optimizer are prepared, the DataLoader built next to them is not."""
    accelerator = Accelerator(cpu=True)
    model, opt, loader = ta._parts()
    model, opt = accelerator.prepare(model, opt)
    return {"model": model, "optimizer": opt, "train_dataloader": loader, "accelerator": accelerator}


def make_training_no_loader():
    """Buggy with dlcheck_dataloader: the factory prepares the model and the optimizer only; the script iterates the
    plain loader."""
    accelerator = Accelerator(cpu=True)
    model, opt, _ = ta._parts()
    model, opt = accelerator.prepare(model, opt)
    return {"model": model, "optimizer": opt, "accelerator": accelerator}


def project(make: str, dataloader: bool = False) -> str:
    """A user's conftest.py: the factory named, the Accelerate step and loss of tiny_accelerate (and
    dlcheck_dataloader, the plain loader, when ``dataloader``)."""
    loader = ["@pytest.fixture(scope='session')", "def dlcheck_dataloader():", "    return ta.plain_loader()", ""]
    return "\n".join(
        [
            "import pytest",
            "import tiny_accelerate as ta",
            "import tiny_own_loader as tol",
            "",
            "@pytest.fixture(scope='session')",
            "def dlcheck_make_training():",
            f"    return tol.{make}",
            "",
            "@pytest.fixture(scope='session')",
            "def dlcheck_train_step():",
            "    return ta.step",
            "",
            "@pytest.fixture(scope='session')",
            "def dlcheck_compute_loss():",
            "    return ta.loss_of",
            "",
            *(loader if dataloader else []),
        ]
    )
