"""Domain-free checks of any training loop (train), shared by the ckpt and smoke domains.

Besides the core roles (``dlcheck_trainer``, ``dlcheck_model``, ``dlcheck_dataloader``, …) a user hands
over their training in one of three ways; the training roles are declared here:

- transformers / TRL: ``dlcheck_trainer`` alone;
- Lightning: ``dlcheck_lightning_module`` and ``dlcheck_datamodule`` (or ``dlcheck_dataloader``; or nothing
  more when the module defines its own ``train_dataloader()``, trained as ``fit(module)``), and the
  Trainer's callbacks (``dlcheck_lightning_callbacks``, or your ``lightning.Trainer`` as ``dlcheck_trainer``);
- a plain loop: ``dlcheck_make_training`` and the data (``dlcheck_dataloader``, or ``dlcheck_collator`` +
  ``dlcheck_dataset``), optionally ``dlcheck_train_step`` and ``dlcheck_compute_loss``; the ckpt domain
  adds ``dlcheck_save_checkpoint`` / ``dlcheck_load_checkpoint``."""

from __future__ import annotations

import copy
from collections.abc import Callable
from typing import Any

import pytest

from ...errors import MISSING, RoleError
from ...registry import applicability
from ...roles import an_object, deriver, role
from ..shared.training_users import rl_agent_only

role(
    "lightning_module",
    "your LightningModule (training_step, configure_optimizers); checks train deep copies of it",
    "dlcheck_model when it is a LightningModule",
)
role("datamodule", "your LightningDataModule; checks call setup('fit') and train_dataloader() on a copy of it")
role(
    "lightning_callbacks",
    "callable () -> a fresh list of your Lightning Trainer's callbacks (BackboneFinetuning, an EMA callback, your "
    "own): every Lightning run of the checks includes them; called once per run (callbacks hold state)",
    "dlcheck_trainer when it is your lightning Trainer (its callbacks, deep-copied for every run)",
    expect=an_object("a callable returning your Lightning callbacks (or a list of them)"),
)
role(
    "make_training",
    "callable () -> dict of fresh training objects: {'model', 'optimizer'} and optionally "
    "'lr_scheduler', 'scaler' (GradScaler), 'ema', …; called for every fresh run, under a fixed seed",
)
role(
    "train_step",
    "callable (state, batch[, index]) -> loss: one micro-step of your loop on the dict from "
    "dlcheck_make_training (backward, and the optimizer/scheduler steps when due); index counts micro-steps "
    "from 0; default: loss.backward(), optimizer.step(), lr_scheduler.step(), zero_grad()",
)
role(
    "num_epochs",
    "how many epochs your plain or Accelerate loop trains (an int, e.g. args.epochs): the plan a Trainer's "
    "num_train_epochs or a Lightning Trainer's max_epochs gives; T7 judges a loader that does not shuffle with it",
    expect=lambda v: (
        None
        if isinstance(v, (int, float)) and not isinstance(v, bool) and v > 0
        else f"is {v!r}, expected a positive number: the epochs your loop trains"
    ),
)
role(
    "compute_loss",
    "callable (model, batch) -> scalar loss tensor, the forward half of your step; default: "
    "model(**batch).loss for mapping batches, dlcheck_loss_fn(model(inputs), targets) for (inputs, targets)",
)

Get = Callable[[str], Any]
Cache = Callable[[Any, str, Callable[[], Any]], Any]


def get_role(get: Get, name: str) -> Any:
    # a core default fixture resolves roles by fixture lookup, and a domain role may have no fixture
    try:
        return get(name)
    except pytest.FixtureLookupError:
        return MISSING


def _prepared_datamodule(dm: Any) -> Any:
    """A copy of the user's datamodule, set up for fitting (the user's own stays as it was)."""
    prepared = copy.deepcopy(dm)
    prepared.prepare_data()
    prepared.setup("fit")
    return prepared


def _prepared_module(module: Any) -> Any:
    """A copy of the user's LightningModule, prepared as ``fit(module)`` prepares it before calling its own
    ``train_dataloader()`` (the user's own stays as it was)."""
    trainer_ref = getattr(module, "_trainer", None)
    prepared = copy.deepcopy(module, {id(trainer_ref): None} if trainer_ref is not None else {})
    prepared.prepare_data()
    if getattr(prepared, "_trainer", None) is None:
        # fit() calls setup() with a Trainer attached, and a module's setup may read it (self.trainer.strategy,
        # its world size: Lightning's imagenet template): a bare one of the module's own library, on the CPU
        prepared.trainer = _bare_trainer(prepared)
    prepared.setup("fit")
    return prepared


def _bare_trainer(module: Any) -> Any:
    """A Trainer of the module's Lightning package that logs, saves and prints nothing: what ``setup('fit')`` may
    read of the Trainer fit() attaches (its strategy, world size, ranks)."""
    import importlib

    package = next(
        (
            name
            for c in type(module).__mro__
            for name in ("lightning.pytorch", "pytorch_lightning")
            if c.__module__.startswith(name)
        ),
        "lightning.pytorch",
    )
    trainer_cls = importlib.import_module(package).Trainer
    return trainer_cls(
        accelerator="cpu",
        devices=1,
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
    )


@deriver
def from_lightning(name: str, get: Get, cache: Cache) -> Any:
    from ...training import is_lightning_module

    if name == "lightning_module":
        model = get_role(get, "model")
        return model if model is not MISSING and is_lightning_module(model) else MISSING
    if name == "model":
        module = get_role(get, "lightning_module")
        return module if module is not MISSING else MISSING
    if name in ("dataloader", "eval_dataloader"):
        dm = get_role(get, "datamodule")
        if dm is MISSING:
            return _own_dataloader(name, get, cache)
        prepared = cache(dm, "lightning:prepared", lambda: _prepared_datamodule(dm))
        method = "train_dataloader" if name == "dataloader" else "val_dataloader"
        try:
            return cache(dm, f"lightning:{method}", getattr(prepared, method))
        except Exception:  # noqa: BLE001 - a datamodule without val_dataloader raises MisconfigurationException
            if name == "dataloader":
                raise
            return MISSING
    return MISSING


def _own_dataloader(name: str, get: Get, cache: Cache) -> Any:
    """No datamodule: the loader of a LightningModule that defines its own ``train_dataloader()`` (and
    ``val_dataloader()``), called on a prepared copy of it, as ``fit(module)`` trains it."""
    from ...training import own_dataloader

    if get_role(get, "make_training") is not MISSING:
        # a plain loop's factory: its model is not a Lightning user's module, and asking for it here would call the
        # factory in this process (a torchrun factory building a DistributedSampler raises without a process group)
        return MISSING
    try:
        module = get_role(get, "lightning_module")
    except RoleError:
        return MISSING  # a dlcheck_model that is no module at all: the checks that need it say so, not the data
    if module is MISSING or not own_dataloader(module):
        return MISSING
    method = "train_dataloader" if name == "dataloader" else "val_dataloader"
    if not own_dataloader(module, method):
        return MISSING
    prepared = cache(module, "lightning:prepared-module", lambda: _prepared_module(module))
    return cache(module, f"lightning:module-{method}", getattr(prepared, method))


@deriver
def from_make_training(name: str, get: Get, cache: Cache) -> Any:
    if name not in ("model", "optimizer", "lr_scheduler"):
        return MISSING
    make = get_role(get, "make_training")
    if make is MISSING:
        return MISSING
    from ...guard import preserved_rng
    from ...training import SEED, seed_all

    def build() -> Any:
        with preserved_rng():
            seed_all(SEED)
            return make()

    state = cache(make, "make_training:state", build)
    value = state.get(name) if isinstance(state, dict) else None
    return value if value is not None else MISSING


@applicability("train")
def concerns_train(ctx) -> str | None:
    """Not applicable to a reinforcement-learning agent with no supervised training, decided from its objects
    (``checks.shared.training_users.rl_agent_only``); otherwise a missing role stays one."""
    return rl_agent_only(ctx, "train")
