"""Running a user's training for the train, ckpt and smoke checks (and the llm checks that need a step).

The package, from the bottom up:

- :mod:`.runs` — the shared machinery: recognising the user's objects, fresh copies and snapshots, RNG
  states, batches and model calls, what a run records (:class:`~.runs.Trajectory`);
- :mod:`.resume` — resume runs and saves: the uninterrupted baseline, the resumed run, the state dicts
  a checkpoint holds, a save interrupted half way;
- one module per kind of user, each a setup class with the same small interface (``kind``,
  ``sources``, ``describe``, ``fresh``, ``smoke``, ``resume``, ``saved_state``, ``interrupted_save``):
  :mod:`.trainer` (transformers / TRL ``Trainer``), :mod:`.lightning`, :mod:`.loop` (a plain loop);
- :mod:`.setup` — which kind a check is given, sampled batches, probes and the shared smoke run.

The user's own objects are never trained: every run works on fresh objects, and every file is written
under pytest's tmp paths. This module re-exports what the checks use."""

from .resume import strip_wrapper_prefix, unwrapped_keys
from .runs import (
    SEED,
    ModuleSnapshot,
    SetupError,
    base_lr,
    batch_len,
    device_of,
    draw_batches,
    fresh_modules,
    is_lightning_module,
    is_preference,
    is_reward_trainer,
    output_tensor,
    own_dataloader,
    preference_loss,
    seed_all,
    targets_of,
    to_device,
    with_field,
)
from .setup import (
    as_soft_targets,
    decode_example,
    describe_batch,
    eval_batches,
    eval_loss,
    explains_failures,
    find_setup,
    fresh_probe,
    get_setup,
    loss_modes,
    losses_in_train_mode,
    mean_loss,
    memo_or_skip,
    modes,
    pipeline_call,
    probe,
    run_or_skip,
    show_losses,
    smoke_baseline,
    smoke_run,
    soft_targets,
    training_batches,
)

__all__ = [
    "SEED",
    "ModuleSnapshot",
    "SetupError",
    "as_soft_targets",
    "base_lr",
    "batch_len",
    "decode_example",
    "describe_batch",
    "device_of",
    "draw_batches",
    "eval_batches",
    "eval_loss",
    "explains_failures",
    "find_setup",
    "fresh_modules",
    "fresh_probe",
    "get_setup",
    "is_lightning_module",
    "is_preference",
    "is_reward_trainer",
    "loss_modes",
    "losses_in_train_mode",
    "preference_loss",
    "mean_loss",
    "memo_or_skip",
    "modes",
    "output_tensor",
    "own_dataloader",
    "pipeline_call",
    "probe",
    "run_or_skip",
    "seed_all",
    "show_losses",
    "smoke_baseline",
    "smoke_run",
    "soft_targets",
    "strip_wrapper_prefix",
    "targets_of",
    "to_device",
    "with_field",
    "training_batches",
    "unwrapped_keys",
]
