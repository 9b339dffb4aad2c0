from __future__ import annotations

import math

import torch

from ... import detectors
from ...registry import check
from ...training import show_losses, smoke_run

ADAM_LIKE = ("Adam", "AdamW", "Adamax", "NAdam", "RAdam")
FLOAT16_TINY = 6e-8  # the smallest float16 subnormal: a smaller eps rounds to 0


def _num(value) -> str:
    return "not logged" if value is None else f"{value:.4g}"


def _norm(rec) -> str:
    if rec.grad_norm is None and rec.step_norm is not None:
        return f"{rec.step_norm:.4g} at optimizer.step()"  # the norm before clipping not known at this step
    return _num(rec.grad_norm)


def _param_dtypes(optimizer) -> set:
    return {p.dtype for g in optimizer.param_groups for p in g["params"]} if optimizer is not None else set()


@check(
    "S1",
    domain="smoke",
    title="NaN/Inf loss, gradients or weights in a short real run",
    roles=(),
    optional_roles=("trainer", "lightning_module", "make_training", "dataloader"),
    settings=detectors.SETTINGS["S1"],
)
def check_nonfinite_run(dlcheck):
    """A short real run of your training keeps its loss, gradients and weights finite.

    What it does
        Runs ``S1.steps`` optimizer steps of your own training on fresh objects (a clone of your Trainer and
        its ``train()``, a Lightning ``fit`` on a copy of your module, or your ``dlcheck_train_step`` on
        ``dlcheck_make_training``, called micro-batch by micro-batch until your optimizer has stepped
        ``steps`` times: under gradient accumulation that is ``steps`` x the accumulation, at most
        ``max_micro_steps``, and the evidence says how many of each ran), recording at every step the loss,
        the gradient norm and which gradients and weights hold NaN/Inf. Fails at the first step that shows one, naming what went
        non-finite first: the loss (the forward), the gradients (the backward) or the weights (the
        optimizer update).
    Why it is bad
        A NaN is absorbing: once in the weights, every later step is NaN, and a long run is lost (the
        Trainer's ``logging_nan_inf_filter`` even hides NaN losses from the logs). Typical causes: a pure
        float16 model with Adam, whose ``eps=1e-8`` rounds to 0 in float16 so a zero gradient gives 0/0;
        a learning rate that diverges; an fp16 overflow.
    Example
        model.half(); optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)   # eps 1e-8 == 0 in fp16
    Use instead
        keep float32 master weights and use autocast + GradScaler (or bfloat16); for pure fp16 weights use
        eps >= 1e-4; lower the learning rate or add warmup and gradient clipping when the loss diverges.
    Known problems
        A step a GradScaler skips because of Inf gradients is expected and not reported (its update never
        happens); an optimizer that takes no step in the whole run (a scaler that skips every step)
        leaves the gradients and updates not judged, and says so (T5 judges a scaler that never steps). A gradient accumulation longer than ``max_micro_steps / steps`` gets fewer optimizer steps
        (the evidence says so; raise ``S1.max_micro_steps``). A state without an optimizer object, whose step updates
        the weights itself (a hand-written ``p.data.add_(p.grad, alpha=-lr)``), runs until the step has made
        ``steps`` updates: an update is a call after which the weights changed (a fingerprint of each parameter),
        its gradients read as the backward leaves them; one that changes no weight in ``steps`` calls runs no
        further and its updates are not judged. A state whose optimizer the step never calls runs
        ``max_micro_steps``. The gradients are read at your optimizer's step, as it applies them (after the
        closure of ``optimizer.step(closure)`` has run: Lightning Fabric's, LBFGS's way), so a step that zeroes
        them after stepping is judged; a step at which no parameter has a gradient gives no norm. The run is
        short: a NaN that needs thousands of steps to appear is out of reach here; ``pytest_dlcheck.watch``
        runs this detector during the real run (README, "During the real run").
    Not applicable
        None: every run's loss, gradients and weights must stay finite.
    """
    run = smoke_run(dlcheck)
    traj = run.trajectory
    for rec in traj.steps:
        loss_bad = rec.loss is not None and not math.isfinite(rec.loss)
        if not (loss_bad or rec.nonfinite_grads or rec.nonfinite_params):
            continue
        before = show_losses(traj, upto=rec.step - 1) if rec.step > 1 else "none (the first step)"
        evidence = [
            f"{run.at(rec.step)}: loss {_num(rec.loss)}, gradient norm {_norm(rec)}, "
            f"lr {_num(rec.lr)}; losses before it: {before}"
        ]
        opt = traj.notes.get("optimizer")
        dtypes = _param_dtypes(opt)
        if rec.nonfinite_params and not rec.nonfinite_grads and not loss_bad:
            shown = ", ".join(rec.nonfinite_params[:5])
            evidence.append(
                f"the gradients of step {rec.step} were finite, but after the optimizer update the weights hold "
                f"NaN/Inf: {shown}"
            )
            eps = opt.param_groups[0].get("eps") if opt is not None else None
            if (
                opt is not None
                and type(opt).__name__ in ADAM_LIKE
                and torch.float16 in dtypes
                and eps is not None
                and eps < FLOAT16_TINY
            ):
                cause = (
                    f"{type(opt).__name__}(eps={eps:g}) on float16 weights: eps rounds to 0 in float16, so a "
                    "parameter whose gradient is 0 (an unused embedding row, a dead unit) gets the update "
                    "0 / (0 + 0) = NaN"
                )
                fix = (
                    "keep the weights in float32 and train with autocast + GradScaler (or in bfloat16); if the "
                    f"weights must stay float16, use eps=1e-4 ({type(opt).__name__}(..., eps=1e-4))"
                )
            else:
                cause, fix = detectors.NONFINITE["update"]
        elif rec.nonfinite_grads and not loss_bad:
            evidence.append(
                f"the loss was finite but the gradients of {len(rec.nonfinite_grads)} parameters hold NaN/Inf: "
                + ", ".join(rec.nonfinite_grads[:5])
            )
            cause, fix = detectors.NONFINITE["backward"]
        else:
            finite = [v for _, v in traj.losses() if v is not None and math.isfinite(v)]
            if detectors.diverged_before(finite):
                evidence.append(f"the loss rose from {finite[0]:.4g} to {finite[-1]:.4g} before turning non-finite")
                cause, fix = detectors.NONFINITE["diverging"]
                cause = cause.format(lr=rec.lr)
            else:
                cause, fix = detectors.NONFINITE["forward"]
        dlcheck.fail(evidence, cause, fix)
    if not traj.steps:
        dlcheck.skip("the smoke run recorded no step")
    losses = [v for _, v in traj.losses() if v is not None]
    norms = [r.grad_norm for r in traj.steps if r.grad_norm is not None]
    own = bool(traj.notes.get("own_updates"))  # no optimizer object: the step updates the weights itself
    # an optimizer that took no step in the whole run (a GradScaler skipping every step, a step that
    # never calls it): no gradient was applied and no update happened to judge
    unstepped = not own and traj.notes.get("opt_steps") == 0
    opt_steps = traj.calls.count("opt") if own or unstepped else traj.calls.count("opt") or len(traj.steps)
    steps_word = "update(s) made by dlcheck_train_step itself" if own else "optimizer step(s)"
    gradless = traj.notes.get("no_grad_steps", 0)
    if gradless and not any(r.grad_norm is not None or r.step_norm is not None for r in traj.steps):
        dlcheck.not_judged(
            "gradients",
            f"no parameter of the model had a gradient at any of the {gradless} updates the run watched"
            if own
            else f"no parameter of the optimizer had a gradient at any of its {gradless} steps the run watched",
        )
    if own and not opt_steps:
        dlcheck.not_judged(
            "the updates",
            f"the {len(traj.steps)} calls of dlcheck_train_step changed no weight of the model (no optimizer object in "
            "the state: an update is a call after which the weights changed); T2 judges a step that does not train",
        )
    if unstepped:
        dlcheck.not_judged(
            "gradients and updates",
            f"the optimizer took no step in the {len(traj.steps)} micro-steps of the run (a GradScaler that "
            "skips every step because the gradients overflow, or a step that never calls the optimizer): T5 judges "
            "a GradScaler that never steps, T2 a step that does not train",
        )
    dlcheck.measured(
        f"{run.length}: "
        + (
            f"losses {losses[0]:.4g} -> {losses[-1]:.4g} ({len(losses)} logged), all finite"
            if losses
            else "no loss logged"
        )
        + (f"; gradient norm ≤ {max(norms):.3g} at {len(norms)} steps, all finite" if norms else "")
        + (f"; no parameter had a gradient at {gradless} {steps_word}: no norm there" if gradless else "")
        + (
            f"; weights finite after {opt_steps} updates made by dlcheck_train_step itself (no optimizer object)"
            if own
            else "; no optimizer step taken"
            if unstepped
            else f"; weights finite after {opt_steps} optimizer steps"
        ),
        steps=len(traj.steps),
        optimizer_steps=opt_steps,
        micro_steps=run.micro_steps,
        first_loss=losses[0] if losses else None,
        last_loss=losses[-1] if losses else None,
        max_grad_norm=max(norms) if norms else None,
    )
