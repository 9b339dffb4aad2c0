"""Kind 1: a transformers / TRL ``Trainer``. Runs go through a clone of it (same class, arguments,
datasets, collator and callbacks, around a fresh copy of the model), so the real ``train()`` loop,
checkpoint-* directories and ``resume_from_checkpoint`` are exercised."""

from __future__ import annotations

import contextlib
import copy
import inspect
import math
import warnings
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import torch

from ..session import collect_freed, user_call
from .resume import (
    Baseline,
    InterruptedSave,
    ResumeLoadFailed,
    ResumeRun,
    SaveInterrupted,
    epoch_save_point,
    interrupted_saves,
    load_reports,
    put_back_rng,
    raised_loading,
    read_saved,
)
from .runs import (
    Fresh,
    OnDisk,
    SetupError,
    Trajectory,
    as_float,
    digest,
    example_digests,
    fresh_modules,
    generation_cycle,
    grad_report,
    is_grpo,
    labels_restore,
    nonfinite_params,
    own_batch,
    preference_loss,
    release_training_memory,
    rng_state,
)

# --------------------------------------------------------------------------------------------------
# kind 1: a transformers / TRL Trainer


_FRAMEWORK_CALLBACKS = ("transformers.", "trl.", "accelerate.")


class TrainerSetup:
    kind = "trainer"

    def interrupted_save(self) -> InterruptedSave:
        """A checkpoint saved over an earlier one and interrupted half way (C2)."""
        return trainer_interrupted_save(self)

    def __init__(self, trainer: Any, tmp: Any):
        self.trainer = trainer
        self.tmp = tmp
        #: lets the session's spares go (the probe clone, the smoke run's trained model): get_setup sets it
        self.make_room: Any = lambda: None
        self.name = type(trainer).__name__
        # DPO pairs chosen and rejected inside its step (the dist domain does not launch it yet); KTO's
        # unpaired batches launch as a Trainer's do
        self.preference = preference_loss(trainer) == "dpo"
        # a trainer that generates its completions inside the step (GRPO, RLOO): its loss is judged on batches of
        # its own train dataloader, and C1 runs its own resume, saved where its generation cycle asks
        self.generates = is_grpo(trainer)
        # GRPOTrainer itself (the dist domain does not launch it yet)
        self.grpo = any(c.__name__ == "GRPOTrainer" for c in type(trainer).__mro__)

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

        self.make_room()  # no copy kept for other checks lives beside the one this clone trains
        collect_freed()  # an earlier clone is held in a cycle (its callbacks refer to it): its tensors go now
        tr = self.trainer
        ref = getattr(tr, "ref_model", None)
        models = fresh_modules([tr.model] + ([ref] if ref is not None else []))
        out = self.tmp.mktemp(f"dlcheck-{tag}")
        base = dict(
            output_dir=str(out),
            report_to="none",
            push_to_hub=False,
            disable_tqdm=True,
            logging_strategy="steps",  # every step's loss and grad_norm, whatever the user's cadence (epoch, no)
            logging_steps=1,
            logging_nan_inf_filter=False,
            eval_strategy="no",
            save_strategy="no",
            load_best_model_at_end=False,
            hub_token=None,
        )
        base.update(overrides)
        args = clone_args(tr.args, base)
        opt, sched = self._rebuild_optimizers(models[0])
        values = {
            "model": models[0],
            "ref_model": models[1] if ref is not None else None,
            "args": args,
            "data_collator": tr.data_collator,
            "train_dataset": tr.train_dataset,
            "eval_dataset": tr.eval_dataset,
            "processing_class": getattr(tr, "processing_class", None),
            "compute_metrics": tr.compute_metrics,
            "callbacks": self._user_callbacks(),
            "optimizers": (opt, sched),
            "peft_config": None,
            "formatting_func": None,
        }
        if getattr(tr, "padding_free", False):
            values["data_collator"] = None  # TRL makes its own in padding-free mode (and refuses one passed in)
        cls = type(tr)
        kwargs = {}
        for name in _init_parameters(cls):
            if name in values:
                kwargs[name] = values[name]
            elif hasattr(tr, name):
                kwargs[name] = getattr(tr, name)
        # a model the user named by a hub id or path is an instance on the Trainer: its *_init_kwargs (TRL's
        # model_init_kwargs, teacher_model_init_kwargs, ref_model_init_kwargs) applied when the Trainer loaded it, and
        # TRL refuses them beside an instance (GKDTrainer: "your teacher_model is already instantiated")
        loaded = {
            f"{name}_init_kwargs": None
            for name in ("model", "ref_model", "teacher_model")
            if getattr(args, f"{name}_init_kwargs", None) is not None and hasattr(kwargs.get(name), "parameters")
        }
        if loaded and "args" in kwargs:
            kwargs["args"] = clone_args(tr.args, {**base, **loaded})
        # the datasets are already prepared (tokenized, packed): TRL must not prepare them again
        attrs = {"_prepare_dataset": lambda self, dataset, *a, **k: dataset} if hasattr(cls, "_prepare_dataset") else {}
        clone_cls = type(cls.__name__, (cls,), attrs)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            # the copy is built by pytest-dlcheck from the Trainer's attributes: a constructor that refuses them
            # is ours to fix, not the user's Trainer raising
            clone = user_call(
                "trainer",
                lambda: clone_cls(**kwargs),
                synthetic=f"a copy of your {cls.__name__} built by pytest-dlcheck from its attributes",
            )
        for cb in (PrinterCallback, ProgressCallback):
            clone.remove_callback(cb)
        return clone

    def _user_callbacks(self) -> list[Any]:
        own = [
            cb
            for cb in self.trainer.callback_handler.callbacks
            if not type(cb).__module__.startswith(_FRAMEWORK_CALLBACKS)
        ]
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
        dropped = object()  # a real parameter the fresh model lacks (--dlcheck-twin: layers the twin has not)
        memo = {id(p): by_name.get(n, dropped) for n, p in self.trainer.model.named_parameters()}
        new_opt = copy.deepcopy(opt, memo)
        for group in new_opt.param_groups:
            group["params"] = [p for p in group["params"] if p is not dropped]
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

    @property
    def own_loader(self) -> bool:
        """Whether the Trainer's class builds its own train dataloader (TRL's GRPOTrainer and RLOOTrainer batch
        ``per_device_train_batch_size`` × ``steps_per_generation`` rows, a generation batch its step splits): the
        batches its ``training_step`` receives are then that loader's, drawn through a clone's
        ``get_train_dataloader()``, not a plain loader's over its collator and dataset."""
        from transformers import Trainer

        # only for a trainer that generates inside its step: another subclass's loader may do work of its own when
        # built (an older DPOTrainer's precompute_ref_log_probs passes over the whole train set)
        return self.generates and type(self.trainer).get_train_dataloader is not Trainer.get_train_dataloader

    def fresh(self) -> Fresh:
        clone = self.clone("fresh")
        if self.generates:
            return self._generating_fresh(clone)

        def loss(batch: Any) -> torch.Tensor:
            inputs = clone._prepare_inputs(own_batch(batch))  # a batch of its own, as the Trainer's loader gives
            if not _holds_tensor(inputs):
                raise SetupError(self._no_model_inputs(inputs))
            with clone.compute_loss_context_manager():
                return clone.compute_loss(clone.model, inputs)

        def make_optimizer() -> tuple[Any, Any]:
            if self.trainer.optimizer is not None:  # passed in optimizers=(...): rebuilt over the clone's model
                return self._rebuild_optimizers(clone.model)
            clone.optimizer = None
            return clone.create_optimizer(), None

        return Fresh(clone.model, loss, make_optimizer, owner=clone)

    def _no_model_inputs(self, inputs: Any) -> str:
        """Why the loss of a batch is not judged when the trainer's batches hold no tensor (TRL's online DPO
        trainer batches prompt strings and generates the model's inputs inside its own training_step)."""
        from transformers import Trainer

        keys = (
            ", ".join(f"{k}: {type(v).__name__}" for k, v in list(inputs.items())[:4])
            if isinstance(inputs, dict)
            else type(inputs).__name__
        )
        own_step = type(self.trainer).training_step is not Trainer.training_step
        return (
            f"the batches of {self.name}'s train dataloader hold no tensor ({keys}): {self.name} builds the model's "
            "inputs inside its own training step"
            + (f" ({type(self.trainer).__name__} overrides Trainer.training_step)" if own_step else "")
            + ", so a loss of the batch as given is not what it trains on, and is not judged"
        )

    def _generating_fresh(self, clone: Any) -> Fresh:
        """Fresh objects of a trainer that generates its completions inside the step (GRPO, RLOO): the loss on a
        batch of its own train dataloader (a generation batch) is its ``_prepare_inputs`` — completions generated
        once per batch, from the RNGs seeded the same way, and kept as the trainer keeps its generation buffer
        across the steps of a cycle — then its ``compute_loss`` on the first slice, as its first step trains."""
        from ..guard import preserved_rng
        from .runs import SEED, seed_all

        prepared: dict[int, tuple[Any, Any]] = {}
        if not hasattr(clone, "current_gradient_accumulation_steps"):
            # set by train() for each accumulation window (its loss normalises by it): a full window, as most are
            clone.current_gradient_accumulation_steps = max(1, int(clone.args.gradient_accumulation_steps or 1))

        def inputs_of(batch: Any) -> Any:
            if id(batch) not in prepared:
                with preserved_rng(), torch.no_grad():
                    seed_all(SEED)
                    clone._step, clone._buffered_inputs = 0, None
                    was = clone.model.training
                    clone.model.train()  # the training's split of the generation batch, not evaluation's
                    try:
                        prepared[id(batch)] = (batch, clone._prepare_inputs(own_batch(batch)))
                    finally:
                        clone.model.train(was)
                        clone._step, clone._buffered_inputs = 0, None
            return prepared[id(batch)][1]

        def loss(batch: Any) -> torch.Tensor:
            inputs = inputs_of(batch)
            with clone.compute_loss_context_manager():
                return clone.compute_loss(clone.model, inputs)

        def why_constant(batch: Any) -> str | None:
            adv = inputs_of(batch).get("advantages") if isinstance(inputs_of(batch), dict) else None
            if isinstance(adv, torch.Tensor) and adv.numel() and not bool(adv.any()):
                return (
                    f"every advantage of the {adv.shape[0]} completions {self.name} trains first from batch 0 (the "
                    "first slice of its generation batch) is 0 (the rewards are equal within each group): its policy "
                    "loss is constant in the weights by construction, so a gradient of 0 says nothing"
                )
            return None

        def make_optimizer() -> tuple[Any, Any]:
            if self.trainer.optimizer is not None:
                return self._rebuild_optimizers(clone.model)
            clone.optimizer = None
            return clone.create_optimizer(), None

        return Fresh(clone.model, loss, make_optimizer, owner=clone, why_constant=why_constant)

    def own_batches(self, n: int, owner: Any = None) -> list[Any]:
        """The first ``n`` batches of the Trainer's own ``get_train_dataloader()`` (:attr:`own_loader`), built on
        ``owner`` (a clone: the user's Trainer gets no accelerate-prepared loader registered on it)."""
        from .runs import draw_batches

        clone = owner if owner is not None else self.clone("batches")
        with _quiet():
            loader = clone.get_train_dataloader()
        return draw_batches(loader, n)

    # ---- runs -----------------------------------------------------------------------------------------

    def _recorder(self, traj: Trajectory, digests: bool = False, digest_after: int = 0):
        from transformers import TrainerCallback

        class Record(TrainerCallback):
            def __init__(self) -> None:
                self.params: list = []

            def on_pre_optimizer_step(self, args, state, control, model=None, **kw):
                if model is not None and not self.params:
                    self.params = [(n, p) for n, p in model.named_parameters() if p.requires_grad]
                rec = traj.record(state.global_step + 1)
                norm, rec.nonfinite_grads = grad_report(self.params)
                clip = as_float(getattr(args, "max_grad_norm", None)) or 0
                if clip > 0:
                    # the Trainer clipped before this hook: the norm before its clipping comes with its log
                    rec.step_norm = norm
                    traj.notes.setdefault(
                        "step_norm_why",
                        f"the Trainer clips at max_grad_norm={clip:g} before its optimizer step and logs the norm "
                        "before clipping (grad_norm) only at the steps it logs",
                    )
                else:
                    rec.grad_norm = norm

            def on_optimizer_step(self, args, state, control, **kw):
                traj.calls.append("opt")
                bad = nonfinite_params(self.params)
                if bad:
                    traj.record(state.global_step + 1).nonfinite_params = bad

            def on_step_end(self, args, state, control, model=None, **kw):
                if digests and model is not None and state.global_step > digest_after:
                    traj.digests.append((state.global_step, digest(model)))

            def on_log(self, args, state, control, logs=None, **kw):
                logs = logs or {}
                if "loss" not in logs:
                    return
                rec = traj.record(state.global_step)
                rec.loss = as_float(logs["loss"])
                rec.lr = as_float(logs.get("learning_rate", rec.lr))
                if logs.get("grad_norm") is not None:
                    # the Trainer logs the norm before its clipping (what clip_grad_norm_ returned) of the step it
                    # logs at; the hook before the optimizer step read the gradients after it. A step it does not
                    # log keeps only that (step_norm): never compared with norms before clipping
                    at_step = rec.step_norm if rec.step_norm is not None else rec.grad_norm
                    rec.grad_norm, rec.step_norm = as_float(logs["grad_norm"]), None
                    if at_step is not None and rec.grad_norm is not None and at_step < rec.grad_norm * (1 - 1e-3):
                        rec.clipped_norm = at_step
                rec.metrics = {
                    k: as_float(v) for k, v in logs.items() if k not in ("loss", "learning_rate", "grad_norm", "epoch")
                }

        return Record()

    def saved_state(self) -> tuple[Any, list[tuple[str, Any]], str]:
        """(the model, the state dicts found in what the Trainer saves, how it was saved)."""
        return _trainer_saved(self)

    def smoke(
        self, steps: int, save_from: int | None = None, max_micro: int | None = None
    ) -> tuple[Trajectory, Fresh, Baseline | None]:
        """The shared smoke run of ``steps`` optimizer steps (``max_steps``; fewer when that many under the
        Trainer's gradient accumulation would take more than ``max_micro`` micro-batches); with ``save_from``,
        C1's uninterrupted baseline too: the Trainer writes its checkpoint-``save_from`` directory (a save
        that raises leaves no baseline and the run goes on: C1 then runs its own and reports it)."""
        accum = max(1, int(getattr(self.trainer.args, "gradient_accumulation_steps", 1) or 1))
        if max_micro:
            steps = min(steps, max(1, max_micro // accum))
        clone = self.clone("smoke", max_steps=steps)
        traj = Trajectory()
        _record_examples(clone, traj)
        clone.add_callback(self._recorder(traj, digests=bool(save_from), digest_after=save_from or 0))
        traj.notes["optimizer"] = None
        saving = _BaselineSave(clone, save_from, tolerant=True) if save_from and save_from < steps else None
        with _quiet():
            clone.train()
        baseline = saving.baseline(traj) if saving is not None else None
        traj.notes["opt_steps"] = clone.state.global_step
        traj.notes["micro_steps"] = clone.state.global_step * accum
        traj.notes["optimizer"] = clone.optimizer
        traj.notes["scheduler"] = clone.lr_scheduler
        # its readers want the trajectory, the trained weights and the optimizer's settings: the gradients and
        # the moments (two copies of the weights under Adam) need not live for the whole session
        release_training_memory({"model": clone.model, "optimizer": clone.optimizer})
        fresh = Fresh(
            clone.model, lambda b: _trainer_loss(clone, b), lambda: (clone.optimizer, clone.lr_scheduler), owner=clone
        )
        return traj, fresh, baseline

    @property
    def smoke_baseline(self) -> bool:
        """Whether the smoke run can save for C1 and be its uninterrupted baseline (``smoke(steps, save_from)``):
        not for a trainer that generates its completions inside the step (GRPO, RLOO), whose resumes late in a run
        were seen not to reproduce it bitwise, and whose save must sit where its generation cycle asks (C1's own
        run, :meth:`resume_plan`)."""
        return not self.generates

    def can_resume(self) -> bool:
        return True

    def resume_plan(self, total: int) -> tuple[int, int, list[str], bool]:
        """(steps of C1's own uninterrupted run, the optimizer step after which it saves, lines saying why there,
        whether that save is inside the trainer's generation cycle). Half way by default. A trainer that keeps
        its generated completions in a buffer across a cycle of steps (:func:`generation_cycle`; the checkpoint
        does not hold the buffer) is saved where your own save cadence puts a save in that cycle: at a cycle
        boundary when your ``save_steps`` is a multiple of the cycle (or you save at epoch ends, or not at all),
        at the same place inside it when it is not; the run then goes on as many steps past the save as half of
        ``total``."""
        k = max(1, total // 2)
        cycle = generation_cycle(self.trainer)
        lines: list[str] = []
        inside = False
        if cycle is not None:
            steps, micro = cycle
            args = self.trainer.args
            strategy = str(getattr(getattr(args, "save_strategy", None), "value", args.save_strategy))
            every = getattr(args, "save_steps", None)
            if strategy == "steps" and isinstance(every, float) and every < 1:
                every = math.ceil(args.max_steps * every) if args.max_steps and args.max_steps > 0 else None
            every = int(every) if strategy == "steps" and every else None
            phase = every % steps if every else 0
            resumed = max(1, total - k)
            k = k + (phase - k) % steps
            total = k + resumed
            accum = max(1, int(getattr(args, "gradient_accumulation_steps", 1) or 1))
            lines.append(
                f"{self.name} generates completions once every {steps} optimizer steps ({micro} training steps: "
                f"steps_per_generation x num_iterations, gradient accumulation {accum}) and keeps them in a buffer "
                "the checkpoint does not hold"
            )
            if phase:
                inside = True
                lines.append(
                    f"your save_steps={every} is not a multiple of {steps}: your run saves {phase} step(s) into a "
                    f"generation cycle, so the check saved after step {k}, at the same place in the cycle"
                )
            else:
                lines.append(
                    f"your save_steps={every} is a multiple of {steps}: your run saves at a cycle boundary, so the "
                    f"check saved after step {k}, at one too"
                    if every
                    else f"your save_strategy is '{strategy}' (no save_steps cadence): the check saved after step {k}, "
                    "at a cycle boundary"
                )
        else:
            point = self.save_point(total, k)
            k, lines = point.at, list(point.lines)
        self.__dict__.setdefault("_save_at", {})[total] = k
        return total, k, lines, inside

    def epoch_steps(self) -> int | None:
        """Optimizer steps in an epoch of the user's training data, as the Trainer counts them in one process
        (batches of ``train_batch_size``, ``dataloader_drop_last``, then ``ceil(batches / gradient accumulation)``);
        None when the dataset has no length (an IterableDataset), and for a trainer that builds its own train
        dataloader (GRPO, RLOO: a generation batch its step splits over several optimizer steps, whose buffered
        completions a checkpoint does not hold): its epochs are not the dataset's in batches of train_batch_size."""
        args, data = self.trainer.args, self.trainer.train_dataset
        if data is None or isinstance(data, torch.utils.data.IterableDataset) or self.own_loader:
            return None
        try:
            n = len(data)
        except TypeError:
            return None
        size = max(1, int(getattr(args, "train_batch_size", 0) or args.per_device_train_batch_size or 1))
        batches = n // size if args.dataloader_drop_last else math.ceil(n / size)
        accum = max(1, int(getattr(args, "gradient_accumulation_steps", 1) or 1))
        return max(1, math.ceil(batches / accum)) if batches else None

    def save_point(self, total: int, k: int) -> Any:
        """Where C1's run of ``total`` steps planned to save after step ``k`` saves (:func:`epoch_save_point`): in
        the middle of an epoch after the first when the run reaches one, at an epoch end when your save_strategy is
        'epoch' (your checkpoints are all there). Kept for the pass (``_save_point``)."""
        strategy = str(
            getattr(getattr(self.trainer.args, "save_strategy", None), "value", self.trainer.args.save_strategy)
        )
        at_ends = "your save_strategy='epoch' saves at epoch ends only" if strategy == "epoch" else None
        point = epoch_save_point(k, total, self.epoch_steps(), at_ends)
        self.__dict__["_save_point"] = point
        return point

    def resume(self, total: int, restore: frozenset[str] = frozenset(), baseline: Baseline | None = None) -> ResumeRun:
        """Train ``total`` steps saving at half way (the Trainer's own checkpoint-* directory; or take
        ``baseline``, the smoke run that saved), then a second clone resumes with ``resume_from_checkpoint``;
        ``restore`` names pieces put back from the uninterrupted run's truth after the Trainer's own loading
        (for the diagnosis)."""
        if baseline is not None:
            base, k = baseline, baseline.truth["_saved_at"]
        else:
            k = self.__dict__.get("_save_at", {}).get(total, max(1, total // 2))
            base = self._uninterrupted(total, k)
        clone = self.clone(
            "resume", max_steps=total, **({"ignore_data_skip": False} if "data position" in restore else {})
        )
        traj = Trajectory()
        _record_examples(clone, traj)
        clone.add_callback(self._recorder(traj, digests=True))
        truth = base.truth
        loads = _patch_trainer_restore(clone, truth, restore)
        with _quiet():
            try:
                clone.train(resume_from_checkpoint=str(base.checkpoint))
            except Exception as exc:
                if not raised_loading(exc):
                    raise
                # the Trainer's own resume refuses the checkpoint directory its own save wrote: C1's finding
                raise ResumeLoadFailed(
                    "trainer",
                    f"train(resume_from_checkpoint=...) raised {type(exc).__name__} loading "
                    f"{base.checkpoint.name}: " + " ".join(str(exc).split())[:600],
                    exc,
                    "train(resume_from_checkpoint=...)",
                    base.checkpoint,
                    k,
                ) from exc
        return ResumeRun(base.trajectory, traj, k, base.checkpoint, base.pieces, loads)

    def uninterrupted_again(self, total: int, saved_at: int) -> Trajectory:
        """The uninterrupted run once more, the same way (a new clone, the same save at step ``saved_at``):
        whether the run reproduces itself (C1 asks only when no piece put back makes the resumed run
        identical)."""
        clone = self.clone("again", max_steps=total)
        traj = Trajectory()
        _record_examples(clone, traj)
        clone.add_callback(self._recorder(traj, digests=True, digest_after=saved_at))
        _BaselineSave(clone, saved_at)
        with _quiet():
            clone.train()
        _let_go(clone)
        return traj

    def _uninterrupted(self, total: int, k: int) -> Baseline:
        key = (total, k)
        cache = self.__dict__.setdefault("_baselines", {})
        if key not in cache:
            clone = self.clone("run", max_steps=total)
            traj = Trajectory()
            _record_examples(clone, traj)
            clone.add_callback(self._recorder(traj, digests=True, digest_after=k))
            saving = _BaselineSave(clone, k)
            with _quiet():
                clone.train()
            baseline = saving.baseline(traj)
            if baseline is None:
                raise SetupError(f"the Trainer wrote no checkpoint-{k} directory after {k} steps")
            cache[key] = baseline
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


class _BaselineSave:
    """Makes a clone's run C1's uninterrupted baseline: after step ``k`` it keeps the state at that step on
    disk (the truth of C1's diagnostic resumes) and has the Trainer write its checkpoint-``k`` directory
    through its own save (``control.should_save``). ``tolerant`` (the shared smoke run, whose checks do not
    depend on C1's save): a save that raises is recorded and the run goes on, leaving no baseline."""

    def __init__(self, clone: Any, k: int, tolerant: bool = False):
        from transformers import TrainerCallback

        self.clone, self.k, self.truth, self.failed = clone, k, {}, None
        saving = self

        class Save(TrainerCallback):
            def on_step_end(self, args, state, control, **kw):
                if state.global_step != k or saving.failed is not None:
                    return
                try:
                    saving.truth.update(_trainer_truth(clone, Path(args.output_dir) / "truth.pt"))
                except Exception as exc:  # noqa: BLE001 - a state torch.save cannot write: no baseline
                    if not tolerant:
                        raise
                    saving.failed = exc
                    return
                control.should_save = True

            def on_save(self, args, state, control, **kw):
                # the RNG states as the Trainer's own save wrote them (rng_state.pth): after anything that
                # drew between the step's end and the save (an evaluation's dataloader, ...)
                if state.global_step == k and saving.failed is None and "rng" in saving.truth:
                    saving.truth["rng"] = rng_state()

        if tolerant:
            save_checkpoint = clone._save_checkpoint

            def guarded(*args: Any, **kwargs: Any) -> Any:
                try:
                    return save_checkpoint(*args, **kwargs)
                except Exception as exc:  # noqa: BLE001 - C1 runs its own baseline and reports the save's error
                    saving.failed = exc

            clone._save_checkpoint = guarded
        clone.add_callback(Save())

    def baseline(self, traj: Trajectory) -> Baseline | None:
        ckpt = Path(self.clone.args.output_dir) / f"checkpoint-{self.k}"
        if self.failed is not None or not self.truth or not ckpt.is_dir():
            return None
        self.truth["_saved_at"] = self.k
        return Baseline(traj, self.truth, ckpt, _trainer_pieces(self.clone, ckpt))


def _record_examples(clone: Any, traj: Trajectory) -> None:
    """Write down, per optimizer step, a content digest of each example the clone trains (every micro-batch
    its ``training_step`` is given): which examples a resumed epoch trains, against the uninterrupted one."""
    step = clone.training_step

    def training_step(model: Any, inputs: Any, *args: Any, **kwargs: Any) -> Any:
        found = example_digests(inputs, labels_restore(getattr(clone, "data_collator", None)))
        if found is not None:
            rec = traj.record(clone.state.global_step + 1)
            rec.examples = (rec.examples or []) + found
        return step(model, inputs, *args, **kwargs)

    clone.training_step = training_step


def _let_go(clone: Any) -> None:
    """A finished clone's gradients and optimizer moments dropped at once (its weights go with the clone): the
    next clone's training state is built beside no second one."""
    release_training_memory({"model": clone.model, "optimizer": clone.optimizer})
    clone.optimizer = clone.lr_scheduler = None


def _trainer_loss(clone: Any, batch: Any) -> torch.Tensor:
    inputs = clone._prepare_inputs(own_batch(batch))
    with clone.compute_loss_context_manager():
        return clone.compute_loss(clone.model, inputs)


def _trainer_truth(clone: Any, file: Path) -> dict[str, Any]:
    """The uninterrupted run's state at the save, for the diagnostic resumes: the model's, the optimizer's and
    the scheduler's state dicts written to ``file`` as they stand (no copy in memory: a clean resume never
    reads them), the RNG states (small) in memory."""
    heavy = {"model": clone.model.state_dict()}
    if clone.optimizer is not None:
        heavy["optimizer"] = clone.optimizer.state_dict()
    if clone.lr_scheduler is not None:
        heavy["lr_scheduler"] = clone.lr_scheduler.state_dict()
    torch.save(heavy, file)
    return {"rng": rng_state(), **{k: OnDisk(file, k) for k in heavy}}


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


def _patch_trainer_restore(clone: Any, truth: dict[str, Any], restore: frozenset[str]) -> list[str]:
    """After the Trainer loads its checkpoint, put back the named pieces from the uninterrupted run. Returns
    the list where what the Trainer's own loading of the weights reports (key mismatches) is written."""
    loads: list[str] = []
    truth = {k: (v.load() if isinstance(v, OnDisk) else v) for k, v in truth.items() if k in restore}
    load_opt, load_rng, load_model = (
        clone._load_optimizer_and_scheduler,
        clone._load_rng_state,
        clone._load_from_checkpoint,
    )

    def load_optimizer_and_scheduler(checkpoint):
        load_opt(checkpoint)
        if "optimizer" in restore and "optimizer" in truth:
            clone.optimizer.load_state_dict(copy.deepcopy(truth["optimizer"]))
        if "lr_scheduler" in restore and "lr_scheduler" in truth:
            clone.lr_scheduler.load_state_dict(copy.deepcopy(truth["lr_scheduler"]))

    def load_rng_state(checkpoint):
        load_rng(checkpoint)
        put_back_rng(truth, restore)

    def load_from_checkpoint(checkpoint, model=None):
        with load_reports() as found:
            load_model(checkpoint, model) if model is not None else load_model(checkpoint)
        loads.extend(found)
        if "model" in restore:
            clone.model.load_state_dict(truth["model"])

    clone._load_optimizer_and_scheduler = load_optimizer_and_scheduler
    clone._load_rng_state = load_rng_state
    clone._load_from_checkpoint = load_from_checkpoint
    return loads


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


def _control_resume(setup: TrainerSetup) -> None:
    """The control of an interrupted save: the same two checkpoints written with no interruption, and the
    resume from the first. When that fails too, the interruption is not what breaks the resume (C1 reports
    a failing resume): C2 cannot judge."""
    clone = setup.clone("atomic-control", max_steps=2, save_strategy="steps", save_steps=1, save_total_limit=None)
    with _quiet():
        clone.train()
    previous = Path(clone.args.output_dir) / "checkpoint-1"
    _let_go(clone)
    del clone  # its training state goes before the resuming clone builds its own
    resume = setup.clone("atomic-control-resume", max_steps=2)
    try:
        with _quiet():
            resume.train(resume_from_checkpoint=str(previous))
    except Exception as exc:  # noqa: BLE001 - the control failing is what C2 reports as undecidable
        raise SetupError(
            "cannot judge an interrupted save: resuming from checkpoint-1 fails with no interruption at all: "
            f"{type(exc).__name__}: {' '.join(str(exc).split())[:240]} (C1 reports the failing resume)"
        ) from None


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
    from transformers.trainer_utils import get_last_checkpoint

    # what the Trainer's own automatic resume takes now (resume_from_checkpoint=True, the example scripts' default)
    latest = get_last_checkpoint(str(out)) if out.is_dir() else None
    complete = None if latest is None else (Path(latest) / "trainer_state.json").is_file()
    _let_go(clone)
    del clone  # its training state goes before the resuming clone builds its own
    if not hits or not previous.is_dir():
        raise SetupError(
            "the Trainer's second checkpoint was not written through torch.save/safetensors: it cannot be interrupted"
        )
    resume = setup.clone("atomic-resume", max_steps=2)
    try:
        with _quiet():
            resume.train(resume_from_checkpoint=str(previous))
    except Exception as exc:  # noqa: BLE001 - the resume failing is the finding
        _control_resume(setup)
        return InterruptedSave(
            "the Trainer's checkpoint-* directories",
            hits[0],
            str(previous),
            f"{type(exc).__name__}: {str(exc).splitlines()[0][:200]}",
            latest=latest,
            latest_complete=complete,
        )
    return InterruptedSave(
        "the Trainer's checkpoint-* directories",
        hits[0],
        str(previous),
        None,
        "previous",
        latest=latest,
        latest_complete=complete,
    )


def _init_parameters(cls: type) -> list[str]:
    """The keyword parameters a Trainer class's constructor takes: its own, and — while a constructor passes
    ``**kwargs`` on to ``super().__init__`` (a ``QuestionAnsweringTrainer(*args, eval_examples=None,
    post_process_function=None, **kwargs)``) — those of the classes above it, down to the first that takes no
    ``**kwargs``, so that the clone gets its model and args by name."""
    names: list[str] = []
    for klass in cls.__mro__:
        init = klass.__dict__.get("__init__")
        if init is None:
            continue
        try:
            params = inspect.signature(init).parameters
        except (TypeError, ValueError):
            break
        for name, p in params.items():
            if name == "self" or p.kind in (inspect.Parameter.VAR_POSITIONAL, inspect.Parameter.VAR_KEYWORD):
                continue
            if name not in names:
                names.append(name)
        if not any(p.kind is inspect.Parameter.VAR_KEYWORD for p in params.values()):
            break
    return names


def _holds_tensor(value: Any, depth: int = 0) -> bool:
    """Whether a batch holds a tensor anywhere (a mapping, a sequence, a dataclass-like batch), to a bounded depth."""
    if isinstance(value, torch.Tensor):
        return True
    if depth > 4 or isinstance(value, (str, bytes)):
        return False
    if isinstance(value, dict) or hasattr(value, "items"):
        try:
            return any(_holds_tensor(v, depth + 1) for v in value.values())
        except Exception:  # noqa: BLE001 - a mapping-like object that cannot be walked: judged as it is
            return True
    if isinstance(value, (list, tuple)):
        return any(_holds_tensor(v, depth + 1) for v in value[:64])
    return hasattr(value, "__dict__") and any(_holds_tensor(v, depth + 1) for v in vars(value).values())
