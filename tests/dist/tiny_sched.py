"""A tiny real Accelerate user with an LR schedule, for D8: ``Accelerator(cpu=True)``, the model, optimizer, a shuffled
DataLoader and transformers' ``get_cosine_schedule_with_warmup`` passed to ``accelerator.prepare`` (which wraps the
scheduler in an ``AcceleratedScheduler``: ``num_processes`` scheduler steps per optimizer step). Buggy: the schedule
sized in a rank's optimizer steps (``len(prepared loader) * epochs``); correct: times ``accelerator.num_processes``, as
Accelerate's examples size it; correct too: an unprepared scheduler sized in a rank's optimizer steps."""

from __future__ import annotations

import tiny_accelerate as ta
import torch
from accelerate import Accelerator
from transformers import get_cosine_schedule_with_warmup

EPOCHS, WARMUP = 3, 2


def _prepared():
    accelerator = Accelerator(cpu=True)
    model, opt, loader = accelerator.prepare(*ta._parts())
    return accelerator, model, opt, loader


def make_training_sized_per_rank():
    """Buggy: sized in a rank's optimizer steps, then prepared (stepped num_processes times per optimizer step)."""
    accelerator, model, opt, loader = _prepared()
    sched = get_cosine_schedule_with_warmup(opt, WARMUP, len(loader) * EPOCHS)
    sched = accelerator.prepare(sched)
    return {
        "model": model,
        "optimizer": opt,
        "train_dataloader": loader,
        "lr_scheduler": sched,
        "accelerator": accelerator,
    }


def make_training_sized_times_processes():
    """Correct: sized as Accelerate's examples do (warmup and length times num_processes), then prepared."""
    accelerator, model, opt, loader = _prepared()
    n = accelerator.num_processes
    sched = get_cosine_schedule_with_warmup(opt, WARMUP * n, len(loader) * EPOCHS * n)
    sched = accelerator.prepare(sched)
    return {
        "model": model,
        "optimizer": opt,
        "train_dataloader": loader,
        "lr_scheduler": sched,
        "accelerator": accelerator,
    }


def make_training_unprepared_scheduler():
    """Correct: sized in a rank's optimizer steps and left out of prepare (stepped once per optimizer step)."""
    accelerator, model, opt, loader = _prepared()
    sched = get_cosine_schedule_with_warmup(opt, WARMUP, len(loader) * EPOCHS)
    return {
        "model": model,
        "optimizer": opt,
        "train_dataloader": loader,
        "lr_scheduler": sched,
        "accelerator": accelerator,
    }


def make_training_unprepared_sized_twice():
    """Buggy the other way: sized from the DataLoader before prepare (all the examples) and times num_processes, as
    for a prepared scheduler, but left out of prepare: stepped once per optimizer step, it has not decayed when the
    run ends."""
    accelerator = Accelerator(cpu=True)
    model, opt, loader = ta._parts()
    n = accelerator.num_processes
    sched = get_cosine_schedule_with_warmup(opt, WARMUP * n, len(loader) * EPOCHS * n)
    model, opt, loader = accelerator.prepare(model, opt, loader)
    return {
        "model": model,
        "optimizer": opt,
        "train_dataloader": loader,
        "lr_scheduler": sched,
        "accelerator": accelerator,
    }


def make_training_constant():
    """A constant LR (transformers' get_constant_schedule), prepared: nothing for the processes to shift."""
    from transformers import get_constant_schedule

    accelerator, model, opt, loader = _prepared()
    sched = accelerator.prepare(get_constant_schedule(opt))
    return {
        "model": model,
        "optimizer": opt,
        "train_dataloader": loader,
        "lr_scheduler": sched,
        "accelerator": accelerator,
    }


def make_training_accumulating():
    """Gradient accumulation over 2 micro-batches, the scheduler unprepared (stepped by step_every_micro_batch)."""
    accelerator = Accelerator(cpu=True, gradient_accumulation_steps=2)
    model, opt, loader = accelerator.prepare(*ta._parts())
    sched = get_cosine_schedule_with_warmup(opt, WARMUP, len(loader) * EPOCHS // 2)
    return {
        "model": model,
        "optimizer": opt,
        "train_dataloader": loader,
        "lr_scheduler": sched,
        "accelerator": accelerator,
    }


def _accumulating(k: int, sized_per_rank: bool | None):
    """Gradient accumulation over ``k`` micro-batches (more than the launch's 3 micro-steps), the scheduler prepared:
    constant (``sized_per_rank`` None), or a cosine sized in a rank's optimizer steps (buggy on N processes)."""
    from torch.utils.data import ConcatDataset, DataLoader
    from transformers import get_constant_schedule

    accelerator = Accelerator(cpu=True, gradient_accumulation_steps=k)
    model, opt, _ = ta._parts()
    # 4 copies of the data: 21 batches per rank, more than the launch trains (a rank's epoch end also syncs)
    loader = DataLoader(ConcatDataset([ta.data()] * 4), batch_size=ta.BATCH, shuffle=True)
    model, opt, loader = accelerator.prepare(model, opt, loader)
    if sized_per_rank is None:
        sched = get_constant_schedule(opt)
    else:
        sched = get_cosine_schedule_with_warmup(opt, 0, -(-len(loader) // k) * EPOCHS)
    return {
        "model": model,
        "optimizer": opt,
        "train_dataloader": loader,
        "lr_scheduler": accelerator.prepare(sched),
        "accelerator": accelerator,
    }


def make_training_accumulating_4():
    """Correct: 4 micro-batches per optimizer step, a constant schedule."""
    return _accumulating(4, None)


def make_training_accumulating_4_sized_per_rank():
    """Buggy: 4 micro-batches per optimizer step, a cosine sized in a rank's optimizer steps, then prepared."""
    return _accumulating(4, True)


def make_training_accumulating_32():
    """32 micro-batches per optimizer step: past the most micro-steps the launch trains to reach one."""
    return _accumulating(32, None)


def step_every_micro_batch(state, batch):
    """Buggy (T6's): the unprepared scheduler stepped on every micro-batch while the optimizer steps every second."""
    accelerator, model, opt, sched = state["accelerator"], state["model"], state["optimizer"], state["lr_scheduler"]
    model.train()
    with accelerator.accumulate(model):
        loss = ta.loss_of(model, batch)
        accelerator.backward(loss)
        opt.step()
        opt.zero_grad()
    sched.step()
    return loss.detach()


def _accumulated_step(state, batch, when_synced: bool):
    accelerator, model, opt, sched = state["accelerator"], state["model"], state["optimizer"], state["lr_scheduler"]
    model.train()
    with accelerator.accumulate(model):
        loss = ta.loss_of(model, batch)
        accelerator.backward(loss)
        opt.step()
        if accelerator.sync_gradients or not when_synced:
            sched.step()
        opt.zero_grad()
    return loss.detach()


def step_when_synced(state, batch):
    """Accumulation done right with an unprepared scheduler: stepped only when the optimizer really steps."""
    return _accumulated_step(state, batch, when_synced=True)


def step(state, batch):
    """The Accelerate step of its examples: the scheduler stepped right after the optimizer."""
    return _accumulated_step(state, batch, when_synced=False)


def project(make: str, train_step: str = "step") -> str:
    return "\n".join(
        [
            "import pytest",
            "import tiny_sched as ts",
            "import tiny_accelerate as ta",
            "",
            "@pytest.fixture(scope='session')",
            "def dlcheck_make_training():",
            f"    return ts.{make}",
            "",
            "@pytest.fixture(scope='session')",
            "def dlcheck_train_step():",
            f"    return ts.{train_step}",
            "",
            "@pytest.fixture(scope='session')",
            "def dlcheck_compute_loss():",
            "    return ta.loss_of",
            "",
        ]
    )


torch.set_num_threads(1)
