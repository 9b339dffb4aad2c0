"""ZeroRedundancyOptimizer users for D1 (tiny_dist's token model and data): each rank owns the optimizer state of its
partition. Correct: ZeRO on the DDP-wrapped model. Buggy: a learning rate scaled by the rank (rank 1's shard trains
twice as fast; the parameters stay identical on every rank because each owner broadcasts its shard), and ZeRO without
DDP (each shard updated from its owner's gradient alone)."""

from __future__ import annotations

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.optim import ZeroRedundancyOptimizer


def wrap_ddp_zero(state):
    model = nn.parallel.DistributedDataParallel(state["model"])
    opt = ZeroRedundancyOptimizer(model.parameters(), optimizer_class=torch.optim.AdamW, lr=1e-2)
    return {"model": model, "optimizer": opt}


def wrap_ddp_zero_lr_per_rank(state):
    model = nn.parallel.DistributedDataParallel(state["model"])
    opt = ZeroRedundancyOptimizer(
        model.parameters(), optimizer_class=torch.optim.AdamW, lr=1e-2 * (1 + dist.get_rank())
    )
    return {"model": model, "optimizer": opt}


def wrap_zero_without_ddp(state):
    model = state["model"]
    opt = ZeroRedundancyOptimizer(model.parameters(), optimizer_class=torch.optim.AdamW, lr=1e-2)
    return {"model": model, "optimizer": opt}


def step_resetting_moments_on_rank1(state, batch, index):
    """Buggy: tiny_dist's correct step, then rank 1 resets the first moments of the shard it owns (an optimizer-state
    reset after a loss spike, run on the rank that saw the spike only): every count and hyperparameter still agrees."""
    import tiny_dist as td

    loss = td.step_global_tokens(state, batch, index)
    if dist.get_rank() == 1:
        for st in state["optimizer"].optim.state.values():
            st["exp_avg"].zero_()
    return loss


def project(wrap: str, setup: str = "seed_per_rank", step: str = "step_global_tokens") -> str:
    """tiny_dist's clean script with the wrap (and the ZeroRedundancyOptimizer) of this module, and its step (or
    tiny_dist's)."""
    import tiny_dist as td

    src = td.project(setup=setup, wrap=None, save=None, load=None, step=step if hasattr(td, step) else None)
    return src + "\n".join(
        [
            "import tiny_zero as tz",
            "",
            "@pytest.fixture(scope='session')",
            "def dlcheck_dist_wrap():",
            f"    return tz.{wrap}",
            "",
            *(
                []
                if hasattr(td, step)
                else ["@pytest.fixture(scope='session')", "def dlcheck_train_step():", f"    return tz.{step}", ""]
            ),
        ]
    )
