"""Kind 3: a plain loop (``dlcheck_make_training`` + data, optionally ``dlcheck_train_step``,
``dlcheck_compute_loss``, ``dlcheck_save_checkpoint`` / ``dlcheck_load_checkpoint``): runs call the
user's step on fresh objects from the user's factory."""

from __future__ import annotations

import contextlib
import copy
import dataclasses
import inspect
import itertools
import os
import weakref
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path
from typing import Any

import torch

from ..errors import MISSING, RoleError
from ..guard import preserved_dataloader, preserved_rng
from ..session import user_call
from .resume import (
    DRAW_SEED,
    EPOCH_DRAWS,
    Baseline,
    DataResume,
    InterruptedSave,
    ResumeLoadFailed,
    ResumeRun,
    SaveInterrupted,
    after_load,
    epoch_reach,
    generator_states,
    interrupted_saves,
    load_reports,
    own_generators,
    piece_states,
    put_back_rng,
    read_saved,
    same_generators,
    same_rng,
    saved_pieces,
    scaler_ends,
)
from .resume import seeded_examples as _seeded_examples
from .runs import (
    ACCUMULATION_LIMIT,
    SEED,
    Fresh,
    NoStepToSaveAfter,
    NotTheBatch,
    OnDisk,
    SetupError,
    Trajectory,
    UpdateWatch,
    _forward_params,
    as_float,
    device_of,
    digest,
    draw_batches,
    ema_counter,
    ema_describe,
    ema_state,
    example_digests,
    find_emas,
    labels_restore,
    loss_scale_of,
    loss_tensor,
    model_call,
    offload_tensors,
    own_batch,
    param_names,
    past_accumulation,
    release_training_memory,
    rng_state,
    schedule_plan,
    scheduler_count,
    seed_all,
    set_rng_state,
    state_tensors,
    targets_of,
    to_device,
    unwrap_prepared,
    watch_optimizer,
)
from .told import ToldCalls

# --------------------------------------------------------------------------------------------------
# kind 3: a plain loop


def _no_room() -> None:
    """The default of ``make_room``: nothing to let go."""


class LoopSetup:
    kind = "loop"

    def interrupted_save(self) -> InterruptedSave:
        """A checkpoint saved over an earlier one and interrupted half way (C2)."""
        return loop_interrupted_save(self)

    def __init__(
        self,
        make_training: Any,
        train_step: Any,
        compute_loss: Any,
        loss_fn: Any,
        loader: Any,
        save: Any,
        load: Any,
        tmp: Any,
        resume_loader: Any = MISSING,
        checkpoint_every: Any = MISSING,
        start_epoch: Any = MISSING,
    ):
        self.make_training = make_training
        self.train_step = train_step
        self.compute_loss = compute_loss
        self.loss_fn = loss_fn
        self.loader = loader
        self.save = save
        self.load = load
        self.tmp = tmp
        #: ``dlcheck_resume_dataloader``: what the user's epoch loop trains on after a resume (the data position)
        self.resume_loader = resume_loader
        #: ``dlcheck_checkpoint_every``: where the user's loop saves ("epoch", or every N optimizer steps); C1's
        #: runs save there instead of half way
        self.checkpoint_every = checkpoint_every
        #: ``dlcheck_start_epoch``: the top of the user's epoch loop, called at each epoch's start of C1's data
        #: runs when the loop checkpoints at epoch ends
        self.start_epoch = start_epoch
        self.name = "dlcheck_make_training"
        self._batches: list[Any] = []
        #: lets the session's spares go (the probe, the smoke run's trained objects): get_setup sets it
        self.make_room: Callable[[], None] = _no_room  # module level: a spawned rank unpickles the setup

    def __getstate__(self) -> dict[str, Any]:
        """A launched rank (pickled for ``spawn``) judges no data position: ``dlcheck_resume_dataloader`` stays
        in this process (a lambda of a conftest need not pickle)."""
        state = dict(self.__dict__)
        state.pop("resume_loader", None)
        state.pop("start_epoch", None)
        state.pop("_handed", None)  # weak references of this process's objects
        return state

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)
        self.resume_loader = MISSING
        self.start_epoch = MISSING

    @property
    def sources(self) -> Any:
        return (
            self.make_training,
            self.loader,
            self.train_step,
            self.compute_loss,
            self.loss_fn,
            self.save,
            self.load,
            self.resume_loader,
        )

    def describe(self) -> str:
        step = (
            "dlcheck_train_step"
            if self.train_step is not MISSING
            else "the default step (loss.backward(), optimizer.step())"
        )
        return f"fresh objects from dlcheck_make_training, trained by {step}"

    def keep(self, state: dict[str, Any]) -> None:
        """Hand ``state`` (built by the factory at the seed, unused) to the next :meth:`state` call."""
        self._kept = state

    def state(self) -> dict[str, Any]:
        """Fresh objects from the factory, at the seed, for a run: the spares other checks share are let go
        first, so that none lives beside the training state this builds."""
        self.make_room()
        return self._new_state()

    def _new_state(self) -> dict[str, Any]:
        kept = self.__dict__.pop("_kept", None)
        if kept is not None:
            return kept
        with preserved_rng():
            seed_all(SEED)
            state = user_call("make_training", self.make_training)
        if not isinstance(state, Mapping) or "model" not in state:
            raise SetupError(
                "dlcheck_make_training must return a dict with at least 'model' and 'optimizer', "
                f"got {type(state).__name__}"
            )
        self._remember(state)
        return dict(state)

    def _remember(self, state: Mapping[str, Any]) -> None:
        """Write down (by weak reference) the tensors of this result of the factory: a tensor an earlier result
        held too is the user's own, handed to every state (a frozen feature extractor built once), not the
        call's; :meth:`users_tensors` names them."""
        handed = self.__dict__.setdefault("_handed", {"calls": 0, "seen": {}, "shared": {}})
        handed["calls"] += 1
        seen, shared = handed["seen"], handed["shared"]
        for key in [k for k, (ref, _) in seen.items() if ref() is None]:
            del seen[key]
        for t in state_tensors(state):
            got = seen.get(id(t))
            if got is not None and got[0]() is t:
                if got[1] != handed["calls"]:
                    shared[id(t)] = got[0]
                continue
            seen[id(t)] = (weakref.ref(t), handed["calls"])

    def users_tensors(self, state: Mapping[str, Any]) -> frozenset[int]:
        """The ids of the tensors of ``state`` (a result of the factory) that are the user's, not fresh to the
        call: held by another result of the factory too. When the factory has made no other result yet, one is
        made to compare (at the seed, as every state) and kept for the next run, which would make it anyway. The
        plugin releases, empties or offloads only what is fresh to the call: it leaves no trace on the user's
        own objects."""
        handed = self.__dict__.get("_handed")
        if handed is None or handed["calls"] < 2:
            self.keep(self._new_state())
            handed = self.__dict__["_handed"]
        shared = handed["shared"]
        return frozenset(id(t) for t in state_tensors(state) if id(t) in shared and shared[id(t)]() is t)

    def loss_of(self, model: Any, batch: Any) -> torch.Tensor:
        batch = own_batch(batch)  # the user's loss, model or loss_fn may change it in place: a batch of its own
        if self.compute_loss is not MISSING:
            return loss_tensor(user_call("compute_loss", lambda: self.compute_loss(model, batch)))
        try:
            out_call = model_call(model, batch)
        except NotTheBatch as exc:
            raise SetupError(
                f"missing role: define fixture dlcheck_compute_loss (model, batch) -> loss: {type(model).__name__} "
                f"does not take the batch ({str(exc).split(': ', 1)[1].split(', which')[0]})"
            ) from None
        if isinstance(batch, Mapping):
            out = user_call("make_training", out_call)
            try:
                return loss_tensor(out)
            except SetupError:
                why = self.loss_unavailable(model, batch)
                if why is None:
                    raise
                raise SetupError(
                    f"missing role: define fixture dlcheck_compute_loss (model, batch) -> loss: {why}"
                ) from None
        if self.loss_fn is not MISSING and isinstance(batch, (list, tuple)) and targets_of(batch, model) is not None:
            return loss_tensor(user_call("loss_fn", lambda: self.loss_fn(out_call(), targets_of(batch, model))))
        raise SetupError(
            "the batches are not mappings the model takes by keyword: define fixture dlcheck_compute_loss "
            "(model, batch) -> loss, or dlcheck_loss_fn for (inputs, targets) batches"
        )

    def loss_unavailable(self, model: Any, batch: Any) -> str | None:
        """Why :meth:`loss_of` cannot compute the loss of ``batch`` without running anything (no
        ``dlcheck_compute_loss``, a model that does not take the batch, batches that are no (inputs, targets)
        pair for ``dlcheck_loss_fn``), or None when it can."""
        if self.compute_loss is not MISSING:
            return None
        try:
            model_call(model, batch)
        except NotTheBatch as exc:
            return f"{type(model).__name__} does not take the batch ({str(exc).split(': ', 1)[1].split(', which')[0]})"
        if isinstance(batch, Mapping):
            # a model called on a mapping returns a loss when it is given the targets (transformers' convention:
            # labels, or return_loss); a text encoder on a textual-inversion batch returns hidden states
            inner = unwrap_prepared(model)
            found = _forward_params(inner)
            takes = found[0] if found is not None else None
            given = [k for k in ("labels", "label", "return_loss") if k in batch and (takes is None or k in takes)]
            # transformers 5's forwards take **kwargs: a PreTrainedModel still computes no loss without its labels
            transformers_model = any(
                c.__name__ == "PreTrainedModel" and c.__module__.startswith("transformers") for c in type(inner).__mro__
            )
            if (found is not None or transformers_model) and not given:
                return (
                    f"{type(unwrap_prepared(model)).__name__} is given no labels by the batches (fields: "
                    f"{', '.join(map(str, batch))}): its output carries no loss, your step computes it"
                )
            return None
        if self.loss_fn is not MISSING and isinstance(batch, (list, tuple)) and targets_of(batch, model) is not None:
            return None
        return "the batches are not mappings the model takes by keyword, and no dlcheck_loss_fn takes (inputs, targets)"

    def fresh(self) -> Fresh:
        state = self._new_state()  # the probe, a spare itself: it lets no other go
        model = state["model"]

        def make_optimizer() -> tuple[Any, Any]:
            again = self._new_state()
            opt = state.get("optimizer")
            # the factory built the optimizer for its own model; map it onto this one by parameter name
            by_name = dict(model.named_parameters())
            memo = {id(p): by_name[n] for n, p in again["model"].named_parameters() if n in by_name}
            # a wrapper's torch optimizer (Fabric's _FabricOptimizer forwards attributes to it and cannot be copied)
            source = unwrap_prepared(again.get("optimizer"))
            new_opt = copy.deepcopy(source, memo) if source is not None else opt
            if source is not None and new_opt is not source:
                # torch's Optimizer pickles only defaults, state and param_groups: what a subclass keeps beside them
                # (LBFGS's _params, the flat list its step reads) is copied over too, onto this model's parameters
                for key, value in vars(source).items():
                    # data only: a scheduler's wrapper of the old optimizer's step (an instance attribute) stays behind
                    if key not in vars(new_opt) and not callable(value):
                        setattr(new_opt, key, copy.deepcopy(value, memo))
            sched = again.get("lr_scheduler")
            new_sched = copy.deepcopy(sched, {**memo, id(again["optimizer"]): new_opt}) if sched is not None else None
            return new_opt, new_sched

        return Fresh(model, lambda b: self.loss_of(model, to_device(b, device_of(model))), make_optimizer, owner=state)

    def batches(self, n: int) -> list[Any]:
        if len(self._batches) < n:
            if self.loader is MISSING:
                raise SetupError(
                    "no training data: define fixture dlcheck_dataloader (or dlcheck_collator + dlcheck_dataset)"
                )
            self._batches = draw_batches(self.loader, n)
            if not self._batches:
                raise SetupError("dlcheck_dataloader yielded no batch")
        return [self._batches[i % len(self._batches)] for i in range(n)]

    def train_mode(self, state: dict[str, Any]) -> None:
        """Put the modules the state trains in train mode, as the user's epoch loop does before its steps
        (``model.train()`` at the top of each epoch, outside the step): ``state['model']`` and every other
        module of the state whose parameters an optimizer of the state steps (a GAN's second network, a text
        encoder trained beside a UNet). A module nothing optimizes (an EMA, a frozen teacher or VAE) keeps its
        mode. Each module's own ``train()`` is called (an override that keeps BatchNorm frozen stays in force);
        the objects are fresh ones from the factory, so nothing is put back."""
        for module in trained_modules(state):
            user_call("make_training", module.train)

    def _step_fn(self) -> Any:
        """The user's step function (searched for generators of its own), or None for dlcheck's default step."""
        return None if self.train_step is MISSING else self.train_step

    def step(self, state: dict[str, Any], batch: Any, index: int) -> float | None:
        """One call of the user's step (or the default one) on a batch (a batch of its own, :func:`own_batch`)."""
        batch = to_device(batch, device_of(state["model"]))
        if self.train_step is not MISSING:
            batch = own_batch(batch)
            fn = self.train_step
            try:
                takes_index = len(inspect.signature(fn).parameters) >= 3
            except (TypeError, ValueError):
                takes_index = False
            out = user_call(
                "train_step", (lambda: fn(state, batch, index)) if takes_index else (lambda: fn(state, batch))
            )
            return as_float(out if not isinstance(out, Mapping) else out.get("loss"))
        model, opt, sched, scaler = (
            state["model"],
            state.get("optimizer"),
            state.get("lr_scheduler"),
            state.get("scaler"),
        )
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

    def run(
        self,
        state: dict[str, Any],
        batches: list[Any],
        start: int,
        traj: Trajectory,
        digests: bool = False,
        after: Callable[[int], None] | None = None,
        stop: Callable[[], bool] | None = None,
        planned: int | None = None,
    ) -> None:
        """Micro-steps ``start .. start+len(batches)-1`` of the user's loop on ``state``, recorded (``batches``
        may be any iterable; ``planned`` bounds its length when it has none); ``stop()``, asked after each
        micro-step, ends the run early when true. The run never steps the state's LR scheduler past the end
        of its plan (:func:`schedule_plan`: the user's own run, planned for that schedule, never does): it
        stops there instead, and ``traj.notes["plan_end"]`` says where and why."""
        model, opt = state["model"], state.get("optimizer")
        names = param_names(model)
        current = {"i": start}
        # no optimizer object: the user's step updates the weights itself (p.data.add_(p.grad, ...)); an update is a
        # call after which the weights changed, its gradients read as the backward left them
        own = UpdateWatch(model, traj) if opt is None and self.train_step is not MISSING else None
        undo = (
            watch_optimizer(opt, names, traj, lambda: current["i"] + 1, loss_scale_of(state))
            if opt is not None
            else own.remove
            if own is not None
            else (lambda: None)
        )
        sched = state.get("lr_scheduler")
        length = planned if planned is not None else len(batches) if hasattr(batches, "__len__") else None
        plan = schedule_plan(sched, length) if sched is not None and length else None
        first = scheduler_count(sched)
        # a scheduler told its position by the loop (timm's step(epoch) / step_update(num_updates)) has no counter of
        # its own: its calls are counted for the run (traj.notes["told_scheduler"])
        told = ToldCalls(unwrap_prepared(sched))
        self.train_mode(state)  # the user's epoch loop sets it before its steps (a from_pretrained model is in eval)
        try:
            for offset, batch in enumerate(batches):
                i = start + offset
                if plan is not None and first is not None and (scheduler_count(sched) or 0) - first >= plan[0]:
                    traj.notes["plan_end"] = (
                        f"stopped after {offset} micro-steps, where the user's LR schedule ends: "
                        f"state['lr_scheduler'] ({type(sched).__name__}): {plan[1]}; the user's own run never "
                        "steps past its plan"
                    )
                    break
                current["i"] = i
                before = scheduler_count(sched)
                loss = self.step(state, batch, i)
                if own is not None:
                    own.after(i + 1)
                after_count = scheduler_count(sched)
                if before is not None and after_count is not None:
                    traj.calls.extend(["sched"] * max(0, after_count - before))
                traj.record(i + 1).loss = loss
                if digests:
                    traj.digests.append((i + 1, digest(model)))
                if after is not None:
                    after(i)
                if stop is not None and stop():
                    break
        finally:
            told.stop()
            if told.active:
                traj.notes["told_scheduler"] = told
            undo()

    def smoke(
        self, steps: int, save_from: int | None = None, max_micro: int | None = None
    ) -> tuple[Trajectory, Fresh, Baseline | None]:
        """The shared smoke run: micro-steps of the user's step until ``steps`` optimizer steps are made (or
        ``max_micro`` micro-steps, under a gradient accumulation too long for it; a state without an
        optimizer runs ``steps`` micro-steps). With ``save_from``, it is C1's uninterrupted baseline too: it
        saves with the user's function right after optimizer step ``save_from`` (a save that raises, or finds
        no later step, leaves no baseline: C1 then runs its own and reports it). ``traj.notes`` says how many
        micro-steps (``micro_steps``) and optimizer steps (``opt_steps``) ran."""
        state = self.state()
        traj = Trajectory()
        limit = max(steps, max_micro or steps)
        saving = _Saving(self, state, traj, limit, save_from, tolerant=True, opt_steps=True) if save_from else None

        # an optimizer's steps, or the updates of a step that updates the weights itself, are counted (an accumulation
        # may outlast ``steps``); a step that updated nothing in ``steps`` calls is not run further
        watched = state.get("optimizer") is not None

        def enough() -> bool:
            made = traj.calls.count("opt")
            return made >= steps or (not watched and not made and len(traj.steps) >= steps)

        with preserved_rng():
            seed_all(SEED)
            self.run(state, self._stream(limit), 0, traj, after=saving, stop=enough, planned=limit)
        traj.notes["micro_steps"] = len(traj.steps)
        traj.notes["opt_steps"] = traj.calls.count("opt")
        baseline = saving.baseline() if saving is not None else None
        traj.notes["optimizer"] = state.get("optimizer")
        traj.notes["scheduler"] = state.get("lr_scheduler")
        # the training dict's other optimizers (a critic's, a discriminator's): the smoke run watches 'optimizer' only
        # (a wrapper of the same optimizer, Accelerate's AcceleratedOptimizer around it, is no other one)
        watched_opt = unwrap_prepared(state.get("optimizer"))
        traj.notes["other_optimizers"] = [
            str(k)
            for k, v in state.items()
            if k != "optimizer"
            and isinstance(unwrap_prepared(v), torch.optim.Optimizer)
            and unwrap_prepared(v) is not watched_opt
        ]
        users = self.users_tensors(state)  # a module the factory hands to every state is the user's: left alone
        release_training_memory(state, users)
        if self.offload_trained:
            read_back = offload_tensors(state, self.tmp.mktemp("dlcheck-smoke") / "trained.pt", users)
            if read_back is not None:
                # the trained weights wait on disk; their checks read them back into new objects
                return traj, lambda: self._trained(read_back()), baseline
        return traj, self._trained(state), baseline

    def _stream(self, limit: int) -> Any:
        """The sampled batches one by one, up to ``limit``, drawn as the run goes (doubling the draw when it
        runs out): the first ones are those :meth:`batches` gives (C1's resume trains the same)."""
        drawn: list[Any] = []
        for i in range(limit):
            if i >= len(drawn):
                drawn = self.batches(min(limit, max(2 * len(drawn), 20, i + 1)))
            yield drawn[i]

    def _trained(self, state: dict[str, Any]) -> Fresh:
        model = state["model"]
        return Fresh(
            model,
            lambda b: self.loss_of(model, to_device(b, device_of(model))),
            lambda: (state.get("optimizer"), state.get("lr_scheduler")),
            owner=state,
        )

    #: the smoke run's trained tensors are kept on disk (an Accelerate user's state, an Accelerator and its
    #: prepared objects, stays in memory)
    offload_trained = True

    # ---- checkpoint and resume -------------------------------------------------------------------------

    def saved_state(self) -> tuple[Any, list[tuple[str, Any]], str]:
        if self.save is MISSING:
            raise SetupError("missing role: define fixture dlcheck_save_checkpoint (state, path) in conftest.py")
        state = self.state()
        path = self.tmp.mktemp("dlcheck-save") / "checkpoint"
        user_call("save_checkpoint", lambda: self.save(state, str(path)))
        return state["model"], read_saved(path), "dlcheck_save_checkpoint"

    #: the smoke run can save for C1 and be its uninterrupted baseline (``smoke(steps, save_from)``)
    smoke_baseline = True

    def can_resume(self) -> bool:
        return self.save is not MISSING and self.load is not MISSING

    def resume(self, total: int, restore: frozenset[str] = frozenset(), baseline: Baseline | None = None) -> ResumeRun:
        """Run ``total`` micro-steps, saving with the user's save function after the first optimizer step
        at or past half way (or where ``dlcheck_checkpoint_every`` says the user's loop saves, the run then as long
        as that needs; or take ``baseline``, the smoke run that saved); fresh objects from the factory
        load it with the user's load function (the global RNGs first moved elsewhere, as in a new process)
        and continue on the same batches."""
        if not self.can_resume():
            raise SetupError(missing_checkpoint_roles(self))
        cache = self.__dict__.setdefault("_baselines", {})
        if baseline is None and total not in cache:
            cache[total] = self._uninterrupted_past_accumulation(total)
        if baseline is None:
            run_length, base = cache[total]
        else:
            run_length, base = total, baseline
        batches = self.batches(run_length)
        saved_at = base.truth["_saved_at"]
        state = self.state()
        traj = Trajectory()
        # the generators the user's step holds (its closure, defaults) outlive the resume: put back as they were
        held = own_generators(None, self._step_fn())
        held_states = generator_states(held)
        judged_at = self.__dict__.get("_judged_at") if beyond_reach(self.checkpoint_every, total) else None
        if judged_at and not _files_under(base.checkpoint):
            raise SetupError(
                f"the resume is not judged: {judged_at}, and your dlcheck_save_checkpoint wrote nothing there (a save "
                f"that decides by your step counter, writing only at multiples of {self.checkpoint_every}, is not "
                "called at your cadence by dlcheck)"
            )
        # the first resume (nothing put back but the RNG states) reads what the user's load restored of the optimizer
        # and the LR scheduler, against their states at the save and before the load (C1's cause)
        reading = not (restore - {"rng"})
        fresh = piece_states(state) if reading else {}
        with preserved_rng(), _generators_kept(held, held_states):
            seed_all(SEED + 1)  # a new process: the global RNGs are wherever they are
            try:
                with load_reports() as loads:
                    user_call("load_checkpoint", lambda: self.load(state, str(base.checkpoint)))
            except RoleError as exc:
                if _wrote_nothing(base.checkpoint):
                    raise RoleError(
                        "save_checkpoint",
                        f"wrote nothing at the path it was given ({base.checkpoint}), "
                        f"so dlcheck_load_checkpoint {exc.message}",
                    ) from None
                # the user's load raising on what the user's own save wrote: C1's finding
                raise ResumeLoadFailed(
                    exc.role, exc.message, exc.__cause__ or exc, "load", base.checkpoint, saved_at
                ) from exc.__cause__
            # whether the user's load put the global RNGs back where they were at the save (C3 asks it when
            # the steps draw nothing but the user's data path does)
            traj.notes["rng_restored"] = restored_rngs(base.truth.get("rng"), rng_state())
            # the global RNG states at the save: C3 puts them back before the user's epoch loop draws its first
            # resumed batch (:meth:`loop_draws`)
            traj.notes["rng_at_save"] = base.truth.get("rng")
            # the training's own generators (state['generator'], the step's closure): whether the load put each back
            gens = own_generators(state, self._step_fn())
            traj.notes["generators"] = list(gens)
            traj.notes["generators_restored"] = same_generators(
                base.truth.get("generators") or {}, generator_states(gens)
            )
            if reading:
                kinds = {k: type(unwrap_prepared(state[k])).__name__ for k in fresh if k in state}
                traj.notes["after_load"] = after_load(fresh, piece_states(state), saved_pieces(base.truth), kinds)
            _loop_restore(state, base.truth, restore, gens)
            before, own_before = rng_state(), generator_states(gens)
            self.run(state, batches[saved_at:], saved_at, traj, digests=True)
            # whether the resumed steps draw from the global RNGs (dlcheck feeds the batches: only the user's
            # step can draw): C3 then needs no third resume to tell a run that draws none
            now = rng_state()
            traj.notes["rng_drawn"] = not same_rng(before, now)
            # which generators the resumed steps draw from: the global ones whose states moved, and the own ones
            kept = restored_rngs(before, now)
            moved_own = same_generators(own_before, generator_states(gens))
            traj.notes["rng_drawn_from"] = [n for n, same in kept.items() if not same]
            traj.notes["own_drawn_from"] = [w for w, same in moved_own.items() if not same]
            traj.notes["rng_drawn"] = traj.notes["rng_drawn"] or not all(moved_own.values())
        traj.notes["ema"] = _ema_end(state)
        traj.notes["scalers"] = scaler_ends(state)
        return ResumeRun(base.trajectory, traj, saved_at, base.checkpoint, base.pieces, loads)

    def data_resume(
        self,
        total: int,
        build: Callable[[], dict[str, Any]] | None = None,
        path: Path | None = None,
        before_load: Callable[[], None] | None = None,
        new_epoch: bool = False,
    ) -> DataResume | None:
        """The data position across a save and a resume, drawn from the user's own data path: the loader the
        factory's training dict holds (:func:`loader_key`). Fresh objects train ``total`` micro-steps on
        batches drawn from their ``state[key]`` (a new epoch when it runs out, as a loop's epochs do), saved
        with the user's save after the first optimizer step at or past half way (with ``dlcheck_checkpoint_every``:
        at the user's cadence, :meth:`_uninterrupted_at_cadence`, the next epoch after an epoch-end save started by
        ``dlcheck_start_epoch`` and drawn from what the load or ``dlcheck_resume_dataloader`` hands over); other
        fresh objects, loaded
        by the user's load, draw the remaining steps from their own ``state[key]`` (the one the load left
        there: ``accelerator.skip_first_batches(...)`` or a restored stateful loader). When the epoch is longer
        than ``total`` (and at most :data:`~.resume.EPOCH_DRAWS` batches), both runs draw on to its end without
        training: every example of the epoch is then known by content, and a resumed epoch drawn anew (a restart
        on a reshuffled epoch) is counted rather than left as examples the compared steps do not hold. Each draw is made with
        the global RNGs at a state set by its position in the run, and each example with them set by its
        index (a map-style dataset read in this process), so that a reshuffle shows as one and a random
        augmentation does not hide an example. None when the dict holds no dataloader.

        A launched rank (D5, :mod:`checks.dist.launch`) passes ``build`` (the factory plus the user's wrap),
        ``path`` (the one checkpoint path every rank saves to) and ``before_load`` (a barrier: every rank has
        saved before any rank loads). ``new_epoch``: after a save at an epoch's end, the resumed run's next epoch is
        drawn whole (its rest without training, :attr:`~.resume.DataResume.new_epoch`) when it is at most
        :data:`~.resume.EPOCH_DRAWS` batches, so that it is judged as an epoch (each example once), not by the
        uninterrupted run's order."""
        new_state = build if build is not None else self.state
        state = new_state()
        key = loader_key(state)
        if key is None or not self.can_resume():
            if build is None:
                self.keep(state)  # built at the seed, unused: the next run takes it
            return None
        loader = state[key]
        try:
            epoch = len(loader)
        except TypeError:
            epoch = None
        if self.resume_loader is MISSING and getattr(self, "user_load", self.load) is MISSING:
            # the resume would be dlcheck's own stand-in (accelerator.load_state), not the user's: not judged
            if build is None:
                self.keep(state)
            name = type(loader).__name__
            return DataResume(key, name, name, 0, 0, epoch, [], [], [], not_seen=DEFAULT_LOAD)
        snapshot = _loader_state(loader)
        traj, drawn = Trajectory(), []
        every = self.checkpoint_every
        counted = ""
        if every == "epoch" and epoch is None:  # a sampler without a length: its epoch counted, no data loaded
            epoch, counted = counted_epoch(loader, cadence_bound(total))
        # a cadence of N optimizer steps past reach: saved half way (a reachable optimizer step), said so
        judged_at = beyond_reach(every, total)
        if judged_at:
            every = MISSING
        starts = self._epoch_starts(state) if every == "epoch" else None
        if every is MISSING:
            saving = _Saving(self, state, traj, total, total // 2, path=path)
            reach, limit, stop = epoch_reach(epoch, total), total, None
        else:
            # the save where the user's loop saves (its epoch end, every N optimizer steps), then as many resumed
            # steps as C1 compares; the epoch after the save is not drawn to its end (a resumed loop that starts
            # the next epoch draws it anew, its order the loop's own)
            half, after = max(1, total // 2), total - total // 2
            bound = cadence_bound(total)
            if every == "epoch" and (epoch is None or epoch * max(1, -(-half // epoch)) > bound):
                if build is None:
                    self.keep(state)
                else:
                    release_training_memory(state)
                why = (
                    (counted or "your training loader has no length, so an epoch's end is not known")
                    if epoch is None
                    else epoch_too_long(epoch, epoch * max(1, -(-half // epoch)), bound, total)
                )
                raise SetupError(off_cadence(every, why))
            limit = bound + after
            saving = _Saving(self, state, traj, limit, half, path=path, every=(every, epoch), after=after)
            reach, stop = limit, saving.done
        with preserved_rng():
            seed_all(SEED)
            draws = _draws(lambda: state[key], 0, reach, drawn, starts=starts)
            self.run(state, itertools.islice(draws, limit), 0, traj, after=saving, stop=stop, planned=limit)
            if every is MISSING:
                # the rest of the epoch drawn without training: every example of it known by content, so that the
                # examples of a resumed epoch drawn anew are recognised wherever the uninterrupted epoch has them
                for _ in draws:
                    pass
        saved_at = saving.truth.get("_saved_at")
        trained = len(traj.steps)
        reach = max(trained, len(drawn)) if reach > total and every is MISSING else trained
        release_training_memory(state)
        state = None
        if every is not MISSING and (saved_at is None or not saving.done()):
            raise SetupError(
                off_cadence(
                    every,
                    traj.notes.get("plan_end")
                    or f"no {cadence_point(every)} within the first {cadence_bound(total)} micro-steps of the run "
                    f"drawn from your loader (the most C1 trains before its save: max(2 x C1.steps, {CADENCE_STEPS}))",
                )
            )
        if saved_at is None or saved_at >= trained:
            raise NoStepToSaveAfter(
                f"no optimizer step happened between micro-steps {total // 2} and {total - 1} of the run drawn from "
                "your loader to save after (raise C1.steps above your gradient accumulation)"
            )
        result = DataResume(key, "", "", trained, saved_at, epoch, drawn[:saved_at], drawn[saved_at:reach], [])
        if every is not MISSING:
            result.cadence = (
                f"the end of epoch {saved_at // epoch}"
                if every == "epoch" and epoch
                else f"optimizer step {saving.saved_opt}"
            ) + f", where your loop checkpoints: {cadence_words(every)}"
            if every == "epoch" and counted and epoch:
                result.cadence += f"; {counted}"
        elif judged_at:
            result.cadence = (
                reach_words(self.checkpoint_every, saving.saved_opt, cadence_bound(total))
                + "; a save every N optimizer steps lands within an epoch unless N is a multiple of the epoch's "
                "optimizer steps"
            )
            if not _files_under(saving.path):
                result.unreadable = (
                    "your dlcheck_save_checkpoint wrote nothing when called there (a save that decides by your step "
                    f"counter, writing only at multiples of {self.checkpoint_every}, is not called at your cadence "
                    "by dlcheck)"
                )
                return result
        fresh = new_state()
        result.loader = type(fresh[key]).__name__
        if fresh.get(key) is loader:  # one loader shared by every call of the factory: its state put back
            if snapshot is not None:
                loader.load_state_dict(snapshot)
            result.unreadable = (
                f"dlcheck_make_training returns the same state['{key}'] object on every call, so its position "
                "would carry from the uninterrupted run into the resumed one (build the loader inside the factory)"
            )
            return result
        loader = None
        held = fresh[key]
        held_state = _loader_state(held)
        with preserved_rng():
            seed_all(SEED + 1)  # a new process: the global RNGs are wherever they are
            if before_load is not None:
                before_load()
            try:
                with _loads_watched(held) as loads:
                    user_call("load_checkpoint", lambda: self.load(fresh, str(saving.path)))
            except RoleError as exc:  # C1's resume reports the load that raises
                result.load_error = exc.message
                return result
            if fresh.get(key) is None:
                result.unreadable = f"your load left no state['{key}']"
                return result
            result.resumed_loader = type(fresh[key]).__name__
            touched = fresh[key] is not held or bool(loads) or not _same_state(held_state, _loader_state(held))
            first = None
            resumed_starts = None
            if every == "epoch" and epoch:
                # the save was at an epoch's end: the resumed loop starts the next epoch at the top of its epoch loop
                # (dlcheck_start_epoch, given the epoch's index in the run), then trains on what your loop makes of
                # the loader after the load (dlcheck_resume_dataloader, which sees your own epoch counter), or on
                # the loader as your load leaves it, as a loop does at an epoch's start
                resumed_starts = self._epoch_starts(fresh, saved_at // epoch)
                if self.resume_loader is not MISSING:
                    seed_all(DRAW_SEED + saved_at)
                    next(resumed_starts)
            if self.resume_loader is not MISSING:
                result.resumed_step = saved_at % epoch if epoch else saved_at
                first = user_call(
                    "resume_dataloader", lambda: self.resume_loader(fresh, fresh[key], result.resumed_step)
                )
                result.through_role = type(first).__name__
            elif not touched and resumed_starts is None:
                result.not_seen = UNTOUCHED.format(key=key)
                release_training_memory(fresh)
                return result
            compared = reach - saved_at
            # a save at an epoch's end: the resumed loop's next epoch drawn whole (its rest without training)
            whole = new_epoch and bool(epoch) and saved_at % epoch == 0 and compared < epoch <= EPOCH_DRAWS
            after: list[Any] = []
            for _ in _draws(
                lambda: fresh[key], saved_at, epoch if whole else compared, after, first=first, starts=resumed_starts
            ):
                pass
            result.resumed = after[:compared]
            if whole:
                result.new_epoch = after
        if any(d is None for d in result.before + result.expected + result.resumed + result.new_epoch):
            result.unreadable = "a batch holds no tensor with a batch dimension to tell its examples apart"
        release_training_memory(fresh)
        return result

    def loop_draws(self, run: ResumeRun) -> LoopDraws | None:
        """What the user's epoch loop draws from the global RNGs between the load and the first resumed step
        (``dlcheck_resume_dataloader``: a new iterator, the batches it skips, a loader that fetches ahead): the
        global RNG states right after the loop yields its first resumed batch (fresh objects loaded by the user's
        load from ``run``'s checkpoint, the global RNG states at the save put back after it), compared with the
        uninterrupted loop's right after its iterator, continued from the run's start, yields the same step's batch
        from the same states at the save; the two batches too. Each example is read with the global RNGs seeded by
        its index and the stream put back after it (:func:`~.resume.seeded_examples`): an example has the same
        content on both sides (told apart by content), and a random augmentation's draws are not in the comparison
        (C3 asks whether the data path draws from a moved generator, :meth:`data_rng`). Trains nothing. None when
        the training dict holds no loader, without the role, or when the load or the loop yields nothing (C1
        reports a load that raises)."""
        at_save = run.resumed.notes.get("rng_at_save")
        if self.resume_loader is MISSING or not at_save:
            return None
        saved_at = run.saved_at
        every = self.checkpoint_every
        ref = self.state()
        key = loader_key(ref)
        if key is None:
            self.keep(ref)
            return None
        try:
            epoch = len(ref[key])
        except TypeError:
            epoch = counted_epoch(ref[key], saved_at)[0] if every == "epoch" else None
        reference: list[Any] = []
        # each example read with the RNGs seeded by its index, the stream put back after it: a random augmentation
        # gives the example the same content on both sides (told apart by content), and what the loading draws
        # besides (an iterator's seed, a sampler, a collator) draws from the stream as it would
        with preserved_rng(), preserved_dataloader(ref[key]), _seeded_examples(ref[key], keep_stream=True):
            seed_all(SEED)
            starts = self._epoch_starts(ref) if every == "epoch" else None
            it = None
            for p in range(saved_at + 1):
                if p == saved_at:  # the step after the save: drawn from the states at the save
                    set_rng_state(at_save)
                if it is None:
                    if starts is not None:
                        next(starts)
                    it = iter(ref[key])
                try:
                    batch = next(it)
                except StopIteration:
                    if p == saved_at:
                        set_rng_state(at_save)
                    if starts is not None:
                        next(starts)
                    it = iter(ref[key])
                    try:
                        batch = next(it)
                    except StopIteration:
                        break
                if p == saved_at:
                    reference = [batch, rng_state()]
            _close(it)
            it = None
        collate = getattr(ref[key], "collate_fn", None)
        release_training_memory(ref)
        ref = None
        if not reference:
            return None
        fresh = self.state()
        try:
            with preserved_rng():
                seed_all(SEED + 1)  # a new process: the global RNGs are wherever they are
                try:
                    user_call("load_checkpoint", lambda: self.load(fresh, str(run.checkpoint)))
                except RoleError:  # C1's resume reports the load that raises
                    return None
                if fresh.get(key) is None:
                    return None
                with preserved_dataloader(fresh[key]), _seeded_examples(fresh[key], keep_stream=True):
                    set_rng_state(at_save)
                    if every == "epoch" and epoch:
                        next(self._epoch_starts(fresh, saved_at // epoch))
                    resumed_step = saved_at % epoch if epoch else saved_at
                    first = user_call("resume_dataloader", lambda: self.resume_loader(fresh, fresh[key], resumed_step))
                    it = iter(first)
                    try:
                        batch = next(it)
                    except StopIteration:
                        return None
                    finally:
                        _close(it)
                    now = rng_state()
        finally:
            release_training_memory(fresh)
        restores = labels_restore(collate)
        mine, theirs = example_digests(batch, restores), example_digests(reference[0], restores)
        moved = [name for name, same in restored_rngs(reference[1], now).items() if not same]
        ahead = None
        if "torch" in moved:
            ahead = _numbers_apart(reference[1]["torch"], now["torch"])
        return LoopDraws(
            step=saved_at + 1,
            through=type(first).__name__,
            moved=moved,
            same_examples=mine is not None and mine == theirs,
            batch_differs=_batch_differs(batch, reference[0]),
            torch_ahead=ahead,
        )

    def _epoch_starts(self, state: dict[str, Any], epoch: int = 0) -> Iterator[None]:
        """The top of the user's epoch loop, once per epoch from ``epoch`` on: ``dlcheck_start_epoch(state,
        state[key], epoch)`` when given (nothing otherwise)."""
        key = loader_key(state)
        while True:
            if self.start_epoch is not MISSING and key is not None:
                n = epoch
                user_call("start_epoch", lambda: self.start_epoch(state, state[key], n))
            epoch += 1
            yield

    def data_rng(self) -> tuple[str, list[str]] | None:
        """Whether the user's data path draws from the global RNGs: the first batches of the training loader
        (the one the factory's dict holds, else ``dlcheck_dataloader``) drawn with the global RNGs at one
        state, then with one of them (torch, python, numpy) set elsewhere. Returns the loader in words and
        the generators whose state changes the batches (a shuffle of a ``RandomSampler`` without
        ``generator=``, a random transform, a Mixup in the collate, the seeds of the loader's workers); None
        when the loader does not give the same batches twice from the same global states (a generator of its
        own that its iteration advances): what it draws from cannot be told. The global RNGs, the loader's
        generators and epoch counters are put back."""
        loader, where, state = self.loader, "dlcheck_dataloader", None
        if loader is MISSING or self.kind == "accelerate":  # an Accelerate user iterates the prepared loader
            state = self.state()
            key = loader_key(state)
            if key is not None:
                loader, where = state[key], f"dlcheck_make_training's state['{key}']"
        if loader is MISSING:
            return None
        import sys

        names = ["torch", "python"] + (["numpy"] if sys.modules.get("numpy") is not None else [])
        try:
            reference = _first_draws(loader, None)
            if reference is None or _first_draws(loader, None) != reference:
                return None
            moved = [name for name in names if _first_draws(loader, name) != reference]
        finally:
            if state is not None:
                release_training_memory(state)
        return where, moved

    def uninterrupted_again(self, total: int, saved_at: int) -> Trajectory:
        """The uninterrupted run once more, the same way (fresh objects at the seed, the same batches, the same
        save after micro-step ``saved_at``): whether the run reproduces itself (C1 asks only when no piece put
        back makes the resumed run identical)."""
        state = self.state()
        traj = Trajectory()
        saving = _Saving(self, state, traj, total, saved_at)
        with preserved_rng():
            seed_all(SEED)
            self.run(state, self.batches(total), 0, traj, after=saving)
        saving.baseline()  # the EMAs at the end, compared too
        release_training_memory(state)
        return traj

    def _uninterrupted_past_accumulation(self, total: int) -> tuple[int, Baseline]:
        """(run length, baseline) of the uninterrupted run: ``total`` micro-steps, doubled (up to
        :data:`_ACCUMULATION_LIMIT`) while a gradient accumulation leaves no optimizer step in the second half to
        save after, as a loop saves only after one. With ``dlcheck_checkpoint_every``, the run saves where the
        user's loop does and is as long as that save plus the resumed steps (:meth:`_uninterrupted_at_cadence`)."""
        if self.checkpoint_every is not MISSING and not beyond_reach(self.checkpoint_every, total):
            return self._uninterrupted_at_cadence(total)
        if self.checkpoint_every is not MISSING:  # N optimizer steps past reach: judged at a reachable step
            run_length, base = self._uninterrupted_past_accumulation_plain(total)
            self.__dict__["_judged_at"] = reach_words(
                self.checkpoint_every, base.trajectory.notes.get("saved_opt"), cadence_bound(total)
            )
            return run_length, base
        return self._uninterrupted_past_accumulation_plain(total)

    def _uninterrupted_past_accumulation_plain(self, total: int) -> tuple[int, Baseline]:
        return past_accumulation(lambda n: self._uninterrupted(self.batches(n), n), total, _ACCUMULATION_LIMIT)

    def _uninterrupted_at_cadence(self, total: int) -> tuple[int, Baseline]:
        """(run length, baseline) of the uninterrupted run saved where the user's loop saves
        (``dlcheck_checkpoint_every``): right after the last micro-step of an epoch of the training loader, or after
        the first optimizer step that is a multiple of N, at or past micro-step ``total // 2`` (else the first such
        point), then ``total - total // 2`` micro-steps more. A save point past :func:`cadence_bound` is not
        reached: a SetupError says the resume is not judged at the user's cadence, and why."""
        state = self.state()
        every, half, after = self.checkpoint_every, max(1, total // 2), total - total // 2
        bound = cadence_bound(total)
        epoch, counted = training_epoch(state, self.loader, bound) if every == "epoch" else (None, "")
        if every == "epoch":
            if epoch is None:
                release_training_memory(state)
                raise SetupError(off_cadence(every, counted))
            self.__dict__["_epoch_counted"] = counted
            first = epoch * max(1, -(-half // epoch))
            if first > bound:
                release_training_memory(state)
                raise SetupError(off_cadence(every, epoch_too_long(epoch, first, bound, total)))
        traj = Trajectory()
        limit = bound + after
        saving = _Saving(self, state, traj, limit, half, every=(every, epoch), after=after)
        with preserved_rng():
            seed_all(SEED)
            self.run(state, self._stream(limit), 0, traj, after=saving, stop=saving.done, planned=limit)
        baseline = saving.baseline()
        if baseline is None or len(traj.steps) < baseline.truth["_saved_at"] + after:
            why = traj.notes.get("plan_end") or (
                f"no {cadence_point(every)} within the first {bound} micro-steps of the run (the most C1 trains "
                f"before its save: max(2 x C1.steps, {CADENCE_STEPS}))"
            )
            release_training_memory(state)
            raise SetupError(off_cadence(every, why))
        return len(traj.steps), baseline

    def _uninterrupted(self, batches: list[Any], total: int) -> Baseline:
        state = self.state()
        traj = Trajectory()
        saving = _Saving(self, state, traj, total, total // 2)
        with preserved_rng():
            seed_all(SEED)
            self.run(state, batches, 0, traj, after=saving)
        baseline = saving.baseline()
        if baseline is None and traj.notes.get("plan_end"):
            raise SetupError(
                f"cannot judge a resume: the uninterrupted run of {total} micro-steps {traj.notes['plan_end']}, "
                "before a step after its save (lower C1.steps below the user's planned run)"
            )
        if baseline is None:
            raise NoStepToSaveAfter(
                f"no optimizer step happened between micro-steps {total // 2} and {total - 1} to save after "
                "(raise C1.steps above your gradient accumulation)"
            )
        return baseline


def restored_rngs(saved: Mapping[str, Any] | None, now: Mapping[str, Any]) -> dict[str, bool]:
    """Per global generator (python, numpy, torch, cuda), whether ``now`` is the state ``saved`` holds
    (:func:`~.runs.rng_state` snapshots)."""
    if not saved:
        return {}
    out = {}
    for name in saved:
        if name not in now:
            continue
        a, b = saved[name], now[name]
        if name == "python":
            out[name] = a == b
        elif name == "numpy":
            (kind_a, keys_a, *rest_a), (kind_b, keys_b, *rest_b) = a, b
            out[name] = bool(kind_a == kind_b and rest_a == rest_b and (keys_a == keys_b).all())
        elif name == "cuda":
            out[name] = len(a) == len(b) and all(torch.equal(x, y) for x, y in zip(a, b, strict=False))
        else:
            out[name] = bool(torch.equal(a, b))
    return out


@dataclasses.dataclass
class LoopDraws:
    """:meth:`LoopSetup.loop_draws`' answer: the step the user's epoch loop resumes at, what it trains on (in
    words), the global generators whose states differ from the uninterrupted run's right after the first resumed
    batch, whether that batch holds the uninterrupted run's examples, which of its entries differ from the
    uninterrupted batch's (empty: none), and how many 32-bit numbers torch's global RNG is ahead of the
    uninterrupted run's (negative: behind; None: not within :data:`_APART`, or not moved)."""

    step: int
    through: str
    moved: list[str]
    same_examples: bool
    batch_differs: list[str]
    torch_ahead: int | None


#: how many 32-bit numbers apart two states of torch's CPU generator are looked for
_APART = 4096


def _numbers_apart(reference: torch.Tensor, now: torch.Tensor) -> int | None:
    """How many 32-bit numbers torch's CPU generator draws from the state ``reference`` to reach ``now``
    (negative: from ``now`` to ``reference``); None when neither is within :data:`_APART` draws of the other. On a
    generator of dlcheck's own: the global one is untouched."""
    for start, goal, sign in ((reference, now, 1), (now, reference, -1)):
        gen = torch.Generator()
        try:
            gen.set_state(start)
        except RuntimeError:  # not a CPU generator's state
            return None
        one = torch.empty((), dtype=torch.int32)
        for k in range(1, _APART + 1):
            one.random_(generator=gen)
            if torch.equal(gen.get_state(), goal):
                return sign * k
    return None


def _batch_differs(a: Any, b: Any) -> list[str]:
    """The entries (a mapping's keys, a sequence's positions) where two batches differ; ``["the batch"]`` when they
    differ as a whole; empty when they are the same."""
    if _nested_digest(a) == _nested_digest(b):
        return []
    if isinstance(a, Mapping) and isinstance(b, Mapping) and a.keys() == b.keys():
        return [str(k) for k in a if _nested_digest(a[k]) != _nested_digest(b[k])]
    if isinstance(a, (list, tuple)) and isinstance(b, (list, tuple)) and len(a) == len(b):
        return [f"[{i}]" for i, (x, y) in enumerate(zip(a, b, strict=True)) if _nested_digest(x) != _nested_digest(y)]
    return ["the batch"]


def _close(it: Any) -> None:
    """Close an iterator left part way (a generator's ``close()``): a loader's generator-based iteration ends
    now, not when it is collected."""
    close = getattr(it, "close", None)
    if callable(close):
        with contextlib.suppress(Exception):
            close()


def _reseed(name: str, seed: int) -> None:
    """Set one global generator (torch, python, numpy) to the state of ``seed``."""
    import random
    import sys

    if name == "torch":
        torch.random.manual_seed(seed)
    elif name == "python":
        random.seed(seed)
    elif name == "numpy":
        sys.modules["numpy"].random.seed(seed % 2**32)


def _first_draws(loader: Any, moved: str | None, n: int = 2) -> str | None:
    """A digest of the first ``n`` batches of a new iteration of ``loader``, drawn with the global RNGs
    seeded, and ``moved`` (one of them) set elsewhere; None when it yields no batch. Everything the draw
    moves (the global RNGs, the loader's generators and epoch counters) is put back."""
    from ..guard import kept, preserved_dataloader

    with preserved_rng(), preserved_dataloader(loader):
        seed_all(DRAW_SEED)
        if moved is not None:
            _reseed(moved, DRAW_SEED + 1)
        it = iter(loader)
        got = []
        for _ in range(n):
            try:
                got.append(kept(next(it)))
            except StopIteration:
                break
        del it
    return _nested_digest(got) if got else None


def _nested_digest(obj: Any) -> str:
    """A digest of every tensor, array and number of a batch (or a list of them), in order."""
    import hashlib

    h = hashlib.sha1()

    def walk(x: Any, depth: int) -> None:
        if depth > 6:
            return
        if isinstance(x, torch.Tensor):
            data = x.detach().cpu().contiguous()
            if data.dtype in (torch.bfloat16, torch.float16):
                data = data.float()
            h.update(str((tuple(data.shape), data.dtype)).encode())
            if data.numel():
                h.update(data.reshape(-1).view(torch.uint8).numpy().tobytes())
        elif isinstance(x, Mapping):
            for k in x:
                h.update(str(k).encode())
                walk(x[k], depth + 1)
        elif isinstance(x, (list, tuple)):
            for v in x:
                walk(v, depth + 1)
        elif hasattr(x, "__dataclass_fields__"):
            for k in x.__dataclass_fields__:
                walk(getattr(x, k, None), depth + 1)
        elif hasattr(x, "tobytes") and hasattr(x, "shape"):  # a numpy array
            h.update(x.tobytes())
        elif isinstance(x, (int, float, str, bool)) or x is None:
            h.update(repr(x).encode())
        elif hasattr(x, "items"):  # a BatchEncoding-like mapping
            for k, v in x.items():
                h.update(str(k).encode())
                walk(v, depth + 1)
        else:
            h.update(repr(type(x)).encode())

    walk(obj, 0)
    return h.hexdigest()


def trained_modules(state: Mapping[str, Any]) -> list[Any]:
    """The modules of a training dict that its training trains: ``state['model']``, and every other
    ``torch.nn.Module`` of the dict with a parameter an optimizer of the dict steps (the prepared wrappers of
    Accelerate looked through)."""
    model = state.get("model")
    out = [model] if isinstance(model, torch.nn.Module) else []
    stepped: set[int] = set()
    for value in state.values():
        inner = unwrap_prepared(value)
        if isinstance(inner, torch.optim.Optimizer):
            stepped.update(id(p) for group in inner.param_groups for p in group["params"])
    if not stepped:
        return out
    for value in state.values():
        if (
            isinstance(value, torch.nn.Module)
            and all(value is not m for m in out)
            and any(id(p) in stepped for p in value.parameters())
        ):
            out.append(value)
    return out


def loader_key(state: Mapping[str, Any]) -> str | None:
    """The key of the training dataloader in a training dict: a ``torch.utils.data.DataLoader`` (Accelerate's
    prepared loaders and torchdata's StatefulDataLoader are ones) under ``dataloader`` / ``train_dataloader``
    / ``train_loader``, or the only one the dict holds. None when there is none (or several, none so named)."""
    from torch.utils.data import DataLoader

    found = [k for k, v in state.items() if isinstance(k, str) and isinstance(v, DataLoader)]
    for name in ("dataloader", "train_dataloader", "train_loader"):
        if name in found:
            return name
    return found[0] if len(found) == 1 else None


#: why the data position is not judged when the resume's data path is not the user's own or not visible
DEFAULT_LOAD = (
    "the resume is dlcheck's own stand-in (accelerator.load_state: no dlcheck_load_checkpoint), not your loop's, "
    "so where your loop resumes the epoch is not visible to dlcheck"
)
UNTOUCHED = (
    "your dlcheck_load_checkpoint leaves state['{key}'] as the factory built it (neither replaced nor its state "
    "loaded), so where your loop resumes the epoch (a skip in the epoch loop, outside the load) is not visible to "
    "dlcheck"
)


@contextlib.contextmanager
def _loads_watched(loader: Any) -> Iterator[list[int]]:
    """While active, a call of the loader's own ``load_state_dict`` (a stateful loader restored by the user's
    load or by ``accelerator.load_state``) is counted in the yielded list. The fresh loader is dlcheck's (built
    by the factory for this run); the instance attribute is removed afterwards."""
    calls: list[int] = []
    real = getattr(loader, "load_state_dict", None)
    if not callable(real):
        yield calls
        return

    def load_state_dict(*args: Any, **kwargs: Any) -> Any:
        calls.append(1)
        return real(*args, **kwargs)

    try:
        object.__setattr__(loader, "load_state_dict", load_state_dict)
    except (AttributeError, TypeError):  # slots, a read-only attribute: the state compared is what is left
        yield calls
        return
    try:
        yield calls
    finally:
        with contextlib.suppress(AttributeError):
            object.__delattr__(loader, "load_state_dict")


def _same_state(a: Any, b: Any) -> bool:
    """Whether two loader ``state_dict()`` snapshots are the same (tensors compared by value)."""
    if isinstance(a, torch.Tensor) or isinstance(b, torch.Tensor):
        return isinstance(a, torch.Tensor) and isinstance(b, torch.Tensor) and torch.equal(a, b)
    if isinstance(a, Mapping) and isinstance(b, Mapping):
        return a.keys() == b.keys() and all(_same_state(a[k], b[k]) for k in a)
    if isinstance(a, (list, tuple)) and isinstance(b, (list, tuple)):
        return len(a) == len(b) and all(_same_state(x, y) for x, y in zip(a, b, strict=True))
    try:
        return bool(a == b)
    except Exception:  # noqa: BLE001 - an object without a usable equality: taken as changed
        return False


def _loader_state(loader: Any) -> Any:
    """A stateful loader's ``state_dict()`` (torchdata's StatefulDataLoader), or None."""
    if not callable(getattr(loader, "load_state_dict", None)):
        return None
    try:
        return copy.deepcopy(loader.state_dict())
    except Exception:  # noqa: BLE001 - e.g. Accelerate's DataLoaderShard without a stateful loader
        return None


def _draws(
    get: Callable[[], Any], start: int, n: int, out: list[Any], first: Any = None, starts: Iterator[None] | None = None
) -> Iterator[Any]:
    """Batches ``start .. start+n-1`` of a run drawn from the loader ``get()`` returns (a new epoch when it
    runs out), each with the global RNGs set by its position; the examples of each are written to ``out``.
    ``first``: the iterable the current epoch is drawn from instead (what the user's loop trains on after a
    resume, ``dlcheck_resume_dataloader``'s), the next epochs from ``get()``. ``starts``: advanced once before
    each epoch drawn from ``get()`` (the top of the user's epoch loop, :meth:`LoopSetup._epoch_starts`)."""
    it = None
    for p in range(start, start + n):
        seed_all(DRAW_SEED + p)
        with _seeded_examples(get()):
            if it is None:
                if first is None and starts is not None:
                    next(starts)
                it = iter(first if first is not None else get())
            try:
                batch = next(it)
            except StopIteration:
                seed_all(DRAW_SEED + p)
                if starts is not None:
                    next(starts)
                it = iter(get())
                try:
                    batch = next(it)
                except StopIteration:
                    return
        seed_all(DRAW_SEED + p)  # the step's own draws: the same in both runs whatever the examples drew
        out.append(example_digests(batch, labels_restore(getattr(get(), "collate_fn", None))))
        yield batch


class _Saving:
    """The after-step hook of an uninterrupted run: saves with the user's function right after the first
    optimizer step at or past micro-step ``save_from`` (never inside a gradient accumulation) and before the
    last, keeps the state at the save on disk (the diagnostic resumes' truth), then digests the weights after
    every later step (what the resumed steps are compared with). ``tolerant``: a save that raises leaves no
    baseline instead of ending the run (the shared smoke run's checks do not depend on C1's save)."""

    def __init__(
        self,
        setup: LoopSetup,
        state: dict[str, Any],
        traj: Trajectory,
        total: int,
        save_from: int,
        tolerant=False,
        opt_steps=False,
        path: Path | None = None,
        every: tuple[Any, int | None] | None = None,
        after: int = 0,
    ):
        self.setup, self.state, self.traj, self.total, self.save_from = setup, state, traj, total, save_from
        #: the user's checkpoint cadence (``("epoch", epoch length)`` or ``(N, None)``): the save is made at the
        #: first such point at or past ``save_from``, and :meth:`done` ends the run ``after`` micro-steps later
        self.every, self.after = every, after
        self.tolerant, self.truth, self.failed, self.opt_calls = tolerant, {}, False, 0
        #: ``save_from`` counts optimizer steps (the smoke run: save right after optimizer step ``save_from``)
        self.opt_steps = opt_steps
        self.path = path if path is not None else setup.tmp.mktemp("dlcheck-ckpt") / "checkpoint"

    def __call__(self, i: int) -> None:
        stepped = self.traj.calls.count("opt") > self.opt_calls
        self.opt_calls = self.traj.calls.count("opt")
        reached = self.opt_calls >= self.save_from if self.opt_steps else self.save_from <= i + 1
        if reached and self.every is not None:
            every, epoch = self.every
            reached = (i + 1) % epoch == 0 if every == "epoch" else self.opt_calls % int(every) == 0
        if "_saved_at" in self.truth:
            self.traj.digests.append((i + 1, digest(self.state["model"])))
        elif not self.failed and reached and i + 1 < self.total and stepped:
            try:
                user_call("save_checkpoint", lambda: self.setup.save(self.state, str(self.path)))
            except RoleError:
                if not self.tolerant:
                    raise
                self.failed = True
                return
            self.truth.update(
                _saved_truth(self.state, self.setup.tmp.mktemp("dlcheck-truth") / "state.pt", self.setup._step_fn())
            )
            self.truth["_saved_at"] = i + 1
            self.saved_opt = self.opt_calls  # the optimizer steps made at the save
            self.traj.notes["saved_opt"] = self.opt_calls

    def done(self) -> bool:
        """True once the run has trained ``after`` micro-steps past its save (a run at the user's cadence)."""
        return "_saved_at" in self.truth and len(self.traj.steps) >= self.truth["_saved_at"] + self.after

    def baseline(self) -> Baseline | None:
        if "_saved_at" not in self.truth or self.truth["_saved_at"] >= len(self.traj.steps):
            return None  # no save, or nothing trained after it (the run ended at the save)
        self.traj.notes["ema"] = _ema_end(self.state)
        self.traj.notes["scalers"] = scaler_ends(self.state)
        pieces = {p: "" for p in self.truth if not p.startswith("_") and p != "generators"}
        return Baseline(self.traj, self.truth, self.path, pieces)


def _files_under(path: Path) -> set[str]:
    """Every file at ``path`` (a file, or a directory's files at any depth, or ``path`` + a suffix)."""
    found = [path] if path.is_file() else list(path.rglob("*")) if path.is_dir() else []
    found += [p for p in path.parent.glob(path.name + "?*") if p.is_file()]
    return {str(p.resolve()) for p in found if p.is_file()}


def _wrote_nothing(path: Path) -> bool:
    """True when nothing named like ``path`` (the file, a directory, or ``path`` + a suffix) exists."""
    return not path.exists() and not any(p.name.startswith(path.name) for p in path.parent.iterdir())


def _ema_end(state: dict[str, Any]) -> dict[str, Any]:
    """The EMAs of the state at the end of a run (C1 compares them: an EMA does not feed the loss, so a
    resume that loses it shows in no loss and no weight of the model)."""
    return {
        name: {"what": ema_describe(f"state['{name}']", ema), "tensors": ema_state(ema), "counter": ema_counter(ema)}
        for name, ema in find_emas(state)
    }


def _saved_truth(state: dict[str, Any], file: Path, step: Any = None) -> dict[str, Any]:
    """The state at a save, for the diagnostic resumes: the state dict of every piece that has one (model,
    optimizer, scheduler, EMA…) written to ``file`` as it stands, with no copy in memory (at most one extra
    copy of the training state is alive at a time), replaced by :class:`OnDisk` handles; the RNG states
    (small) stay in memory. A piece whose state cannot be read is not one a diagnosis can put back."""
    heavy = {}
    for key, obj in state.items():
        if hasattr(obj, "state_dict") and hasattr(obj, "load_state_dict"):
            try:
                heavy[key] = obj.state_dict()
            except Exception:  # noqa: BLE001 - e.g. Accelerate's DataLoaderShard without a stateful loader
                continue  # an object whose state cannot be read is not a piece the diagnosis can put back
    truth: dict[str, Any] = {"rng": rng_state(), "generators": generator_states(own_generators(state, step))}
    if heavy:
        torch.save(heavy, file)
        truth.update({k: OnDisk(file, k) for k in heavy})
    return truth


@contextlib.contextmanager
def _generators_kept(found: Mapping[str, torch.Generator], states: Mapping[str, torch.Tensor]) -> Iterator[None]:
    """Put the generators found back in the states given once the block ends."""
    try:
        yield
    finally:
        for where, gen in found.items():
            gen.set_state(states[where])


def _loop_restore(
    state: dict[str, Any], truth: dict[str, Any], restore: frozenset[str], generators: Any = None
) -> None:
    truth = {
        k: (v.load() if isinstance(v, OnDisk) else v)
        for k, v in truth.items()
        if k in restore or (k == "generators" and "rng" in restore)
    }
    for piece in restore:
        if piece in truth and piece in state and piece not in ("rng", "generators"):
            if isinstance(state[piece], torch.nn.Module):
                # the user's load may have changed the module's structure (a PEFT adapter added under another
                # name): put back every tensor the saved state had, leave what the load added
                state[piece].load_state_dict(copy.deepcopy(truth[piece]), strict=False)
            else:
                state[piece].load_state_dict(copy.deepcopy(truth[piece]))
    put_back_rng(truth, restore, generators)


def _fingerprints(model: Any) -> dict[str, str]:
    """A hash of every tensor of the model's state dict: equal weights, equal fingerprints (no copy kept)."""
    import hashlib

    out = {}
    for k, v in model.state_dict().items():
        data = v.detach().cpu().contiguous().reshape(-1)
        out[k] = hashlib.sha1(data.view(torch.uint8).numpy().tobytes()).hexdigest() if data.numel() else ""
    return out


#: the most micro-steps C2 trains between its two saves waiting for the optimizer to step (an accumulation), and
#: C1's uninterrupted run is doubled to (:func:`~.runs.past_accumulation`)
_ACCUMULATION_LIMIT = ACCUMULATION_LIMIT

#: the furthest micro-step C1's runs reach for the user's checkpoint cadence (``dlcheck_checkpoint_every``), when
#: twice ``C1.steps`` is less: an epoch of up to this many batches is judged at its end
CADENCE_STEPS = 64


def cadence_bound(total: int) -> int:
    """The last micro-step after which a run of ``total`` steps may save at the user's cadence."""
    return max(2 * total, CADENCE_STEPS)


def training_epoch(state: Mapping[str, Any], loader: Any, bound: int | None = None) -> tuple[int | None, str]:
    """The micro-steps of an epoch: the length of the loader the training dict holds, else of
    ``dlcheck_dataloader``; else (given ``bound``) its epoch counted by iterating its sampler once
    (:func:`counted_epoch`). Returns (the epoch or None, why none / how it was counted; empty for a length)."""
    key = loader_key(state)
    sources = ([state[key]] if key is not None else []) + ([loader] if loader is not MISSING else [])
    for source in sources:
        try:
            return len(source), ""
        except TypeError:
            continue
    if bound is None or not sources:
        return None, "your training loader has no length, so an epoch's end is not known"
    return counted_epoch(sources[0], bound)


def beyond_reach(every: Any, total: int) -> bool:
    """True when the user's cadence is every N optimizer steps with N past :func:`cadence_bound` (a micro-step makes
    at most one optimizer step, so no multiple of N is reached): C1's runs then save at a reachable optimizer step
    (:func:`reach_words` says which, and that it is not the cadence)."""
    if every is MISSING or every == "epoch" or isinstance(every, bool):
        return False
    try:
        return int(every) > cadence_bound(total)
    except (TypeError, ValueError):
        return False


def reach_words(every: Any, saved_opt: Any, bound: int) -> str:
    """Where a resume of a cadence out of reach is judged, in words."""
    return (
        f"judged at optimizer step {saved_opt}, not at your cadence ({cadence_words(every)}), which lies past the "
        f"{bound} micro-steps C1 trains before its save (max(2 x C1.steps, {CADENCE_STEPS})): what a resume loses "
        "(optimizer moments, scheduler, RNG states, the position in the epoch) does not depend on the mid-run step "
        "it is saved at; your save and load run there, with your step counters as they stand there"
    )


def counted_epoch(loader: Any, bound: int) -> tuple[int | None, str]:
    """The batches of one epoch of a loader without a length (a sampler without ``__len__``), counted by iterating
    its batch sampler (else its sampler) once, loading no data, from the global RNGs at :data:`SEED` (where the runs
    draw their first epoch) and once more from other states: an epoch whose length depends on its draws has no
    known end. Stops past ``bound`` batches. The global RNGs and the loader's generators are put back. Returns
    (the epoch or None, how it was counted or why not)."""
    from torch.utils.data import IterableDataset

    none = "your training loader has no length"
    sampler = getattr(loader, "batch_sampler", None)
    if sampler is None:
        sampler = getattr(loader, "sampler", None)
    if sampler is None or isinstance(getattr(loader, "dataset", None), IterableDataset):
        return None, f"{none} and no sampler to count an epoch with, so an epoch's end is not known"
    counts = []
    with preserved_rng(), preserved_dataloader(loader):
        for seed in (SEED, SEED + 1):
            seed_all(seed)
            n = 0
            try:
                for _ in sampler:
                    n += 1
                    if n > bound:
                        break
            except Exception as exc:  # noqa: BLE001 - a sampler that cannot be iterated alone: not counted
                return None, f"{none}, and iterating its sampler alone raised {type(exc).__name__}: {exc}"
            counts.append(n)
    if counts[0] > bound:
        return None, (
            f"{none}, and an epoch of its sampler (iterated once, no data loaded) runs past the {bound} micro-steps "
            f"C1 trains at most before its save (max(2 x C1.steps, {CADENCE_STEPS}))"
        )
    if counts[0] != counts[1] or not counts[0]:
        return None, (
            f"{none}, and its sampler's epochs differ in length ({counts[0]} and {counts[1]} batches, iterated from "
            "two RNG states), so an epoch's end is not known"
        )
    n = counts[0]
    return n, f"an epoch of {n} batches, counted by iterating its sampler once (your loader has no length)"


def cadence_words(every: Any) -> str:
    """``dlcheck_checkpoint_every = 'epoch'`` / ``= 50``."""
    return f"dlcheck_checkpoint_every = {every!r}"


def cadence_point(every: Any) -> str:
    """Where the user's loop saves, in words."""
    return (
        "end of an epoch after an optimizer step"
        if every == "epoch"
        else f"optimizer step that is a multiple of {every}"
    )


def off_cadence(every: Any, why: str) -> str:
    """The reason C1 gives for a resume it does not judge at the user's checkpoint cadence."""
    return (
        f"the resume is not judged at your checkpoint cadence ({cadence_words(every)}): {why}; a save anywhere else "
        "would not be where your loop saves, so none is judged"
    )


def epoch_too_long(epoch: int, first: int, bound: int, total: int) -> str:
    return (
        f"an epoch of your training loader is {epoch} micro-steps, and its end (micro-step {first}) lies past the "
        f"{bound} micro-steps C1 trains at most before its save (max(2 x C1.steps, {CADENCE_STEPS}); raise C1.steps "
        f"to {-(-first // 2)} with --dlcheck-set C1.steps=N, or hand over a shorter loader)"
    )


def missing_checkpoint_roles(setup: LoopSetup) -> str:
    """The missing role of a resume: the save, the load or both, each with what it stands for. A save handed
    over without a load (a script that writes its weights and never resumes) names the load alone."""
    names = [f"dlcheck_{n}_checkpoint" for n, f in (("save", setup.save), ("load", setup.load)) if f is MISSING]
    what = (
        "your save and your resume (state, path)"
        if len(names) == 2
        else "your save (state, path)"
        if setup.save is MISSING
        else "your resume, loading what your save writes into fresh objects (state, path); a script that never "
        "resumes has nothing to judge here"
    )
    return f"missing role: define fixture {' and '.join(names)} in conftest.py: {what}"


def loop_interrupted_save(setup: LoopSetup) -> InterruptedSave:
    """Save a checkpoint, train a step, save again to the same path and interrupt that save half way; then
    load the path into fresh objects with the user's load function."""
    if setup.save is MISSING or setup.load is MISSING:
        raise SetupError(missing_checkpoint_roles(setup))
    path = setup.tmp.mktemp("dlcheck-atomic") / "checkpoint"
    first = setup.state()
    first_target = _save_target(setup, first) if _counters(first) else None
    user_call("save_checkpoint", lambda: setup.save(first, str(path)))
    old_weights = _fingerprints(first["model"])
    first = None  # one training state alive at a time
    # the control: the checkpoint must load when nothing interrupts anything, or an interrupted save is
    # not what would break the resume (torch >= 2.6 loads with weights_only=True: a checkpoint holding an
    # argparse.Namespace, as torchvision's references save, fails to load either way)
    control = setup.state()
    control_error = None
    try:
        with preserved_rng():
            setup.load(control, str(path))
    except Exception as exc:  # noqa: BLE001 - the user's load failing is reported, not raised
        # judged on the files alone below: a save that cuts the previous checkpoint's own file destroys it whatever
        # the load does; a save beside it cannot be judged without a load that works
        control_error = (
            f"dlcheck_load_checkpoint fails on the checkpoint dlcheck_save_checkpoint has just written, with no "
            f"interruption: {type(exc).__name__}: {' '.join(str(exc).split())[:240]} (C1 reports the failing resume)"
        )
    control = None
    sizes = {
        p.name: p.stat().st_size
        for p in ([path] if path.is_file() else path.parent.glob(path.name + "*"))
        if p.is_file()
    }
    second = setup.state()
    # one optimizer step between the saves, as a loop saves after one: under gradient accumulation that is several
    # micro-steps (a save named after the optimizer steps taken, step_{completed_steps}, moves on only then)
    traj = Trajectory()
    watched = second.get("optimizer") is not None
    limit = _ACCUMULATION_LIMIT if watched else 1
    with preserved_rng():
        setup.run(
            second,
            setup._stream(limit),
            0,
            traj,
            stop=lambda: not watched or traj.calls.count("opt") >= 1,
            planned=limit,
        )
    new_weights = _fingerprints(second["model"])
    written_before = _files_under(path)
    to_save, advanced = _as_next_save(setup, first_target, second)
    with interrupted_saves() as hits:
        try:
            user_call("save_checkpoint", lambda: setup.save(to_save, str(path)))
        except SaveInterrupted:
            pass
    if not hits:
        raise SetupError(
            "dlcheck_save_checkpoint does not write through torch.save or safetensors' save_file: it "
            "cannot be interrupted half way"
        )
    after = {
        p.name: p.stat().st_size
        for p in ([path] if path.is_file() else path.parent.glob(path.name + "*"))
        if p.is_file()
    }
    size_text = "; ".join(f"{n}: {sizes.get(n, 0)} -> {after.get(n, 0)} bytes" for n in sorted(set(sizes) | set(after)))
    second = None
    if control_error is not None:
        if str(Path(hits[0]).resolve()) not in written_before:
            raise SetupError(f"cannot judge an interrupted save: {control_error}")
        # the interrupted save cut the previous checkpoint's own file: gone, whatever a load would do with it
        return InterruptedSave(
            "dlcheck_save_checkpoint",
            hits[0],
            str(path),
            f"(not loaded: {control_error}) the file of the previous checkpoint now holds the first half of the new "
            "save's bytes",
            sizes=size_text,
            overwrote=True,
            advanced=advanced,
        )
    third = setup.state()
    try:
        with preserved_rng():
            setup.load(third, str(path))
    except SaveInterrupted:
        raise
    except Exception as exc:  # noqa: BLE001 - the user's load failing is the finding
        overwrote = str(Path(hits[0]).resolve()) in written_before
        third = None
        return InterruptedSave(
            "dlcheck_save_checkpoint",
            hits[0],
            str(path),
            f"{type(exc).__name__}: {str(exc).splitlines()[0][:200]}",
            sizes=size_text,
            overwrote=overwrote,
            advanced=advanced,
            without_new=None if overwrote else _load_without(setup, path, written_before, old_weights, new_weights),
        )
    loaded = _fingerprints(third["model"])
    which = "previous" if loaded == old_weights else "new" if loaded == new_weights else "mixed"
    return InterruptedSave("dlcheck_save_checkpoint", hits[0], str(path), None, which, size_text, advanced=advanced)


def _counters(state: dict[str, Any]) -> dict[str, Any]:
    """The training state's counters (an int, or a one-int list as loops keep a mutable step), each one on."""
    out: dict[str, Any] = {}
    for key, value in state.items():
        if isinstance(value, int) and not isinstance(value, bool):
            out[key] = value + 1
        elif (
            isinstance(value, list) and len(value) == 1 and isinstance(value[0], int) and not isinstance(value[0], bool)
        ):
            out[key] = [value[0] + 1]
    return out


def _save_target(setup: LoopSetup, state: dict[str, Any]) -> str | None:
    """Where the user's save writes its first file for ``state``, relative to the path it is given (a dry
    save into a scratch directory: nothing is written through torch.save or save_file)."""
    root = setup.tmp.mktemp("dlcheck-where")
    with interrupted_saves(dry=True) as hits:
        try:
            user_call("save_checkpoint", lambda: setup.save(state, str(root / "checkpoint")))
        except SaveInterrupted:
            pass
    return os.path.relpath(hits[0], root) if hits and isinstance(hits[0], str) and os.path.isabs(hits[0]) else None


def _as_next_save(setup: LoopSetup, first: str | None, state: dict[str, Any]) -> tuple[dict[str, Any], str]:
    """The state as the loop's next save sees it. A save that names its files after a counter of the training
    state (netG_epoch_{epoch}.pth) is made once per value of it: the loop advances the counter between two
    saves, so when the training step did not (an epoch counter), the second save is made with the counters one
    on. Otherwise the state as it is. ``first``: where the first save wrote."""
    counters = _counters(state)
    here = _save_target(setup, state) if counters else None
    if here is None or here != first:
        return state, ""
    # the counters the save's names depend on, each probed alone (a run's num_epochs does not move between saves)
    counters = {k: v for k, v in counters.items() if _save_target(setup, {**state, k: v}) not in (None, here)}
    if not counters:
        return state, ""
    advanced = {**state, **counters}
    there = _save_target(setup, advanced)
    said = ", ".join(
        f"{k} {state[k] if isinstance(state[k], int) else state[k][0]} -> {v if isinstance(v, int) else v[0]}"
        for k, v in counters.items()
    )
    return advanced, f"{said} (your save names its files after them: {here} -> {there})"


def _load_without(
    setup: LoopSetup, path: Path, before: set[str], old_weights: dict[str, str], new_weights: dict[str, str]
) -> str | None:
    """Put the files the interrupted save added aside and load again: which weights the previous checkpoint
    gives ("previous" when it is intact), or None when the load still fails."""
    import shutil

    aside = setup.tmp.mktemp("dlcheck-aside")
    new = {Path(f) for f in _files_under(path) if f not in before}
    old_dirs = {Path(f).parent for f in before} | {path.resolve()}
    # the topmost new entry of each new file (a new step_N directory moves as one: a load that picks the newest
    # directory must not find it left empty)
    tops = set()
    for f in new:
        while f.parent not in old_dirs and f.parent != f.parent.parent and path.resolve() in f.parent.parents:
            f = f.parent
        tops.add(str(f))
    moved = sorted(tops)
    for i, f in enumerate(moved):
        shutil.move(f, aside / str(i))
    try:
        state = setup.state()
        with preserved_rng():
            setup.load(state, str(path))
        loaded = _fingerprints(state["model"])
    except Exception:  # noqa: BLE001 - the previous checkpoint does not load either: the finding stands
        return None
    finally:
        for i, f in enumerate(moved):
            shutil.move(aside / str(i), f)
    return "previous" if loaded == old_weights else "new" if loaded == new_weights else "mixed"
