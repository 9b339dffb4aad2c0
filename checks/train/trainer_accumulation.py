"""T10 on a transformers Trainer: whether the loss it backpropagates under gradient accumulation is normalised.

Since transformers 4.46 the Trainer's ``training_step`` divides the loss by ``gradient_accumulation_steps`` only when
nothing else normalises it: when the model "accepts loss kwargs" (``accepts_loss_kwargs``, else a forward that takes
``**kwargs``) or a ``compute_loss_func`` is set, it hands ``num_items_in_batch`` (the supervised items of the whole
accumulated batch) to the loss and trusts it to divide by that count; a trainer class that sets
``loss_is_scaled_for_ga = True`` (TRL's GRPO) says its ``compute_loss`` normalises over the window itself. A head
whose forward takes ``**kwargs`` but computes a per-batch mean that never reads ``num_items_in_batch`` (transformers
issue #47688: Wav2Vec2ForCTC and others), or a ``compute_loss`` override that ignores it, is then divided by neither:
the gradient of every optimizer step is the sum of the micro-batches' mean gradients, ``gradient_accumulation_steps``
times the full batch's.

Measured on the fresh probe's clone, on one training batch, without gradients and from the same RNG states: the
Trainer's own ``compute_loss`` with ``num_items_in_batch`` = N and = 2N at the accumulation k, and with N at an
accumulation of 1 (the trainer's ``current_gradient_accumulation_steps``, which ``train()`` sets for each window, and
``args.gradient_accumulation_steps``, both set for the call and put back). A loss that halves with the items and does
not move with the accumulation divides by the window's items (pass); one that does not move with the items and grows
k times at 1 divides by the accumulation itself (pass); one that does both divides twice (fail: 1/k of the full
batch's gradient); one that moves with neither is divided by nothing (fail); anything else is said and not judged."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import torch

from ...guard import preserved_rng
from ...training.runs import SEED, seed_all


def scaled_for_accumulation(clone: Any) -> tuple[bool, str]:
    """(whether the Trainer leaves the division by the accumulation to the loss, the reason in words), as its
    training_step decides it."""
    fixed = getattr(clone, "loss_is_scaled_for_ga", None)
    if fixed is not None:
        return bool(fixed), f"{type(clone).__name__}.loss_is_scaled_for_ga={fixed}"
    if getattr(clone, "compute_loss_func", None) is not None:
        return True, "a compute_loss_func is set"
    if getattr(clone, "model_accepts_loss_kwargs", False):
        model = clone.model
        inner = getattr(model, "module", model)
        if hasattr(inner, "accepts_loss_kwargs"):
            why = f"{type(inner).__name__}.accepts_loss_kwargs=True"
        else:
            why = f"{type(inner).__name__}.forward takes **kwargs (model_accepts_loss_kwargs=True)"
        return True, why
    return False, f"{type(clone.model).__name__}'s forward takes no loss kwargs (model_accepts_loss_kwargs=False)"


def items_of(inputs: Any) -> int:
    labels = inputs.get("labels") if isinstance(inputs, Mapping) else None
    if isinstance(labels, torch.Tensor) and labels.numel():
        return max(1, int((labels != -100).sum()))
    return 8


def loss_at(clone: Any, inputs: Any, items: int, accumulation: int) -> float:
    """The Trainer's compute_loss on ``inputs`` with ``num_items_in_batch=items`` while the trainer's accumulation
    (``current_gradient_accumulation_steps``, ``args.gradient_accumulation_steps``) reads ``accumulation``, in train
    mode as the step runs it, from seeded RNG states (dropout, SpecAugment-style masking drawn alike for every call),
    no gradient. The clone's attributes are put back."""
    model = clone.model
    was = model.training
    missing = object()
    current = vars(clone).get("current_gradient_accumulation_steps", missing)
    knob = clone.args.gradient_accumulation_steps
    with preserved_rng(), torch.no_grad():
        seed_all(SEED)
        model.train()
        clone.current_gradient_accumulation_steps = accumulation
        object.__setattr__(clone.args, "gradient_accumulation_steps", accumulation)
        try:
            with clone.compute_loss_context_manager():
                loss = clone.compute_loss(model, dict(inputs), num_items_in_batch=torch.tensor(items))
        finally:
            model.train(was)
            object.__setattr__(clone.args, "gradient_accumulation_steps", knob)
            if current is missing:
                del clone.current_gradient_accumulation_steps
            else:
                clone.current_gradient_accumulation_steps = current
    if isinstance(loss, tuple):
        loss = loss[0]
    return float(loss.detach().float().mean())


def _near(ratio: float, target: float, tol: float = 2e-3) -> bool:
    return abs(ratio - target) <= tol * target


def _trainers_step(cls: type) -> bool:
    """Whether ``cls.training_step`` is transformers' own: every override above Trainer in the MRO hands the call on
    to ``super().training_step(...)`` (TRL's SFTTrainer wraps it in a context), so the loss is normalised there."""
    import inspect

    from transformers import Trainer

    for klass in cls.__mro__:
        if klass is Trainer:
            return True
        step = vars(klass).get("training_step")
        if step is None:
            continue
        try:
            source = inspect.getsource(step)
        except (OSError, TypeError):
            return False
        if "super().training_step(" not in source:
            return False
    return False


def judge(dlcheck: Any, fresh: Any, batches: list[Any], accum: int) -> None:
    """Fail, pass or skip T10 for a Trainer with ``accum`` > 1 micro-batches per optimizer step."""

    clone = fresh.owner
    name = type(clone).__name__
    if not _trainers_step(type(clone)):
        dlcheck.skip(
            f"not judged: {name} overrides Trainer.training_step (gradient_accumulation_steps={accum}), so how it "
            "normalises an accumulated loss is its own"
        )
    scaled, why = scaled_for_accumulation(clone)
    if not scaled:
        dlcheck.skip(
            f"not judged: {why}, so the Trainer divides each micro-batch's loss by gradient_accumulation_steps="
            f"{accum} itself: the accumulated gradient is the micro-batches' mean, right for a loss averaged over "
            "examples of equal-size micro-batches; a token-mean loss is then weighted per micro-batch, not per token "
            "(transformers' documented approximation), which T10 does not measure on a Trainer"
        )
    inputs = clone._prepare_inputs(batches[0])
    if not isinstance(inputs, Mapping):
        dlcheck.skip(f"not judged: {name}'s batches are not mappings ({type(inputs).__name__})")
    n = items_of(inputs) * accum
    one, two = loss_at(clone, inputs, n, accum), loss_at(clone, inputs, 2 * n, accum)
    whole = loss_at(clone, inputs, n, 1)
    shown = (
        f"{name}.compute_loss on a training batch, with current_gradient_accumulation_steps={accum}: {one:.6g} with "
        f"num_items_in_batch={n}, {two:.6g} with {2 * n}; with 1 (and {n} items): {whole:.6g}"
    )
    if not (abs(one) > 0 and abs(two) > 0 and abs(whole) > 0):
        dlcheck.skip(f"not judged: the loss is 0 ({shown})")
    by_items, by_accum = one / two, whole / one
    reads_items, ignores_items = _near(by_items, 2.0), abs(by_items - 1.0) <= 1e-6
    reads_accum, ignores_accum = _near(by_accum, float(accum)), abs(by_accum - 1.0) <= 1e-6
    if reads_items and ignores_accum:
        dlcheck.measured(
            f"the loss divides by num_items_in_batch, the supervised items of the whole accumulated batch "
            f"(gradient_accumulation_steps={accum}; {why}, so the Trainer leaves that division to it), and not by the "
            f"accumulation again: {shown}",
            steps=0,
        )
        return
    if ignores_items and reads_accum:
        dlcheck.measured(
            f"the loss divides by the accumulation itself ({why}, so the Trainer leaves the division to it): {shown} "
            f"({by_accum:.4g}x at 1); it does not read num_items_in_batch. Each micro-batch's loss is divided by "
            f"{accum}: the optimizer steps on the mean of the micro-batches' gradients. Not judged: how the loss "
            "weights the items inside a micro-batch (a mean over each micro-batch's own tokens weights the "
            "micro-batches alike, not their tokens)",
            steps=0,
        )
        return
    if reads_items and reads_accum:
        dlcheck.fail(
            f"{shown}: the loss divides by num_items_in_batch and by the accumulation ({by_accum:.4g}x at 1), and the "
            f"Trainer hands it the items of the whole window ({why})",
            cause=f"num_items_in_batch already counts the items of all {accum} micro-batches: dividing by the "
            f"accumulation as well makes each optimizer step's gradient 1/{accum} of the full batch's (the logged "
            "train loss too); the effective learning rate shrinks with gradient_accumulation_steps",
            fix="divide by one of them: keep the division by num_items_in_batch and drop the one by "
            "gradient_accumulation_steps (or current_gradient_accumulation_steps)",
        )
    if ignores_items and ignores_accum:
        dlcheck.fail(
            f"{shown}: the loss does not read num_items_in_batch nor divide by the accumulation, and the Trainer does "
            f"not divide it by gradient_accumulation_steps={accum} because {why}",
            cause=f"the Trainer trusts the loss to be normalised over the accumulated batch and it is not: each "
            f"optimizer step's gradient is the sum of {accum} micro-batch mean gradients, {accum}x the full batch's "
            "(the logged train loss too); the effective learning rate grows with gradient_accumulation_steps "
            "(transformers issue #47688)",
            fix="make the loss divide its sum by num_items_in_batch (pass **kwargs on to self.loss_function / compute "
            "sum(loss) / num_items_in_batch), or tell the Trainer it does not: set model.accepts_loss_kwargs = False "
            "(or trainer.model_accepts_loss_kwargs = False; loss_is_scaled_for_ga = False on a Trainer subclass) so "
            "that the Trainer divides by the accumulation itself",
        )
    dlcheck.skip(
        f"not judged: the loss moves with num_items_in_batch or the accumulation, but not as 1/num_items_in_batch or "
        f"1/accumulation ({shown}; ratios {by_items:.4g} for twice the items, {by_accum:.4g} at an accumulation of 1: "
        f"a loss dividing by the items gives 2 and 1, one dividing by the accumulation 1 and {accum})"
    )
