"""Checks of checkpointing and resuming: the run continued from a checkpoint is the run that was saved.

A transformers / TRL Trainer is checked through its own ``checkpoint-*`` directories and
``resume_from_checkpoint``, a Lightning module through its ``.ckpt`` files and ``fit(ckpt_path=...)``;
a plain loop hands over its save and load functions (roles declared here)."""

from __future__ import annotations

from ...registry import applicability
from ...roles import a_callable, role
from ..shared.training_users import rl_agent_only

role(
    "save_checkpoint",
    "callable (state, path): your checkpoint save, given the dict from dlcheck_make_training and "
    "a path under pytest's tmp dir (a file or a directory, as you like); every save of a run gets the same path, "
    "as a script with one checkpoint path does: when your script writes a new one per save (step_{n}/, "
    "checkpoint-{n}/, epoch_{e}.pt), save under path the same way, named from a counter of the dict",
)
role(
    "load_checkpoint",
    "callable (state, path): your resume, loading that path into the fresh dict from dlcheck_make_training",
)
role(
    "resume_dataloader",
    "callable (state, dataloader, resumed_step): what your epoch loop does to the training loader after a resume "
    "— the iterable it trains on for the rest of the epoch, given the loaded dict, the loader it holds and the "
    "batches of the epoch trained before the save (accelerator.skip_first_batches(dataloader, resumed_step), "
    "itertools.islice(dataloader, resumed_step, None), or dataloader itself when the loop starts the epoch "
    "again): with it C1 and C10 judge the data position of a loop that skips outside its load",
    expect=a_callable("what your loop trains on after a resume"),
)


def _cadence(value) -> str | None:
    if value == "epoch" or (isinstance(value, int) and not isinstance(value, bool) and value > 0):
        return None
    return f"is {value!r}, expected 'epoch' or a positive int N (a checkpoint every N optimizer steps)"


role(
    "checkpoint_every",
    "where your plain or Accelerate loop saves: 'epoch' (only at epoch ends, resuming at the next epoch's start) or "
    "an int N (every N optimizer steps); C1, C3 and D5 then save there instead of half way through their run "
    "(an epoch's end: after len(training loader) micro-steps)",
    expect=_cadence,
)


@applicability("ckpt")
def concerns_ckpt(ctx) -> str | None:
    """Not applicable to a reinforcement-learning agent with no supervised training, decided from its objects
    (``checks.shared.training_users.rl_agent_only``); otherwise a missing role stays one."""
    return rl_agent_only(ctx, "ckpt")
