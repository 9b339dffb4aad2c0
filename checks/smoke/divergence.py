from __future__ import annotations

import math

from ... import detectors
from ...registry import check
from ...training import show_losses, smoke_run


def _lr_text(rec) -> str:
    return detectors.lr_text(rec.lr)


@check(
    "S2",
    domain="smoke",
    title="loss spike in a short real run",
    roles=(),
    optional_roles=("trainer", "lightning_module", "make_training", "dataloader"),
    settings=detectors.SETTINGS["S2"],
)
def check_loss_spike(dlcheck):
    """No step of a short real run has a loss far above the mean of the steps before it.

    What it does
        Uses the shared smoke run (see S1): for every step after ``warmup``, compares its loss with the
        mean of the ``window`` previous finite losses, and fails at the first one above ``factor`` x.
    Why it is bad
        A loss that jumps several-fold within a few steps is a run diverging: a learning rate too high for
        the model, no warmup, no gradient clipping, or a bad batch. It usually ends in NaN or in a model
        that never recovers, after hours of compute.
    Example
        torch.optim.AdamW(model.parameters(), lr=1.0)       # or TrainingArguments(learning_rate=1e-1)
    Use instead
        a learning rate in the usual range for the optimizer (1e-5 to 1e-3 for AdamW), a warmup, and
        gradient clipping (max_grad_norm=1.0 / clip_grad_norm_).
    Known problems
        Non-finite losses are S1's. A loss that reaches exactly 0 skips.
    Not applicable
        Losses that take negative values (GRPO and other policy-gradient objectives, a loss with a
        negative offset): a multiple of their running mean means nothing.
    """
    run = smoke_run(dlcheck)
    losses = [(s, v) for s, v in run.trajectory.losses() if v is not None and math.isfinite(v)]
    if len(losses) < dlcheck.setting("warmup") + 1:
        dlcheck.skip(f"the smoke run logged {len(losses)} finite losses: too few to judge spikes (raise S1.steps)")
    negative = [(s, v) for s, v in losses if v < 0]
    if negative:
        dlcheck.not_applicable(
            f"the loss takes negative values (step {negative[0][0]}: {negative[0][1]:.4g}; a policy-gradient "
            "objective such as GRPO's): a spike as a multiple of its running mean means nothing"
        )
    if any(v == 0 for _, v in losses):
        dlcheck.skip("the loss reaches 0 in the smoke run: spikes relative to its mean cannot be judged")
    factor, window = dlcheck.setting("factor"), dlcheck.setting("window")
    recs = {r.step: r for r in run.trajectory.steps}
    watch = detectors.SpikeWatch(factor, window, dlcheck.setting("warmup"))
    for step, value in losses:
        spike = watch.add(step, value)
        if spike is not None:
            rec = recs[step]
            evidence = [
                f"step {step} of {run.steps}: loss {value:.4g} = {spike.ratio:.1f} x the mean {spike.mean:.4g} of the "
                f"{len(spike.previous)} steps before it (limit {factor} x)",
                f"losses: {show_losses(run.trajectory, upto=step, last=window + 1)}; {_lr_text(rec)}",
            ]
            if rec.grad_norm is not None:
                evidence.append(f"gradient norm at step {step}: {rec.grad_norm:.4g}")
            dlcheck.fail(evidence, detectors.spike_cause(_lr_text(rec)), detectors.SPIKE_FIX)
    worst = watch.worst
    dlcheck.measured(
        f"{run.steps}-step smoke run: losses {losses[0][1]:.4g} -> {losses[-1][1]:.4g}; the highest loss against "
        f"the mean of the {window} steps before it is {worst[0]:.2f} x (step {worst[1]}; a spike is {factor} x)",
        losses=len(losses),
        first_loss=losses[0][1],
        last_loss=losses[-1][1],
        largest_ratio=round(worst[0], 4),
        at_step=worst[1],
    )


@check(
    "S3",
    domain="smoke",
    title="gradient norm explodes in a short real run",
    roles=(),
    optional_roles=("trainer", "lightning_module", "make_training", "dataloader"),
    settings=detectors.SETTINGS["S3"],
)
def check_grad_explosion(dlcheck):
    """The gradient norm of a short real run stays within a multiple of its starting level.

    What it does
        Uses the shared smoke run (see S1): the total gradient 2-norm at every optimizer step (before
        clipping: the Trainer's logged ``grad_norm``, the norm at ``optimizer.step()`` otherwise) is
        compared with the median of the first ``baseline`` steps; the first step above ``factor`` x fails.
    Why it is bad
        Exploding gradients precede a divergence (S2) or a NaN (S1): updates grow, the weights leave the
        region where the loss is smooth, and training is lost. Clipping hides it in the updates but not in
        the norm.
    Example
        torch.optim.SGD(model.parameters(), lr=5.0)
    Use instead
        lower the learning rate, add warmup, clip gradients (max_grad_norm=1.0), and check that the loss
        is averaged, not summed, over tokens/examples.
    Known problems
        Needs gradient norms: a run that does not expose them (a Trainer with max_grad_norm=0 still logs
        them; a custom loop whose optimizer is not in dlcheck_make_training does not) skips.
    Not applicable
        None: every run that takes optimizer steps has gradients.
    """
    run = smoke_run(dlcheck)
    norms = [
        (r.step, r.grad_norm, r) for r in run.trajectory.steps if r.grad_norm is not None and math.isfinite(r.grad_norm)
    ]
    base_n = dlcheck.setting("baseline")
    if len(norms) <= base_n:
        dlcheck.skip(f"the smoke run recorded {len(norms)} finite gradient norms: too few to judge (raise S1.steps)")
    factor = dlcheck.setting("factor")
    watch = detectors.GradWatch(factor, base_n)
    for step, norm, rec in norms:
        if watch.reference is not None and watch.reference <= 0:
            dlcheck.skip("the first gradient norms are 0: nothing to compare against (see T3)")
        boom = watch.add(step, norm)
        if boom is not None:
            series = ", ".join(f"{s}: {n:.3g}" for s, n, _ in norms if s <= step)
            evidence = [
                f"step {step} of {run.steps}: gradient norm {norm:.4g} = {boom.ratio:.0f} x the median "
                f"{boom.reference:.4g} of steps 1-{base_n} (limit {factor} x)",
                f"gradient norms: {series}",
                f"losses: {show_losses(run.trajectory, upto=step)}; {_lr_text(rec)}",
            ]
            dlcheck.fail(evidence, detectors.grad_cause(_lr_text(rec)), detectors.GRAD_FIX)
    reference = watch.reference
    highest = max(norms[base_n:], key=lambda t: t[1])
    dlcheck.measured(
        f"{run.steps}-step smoke run: gradient norms {norms[0][1]:.3g} -> {norms[-1][1]:.3g}, at most "
        f"{highest[1]:.3g} = {highest[1] / reference:.2f} x the median {reference:.3g} of steps 1-{base_n} "
        f"(step {highest[0]}; an explosion is {factor} x)",
        norms=len(norms),
        reference=reference,
        largest=highest[1],
        largest_ratio=round(highest[1] / reference, 4),
    )
