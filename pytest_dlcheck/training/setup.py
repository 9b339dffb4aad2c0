"""The user's training as a check gets it: which kind of user this is, the sampled batches, probes (a
model, its loss and batches, for the checks that need no training run) and the smoke run S1-S5 share.
A kind of user is a module of this package with a setup class (``kind``, ``sources``, ``describe``,
``fresh``, ``smoke``, ``resume``, ``saved_state``, ``interrupted_save``) chosen here."""

from __future__ import annotations

import contextlib
import math
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from typing import Any

import pytest
import torch

from ..errors import MISSING, RoleError
from ..guard import preserved_rng
from ..registry import load_checks
from ..session import user_call
from .accelerate import AccelerateSetup, accelerator_of
from .lightning import LightningSetup, given_loaders
from .loop import LoopSetup
from .runs import (
    LOOP_KINDS,
    SEED,
    Fresh,
    ModuleSnapshot,
    SetupError,
    Trajectory,
    device_of,
    draw_batches,
    is_hf_trainer,
    is_lightning_trainer,
    loss_tensor,
    model_call,
    own_batch,
    own_dataloader,
    seed_all,
    targets_of,
    to_device,
    unwrap_prepared,
)
from .trainer import TrainerSetup

# --------------------------------------------------------------------------------------------------
# choosing the kind


def get_setup(ctx: Any) -> Any:
    """The user's training, whichever kind they gave; skips naming the fixtures when none is given."""
    tmp = ctx.request.getfixturevalue("tmp_path_factory")
    trainer = ctx.role("trainer")
    if trainer is not MISSING and is_hf_trainer(trainer):
        setup = ctx.memo(trainer, "training:setup", lambda: TrainerSetup(trainer, tmp))
        setup.make_room = ctx.state.make_room  # a clone it trains lets the session's spares go
        return setup
    make = ctx.role("make_training")
    if make is not MISSING:
        loader = ctx.role("dataloader")
        parts = [
            ctx.role(n)
            for n in (
                "train_step",
                "compute_loss",
                "loss_fn",
                "save_checkpoint",
                "load_checkpoint",
                "resume_dataloader",
            )
        ] + [_given_only(ctx, n) for n in ("checkpoint_every", "start_epoch")]
        # every part of the loop is in the key: two projects sharing a factory and a loader keep their own step/save
        setup = ctx.memo(
            (make, loader, *parts),
            "training:setup",
            lambda: _loop_or_accelerate(
                LoopSetup(
                    make,
                    parts[0],
                    parts[1],
                    parts[2],
                    loader,
                    parts[3],
                    parts[4],
                    tmp,
                    resume_loader=parts[5],
                    checkpoint_every=parts[6],
                    start_epoch=parts[7],
                )
            ),
        )
        setup.make_room = ctx.state.make_room  # a training state it builds lets the session's spares go
        return setup
    module = ctx.role("lightning_module")
    if module is not MISSING:
        dm = ctx.role("datamodule")
        if dm is MISSING and not own_dataloader(module) and ctx.role("dataloader") is not MISSING:
            # fit(module, train_dataloaders=..., val_dataloaders=...): the loaders the user handed over are the data
            train, val = ctx.role("dataloader"), ctx.role("eval_dataloader")
            dm = ctx.memo((module, train), "training:given-loaders", lambda: given_loaders(train, val))
        l_trainer = trainer if trainer is not MISSING and is_lightning_trainer(trainer) else MISSING
        callbacks = ctx.role("lightning_callbacks")  # else those of the Lightning Trainer given as dlcheck_trainer
        setup = ctx.memo((module, dm), "training:setup", lambda: LightningSetup(module, dm, l_trainer, tmp, callbacks))
        setup.make_room = ctx.state.make_room  # a copy it trains lets the session's spares go
        return setup
    ctx.skip(
        "missing role: define fixture dlcheck_trainer (transformers/TRL), or dlcheck_lightning_module + "
        "dlcheck_datamodule (Lightning), or dlcheck_make_training + dlcheck_dataloader (plain loop) in conftest.py"
    )


def _given_only(ctx: Any, name: str) -> Any:
    """Role ``name`` when the user defines its fixture, else MISSING, never derived (nothing derives these, and a
    derivation would build the user's objects: a factory that needs a process group raises outside the ranks)."""
    try:
        ctx.request.getfixturevalue(f"dlcheck_{name}")
    except pytest.FixtureLookupError:
        return MISSING
    return ctx.role(name)


def _loop_or_accelerate(setup: LoopSetup) -> LoopSetup:
    """A factory whose state holds an ``Accelerator`` is an Accelerate user (kind 4). The first state the
    factory builds is kept and handed to the first run, so telling the kinds apart costs no extra call."""
    try:
        state = setup.state()
    except Exception:  # noqa: BLE001 - the factory's error is reported by the run that needs it
        return setup
    if accelerator_of(state) is None:
        setup.keep(state)
        return setup
    acc = AccelerateSetup(
        setup.make_training,
        setup.train_step,
        setup.compute_loss,
        setup.loss_fn,
        setup.loader,
        setup.save,
        setup.load,
        setup.tmp,
        resume_loader=setup.resume_loader,
        checkpoint_every=setup.checkpoint_every,
        start_epoch=setup.start_epoch,
    )
    acc.keep(state)
    return acc


def training_batches(ctx: Any, setup: Any, n: int | None = None) -> list[Any]:
    """Sampled training batches as the user's step takes them (shared across checks)."""
    if setup.kind in LOOP_KINDS:
        return setup.batches(n or _n_batches(ctx))
    if getattr(setup, "own_loader", False):
        # a Trainer whose class builds its own train dataloader (TRL's online trainers: a generation batch of
        # per_device_train_batch_size x steps_per_generation rows): its training_step receives that loader's batches
        want = n or _n_batches(ctx)
        got = ctx.memo(
            setup.sources,
            f"training:own-batches:{want}",
            lambda: setup.own_batches(want, fresh_probe(ctx, setup).owner),
        )
        if not got:
            raise SetupError("the Trainer's get_train_dataloader() yielded no batch")
        return got
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


#: explainers of what a model or trainer raised on the sampled batches, registered by the domain whose
#: check owns the root cause (the vlm domain: image tokens cut or mismatched, X4)
_ROOT_CAUSES: list[Callable[[BaseException], str | None]] = []


def explains_failures(explainer: Callable[[BaseException], str | None]) -> Callable[[BaseException], str | None]:
    """Register ``explainer(exc) -> skip reason naming the check that owns the cause, or None``."""
    _ROOT_CAUSES.append(explainer)
    return explainer


def root_cause(exc: BaseException) -> str | None:
    """Root cause first: a skip reason naming the check that explains what a model or trainer raised on
    the sampled batches, or None."""
    for explainer in _ROOT_CAUSES:
        reason = explainer(exc)
        if reason:
            return reason
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


def memo_or_skip(ctx: Any, sources: Any, key: str, make: Callable[[], Any], spare: bool = False) -> Any:
    """``ctx.memo`` that remembers a SetupError too (so every check sharing the work skips with it). A
    ``spare`` (an object rebuilt the same at will) is let go before a training state is built."""
    value = memo_captured(ctx, sources, key, make, spare)
    if isinstance(value, SetupError):
        ctx.skip(str(value))
    return value


def memo_captured(ctx: Any, sources: Any, key: str, make: Callable[[], Any], spare: bool = False) -> Any:
    """``ctx.memo`` whose value is the SetupError the work ended with, if it did (not raised)."""

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

    return ctx.memo(sources, key, capture, spare)


# --------------------------------------------------------------------------------------------------
# probes: a model, its loss and sample batches, for the checks that need no training run


def find_setup(ctx: Any) -> Any:
    """Like :func:`get_setup`, but None instead of a skip when the user gave no training."""
    if (
        ctx.has("trainer")
        and is_hf_trainer(ctx.role("trainer"))
        or ctx.has("make_training")
        or ctx.has("lightning_module")
    ):
        return get_setup(ctx)
    return None


def fresh_probe(ctx: Any, setup: Any) -> Fresh:
    """The fresh objects at the initial state the checks share (the probe): a spare, let go while a check
    trains a copy of its own (at most one extra training state in memory) and rebuilt, the same, by the
    next check that needs it."""
    return memo_or_skip(ctx, setup.sources, "training:fresh-probe", setup.fresh, spare=True)


def probe(ctx: Any) -> tuple[Fresh, list[Any], Any]:
    """(fresh objects, sample batches, setup or None). Without a training setup, the user's own
    ``dlcheck_model`` is used as it is, for forward/autograd-only measurements that leave no trace
    (``torch.autograd.grad`` fills no ``.grad``; train/eval flags are restored by the caller)."""
    setup = find_setup(ctx)
    if setup is not None:
        fresh = fresh_probe(ctx, setup)
        return fresh, run_or_skip(ctx, lambda: training_batches(ctx, setup)), setup
    model, loader = ctx.require("model", "dataloader")
    if not isinstance(model, torch.nn.Module):
        ctx.skip(f"dlcheck_model is a {type(model).__name__}, not a torch.nn.Module")

    def loss(batch: Any) -> torch.Tensor:
        batch = own_batch(to_device(batch, device_of(model)))
        if not isinstance(batch, Mapping):
            raise SetupError(
                "the batches are (inputs, targets): define fixture dlcheck_make_training (and "
                "dlcheck_compute_loss) so the loss can be computed"
            )
        return loss_tensor(user_call("model", model_call(model, batch)))

    batches = run_or_skip(
        ctx,
        lambda: ctx.memo(loader, f"training:batches:{_n_batches(ctx)}", lambda: draw_batches(loader, _n_batches(ctx))),
    )
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


#: torchvision's detectors: their forward returns the loss dict in train mode only (detections in eval mode)
_TRAIN_MODE_LOSSES = ("GeneralizedRCNN", "RetinaNet", "FCOS", "SSD")


def losses_in_train_mode(model: Any) -> str | None:
    """Why ``model`` computes its losses in train mode only, or None: a torchvision detector (Faster/Mask/Keypoint
    R-CNN, RetinaNet, FCOS, SSD/SSDlite) returns its loss dict when ``model.training`` and its detections
    otherwise, so a loss asked of it in eval mode is a condition its pipeline never produces. The detector may be
    the model or inside it (a LightningModule's ``self.model``, a DDP wrapper's ``module``)."""
    modules = model.named_modules() if isinstance(model, torch.nn.Module) else [("", model)]
    for name, inner in modules:
        for cls in type(inner).__mro__:
            if cls.__name__ in _TRAIN_MODE_LOSSES and cls.__module__.startswith("torchvision.models.detection"):
                where = f", as {type(model).__name__}.{name}" if name else ""
                return (
                    f"{type(inner).__name__} (torchvision detection{where}) returns its losses in train mode only (in "
                    "eval mode its forward returns detections)"
                )
    return None


#: the layers whose train/eval flag changes what a forward computes (statistics, dropout masks)
_NORM_DROPOUT = (
    torch.nn.modules.batchnorm._BatchNorm,
    torch.nn.modules.instancenorm._InstanceNorm,
    torch.nn.modules.dropout._DropoutNd,
)


@contextlib.contextmanager
def loss_modes(model: Any) -> Iterator[Any]:
    """The modes a loss is measured in under eval conditions: eval mode; but a model whose losses exist in train
    mode only (:func:`losses_in_train_mode`) is put in train mode, as its pipeline computes them, with its
    BatchNorm / InstanceNorm / dropout layers in eval mode (running statistics, no dropout: the eval conditions
    the flag stands for; torchvision's pretrained detectors use FrozenBatchNorm2d, which has no flag). Every
    submodule's own flag is restored afterwards."""
    with _flags(model, train=losses_in_train_mode(model) is not None) as m:
        yield m


@contextlib.contextmanager
def _train_flags(model: Any) -> Iterator[Any]:
    """Train mode with BatchNorm / InstanceNorm / dropout layers in eval mode; every flag restored afterwards."""
    with _flags(model, train=True) as m:
        yield m


@contextlib.contextmanager
def _flags(model: Any, train: bool) -> Iterator[Any]:
    """Eval mode, or (``train``) train mode with the BatchNorm / InstanceNorm / dropout layers in eval mode;
    every submodule's own flag restored afterwards."""
    saved = [(m, m.training) for m in model.modules()]
    model.train(train)
    if train:
        for m in model.modules():
            if isinstance(m, _NORM_DROPOUT):
                m.training = False
    try:
        yield model
    finally:
        for m, flag in saved:
            m.training = flag


def eval_loss(model: Any, compute: Callable[[], Any]) -> Any:
    """``compute()`` (the training's loss on a batch) under eval conditions, no grad: :func:`loss_modes`. When
    the user's loss raises in eval mode on a model not known to compute its losses in train mode only, it is
    asked once more in train mode (BatchNorm and dropout still in eval mode): a loss that exists there only (a
    detector of the user's own whose forward returns predictions in eval mode) is a condition the check cannot
    reproduce in eval mode, said as a :class:`SetupError` (not judged), not blamed on the user's role; a loss that
    raises in train mode too is the user's error, as it was."""
    with loss_modes(model), torch.no_grad():
        try:
            return compute()
        except RoleError as exc:
            if losses_in_train_mode(model) is not None or not isinstance(model, torch.nn.Module):
                raise
            first = exc
    with _train_flags(model), torch.no_grad():
        try:
            compute()
        except Exception:  # noqa: BLE001 - it raises in train mode too: the first error is the user's, as it was
            raise first from first.__cause__
    raise SetupError(
        f"not judged: dlcheck_{first.role} {first.message.split(' (in ')[0][:160]} with the model in eval mode, and "
        "not in train mode: the model computes its losses in train mode only, and its training never asks them in "
        "eval mode (a torchvision detector is measured in train mode with BatchNorm and dropout in eval mode; a "
        "model of another kind is not)"
    )


def soft_targets(targets: Any) -> bool:
    """Whether ``targets`` are soft targets: a float ``(batch, classes)`` tensor whose rows are distributions
    (non-negative, summing to 1), as Mixup/CutMix and label smoothing make them for a cross-entropy."""
    if not isinstance(targets, torch.Tensor) or not targets.is_floating_point() or targets.dim() != 2:
        return False
    if targets.shape[-1] < 2 or targets.numel() == 0:
        return False
    t = targets.detach().float()
    return bool((t >= -1e-6).all()) and bool(
        torch.allclose(t.sum(-1), torch.ones(t.shape[0], device=t.device), atol=1e-3)
    )


def with_targets(batch: Any, targets: Any) -> Any:
    """The batch with its targets (``labels``/``label``, or the second item of a pair) replaced, of its own type;
    the batch itself is left as it was."""
    from .runs import with_field

    if isinstance(batch, Mapping):
        return with_field(batch, "labels" if "labels" in batch else "label", targets)
    items = [batch[0], targets, *batch[2:]]
    return type(batch)(items) if isinstance(batch, list) else tuple(items)


def as_soft_targets(batch: Any, like: Any) -> Any:
    """``batch`` with its class indices as one-hot soft targets when the training's batches (``like``) hold soft
    targets (:func:`soft_targets`) of as many classes, else None: a loss built for soft targets (timm's
    SoftTargetCrossEntropy after Mixup) takes them, and its value on a one-hot target is the cross-entropy on the
    class index."""
    y, ref = targets_of(batch), targets_of(like)
    if not soft_targets(ref) or not isinstance(y, torch.Tensor) or y.is_floating_point() or y.dim() != 1:
        return None
    classes = int(ref.shape[-1])
    if y.numel() == 0 or int(y.min()) < 0 or int(y.max()) >= classes:
        return None
    return with_targets(batch, torch.nn.functional.one_hot(y.long(), classes).to(ref.dtype))


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
# how the pipeline calls the model: learnt from the pipeline itself


@dataclass
class PipelineCall:
    """The first call of a plain loop's model (its forward, from outside) inside the user's own loss or step on a
    sampled batch: its inputs as the pipeline hands them (detached copies). A GAN's step calls its generator on
    noise it draws (``netG(noise)``), never on the batch's images; a check that would call the model on the batch
    calls it on these inputs instead, or says it does not judge."""

    #: who made the call: ``dlcheck_compute_loss`` or ``dlcheck_train_step``
    by: str
    #: the class of the model called (the training state's ``model``)
    model_type: type
    #: its positional and keyword inputs, None when the loss or step never calls the model itself
    args: tuple | None
    kwargs: dict
    #: whether a tensor of the batch, as it comes, is among those inputs (the model is called on the batch)
    on_batch: bool
    #: whether one of those inputs is a tensor of the batch mixed among its own rows (Mixup, CutMix: each row lies,
    #: element by element, between two of the batch's rows): the model is called on the batch's examples, mixed
    mixed: bool = False

    @property
    def called(self) -> bool:
        return self.args is not None

    def inputs(self) -> str:
        """The inputs in words: ``float32 (4, 100, 1, 1)``, or a tuple / mapping of them."""
        if self.args is None:
            return "nothing"
        if len(self.args) == 1 and not self.kwargs:
            return describe_batch(self.args[0])
        shown = [describe_batch(a) for a in self.args] + [f"{k}={describe_batch(v)}" for k, v in self.kwargs.items()]
        return "(" + ", ".join(shown) + ")"

    def elsewhere(self) -> str | None:
        """Why the model is not called on the batch, in words, or None when it is."""
        name = self.model_type.__name__
        if not self.called:
            return f"{self.by} never calls {name} itself on a batch (it calls its members or methods)"
        if self.on_batch or self.mixed:
            return None
        return f"{self.by} calls {name} on {self.inputs()}, not on the batch"


def _tensors(value: Any, depth: int = 0) -> list[torch.Tensor]:
    """The tensors in a batch or a call's inputs (through mappings, lists and tuples, a few levels deep)."""
    if isinstance(value, torch.Tensor):
        return [value]
    if depth > 3:
        return []
    if isinstance(value, Mapping):
        return [t for v in value.values() for t in _tensors(v, depth + 1)]
    if isinstance(value, (list, tuple)):
        return [t for v in value for t in _tensors(v, depth + 1)]
    return []


def _detached(value: Any, depth: int = 0) -> Any:
    if isinstance(value, torch.Tensor):
        return value.detach().clone()
    if depth > 3:
        return value
    if isinstance(value, tuple) and not hasattr(value, "_fields"):
        return tuple(_detached(v, depth + 1) for v in value)
    if isinstance(value, list):
        return [_detached(v, depth + 1) for v in value]
    if isinstance(value, dict):
        return {k: _detached(v, depth + 1) for k, v in value.items()}
    return value


def _mixed_from_batch(inputs: list[torch.Tensor], batch: Any, rows: int = 8) -> bool:
    """Whether one of ``inputs`` is a float tensor of ``batch`` (its shape and dtype, at least 2 rows) mixed among its
    own rows, as Mixup (a convex blend of two rows) and CutMix (a patch of one row pasted on another) mix a batch of
    images: each of its first ``rows`` rows lies, element by element, between two rows of the batch's tensor (within
    a rounding tolerance), and they are not all rows of it as they come. Noise, or an image the loss augments itself
    (flipped, cropped), does not."""
    given = [b for b in _tensors(batch) if b.is_floating_point() and b.ndim >= 2 and b.shape[0] >= 2]
    for t in inputs:
        if not t.is_floating_point():
            continue
        for b in given:
            if t.shape != b.shape or t.dtype != b.dtype:
                continue
            x = b.detach().reshape(len(b), -1).double().cpu()
            y = t.detach().reshape(len(t), -1).double().cpu()
            tol = 1e-5 * float(x.abs().max()) + 1e-12
            inside, copies = True, 0
            for i in range(min(rows, len(y))):
                a = y[i][None] - x  # (B, D): the row against every row of the batch
                pos, neg = (a > tol).double(), (a < -tol).double()
                # a pair (j, k) holds the row between them where no element is above (or below) both
                outside = pos @ pos.T + neg @ neg.T
                if not bool((outside == 0).any()):
                    inside = False
                    break
                copies += int(bool(((pos + neg).sum(1) == 0).any()))
            if inside and copies < min(rows, len(y)):
                return True
    return False


def _from_batch(inputs: list[torch.Tensor], batch: Any) -> bool:
    """Whether one of ``inputs`` is a tensor of ``batch`` as it comes (the same values, shape and dtype)."""
    given = _tensors(batch)
    for t in inputs:
        for b in given:
            if t is b or (
                t.shape == b.shape and t.dtype == b.dtype and torch.equal(t.detach().cpu(), b.detach().cpu())
            ):
                return True
    return False


def pipeline_call(ctx: Any, setup: Any = None) -> PipelineCall | None:
    """How a plain loop's (or Accelerate loop's) own ``dlcheck_compute_loss`` — without it, its
    ``dlcheck_train_step`` — calls the model on the first sampled batch, or None when the training is of another
    kind or gives neither (dlcheck's default step calls the model on the batch). The loss runs once on the probe
    (train mode, no grad, its state put back); the step once on fresh objects from ``dlcheck_make_training``, which
    it may step; at the seed, the RNG states put back. Shared per session: one call of the user's loss or step."""
    setup = find_setup(ctx) if setup is None else setup
    if setup is None or setup.kind not in LOOP_KINDS:
        return None
    if setup.compute_loss is MISSING and setup.train_step is MISSING:
        return None

    def make() -> PipelineCall:
        batch = training_batches(ctx, setup)[0]
        seen: list[tuple[tuple, dict]] = []

        def pre(mod: Any, args: tuple, kwargs: dict) -> None:
            if not seen:
                seen.append((_detached(args), _detached(kwargs)))

        def watched(model: Any) -> list[Any]:
            mods = {id(m): m for m in (model, unwrap_prepared(model)) if isinstance(m, torch.nn.Module)}
            return [m.register_forward_pre_hook(pre, with_kwargs=True) for m in mods.values()]

        if setup.compute_loss is not MISSING:
            by = "dlcheck_compute_loss"
            fresh = fresh_probe(ctx, setup)
            model = fresh.model
            start = ModuleSnapshot.take(model)
            handles = watched(model)
            try:
                with preserved_rng(), modes(model, train=True), torch.no_grad():
                    seed_all(SEED)
                    fresh.loss(batch)
            finally:
                for h in handles:
                    h.remove()
                start.restore(model)
        else:
            by = "dlcheck_train_step"
            state = setup.state()
            model = state["model"]
            handles = watched(model)
            try:
                with preserved_rng():
                    seed_all(SEED)
                    setup.train_mode(state)
                    setup.step(state, batch, 0)
            finally:
                for h in handles:
                    h.remove()
            del state
        model_type = type(unwrap_prepared(model))
        if not seen:
            return PipelineCall(by, model_type, None, {}, False)
        args, kwargs = seen[0]
        inputs, given = _tensors(args) + _tensors(kwargs), to_device(batch, device_of(model))
        on_batch = _from_batch(inputs, given)
        return PipelineCall(by, model_type, args, kwargs, on_batch, not on_batch and _mixed_from_batch(inputs, given))

    return memo_or_skip(ctx, setup.sources, "training:pipeline-call", make)


# --------------------------------------------------------------------------------------------------
# the smoke run shared by S1-S5


@dataclass
class SmokeRun:
    setup: Any
    trajectory: Trajectory
    #: the trained objects, or (a plain loop's, kept on disk) how to read them back into new objects
    kept: Fresh | Callable[[], Fresh]
    #: the run's length as its kind's ``resume`` counts it (what C1 hands to it): micro-steps of a plain loop
    #: or an Accelerate step, optimizer steps of a Trainer or a Lightning fit
    steps: int
    #: the session's state, where objects read back are kept as a spare
    session: Any = None
    #: C1's uninterrupted baseline when the run saved a checkpoint for it (C1 selected too), else None
    baseline: Any = None
    #: optimizer steps made, and micro-batches trained (forward and backward passes) to make them
    opt_steps: int = 0
    micro_steps: int = 0
    #: the optimizer steps asked for (``S1.steps``): more than ``opt_steps`` when ``S1.max_micro_steps`` cut
    #: the run short under gradient accumulation
    wanted: int = 0

    @property
    def capped(self) -> bool:
        return self.opt_steps < self.wanted and self.micro_steps > self.opt_steps

    @property
    def by_micro_step(self) -> bool:
        """Whether the trajectory's records are micro-steps (a loop's, Lightning's) apart from optimizer steps."""
        return self.micro_steps > self.opt_steps and self.setup.kind != "trainer"

    @property
    def length(self) -> str:
        """``20-step smoke run``, or under gradient accumulation ``smoke run of 20 optimizer steps (80
        micro-steps)`` (and why fewer, when S1.max_micro_steps cut it)."""
        if self.micro_steps <= self.opt_steps or self.opt_steps == 0:
            text = f"{self.steps}-step smoke run"
        else:
            text = f"smoke run of {self.opt_steps} optimizer steps ({self.micro_steps} micro-steps)"
        if self.capped:
            text += f", cut from {self.wanted} optimizer steps by S1.max_micro_steps"
        if self.trajectory.notes.get("plan_end"):
            text += f" ({self.trajectory.notes['plan_end']})"
        return text

    def where(self, step: int | None) -> str:
        """``step 5``, or ``micro-step 37, optimizer step 9`` when the records are micro-steps."""
        if step is None or not self.by_micro_step:
            return f"step {step}"
        made = sum(1 for r in self.trajectory.steps if r.step <= step and r.stepped)
        return f"micro-step {step}, optimizer step {made}"

    def at(self, step: int) -> str:
        """Where a record of the trajectory is: ``step 5 of 20``, or ``micro-step 37 of 80 (optimizer step
        9)`` when the records are micro-steps."""
        if not self.by_micro_step:
            return f"step {step} of {self.steps}"
        made = sum(1 for r in self.trajectory.steps if r.step <= step and r.stepped)
        return f"micro-step {step} of {self.micro_steps} (optimizer step {made} of {self.opt_steps})"

    @property
    def trained(self) -> Fresh:
        """The objects at the end of the run (read back from disk when they were kept there: a spare, let
        go before a training state is built)."""
        if isinstance(self.kept, Fresh) or self.session is None:
            return self.kept if isinstance(self.kept, Fresh) else self.kept()
        return self.session.memo(self.setup.sources, f"smoke:{self.steps}:trained", self.kept, spare=True)


def smoke_steps(ctx: Any) -> int:
    """The length of the shared smoke run: the setting ``S1.steps`` (it sets every smoke check's run)."""
    return int(ctx.state.setting(load_checks()["S1"], "steps"))


def smoke_run(ctx: Any) -> SmokeRun:
    run = shared_smoke_run(ctx)
    smoke_picture(ctx, run.trajectory)
    return run


def shared_smoke_run(ctx: Any) -> SmokeRun:
    """The session's smoke run (made by the first check that needs it). When C1 is selected too, the run
    saves a checkpoint ``C1.steps // 2`` steps before its end and is C1's uninterrupted baseline: C1 trains
    only the resumed steps."""
    value = _smoke_memo(ctx, get_setup(ctx))
    if isinstance(value, SetupError):
        ctx.skip(str(value))
    return value


def _smoke_memo(ctx: Any, setup: Any, make_it: bool = True) -> Any:
    """The smoke run, or the SetupError it ended with; None when not made yet and ``make_it`` is false."""
    steps = smoke_steps(ctx)
    key = f"smoke:{steps}"
    if not make_it and not ctx.state.made(setup.sources, key):
        return None
    save_from = resume_save_point(ctx, setup, steps)

    max_micro = int(ctx.state.setting(load_checks()["S1"], "max_micro_steps"))

    def make() -> SmokeRun:
        ctx.state.make_room()  # no spare beside the run's training state
        traj, trained, baseline = setup.smoke(steps, save_from, max_micro)
        opt = int(traj.notes.get("opt_steps", traj.calls.count("opt")))
        micro = int(traj.notes.get("micro_steps", len(traj.steps)))
        # a loop's resume counts micro-steps; a Trainer's and Lightning's optimizer steps
        length = micro if setup.kind in LOOP_KINDS else opt or steps
        return SmokeRun(setup, traj, trained, length, ctx.state, baseline, opt, micro, steps)

    return memo_captured(ctx, setup.sources, key, make)


#: the checks that always read the smoke run when they run: with one of them selected, the run is made anyway
SMOKE_READERS = ("S1", "S2", "S3")


def resume_save_point(ctx: Any, setup: Any, steps: int) -> int | None:
    """Where the smoke run saves for C1 (the optimizer step after which it saves), or None: C1 not selected, a kind
    whose resume the smoke run cannot serve (Lightning resumes at an epoch boundary), or no save and load
    to resume through."""
    checks = load_checks()
    if "C1" not in {c.id for c in ctx.state.selected} or not getattr(setup, "smoke_baseline", False):
        return None
    if not setup.can_resume():
        return None
    if getattr(setup, "checkpoint_every", MISSING) is not MISSING:
        return None  # C1 saves where the user's loop saves (dlcheck_checkpoint_every): its own run, not the smoke run
    resumed = max(1, int(ctx.state.setting(checks["C1"], "steps")) // 2)
    if steps - resumed < 1:
        return None
    # a kind that knows its epoch moves the save off the epoch's ends (TrainerSetup.save_point)
    return setup.save_point(steps, steps - resumed).at if hasattr(setup, "save_point") else steps - resumed


def smoke_baseline(ctx: Any, setup: Any, make_it: bool = True) -> SmokeRun | None:
    """The smoke run as C1's uninterrupted baseline: when it was made (a check before C1 read it) or a
    selected check will make it anyway, and it saved for C1. None otherwise (C1 then runs its own, and
    reports what made the smoke run fail, if anything, through its own run)."""
    if resume_save_point(ctx, setup, smoke_steps(ctx)) is None:
        return None
    will_run = make_it and bool({c.id for c in ctx.state.selected} & set(SMOKE_READERS))
    run = _smoke_memo(ctx, setup, make_it=will_run)
    return run if isinstance(run, SmokeRun) and run.baseline is not None else None


def smoke_picture(ctx: Any, traj: Trajectory) -> None:
    """The report's picture of the shared smoke run (the same for every check that reads it, so the report
    draws it once): the loss per step with the learning rate on a second axis, the gradient norm, the
    first non-finite step and the largest jump over the running mean marked."""
    steps = [s.step for s in traj.steps]
    if not steps:
        return
    finite = [s.loss if s.loss is not None and math.isfinite(s.loss) else None for s in traj.steps]
    marks = []
    bad = next((s.step for s in traj.steps if _nonfinite(s)), None)
    if bad is not None:
        marks.append({"x": bad, "label": f"first NaN/Inf (step {bad})"})
    ratios = []
    for i, s in enumerate(traj.steps):
        before = [v for v in finite[max(0, i - 5) : i] if v is not None]
        if finite[i] is not None and before and sum(before) > 0:
            ratios.append((finite[i] / (sum(before) / len(before)), s.step))
    if ratios:
        ratio, at = max(ratios)
        if ratio > 1.5:
            marks.append({"x": at, "label": f"{ratio:.1f}x its running mean"})
    series = {"loss": finite}
    if any(s.grad_norm is not None for s in traj.steps):
        series["gradient norm"] = [s.grad_norm for s in traj.steps]
    series2 = {"learning rate": [s.lr for s in traj.steps]} if any(s.lr is not None for s in traj.steps) else {}
    ctx.attach(
        "series",
        title=f"the {len(steps)}-step smoke run (S1-S5)",
        x={name: steps for name in [*series, *series2]},
        series=series,
        series2=series2,
        ylabel="loss / gradient norm",
        ylabel2="learning rate",
        marks=marks,
        logy=all(v is None or v > 0 for vals in series.values() for v in vals),
        caption="the shared smoke run every smoke check reads",
    )


def _nonfinite(s: Any) -> bool:
    values = [s.loss, s.grad_norm]
    return bool(s.nonfinite_grads or s.nonfinite_params) or any(v is not None and not math.isfinite(v) for v in values)


def mean_loss(fresh: Fresh, batches: list[Any], reasons: list[str] | None = None) -> float | None:
    """Mean eval-mode loss of ``fresh`` over ``batches`` (no gradients, modes restored; a model whose losses exist
    in train mode only is measured as :func:`loss_modes` says; see :func:`eval_loss`). None when it cannot be
    computed, the reason appended to ``reasons``."""
    values = []
    for batch in batches:
        try:
            values.append(float(eval_loss(fresh.model, lambda b=batch: fresh.loss(b))))
        except SetupError as exc:
            if reasons is not None:
                reasons.append(str(exc))
            return None
    finite = [v for v in values if math.isfinite(v)]
    return sum(finite) / len(finite) if finite else None


def show_losses(traj: Trajectory, upto: int | None = None, last: int = 6) -> str:
    pairs = [(s, v) for s, v in traj.losses() if upto is None or s <= upto]
    shown = pairs[-last:]
    return ", ".join(f"{s}: {v:.4g}" for s, v in shown) or "none logged"
