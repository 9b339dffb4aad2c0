from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

import torch

from ...guard import preserved_rng
from ...registry import check
from ...training import describe_batch, modes, output_tensor, probe, run_or_skip
from ...training.backward import own_backward

MAX_BATCHES = 2


def _float_fields(batch: Any) -> list[tuple[str, torch.Tensor]]:
    """The batch's float tensors by name, those nested in lists or tuples among them (the crop batches of a multi-view
    batch, [[global crops, local crops], labels]; a field holding a list of tensors), a few levels down."""
    if isinstance(batch, torch.Tensor):
        return [("batch", batch)]
    if isinstance(batch, Mapping):
        return [f for k, v in batch.items() for f in _nested(str(k), v, 2)]
    if isinstance(batch, (list, tuple)):
        return [f for i, v in enumerate(batch) for f in _nested(f"batch[{i}]", v, 2)]
    return []


def _nested(name: str, value: Any, depth: int) -> list[tuple[str, torch.Tensor]]:
    if isinstance(value, torch.Tensor):
        return [(name, value)] if value.is_floating_point() else []
    if depth > 0 and isinstance(value, (list, tuple)):
        return [f for i, v in enumerate(value) for f in _nested(f"{name}[{i}]", v, depth - 1)]
    return []


def _fields_said(batches: list[Any], fields: int) -> str:
    """What the sampled batches' float fields are, said as they are: finite float fields, integer tensors only
    (token ids, class ids), or examples a trainer collates inside its own step (lists of dicts of prompts)."""
    if fields:
        return f"{fields} float field(s) finite"
    first = batches[0] if batches else None
    if isinstance(first, (list, tuple)) and first and all(isinstance(b, Mapping) for b in first):
        keys = sorted({str(k) for b in first for k in b})
        return (
            f"no float field (the batches are lists of {len(first)} uncollated examples with {', '.join(keys)}: "
            "their tensors are built inside the training step)"
        )
    tensors = [
        v
        for b in batches
        for v in (b.values() if isinstance(b, Mapping) else b if isinstance(b, (list, tuple)) else [b])
    ]
    return "no float field (token ids)" if any(isinstance(v, torch.Tensor) for v in tensors) else "no float field"


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
        Checks the float fields of the first sampled batches for NaN/Inf (tensors nested in lists or tuples
        too, two levels down: the crop batches of a multi-view batch, ``[[crops...], labels]``), then runs the loss as your
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
        (S1), not here. A loop watched through its step whose loss a GradScaler scales (one of the state's, or
        any the step calls ``scale`` on) leaves scaled gradients, which overflow by design at the scaler's
        starting scale: the scaler finds the Inf, skips that optimizer step and lowers its scale. Those
        gradients are judged as the optimizer applies them, at the steps of the state's optimizers that are
        taken (after ``unscale_``); while the scaler skips every step, the step is called again on the first
        batches (a skipped step changes no weight), up to 40 calls, until it takes one. Fails when non-finite
        gradients reach a step taken, or when the scaler still skips at a scale of 1 or less (the gradients
        are non-finite unscaled); a scaler that has neither taken a step nor come down to 1 in 40 calls
        leaves the gradients not judged. The forward and the loss the step returns are unscaled and judged
        as they are. A loop without a scaler, or whose optimizer is not in the state, is judged on the
        gradients as the backward leaves them.
        A model set up by Lightning Fabric under a precision plugin that wants ``fabric.backward(loss)``
        (``bf16-mixed``, ``16-mixed``) is backpropagated as ``fabric.backward`` runs it on one device (its
        gradients unscaled); a strategy with a backward of its own (DeepSpeed) is not run through.
    Not applicable
        A model given as dlcheck_model whose forward needs fields the batches lack (a denoiser that your
        loss calls): it is not called on the batch (give dlcheck_make_training with dlcheck_train_step or
        dlcheck_compute_loss and T5 runs your loss; a loop whose loss lives inside its own dlcheck_train_step is
        watched through that step: every module of every network it trains, the loss it returns, the gradients). Every other trained model: its loss, activations and gradients must be finite.
    """
    fresh, batches, setup = probe(dlcheck)
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
    fields = sum(len(_float_fields(b)) for b in batches)
    from .gradients import _loss_unavailable

    why = _loss_unavailable(setup, model, batches[0])
    if why is not None:
        _through_the_step(dlcheck, setup, why, _fields_said(batches, fields), len(batches))
        return
    names = {id(m): n for n, m in model.named_modules()}  # by identity: a Metric hashes its state
    trainable = [(n, p) for n, p in model.named_parameters() if p.requires_grad]
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
                    with own_backward():
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
        + _fields_said(batches, fields)
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


#: calls of the user's step T5 watches when the loss lives inside it
STEP_CALLS = MAX_BATCHES
#: calls at most while a GradScaler skips every step: from its default starting scale (2**16), halved at each skip,
#: the scale reaches 1 (the gradients unscaled) at the 17th
SCALER_CALLS = 40


def _grad_scalers(state: Mapping[str, Any]) -> list[Any]:
    """The enabled GradScalers a training state holds (an entry, or an Accelerator's ``scaler``)."""
    found: list[Any] = []
    for value in state.values():
        for obj in (value, getattr(value, "scaler", None)):
            if isinstance(obj, torch.amp.GradScaler) and obj.is_enabled() and all(obj is not s for s in found):
                found.append(obj)
    return found


def _scale_of(scalers: list[Any]) -> float | None:
    return min((float(s.get_scale()) for s in scalers), default=None)


def _state_optimizers(state: Mapping[str, Any]) -> list[torch.optim.Optimizer]:
    """The torch optimizers of a training state, unwrapped (an Accelerator's or Fabric's wrapper steps the inner
    one through its scaler)."""
    from ...training.runs import unwrap_prepared

    out: list[torch.optim.Optimizer] = []
    for value in state.values():
        inner = unwrap_prepared(value)
        if isinstance(inner, torch.optim.Optimizer) and all(inner is not o for o in out):
            out.append(inner)
    return out


def _through_the_step(dlcheck, setup: Any, why: str, fields: str, n_batches: int) -> None:
    """T5 for a loop whose loss lives inside its own step: fresh objects from the factory, the user's
    ``dlcheck_train_step`` called on the first training batches with a hook on every module of every network the
    state trains (the first non-finite output), one on every trainable parameter (a non-finite gradient as backward
    accumulates it), one on every optimizer of the state (the gradients each step taken applies), and the loss the
    step returns. A backward whose loss a GradScaler scaled leaves scaled gradients: an overflow there is the
    scaler's to find (it skips that step and lowers its scale), so those gradients are judged as the optimizer
    applies them, at the steps taken; while the scaler skips every step the run goes on (at most
    :data:`SCALER_CALLS` calls, the first batches again: a skipped step changes no weight) until it takes one or
    its scale is down to 1."""
    from ...training.runs import Trajectory
    from .gradients import _state_modules

    def watched() -> dict[str, Any]:
        state = setup.state()
        roots = _state_modules(state)
        names: dict[int, str] = {}
        pnames: dict[int, str] = {}
        for prefix, root in roots:
            for mn, m in root.named_modules():
                names.setdefault(id(m), (prefix + mn).rstrip(".") or type(root).__name__)
            for pn, p in root.named_parameters():
                pnames.setdefault(id(p), prefix + pn)
        seen: dict[str, Any] = {"first": None, "outputs": 0, "bad_grads": [], "grads": set(), "calls": 0}
        # the GradScaler: the state's, and any the step scales a loss with; per call, the smallest scale a backward used
        scalers = _grad_scalers(state)
        seen.update(scale_at={}, bad_calls=set(), taken=[], taken_bad=None, taken_params=set(), opt_watched=False)
        before = {"scale": _scale_of(scalers)}

        def hook(mod, args, out):
            t = output_tensor(out)
            if seen["first"] is not None or not isinstance(t, torch.Tensor) or not t.is_floating_point():
                return
            if not torch.isfinite(t.detach()).all():
                seen["first"] = (
                    names.get(id(mod), "?"),
                    type(mod).__name__,
                    str(t.dtype).replace("torch.", ""),
                    int(torch.isnan(t).sum()),
                    int(torch.isinf(t).sum()),
                    t.numel(),
                    _max_abs(args),
                    seen["calls"],
                )
            else:
                seen["outputs"] += 1

        def grad_hook(name):
            def h(p):
                seen["grads"].add(name)
                if p.grad is not None and not torch.isfinite(p.grad).all():
                    seen["bad_calls"].add(seen["calls"])
                    if name not in seen["bad_grads"]:
                        seen["bad_grads"].append(name)
                        seen.setdefault("bad_grads_at", seen["calls"])

            return h

        def read_step(opt: torch.optim.Optimizer) -> None:
            seen["taken"].append(seen["calls"])
            params = [p for g in opt.param_groups for p in g["params"] if p.grad is not None]
            seen["taken_params"].update(id(p) for p in params)
            bad = [pnames.get(id(p), f"param{i}") for i, p in enumerate(params) if not torch.isfinite(p.grad).all()]
            if bad and seen["taken_bad"] is None:
                seen["taken_bad"] = (seen["calls"], bad)

        closure_step: set[int] = set()

        def pre(opt, args, kwargs):
            given = args[1:] if args and args[0] is opt else args
            if callable(kwargs.get("closure", given[0] if given else None)):
                closure_step.add(id(opt))  # the closure computes the gradients inside the step: read them after
            else:
                read_step(opt)

        def post(opt, args, kwargs):
            if id(opt) in closure_step:
                closure_step.discard(id(opt))
                read_step(opt)

        handles = [m.register_forward_hook(hook) for _, root in roots for m in root.modules()]
        for prefix, root in roots:
            handles += [
                p.register_post_accumulate_grad_hook(grad_hook(prefix + n))
                for n, p in root.named_parameters()
                if p.requires_grad
            ]
        for opt in _state_optimizers(state):
            handles += [opt.register_step_pre_hook(pre), opt.register_step_post_hook(post)]
            seen["opt_watched"] = True
        traj = Trajectory()
        original_scale = torch.amp.GradScaler.scale

        def scale(self, outputs):
            if self.is_enabled():
                if all(self is not s for s in scalers):
                    scalers.append(self)
                used = float(self.get_scale())
                seen["scale_at"][seen["calls"]] = min(used, seen["scale_at"].get(seen["calls"], used))
            return original_scale(self, outputs)

        def after(i: int) -> None:
            # a scaler of the state whose own scale() does not come here (a subclass's): the scale it began the call at
            now = _scale_of(scalers)
            if i not in seen["scale_at"] and before["scale"] is not None and now is not None and now != before["scale"]:
                seen["scale_at"][i] = before["scale"]
            before["scale"] = now
            seen["calls"] = i + 1

        def skipping() -> bool:
            """Every backward so far overflowed under a GradScaler that has taken no step, with room left to lower
            its scale: the run goes on."""
            if not seen["scale_at"] or seen["taken"] or not seen["opt_watched"] or seen["first"] is not None:
                return False
            if any(v is not None and not math.isfinite(v) for _, v in traj.losses()):
                return False
            scaled_bad = [c for c in seen["bad_calls"] if c in seen["scale_at"]]
            return bool(scaled_bad) and min(seen["scale_at"][c] for c in scaled_bad) > 1

        def stop() -> bool:
            return seen["calls"] >= STEP_CALLS and not skipping()

        first_batches = setup.batches(STEP_CALLS)
        stream = (first_batches[k % len(first_batches)] for k in range(SCALER_CALLS))
        torch.amp.GradScaler.scale = scale
        try:
            with preserved_rng():
                setup.run(state, stream, 0, traj, after=after, stop=stop, planned=SCALER_CALLS)
        finally:
            torch.amp.GradScaler.scale = original_scale
            for h in handles:
                h.remove()
        seen["losses"] = [loss for _, loss in traj.losses()]
        return seen

    seen = run_or_skip(dlcheck, watched)
    calls = seen["calls"]
    where = f"{calls} call(s) of dlcheck_train_step on fresh objects from dlcheck_make_training (its loss is computed inside the step: {why})"
    # a backward whose loss a GradScaler scaled: its gradients are judged at the optimizer steps taken, not as the
    # backward leaves them (scaled; an overflow there is the scaler's to find, and it skips that step)
    scaled = bool(seen["scale_at"]) and seen["opt_watched"]
    scaled_bad = sorted(c for c in seen["bad_calls"] if scaled and c in seen["scale_at"])
    raw_bad_at = min((c for c in seen["bad_calls"] if c not in scaled_bad), default=None)
    never_taken = bool(scaled_bad) and not seen["taken"]
    diverged_at = None
    if never_taken and min(seen["scale_at"][c] for c in scaled_bad) <= 1:
        diverged_at = next(c for c in scaled_bad if seen["scale_at"][c] <= 1)
    grad_events = [
        raw_bad_at,
        seen["taken_bad"][0] if seen["taken_bad"] is not None else None,
        diverged_at,
    ]
    grad_at = min((c for c in grad_events if c is not None), default=None)
    # the first thing to go wrong, in the order the step runs (a forward, its backward, the loss it returns): an
    # Inf loss at call 1 steps NaN into the weights, and every output of call 2 is its consequence
    losses = [v for v in seen["losses"] if v is not None]
    loss_at = next((i for i, v in enumerate(seen["losses"]) if v is not None and not math.isfinite(v)), None)
    events = [
        (seen["first"][7], 0) if seen["first"] is not None else None,
        (grad_at, 1) if grad_at is not None else None,
        (loss_at, 2) if loss_at is not None else None,
    ]
    earliest = min((e for e in events if e is not None), default=None)
    if earliest is not None and earliest[1] > 0:
        seen["first"] = None  # a module's non-finite output came after: the consequence, not the cause
    if earliest is not None and earliest[1] == 1 and loss_at is not None and loss_at == earliest[0]:
        earliest = (loss_at, 2)  # the same call's loss is already non-finite: the loss is the cause
    if seen["first"] is not None:
        name, kind, dtype, n_nan, n_inf, numel, in_max, at = seen["first"]
        dlcheck.fail(
            [
                f"{where}: at call {at + 1}, the first module with a non-finite output is {name} ({kind}, {dtype}): "
                f"{n_nan} NaN and {n_inf} Inf among {numel} values"
                + (f"; its input's largest finite |value| {in_max:.4g}" if in_max is not None else "")
            ],
            f"{name} produces NaN/Inf in the training step: an overflow (float16 beyond 65504, exp or squares of large "
            "values), an undefined operation (0/0, log of 0, sqrt of a negative), or non-finite values it was given",
            "normalise the inputs, train in bfloat16 or float32 with autocast instead of model.half(), use the stable "
            "library ops (log_softmax, logsumexp), clamp before log/sqrt",
        )
    if earliest is not None and earliest[1] == 2:
        dlcheck.fail(
            [
                f"{where}: at call {loss_at + 1} the step returned the loss {seen['losses'][loss_at]} while every module "
                "output was finite"
            ],
            "the loss itself is undefined: log of 0, a mean over zero supervised targets, or a division by zero in a "
            "hand-written loss",
            "use F.cross_entropy/log_softmax rather than log(softmax), make sure every batch has supervised targets, "
            "add eps to divisions",
        )
    if grad_at is not None and grad_at == raw_bad_at:
        bad = seen["bad_grads"]
        dlcheck.fail(
            [
                f"{where}: every activation finite, but {len(bad)} parameter gradients hold NaN/Inf: {', '.join(bad[:6])}"
            ],
            "the backward pass overflows (float16 gradients beyond 65504, or the derivative of sqrt/log at 0)",
            "train with a GradScaler (torch.amp.GradScaler) or in bfloat16, and add eps inside sqrt/log/norm",
        )
    if grad_at is not None and seen["taken_bad"] is not None and grad_at == seen["taken_bad"][0]:
        at, bad = seen["taken_bad"]
        dlcheck.fail(
            [
                f"{where}: every activation finite, but the optimizer step taken at call {at + 1} applied gradients "
                f"that hold NaN/Inf in {len(bad)} parameters: {', '.join(bad[:6])}"
                + (
                    f" (the backward's loss was scaled by a GradScaler, scale {seen['scale_at'][at]:g})"
                    if at in seen["scale_at"]
                    else ""
                )
            ],
            "non-finite gradients reach the weights: a GradScaler's skip is bypassed (optimizer.step() called on "
            "gradients the scaler found non-finite), or the gradients overflow after unscaling",
            "step through scaler.step(optimizer) then scaler.update() (it skips a step whose gradients overflowed and "
            "lowers its scale), train in bfloat16, and add eps inside sqrt/log/norm",
        )
    if diverged_at is not None:
        bad = seen["bad_grads"]
        first_scale = seen["scale_at"][scaled_bad[0]]
        dlcheck.fail(
            [
                f"{where}: every activation and loss finite, but the GradScaler skipped every optimizer step: the "
                f"gradients overflowed at all {len(scaled_bad)} backwards, its scale falling from {first_scale:g} to "
                f"{seen['scale_at'][diverged_at]:g}, so they are non-finite even unscaled ({len(bad)} parameters: "
                f"{', '.join(bad[:6])}); the weights never train"
            ],
            "the backward itself produces NaN/Inf at any scale (the derivative of sqrt/log/norm at 0, a division by "
            "zero), not the scaler's overflow",
            "add eps inside sqrt/log/norm and divisions, upcast the loss's reductions to float32",
        )
    if never_taken:
        dlcheck.not_judged(
            "the gradients applied",
            f"the GradScaler skipped every optimizer step of the {calls} calls (its scaled gradients overflowed; its "
            f"scale {seen['scale_at'][scaled_bad[-1]]:g} at the last): whether a lower scale makes them finite was not "
            "reached",
        )
    if scaled_bad and seen["taken"]:
        scales = [seen["scale_at"][c] for c in scaled_bad]
        grads_said = (
            f", {len(scaled_bad)} call(s) whose scaled gradients overflowed (a GradScaler scaled the loss: it finds "
            f"the Inf, skips their optimizer step and lowers its scale, by design: {max(scales):g} -> "
            f"{min(seen['scale_at'].values()):g}), the gradients of {len(seen['taken_params'])} parameter tensors "
            f"finite at every optimizer step taken ({len(seen['taken'])})"
        )
    elif never_taken:
        grads_said = ", the gradients not judged (no optimizer step taken)"
    elif seen["grads"]:
        grads_said = f", the gradients of {len(seen['grads'])} parameter tensors finite"
    else:
        grads_said = ", no gradient"
    dlcheck.measured(
        f"{n_batches} sampled batch(es): "
        + fields
        + f"; {where}: every module output finite ({seen['outputs']} outputs)"
        + (f", losses {', '.join(f'{v:.4g}' for v in losses)}" if losses else ", the step returns no loss")
        + grads_said,
        batches=calls,
        losses=[round(v, 6) for v in losses],
        gradients_checked=len(seen["grads"]),
        scaler_skipped=len(scaled_bad),
        optimizer_steps_taken=len(seen["taken"]),
    )
