"""T10 on a transformers Trainer: whether the loss it backpropagates under gradient accumulation is normalised.

Since transformers 4.46 the Trainer's ``training_step`` divides the loss by ``gradient_accumulation_steps`` only when
nothing else normalises it: when the model "accepts loss kwargs" (``accepts_loss_kwargs``, else a forward that takes
``**kwargs``) or a ``compute_loss_func`` is set, it hands ``num_items_in_batch`` (the supervised items of the whole
accumulated batch) to the loss and trusts it to divide by that count. A head whose forward takes ``**kwargs`` but
computes a per-batch mean that never reads ``num_items_in_batch`` (transformers issue #47688: Wav2Vec2ForCTC and
others), or a ``compute_loss`` override that ignores it, is then divided by neither: the gradient of every optimizer
step is the sum of the micro-batches' mean gradients, ``gradient_accumulation_steps`` times the full batch's.

Measured on the fresh probe's clone, on one training batch, without gradients and from the same RNG states: the
Trainer's own ``compute_loss`` with ``num_items_in_batch`` = N and = 2N. A loss that halves divides by it (pass); a
loss that does not move ignores it (fail); anything else is said and not judged."""

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


def loss_at(clone: Any, inputs: Any, items: int) -> float:
    """The Trainer's compute_loss on ``inputs`` with ``num_items_in_batch=items``, in train mode as the step runs it,
    from seeded RNG states (dropout, SpecAugment-style masking drawn alike for every call), no gradient."""
    model = clone.model
    was = model.training
    with preserved_rng(), torch.no_grad():
        seed_all(SEED)
        model.train()
        try:
            with clone.compute_loss_context_manager():
                loss = clone.compute_loss(model, dict(inputs), num_items_in_batch=torch.tensor(items))
        finally:
            model.train(was)
    if isinstance(loss, tuple):
        loss = loss[0]
    return float(loss.detach().float().mean())


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
    one, two = loss_at(clone, inputs, n), loss_at(clone, inputs, 2 * n)
    shown = f"{name}.compute_loss on a training batch: {one:.6g} with num_items_in_batch={n}, {two:.6g} with {2 * n}"
    if not (abs(one) > 0 and abs(two) > 0):
        dlcheck.skip(f"not judged: the loss is 0 ({shown})")
    ratio = one / two
    if abs(ratio - 2.0) <= 2e-3:
        dlcheck.measured(
            f"the loss divides by num_items_in_batch, the supervised items of the whole accumulated batch "
            f"(gradient_accumulation_steps={accum}; {why}, so the Trainer leaves that division to it): {shown}",
            steps=0,
        )
        return
    if abs(ratio - 1.0) <= 1e-6:
        dlcheck.fail(
            f"{shown}: the loss does not read num_items_in_batch, and the Trainer does not divide it by "
            f"gradient_accumulation_steps={accum} because {why}",
            cause=f"the Trainer trusts the loss to divide by the accumulated batch's item count and it does not: each "
            f"optimizer step's gradient is the sum of {accum} micro-batch mean gradients, {accum}x the full batch's "
            "(the logged train loss too); the effective learning rate grows with gradient_accumulation_steps "
            "(transformers issue #47688)",
            fix="make the loss divide its sum by num_items_in_batch (pass **kwargs on to self.loss_function / compute "
            "sum(loss) / num_items_in_batch), or tell the Trainer it does not: set model.accepts_loss_kwargs = False "
            "(or trainer.model_accepts_loss_kwargs = False) so that the Trainer divides by the accumulation itself",
        )
    dlcheck.skip(
        f"not judged: the loss moves with num_items_in_batch, but not as 1/num_items_in_batch ({shown}; ratio "
        f"{ratio:.4g}, a loss dividing by it gives 2)"
    )
