"""Shared training machinery of the train, ckpt and smoke checks: the three kinds of users, fresh objects,
short real runs, and checkpoint/resume runs.

Three kinds of users hand over their training, with the least they can write:

- a transformers / TRL ``Trainer`` (``dlcheck_trainer``): runs go through a *clone* of it — the same
  class, arguments (output under pytest's tmp dir, nothing reported or pushed), datasets, collator and
  callbacks, around a fresh copy of the model (and of the DPO reference, sharing preserved) — so the
  real ``train()`` loop, checkpoint-* directories and ``resume_from_checkpoint`` are exercised;
- a Lightning user (``dlcheck_lightning_module`` + ``dlcheck_datamodule``): runs are real
  ``lightning.Trainer.fit`` calls on deep copies of the module and the datamodule;
- a plain loop (``dlcheck_make_training`` + data, optionally ``dlcheck_train_step``,
  ``dlcheck_compute_loss``, ``dlcheck_save_checkpoint`` / ``dlcheck_load_checkpoint``): runs call the
  user's step on fresh objects from the user's factory.

The user's own objects are never trained: every run works on fresh objects, and every file is written
under pytest's tmp paths. Copies of modules drop instance-level method patches (TRL binds a patched
``forward`` to the original module; a deep copy would keep calling the original) — the cloned trainer
applies its own patches to the copy — and are verified to share no storage with the original."""

from __future__ import annotations

import contextlib
import copy
import inspect
import math
import random
import sys
import warnings
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from .guard import preserved_dataloader, preserved_rng
from .outcome import RoleError
from .roles import MISSING

#: the seed every fresh run of a plain loop or a Lightning module starts from (a Trainer uses args.seed)
SEED = 0


class SetupError(Exception):
    """The user's training cannot be run the way a check needs: the check skips with this reason."""


# --------------------------------------------------------------------------------------------------
# recognising the user's objects


def is_hf_trainer(obj: Any) -> bool:
    return any(c.__module__.startswith(("transformers.", "trl.")) and c.__name__.endswith("Trainer") for c in type(obj).__mro__)


def is_lightning_module(obj: Any) -> bool:
    return any(c.__name__ == "LightningModule" and c.__module__.startswith(("lightning.", "pytorch_lightning."))
               for c in type(obj).__mro__)


def is_lightning_trainer(obj: Any) -> bool:
    return any(c.__name__ == "Trainer" and c.__module__.startswith(("lightning.pytorch", "pytorch_lightning"))
               for c in type(obj).__mro__)


def is_grpo(trainer: Any) -> bool:
    return any(c.__name__ == "GRPOTrainer" for c in type(trainer).__mro__)


def is_preference(trainer: Any) -> bool:
    return any(c.__name__ == "DPOTrainer" for c in type(trainer).__mro__)


# --------------------------------------------------------------------------------------------------
# fresh copies, snapshots, RNG


def _strip_instance_patches(copied: torch.nn.Module) -> list[str]:
    """Drop callables set on module instances that shadow a class method (a patched ``forward``): in a deep
    copy they are the original's closures, still bound to the original module."""
    dropped = []
    for name, mod in copied.named_modules():
        for attr, value in list(vars(mod).items()):
            if (callable(value) and not isinstance(value, (torch.nn.Module, torch.Tensor, type))
                    and callable(getattr(type(mod), attr, None))):
                delattr(mod, attr)
                dropped.append(f"{name or type(copied).__name__}.{attr}")
    return dropped


def fresh_modules(modules: list[Any], extra_memo: dict[int, Any] | None = None) -> list[Any]:
    """Independent copies of ``modules`` (copied together, so parameters they share stay shared between
    the copies), without instance-level method patches, verified to share no storage with the originals."""
    memo = dict(extra_memo or {})
    copies = copy.deepcopy(list(modules), memo)
    originals = {p.data_ptr() for m in modules if m is not None for p in m.parameters()}
    for cp in copies:
        if cp is None:
            continue
        _strip_instance_patches(cp)
        shared = [n for n, p in cp.named_parameters() if p.data_ptr() in originals]
        if shared:
            raise SetupError(f"a copy of the model still shares storage with the original ({shared[0]}): "
                             "dlcheck trains only copies, never your objects")
    return copies


@dataclass
class ModuleSnapshot:
    """Everything a step may change on a module: tensors, grads, requires_grad, train/eval flags."""

    tensors: dict[str, torch.Tensor]
    grads: dict[str, torch.Tensor | None]
    requires_grad: dict[str, bool]
    training: dict[str, bool]

    @classmethod
    def take(cls, module: torch.nn.Module) -> ModuleSnapshot:
        return cls(
            {k: v.detach().clone() for k, v in module.state_dict(keep_vars=True).items()},
            {n: None if p.grad is None else p.grad.detach().clone() for n, p in module.named_parameters()},
            {n: p.requires_grad for n, p in module.named_parameters()},
            {n: m.training for n, m in module.named_modules()},
        )

    def restore(self, module: torch.nn.Module) -> None:
        with torch.no_grad():
            for k, v in module.state_dict(keep_vars=True).items():
                if k in self.tensors:
                    v.copy_(self.tensors[k])
        for n, p in module.named_parameters():
            if n in self.grads:
                p.grad = self.grads[n]
            if n in self.requires_grad:
                p.requires_grad_(self.requires_grad[n])
        for n, m in module.named_modules():
            if n in self.training:
                m.training = self.training[n]


def rng_state() -> dict[str, Any]:
    np = sys.modules.get("numpy")
    state = {"python": random.getstate(), "torch": torch.random.get_rng_state()}
    if np is not None:
        state["numpy"] = np.random.get_state()
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state


def set_rng_state(state: dict[str, Any]) -> None:
    random.setstate(state["python"])
    torch.random.set_rng_state(state["torch"])
    if "numpy" in state and sys.modules.get("numpy") is not None:
        sys.modules["numpy"].random.set_state(state["numpy"])
    if "cuda" in state:
        torch.cuda.set_rng_state_all(state["cuda"])


def seed_all(seed: int) -> None:
    random.seed(seed)
    torch.manual_seed(seed)
    np = sys.modules.get("numpy")
    if np is not None:
        np.random.seed(seed % 2**32)


# --------------------------------------------------------------------------------------------------
# batches and model calls


def to_device(batch: Any, device: Any) -> Any:
    if isinstance(batch, torch.Tensor):
        return batch.to(device)
    if isinstance(batch, Mapping):
        return type(batch)({k: to_device(v, device) for k, v in batch.items()}) if isinstance(batch, dict) else \
            {k: to_device(v, device) for k, v in batch.items()}
    if isinstance(batch, (list, tuple)) and not (batch and isinstance(batch[0], Mapping)):
        moved = [to_device(v, device) for v in batch]
        return type(batch)(moved) if isinstance(batch, list) else tuple(moved)
    return batch


def batch_len(batch: Any) -> int | None:
    first = None
    if isinstance(batch, torch.Tensor):
        first = batch
    elif isinstance(batch, Mapping):
        first = next((v for v in batch.values() if isinstance(v, torch.Tensor) and v.dim() > 0), None)
    elif isinstance(batch, (list, tuple)) and batch:
        if isinstance(batch[0], torch.Tensor):
            first = batch[0]
        else:
            return len(batch)
    return int(first.shape[0]) if first is not None else None


def draw_batches(loader: Any, n: int) -> list[Any]:
    """The first ``n`` batches of a dataloader, whatever their shape, re-iterating it (a new epoch,
    ``set_epoch`` applied when the sampler has it) when it runs out. The loader's generators and the
    global RNGs are left as they were."""
    out: list[Any] = []
    with preserved_rng(), preserved_dataloader(loader):
        epoch = 0
        while len(out) < n:
            sampler = getattr(loader, "sampler", None)
            if hasattr(sampler, "set_epoch"):
                sampler.set_epoch(epoch)
            got = 0
            for batch in loader:
                out.append(batch)
                got += 1
                if len(out) >= n:
                    break
            if got == 0:
                break
            epoch += 1
    return out


def device_of(model: Any) -> Any:
    for p in model.parameters():
        return p.device
    return torch.device("cpu")


def loss_tensor(out: Any) -> torch.Tensor:
    """The loss a step returned: a tensor, a mapping with 'loss', or an HF ModelOutput."""
    if isinstance(out, torch.Tensor):
        return out
    if isinstance(out, Mapping) and "loss" in out:
        return loss_tensor(out["loss"])
    loss = getattr(out, "loss", None)
    if isinstance(loss, torch.Tensor):
        return loss
    if isinstance(out, (list, tuple)) and out and isinstance(out[0], torch.Tensor) and out[0].dim() == 0:
        return out[0]
    raise SetupError(f"the loss is a {type(out).__name__}, not a scalar tensor")


def as_float(value: Any) -> float | None:
    if value is None:
        return None
    if isinstance(value, torch.Tensor):
        return float(value.detach().float().mean()) if value.numel() else None
    try:
        return float(value)
    except (TypeError, ValueError):
        return None


def output_tensor(out: Any) -> torch.Tensor | None:
    """The prediction tensor of a model output (HF ``logits``, a tensor, the first tensor of a tuple)."""
    if isinstance(out, torch.Tensor):
        return out
    for key in ("logits", "last_hidden_state", "out"):
        value = out.get(key) if isinstance(out, Mapping) else getattr(out, key, None)
        if isinstance(value, torch.Tensor):
            return value
    if isinstance(out, Mapping):
        return next((v for v in out.values() if isinstance(v, torch.Tensor) and v.dim() > 0), None)
    if isinstance(out, (list, tuple)):
        return next((v for v in out if isinstance(v, torch.Tensor) and v.dim() > 0), None)
    return None


def _forward_params(model: Any) -> set[str] | None:
    try:
        params = inspect.signature(model.forward).parameters
    except (TypeError, ValueError):
        return None
    named = {n for n, p in params.items() if p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY)}
    return named or None


def model_call(model: Any, batch: Any) -> Callable[[], Any]:
    """How a model is called on a batch: a mapping by keyword (keys the forward does not name are left
    out), ``(inputs, targets, …)`` with its first element, a tensor as it is."""
    if isinstance(batch, Mapping):
        names = _forward_params(model)
        kwargs = {k: v for k, v in batch.items() if names is None or k in names}
        return lambda: model(**kwargs)
    if isinstance(batch, (list, tuple)) and batch:
        return lambda: model(batch[0])
    return lambda: model(batch)


def targets_of(batch: Any) -> Any:
    if isinstance(batch, Mapping):
        return batch.get("labels", batch.get("label"))
    if isinstance(batch, (list, tuple)) and len(batch) >= 2:
        return batch[1]
    return None


# --------------------------------------------------------------------------------------------------
# what a run records


@dataclass
class StepRecord:
    step: int
    loss: float | None = None
    grad_norm: float | None = None
    lr: float | None = None
    nonfinite_grads: list[str] = field(default_factory=list)
    nonfinite_params: list[str] = field(default_factory=list)
    metrics: dict[str, float] = field(default_factory=dict)


@dataclass
class Trajectory:
    steps: list[StepRecord] = field(default_factory=list)
    #: per step, a digest of the model's parameters after it (for bitwise comparisons)
    digests: list[tuple[int, float]] = field(default_factory=list)
    #: optimizer.step() and lr_scheduler.step() calls, in order ("opt" / "sched")
    calls: list[str] = field(default_factory=list)
    notes: dict[str, Any] = field(default_factory=dict)

    def losses(self) -> list[tuple[int, float]]:
        return [(s.step, s.loss) for s in self.steps if s.loss is not None]

    def record(self, step: int) -> StepRecord:
        if not self.steps or self.steps[-1].step != step:
            self.steps.append(StepRecord(step))
        return self.steps[-1]


def digest(model: Any) -> float:
    with torch.no_grad():
        return float(sum(p.detach().double().sum() + p.detach().double().abs().sum() * 1e-3 for p in model.parameters()))


def grad_report(params: list[tuple[str, torch.Tensor]]) -> tuple[float, list[str]]:
    """Total gradient 2-norm and the names of parameters whose gradient holds NaN/Inf."""
    total, bad = 0.0, []
    for name, p in params:
        if p.grad is None:
            continue
        g = p.grad.detach()
        if not torch.isfinite(g).all():
            bad.append(name)
            continue
        total += float(g.double().pow(2).sum())
    return (math.inf if bad else math.sqrt(total)), bad


def nonfinite_params(params: list[tuple[str, torch.Tensor]]) -> list[str]:
    return [n for n, p in params if not torch.isfinite(p.detach()).all()]


def param_names(model: Any) -> dict[int, str]:
    return {id(p): n for n, p in model.named_parameters()}


def optimizer_params(optimizer: Any, names: dict[int, str]) -> list[tuple[str, torch.Tensor]]:
    return [(names.get(id(p), f"param{i}"), p) for g in optimizer.param_groups for i, p in enumerate(g["params"])]


def scheduler_count(scheduler: Any) -> int | None:
    """How many times a torch LR scheduler has stepped (its own counter; nothing is patched on it, so its
    state_dict stays picklable)."""
    if scheduler is None:
        return None
    count = getattr(scheduler, "_step_count", None)
    if count is None:
        count = getattr(scheduler, "last_epoch", None)
    return int(count) if isinstance(count, int) else None


def watch_optimizer(optimizer: Any, names: dict[int, str], traj: Trajectory,
                    step_of: Callable[[], int]) -> Callable[[], None]:
    """Record, at every optimizer step, the gradient norm, non-finite gradients and parameters, the LR,
    and the optimizer steps in ``traj.calls``. Returns the function that removes the watch."""
    params = optimizer_params(optimizer, names)

    def pre(opt, args, kwargs):
        rec = traj.record(step_of())
        rec.grad_norm, rec.nonfinite_grads = grad_report(params)
        rec.lr = float(opt.param_groups[0]["lr"])

    def post(opt, args, kwargs):
        traj.calls.append("opt")
        bad = nonfinite_params(params)
        if bad:
            traj.record(step_of()).nonfinite_params = bad

    handles = [optimizer.register_step_pre_hook(pre), optimizer.register_step_post_hook(post)]
    return lambda: [h.remove() for h in handles]


# --------------------------------------------------------------------------------------------------
# the fresh objects a check trains


@dataclass
class Fresh:
    """Fresh objects at the initial state: the model, how the user's training computes its loss on a
    batch, and a factory of a fresh optimizer (and scheduler) for this model."""

    model: Any
    loss: Callable[[Any], torch.Tensor]
    make_optimizer: Callable[[], tuple[Any, Any]]
    #: what produced them (a cloned trainer, a module copy, a loop state), kept alive with them
    owner: Any = None

    def forward(self, batch: Any) -> Any:
        return model_call(self.model, to_device(batch, device_of(self.model)))()


def base_lr(optimizer: Any) -> None:
    """Put every param group at its base LR (a scheduler built on it may have moved it, e.g. a warmup
    that starts at 0)."""
    for g in optimizer.param_groups:
        if "initial_lr" in g:
            g["lr"] = g["initial_lr"]


# --------------------------------------------------------------------------------------------------
# kind 1: a transformers / TRL Trainer


_FRAMEWORK_CALLBACKS = ("transformers.", "trl.", "accelerate.")


class TrainerSetup:
    kind = "trainer"

    def __init__(self, trainer: Any, tmp: Any):
        self.trainer = trainer
        self.tmp = tmp
        self.name = type(trainer).__name__
        self.preference = is_preference(trainer)
        self.grpo = is_grpo(trainer)

    @property
    def sources(self) -> Any:
        return self.trainer

    def describe(self) -> str:
        return f"a clone of your {self.name} (fresh model copy, same args, data and callbacks)"

    # ---- cloning ------------------------------------------------------------------------------------

    def clone(self, tag: str, **overrides: Any) -> Any:
        """A new trainer of the user's class around fresh copies of the model (and reference model),
        writing under a tmp dir, reporting and pushing nothing."""
        from transformers.trainer_callback import PrinterCallback, ProgressCallback

        tr = self.trainer
        ref = getattr(tr, "ref_model", None)
        models = fresh_modules([tr.model] + ([ref] if ref is not None else []))
        out = self.tmp.mktemp(f"dlcheck-{tag}")
        base = dict(output_dir=str(out), report_to="none", push_to_hub=False, disable_tqdm=True, logging_steps=1,
                    logging_nan_inf_filter=False, eval_strategy="no", save_strategy="no", load_best_model_at_end=False,
                    hub_token=None)
        base.update(overrides)
        args = clone_args(tr.args, base)
        opt, sched = self._rebuild_optimizers(models[0])
        values = {
            "model": models[0], "ref_model": models[1] if ref is not None else None, "args": args,
            "data_collator": tr.data_collator, "train_dataset": tr.train_dataset, "eval_dataset": tr.eval_dataset,
            "processing_class": getattr(tr, "processing_class", None), "compute_metrics": tr.compute_metrics,
            "callbacks": self._user_callbacks(), "optimizers": (opt, sched),
            "peft_config": None, "formatting_func": None,
        }
        if getattr(tr, "padding_free", False):
            values["data_collator"] = None  # TRL makes its own in padding-free mode (and refuses one passed in)
        cls = type(tr)
        params = inspect.signature(cls.__init__).parameters
        kwargs = {}
        for name in params:
            if name == "self" or params[name].kind in (inspect.Parameter.VAR_POSITIONAL, inspect.Parameter.VAR_KEYWORD):
                continue
            if name in values:
                kwargs[name] = values[name]
            elif hasattr(tr, name):
                kwargs[name] = getattr(tr, name)
        # the datasets are already prepared (tokenized, packed): TRL must not prepare them again
        attrs = {"_prepare_dataset": lambda self, dataset, *a, **k: dataset} if hasattr(cls, "_prepare_dataset") else {}
        clone_cls = type(cls.__name__, (cls,), attrs)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            clone = clone_cls(**kwargs)
        for cb in (PrinterCallback, ProgressCallback):
            clone.remove_callback(cb)
        return clone

    def _user_callbacks(self) -> list[Any]:
        own = [cb for cb in self.trainer.callback_handler.callbacks
               if not type(cb).__module__.startswith(_FRAMEWORK_CALLBACKS)]
        return [copy.deepcopy(cb) for cb in own]

    def _rebuild_optimizers(self, fresh_model: Any) -> tuple[Any, Any]:
        """An optimizer/scheduler the user passed in ``optimizers=`` rebuilt over the fresh model's
        parameters (matched by name), as they were before any step: a trainer handed over after
        ``train()`` holds the Trainer's own scheduler (made for that run's length, left, say, at LR 0)
        and a used optimizer; the clone makes its own scheduler then, and starts the optimizer empty."""
        import collections

        opt, sched = self.trainer.optimizer, self.trainer.lr_scheduler
        if opt is None:
            return None, None
        if getattr(self.trainer, "_created_lr_scheduler", False):
            sched = None  # the Trainer's, not the user's: the clone creates one for its own run
        by_name = dict(fresh_model.named_parameters())
        memo = {id(p): by_name[n] for n, p in self.trainer.model.named_parameters() if n in by_name}
        new_opt = copy.deepcopy(opt, memo)
        new_opt.state = collections.defaultdict(dict)  # no moments or step counts from an earlier run
        new_sched = copy.deepcopy(sched, {**memo, id(opt): new_opt}) if sched is not None else None
        if new_sched is not None and getattr(new_sched, "last_epoch", 0) > 0 and hasattr(new_sched, "_initial_step"):
            for group in new_opt.param_groups:  # back to the schedule's first step
                if "initial_lr" in group:
                    group["lr"] = group["initial_lr"]
            new_sched.last_epoch = -1
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                new_sched._initial_step()
        return new_opt, new_sched

    # ---- fresh objects --------------------------------------------------------------------------------

    def fresh(self) -> Fresh:
        if self.grpo:
            raise SetupError("GRPOTrainer computes its loss on completions it generates inside the step; the "
                             "smoke checks (S1-S3) run it for real")
        clone = self.clone("fresh")

        def loss(batch: Any) -> torch.Tensor:
            inputs = clone._prepare_inputs(batch)
            with clone.compute_loss_context_manager():
                return clone.compute_loss(clone.model, inputs)

        def make_optimizer() -> tuple[Any, Any]:
            if self.trainer.optimizer is not None:  # passed in optimizers=(...): rebuilt over the clone's model
                return self._rebuild_optimizers(clone.model)
            clone.optimizer = None
            return clone.create_optimizer(), None

        return Fresh(clone.model, loss, make_optimizer, owner=clone)

    # ---- runs -----------------------------------------------------------------------------------------

    def _recorder(self, traj: Trajectory, digests: bool = False):
        from transformers import TrainerCallback

        class Record(TrainerCallback):
            def __init__(self) -> None:
                self.params: list = []

            def on_pre_optimizer_step(self, args, state, control, model=None, **kw):
                if model is not None and not self.params:
                    self.params = [(n, p) for n, p in model.named_parameters() if p.requires_grad]
                rec = traj.record(state.global_step + 1)
                rec.grad_norm, rec.nonfinite_grads = grad_report(self.params)

            def on_optimizer_step(self, args, state, control, **kw):
                traj.calls.append("opt")
                bad = nonfinite_params(self.params)
                if bad:
                    traj.record(state.global_step + 1).nonfinite_params = bad

            def on_step_end(self, args, state, control, model=None, **kw):
                if digests and model is not None:
                    traj.digests.append((state.global_step, digest(model)))

            def on_log(self, args, state, control, logs=None, **kw):
                logs = logs or {}
                if "loss" not in logs:
                    return
                rec = traj.record(state.global_step)
                rec.loss = as_float(logs["loss"])
                rec.lr = as_float(logs.get("learning_rate", rec.lr))
                if logs.get("grad_norm") is not None:
                    rec.grad_norm = as_float(logs["grad_norm"])
                rec.metrics = {k: as_float(v) for k, v in logs.items() if k not in ("loss", "learning_rate", "grad_norm", "epoch")}

        return Record()

    def saved_state(self) -> tuple[Any, list[tuple[str, Any]], str]:
        """(the model, the state dicts found in what the Trainer saves, how it was saved)."""
        return _trainer_saved(self)

    def smoke(self, steps: int) -> tuple[Trajectory, Fresh]:
        clone = self.clone("smoke", max_steps=steps)
        traj = Trajectory()
        clone.add_callback(self._recorder(traj))
        traj.notes["optimizer"] = None
        with _quiet():
            clone.train()
        traj.notes["optimizer"] = clone.optimizer
        traj.notes["scheduler"] = clone.lr_scheduler
        fresh = Fresh(clone.model, lambda b: _trainer_loss(clone, b), lambda: (clone.optimizer, clone.lr_scheduler),
                      owner=clone)
        return traj, fresh

    def resume(self, total: int, restore: frozenset[str] = frozenset()) -> ResumeRun:
        """Train ``total`` steps saving at half way (the Trainer's own checkpoint-* directory), then a
        second clone resumes with ``resume_from_checkpoint``; ``restore`` names pieces put back from the
        uninterrupted run's in-memory truth after the Trainer's own loading (for the diagnosis)."""
        k = max(1, total // 2)
        base = self._uninterrupted(total, k)
        clone = self.clone("resume", max_steps=total, **({"ignore_data_skip": False} if "data position" in restore else {}))
        traj = Trajectory()
        clone.add_callback(self._recorder(traj, digests=True))
        truth = base.truth
        if restore:
            _patch_trainer_restore(clone, truth, restore)
        with _quiet():
            clone.train(resume_from_checkpoint=str(base.checkpoint))
        return ResumeRun(base.trajectory, traj, k, base.checkpoint, base.pieces)

    def _uninterrupted(self, total: int, k: int) -> Baseline:
        key = (total, k)
        cache = self.__dict__.setdefault("_baselines", {})
        if key not in cache:
            clone = self.clone("run", max_steps=total, save_strategy="steps", save_steps=k, save_total_limit=None)
            traj = Trajectory()
            clone.add_callback(self._recorder(traj, digests=True))
            truth: dict[str, Any] = {}
            from transformers import TrainerCallback

            class Truth(TrainerCallback):
                def on_step_end(self, args, state, control, model=None, **kw):
                    if state.global_step == k:
                        truth.update(_trainer_truth(clone))

            clone.add_callback(Truth())
            with _quiet():
                clone.train()
            ckpt = Path(clone.args.output_dir) / f"checkpoint-{k}"
            if not ckpt.is_dir():
                raise SetupError(f"the Trainer wrote no {ckpt.name} directory after {k} steps")
            pieces = _trainer_pieces(clone, ckpt)
            cache[key] = Baseline(traj, truth, ckpt, pieces)
        return cache[key]


def clone_args(args: Any, overrides: dict[str, Any]) -> Any:
    """A copy of a TrainingArguments / TRL config with some fields changed. Set on a deep copy, not through
    ``dataclasses.replace``: re-running ``__post_init__`` on already post-processed values fails for some
    configs (GRPOConfig derives generation_batch_size from steps_per_generation)."""
    import enum

    new = copy.deepcopy(args)
    for name, value in overrides.items():
        if not hasattr(new, name):
            continue
        current = getattr(new, name)
        if isinstance(current, enum.Enum) and isinstance(value, str):
            value = type(current)(value)
        if name == "report_to":
            value = [] if value in (None, "none") else [value] if isinstance(value, str) else list(value)
        object.__setattr__(new, name, value)
    return new


def _trainer_saved(setup: TrainerSetup) -> tuple[Any, list[tuple[str, Any]], str]:
    clone = setup.clone("save")
    out = Path(clone.args.output_dir) / "saved"
    with _quiet():
        clone.save_model(str(out))
    return clone.model, read_saved(out), f"the Trainer's save_model ({out.name}/)"


def _trainer_loss(clone: Any, batch: Any) -> torch.Tensor:
    inputs = clone._prepare_inputs(batch)
    with clone.compute_loss_context_manager():
        return clone.compute_loss(clone.model, inputs)


def _trainer_truth(clone: Any) -> dict[str, Any]:
    truth = {"model": {k: v.detach().clone() for k, v in clone.model.state_dict().items()}, "rng": rng_state()}
    if clone.optimizer is not None:
        truth["optimizer"] = copy.deepcopy(clone.optimizer.state_dict())
    if clone.lr_scheduler is not None:
        truth["lr_scheduler"] = copy.deepcopy(clone.lr_scheduler.state_dict())
    return truth


def _trainer_pieces(clone: Any, ckpt: Path) -> dict[str, str]:
    """Which pieces of the training state the checkpoint directory holds, by the Trainer's file names."""
    files = {p.name for p in ckpt.iterdir()}
    weights = any(f.startswith(("model", "pytorch_model", "adapter_model")) for f in files)
    pieces = {
        "model": "model weights file" if weights else "",
        "optimizer": "optimizer.pt" if "optimizer.pt" in files or "optimizer.bin" in files else "",
        "lr_scheduler": "scheduler.pt" if "scheduler.pt" in files else "",
        "rng": "rng_state.pth" if any(f.startswith("rng_state") for f in files) else "",
        "data position": "" if clone.args.ignore_data_skip else "trainer_state.json global_step (batches skipped)",
    }
    return pieces


def _patch_trainer_restore(clone: Any, truth: dict[str, Any], restore: frozenset[str]) -> None:
    """After the Trainer loads its checkpoint, put back the named pieces from the uninterrupted run."""
    load_opt, load_rng, load_model = clone._load_optimizer_and_scheduler, clone._load_rng_state, clone._load_from_checkpoint

    def load_optimizer_and_scheduler(checkpoint):
        load_opt(checkpoint)
        if "optimizer" in restore and "optimizer" in truth:
            clone.optimizer.load_state_dict(copy.deepcopy(truth["optimizer"]))
        if "lr_scheduler" in restore and "lr_scheduler" in truth:
            clone.lr_scheduler.load_state_dict(copy.deepcopy(truth["lr_scheduler"]))

    def load_rng_state(checkpoint):
        load_rng(checkpoint)
        if "rng" in restore:
            set_rng_state(truth["rng"])

    def load_from_checkpoint(checkpoint, model=None):
        load_model(checkpoint, model) if model is not None else load_model(checkpoint)
        if "model" in restore:
            clone.model.load_state_dict(truth["model"])

    clone._load_optimizer_and_scheduler = load_optimizer_and_scheduler
    clone._load_rng_state = load_rng_state
    clone._load_from_checkpoint = load_from_checkpoint


@dataclass
class Baseline:
    trajectory: Trajectory
    truth: dict[str, Any]
    checkpoint: Path
    #: piece -> where the checkpoint keeps it ("" when it does not)
    pieces: dict[str, str]


@dataclass
class ResumeRun:
    uninterrupted: Trajectory
    resumed: Trajectory
    saved_at: int
    checkpoint: Path
    pieces: dict[str, str]

    def mismatch(self) -> tuple[int, str] | None:
        """The first step after the save where the resumed run differs from the uninterrupted one."""
        base = {s.step: s for s in self.uninterrupted.steps}
        based = dict(self.uninterrupted.digests)
        for rec in self.resumed.steps:
            ref = base.get(rec.step)
            if ref is None or rec.step <= self.saved_at:
                continue
            if rec.loss is not None and ref.loss is not None and rec.loss != ref.loss:
                return rec.step, f"loss {rec.loss:.6g} resumed vs {ref.loss:.6g} uninterrupted"
            if rec.lr is not None and ref.lr is not None and rec.lr != ref.lr:
                return rec.step, f"learning rate {rec.lr:.6g} resumed vs {ref.lr:.6g} uninterrupted"
        for step, value in self.resumed.digests:
            if step > self.saved_at and step in based and value != based[step]:
                return step, f"weights differ after the step (digest {value:.9g} resumed vs {based[step]:.9g})"
        if not any(s.step > self.saved_at for s in self.resumed.steps) and not any(
                st > self.saved_at for st, _ in self.resumed.digests):
            return self.saved_at + 1, "the resumed run trained no step"
        return None


@contextlib.contextmanager
def _quiet() -> Iterator[None]:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        try:
            from transformers.utils import logging as hf_logging

            level, bars = hf_logging.get_verbosity(), hf_logging.is_progress_bar_enabled()
            hf_logging.set_verbosity_error()
            hf_logging.disable_progress_bar()
        except ImportError:
            hf_logging = None
        try:
            yield
        finally:
            if hf_logging is not None:
                hf_logging.set_verbosity(level)
                if bars:
                    hf_logging.enable_progress_bar()


# --------------------------------------------------------------------------------------------------
# kind 2: Lightning


class LightningSetup:
    kind = "lightning"

    def __init__(self, module: Any, datamodule: Any, l_trainer: Any, tmp: Any):
        self.module = module
        self.datamodule = datamodule
        self.l_trainer = l_trainer
        self.tmp = tmp
        self.name = type(module).__name__

    @property
    def sources(self) -> Any:
        return (self.module, self.datamodule) if self.datamodule is not MISSING else self.module

    def describe(self) -> str:
        return f"a copy of your LightningModule {self.name}"

    def _copies(self) -> tuple[Any, Any]:
        trainer_ref = getattr(self.module, "_trainer", None)
        memo = {id(trainer_ref): None} if trainer_ref is not None else {}
        module = fresh_modules([self.module], memo)[0]
        dm = copy.deepcopy(self.datamodule, {id(trainer_ref): None} if trainer_ref is not None else {}) \
            if self.datamodule is not MISSING else None
        return module, dm

    def fresh(self) -> Fresh:
        module, _ = self._copies()

        def loss(batch: Any) -> torch.Tensor:
            batch = to_device(batch, device_of(module))
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                return loss_tensor(module.training_step(batch, 0))

        def make_optimizer() -> tuple[Any, Any]:
            opt, sched, _ = lightning_optimizers(module)
            return opt, sched

        return Fresh(module, loss, make_optimizer, owner=module)

    def _fit(self, module: Any, dm: Any, callbacks: list[Any], ckpt_path: str | None = None, **kwargs: Any) -> Any:
        import lightning.pytorch as pl

        settings = dict(accelerator="cpu" if device_of(module).type == "cpu" else "auto", devices=1, logger=False,
                        enable_progress_bar=False, enable_model_summary=False, num_sanity_val_steps=0,
                        limit_val_batches=0, enable_checkpointing=any(type(c).__name__ == "ModelCheckpoint" for c in callbacks),
                        default_root_dir=str(self.tmp.mktemp("dlcheck-lightning")))
        if self.l_trainer not in (MISSING, None):
            t = self.l_trainer
            settings.update(accumulate_grad_batches=t.accumulate_grad_batches, gradient_clip_val=t.gradient_clip_val,
                            gradient_clip_algorithm=t.gradient_clip_algorithm, precision=t.precision)
        settings.update(kwargs)
        trainer = pl.Trainer(callbacks=callbacks, **settings)
        with _lightning_quiet():
            if dm is not None:
                trainer.fit(module, datamodule=dm, ckpt_path=ckpt_path)
            else:
                raise SetupError("no datamodule: define fixture dlcheck_datamodule")
        return trainer

    def _recorder(self, traj: Trajectory, digests: bool = False, truth_at_epoch_end: dict | None = None):
        import lightning.pytorch as pl

        class Record(pl.Callback):
            def __init__(self) -> None:
                self.params: list = []

            def on_before_optimizer_step(self, trainer, pl_module, optimizer):
                if not self.params:
                    self.params = [(n, p) for n, p in pl_module.named_parameters() if p.requires_grad]
                rec = traj.record(trainer.global_step + 1)
                rec.grad_norm, rec.nonfinite_grads = grad_report(self.params)
                rec.lr = float(optimizer.param_groups[0]["lr"])

            def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
                rec = traj.record(trainer.global_step)
                loss = outputs.get("loss") if isinstance(outputs, Mapping) else outputs
                rec.loss = as_float(loss)
                bad = nonfinite_params(self.params)
                if bad:
                    rec.nonfinite_params = bad
                if digests:
                    traj.digests.append((trainer.global_step, digest(pl_module)))

            def on_train_epoch_end(self, trainer, pl_module):
                if truth_at_epoch_end is not None and trainer.current_epoch == 0:
                    truth_at_epoch_end.update(_lightning_truth(trainer, pl_module))

        return Record()

    def smoke(self, steps: int) -> tuple[Trajectory, Fresh]:
        module, dm = self._copies()
        traj = Trajectory()
        trainer = self._fit(module, dm, [self._recorder(traj)], max_steps=steps)
        traj.notes["optimizer"] = trainer.optimizers[0] if trainer.optimizers else None
        traj.notes["scheduler"] = trainer.lr_scheduler_configs[0].scheduler if trainer.lr_scheduler_configs else None
        module._trainer = None  # detached: its training_step (and self.log) is called again on its own

        def loss(batch: Any) -> torch.Tensor:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                return loss_tensor(module.training_step(to_device(batch, device_of(module)), 0))

        return traj, Fresh(module, loss, lambda: (traj.notes["optimizer"], None), owner=(module, trainer))

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
        from lightning.pytorch.callbacks import ModelCheckpoint

        k = max(1, total // 2)
        cache = self.__dict__.setdefault("_baselines", {})
        if k not in cache:
            module, dm = self._copies()
            traj, truth = Trajectory(), {}
            ckdir = self.tmp.mktemp("dlcheck-ckpt")
            seed_all(SEED)
            self._fit(module, dm, [self._recorder(traj, True, truth),
                                   ModelCheckpoint(dirpath=str(ckdir), every_n_epochs=1, save_top_k=-1)],
                      max_epochs=2, limit_train_batches=k)
            ckpts = sorted(ckdir.glob(f"*step={k}.ckpt"))
            if not ckpts:
                raise SetupError(f"Lightning's ModelCheckpoint wrote no .ckpt after {k} steps")
            saved = torch.load(ckpts[0], map_location="cpu", weights_only=False)
            pieces = {
                "model": "state_dict" if saved.get("state_dict") else "",
                "optimizer": "optimizer_states" if saved.get("optimizer_states") else "",
                "lr_scheduler": "lr_schedulers" if saved.get("lr_schedulers") or not truth.get("lr_scheduler") else "",
                "rng": "",
            }
            cache[k] = Baseline(traj, truth, ckpts[0], pieces)
        base = cache[k]
        module, dm = self._copies()
        traj = Trajectory()
        callbacks = [self._recorder(traj, True)]
        if restore:
            callbacks.insert(0, _lightning_restorer(base.truth, restore))
        seed_all(SEED)
        self._fit(module, dm, callbacks, ckpt_path=str(base.checkpoint), max_epochs=2, limit_train_batches=k)
        return ResumeRun(base.trajectory, traj, k, base.checkpoint, base.pieces)


def _lightning_truth(trainer: Any, module: Any) -> dict[str, Any]:
    truth = {"model": {k: v.detach().clone() for k, v in module.state_dict().items()}, "rng": rng_state()}
    if trainer.optimizers:
        truth["optimizer"] = [copy.deepcopy(o.state_dict()) for o in trainer.optimizers]
    if trainer.lr_scheduler_configs:
        truth["lr_scheduler"] = [copy.deepcopy(c.scheduler.state_dict()) for c in trainer.lr_scheduler_configs]
    return truth


def _lightning_restorer(truth: dict[str, Any], restore: frozenset[str]) -> Any:
    import lightning.pytorch as pl

    class Restore(pl.Callback):
        def on_load_checkpoint(self, trainer, pl_module, checkpoint):
            # where a user's own RNG callback restores: before the fit loop builds its dataloader iterator
            if "rng" in restore:
                set_rng_state(truth["rng"])

        def on_train_start(self, trainer, pl_module):
            if "model" in restore:
                pl_module.load_state_dict(truth["model"])
            if "optimizer" in restore:
                for o, s in zip(trainer.optimizers, truth.get("optimizer", [])):
                    o.load_state_dict(copy.deepcopy(s))
            if "lr_scheduler" in restore:
                for c, s in zip(trainer.lr_scheduler_configs, truth.get("lr_scheduler", [])):
                    c.scheduler.load_state_dict(copy.deepcopy(s))

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


def lightning_optimizers(module: Any) -> tuple[Any, Any, str | None]:
    """(first optimizer, first scheduler, its interval) from ``configure_optimizers`` of a module copy."""
    conf = module.configure_optimizers()
    try:
        from lightning.pytorch.core.optimizer import _configure_optimizers

        optimizers, schedulers, _ = _configure_optimizers(conf)
    except Exception as exc:  # noqa: BLE001 - an unusual return value: say so
        raise SetupError(f"configure_optimizers() returned {type(conf).__name__}: {exc}") from exc
    if not optimizers:
        raise SetupError("configure_optimizers() returned no optimizer")
    sched, interval = None, None
    if schedulers:
        first = schedulers[0]
        sched = first.get("scheduler") if isinstance(first, Mapping) else first
        interval = first.get("interval", "epoch") if isinstance(first, Mapping) else "epoch"
    return optimizers[0], sched, interval


# --------------------------------------------------------------------------------------------------
# kind 3: a plain loop


class LoopSetup:
    kind = "loop"

    def __init__(self, make_training: Any, train_step: Any, compute_loss: Any, loss_fn: Any, loader: Any,
                 save: Any, load: Any, tmp: Any):
        self.make_training = make_training
        self.train_step = train_step
        self.compute_loss = compute_loss
        self.loss_fn = loss_fn
        self.loader = loader
        self.save = save
        self.load = load
        self.tmp = tmp
        self.name = "dlcheck_make_training"
        self._batches: list[Any] = []

    @property
    def sources(self) -> Any:
        return (self.make_training, self.loader, self.train_step, self.compute_loss, self.loss_fn, self.save, self.load)

    def describe(self) -> str:
        step = "dlcheck_train_step" if self.train_step is not MISSING else "the default step (loss.backward(), optimizer.step())"
        return f"fresh objects from dlcheck_make_training, trained by {step}"

    def state(self) -> dict[str, Any]:
        from .plugin import user_call

        with preserved_rng():
            seed_all(SEED)
            state = user_call("make_training", self.make_training)
        if not isinstance(state, Mapping) or "model" not in state:
            raise SetupError("dlcheck_make_training must return a dict with at least 'model' and 'optimizer', "
                             f"got {type(state).__name__}")
        return dict(state)

    def loss_of(self, model: Any, batch: Any) -> torch.Tensor:
        from .plugin import user_call

        if self.compute_loss is not MISSING:
            return loss_tensor(user_call("compute_loss", lambda: self.compute_loss(model, batch)))
        out_call = model_call(model, batch)
        if isinstance(batch, Mapping):
            return loss_tensor(user_call("make_training", out_call))
        if self.loss_fn is not MISSING and isinstance(batch, (list, tuple)) and len(batch) >= 2:
            return loss_tensor(user_call("loss_fn", lambda: self.loss_fn(out_call(), batch[1])))
        raise SetupError("the batches are not mappings the model takes by keyword: define fixture dlcheck_compute_loss "
                         "(model, batch) -> loss, or dlcheck_loss_fn for (inputs, targets) batches")

    def fresh(self) -> Fresh:
        state = self.state()
        model = state["model"]

        def make_optimizer() -> tuple[Any, Any]:
            again = self.state()
            opt = state.get("optimizer")
            # the factory built the optimizer for its own model; map it onto this one by parameter name
            by_name = dict(model.named_parameters())
            memo = {id(p): by_name[n] for n, p in again["model"].named_parameters() if n in by_name}
            new_opt = copy.deepcopy(again.get("optimizer"), memo) if again.get("optimizer") is not None else opt
            sched = again.get("lr_scheduler")
            new_sched = copy.deepcopy(sched, {**memo, id(again["optimizer"]): new_opt}) if sched is not None else None
            return new_opt, new_sched

        return Fresh(model, lambda b: self.loss_of(model, to_device(b, device_of(model))), make_optimizer, owner=state)

    def batches(self, n: int) -> list[Any]:
        if len(self._batches) < n:
            if self.loader is MISSING:
                raise SetupError("no training data: define fixture dlcheck_dataloader (or dlcheck_collator + dlcheck_dataset)")
            self._batches = draw_batches(self.loader, n)
            if not self._batches:
                raise SetupError("dlcheck_dataloader yielded no batch")
        return [self._batches[i % len(self._batches)] for i in range(n)]

    def step(self, state: dict[str, Any], batch: Any, index: int) -> float | None:
        """One call of the user's step (or the default one) on a batch."""
        from .plugin import user_call

        batch = to_device(batch, device_of(state["model"]))
        if self.train_step is not MISSING:
            fn = self.train_step
            try:
                takes_index = len(inspect.signature(fn).parameters) >= 3
            except (TypeError, ValueError):
                takes_index = False
            out = user_call("train_step", (lambda: fn(state, batch, index)) if takes_index else (lambda: fn(state, batch)))
            return as_float(out if not isinstance(out, Mapping) else out.get("loss"))
        model, opt, sched, scaler = state["model"], state.get("optimizer"), state.get("lr_scheduler"), state.get("scaler")
        if opt is None:
            raise SetupError("dlcheck_make_training returned no 'optimizer' (and no dlcheck_train_step was given)")
        model.train()
        loss = self.loss_of(model, batch)
        if scaler is not None:
            scaler.scale(loss).backward()
            scaler.step(opt)
            scaler.update()
        else:
            loss.backward()
            opt.step()
        if sched is not None:
            sched.step()
        opt.zero_grad(set_to_none=True)
        return as_float(loss)

    def run(self, state: dict[str, Any], batches: list[Any], start: int, traj: Trajectory, digests: bool = False,
            after: Callable[[int], None] | None = None) -> None:
        """Micro-steps ``start .. start+len(batches)-1`` of the user's loop on ``state``, recorded."""
        model, opt = state["model"], state.get("optimizer")
        names = param_names(model)
        current = {"i": start}
        undo = watch_optimizer(opt, names, traj, lambda: current["i"] + 1) if opt is not None else (lambda: None)
        sched = state.get("lr_scheduler")
        try:
            for offset, batch in enumerate(batches):
                i = start + offset
                current["i"] = i
                before = scheduler_count(sched)
                loss = self.step(state, batch, i)
                after_count = scheduler_count(sched)
                if before is not None and after_count is not None:
                    traj.calls.extend(["sched"] * max(0, after_count - before))
                traj.record(i + 1).loss = loss
                if digests:
                    traj.digests.append((i + 1, digest(model)))
                if after is not None:
                    after(i)
        finally:
            undo()

    def smoke(self, steps: int) -> tuple[Trajectory, Fresh]:
        state = self.state()
        traj = Trajectory()
        with preserved_rng():
            seed_all(SEED)
            self.run(state, self.batches(steps), 0, traj)
        traj.notes["optimizer"] = state.get("optimizer")
        traj.notes["scheduler"] = state.get("lr_scheduler")
        model = state["model"]
        return traj, Fresh(model, lambda b: self.loss_of(model, to_device(b, device_of(model))),
                           lambda: (state.get("optimizer"), state.get("lr_scheduler")), owner=state)

    # ---- checkpoint and resume -------------------------------------------------------------------------

    def saved_state(self) -> tuple[Any, list[tuple[str, Any]], str]:
        from .plugin import user_call

        if self.save is MISSING:
            raise SetupError("missing role: define fixture dlcheck_save_checkpoint (state, path) in conftest.py")
        state = self.state()
        path = self.tmp.mktemp("dlcheck-save") / "checkpoint"
        user_call("save_checkpoint", lambda: self.save(state, str(path)))
        return state["model"], read_saved(path), "dlcheck_save_checkpoint"

    def resume(self, total: int, restore: frozenset[str] = frozenset()) -> ResumeRun:
        """Run ``total`` micro-steps, saving with the user's save function after the first optimizer step
        at or past half way; fresh objects from the factory load it with the user's load function (the
        global RNGs first moved elsewhere, as in a new process) and continue on the same batches."""
        from .plugin import user_call

        if self.save is MISSING or self.load is MISSING:
            raise SetupError("missing role: define fixtures dlcheck_save_checkpoint and dlcheck_load_checkpoint "
                             "(state, path) in conftest.py")
        batches = self.batches(total)
        cache = self.__dict__.setdefault("_baselines", {})
        if total not in cache:
            cache[total] = self._uninterrupted(batches, total)
        base = cache[total]
        saved_at = base.truth["_saved_at"]
        state = self.state()
        traj = Trajectory()
        with preserved_rng():
            seed_all(SEED + 1)  # a new process: the global RNGs are wherever they are
            try:
                user_call("load_checkpoint", lambda: self.load(state, str(base.checkpoint)))
            except RoleError as exc:
                if _wrote_nothing(base.checkpoint):
                    raise RoleError("save_checkpoint", f"wrote nothing at the path it was given ({base.checkpoint}), "
                                    f"so dlcheck_load_checkpoint {exc.message}") from None
                raise
            _loop_restore(state, base.truth, restore)
            self.run(state, batches[saved_at:], saved_at, traj, digests=True)
        return ResumeRun(base.trajectory, traj, saved_at, base.checkpoint, base.pieces)

    def _uninterrupted(self, batches: list[Any], total: int) -> Baseline:
        from .plugin import user_call

        state = self.state()
        traj, truth = Trajectory(), {}
        path = self.tmp.mktemp("dlcheck-ckpt") / "checkpoint"
        seen = {"opt": 0}

        def after(i: int) -> None:
            stepped = traj.calls.count("opt") > seen["opt"]
            seen["opt"] = traj.calls.count("opt")
            # save right after an optimizer step (never inside a gradient accumulation) at or past half way
            if "_saved_at" not in truth and i + 1 >= total // 2 and stepped:
                user_call("save_checkpoint", lambda: self.save(state, str(path)))
                truth.update(_loop_truth(state))
                truth["_saved_at"] = i + 1

        with preserved_rng():
            seed_all(SEED)
            self.run(state, batches, 0, traj, digests=True, after=after)
        if "_saved_at" not in truth or truth["_saved_at"] >= total:
            raise SetupError(f"no optimizer step happened between micro-steps {total // 2} and {total - 1} to save after "
                             "(raise C1.steps above your gradient accumulation)")
        pieces = {p: "" for p in truth if not p.startswith("_")}
        return Baseline(traj, truth, path, pieces)


def _wrote_nothing(path: Path) -> bool:
    """True when nothing named like ``path`` (the file, a directory, or ``path`` + a suffix) exists."""
    return not path.exists() and not any(p.name.startswith(path.name) for p in path.parent.iterdir())


def _loop_truth(state: dict[str, Any]) -> dict[str, Any]:
    truth: dict[str, Any] = {"rng": rng_state()}
    for key, obj in state.items():
        if hasattr(obj, "state_dict") and hasattr(obj, "load_state_dict"):
            sd = obj.state_dict()
            truth[key] = {k: v.detach().clone() for k, v in sd.items()} if isinstance(obj, torch.nn.Module) else copy.deepcopy(sd)
    return truth


def _loop_restore(state: dict[str, Any], truth: dict[str, Any], restore: frozenset[str]) -> None:
    for piece in restore:
        if piece == "rng":
            set_rng_state(truth["rng"])
        elif piece in truth and piece in state:
            state[piece].load_state_dict(copy.deepcopy(truth[piece]))


# --------------------------------------------------------------------------------------------------
# choosing the kind


def get_setup(ctx: Any) -> Any:
    """The user's training, whichever kind they gave; skips naming the fixtures when none is given."""
    tmp = ctx.request.getfixturevalue("tmp_path_factory")
    trainer = ctx.role("trainer")
    if trainer is not MISSING and is_hf_trainer(trainer):
        return ctx.memo(trainer, "training:setup", lambda: TrainerSetup(trainer, tmp))
    make = ctx.role("make_training")
    if make is not MISSING:
        loader = ctx.role("dataloader")
        parts = [ctx.role(n) for n in ("train_step", "compute_loss", "loss_fn", "save_checkpoint", "load_checkpoint")]
        # every part of the loop is in the key: two projects sharing a factory and a loader keep their own step/save
        return ctx.memo((make, loader, *parts), "training:setup", lambda: LoopSetup(make, parts[0], parts[1], parts[2], loader,
                                                                           parts[3], parts[4], tmp))
    module = ctx.role("lightning_module")
    if module is not MISSING:
        dm = ctx.role("datamodule")
        l_trainer = trainer if trainer is not MISSING and is_lightning_trainer(trainer) else MISSING
        return ctx.memo((module, dm), "training:setup", lambda: LightningSetup(module, dm, l_trainer, tmp))
    ctx.skip("missing role: define fixture dlcheck_trainer (transformers/TRL), or dlcheck_lightning_module + "
             "dlcheck_datamodule (Lightning), or dlcheck_make_training + dlcheck_dataloader (plain loop) in conftest.py")


def training_batches(ctx: Any, setup: Any, n: int | None = None) -> list[Any]:
    """Sampled training batches as the user's step takes them (shared across checks)."""
    if setup.kind == "loop":
        return setup.batches(n or _n_batches(ctx))
    loader = ctx.role("dataloader")
    if loader is MISSING:
        raise SetupError("no training dataloader could be derived: define fixture dlcheck_dataloader")
    want = n or _n_batches(ctx)
    got = ctx.memo(loader, f"training:batches:{want}", lambda: draw_batches(loader, want))
    if not got:
        raise SetupError("the training dataloader yielded no batch")
    return got


def eval_batches(ctx: Any, setup: Any) -> list[Any] | None:
    loader = ctx.role("eval_dataloader")
    if loader is MISSING:
        return None
    want = _n_batches(ctx)
    return ctx.memo(loader, f"training:batches:{want}", lambda: draw_batches(loader, want)) or None


def _n_batches(ctx: Any) -> int:
    return max(1, math.ceil(ctx.samples / max(1, ctx.batch_size)))


def root_cause(exc: BaseException) -> str | None:
    """Root cause first: a skip reason naming the check that explains what a model or trainer raised on
    the sampled batches (the VLM's image tokens cut or mismatched: X4), or None."""
    from . import vlm

    text = str(exc)
    if vlm.PLACEHOLDERS_TRUNCATED in text:
        return "the model cannot run on the sampled batches: truncation cuts the image tokens (see X4)"
    if vlm.is_feature_mismatch(exc):
        return "the model cannot run on the sampled batches: the image placeholder tokens do not match the image features (see X4)"
    return None


def run_or_skip(ctx: Any, make: Callable[[], Any]) -> Any:
    """Run a piece of machinery; a :class:`SetupError` (the training cannot be run the way the check
    needs) becomes a skip with its reason, and so does a user error another check explains (root_cause)."""
    try:
        return make()
    except SetupError as exc:
        ctx.skip(str(exc))
    except Exception as exc:  # a RoleError, or a library's own error from a Trainer's compute_loss
        reason = root_cause(exc)
        if reason is None:
            raise
        ctx.skip(reason)


def memo_or_skip(ctx: Any, sources: Any, key: str, make: Callable[[], Any]) -> Any:
    """``ctx.memo`` that remembers a SetupError too (so every check sharing the work skips with it)."""

    def capture() -> Any:
        try:
            return make()
        except SetupError as exc:
            return exc
        except Exception as exc:  # a RoleError, or a library's own error from a Trainer's compute_loss
            reason = root_cause(exc)
            if reason is None:
                raise
            return SetupError(reason)

    value = ctx.memo(sources, key, capture)
    if isinstance(value, SetupError):
        ctx.skip(str(value))
    return value


# --------------------------------------------------------------------------------------------------
# probes: a model, its loss and sample batches, for the checks that need no training run


def find_setup(ctx: Any) -> Any:
    """Like :func:`get_setup`, but None instead of a skip when the user gave no training."""
    if ctx.has("trainer") and is_hf_trainer(ctx.role("trainer")) or ctx.has("make_training") or ctx.has("lightning_module"):
        return get_setup(ctx)
    return None


def probe(ctx: Any) -> tuple[Fresh, list[Any], Any]:
    """(fresh objects, sample batches, setup or None). Without a training setup, the user's own
    ``dlcheck_model`` is used as it is, for forward/autograd-only measurements that leave no trace
    (``torch.autograd.grad`` fills no ``.grad``; train/eval flags are restored by the caller)."""
    setup = find_setup(ctx)
    if setup is not None:
        fresh = memo_or_skip(ctx, setup.sources, "training:fresh-probe", setup.fresh)
        return fresh, run_or_skip(ctx, lambda: training_batches(ctx, setup)), setup
    model, loader = ctx.require("model", "dataloader")
    if not isinstance(model, torch.nn.Module):
        ctx.skip(f"dlcheck_model is a {type(model).__name__}, not a torch.nn.Module")

    def loss(batch: Any) -> torch.Tensor:
        batch = to_device(batch, device_of(model))
        if not isinstance(batch, Mapping):
            raise SetupError("the batches are (inputs, targets): define fixture dlcheck_make_training (and "
                             "dlcheck_compute_loss) so the loss can be computed")
        from .plugin import user_call

        return loss_tensor(user_call("model", model_call(model, batch)))

    batches = run_or_skip(ctx, lambda: ctx.memo(loader, f"training:batches:{_n_batches(ctx)}",
                                                 lambda: draw_batches(loader, _n_batches(ctx))))
    if not batches:
        ctx.skip("dlcheck_dataloader yielded no batch")
    return Fresh(model, loss, lambda: (None, None), owner=None), batches, None


@contextlib.contextmanager
def modes(model: Any, train: bool) -> Iterator[Any]:
    """Put the model in train or eval mode, restoring every submodule's own flag afterwards."""
    saved = [(m, m.training) for m in model.modules()]
    model.train(train)
    try:
        yield model
    finally:
        for m, flag in saved:
            m.training = flag


def decode_example(ctx: Any, batch: Any, row: int = 0, limit: int = 120) -> str | None:
    """The row of a batch as text (token batches and a tokenizer) or as its shape, for evidence lines."""
    ids = batch.get("input_ids") if isinstance(batch, Mapping) else None
    tok = ctx.role("tokenizer")
    if isinstance(ids, torch.Tensor) and tok is not MISSING:
        try:
            mask = batch.get("attention_mask")
            row_ids = ids[row][mask[row].bool()] if isinstance(mask, torch.Tensor) else ids[row]
            text = tok.decode(row_ids.tolist())
        except Exception:  # noqa: BLE001 - a processor without decode: fall back to shapes
            text = None
        if text is not None:
            return repr(text if len(text) <= limit else text[:limit] + "…")
    return describe_batch(batch)


def describe_batch(batch: Any) -> str:
    def one(v: Any) -> str:
        if isinstance(v, torch.Tensor):
            return f"{v.dtype} {tuple(v.shape)}".replace("torch.", "")
        return type(v).__name__

    if isinstance(batch, Mapping):
        return "{" + ", ".join(f"{k}: {one(v)}" for k, v in batch.items()) + "}"
    if isinstance(batch, (list, tuple)):
        return "(" + ", ".join(one(v) for v in batch) + ")"
    return one(batch)


# --------------------------------------------------------------------------------------------------
# the smoke run shared by S1-S5


@dataclass
class SmokeRun:
    setup: Any
    trajectory: Trajectory
    trained: Fresh
    steps: int


def smoke_steps(ctx: Any) -> int:
    """The length of the shared smoke run: the setting ``S1.steps`` (it sets every smoke check's run)."""
    from .registry import load_checks

    return int(ctx.state.setting(load_checks()["S1"], "steps"))


def smoke_run(ctx: Any) -> SmokeRun:
    setup = get_setup(ctx)
    steps = smoke_steps(ctx)

    def make() -> SmokeRun:
        traj, trained = setup.smoke(steps)
        return SmokeRun(setup, traj, trained, steps)

    return memo_or_skip(ctx, setup.sources, f"smoke:{steps}", make)


def mean_loss(fresh: Fresh, batches: list[Any]) -> float | None:
    """Mean eval-mode loss of ``fresh`` over ``batches`` (no gradients, modes restored)."""
    values = []
    with modes(fresh.model, train=False), torch.no_grad():
        for batch in batches:
            try:
                values.append(float(fresh.loss(batch)))
            except SetupError:
                return None
    finite = [v for v in values if math.isfinite(v)]
    return sum(finite) / len(finite) if finite else None


def show_losses(traj: Trajectory, upto: int | None = None, last: int = 6) -> str:
    pairs = [(s, v) for s, v in traj.losses() if upto is None or s <= upto]
    shown = pairs[-last:]
    return ", ".join(f"{s}: {v:.4g}" for s, v in shown) or "none logged"


# --------------------------------------------------------------------------------------------------
# what a checkpoint holds


CHECKPOINT_SUFFIXES = (".pt", ".pth", ".bin", ".ckpt", ".safetensors", ".tar")


def read_saved(path: Path) -> list[tuple[str, Any]]:
    """(where, mapping of str -> tensor) for every state dict found in the file(s) at ``path``: a file, or
    the checkpoint files of a directory; nested dicts are searched a few levels deep."""
    path = Path(path)
    if path.is_file():
        files = [path]
    elif path.is_dir():
        files = sorted(p for p in path.rglob("*") if p.is_file() and p.suffix in CHECKPOINT_SUFFIXES)
    else:  # the save function appended its own suffix
        files = sorted(p for p in path.parent.glob(path.name + "*") if p.is_file())
    found: list[tuple[str, Any]] = []
    for f in files:
        rel = f.name
        if f.suffix == ".safetensors":
            from safetensors import safe_open

            with safe_open(str(f), framework="pt") as handle:
                found.append((rel, dict.fromkeys(handle.keys())))
            continue
        try:
            obj = torch.load(f, map_location="cpu", weights_only=False)
        except Exception:  # noqa: BLE001 - not a torch file: nothing to read there
            continue
        _collect_state_dicts(obj, rel, found, depth=0)
    return found


def _collect_state_dicts(obj: Any, where: str, out: list[tuple[str, Any]], depth: int) -> None:
    if isinstance(obj, torch.nn.Module):
        out.append((where, obj.state_dict()))
        return
    if not isinstance(obj, Mapping) or depth > 4:
        return
    tensors = {k: v for k, v in obj.items() if isinstance(k, str) and isinstance(v, torch.Tensor)}
    if tensors and len(tensors) == len(obj) and len(tensors) > 1:
        out.append((where, tensors))
        return
    for key, value in obj.items():
        _collect_state_dicts(value, f"{where}['{key}']", out, depth + 1)


WRAPPERS = {"OptimizedModule": "_orig_mod", "DistributedDataParallel": "module", "DataParallel": "module",
            "FullyShardedDataParallel": "_fsdp_wrapped_module"}


def unwrapped_keys(model: Any) -> set[str]:
    """The model's state-dict keys as the unwrapped model has them (no torch.compile / DDP segments)."""
    keys = set(model.state_dict().keys())
    segments = []
    for name, mod in model.named_modules():
        attr = WRAPPERS.get(type(mod).__name__)
        if attr:
            segments.append(f"{name}.{attr}." if name else f"{attr}.")
    out = set()
    for key in keys:
        for seg in segments:
            if seg in key and (key.startswith(seg) or f".{seg}" in key):
                head, _, tail = key.partition(seg)
                key = head + tail
        out.add(key)
    return out


def strip_wrapper_prefix(key: str, clean: set[str]) -> str | None:
    """The clean key a saved key maps to once a wrapper segment is dropped, or None."""
    for attr in set(WRAPPERS.values()):
        seg = attr + "."
        start = 0
        while True:
            at = key.find(seg, start)
            if at < 0:
                break
            if at == 0 or key[at - 1] == ".":
                candidate = key[:at] + key[at + len(seg):]
                if candidate in clean:
                    return candidate
                deeper = strip_wrapper_prefix(candidate, clean)
                if deeper:
                    return deeper
            start = at + 1
    return None


# --------------------------------------------------------------------------------------------------
# interrupting a save (C2)


class SaveInterrupted(BaseException):
    """Raised by dlcheck in the middle of a save, as a kill would stop it (a BaseException, so a user's
    ``except Exception`` does not swallow it)."""


@contextlib.contextmanager
def interrupted_saves(armed: Callable[[], bool] = lambda: True) -> Iterator[list[str]]:
    """While active (and ``armed()``), ``torch.save`` and safetensors' ``save_file`` write the first half of
    what they would write to their target, then raise :class:`SaveInterrupted`. Yields the list of
    interrupted targets."""
    import io
    import os

    import torch.serialization

    hits: list[str] = []
    real_save = torch.save

    def half(target: Any, data: bytes) -> None:
        if isinstance(target, (str, os.PathLike)):
            with open(target, "wb") as fh:
                fh.write(data[: len(data) // 2])
        else:
            target.write(data[: len(data) // 2])

    def save(obj: Any, f: Any, *args: Any, **kwargs: Any) -> None:
        if not armed():
            return real_save(obj, f, *args, **kwargs)
        buf = io.BytesIO()
        real_save(obj, buf, *args, **kwargs)
        half(f, buf.getvalue())
        hits.append(str(f) if isinstance(f, (str, os.PathLike)) else type(f).__name__)
        raise SaveInterrupted(hits[-1])

    patches = [(torch, "save", save), (torch.serialization, "save", save)]
    try:
        import safetensors.torch as st

        real_file = st.save_file

        def save_file(tensors: Any, filename: Any, metadata: Any = None) -> None:
            if not armed():
                return real_file(tensors, filename, metadata=metadata)
            half(filename, st.save(tensors, metadata=metadata))
            hits.append(str(filename))
            raise SaveInterrupted(str(filename))

        patches.append((st, "save_file", save_file))
    except ImportError:
        pass
    saved = [(owner, name, getattr(owner, name)) for owner, name, _ in patches]
    for owner, name, value in patches:
        setattr(owner, name, value)
    try:
        yield hits
    finally:
        for owner, name, value in saved:
            setattr(owner, name, value)


@dataclass
class InterruptedSave:
    how: str
    #: what was interrupted (the file being written)
    target: str
    #: the checkpoint that must still load, and the error loading it raised (None when it loaded)
    previous: str
    error: str | None
    #: when it loaded: "previous", "new" or "mixed" weights
    loaded: str | None = None
    sizes: str = ""


def _same_weights(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> bool:
    return a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)


def loop_interrupted_save(setup: LoopSetup) -> InterruptedSave:
    """Save a checkpoint, train a step, save again to the same path and interrupt that save half way; then
    load the path into fresh objects with the user's load function."""
    from .plugin import user_call

    if setup.save is MISSING or setup.load is MISSING:
        raise SetupError("missing role: define fixtures dlcheck_save_checkpoint and dlcheck_load_checkpoint in conftest.py")
    path = setup.tmp.mktemp("dlcheck-atomic") / "checkpoint"
    first = setup.state()
    user_call("save_checkpoint", lambda: setup.save(first, str(path)))
    old_weights = {k: v.detach().clone() for k, v in first["model"].state_dict().items()}
    sizes = {p.name: p.stat().st_size for p in ([path] if path.is_file() else path.parent.glob(path.name + "*"))
             if p.is_file()}
    second = setup.state()
    with preserved_rng():
        setup.run(second, setup.batches(1), 0, Trajectory())
    new_weights = {k: v.detach().clone() for k, v in second["model"].state_dict().items()}
    with interrupted_saves() as hits:
        try:
            user_call("save_checkpoint", lambda: setup.save(second, str(path)))
        except SaveInterrupted:
            pass
    if not hits:
        raise SetupError("dlcheck_save_checkpoint does not write through torch.save or safetensors' save_file: it "
                         "cannot be interrupted half way")
    after = {p.name: p.stat().st_size for p in ([path] if path.is_file() else path.parent.glob(path.name + "*"))
             if p.is_file()}
    size_text = "; ".join(f"{n}: {sizes.get(n, 0)} -> {after.get(n, 0)} bytes" for n in sorted(set(sizes) | set(after)))
    third = setup.state()
    try:
        with preserved_rng():
            setup.load(third, str(path))
    except SaveInterrupted:
        raise
    except Exception as exc:  # noqa: BLE001 - the user's load failing is the finding
        return InterruptedSave("dlcheck_save_checkpoint", hits[0], str(path), f"{type(exc).__name__}: {str(exc).splitlines()[0][:200]}",
                               sizes=size_text)
    loaded = {k: v.detach() for k, v in third["model"].state_dict().items()}
    which = "previous" if _same_weights(loaded, old_weights) else "new" if _same_weights(loaded, new_weights) else "mixed"
    return InterruptedSave("dlcheck_save_checkpoint", hits[0], str(path), None, which, size_text)


def trainer_interrupted_save(setup: TrainerSetup) -> InterruptedSave:
    """Checkpoint after steps 1 and 2; the second save is interrupted half way; a fresh clone must resume
    from checkpoint-1."""
    from transformers import TrainerCallback

    clone = setup.clone("atomic", max_steps=2, save_strategy="steps", save_steps=1, save_total_limit=None)
    arm = {"on": False}

    class Arm(TrainerCallback):
        def on_step_end(self, args, state, control, **kw):
            arm["on"] = state.global_step == 2

    clone.add_callback(Arm())
    with interrupted_saves(lambda: arm["on"]) as hits, _quiet():
        try:
            clone.train()
        except SaveInterrupted:
            pass
    out = Path(clone.args.output_dir)
    previous = out / "checkpoint-1"
    if not hits or not previous.is_dir():
        raise SetupError("the Trainer's second checkpoint was not written through torch.save/safetensors: it cannot be interrupted")
    resume = setup.clone("atomic-resume", max_steps=2)
    try:
        with _quiet():
            resume.train(resume_from_checkpoint=str(previous))
    except Exception as exc:  # noqa: BLE001 - the resume failing is the finding
        return InterruptedSave("the Trainer's checkpoint-* directories", hits[0], str(previous),
                               f"{type(exc).__name__}: {str(exc).splitlines()[0][:200]}")
    return InterruptedSave("the Trainer's checkpoint-* directories", hits[0], str(previous), None, "previous")


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
            setup._fit(module, dm, [Arm(), ModelCheckpoint(dirpath=str(ckdir), every_n_train_steps=1, save_top_k=-1)],
                       max_steps=2)
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
