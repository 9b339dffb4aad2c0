"""What the user's own loss path does with a sampled batch (train, vision): whether the loss reads the batch's
labels at all, and what the model's forward returns when the training step calls it.

A check that would otherwise call the model on a batch (or an image) it prepared itself goes through the
training's own loss instead (a Lightning module's ``training_step``, a plain loop's ``dlcheck_compute_loss``, a
Trainer's ``compute_loss``): an autoencoder's ``training_step`` flattens the images before its forward and trains
on no label, which a forward on the loader's images cannot know."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import pytest

from ...guard import preserved_rng
from ...session import made_up
from ...training import (
    SEED,
    ModuleSnapshot,
    describe_batch,
    eval_loss,
    find_setup,
    fresh_probe,
    output_tensor,
    run_or_skip,
    seed_all,
    targets_of,
    training_batches,
    with_field,
)
from .forward import ABSENT, put_forward, restore_forward


@dataclass
class StepProbe:
    """One batch through the training's own loss, in eval mode (a model whose losses exist in train mode only:
    as ``loss_modes`` says), no grad."""

    loss: float
    #: the shape of the model's output at its first call inside the loss, None when the loss never calls it
    forward_out: tuple[int, ...] | None
    #: the loss with the batch's integer labels shuffled among its examples, None when it has none to shuffle (both
    #: losses from the same seeded random state)
    shuffled_loss: float | None
    targets: str
    describe: str


def _shuffled(batch: Any) -> Any:
    """The batch with its integer labels rolled by one example (the same label values, other owners; two of them
    swapped when the roll only renames the classes), or None when it holds no integer labels with two distinct
    values."""
    import torch

    y = targets_of(batch)
    if not isinstance(y, torch.Tensor) or y.is_floating_point() or y.dim() < 1 or y.shape[0] < 2:
        return None
    rolled = y.roll(1, dims=0)
    if torch.equal(rolled, y):
        return None
    if y.dim() == 1 and _relabeling(y, rolled):
        # rolled, a periodic pattern (0, 1, 2, 3, 0, 1, ...) is its own classes renamed: a loss that reads which
        # examples share a class (a triplet or contrastive loss) gives the same value, as if it read no label. Swap
        # the first example's label with the first different one instead (another grouping of the examples)
        j = int((y != y[0]).nonzero()[0])
        swapped = y.clone()
        swapped[0], swapped[j] = y[j], y[0]
        if not _relabeling(y, swapped):
            rolled = swapped
    if isinstance(batch, Mapping):
        return with_field(batch, "labels" if "labels" in batch else "label", rolled)
    return type(batch)([batch[0], rolled, *batch[2:]]) if isinstance(batch, list) else (batch[0], rolled, *batch[2:])


def _relabeling(y: Any, other: Any) -> bool:
    """Whether ``other`` is ``y`` with its classes renamed (one-to-one): the same grouping of the examples."""
    pairs = set(zip(y.tolist(), other.tolist()))
    return len(pairs) == len({a for a, _ in pairs}) == len({b for _, b in pairs})


_NONE = object()  # no forward of the instance's own


def step_probe(ctx: Any) -> StepProbe | None:
    """The first sampled batch through the user's training loss (shared per session), or None when the user
    gave no training (no Trainer, Lightning module or dlcheck_make_training)."""
    setup = find_setup(ctx)
    if setup is None:
        return None

    def make() -> StepProbe:

        fresh = fresh_probe(ctx, setup)
        batch = run_or_skip(ctx, lambda: training_batches(ctx, setup))[0]
        model = fresh.model
        seen: list[Any] = []

        def hook(mod, args, out):
            if not seen:
                t = output_tensor(out)
                seen.append(None if t is None else tuple(t.shape))

        start = ModuleSnapshot.take(model)
        handle = model.register_forward_hook(hook)
        # a training_step that calls its network directly (self.model(x, y), Lightning's demo Transformer and its
        # imagenet example) runs no forward of the module itself: the output is that of the last top-level child the
        # step calls whose output is a float tensor of two dimensions or more (the metrics it updates afterwards,
        # torchmetrics' Accuracy, return scalars)
        children: dict[str, Any] = {}

        def child_hook(name: str) -> Any:
            def record(mod, args, out):
                t = output_tensor(out)
                if t is not None and t.is_floating_point() and t.dim() >= 2:
                    children.setdefault(name, tuple(t.shape))

            return record

        child_handles = [m.register_forward_hook(child_hook(n)) for n, m in model.named_children()]
        # a training_step that calls self.forward(x) (Lightning's fine-tuning example) runs no forward hook: the
        # forward is read where it is called too, on the copy, and put back after
        own = vars(model).get("forward", _NONE)
        forward = model.forward

        def spy(*args, **kwargs):
            out = forward(*args, **kwargs)
            hook(model, args, out)
            return out

        def seeded_loss(b: Any) -> float:
            # the same random draws for either batch: a loss that samples in eval mode too (a VAE's
            # reparameterisation noise, torch.randn_like in its forward) differs between two calls by its noise
            # alone, which is not reading the labels
            with preserved_rng():
                seed_all(SEED)
                # eval conditions; a detector's losses exist in train mode only, where its pipeline computes them
                return float(run_or_skip(ctx, lambda: eval_loss(model, lambda: fresh.loss(b))))

        put_forward(model, spy)
        try:
            loss = seeded_loss(batch)
            handle.remove()
            shuffled = _shuffled(batch)
            other = None
            if shuffled is not None:
                with made_up("the batch with its labels shuffled among its examples"):
                    other = seeded_loss(shuffled)
        finally:
            handle.remove()
            for h in child_handles:
                h.remove()
            restore_forward(model, ABSENT if own is _NONE else own)
            start.restore(model)
        out = seen[0] if seen else None
        if not seen and children:
            out = list(children.values())[-1]
        return StepProbe(loss, out, other, describe_batch(targets_of(batch)), setup.describe())

    return ctx.memo(setup.sources, "shared:step-probe", make)


def labels_unused(ctx: Any) -> str | None:
    """Why the batch's labels are not trained on (the training's own loss is the same, to the bit, with them
    shuffled among the batch's examples, both computed from the same seeded random state: an autoencoder's
    reconstruction loss, a VAE's that draws its reparameterisation noise in eval mode too), or None (they are, or it
    cannot be told: no training given, no integer labels with two distinct values)."""
    try:
        probe = step_probe(ctx)
    except pytest.skip.Exception:  # the loss cannot be computed the way the check needs: it cannot be told
        return None
    if probe is None or probe.shuffled_loss is None or probe.shuffled_loss != probe.loss:
        return None
    return (
        f"the training's loss ({probe.describe}) does not read the batch's labels ({probe.targets}): it is "
        f"{probe.loss:.6g} with them and the same, to the bit, with them shuffled among the batch's examples (both "
        "from the same seeded random state)"
    )


def step_forward_shape(ctx: Any) -> tuple[int, ...] | None:
    """The shape of the model's output where the training's own loss calls its forward (a Lightning module's
    training_step), or None (no training given, the loss never calls it, or it cannot be run as needed)."""
    try:
        probe = step_probe(ctx)
    except pytest.skip.Exception:
        return None
    return None if probe is None else probe.forward_out
