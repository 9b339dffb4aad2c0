"""Kind 4: Hugging Face Accelerate. The user's ``dlcheck_make_training`` returns their ``Accelerator`` under
``"accelerator"`` with what it prepared (``model``, ``optimizer``, ``lr_scheduler``, any ``ema``, ...);
their step (``dlcheck_train_step``) runs as they wrote it (``with accelerator.accumulate(model):``,
``accelerator.backward(loss)``, ``if accelerator.sync_gradients:``). Everything a plain loop has works the
same; what differs:

- without ``dlcheck_train_step``, the default step is the Accelerate one (``accumulate``, ``backward``,
  optimizer and scheduler stepped through their prepared wrappers);
- without ``dlcheck_save_checkpoint`` / ``dlcheck_load_checkpoint``, checkpoints are Accelerate's own
  ``accelerator.save_state(path)`` / ``accelerator.load_state(path)`` (C1, C2 and C10 judge those); with a
  load and no save, ``save_state`` stands in for the save; with a save and no load, nothing stands in for the
  load (the user's save may write files ``load_state`` never reads: C1, C2 and C3 name the missing
  ``dlcheck_load_checkpoint``; C10 loads a save made through ``save_state`` with ``load_state``, said so);
- :func:`round_trip` saves a trained state and loads it into fresh objects, piece by piece (C10).

Every fresh state comes from the user's factory, so it has its own ``Accelerator`` (Accelerate shares its
process state between instances; a second ``Accelerator()`` in one process is what its own tests do)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import torch

from ..errors import MISSING
from ..guard import preserved_rng
from ..session import user_call
from .loop import LoopSetup
from .runs import (
    ACCUMULATION_LIMIT,
    SEED,
    NoStepToSaveAfter,
    SetupError,
    Trajectory,
    as_float,
    device_of,
    first_difference,
    past_accumulation,
    plain_state,
    seed_all,
    to_device,
    unwrap_prepared,
)


def is_accelerator(obj: Any) -> bool:
    return any(c.__name__ == "Accelerator" and c.__module__.startswith("accelerate.") for c in type(obj).__mro__)


def accelerator_of(state: Any) -> Any:
    """The ``Accelerator`` in a training state dict (under "accelerator", or any value that is one)."""
    if not isinstance(state, Mapping):
        return None
    if is_accelerator(state.get("accelerator")):
        return state["accelerator"]
    return next((v for v in state.values() if is_accelerator(v)), None)


class AccelerateSetup(LoopSetup):
    kind = "accelerate"
    #: the smoke run's trained state (an Accelerator and its prepared objects) stays in memory
    offload_trained = False

    def __init__(self, *args: Any, **kwargs: Any):
        super().__init__(*args, **kwargs)
        self.name = "dlcheck_make_training"
        self.user_save, self.user_load = self.save, self.load
        # Accelerate's own save_state stands in for a save not handed over, and load_state for a load only when
        # the save is the stand-in too: paired with the user's own save (a save_pretrained of the weights), a
        # load_state would read files that save never writes, and a script that never resumes has no load to
        # judge (C1, C2, C3: missing role dlcheck_load_checkpoint)
        if self.save is MISSING:
            self.save = _save_state
        if self.load is MISSING and self.user_save is MISSING:
            self.load = _load_state

    def describe(self) -> str:
        step = (
            "dlcheck_train_step"
            if self.train_step is not MISSING
            else "the Accelerate step (accelerator.accumulate, accelerator.backward, prepared optimizer and scheduler)"
        )
        return f"fresh Accelerator-prepared objects from dlcheck_make_training, trained by {step}"

    def checkpoint_how(self) -> str:
        if self.user_save is MISSING and self.user_load is MISSING:
            return "accelerator.save_state / accelerator.load_state"
        if self.user_save is MISSING:
            return "accelerator.save_state (dlcheck's stand-in: no dlcheck_save_checkpoint) / dlcheck_load_checkpoint"
        if self.user_load is MISSING:
            return "dlcheck_save_checkpoint / accelerator.load_state (dlcheck's stand-in: no dlcheck_load_checkpoint)"
        return "dlcheck_save_checkpoint / dlcheck_load_checkpoint"

    def loaded_by(self) -> str:
        """Who loads in a resume, in the evidence's words: the user's load, or Accelerate's own stand-in."""
        return "accelerator.load_state" if self.user_load is MISSING else "your dlcheck_load_checkpoint"

    def saved_by(self) -> str:
        return "accelerator.save_state" if self.user_save is MISSING else "your dlcheck_save_checkpoint"

    def saved_state(self) -> tuple[Any, list[tuple[str, Any]], str]:
        model, saved, how = super().saved_state()
        return model, saved, ("accelerator.save_state" if self.user_save is MISSING else how)

    def fresh(self) -> Any:
        got = super().fresh()
        make = got.make_optimizer

        def inner() -> tuple[Any, Any]:
            opt, sched = make()
            return unwrap_prepared(opt), unwrap_prepared(sched) if sched is not None else None

        got.make_optimizer = inner
        return got

    def step(self, state: dict[str, Any], batch: Any, index: int) -> float | None:
        if self.train_step is not MISSING:
            return super().step(state, batch, index)
        accelerator = accelerator_of(state)
        model, opt, sched = state["model"], state.get("optimizer"), state.get("lr_scheduler")
        if opt is None:
            raise SetupError("dlcheck_make_training returned no 'optimizer' (and no dlcheck_train_step was given)")
        batch = to_device(batch, device_of(model))
        model.train()
        with accelerator.accumulate(model):
            loss = self.loss_of(model, batch)
            accelerator.backward(loss)
            opt.step()
            if sched is not None:
                sched.step()
            opt.zero_grad(set_to_none=True)
        return as_float(loss)


def _save_state(state: dict[str, Any], path: str) -> None:
    """The default save (no dlcheck_save_checkpoint): what it raises is the user's Accelerator's, from their
    factory — reported as dlcheck_make_training, not as a save fixture they never defined."""
    user_call("make_training", lambda: accelerator_of(state).save_state(path))


def _load_state(state: dict[str, Any], path: str) -> None:
    user_call("make_training", lambda: accelerator_of(state).load_state(path))


def _stand_in_load(state: dict[str, Any], path: str) -> None:
    """Accelerate's ``load_state`` on what the user's own save wrote through ``save_state`` (no
    dlcheck_load_checkpoint): what it raises is dlcheck's pairing, not the user's load, nor their factory."""
    try:
        accelerator_of(state).load_state(path)
    except Exception as exc:  # noqa: BLE001 - said as the missing role it is, with what the stand-in raised
        raise SetupError(
            "missing role: define fixture dlcheck_load_checkpoint (state, path) in conftest.py: your resume "
            "(dlcheck's stand-in accelerator.load_state(path) raised "
            f"{type(exc).__name__}: {str(exc)[:240]} on what your dlcheck_save_checkpoint wrote at path)"
        ) from exc


# --------------------------------------------------------------------------------------------------
# C10: what save_state / load_state carries over


@dataclass
class Piece:
    key: str  # the key in the training state
    kind: str  # the object's class name
    registered: str | None  # how Accelerate knows it (prepared model/optimizer/scheduler, registered), or None
    restored: bool | None  # None: its state cannot be read
    detail: str = ""  # the first difference (restored False) or a short description (True)


@dataclass
class RoundTrip:
    steps: int  # micro-steps trained before the save
    opt_steps: int
    path: str
    files: list[str]
    pieces: list[Piece] = field(default_factory=list)
    stateful_loader: bool | None = None  # DataLoaderConfiguration(use_stateful_dataloader=...)
    via_save_state: bool = True  # the save went through Accelerator.save_state (dlcheck's default save always does)


def _calls_save_state(save: Any) -> bool:
    """Run ``save`` (under preserved RNG states) and tell whether it went through ``Accelerator.save_state``: a
    script of its own ``torch.save`` dict on an Accelerate loop (lucidrains' Trainer) does not. The class's method
    is wrapped for the call only and put back."""
    from accelerate import Accelerator

    seen: list[bool] = []
    original = Accelerator.__dict__["save_state"]

    def save_state(self: Any, *args: Any, **kwargs: Any) -> Any:
        seen.append(True)
        return original(self, *args, **kwargs)

    Accelerator.save_state = save_state
    try:
        with preserved_rng():
            save()
    finally:
        Accelerator.save_state = original
    return bool(seen)


def _registered(accelerator: Any, obj: Any) -> str | None:
    inner = unwrap_prepared(obj)
    for attr, what in (
        ("_models", "prepared model"),
        ("_optimizers", "prepared optimizer"),
        ("_schedulers", "prepared scheduler"),
        ("_dataloaders", "prepared dataloader"),
        ("_custom_objects", "register_for_checkpointing"),
    ):
        for known in getattr(accelerator, attr, None) or []:
            if known is obj or known is inner or unwrap_prepared(known) is inner:
                return what
            if getattr(known, "module", None) is obj or getattr(known, "_orig_mod", None) is obj:
                return what
    return None


def _readable_state(obj: Any) -> Any:
    """The object's state as comparable plain data (tensors cloned), or MISSING when it has none."""
    if is_accelerator(obj) or isinstance(obj, (torch.utils.data.DataLoader,)):
        return MISSING
    if not (callable(getattr(obj, "state_dict", None)) and callable(getattr(obj, "load_state_dict", None))):
        return MISSING
    try:
        sd = obj.state_dict()
    except Exception:  # noqa: BLE001 - e.g. a prepared non-stateful DataLoader
        return MISSING
    return plain_state(sd)


def describe_state(key: str, value: Any) -> str:
    if isinstance(value, Mapping):
        counters = [f"{k} {value[k]}" for k in ("last_epoch", "optimization_step", "n_averaged", "step") if k in value]
        tensors = sum(1 for v in _leaves(value) if isinstance(v, torch.Tensor))
        return ", ".join([f"{tensors} tensors", *map(str, counters)])
    return type(value).__name__


def _leaves(value: Any) -> Any:
    if isinstance(value, Mapping):
        for v in value.values():
            yield from _leaves(v)
    elif isinstance(value, list):
        for v in value:
            yield from _leaves(v)
    else:
        yield value


def _trained(setup: AccelerateSetup, micro_steps: int) -> tuple[dict[str, Any], int]:
    """Fresh objects trained ``micro_steps`` micro-steps with the user's step, and the optimizer steps made;
    NoStepToSaveAfter when a gradient accumulation outlasts them (:func:`~.runs.past_accumulation` lengthens)."""
    trained = setup.state()
    if accelerator_of(trained) is None:
        raise SetupError("dlcheck_make_training returned no Accelerator")
    traj = Trajectory()
    with preserved_rng():
        seed_all(SEED)
        setup.run(trained, setup.batches(micro_steps), 0, traj)
    opt_steps = traj.calls.count("opt")
    if opt_steps == 0:
        raise NoStepToSaveAfter(
            f"no optimizer step in {micro_steps} micro-steps of your step (C10 doubles C10.micro_steps up to "
            f"{ACCUMULATION_LIMIT} while a gradient accumulation outlasts them; raise C10.micro_steps above your "
            "gradient accumulation)"
        )
    return trained, opt_steps


def round_trip(setup: AccelerateSetup, micro_steps: int) -> RoundTrip:
    """Train fresh objects ``micro_steps`` micro-steps with the user's step (doubled, as C1's runs are, while a
    gradient accumulation leaves no optimizer step in them: :func:`~.runs.past_accumulation`), save with the
    user's save (or ``accelerator.save_state``), load into other fresh objects with the user's load (or
    ``load_state``), and compare every stateful piece of the two training states."""
    micro_steps, (trained, opt_steps) = past_accumulation(lambda n: _trained(setup, n), micro_steps)
    accelerator = accelerator_of(trained)
    saved = {k: _readable_state(v) for k, v in trained.items()}
    path = setup.tmp.mktemp("dlcheck-accelerate") / "checkpoint"
    via_save_state = _calls_save_state(lambda: user_call("save_checkpoint", lambda: setup.save(trained, str(path))))
    files = sorted(str(p.relative_to(path)) for p in path.rglob("*") if p.is_file()) if path.is_dir() else []
    config = getattr(accelerator, "dataloader_config", None)
    result = RoundTrip(
        micro_steps,
        opt_steps,
        str(path),
        files,
        stateful_loader=getattr(config, "use_stateful_dataloader", None),
        via_save_state=via_save_state,
    )
    if not via_save_state:
        return result  # a checkpoint of the user's own making: C10's question does not concern it, nothing is loaded
    loaded = setup.state()
    initial = {k: _readable_state(v) for k, v in loaded.items()}
    with preserved_rng():
        seed_all(SEED + 1)
        if setup.load is not MISSING:
            user_call("load_checkpoint", lambda: setup.load(loaded, str(path)))
        else:
            _stand_in_load(loaded, str(path))
    for key, obj in trained.items():
        before = saved.get(key, MISSING)
        if (
            before is MISSING
            or initial.get(key, MISSING) is not MISSING
            and first_difference(before, initial[key]) is None
        ):
            continue  # no state, or training did not change it (a frozen module): nothing to carry over
        after = _readable_state(loaded.get(key)) if key in loaded else MISSING
        piece = Piece(key, type(unwrap_prepared(obj)).__name__, _registered(accelerator, obj), None)
        if after is MISSING:
            piece.detail = "its state cannot be read after the load"
        else:
            diff = first_difference(before, after)
            piece.restored = diff is None
            piece.detail = diff or describe_state(key, before)
        result.pieces.append(piece)
    return result
