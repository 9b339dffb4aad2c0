"""transformers / TRL Trainer users in the dist launch: in every rank a clone of the user's Trainer (the
TrainerSetup of pytest_dlcheck.training: same class, arguments, data, collator and callbacks, around a fresh copy of
the model) runs ``trainer.train()`` for the launch's few steps, as the script runs under ``torchrun``.

- ``TrainingArguments`` caches its device and Accelerate's ``PartialState`` (``_setup_devices``,
  ``distributed_state``, ``_n_gpu``) the first time they are read, which the user's Trainer did in the pytest
  process (one process, not distributed). :func:`forget_devices` drops that cache from the rank's copy of the
  arguments before the clone copies them, so the clone's Accelerator reads this rank's environment (RANK,
  WORLD_SIZE, the gloo group: ``MULTI_CPU`` on CPU) and ``train()`` wraps the model in DistributedDataParallel and
  shards the DataLoader itself.
- A ``TrainerCallback`` added last records what D1 needs: the parameters when training begins, the gradients the
  optimizer steps on first, and after every optimizer step (``on_step_end``, after the user's own callbacks) the
  digests of every parameter and optimizer-state tensor; and, when ``train()`` begins, what D4 needs: example 0
  fetched 16 times through the Trainer's own train DataLoader (its dataset, collator, ``dataloader_num_workers`` and
  the Trainer's ``seed_worker``) at the random state the Trainer left after ``set_seed(args.seed)``, then once
  more with this rank's global generators (random, NumPy, torch) reseeded with the rank: a draw that still
  comes out the same on every rank comes from a generator of the user's own, not from the streams the Trainer
  seeds (:func:`augmentation`). Such a generator is usually built in the pytest process with the user's Trainer (its
  dataset, its transform) and reached every forked rank in one state: whether the script seeds it alike in every
  process is not seen here (D4 says so; one built in the rank is judged: ``checks/dist/generators.py``)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

#: the attributes TrainingArguments fills the first time its device is read
DEVICE_CACHE = ("_setup_devices", "_n_gpu")


class RankTmp:
    """A ``tmp_path_factory`` stand-in for the rank: the clone's output directories under the launch's directory."""

    def __init__(self, root: Path):
        self.root = root
        self.n = 0

    def mktemp(self, name: str) -> Path:
        self.n += 1
        path = self.root / f"{name}{self.n}"
        path.mkdir(parents=True, exist_ok=True)
        return path


def forget_devices(args: Any) -> None:
    """Drop the device and distributed state ``args`` cached in the pytest process (this rank's copy only) and set
    them up again here, as a script's arguments are before its Trainer is built (the Trainer builds its
    Accelerator first, and a later first ``_setup_devices`` would reset the Accelerator's state under it)."""
    for name in DEVICE_CACHE:
        args.__dict__.pop(name, None)
    if "distributed_state" in args.__dict__:
        args.distributed_state = None
    args._setup_devices  # noqa: B018 - the cached property computed in this rank: PartialState of the 2 processes


def run(rank: Any) -> dict[str, Any]:
    """Train a clone of the user's Trainer ``rank.job.steps`` optimizer steps in this rank; D1's record."""
    import torch
    from transformers import TrainerCallback

    from ...training.runs import unwrap_prepared
    from ...training.trainer import _quiet
    from .launch import SMALL_MODEL, fsdp_kind

    setup = rank.setup
    forget_devices(setup.trainer.args)
    setup.tmp = RankTmp(rank.out / f"rank{rank.rank}-trainer")
    clone = rank.call("trainer", lambda: setup.clone("dist", max_steps=rank.job.steps, logging_steps=1))
    inner = clone.model
    small = sum(p.numel() for p in inner.parameters()) <= SMALL_MODEL
    rec: dict[str, Any] = {
        "rank": rank.rank,
        "trainer": setup.name,
        "accelerate": False,
        "small": small,
        "grads": None,
        "steps": [],
        "args_world": None,
    }
    names = {id(p): n for n, p in inner.named_parameters()}

    class Record(TrainerCallback):
        def on_train_begin(self, args, state, control, **kw):
            wrapped = clone.model_wrapped
            rec.update(
                wrapped=type(wrapped).__name__,
                ddp=isinstance(wrapped, torch.nn.parallel.DistributedDataParallel),
                fsdp=fsdp_kind(wrapped),
                args_world=args.world_size,
                init=rank.params(inner),
                init_tensors=rank.tensors(inner) if small else None,
            )
            rec.update(augmentation(rank, kw.get("train_dataloader"), args, inner))
            rank.progress("Trainer.train() began")

        def on_pre_optimizer_step(self, args, state, control, **kw):
            if rec["grads"] is None:
                rec["grads"] = {
                    names[id(p)]: p.grad.detach().cpu().clone()
                    for p in inner.parameters()
                    if p.grad is not None and id(p) in names
                }

        def on_step_end(self, args, state, control, **kw):
            opt = unwrap_prepared(clone.optimizer)
            rec["steps"].append(
                {
                    "loss": None,
                    "opt_steps": 1,
                    "params": rank.params(inner),
                    "opt": rank.optimizer_state(opt, inner),
                    "tensors": rank.tensors(inner) if small else None,
                }
            )
            rank.progress(f"step {state.global_step}")

    clone.add_callback(Record())
    with _quiet():
        rank.call("trainer", clone.train)
    return rec


def augmentation(rank: Any, loader: Any, args: Any, inner: Any) -> dict[str, Any]:
    """D4's part of the record, taken when ``train()`` begins, before the first batch is fetched: the Trainer's
    train DataLoader described, example 0 fetched through it (:meth:`Rank.augmentation`), then again with the
    rank's global generators reseeded per rank and with the generators of the user's own it reaches reseeded
    (:meth:`Rank.own_streams`), the global torch generator's digest and the Trainer's seeding arguments. The rank's
    generators are put back after every probe."""
    import torch

    from .launch import tensor_digest

    got: dict[str, Any] = {
        "rng_at_step0": tensor_digest(torch.get_rng_state()),
        "dropout": [
            f"{n} (p={m.p})"
            for n, m in inner.named_modules()
            if isinstance(m, torch.nn.modules.dropout._DropoutNd) and m.p > 0
        ],
        "trainer_seed": {
            "seed": getattr(args, "seed", None),
            "data_seed": getattr(args, "data_seed", None),
            "num_workers": getattr(args, "dataloader_num_workers", 0) or 0,
            "process_index": getattr(args, "process_index", None),
        },
    }
    if loader is None:
        got["augment"] = None
        return got
    got["loader"] = rank.describe_loader(loader) | {"built_by": "the Trainer's get_train_dataloader()"}
    got["augment"] = rank.augmentation(loader)
    rank.own_streams(loader, got["augment"])
    rank.before_user = None  # the objects alive before the rank, kept for the probe only
    return got
