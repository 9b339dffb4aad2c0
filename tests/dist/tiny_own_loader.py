"""Accelerate users whose DataLoader is or is not passed to ``accelerator.prepare``, for D3 in the dist launch (the
launch trains on the user's own loader, never on a stand-in it prepared itself): the model and optimizer prepared
in every twin (DDP keeps the replicas in step), the loader

- prepared with them and returned in the factory's dict (correct: Accelerate deals each rank its own batches);
- built and returned in the dict, but left out of ``prepare`` (buggy: each rank iterates the whole dataset);
- left out of the factory altogether: the script may prepare it outside the factory, so the ranks' iteration of
  the plain ``dlcheck_dataloader`` is not judged;
- next to a prepared evaluation loader (prepared first, its key a word eval): the training loader is the one
  keyed for training (or prepared and unkeyed), never the evaluation one; a training loader left out of
  ``prepare`` beside a prepared evaluation loader is still what trains (buggy).

Imported by the throwaway user projects (and, in their rank processes, through the fork)."""

from __future__ import annotations

import tiny_accelerate as ta
from accelerate import Accelerator
from torch.utils.data import DataLoader, Subset

#: the evaluation set: 10 of the examples, in order (the training set has ta.N)
EVAL_N = 10


def _eval_loader():
    return DataLoader(Subset(ta.data(), range(EVAL_N)), batch_size=ta.BATCH)


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


def make_training_eval_prepared_first():
    """Correct: the evaluation loader is prepared first, then the training one, both in the dict, the training
    loader under a key that names neither (``loader``) after ``eval_dataloader``."""
    accelerator = Accelerator(cpu=True)
    eval_loader = accelerator.prepare(_eval_loader())
    model, opt, loader = accelerator.prepare(*ta._parts())
    return {
        "model": model,
        "optimizer": opt,
        "eval_dataloader": eval_loader,
        "loader": loader,
        "accelerator": accelerator,
    }


def make_training_only_eval_in_dict():
    """Correct: both loaders prepared (the evaluation one first), only the evaluation one returned in the dict."""
    accelerator = Accelerator(cpu=True)
    eval_loader = accelerator.prepare(_eval_loader())
    model, opt, _loader = accelerator.prepare(*ta._parts())
    return {"model": model, "optimizer": opt, "val_loader": eval_loader, "accelerator": accelerator}


def make_training_train_unprepared_beside_eval():
    """Buggy: the evaluation loader is prepared, the training loader in the dict is not."""
    accelerator = Accelerator(cpu=True)
    model, opt, loader = ta._parts()
    model, opt, eval_loader = accelerator.prepare(model, opt, _eval_loader())
    return {
        "model": model,
        "optimizer": opt,
        "eval_dataloader": eval_loader,
        "loader": loader,
        "accelerator": accelerator,
    }


def make_training_eval_only():
    """The factory prepares the model, the optimizer and an evaluation loader: the training loader is prepared
    elsewhere in the script (or not at all), which the launch cannot see."""
    accelerator = Accelerator(cpu=True)
    model, opt, _ = ta._parts()
    model, opt, eval_loader = accelerator.prepare(model, opt, _eval_loader())
    return {"model": model, "optimizer": opt, "eval_dataloader": eval_loader, "accelerator": accelerator}


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
