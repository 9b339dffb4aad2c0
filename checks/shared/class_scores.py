"""Whether the user's own loss reads the model's output as class scores under a cross-entropy (T1, V3, V6).

A model whose last dimension is 128 wide may be a 128-class classifier or a 128-d embedding trained with a triplet
loss: the output's shape cannot tell. The user's loss can: it is replayed with the module whose output it reads
returning outputs put in place of the real one (no model run), and its values and gradients are compared with
those of a cross-entropy of those outputs. Any cross-entropy over the classes is one,

    L(z) = sum_ik a_ik (-log softmax(z_i)_k),  a_ik >= 0

over the rows i of the output (the class dimension last, or second for a dense prediction), whatever targets it
reads and however they are aligned (a language model's shifted labels, an ignore index, class weights, label
smoothing, a mean or a sum). Its gradient is ``A_i softmax(z_i) - a_i`` (A_i = sum_k a_ik): two probes identify
``a`` (the gradients at the uniform output and at a random one), further probes verify it, values and gradients
both. Outputs read as probabilities (the loss takes their log) or log-probabilities (an NLL) are replayed as the
softmax / log-softmax of the probes. A triplet or contrastive loss over embeddings, a regression, a focal loss
are no such combination."""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import pytest

from ...cost import reused
from ...errors import MISSING
from ...guard import preserved_rng
from ...session import made_up
from ...training import (
    SEED,
    ModuleSnapshot,
    find_setup,
    fresh_probe,
    loss_modes,
    output_tensor,
    run_or_skip,
    seed_all,
    targets_of,
    training_batches,
)
from .forward import own_forward, put_forward, restore_forward

#: outputs larger than this many values are not replayed (the identification holds a few copies of them)
MAX_VALUES = 4_000_000


@dataclass
class ClassScores:
    """What the replay of the user's loss showed (:func:`class_scores`)."""

    #: "ce": a cross-entropy of the output over its classes; "softmax": not one, but a loss of the output's softmax
    #: (unchanged by a constant added to each row: scores upsampled inside the loss, a focal loss); "other": neither
    #: (a triplet loss on embeddings, a regression); "offset": a cross-entropy plus a term that does not depend on the output; "unread": the loss
    #: does not read one output of one module as returned (it cannot be replayed)
    kind: str
    #: the user's loss, in words ("dlcheck_compute_loss", "Net.training_step")
    loss: str
    #: whose output was put in place ("the model's output", "the output of Net.backbone")
    where: str = ""
    shape: tuple[int, ...] | None = None
    probes: int = 0
    #: the loss at the uniform output (zeros read as logits), for the report
    at_uniform: float = math.nan
    reading: str = "logits"
    #: the sum of the cross-entropy's weights (1 for a mean over the supervised rows, their number for a sum)
    scale: float = 1.0
    #: the constant a cross-entropy is off by ("offset")
    offset: float = 0.0
    why: str = ""

    def showed(self) -> str:
        """What the replay showed, in words."""
        head = (
            f"{self.loss} replayed on {self.probes} outputs put in place of {self.where} "
            f"({'x'.join(map(str, self.shape or ()))})"
        )
        if self.kind == "ce":
            scale = "" if math.isclose(self.scale, 1.0, rel_tol=1e-3) else f"{self.scale:.4g} x "
            return (
                f"{head}: its values and gradients are those of {scale}a cross-entropy of the output read as "
                f"{self.reading}"
            )
        if self.kind == "offset":
            return (
                f"{head}: its gradients are those of a cross-entropy of the output read as {self.reading}, its values "
                f"are {self.offset:+.4g} off one (a term that does not depend on the output)"
            )
        if self.kind == "softmax":
            return (
                f"{head}: not one cross-entropy of the output, but unchanged when a constant is added to each row of "
                f"scores ({self.reading}): it reads the output as class scores through their softmax (a cross-entropy "
                "of the scores upsampled or otherwise mapped inside the loss, or another loss of their softmax)"
            )
        if self.kind == "other":
            return (
                f"{head}: {self.at_uniform:.4g} at a uniform output, and neither its values nor its gradients are "
                "those of a cross-entropy of the output over its last (or second) dimension, read as logits, "
                "probabilities or log-probabilities (a metric-learning loss on embeddings, a regression)"
            )
        return f"{self.loss} could not be replayed on outputs put in place of the model's: {self.why}"


def users_loss(setup: Any) -> str | None:
    """The user's own loss, in words, or None when the loss is a model's own (a transformers model given its
    labels, a Trainer's compute_loss as transformers/TRL ship it) or a torch CrossEntropyLoss / NLLLoss object:
    what :func:`class_scores` replays."""
    import torch

    if setup is None:
        return None
    if setup.kind == "lightning":
        return f"{type(setup.module).__name__}.training_step"
    if setup.kind in ("loop", "accelerate"):
        if setup.compute_loss is not MISSING:
            return "dlcheck_compute_loss"
        loss_fn = setup.loss_fn
        if loss_fn is not MISSING and not isinstance(loss_fn, (torch.nn.CrossEntropyLoss, torch.nn.NLLLoss)):
            return f"dlcheck_loss_fn ({type(loss_fn).__name__})"
        return None
    trainer = getattr(setup, "trainer", None)
    if trainer is not None:
        if getattr(trainer, "compute_loss_func", None) is not None:
            return f"{type(trainer).__name__}'s compute_loss_func"
        owner = next((c for c in type(trainer).__mro__ if "compute_loss" in vars(c)), None)
        if owner is not None and not owner.__module__.startswith(("transformers.", "trl.")):
            return f"{owner.__name__}.compute_loss"
    return None


def class_scores(ctx: Any) -> ClassScores | None:
    """The replay of the user's own loss on the first sampled batch (shared per session), or None: no training
    given, a loss that is the model's own or a torch cross-entropy object (:func:`users_loss`), a batch without
    integer targets, or a loss that cannot be computed."""
    setup = find_setup(ctx)
    loss = users_loss(setup)
    if loss is None:
        return None

    def make() -> ClassScores | None:
        import torch

        fresh = fresh_probe(ctx, setup)
        batch = run_or_skip(ctx, lambda: training_batches(ctx, setup))[0]
        targets = targets_of(batch, fresh.model)
        if not isinstance(targets, torch.Tensor) or targets.is_floating_point():
            return None
        start = ModuleSnapshot.take(fresh.model)
        try:
            with loss_modes(fresh.model), torch.no_grad():
                return _replay(fresh, batch, loss)
        finally:
            start.restore(fresh.model)

    try:
        return ctx.memo(setup.sources, "shared:class-scores", make)
    except pytest.skip.Exception:  # the loss cannot be computed the way the replay needs: it cannot be told
        return None


def not_class_scores(ctx: Any) -> str | None:
    """Why the model's output is not class scores under a cross-entropy (the replay showed another loss), or
    None (it is, or it cannot be told)."""
    found = class_scores(ctx)
    if found is None or found.kind != "other":
        return None
    return f"the training's loss is not a cross-entropy over classes: {found.showed()}"


def untold(ctx: Any) -> str | None:
    """Why it cannot be told whether the model's output is class scores that the loss reads as a cross-entropy,
    or None when it can (the replay showed it, or the loss is a torch cross-entropy object or the model's own)."""
    try:
        setup = find_setup(ctx)
    except pytest.skip.Exception:
        setup = None
    if setup is None:
        return (
            "no training is given whose loss would show it (dlcheck_make_training with dlcheck_compute_loss or "
            "dlcheck_loss_fn, a LightningModule, a Trainer)"
        )
    if users_loss(setup) is None:
        return None
    found = class_scores(ctx)
    if found is None:
        return "the training's loss could not be replayed on a batch with integer targets"
    return found.showed() if found.kind == "unread" else None


# --------------------------------------------------------------------------------------------------
# the replay


def _with_output(out: Any, new: Any) -> Any:
    """``out`` (what the module returned) with its prediction tensor replaced by ``new``, or None when it cannot
    be (a tensor, the ``logits`` of a mapping or ModelOutput, the first tensor of a tuple)."""
    import copy

    import torch

    if isinstance(out, torch.Tensor):
        return new
    if isinstance(out, Mapping) and isinstance(out.get("logits"), torch.Tensor):
        made = copy.copy(out)
        made["logits"] = new
        return made
    if isinstance(out, (list, tuple)):
        i = next((j for j, v in enumerate(out) if isinstance(v, torch.Tensor) and v.dim() > 0), None)
        if i is None:
            return None
        items = list(out)
        items[i] = new
        return items if isinstance(out, list) else type(out)(items) if type(out) is tuple else None
    return None


def _replay(fresh: Any, batch: Any, loss: str) -> ClassScores:
    import torch

    model = fresh.model
    # 1. whose output the loss reads: the model's forward, called once, else the last direct child whose output is
    # a float tensor of at least two dimensions (a training_step that calls self.model(x), then its metrics)
    spied = [("", model)] + [(n, m) for n, m in model.named_children()]
    owns = {id(m): own_forward(m) for _, m in spied}
    calls: list[tuple[str, Any]] = []

    def spy(name: str, module: Any) -> Any:
        forward = module.forward

        def call(*args: Any, **kwargs: Any) -> Any:
            out = forward(*args, **kwargs)
            calls.append((name, out))
            return out

        return call

    def put_back() -> None:
        for _, m in spied:
            restore_forward(m, owns[id(m)])

    def loss_of() -> Any:
        with preserved_rng():
            seed_all(SEED)
            return fresh.loss(batch)

    for name, m in spied:
        put_forward(m, spy(name, m))
    try:
        first_value = float(loss_of())
    except Exception as exc:  # noqa: BLE001 - the loss fails here: the checks that compute it report that
        return ClassScores("unread", loss, why=f"the loss raised {type(exc).__name__} in eval mode")
    finally:
        put_back()
    mine = [out for name, out in calls if name == ""]
    where, target, out = "the model's output", model, None
    if mine:
        if len(mine) == 1:
            out = mine[0]
    else:
        scored = [
            (name, o)
            for name, o in calls
            if (t := output_tensor(o)) is not None and t.is_floating_point() and t.dim() >= 2
        ]
        if scored:
            name = scored[-1][0]
            if sum(1 for n, _ in calls if n == name) == 1:
                out, target = scored[-1][1], dict(spied)[name]
                where = f"the output of {type(model).__name__}.{name}"
    out0 = output_tensor(out) if out is not None else None
    if out0 is None or not out0.is_floating_point() or out0.dim() < 2 or _with_output(out, out0) is None:
        return ClassScores(
            "unread",
            loss,
            why="it does not read one output of the model (or of one of its direct children) as returned: "
            + ("the model is called more than once" if len(mine) > 1 else "no float output of two dimensions or more"),
        )
    shape = tuple(int(s) for s in out0.shape)
    if out0.numel() > MAX_VALUES:
        return ClassScores("unread", loss, where, shape, why=f"its output {shape} is too large to replay")
    out0 = out0.detach()

    current: list[Any] = []

    def replay(*_args: Any, **_kwargs: Any) -> Any:
        reused()  # no model ran: this call returns the output put in place of the model's
        return current[0]

    def loss_at(new: torch.Tensor) -> torch.Tensor:
        current[:] = [_with_output(out, new)]
        return loss_of()

    own = own_forward(target)
    put_forward(target, replay)
    try:
        with made_up("outputs put in place of the model's (a uniform one and random ones)"):
            try:
                same = float(loss_at(out0.clone()))
            except Exception:  # noqa: BLE001 - the loss does not take its own output back: it cannot be replayed
                same = math.nan
            if not math.isclose(same, first_value, rel_tol=1e-4, abs_tol=1e-6):
                return ClassScores(
                    "unread", loss, where, shape, why="the loss reads more than that output (it changes without it)"
                )
            found = _identify(loss_at, out0, loss, where, shape)
    finally:
        restore_forward(target, own)
    return found


def _identify(loss_at: Any, out0: Any, loss: str, where: str, shape: tuple[int, ...]) -> ClassScores:
    import torch

    half = out0.dtype in (torch.float16, torch.bfloat16)
    tol = 2e-2 if half else 1e-3
    g = torch.Generator().manual_seed(SEED)
    probes = [torch.zeros(shape)] + [torch.randn(shape, generator=g) * 2 for _ in range(3)]
    dims = [-1] + ([1] if len(shape) >= 3 else [])
    readings = (
        ("logits", lambda z, d: z),
        ("probabilities", lambda z, d: torch.softmax(z, dim=d)),
        ("log-probabilities", lambda z, d: torch.log_softmax(z, dim=d)),
    )
    at_uniform, offset_seen = math.nan, None
    for dim in dims:
        for name, read in readings:
            measured = []
            for z in probes:
                leaf = z.to(out0.dtype).to(out0.device).requires_grad_(True)
                try:
                    with torch.enable_grad():
                        value = loss_at(read(leaf, dim))
                        grad = (
                            torch.autograd.grad(value, leaf, allow_unused=True)[0]
                            if isinstance(value, torch.Tensor) and value.requires_grad
                            else None
                        )
                except Exception:  # noqa: BLE001 - a loss of probabilities may reject logits: not this reading
                    measured = []
                    break
                v = float(value)
                if not math.isfinite(v) or grad is None or not bool(torch.isfinite(grad).all()):
                    measured = []
                    break
                measured.append((v, grad.detach().double().cpu()))
            if not measured:
                continue
            if name == "logits" and dim == -1:
                at_uniform = measured[0][0]
            if all(float(gr.abs().max()) == 0 for _, gr in measured):
                continue  # the loss does not depend on the output through this reading
            kind, scale, offset = _fits(probes, measured, dim, tol)
            if kind == "ce":
                return ClassScores("ce", loss, where, shape, len(probes), measured[0][0], name, scale)
            if kind == "offset" and offset_seen is None:
                offset_seen = (name, offset)
    if offset_seen is not None:
        return ClassScores("offset", loss, where, shape, len(probes), at_uniform, offset_seen[0], offset=offset_seen[1])
    if math.isnan(at_uniform):
        return ClassScores(
            "unread", loss, where, shape, why="the loss has no finite gradient with respect to the output"
        )
    # not one cross-entropy of the output, but maybe of a map of it that keeps its classes (logits upsampled to the
    # labels' resolution inside the loss) or another function of its softmax (a focal loss): then the loss is the
    # same when a constant is added to every row of scores, which no metric-learning loss or regression is
    for dim in dims:
        if _shift_invariant(loss_at, probes, dim, out0, tol):
            return ClassScores("softmax", loss, where, shape, len(probes), at_uniform, reading=f"dim {dim}")
    return ClassScores("other", loss, where, shape, len(probes), at_uniform)


def _shift_invariant(loss_at: Any, probes: list[Any], dim: int, out0: Any, tol: float) -> bool:
    """Whether the loss is unchanged (within ``tol``) when a random constant is added to each row of the random
    probes along ``dim`` (the classes)."""
    import torch

    g = torch.Generator().manual_seed(SEED + 1)
    size = list(probes[0].shape)
    size[dim] = 1
    for z in probes[1:]:
        shifted = z + torch.randn(size, generator=g) * 3
        try:
            with torch.no_grad():
                a = float(loss_at(z.to(out0.dtype).to(out0.device)))
                b = float(loss_at(shifted.to(out0.dtype).to(out0.device)))
        except Exception:  # noqa: BLE001 - a loss that rejects these outputs: not told
            return False
        if not (math.isfinite(a) and math.isfinite(b)) or abs(a - b) > tol * max(abs(a), abs(b), 1e-6):
            return False
    return True


def _fits(probes: list[Any], measured: list[tuple[float, Any]], dim: int, tol: float) -> tuple[str, float, float]:
    """("ce", the weights' sum, 0) when the measured values and gradients are a cross-entropy's over ``dim``;
    ("offset", sum, constant) when only the gradients are; ("other", 0, 0) otherwise."""
    import torch

    def rows(t: Any) -> Any:
        t = t.double().movedim(dim, -1)
        return t.reshape(-1, t.shape[-1])

    c = probes[0].shape[dim]
    z1 = rows(probes[1])
    g0, g1 = rows(measured[0][1]), rows(measured[1][1])
    p1 = torch.softmax(z1, dim=-1)
    d = p1 - 1.0 / c
    big = max(float(g0.abs().max()), float(g1.abs().max()), 1e-12)
    weight = (((g1 - g0) * d).sum(-1) / (d * d).sum(-1).clamp_min(1e-300)).clamp_min(0)
    a = weight[:, None] * p1 - g1
    if float(a.min()) < -tol * max(float(a.abs().max()), 1e-12):
        return "other", 0.0, 0.0
    a = a.clamp_min(0)
    a_sum = a.sum(-1)
    diffs = []
    for z, (value, grad) in zip(probes, measured):
        logp = torch.log_softmax(rows(z), dim=-1)
        predicted_grad = a_sum[:, None] * logp.exp() - a
        if float((predicted_grad - rows(grad)).abs().max()) > tol * big:
            return "other", 0.0, 0.0
        diffs.append(value - float(-(a * logp).sum()))
    size = max(abs(v) for v, _ in measured)
    scale = float(a.sum())
    if max(abs(x) for x in diffs) <= tol * max(size, 1e-6):
        return "ce", scale, 0.0
    if max(diffs) - min(diffs) <= tol * max(size, 1e-6):
        return "offset", scale, sum(diffs) / len(diffs)
    return "other", 0.0, 0.0
