from __future__ import annotations

import math
from typing import Any

from ... import detectors
from ...registry import check
from ...training import find_setup, show_losses, smoke_run
from ..shared.targets import optimizer_held, state_weight_copies, weight_copies


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
    """No step of a short real run has a loss far above the steps before it, or far above where the run began.

    What it does
        Uses the shared smoke run (see S1) and judges its losses two ways. Against the recent steps: for
        every step after ``warmup``, compares its loss with the mean of the ``window`` previous finite
        losses, and fails at the first one above ``factor`` x. Against the run's start: fails when the
        median of the last ``window`` losses is above ``rise`` x the lowest of the first ``warmup`` (the run
        ends far above where it began).
    Why it is bad
        A loss that jumps several-fold within a few steps, or climbs far above where it started, is a run
        diverging: a learning rate too high for the model, no warmup, no gradient clipping, or a bad batch.
        It usually ends in NaN or in a model that never recovers, after hours of compute. A running mean
        alone follows a divergence: a loss climbing steadily (1.55 -> 11.9 in 20 steps) never jumps 3x over
        its last steps, and one that jumps at step 2 and stays there is compared with steps already diverged;
        the start is what tells them.
    Example
        torch.optim.AdamW(model.parameters(), lr=1.0)       # or TrainingArguments(learning_rate=1e-1)
    Use instead
        a learning rate in the usual range for the optimizer (1e-5 to 1e-3 for AdamW), a warmup, and
        gradient clipping (max_grad_norm=1.0 / clip_grad_norm_).
    Known problems
        Non-finite losses are S1's. A loss that reaches exactly 0 skips. Under gradient accumulation the
        losses are the micro-batches' (a loop's or Lightning's), judged in the order they were trained. A
        loss that is meant to rise (an annealed regulariser weighted up from 0) can fail ``rise``: raise it.
    Not applicable
        Losses that take negative values (GRPO and other policy-gradient objectives, a loss with a
        negative offset): a multiple of their running mean or start means nothing. A model that keeps a target
        network (a top-level submodule, or a module of a plain loop's training dict, with the very parameters of
        one an optimizer trains, in no optimizer itself: a DQN's, TD3's, SAC's, copied or averaged by tau): its
        temporal-difference loss chases the copy's moving targets, and grows as rewards propagate.
    """
    run = smoke_run(dlcheck)
    losses = [(s, v) for s, v in run.trajectory.losses() if v is not None and math.isfinite(v)]
    if len(losses) < dlcheck.setting("warmup") + 1:
        dlcheck.skip(
            f"the smoke run logged {len(losses)} finite losses: too few to judge spikes (raise S1.steps"
            + (", or S1.max_micro_steps under gradient accumulation)" if run.capped else ")")
        )
    negative = detectors.first_negative(losses)
    if negative:
        dlcheck.not_applicable(
            detectors.NEGATIVE_LOSS.format(where=f"step {negative[0]}", value=negative[1])
            + ": a spike as a multiple of its running mean means nothing"
        )
    if any(v == 0 for _, v in losses):
        dlcheck.skip("the loss reaches 0 in the smoke run: spikes relative to its mean cannot be judged")
    copies = _target_networks(dlcheck)
    if copies:
        copy, original = next(iter(copies.items()))
        dlcheck.not_applicable(
            f"the model keeps a target network: {copy} has the very parameters of {original}, which the optimizer "
            f"trains, and is in no optimizer itself (updated from {original}'s weights, copied or averaged, as a "
            "DQN's, TD3's or SAC's): the loss is a temporal-difference loss against that copy's moving targets, which "
            "move with each update of the copy (a jump at each copy) and grow as rewards propagate, so a multiple of "
            "its running mean or start is no divergence (S1 and S3 still judge non-finite losses and exploding "
            "gradients)"
        )
    factor, window, rise = dlcheck.setting("factor"), dlcheck.setting("window"), dlcheck.setting("rise")
    recs = {r.step: r for r in run.trajectory.steps}
    hit, spikes, rises = detectors.divergence(losses, factor, window, dlcheck.setting("warmup"), rise)
    if isinstance(hit, detectors.Spike):
        rec = recs[hit.step]
        evidence = [
            f"{run.at(hit.step)}: loss {hit.loss:.4g} = {hit.ratio:.1f} x the mean {hit.mean:.4g} of the "
            f"{len(hit.previous)} steps before it (limit {factor} x)",
            f"losses: {show_losses(run.trajectory, upto=hit.step, last=window + 1)}; {_lr_text(rec)}",
        ]
        if rec.grad_norm is not None:
            evidence.append(f"gradient norm at step {hit.step}: {rec.grad_norm:.4g}")
        dlcheck.fail(evidence, detectors.spike_cause(_lr_text(rec)), detectors.SPIKE_FIX)
    if isinstance(hit, detectors.Rise):
        rec = recs[hit.step]
        shown = ", ".join(f"{s}: {v:.4g}" for s, v in hit.last)
        evidence = [
            f"{run.at(hit.step)}: the median loss of the last {len(hit.last)} steps, {hit.level:.4g}, is "
            f"{hit.ratio:.1f} x where the run began ({hit.start:.4g} at step {hit.start_step}, the lowest of the "
            f"first {dlcheck.setting('warmup')}; limit {rise} x)",
            f"losses from the start: {show_losses(run.trajectory, upto=hit.start_step + 2, last=window)}; "
            f"the last: {shown}; {_lr_text(rec)}",
        ]
        if rec.grad_norm is not None:
            evidence.append(f"gradient norm at step {hit.step}: {rec.grad_norm:.4g}")
        dlcheck.fail(evidence, detectors.spike_cause(_lr_text(rec)), detectors.SPIKE_FIX)
    worst, up = spikes.worst, rises.worst
    start = (
        f"the median of {window} steps against the lowest of the first {dlcheck.setting('warmup')} is at most "
        f"{up[0]:.2f} x ({run.where(up[1])}; a divergence is {rise} x)"
        if up[1] is not None
        else f"not judged against the start: {len(losses)} losses, fewer than the {window} its median needs"
    )
    dlcheck.measured(
        f"{run.length}: losses {losses[0][1]:.4g} -> {losses[-1][1]:.4g}; the highest loss against "
        f"the mean of the {window} steps before it is {worst[0]:.2f} x ({run.where(worst[1])}; a spike is {factor} x)",
        start,
        losses=len(losses),
        first_loss=losses[0][1],
        last_loss=losses[-1][1],
        largest_ratio=round(worst[0], 4),
        at_step=worst[1],
        largest_rise=round(up[0], 4),
        rise_at_step=up[1],
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
    """The gradient norm of a short real run, before clipping, stays within a multiple of its starting level.

    What it does
        Uses the shared smoke run (see S1): the total gradient 2-norm at every optimizer step, before
        clipping, is compared with the median of the first ``baseline`` steps; the first step above
        ``factor`` x fails. Before clipping means: a Trainer's logged ``grad_norm`` (what its
        ``clip_grad_norm_`` returns; the smoke run logs every step, whatever the Trainer's
        ``logging_strategy`` / ``logging_steps``); a Lightning fit's gradients at ``on_before_optimizer_step``
        (Lightning clips after it); a plain loop's or an Accelerate step's gradients as the backward leaves
        them (each parameter's gradient read when it is accumulated, unscaled by a GradScaler's scale), so
        the value ``clip_grad_norm_`` / ``accelerator.clip_grad_norm_`` returns whichever way the step clips,
        and the norm at ``optimizer.step()`` for a step that does not clip. When the step clipped, the
        evidence shows the norms at the step too. The series compared is of one kind: a step whose norm
        before clipping is not known (a Trainer that clips, at a step it did not log; a loop step with a
        gradient from no backward the run saw) is left out, and the pass says how many. When too few norms
        before clipping are known for the baseline, every step's norm at ``optimizer.step()`` is compared
        instead (a clip only lowers a norm, so an explosion there is one before clipping too), and the pass
        leaves the norms before clipping not judged (partly judged). A tensor whose gradient is exactly 0 at the
        first step has no starting level: a factor initialised to 0 (LoRA's B) keeps its partner's gradient (A's)
        at 0 until it moves, and that gradient then grows from 0 as it grows, so the total norm of a healthy run
        rises many-fold. In a loop (its optimizer's step) the norm compared is the one over the tensors whose
        gradient was not 0 at the first step; the others' growth is not judged (partly judged), and an explosion
        shows in the compared tensors too, since the growing factor feeds their gradients. A Trainer's logged
        ``grad_norm`` and a Lightning fit give only the total, compared as it is.
    Why it is bad
        Exploding gradients precede a divergence (S2) or a NaN (S1): updates grow, the weights leave the
        region where the loss is smooth, and training is lost. Clipping hides it in the updates but not in
        the norm before clipping: a run clipped at 1.0 whose norm grows from 3 to 3000 shows "1 -> 1" after
        the clip. ``factor`` 10: a healthy run's norm drifts by a few x over a short run (it often falls as
        the loss falls); ten times its start is a run leaving the smooth region.
    Example
        torch.optim.SGD(model.parameters(), lr=5.0)
        torch.optim.Adam(model.parameters(), lr=1.0) with clip_grad_norm_(model.parameters(), 1.0)
    Use instead
        lower the learning rate, add warmup, clip gradients (max_grad_norm=1.0), and check that the loss
        is averaged, not summed, over tokens/examples.
    Known problems
        Needs gradient norms. A loop with no optimizer object, whose step updates the weights itself, has them
        read at each call that changed the weights, as the backward left them (before the step's clipping;
        gradients from no backward, ``torch.autograd.grad`` written into ``.grad``, as the step leaves them). A loop's norms are read at its optimizer's step, after the closure of
        ``optimizer.step(closure)`` has run (Lightning Fabric's way), before a ``zero_grad()`` that follows; a
        step at which no parameter has a gradient gives none. A Trainer whose own callback stops its logs
        (``control.should_log``) gives norms before clipping at the logged steps only; a clip hides an explosion
        from a comparison of the norms at ``optimizer.step()``. A loop step that scales the loss with a
        GradScaler kept outside the dlcheck_make_training dict (not an entry, not the Accelerator's) has its
        norms before clipping read scaled by the loss scale (the comparison with the first steps holds; the
        numbers are the scaled ones).
    Not applicable
        None: every run that takes optimizer steps has gradients.
    """
    run = smoke_run(dlcheck)
    steps = run.trajectory.steps
    base_n, factor = dlcheck.setting("baseline"), dlcheck.setting("factor")
    before = [(r.step, r.grad_norm, r) for r in steps if r.grad_norm is not None and math.isfinite(r.grad_norm)]
    unknown = [r for r in steps if r.grad_norm is None and r.step_norm is not None]
    why = run.trajectory.notes.get("step_norm_why") or "read after the step's clipping, if any"
    pre = len(before) > base_n or not unknown
    # one kind of norm: before clipping; or, when too few of those are known, every step's at optimizer.step()
    # (a clip only lowers a norm, so an explosion there is one before it too; none there proves nothing)
    norms = before if pre else [(r.step, n, r) for r in steps if (n := _at_step(r)) is not None and math.isfinite(n)]
    # tensors whose gradient was exactly 0 at the first reading (a factor initialised to 0 keeps its partner's at 0:
    # LoRA's A while B = 0) have no starting level: their growth from 0 is no explosion. The norm over the tensors
    # that had a gradient is compared with its own start; the others' are not judged
    late_of = run.trajectory.notes.get("late_tensors") if pre else None
    late: list[tuple[int, float, Any]] = []
    if late_of and norms and all(r.late_norm is not None for _, _, r in norms):
        late = [(s, r.late_norm, r) for s, _, r in norms if r.late_norm > 0]
        norms = [(s, math.sqrt(max(n * n - r.late_norm**2, 0.0)), r) for s, n, r in norms]
    if len(norms) <= base_n:
        dlcheck.skip(
            f"the smoke run recorded {len(norms)} finite gradient norms: too few to judge (raise S1.steps"
            + (", or S1.max_micro_steps under gradient accumulation)" if run.capped else ")")
        )
    kind = "before clipping" if pre else "at optimizer.step(), after any clipping of yours"
    if late:
        kind += (
            f", over the {late_of[1] - late_of[0]} of the {late_of[1]} tensors with a gradient that was not 0 at "
            "the first step"
        )
    base_steps = _steps_text([s for s, _, _ in norms[:base_n]])
    if run.by_micro_step:  # records by micro-step: say which optimizer steps they are
        made = [sum(1 for r in steps if r.step <= s and r.stepped) for s, _, _ in norms[:base_n]]
        base_steps = f"micro-{base_steps} (optimizer {_steps_text(made)})"
    left = (
        f"{len(unknown)} of {len(steps)} steps not compared: their norm before clipping is not known ({why})"
        if pre and unknown
        else None
    )
    watch = detectors.GradWatch(factor, base_n)
    clipped = [(s, r.clipped_norm) for s, _, r in norms if r.clipped_norm is not None] if pre else []
    for step, norm, rec in norms:
        if watch.reference is not None and watch.reference <= 0:
            dlcheck.skip("the first gradient norms are 0: nothing to compare against (see T3)")
        boom = watch.add(step, norm)
        if boom is not None:
            series = ", ".join(f"{s}: {n:.3g}" for s, n, _ in norms if s <= step)
            evidence = [
                f"{run.at(step)}: gradient norm {norm:.4g} = {boom.ratio:.0f} x the median "
                f"{boom.reference:.4g} of {base_steps} (limit {factor} x)",
                f"gradient norms {kind}: {series}",
            ]
            shown = [(s, n) for s, n in clipped if s <= step]
            if shown:
                evidence.append(
                    "at optimizer.step(), after your clipping: "
                    + ", ".join(f"{s}: {n:.3g}" for s, n in shown[-8:])
                    + " (the clip hides the explosion from the updates, not from the norm)"
                )
            if not pre:
                evidence.append(
                    f"the norm before clipping is known at {len(before)} of {len(steps)} steps ({why}): these are "
                    "the norms the updates used, and a clip only lowers them"
                )
            elif left:
                evidence.append(left)
            evidence.append(f"losses: {show_losses(run.trajectory, upto=step)}; {_lr_text(rec)}")
            dlcheck.fail(evidence, detectors.grad_cause(_lr_text(rec)), detectors.GRAD_FIX)
    if late:
        # their gradient grows from 0 as the zero factor grows (in proportion to it, in a healthy run): no start to
        # compare with; an explosion shows in the other tensors' gradients too, which the factor's growth feeds
        dlcheck.not_judged(
            f"the gradients of the {late_of[0]} tensor{'s' if late_of[0] != 1 else ''} whose gradient was 0 at the "
            "first step",
            f"they grow from 0 (at most {max(n for _, n, _ in late):.3g}) as a zero-initialised factor grows: no "
            "starting level to compare with",
        )
    reference = watch.reference
    highest = max(norms[base_n:], key=lambda t: t[1])
    if not pre:
        dlcheck.not_judged(
            "the gradient norms before clipping",
            f"known at {len(before)} of {len(steps)} steps ({why}); the norms at optimizer.step() were compared "
            "instead, in which a clip would hide an explosion",
        )
    dlcheck.measured(
        f"{run.length}: gradient norms {norms[0][1]:.3g} -> {norms[-1][1]:.3g} ({kind}), at most "
        f"{highest[1]:.3g} = {highest[1] / reference:.2f} x the median {reference:.3g} of {base_steps} "
        f"({run.where(highest[0])}; an explosion is {factor} x)",
        *(
            [
                f"{len(clipped)} of {len(norms)} steps clipped: "
                + (
                    "as the step left .grad after its own update"
                    if run.trajectory.notes.get("own_updates")
                    else "at optimizer.step()"
                )
                + f" the norm was at most {max(n for _, n in clipped):.3g}"
            ]
            if clipped
            else []
        ),
        *([left] if left else []),
        norms=len(norms),
        before_clipping=pre,
        reference=reference,
        largest=highest[1],
        largest_ratio=round(highest[1] / reference, 4),
        clipped_steps=len(clipped),
        not_compared=len(unknown) if pre else 0,
    )


def _at_step(rec: Any) -> float | None:
    """The gradient norm at ``optimizer.step()``: after the step's clipping, when it clipped."""
    for value in (rec.clipped_norm, rec.step_norm, rec.grad_norm):
        if value is not None:
            return value
    return None


def _steps_text(steps: list[int]) -> str:
    """``steps 1-3``, or ``steps 5, 10 and 15`` when they do not follow one another."""
    if len(steps) == 1:
        return f"step {steps[0]}"
    if steps == list(range(steps[0], steps[0] + len(steps))):
        return f"steps {steps[0]}-{steps[-1]}"
    return "steps " + ", ".join(map(str, steps[:-1])) + f" and {steps[-1]}"


def _target_networks(dlcheck: Any) -> dict[str, str]:
    """The target networks of the training's model (:func:`weight_copies`), read from the shared probe's fresh
    objects only when the model has two top-level submodules of one structure; {} when there is none."""
    from ...training import probe

    setup = find_setup(dlcheck)
    if setup is None:
        return {}
    import pytest

    try:
        fresh, _, _ = probe(dlcheck)
    except (Exception, pytest.skip.Exception):  # noqa: BLE001 - a probe that cannot be made leaves S2 as it was
        return {}
    # a plain loop's training dict: its modules side by side (SAC's qf1_target beside qf1)
    in_state = state_weight_copies(fresh.owner)
    if in_state:
        return in_state
    model = fresh.model
    shapes = [tuple((n, tuple(p.shape)) for n, p in m.named_parameters()) for _, m in model.named_children()]
    shapes = [s for s in shapes if s]
    if len(shapes) == len(set(shapes)):
        return {}
    try:
        opt, _ = fresh.make_optimizer()
    except Exception:  # noqa: BLE001 - no optimizer to read: no copy is recognised
        return {}
    if opt is None:
        return {}
    return weight_copies(model, optimizer_held([opt]))
