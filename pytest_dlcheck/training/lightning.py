"""Kind 2: a Lightning user (``dlcheck_lightning_module`` + ``dlcheck_datamodule``, or a module defining its own
``train_dataloader()``): runs are real ``lightning.Trainer.fit`` calls on deep copies of the module and the
datamodule (``fit(module)`` on a copy of the module alone when the module's loaders are the data)."""

from __future__ import annotations

import contextlib
import copy
import warnings
from collections.abc import Iterator, Mapping
from typing import Any

import torch

from ..errors import MISSING
from ..guard import preserved_dataloader, preserved_rng
from ..session import user_call
from .resume import (
    DRAW_SEED,
    Baseline,
    DataResume,
    InterruptedSave,
    ResumeLoadFailed,
    ResumeRun,
    SaveInterrupted,
    interrupted_saves,
    load_reports,
    put_back_rng,
    raised_loading,
    read_saved,
    seeded_examples,
)
from .runs import (
    SEED,
    Fresh,
    SetupError,
    Trajectory,
    as_float,
    batch_digest,
    device_of,
    digest,
    ema_counter,
    ema_describe,
    ema_kind,
    ema_state,
    example_digests,
    fresh_modules,
    grad_report,
    loss_tensor,
    nonfinite_params,
    own_batch,
    own_dataloader,
    release_training_memory,
    rng_state,
    scheduler_count,
    seed_all,
    to_device,
)

# --------------------------------------------------------------------------------------------------
# kind 2: Lightning

#: the resume piece of the LR schedulers a module keeps in its own attributes and steps by hand
HAND_SCHEDULER = "hand-stepped scheduler"
#: the truth's entry of the user's callbacks whose attributes changed before the save (each a piece of its own)
CALLBACKS = "callbacks"
#: the resume piece of the LightningModule's own attributes outside its state_dict that training changed (a replay
#: buffer and the agent filling it, an environment, counters): Lightning's .ckpt does not hold them
MODULE_ATTRS = "module attributes"

#: Lightning's callbacks that dlcheck's runs leave out (by class name, in the MRO of a Lightning callback):
#: what the Trainer adds by itself or writes into the user's folders (checkpoints, a progress bar, a
#: summary), what needs a logger or the validation loop dlcheck's runs do not have, a stop criterion, a
#: tuner that trains runs of its own
NOT_CARRIED = (
    "Checkpoint",
    "ProgressBar",
    "ModelSummary",
    "EarlyStopping",
    "LearningRateMonitor",
    "DeviceStatsMonitor",
    "ThroughputMonitor",
    "Timer",
    "BatchSizeFinder",
    "LearningRateFinder",
    "BasePredictionWriter",
)


def carried(callbacks: list[Any]) -> tuple[list[Any], list[str]]:
    """(the callbacks dlcheck's runs include, the class names of those left out): Lightning's own of
    :data:`NOT_CARRIED`, and pytest-dlcheck's watch (it reports into the user's run, not dlcheck's)."""
    kept, left = [], []
    for cb in callbacks:
        mro = type(cb).__mro__
        lightning_own = any(
            c.__name__ in NOT_CARRIED and c.__module__.startswith(("lightning.pytorch", "pytorch_lightning"))
            for c in mro
        )
        ours = any(c.__module__.startswith("pytest_dlcheck") for c in mro)
        shown = not any(c.__name__ in ("ProgressBar", "ModelSummary") for c in mro)  # what any Trainer adds
        if lightning_own or ours:
            left.extend([type(cb).__name__] if shown else [])
        else:
            kept.append(cb)
    return kept, left


def _is_callback(obj: Any) -> bool:
    return any(
        c.__name__ == "Callback" and c.__module__.startswith(("lightning.pytorch", "pytorch_lightning"))
        for c in type(obj).__mro__
    )


def trainer_callbacks(trainer: Any) -> list[Any]:
    """Deep copies of the callbacks of the user's Lightning Trainer (its own references to the Trainer and its
    module are not copied: they stay unset)."""
    import types

    memo: dict[int, Any] = {id(trainer): None}
    for cb in trainer.callbacks:  # the module's log / log_dict a fit attached: a run attaches its own
        memo.update({id(v): None for v in vars(cb).values() if isinstance(v, types.MethodType)})
    module = getattr(trainer, "_lightning_module", None) or getattr(
        getattr(trainer, "strategy", None), "_lightning_module", None
    )
    if module is not None:
        memo[id(module)] = None
    return copy.deepcopy(list(trainer.callbacks), memo)


def callback_labels(callbacks: list[Any]) -> list[str]:
    """A name per callback: its class name, numbered when two share it."""
    names = [type(cb).__name__ for cb in callbacks]
    return [f"{n}#{names[:i].count(n) + 1}" if names.count(n) > 1 else n for i, n in enumerate(names)]


def callback_state(cb: Any) -> dict[str, Any]:
    """Copies of a callback's attributes (not the Trainer or a LightningModule it keeps a reference to; an
    attribute that cannot be copied is left out)."""
    import types

    import lightning.pytorch as pl

    state = {}
    for name, value in vars(cb).items():
        # the run's own objects, and the module's log / log_dict Lightning attaches to every callback
        if isinstance(value, (pl.Trainer, pl.LightningModule, types.MethodType)):
            continue
        try:
            state[name] = copy.deepcopy(value)
        except Exception:  # noqa: BLE001 - a handle, a lock: nothing a resume could put back
            continue
    return state


def _same(a: Any, b: Any) -> bool:
    if isinstance(a, torch.nn.Module) and isinstance(b, torch.nn.Module):
        return _same(a.state_dict(), b.state_dict())
    if isinstance(a, torch.Tensor) or isinstance(b, torch.Tensor):
        return (
            isinstance(a, torch.Tensor)
            and isinstance(b, torch.Tensor)
            and a.shape == b.shape
            and torch.equal(a.detach().cpu(), b.detach().cpu())
        )
    if isinstance(a, Mapping) and isinstance(b, Mapping):
        return a.keys() == b.keys() and all(_same(a[k], b[k]) for k in a)
    if isinstance(a, (list, tuple)) and isinstance(b, (list, tuple)):
        return len(a) == len(b) and all(_same(x, y) for x, y in zip(a, b))
    try:
        return bool(a == b)
    except Exception:  # noqa: BLE001 - an object whose == does not give one bool
        return a is b


#: attributes of every LightningModule that are the framework's, never the user's training state
_FRAMEWORK_ATTRS = frozenset(
    {"training", "prepare_data_per_node", "allow_zero_length_dataloader_with_multiple_devices"}
)


class _HoldsModel(Exception):
    """An attribute reaches the model, an optimizer or a Lightning object: Lightning's own pieces, not the module's
    own state."""


def _fingerprint(obj: Any, seen: dict[int, int], depth: int = 0) -> Any:
    """A comparable summary of ``obj``'s content (tensors and arrays by their bytes, objects by their attributes),
    without copying it; raises :class:`_HoldsModel` where it reaches a torch module, a parameter, an optimizer, a
    scheduler or a Lightning object. Deeper than 12 levels, met again (a cycle), or past the first 200,000 objects
    of an attribute, an object is summarised by its type (what changes there is not seen)."""
    import hashlib
    import random
    import types

    if obj is None or isinstance(obj, (str, bytes, int, float, complex, bool)):
        return obj
    seen[-1] = seen.get(-1, 0) + 1  # the objects read so far (ids are never negative)
    if seen[-1] > 200_000:
        return ("unread", type(obj).__name__)
    if isinstance(obj, (torch.nn.Module, torch.nn.Parameter, torch.optim.Optimizer)) or hasattr(obj, "optimizer"):
        raise _HoldsModel
    if any(c.__module__.startswith(("lightning.", "pytorch_lightning.")) for c in type(obj).__mro__):
        raise _HoldsModel
    if isinstance(obj, torch.Tensor):
        data = obj.detach().cpu().contiguous()
        return (
            "tensor",
            tuple(data.shape),
            str(data.dtype),
            hashlib.blake2b(data.view(-1).view(torch.uint8).numpy()).hexdigest(),
        )
    if isinstance(obj, (types.FunctionType, types.MethodType, types.ModuleType, type)):
        return ("code", getattr(obj, "__qualname__", type(obj).__name__))
    if id(obj) in seen or depth > 12:
        return ("seen", type(obj).__name__)
    seen[id(obj)] = depth
    if isinstance(obj, random.Random):
        return ("random", obj.getstate())
    if type(obj).__module__ == "numpy":
        try:
            import numpy as np

            if isinstance(obj, np.ndarray):
                return (
                    "array",
                    obj.shape,
                    str(obj.dtype),
                    hashlib.blake2b(np.ascontiguousarray(obj).tobytes()).hexdigest(),
                )
            if isinstance(obj, np.generic):
                return ("scalar", obj.item())
        except ImportError:
            pass
    if type(obj).__name__ == "Generator" and hasattr(obj, "bit_generator"):  # numpy's Generator
        return ("generator", repr(obj.bit_generator.state))
    if isinstance(obj, Mapping):
        return ("map", type(obj).__name__, tuple((repr(k), _fingerprint(v, seen, depth + 1)) for k, v in obj.items()))
    if isinstance(obj, (list, tuple)) or type(obj).__name__ == "deque":
        return ("seq", type(obj).__name__, tuple(_fingerprint(v, seen, depth + 1) for v in obj))
    if isinstance(obj, (set, frozenset)):
        return ("set", tuple(sorted(repr(v) for v in obj)))
    attrs = getattr(obj, "__dict__", None)
    if isinstance(attrs, dict):
        return ("object", type(obj).__name__, _fingerprint(attrs, seen, depth + 1))
    return ("other", type(obj).__name__, repr(obj)[:200])


def module_fingerprints(module: Any) -> dict[str, Any]:
    """``{name: fingerprint}`` of the LightningModule's own public attributes outside its state_dict: not a
    submodule, a parameter or a buffer (Lightning saves those), not the framework's flags, and reaching neither the
    model nor an optimizer nor a Lightning object (the pieces Lightning knows); None where one cannot be read."""
    out = {}
    for name, value in vars(module).items():
        if name.startswith("_") or name in _FRAMEWORK_ATTRS:
            continue
        try:
            out[name] = _fingerprint(value, {})
        except _HoldsModel:
            continue
        except Exception:  # noqa: BLE001 - an attribute whose content cannot be read: not compared
            continue
    return out


def module_attributes_truth(module: Any, at_start: dict[str, Any]) -> dict[str, Any] | None:
    """``{"state", "changed"}`` of the module's own attributes that changed since the fit started (what a
    diagnostic resume puts back: copies, made together so that the references they share stay shared), or None
    when none changed or they cannot be copied."""
    now = module_fingerprints(module)
    changed = [n for n, f in now.items() if n not in at_start or at_start[n] != f]
    if not changed:
        return None
    try:
        state = copy.deepcopy({n: getattr(module, n) for n in changed})
    except Exception:  # noqa: BLE001 - a handle, a lock: nothing a resume could put back
        return None
    return {"state": state, "changed": changed}


def callbacks_truth(callbacks: list[Any], at_start: list[dict[str, Any]]) -> dict[str, Any]:
    """``{label: {"state", "changed", "saves"}}`` for each callback whose attributes changed since the fit
    started: its attributes now (what a diagnostic resume puts back), the names of those that changed, and
    whether it defines ``state_dict`` (Lightning saves a callback's state through nothing else)."""
    import lightning.pytorch as pl

    out = {}
    for label, cb, start in zip(callback_labels(callbacks), callbacks, at_start):
        now = callback_state(cb)
        changed = [n for n in now if n not in start or not _same(now[n], start[n])]
        if changed:
            saves = type(cb).state_dict is not pl.Callback.state_dict
            out[label] = {"state": now, "changed": changed, "saves": saves}
    return out


def callback_emas(callbacks: list[Any]) -> dict[str, Any]:
    """The EMAs the callbacks keep (an AveragedModel such as WeightAveraging's, a diffusers EMAModel, a module
    under a name like ``ema``), at the end of a run, as the loop kind records a state's."""
    out = {}
    for label, cb in zip(callback_labels(callbacks), callbacks):
        for name, value in vars(cb).items():
            if value is None or ema_kind(value, name) is None:
                continue
            out[f"callback {label}.{name}"] = {
                "what": ema_describe(f"self.{name} of your callback {label}", value),
                "tensors": ema_state(value),
                "counter": ema_counter(value),
            }
    return out


def given_loaders(train: Any, val: Any) -> Any:
    """A LightningDataModule over the loaders a user hands to ``fit(module, train_dataloaders=...,
    val_dataloaders=...)`` (dlcheck_dataloader, dlcheck_eval_dataloader), for a module without loaders of its own
    and no datamodule: every run fits on those very loaders, as the user's does (never copied: their cost would
    grow with the data; :meth:`LightningSetup._fit` puts back what a fit advances in them)."""
    import lightning.pytorch as pl

    class GivenLoaders(pl.LightningDataModule):
        given = True

        def __init__(self) -> None:
            super().__init__()
            self.loaders = [dl for dl in (train, val) if dl is not MISSING and dl is not None]

        def train_dataloader(self) -> Any:
            return train

        def __deepcopy__(self, memo: dict) -> Any:
            return self

    if val is not MISSING and val is not None:
        GivenLoaders.val_dataloader = lambda self: val  # type: ignore[attr-defined]
    return GivenLoaders()


class LightningSetup:
    kind = "lightning"

    def interrupted_save(self) -> InterruptedSave:
        """A checkpoint saved over an earlier one and interrupted half way (C2)."""
        return lightning_interrupted_save(self)

    def __init__(self, module: Any, datamodule: Any, l_trainer: Any, tmp: Any, callbacks: Any = MISSING):
        self.module = module
        self.datamodule = datamodule
        self.l_trainer = l_trainer
        self.tmp = tmp
        self.name = type(module).__name__
        #: no datamodule, and the module defines its own train_dataloader(): every run is ``fit(module)`` on a
        #: copy of the module, whose loaders are the data (Lightning's classic style)
        self.own_loaders = datamodule is MISSING and own_dataloader(module)
        #: no datamodule, no loader of the module's own: the loaders handed over (fit(module, loaders)) are the data
        self.given_loaders = getattr(datamodule, "given", False)
        #: the training loader in words, for the evidence
        self.train_loader = (
            "dlcheck_lightning_module's train_dataloader()"
            if self.own_loaders
            else "dlcheck_dataloader"
            if self.given_loaders
            else "your datamodule's train_dataloader()"
        )
        #: the user's callbacks: ``dlcheck_lightning_callbacks`` (a factory, or a list copied per run), else
        #: those of the Lightning Trainer given as ``dlcheck_trainer``; every run of a check includes them
        self.callbacks_role = "lightning_callbacks"
        if callbacks is MISSING and l_trainer not in (MISSING, None):
            trainer = l_trainer
            callbacks = lambda: trainer_callbacks(trainer)  # noqa: E731
            self.callbacks_role = "trainer"
        self.callbacks = callbacks
        #: the names of the user's callbacks dlcheck's runs leave out (Lightning's own, a logger's, a stop criterion)
        self.left_out: list[str] = []
        #: lets the session's spares go (the probe copy, the smoke run's trained module): get_setup sets it
        self.make_room: Any = lambda: None

    @property
    def sources(self) -> Any:
        return (self.module, self.datamodule) if self.datamodule is not MISSING else self.module

    def describe(self) -> str:
        return f"a copy of your LightningModule {self.name}"

    def _copies(self) -> tuple[Any, Any]:
        self.make_room()  # no copy kept for other checks lives beside the one this trains
        trainer_ref = getattr(self.module, "_trainer", None)
        memo = {id(trainer_ref): None} if trainer_ref is not None else {}
        module = fresh_modules([self.module], memo)[0]
        dm = (
            copy.deepcopy(self.datamodule, {id(trainer_ref): None} if trainer_ref is not None else {})
            if self.datamodule is not MISSING
            else None
        )
        return module, dm

    def user_callbacks(self) -> list[Any]:
        """Fresh copies of the user's callbacks for one run (callbacks hold state: an EMA, a counter, the
        param groups a finetuning schedule added), without those :func:`carried` leaves out."""
        source = self.callbacks
        if source is MISSING or source is None:
            return []
        if isinstance(source, (list, tuple)):
            made = copy.deepcopy(list(source))
        elif callable(source) and not _is_callback(source):  # a factory (or a callback class)
            made = user_call(self.callbacks_role, source)
            # copied even so: a factory handing out the same objects (a module-level list) must not have them
            # trained, nor carry one run's state into the next
            made = copy.deepcopy(list(made) if isinstance(made, (list, tuple)) else [made] if made is not None else [])
        else:  # one callback
            made = [copy.deepcopy(source)]
        kept, self.left_out = carried(made)
        return kept

    def fresh(self) -> Fresh:
        module, _ = self._copies()
        configured(module)

        def loss(batch: Any) -> torch.Tensor:
            return step_loss(module, batch)

        def make_optimizer() -> tuple[Any, Any]:
            opt, sched, _ = lightning_optimizers(module)
            return opt, sched

        return Fresh(module, loss, make_optimizer, owner=module)

    def _fit(
        self,
        module: Any,
        dm: Any,
        callbacks: list[Any],
        ckpt_path: str | None = None,
        user: list[Any] | None = None,
        **kwargs: Any,
    ) -> Any:
        """``fit`` of a fresh Trainer with dlcheck's own callbacks (recorders, its ModelCheckpoint) and the
        user's (``user``, else fresh ones), with the user's Trainer's training settings."""
        import lightning.pytorch as pl

        callbacks = list(callbacks) + (self.user_callbacks() if user is None else list(user))
        settings = dict(
            accelerator="cpu" if device_of(module).type == "cpu" else "auto",
            devices=1,
            logger=False,
            enable_progress_bar=False,
            enable_model_summary=False,
            num_sanity_val_steps=0,
            limit_val_batches=0,
            enable_checkpointing=any(type(c).__name__ == "ModelCheckpoint" for c in callbacks),
            default_root_dir=str(self.tmp.mktemp("dlcheck-lightning")),
        )
        if self.l_trainer not in (MISSING, None):
            t = self.l_trainer
            settings.update(
                accumulate_grad_batches=t.accumulate_grad_batches,
                gradient_clip_val=t.gradient_clip_val,
                gradient_clip_algorithm=t.gradient_clip_algorithm,
                precision=t.precision,
            )
        settings.update(kwargs)
        trainer = pl.Trainer(callbacks=callbacks, **settings)
        with _lightning_quiet(), contextlib.ExitStack() as kept:
            for loader in getattr(dm, "loaders", []) if getattr(dm, "given", False) else []:
                kept.enter_context(preserved_dataloader(loader))  # the user's own loaders: their state put back
            if dm is not None:
                trainer.fit(module, datamodule=dm, ckpt_path=ckpt_path)
            elif self.own_loaders:  # the module's own train_dataloader() (and val_dataloader()), as fit(module)
                trainer.fit(module, ckpt_path=ckpt_path)
            else:
                raise SetupError(
                    "no datamodule: define fixture dlcheck_datamodule (or a train_dataloader() in your LightningModule)"
                )
        return trainer

    def _recorder(
        self,
        traj: Trajectory,
        digests: bool = False,
        truth_at_epoch_end: dict | None = None,
        user: list[Any] | None = None,
    ):
        import lightning.pytorch as pl

        class Record(pl.Callback):
            def __init__(self) -> None:
                self.params: list = []

            def on_before_optimizer_step(self, trainer, pl_module, optimizer):
                # read at every step: a finetuning callback (BackboneFinetuning) unfreezes parameters mid-run
                self.params = [(n, p) for n, p in pl_module.named_parameters() if p.requires_grad]
                rec = traj.record(_batch_number(trainer, trainer.global_step + 1))
                rec.grad_norm, rec.nonfinite_grads = grad_report(self.params)
                rec.lr = float(optimizer.param_groups[0]["lr"])
                traj.calls.append("opt")

            def _count_schedulers(self, trainer, pl_module):
                """Scheduler steps since the last look ("sched" in traj.calls): Lightning's own and those the
                user steps by hand (the configured ones through lr_schedulers(), or held in attributes),
                counted by their step counters from batch start to batch start."""
                scheds = [c.scheduler for c in trainer.lr_scheduler_configs]
                scheds += list(hand_schedulers(trainer, pl_module).values())
                for sched in scheds:
                    now = scheduler_count(sched)
                    if now is None:
                        continue
                    before = self.sched_counts.setdefault(id(sched), now)
                    traj.calls.extend(["sched"] * max(0, now - before))
                    self.sched_counts[id(sched)] = now
                    traj.notes.setdefault("scheduler", sched)

            def on_train_batch_start(self, trainer, pl_module, batch, batch_idx):
                self._count_schedulers(trainer, pl_module)

            def on_train_end(self, trainer, pl_module):
                self._count_schedulers(trainer, pl_module)

            def on_train_start(self, trainer, pl_module):
                self.sched_counts: dict[int, int] = {}
                # the user's callbacks as the fit set them up (their on_fit_start, setup): what changes in
                # them from here to the save is state a resume must restore
                self.cb_start = [callback_state(cb) for cb in user or []] if truth_at_epoch_end is not None else []
                self.attrs_start = module_fingerprints(pl_module) if truth_at_epoch_end is not None else {}
                self.manual: list[torch.Tensor] = []
                if not pl_module.automatic_optimization:  # the loss goes to manual_backward, not out
                    backward = pl_module.manual_backward

                    def manual_backward(loss, *args, **kwargs):
                        self.manual.append(loss.detach())
                        return backward(loss, *args, **kwargs)

                    pl_module.manual_backward = manual_backward

            def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
                rec = traj.record(_batch_number(trainer, trainer.global_step))
                rec.batch = batch_digest(batch)
                loss = outputs.get("loss") if isinstance(outputs, Mapping) else outputs
                if loss is None and getattr(self, "manual", None):
                    loss = sum(self.manual) / len(self.manual)
                    self.manual.clear()
                rec.loss = as_float(loss)
                bad = nonfinite_params(self.params)
                if bad:
                    rec.nonfinite_params = bad
                if digests:
                    traj.digests.append((_batch_number(trainer, trainer.global_step), digest(pl_module)))

            def on_train_epoch_end(self, trainer, pl_module):
                if truth_at_epoch_end is not None and trainer.current_epoch == 0:
                    truth_at_epoch_end.update(_lightning_truth(trainer, pl_module))
                    held = callbacks_truth(user or [], self.cb_start)
                    if held:
                        truth_at_epoch_end[CALLBACKS] = held
                    own = module_attributes_truth(pl_module, self.attrs_start)
                    if own:
                        truth_at_epoch_end[MODULE_ATTRS] = own

        return Record()

    def smoke(
        self, steps: int, save_from: int | None = None, max_micro: int | None = None
    ) -> tuple[Trajectory, Fresh, None]:
        """The shared smoke run of ``steps`` optimizer steps (``max_steps``; fewer when that many under
        ``accumulate_grad_batches`` would take more than ``max_micro`` batches); never C1's baseline:
        Lightning resumes at an epoch boundary, C1 runs its own two epochs."""
        accum = self.l_trainer.accumulate_grad_batches if self.l_trainer not in (MISSING, None) else 1
        accum = accum if isinstance(accum, int) and accum > 1 else 1
        if max_micro:
            steps = min(steps, max(1, max_micro // accum))
        module, dm = self._copies()
        traj = Trajectory()
        trainer = self._fit(module, dm, [self._recorder(traj)], max_steps=steps)
        traj.notes["opt_steps"] = trainer.global_step
        traj.notes["micro_steps"] = len(traj.steps)
        traj.notes["optimizer"] = trainer.optimizers[0] if trainer.optimizers else None
        if trainer.lr_scheduler_configs:  # else the first scheduler stepped by hand the recorder saw, if any
            traj.notes["scheduler"] = trainer.lr_scheduler_configs[0].scheduler
        traj.notes.setdefault("scheduler", None)
        traj.notes["manual_optimization"] = not module.automatic_optimization
        module._trainer = None  # detached: its training_step (and self.log) is called again on its own
        # its readers want the trajectory, the trained weights and the optimizers' settings, not the gradients
        # and moments (two copies of the weights under Adam) for the whole session
        release_training_memory({"module": module, **{f"optimizer{i}": o for i, o in enumerate(trainer.optimizers)}})

        def loss(batch: Any) -> torch.Tensor:
            return step_loss(module, batch)

        return traj, Fresh(module, loss, lambda: (traj.notes["optimizer"], None), owner=(module, trainer)), None

    def saved_state(self) -> tuple[Any, list[tuple[str, Any]], str]:
        from lightning.pytorch.callbacks import ModelCheckpoint

        module, dm = self._copies()
        ckdir = self.tmp.mktemp("dlcheck-save")
        self._fit(module, dm, [ModelCheckpoint(dirpath=str(ckdir), every_n_train_steps=1, save_top_k=-1)], max_steps=1)
        return module, read_saved(ckdir), "Lightning's ModelCheckpoint (.ckpt 'state_dict')"

    def resume(self, total: int, restore: frozenset[str] = frozenset()) -> ResumeRun:
        """Two epochs of ``total // 2`` batches; Lightning's ModelCheckpoint saves the ``.ckpt`` at the end
        of the first (an epoch boundary: Lightning does not fast-forward a dataloader mid-epoch); a fresh
        copy resumes from it with ``fit(ckpt_path=...)``."""

        k = max(1, total // 2)
        cache = self.__dict__.setdefault("_baselines", {})
        if k not in cache:
            traj, truth, ckdir = self._uninterrupted(k)
            # the checkpoint of the first epoch's end: under manual optimization with accumulation
            # global_step counts optimizer steps, not batches, so the name's step= is not k
            ckpts = sorted(ckdir.glob("epoch=0-*.ckpt")) or sorted(ckdir.glob(f"*step={k}.ckpt"))
            if not ckpts:
                raise SetupError(f"Lightning's ModelCheckpoint wrote no .ckpt after {k} steps")
            saved = torch.load(ckpts[0], map_location="cpu", weights_only=False)
            pieces = {
                "model": "state_dict" if saved.get("state_dict") else "",
                "optimizer": "optimizer_states" if saved.get("optimizer_states") else "",
                "lr_scheduler": "lr_schedulers" if saved.get("lr_schedulers") or not truth.get("lr_scheduler") else "",
                "rng": "",
            }
            for label, held in truth.get(CALLBACKS, {}).items():  # a callback whose state changed: a piece
                pieces[f"callback {label}"] = "callbacks" if held["saves"] else ""
                traj.notes.setdefault("callbacks", {})[label] = {"changed": held["changed"], "saves": held["saves"]}
            if truth.get(MODULE_ATTRS):  # the module's own attributes that training changed: a piece
                pieces[MODULE_ATTRS] = ""
                traj.notes["module_attributes"] = list(truth[MODULE_ATTRS]["changed"])
            if truth.get(HAND_SCHEDULER):  # schedulers stepped by hand: a piece of their own
                pieces[HAND_SCHEDULER] = ""
                traj.notes["hand_schedulers"] = {
                    label: type_name for label, (_, _, type_name) in truth[HAND_SCHEDULER].items()
                }
            cache[k] = Baseline(traj, truth, ckpts[0], pieces)
        base = cache[k]
        module, dm = self._copies()
        traj = Trajectory()
        user = self.user_callbacks()
        callbacks = [self._recorder(traj, True)]
        if restore:
            callbacks.insert(0, _lightning_restorer(base.truth, restore, user))
        seed_all(SEED)
        with load_reports() as loads:
            try:
                self._fit(
                    module,
                    dm,
                    callbacks,
                    ckpt_path=str(base.checkpoint),
                    user=user,
                    max_epochs=2,
                    limit_train_batches=k,
                )
            except Exception as exc:
                if not raised_loading(exc):
                    raise
                # Lightning's own resume refuses the .ckpt its own ModelCheckpoint wrote (as the user's fit
                # would): C1's finding
                raise ResumeLoadFailed(
                    "lightning_module",
                    f"fit(ckpt_path=...) raised {type(exc).__name__} loading {base.checkpoint.name}: "
                    + " ".join(str(exc).split())[:600],
                    exc,
                    "fit(ckpt_path=...)",
                    base.checkpoint,
                    k,
                ) from exc
        traj.notes["ema"] = callback_emas(user)
        return ResumeRun(base.trajectory, traj, k, base.checkpoint, base.pieces, loads)

    def _uninterrupted(self, k: int) -> tuple[Trajectory, dict[str, Any], Any]:
        """Two epochs of ``k`` batches from the seed, ModelCheckpoint saving at every epoch's end: the
        trajectory, the state at the first epoch's end (the diagnosis' truth) and the checkpoints' folder."""
        from lightning.pytorch.callbacks import ModelCheckpoint

        module, dm = self._copies()
        traj, truth = Trajectory(), {}
        ckdir = self.tmp.mktemp("dlcheck-ckpt")
        user = self.user_callbacks()
        seed_all(SEED)
        self._fit(
            module,
            dm,
            [
                self._recorder(traj, True, truth, user),
                ModelCheckpoint(dirpath=str(ckdir), every_n_epochs=1, save_top_k=-1),
            ],
            user=user,
            max_epochs=2,
            limit_train_batches=k,
        )
        # the EMAs the user's callbacks keep (an EMA callback, WeightAveraging): C1 compares them at the end, as
        # the EMAs of a plain loop's state (an EMA feeds no loss: only its tensors show what a resume lost)
        traj.notes["ema"] = callback_emas(user)
        traj.notes["user_callbacks"] = callback_labels(user)
        traj.notes["left_out_callbacks"] = list(self.left_out)
        return traj, truth, ckdir

    def uninterrupted_again(self, total: int, saved_at: int) -> Trajectory:
        """The uninterrupted run once more, the same way: whether the run reproduces itself (C1 asks only when
        no piece put back makes the resumed run identical)."""
        return self._uninterrupted(max(1, total // 2))[0]

    def checkpointing(self) -> tuple[list[str], list[str]] | None:
        """(what writes a checkpoint in the middle of an epoch, what writes one at epoch ends), in words, from the
        callbacks and settings of the user's Lightning Trainer (``dlcheck_trainer``) or the checkpoint callbacks
        among ``dlcheck_lightning_callbacks``; None when neither shows how the user's runs checkpoint."""
        trainer = self.l_trainer if self.l_trainer not in (MISSING, None) else None
        if trainer is not None:
            callbacks = list(trainer.callbacks)
        else:
            source = self.callbacks
            if source is MISSING or source is None:
                return None
            if isinstance(source, (list, tuple)):
                callbacks = list(source)
            elif callable(source) and not _is_callback(source):
                made = user_call(self.callbacks_role, source)
                callbacks = list(made) if isinstance(made, (list, tuple)) else [made]
            else:
                callbacks = [source]
        mid, ends = [], []
        interval = getattr(trainer, "val_check_interval", 1.0) if trainer is not None else 1.0
        validates_mid_epoch = (
            trainer is not None
            and getattr(trainer, "limit_val_batches", 0) != 0
            and (isinstance(interval, int) or (isinstance(interval, float) and interval < 1.0))
            and _validates(self.module, self.datamodule)
        )
        for cb in callbacks:
            names = [c.__name__ for c in type(cb).__mro__]
            if "OnExceptionCheckpoint" in names:
                mid.append("OnExceptionCheckpoint (where an exception stops the fit)")
            elif "ModelCheckpoint" in names:
                steps = getattr(cb, "_every_n_train_steps", 0) or 0
                timed = getattr(cb, "_train_time_interval", None)
                if steps > 0:
                    mid.append(f"ModelCheckpoint(every_n_train_steps={steps})")
                elif timed is not None:
                    mid.append(f"ModelCheckpoint(train_time_interval={timed})")
                elif validates_mid_epoch and getattr(cb, "_save_on_train_epoch_end", None) is not True:
                    mid.append(f"ModelCheckpoint at every validation (val_check_interval={interval})")
                else:
                    ends.append(f"ModelCheckpoint(every_n_epochs={getattr(cb, '_every_n_epochs', 1)})")
        env = getattr(getattr(trainer, "_accelerator_connector", None), "cluster_environment", None)
        if env is not None and type(env).__name__ == "SLURMEnvironment" and getattr(env, "auto_requeue", False):
            mid.append("a SLURM requeue (SLURMEnvironment(auto_requeue=True) saves where the job is preempted)")
        if trainer is None and not mid and not ends:
            return None  # callbacks without a checkpoint callback: how the runs checkpoint is not shown
        return mid, ends

    def data_resume(self, total: int) -> DataResume:
        """The data position across a mid-epoch save and resume through Lightning's own ``fit(ckpt_path=...)``
        (C1): fresh copies fit one epoch of at most ``total`` batches of the datamodule's (or the module's own)
        ``train_dataloader()``
        (``limit_train_batches``) and ``trainer.save_checkpoint`` right after the first optimizer step at or past
        half way (a mid-epoch checkpoint, as ``ModelCheckpoint(every_n_train_steps=...)`` or a SLURM requeue
        writes one); other fresh copies resume from it with ``fit(ckpt_path=...)`` to the end of that epoch. Both
        fits record the examples of every batch they train (``on_train_batch_start``), start from the same global
        RNG states (a loader whose epoch starts again draws the same shuffle) and read each example of a map-style
        dataset with the RNGs seeded by its index (a random augmentation does not hide an example). Two fits, of
        ``total`` and ``total - total // 2`` batches: C1's other runs save at an epoch boundary, where Lightning
        starts every loader's epoch anew, and cannot show this."""
        from lightning.fabric.utilities.types import _Stateful

        path = self.tmp.mktemp("dlcheck-midepoch") / "mid-epoch.ckpt"
        with preserved_rng():
            first = _data_draws(save_from=max(1, total // 2), path=path)
            module, dm = self._copies()
            seed_all(SEED)
            with first.stack:
                self._fit(module, dm, [first], max_epochs=1, limit_train_batches=total)
            module = dm = None
            trained, k = len(first.batches), first.saved_at
            if k is None:
                raise SetupError(
                    f"an epoch of your {first.loader} has {trained} batch{'es' if trained != 1 else ''}: no "
                    "checkpoint can be saved inside it"
                    if trained < 2
                    else f"no optimizer step ended between batches {first.save_from} and {trained - 1} of the epoch "
                    "to save after (raise C1.steps above your accumulate_grad_batches)"
                )
            before = [d for n, d in first.batches if n <= k]
            expected = [d for n, d in first.batches if n > k]
            result = DataResume(
                "train_dataloader", first.loader, first.loader, trained, k, first.epoch, before, expected, []
            )
            saved = torch.load(path, map_location="cpu", weights_only=False)
            fit_state = ((saved.get("loops") or {}).get("fit_loop") or {}).get("state_dict") or {}
            result.notes = {
                "stateful": bool(first.loaders) and all(isinstance(dl, _Stateful) for dl in first.loaders),
                "held": bool(fit_state.get("combined_loader")),
            }
            saved = None
            again = _data_draws()
            module, dm = self._copies()
            seed_all(SEED)  # the same states as the first fit's start: a new iterator draws the same shuffle
            try:
                with again.stack:
                    self._fit(module, dm, [again], ckpt_path=str(path), max_epochs=1, limit_train_batches=total)
            except Exception as exc:
                if not raised_loading(exc):
                    raise
                result.load_error = (
                    f"fit(ckpt_path=...) raised {type(exc).__name__}: " + " ".join(str(exc).split())[:300]
                )
                return result
            result.resumed_loader = again.loader
            result.resumed = [d for _, d in again.batches]
        if any(d is None for d in result.before + result.expected + result.resumed):
            result.unreadable = "a batch holds no tensor with a batch dimension to tell its examples apart"
        return result


def _validates(module: Any, datamodule: Any) -> bool:
    """Whether a fit of the module validates: it defines ``validation_step`` and it or the datamodule defines
    ``val_dataloader`` (else a ModelCheckpoint saves at the epoch's end whatever ``val_check_interval`` says)."""
    import lightning.pytorch as pl
    from lightning.pytorch.utilities.model_helpers import is_overridden

    if not is_overridden("validation_step", module, pl.LightningModule):
        return False
    return is_overridden("val_dataloader", module, pl.LightningModule) or (
        datamodule not in (MISSING, None) and is_overridden("val_dataloader", datamodule, pl.LightningDataModule)
    )


def _data_draws(save_from: int | None = None, path: Any = None) -> Any:
    """The Lightning callback of the data-position fits: records the examples of each batch the fit trains, by
    its 1-based number in the epoch; with ``save_from``, saves the checkpoint to ``path`` right after the first
    optimizer step at or past that batch and before the epoch's last (a mid-epoch checkpoint)."""
    import lightning.pytorch as pl

    class DataDraws(pl.Callback):
        def __init__(self) -> None:
            self.save_from, self.path, self.saved_at = save_from, path, None
            self.batches: list[tuple[int, list[str] | None]] = []
            self.loaders: list[Any] = []
            self.loader, self.epoch = "train_dataloader()", None
            #: the examples read with the RNGs seeded by their index, while the fit runs
            self.stack = contextlib.ExitStack()

        def on_train_start(self, trainer, pl_module):
            combined = trainer.fit_loop._combined_loader
            self.loaders = list(combined.flattened) if combined is not None else []
            names = [type(dl).__name__ for dl in self.loaders]
            self.loader = " + ".join(names) or self.loader
            if len(self.loaders) == 1:
                try:
                    self.epoch = len(self.loaders[0])
                except TypeError:  # an iterable without a length
                    self.epoch = None
            self.limit = trainer.num_training_batches
            for dl in self.loaders:
                self.stack.enter_context(seeded_examples(dl))
            seed_all(DRAW_SEED)  # where a loader drawing its shuffle at its first batch draws it: both fits alike

        def on_train_batch_start(self, trainer, pl_module, batch, batch_idx):
            self.step_before = trainer.global_step
            self.batches.append((batch_idx + 1, example_digests(batch)))

        def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
            n = batch_idx + 1
            if (
                self.save_from is not None
                and self.saved_at is None
                and self.save_from <= n < self.limit
                and trainer.global_step > self.step_before
            ):
                trainer.save_checkpoint(str(self.path))
                self.saved_at = n

    return DataDraws()


def _batch_number(trainer: Any, fallback: int) -> int:
    """The 1-based number of the batch being trained, counted over the whole fit and restored by a resume
    (the fit loop's batch progress). ``global_step`` counts optimizer steps instead: with gradient
    accumulation (automatic or manual) several batches share one, and a run's records would collide."""
    try:
        return int(trainer.fit_loop.epoch_loop.batch_progress.total.ready)
    except AttributeError:
        return fallback


def hand_schedulers(trainer: Any, module: Any) -> dict[str, Any]:
    """``{"self.sched": scheduler}``: the torch LR schedulers held in the module's own attributes (directly,
    or in a list, tuple or dict attribute) that are not among the schedulers ``configure_optimizers``
    returned: schedulers the user creates and steps by hand, which Lightning neither knows nor saves."""
    from torch.optim.lr_scheduler import LRScheduler, ReduceLROnPlateau

    kinds = (LRScheduler, ReduceLROnPlateau)
    known = {id(c.scheduler) for c in getattr(trainer, "lr_scheduler_configs", None) or []}
    found: dict[str, Any] = {}
    for name, value in vars(module).items():
        if isinstance(value, kinds):
            items = [(f"self.{name}", value)]
        elif isinstance(value, (list, tuple)):
            items = [(f"self.{name}[{i}]", v) for i, v in enumerate(value)]
        elif isinstance(value, dict):
            items = [(f"self.{name}[{k!r}]", v) for k, v in value.items()]
        else:
            continue
        for label, obj in items:
            if isinstance(obj, kinds) and id(obj) not in known:
                found[label] = obj
                known.add(id(obj))
    return found


def _lookup(module: Any, label: str) -> Any:
    """The object ``hand_schedulers`` named ``label`` on (another copy of) the module; None if gone."""
    import ast
    import re

    m = re.fullmatch(r"self\.(\w+)(?:\[(.+)\])?", label)
    if not m:
        return None
    obj = vars(module).get(m.group(1))
    if m.group(2) is not None:
        try:
            obj = obj[ast.literal_eval(m.group(2))]
        except (KeyError, IndexError, TypeError, ValueError, SyntaxError):
            return None
    return obj


def _lightning_truth(trainer: Any, module: Any) -> dict[str, Any]:
    truth = {"model": {k: v.detach().clone() for k, v in module.state_dict().items()}, "rng": rng_state()}
    if trainer.optimizers:
        truth["optimizer"] = [copy.deepcopy(o.state_dict()) for o in trainer.optimizers]
    if trainer.lr_scheduler_configs:
        truth["lr_scheduler"] = [copy.deepcopy(c.scheduler.state_dict()) for c in trainer.lr_scheduler_configs]
    hand = hand_schedulers(trainer, module)
    if hand:
        truth[HAND_SCHEDULER] = {
            label: (copy.deepcopy(s.state_dict()), [float(g["lr"]) for g in s.optimizer.param_groups], type(s).__name__)
            for label, s in hand.items()
        }
    return truth


def _lightning_restorer(truth: dict[str, Any], restore: frozenset[str], user: list[Any] | None = None) -> Any:
    import lightning.pytorch as pl

    held = truth.get(CALLBACKS, {})
    put_back = [
        (cb, held[label]["state"])
        for label, cb in zip(callback_labels(user or []), user or [])
        if f"callback {label}" in restore and label in held
    ]

    class Restore(pl.Callback):
        def on_load_checkpoint(self, trainer, pl_module, checkpoint):
            # where a user's own RNG callback restores: before the fit loop builds its dataloader iterator
            put_back_rng(truth, restore)
            if MODULE_ATTRS in restore and truth.get(MODULE_ATTRS):
                # as on_load_checkpoint would set them: before train_dataloader() is called (a loader over a replay
                # buffer reads the buffer put back), copied together (the agent keeps the buffer it fills)
                for name, value in copy.deepcopy(truth[MODULE_ATTRS]["state"]).items():
                    setattr(pl_module, name, value)

        def on_train_start(self, trainer, pl_module):
            if "model" in restore:
                pl_module.load_state_dict(truth["model"])
            if "optimizer" in restore:
                for o, s in zip(trainer.optimizers, truth.get("optimizer", [])):
                    o.load_state_dict(copy.deepcopy(s))
            if "lr_scheduler" in restore:
                for c, s in zip(trainer.lr_scheduler_configs, truth.get("lr_scheduler", [])):
                    c.scheduler.load_state_dict(copy.deepcopy(s))

        def on_train_batch_start(self, trainer, pl_module, batch, batch_idx):
            # a scheduler stepped by hand is created by the user's own hooks (on_train_start runs after a
            # callback's): it is put back before the first resumed batch, with the LRs it had set
            if getattr(self, "done", False):
                return
            self.done = True
            # a callback's attributes as they stood at the save, before the first resumed batch (after the
            # callback's own load_state_dict, on_fit_start and on_train_start, which may build them anew)
            for cb, state in put_back:
                for name, value in state.items():
                    setattr(cb, name, copy.deepcopy(value))
            if HAND_SCHEDULER not in restore:
                return
            for label, (state, lrs, _) in truth.get(HAND_SCHEDULER, {}).items():
                sched = _lookup(pl_module, label)
                if sched is None:
                    continue
                sched.load_state_dict(copy.deepcopy(state))
                for group, lr in zip(sched.optimizer.param_groups, lrs):
                    group["lr"] = lr

    return Restore()


@contextlib.contextmanager
def _lightning_quiet() -> Iterator[None]:
    import logging

    names = ["lightning", "lightning.pytorch", "lightning.fabric", "pytorch_lightning"]
    names += [n for n in logging.root.manager.loggerDict if n.startswith(("lightning", "pytorch_lightning"))]
    loggers = [logging.getLogger(n) for n in dict.fromkeys(names)]
    levels = [lg.level for lg in loggers]
    for lg in loggers:
        lg.setLevel(logging.ERROR)
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            yield
    finally:
        for lg, level in zip(loggers, levels):
            lg.setLevel(level)


class _NoStep:
    """An optimizer or scheduler a manual-optimization ``training_step`` is handed when a check only
    wants its loss: ``step``/``zero_grad`` do nothing, everything else is the real object's."""

    def __init__(self, real: Any) -> None:
        self._real = real

    def step(self, *args: Any, **kwargs: Any) -> None:
        return None

    def zero_grad(self, *args: Any, **kwargs: Any) -> None:
        return None

    def __getattr__(self, name: str) -> Any:
        return getattr(self._real, name)


def configured(module: Any) -> Any:
    """A module copy used outside a Trainer gets what ``fit`` would give it first: its ``configure_model``
    hook (where Lightning's guides build, or compile, the model's layers; the hook is idempotent)."""
    hook = getattr(module, "configure_model", None)
    if callable(hook):
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            hook()
    return module


def _step(module: Any, batch: Any) -> Any:
    """``training_step(batch, batch_idx)``, or ``training_step(batch)`` for a step that takes no index."""
    import inspect

    try:
        params = [
            p
            for p in inspect.signature(module.training_step).parameters.values()
            if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD, p.VAR_POSITIONAL)
        ]
    except (TypeError, ValueError):
        params = []
    takes_index = len(params) >= 2 or any(p.kind is p.VAR_POSITIONAL for p in params) or not params
    return module.training_step(batch, 0) if takes_index else module.training_step(batch)


def step_loss(module: Any, batch: Any) -> torch.Tensor:
    """The loss of the module's own ``training_step`` on ``batch``, outside a Trainer. Under manual
    optimization (``automatic_optimization = False``) the step computes its loss, hands it to
    ``self.manual_backward`` and steps its optimizers itself: the loss is taken from
    ``manual_backward`` (no backward runs), and ``self.optimizers()`` / ``self.lr_schedulers()`` give
    objects whose ``step`` does nothing, so nothing is trained. The step is handed a batch of its own."""
    batch = own_batch(to_device(batch, device_of(module)))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        if module.automatic_optimization:
            return loss_tensor(_step(module, batch))
        captured: list[torch.Tensor] = []
        opts, scheds = all_lightning_optimizers(module)
        # what self.optimizers() / self.lr_schedulers() return in a Trainer: one object, a list of several, None
        stub_opts = _NoStep(opts[0]) if len(opts) == 1 else [_NoStep(o) for o in opts]
        stub_scheds = None if not scheds else _NoStep(scheds[0]) if len(scheds) == 1 else [_NoStep(s) for s in scheds]
        patches = {
            "manual_backward": lambda loss, *a, **k: captured.append(loss),
            "optimizers": lambda *a, **k: stub_opts,
            "lr_schedulers": lambda *a, **k: stub_scheds,
            "toggle_optimizer": lambda *a, **k: None,
            "untoggle_optimizer": lambda *a, **k: None,
        }
        saved = {name: vars(module)[name] for name in patches if name in vars(module)}
        for name, fn in patches.items():
            setattr(module, name, fn)
        try:
            out = _step(module, batch)
        finally:
            for name in patches:
                delattr(module, name)
            for name, fn in saved.items():
                setattr(module, name, fn)
        if len(captured) > 1 and len(opts) > 1:
            raise SetupError(
                f"not judged: {type(module).__name__}.training_step hands {len(captured)} losses to manual_backward "
                f"for its {len(opts)} optimizers (a GAN's generator and discriminator, an actor and a critic): each "
                "is minimised by its own optimizer, so the step has no one loss to judge"
            )
        if captured:  # one loss, or one optimizer's loss over several backward calls (accumulation by hand)
            return captured[0] if len(captured) == 1 else torch.stack([c.reshape(()) for c in captured]).mean()
        return loss_tensor(out)


def _configured_optimizers(module: Any) -> tuple[list[Any], list[Any]]:
    """(optimizers, scheduler configs) as Lightning reads ``configure_optimizers`` of a module copy."""
    conf = module.configure_optimizers()
    try:
        from lightning.pytorch.core.optimizer import _configure_optimizers

        optimizers, schedulers, _ = _configure_optimizers(conf)
    except Exception as exc:  # noqa: BLE001 - an unusual return value: say so
        raise SetupError(f"configure_optimizers() returned {type(conf).__name__}: {exc}") from exc
    if not optimizers:
        raise SetupError("configure_optimizers() returned no optimizer")
    return list(optimizers), list(schedulers or [])


def all_lightning_optimizers(module: Any) -> tuple[list[Any], list[Any]]:
    """Every optimizer and every scheduler ``configure_optimizers`` of a module copy gives, in order."""
    optimizers, schedulers = _configured_optimizers(module)
    return optimizers, [s.get("scheduler") if isinstance(s, Mapping) else s for s in schedulers]


def lightning_optimizers(module: Any) -> tuple[Any, Any, str | None]:
    """(first optimizer, first scheduler, its interval) from ``configure_optimizers`` of a module copy."""
    optimizers, schedulers = _configured_optimizers(module)
    sched, interval = None, None
    if schedulers:
        first = schedulers[0]
        sched = first.get("scheduler") if isinstance(first, Mapping) else first
        interval = first.get("interval", "epoch") if isinstance(first, Mapping) else "epoch"
    return optimizers[0], sched, interval


def lightning_interrupted_save(setup: LightningSetup) -> InterruptedSave:
    """ModelCheckpoint after steps 1 and 2, the second save interrupted; the first .ckpt must load."""
    import lightning.pytorch as pl
    from lightning.pytorch.callbacks import ModelCheckpoint

    module, dm = setup._copies()
    ckdir = setup.tmp.mktemp("dlcheck-atomic")
    arm = {"on": False}

    class Arm(pl.Callback):
        def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
            arm["on"] = trainer.global_step >= 2

    with interrupted_saves(lambda: arm["on"]) as hits:
        try:
            setup._fit(
                module,
                dm,
                [Arm(), ModelCheckpoint(dirpath=str(ckdir), every_n_train_steps=1, save_top_k=-1)],
                max_steps=2,
            )
        except SaveInterrupted:
            pass
    first = sorted(ckdir.glob("*step=1.ckpt"))
    if not hits or not first:
        raise SetupError("Lightning's second checkpoint was not written through torch.save: it cannot be interrupted")
    try:
        torch.load(first[0], map_location="cpu", weights_only=False)
    except Exception as exc:  # noqa: BLE001 - the finding
        return InterruptedSave("ModelCheckpoint", hits[0], str(first[0]), f"{type(exc).__name__}: {exc}")
    return InterruptedSave("ModelCheckpoint", hits[0], str(first[0]), None, "previous")
