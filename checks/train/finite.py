from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

import torch

from ...registry import check
from ...training import describe_batch, modes, output_tensor, probe, run_or_skip

MAX_BATCHES = 2


def _float_fields(batch: Any) -> list[tuple[str, torch.Tensor]]:
    if isinstance(batch, torch.Tensor):
        return [("batch", batch)]
    if isinstance(batch, Mapping):
        return [(str(k), v) for k, v in batch.items() if isinstance(v, torch.Tensor) and v.is_floating_point()]
    if isinstance(batch, (list, tuple)):
        return [
            (f"batch[{i}]", v) for i, v in enumerate(batch) if isinstance(v, torch.Tensor) and v.is_floating_point()
        ]
    return []


def _max_abs(value: Any) -> float | None:
    tensors = (
        [value]
        if isinstance(value, torch.Tensor)
        else [v for v in (value if isinstance(value, (list, tuple)) else []) if isinstance(v, torch.Tensor)]
    )
    finite = [t.detach().float()[torch.isfinite(t.detach().float())] for t in tensors if t.is_floating_point()]
    finite = [t for t in finite if t.numel()]
    return max(float(t.abs().max()) for t in finite) if finite else None


@check(
    "T5",
    domain="train",
    title="NaN or Inf in the forward, the loss or the gradients",
    roles=(),
    optional_roles=("trainer", "lightning_module", "make_training", "model", "dataloader"),
)
def check_finite(dlcheck):
    """The data, every module's output, the loss and the gradients are finite on sampled batches.

    What it does
        Checks the float fields of the first sampled batches for NaN/Inf, then runs the loss as your
        training does (train mode, fresh objects or ``dlcheck_model`` with ``torch.autograd.grad``) with a
        hook on every module, and reports the first module whose output holds NaN or Inf (with its input's
        largest magnitude and its dtype), a non-finite loss, or the parameters whose gradients are not finite.
    Why it is bad
        One NaN poisons every weight it reaches at the next optimizer step, and the run is lost. In float16
        anything above 65504 becomes Inf — un-normalised inputs, sum-pooling, a hand-written softmax or
        norm — and Inf - Inf or 0 x Inf become NaN; in the data, a NaN feature or label does the same.
    Example
        model.half(); inputs in raw units (values in the tens of thousands): the first Linear overflows
    Use instead
        normalise the inputs; train in bfloat16 or with fp32 master weights and autocast
        (torch.autocast(dtype=torch.bfloat16)), upcast reductions (softmax, norms, losses) to float32; clean
        or impute NaN in the data.
    Known problems
        Sees only what a module returns (an overflow inside a module shows in its output). Runs in the
        model's own dtype: a mixed-precision autocast set up by a trainer is exercised by the smoke run
        (S1), not here.
    Not applicable
        A model given as dlcheck_model whose forward needs fields the batches lack (a denoiser that your
        loss calls): it is not called on the batch (give dlcheck_make_training + dlcheck_compute_loss and T5
        runs your loss). Every other trained model: its loss, activations and gradients must be finite.
    """
    fresh, batches, _ = probe(dlcheck)
    model = fresh.model
    for bi, batch in enumerate(batches):
        for name, t in _float_fields(batch):
            bad = ~torch.isfinite(t)
            if bad.any():
                n = int(bad.sum())
                dlcheck.fail(
                    [
                        f"batch {bi}: field {name} ({describe_batch(t)}) holds {n} non-finite values "
                        f"({int(torch.isnan(t).sum())} NaN, {int(torch.isinf(t).sum())} Inf) before the model sees it"
                    ],
                    "the data itself contains NaN/Inf: the first step will turn every weight it touches into NaN",
                    "clean the data (drop or impute the missing values) and check the transforms that divide or take logs",
                )
    names = {id(m): n for n, m in model.named_modules()}  # by identity: a Metric hashes its state
    trainable = [(n, p) for n, p in model.named_parameters() if p.requires_grad]
    fields = sum(len(_float_fields(b)) for b in batches)
    losses: list[float] = []
    checked_grads, outputs = 0, 0
    for bi, batch in enumerate(batches[:MAX_BATCHES]):
        first: list[tuple[str, Any, Any, torch.Tensor]] = []
        last_finite: list[str] = []

        def hook(mod, args, out):
            t = output_tensor(out)
            if first or not isinstance(t, torch.Tensor) or not t.is_floating_point():
                return
            if not torch.isfinite(t.detach()).all():
                first.append((names.get(id(mod), "?") or type(model).__name__, mod, args, t.detach()))
            else:
                last_finite.append(names.get(id(mod), "?"))

        hooks = [m.register_forward_hook(hook) for m in model.modules()]
        try:
            with modes(model, train=True):
                loss = run_or_skip(dlcheck, lambda: fresh.loss(batch))
                grads = []
                if math.isfinite(float(loss.detach())) and loss.requires_grad and trainable:
                    grads = torch.autograd.grad(loss, [p for _, p in trainable], allow_unused=True)
        finally:
            for h in hooks:
                h.remove()
        if first:
            name, mod, args, out = first[0]
            n_nan, n_inf = int(torch.isnan(out).sum()), int(torch.isinf(out).sum())
            in_max = _max_abs(args)
            finite_out = out.float()[torch.isfinite(out.float())]
            dtype = str(out.dtype).replace("torch.", "")
            in_bad = sum(
                int((~torch.isfinite(a.detach())).sum())
                for a in args
                if isinstance(a, torch.Tensor) and a.is_floating_point()
            )
            evidence = [
                f"batch {bi}: the first module with a non-finite output is {name} ({type(mod).__name__}, {dtype}): "
                f"{n_nan} NaN and {n_inf} Inf among {out.numel()} values",
                f"loss {float(loss.detach()):.4g}; batch: {describe_batch(batch)}",
            ]
            before = f" after {last_finite[-1]}" if last_finite and last_finite[-1] else ""
            if in_bad:
                evidence.insert(
                    1,
                    f"its input already holds {in_bad} non-finite values: an operation outside the modules{before} "
                    f"overflowed (largest finite input |value| {in_max:.4g})"
                    if in_max is not None
                    else f"its input already holds {in_bad} non-finite values",
                )
            elif in_max is not None:
                evidence.insert(1, f"its input is finite, largest |value| {in_max:.4g}")
            if finite_out.numel():
                evidence.append(f"largest finite |output| {float(finite_out.abs().max()):.4g}")
            if out.dtype in (torch.float16,) and (n_inf or in_bad):
                where = f"the operations{before}, before {name}," if in_bad else name
                cause = (
                    f"float16 overflow: {where} produce values beyond 65504, float16's largest (a sum over many "
                    "elements, un-normalised inputs, an exp or a square); Inf then turns into NaN downstream"
                )
                fix = (
                    "normalise the inputs, and train in bfloat16 (same range as float32) or in float32 with autocast "
                    "and fp32 master weights instead of model.half(); upcast large reductions to float32"
                )
            elif not in_bad:
                cause = (
                    f"{name} turns finite inputs into {'NaN' if n_nan else 'Inf'}: an overflow (exp of large values, "
                    "squares of large values) or an undefined operation (0/0, log of 0 or of a negative, sqrt of a negative)"
                )
                fix = "normalise the inputs, use the numerically stable library ops (log_softmax, logsumexp, F.normalize with eps), clamp before log/sqrt"
            else:
                cause = f"{name} receives non-finite values from the tensors it is given"
                fix = "find where the non-finite values are produced (they come from an op outside a module), and normalise the inputs"
            dlcheck.fail(evidence, cause, fix)
        if not math.isfinite(float(loss.detach())):
            dlcheck.fail(
                [
                    f"batch {bi}: the loss is {float(loss.detach())} while every module output is finite",
                    f"batch: {describe_batch(batch)}",
                ],
                "the loss itself is undefined on this batch: log of 0, a mean over zero supervised targets "
                "(every label masked), or a division by zero in a hand-written loss",
                "use F.cross_entropy/log_softmax rather than log(softmax), make sure every batch has supervised targets, add eps to divisions",
            )
        bad = [n for (n, _), g in zip(trainable, grads) if g is not None and not torch.isfinite(g).all()]
        losses.append(float(loss.detach()))
        checked_grads = max(checked_grads, sum(g is not None for g in grads))
        outputs = max(outputs, len(last_finite))
        if bad:
            dlcheck.fail(
                [
                    f"batch {bi}: the loss {float(loss.detach()):.4g} and every activation are finite, but {len(bad)} parameter "
                    f"gradients hold NaN/Inf: {', '.join(bad[:6])}"
                ],
                "the backward pass overflows (float16 gradients beyond 65504, or the derivative of sqrt/log at 0)",
                "train with a GradScaler (torch.amp.GradScaler) or in bfloat16, and add eps inside sqrt/log/norm",
            )
    dlcheck.measured(
        f"{len(batches)} sampled batch(es): "
        + (f"{fields} float field(s) finite" if fields else "no float field (token ids)")
        + f"; on {len(losses)} batch(es) in train mode, every module output finite ({outputs} outputs), loss "
        f"{', '.join(f'{v:.4g}' for v in losses)}, "
        + (
            f"the gradients of {checked_grads} parameter tensors finite"
            if checked_grads
            else "no gradient to check (the loss carries none, or nothing is trainable)"
        ),
        batches=len(losses),
        losses=[round(v, 6) for v in losses],
        gradients_checked=checked_grads,
    )
