from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import torch

from ...cost import reused
from ...errors import MISSING, RoleError
from ...guard import preserved_rng
from ...registry import Setting, check
from ...training import (
    SEED,
    ModuleSnapshot,
    decode_example,
    describe_batch,
    eval_loss,
    is_preference,
    loss_modes,
    losses_in_train_mode,
    modes,
    output_tensor,
    preference_loss,
    probe,
    run_or_skip,
    seed_all,
    soft_targets,
    targets_of,
)
from ...training.runs import is_grpo, online_objective, positional_inputs
from ..shared import frozen
from ..shared.class_scores import class_scores
from ..shared.forward import ABSENT, put_forward, restore_forward
from ..shared.pipeline import labels_unused, step_forward_shape


@check(
    "T1",
    domain="train",
    title="loss at initialisation far above ln(number of classes)",
    roles=(),
    optional_roles=("trainer", "lightning_module", "make_training", "model", "dataloader", "num_classes", "tokenizer"),
    settings=(
        Setting(
            "max_ratio",
            1.5,
            "initial loss / ln(classes) above which the start is wrong: a model that predicts "
            "near-uniformly starts at 1.0x, a pretrained one below; random logits of std s cost about "
            "ln(C) + s^2/2, so 1.5x (std ~2.6 logits for 300 classes) is already a broken start",
        ),
        Setting(
            "min_excess",
            1.0,
            "and the loss must exceed ln(classes) by this many nats: with few classes ln(C) is "
            "small, and logits of std ~1 (a normal init on unnormalised inputs) already cost +0.5",
        ),
    ),
)
def check_initial_loss(dlcheck):
    """The loss on a first batch, before any step, is near ln(number of classes) or below it.

    What it does
        Runs the model as your training does (the Trainer's ``compute_loss``, your LightningModule's
        ``training_step``, your ``dlcheck_compute_loss``; the model of ``dlcheck_model`` by itself
        otherwise) on the first sampled batch, without gradients, dropout off and BatchNorm on the batch's
        statistics (as the first training step sees it; running statistics put back), and compares the loss
        with ln(C), C being the last dimension of the model's output (the vocabulary of a language model,
        the classes of a classifier; ``dlcheck_num_classes`` when given). Soft targets (a float (batch,
        classes) distribution per row, as Mixup/CutMix or label smoothing make them) are judged the same way, C
        their number of classes: a near-uniform prediction costs ln(C) against any distribution. A binary head (one logit
        per example, (batch,) or (batch, 1), against 0/1 targets, integer or float: BCEWithLogitsLoss) is judged
        against ln(2), what a logit of 0 costs against either target. Both hold of a cross-entropy only, so on
        those two paths the loss is first replayed with the model's forward returning outputs put in its place (a
        near-uniform one and random ones, no model run): its values must be those of a cross-entropy of the
        outputs read as logits, probabilities or log-probabilities (label smoothing allowed, any reduction or
        scale), binary ones weighing both classes alike. Integer targets under a loss of your own (a
        ``dlcheck_compute_loss``, a ``dlcheck_loss_fn`` that is no torch CrossEntropyLoss / NLLLoss, a
        LightningModule's training_step, a Trainer's overridden compute_loss) are replayed too, on the output of the
        module the loss reads (the model, or the direct child a training_step calls: ``self.model(images)``): its
        values and gradients must be those of a cross-entropy of that output over its classes, whatever targets it
        reads and however they are aligned (shifted labels, an ignore index, class weights, label smoothing, a mean
        or a sum), or at least unchanged by a constant added to each row of scores (scores upsampled inside the
        loss). A model's own loss (a transformers model given its labels) and a torch cross-entropy object are
        cross-entropies as they are. Fails when it is above
        ``max_ratio`` x ln(C) (and ``min_excess`` nats above it), and names the likely cause: an output
        layer frozen at PyTorch's default (random) initialisation while at most 10% of the parameters train
        (the start is the random head's and stays), logits far too large (the initialisation scale),
        or a loss summed instead of averaged.
    Why it is bad
        A cross-entropy over C classes starts at ln(C) when the model predicts near-uniformly, as a
        freshly initialised one should. Far above it, the model starts confidently wrong: the first
        hundreds of steps are spent undoing the initialisation (or the loss scale is off by the batch
        size, and the learning rate with it), and fp16 runs overflow.
    Example
        LlamaConfig(..., initializer_range=1.0)          # logits of std ~10 at step 0
        nn.CrossEntropyLoss(reduction="sum")             # loss x batch size
        model.head = nn.Linear(32, 4); model.requires_grad_(False)   # the random head frozen too
    Use instead
        keep the default initializer_range (0.02) / initialise the output head small (or at zero), and
        average the loss (reduction="mean"); freeze the backbone before putting a new head in place.
    Known problems
        Applies to classification and language-model losses (integer or soft targets). A batch whose targets it
        cannot find (no ``labels``/``label`` field, not an ``(inputs, targets)`` pair) skips; so does a pair whose
        model's forward takes as many inputs as the batch holds or more (a seq2seq model's (src, tgt) batch, the
        loss building the masks and the shifted targets): not judged, saying so. A pretrained
        model starts below ln(C) and passes; the check does not tell a pretrained start from a leak.
        A Lightning module's number of classes is read from its forward's output inside its own
        training_step (its forward may take what the step makes of the batch), never from a forward on the batch;
        a training_step that calls a child (``self.model(images)``) instead is read from the last direct child it
        calls whose output is a float tensor of two dimensions or more (the metrics it updates return scalars).
        A loss of your own that cannot be replayed (it calls the model more than once, or reads more than its
        output) is judged as a cross-entropy, saying that this was not told. A cross-entropy plus a term that does
        not depend on the output (a weight penalty inside the loss) skips as not judged.
        One output per example against 0/1 targets, or soft targets, whose loss cannot be replayed (computed
        inside the model, or reading more than the model's output tensor) skip as not judged. A binary
        cross-entropy weighing the classes unequally (pos_weight) is judged against its own cost at logit 0 on
        the batch (replayed), not ln(2).
    Not applicable
        Losses that are not a cross-entropy over classes: regression (float targets other than 0/1, or an MSE on a
        0/1 score or on soft targets, as the replay of the loss shows), a metric-learning loss on embeddings (a
        triplet or contrastive loss on (images, class ids) batches: the 128-d output is no 128 classes, as the
        replay of your loss shows), a model with a single output per example
        that is not a binary head, a model whose output is more than a row of scores per example against one
        label per example (an image-to-image network, a feature map), a sequence output whose labels sit
        neither one per example nor one per position (shifted or not), nor one per input token: a sequence loss
        over alignments (CTC: (batch, label length) transcripts against (batch, frames, vocabulary) logits),
        DPO, KTO and other preference losses,
        GRPO, RLOO (a policy-gradient objective on completions generated inside the step), on-policy
        distillation (a divergence from a teacher model on those completions), and any trainer that generates
        its completions inside its step (its own objective on them, not a next-token NLL). A torchvision
        detector (its loss
        is a sum of classification, box-regression and objectness losses, and exists in train mode only). A model given as dlcheck_model
        whose forward needs fields the batches lack (a denoiser that your loss calls): it is not called on
        the batch. A training whose loss does not read the batch's labels (an autoencoder's reconstruction
        loss on (images, labels) batches: its loss is the same, to the bit, with the labels shuffled among the
        batch's examples, both computed from the same random state: a VAE that draws its noise in eval mode too).
    """
    trainer = dlcheck.role("trainer")
    if trainer is not MISSING and (is_preference(trainer) or is_grpo(trainer)):
        kind = preference_loss(trainer)
        dlcheck.not_applicable(
            f"{type(trainer).__name__}'s loss is "
            + (
                "a sigmoid of policy/reference log-ratio margins"
                if kind == "dpo"
                else "1 - σ(β x (policy/reference log-ratio - KL estimate)) on unpaired completions (KTO: 0.5 at the "
                "start, whatever the vocabulary)"
                if kind == "kto"
                else online_objective(trainer)
            )
            + ", not a cross-entropy over classes: ln(classes) does not apply"
        )
    fresh, batches, setup = probe(dlcheck)
    batch = batches[0]
    targets = targets_of(batch, fresh.model)
    detector = losses_in_train_mode(fresh.model)
    if detector:
        dlcheck.not_applicable(
            f"{detector}: its loss is a sum of classification, box-regression and objectness losses, not one "
            "cross-entropy over classes: ln(classes) does not apply"
        )
    soft = soft_targets(targets)
    zero_one = _zero_one(targets)
    if isinstance(targets, torch.Tensor) and targets.is_floating_point() and not soft and not zero_one:
        dlcheck.not_applicable(
            f"the targets are floats ({describe_batch(targets)}): a regression loss, not a cross-entropy over classes"
        )
    if not isinstance(targets, torch.Tensor):
        taken = positional_inputs(fresh.model)
        if isinstance(batch, (list, tuple)) and len(batch) >= 2 and taken >= len(batch):
            # (src, tgt) of a seq2seq loop whose loss builds the forward's other inputs (masks) and its targets
            dlcheck.skip(
                f"not judged: the batch is a {'pair' if len(batch) == 2 else f'{len(batch)}-tuple'} "
                f"{describe_batch(batch)} and {type(fresh.model).__name__}.forward takes {taken} inputs: none of its "
                "elements is left over as the targets, so your loss builds the model's inputs and its targets from them "
                "(a target sequence shifted by one, say), which T1 does not reproduce"
            )
        dlcheck.skip(
            f"cannot find integer targets in the batch ({describe_batch(batch)}): no labels/label field, not an "
            "(inputs, targets) pair"
        )
    unused = labels_unused(dlcheck)
    if unused:
        dlcheck.not_applicable(f"{unused}: not a cross-entropy over classes, ln(classes) does not apply")
    model = fresh.model
    start = ModuleSnapshot.take(model)
    try:
        with loss_modes(model), torch.no_grad():
            # BatchNorm normalises with the batch's own statistics, as the first training step does: a fresh
            # model's running statistics (mean 0, var 1) are not its activations' (in eval mode a fresh ResNet-50
            # gives logits of std ~14 and a loss 13x ln(C)); dropout stays off
            for m in model.modules():
                if isinstance(m, torch.nn.modules.batchnorm._BatchNorm):
                    m.train()
            try:
                loss = run_or_skip(dlcheck, lambda: fresh.loss(batch))
            except RoleError:
                # raised in eval mode: a loss that exists in train mode only is not judged (eval_loss says so)
                run_or_skip(dlcheck, lambda: eval_loss(model, lambda: fresh.loss(batch)))
                raise
            # a plain forward for the logits: a trainer's loss path may never materialise them (TRL's fused head);
            # a Lightning module's forward takes what its training_step makes of the batch: read where it is called
            shape, logits = None, None
            if setup is not None and setup.kind == "lightning":
                shape = step_forward_shape(dlcheck)
            else:
                try:
                    logits = output_tensor(fresh.forward(batch))
                    shape = None if logits is None else tuple(logits.shape)
                except Exception:  # noqa: BLE001 - the model takes the batch only through the user's loss
                    shape, logits = None, None
            # one output per example against 0/1 targets, or soft targets: ln 2 / ln C is what a near-uniform
            # prediction costs under a cross-entropy only; what the loss is, is read by replaying it on outputs
            # put in place of the model's (an MSE on a 0/1 score is no binary head)
            candidate = (
                not isinstance(dlcheck.role("num_classes"), int)
                and not soft
                and zero_one
                and _one_logit(shape, targets)
            )
            replay = _replay(fresh, batch, targets, soft) if candidate or soft else None
    finally:
        start.restore(model)  # the running statistics the batch updated, and every module's mode
    classes = dlcheck.role("num_classes")
    if soft and not isinstance(classes, int):
        # soft targets (Mixup/CutMix, label smoothing): rows of a distribution over the classes; a near-uniform
        # prediction costs -sum(q log 1/C) = ln(C) against any of them, as against a class index
        classes = int(targets.shape[-1])
    if replay is not None and replay.kind != "ce":
        what = (
            "a binary cross-entropy of the model's output"
            if candidate
            else "a cross-entropy of the model's output against the soft targets"
        )
        if replay.kind == "unread":
            dlcheck.skip(
                f"not judged: {'one output per example against 0/1 targets' if candidate else 'soft targets'} "
                f"({describe_batch(targets)}), and whether the loss is {what} cannot be told: the loss does not read "
                "the model's output tensor as returned (computed inside the model, or from more than its forward), so "
                "it cannot be replayed on a near-uniform output; a loss over the model's output "
                "(dlcheck_loss_fn(outputs, targets), or a training_step that calls self(x)) is judged"
            )
        if replay.kind == "weighted" and not (math.isfinite(replay.at_uniform) and replay.at_uniform > 0):
            dlcheck.skip(
                f"not judged: the loss is a binary cross-entropy that weighs the two classes unequally "
                f"(pos_weight or class weights), and its cost at logit 0 on this batch ({replay.at_uniform:.4g}) "
                "gives no reference"
            )
    if replay is not None and replay.kind not in ("ce", "weighted"):
        what = (
            "a binary cross-entropy of the model's output"
            if candidate
            else "a cross-entropy of the model's output against the soft targets"
        )
        dlcheck.not_applicable(
            f"{'one output per example against 0/1 targets' if candidate else 'soft targets'} "
            f"({describe_batch(targets)}), but the loss is not {what}: replayed on outputs put in place of the "
            f"model's it costs {replay.at_uniform:.4g} at a near-uniform output and does not follow a "
            f"cross-entropy's values on other outputs (a regression loss, an MSE or a per-class binary loss): "
            f"ln({'2' if candidate else int(targets.shape[-1])}) does not apply"
        )
    binary = candidate
    if binary:
        # one logit per example against 0/1 targets (BCEWithLogitsLoss): a binary head, whose near-uniform
        # prediction (logit 0, p = 0.5) costs ln 2 against either target
        classes = 2
    elif isinstance(targets, torch.Tensor) and targets.is_floating_point() and not soft:
        dlcheck.not_applicable(
            f"the targets are floats ({describe_batch(targets)}) and the model's output "
            f"({'unknown' if shape is None else tuple(shape)}) is not one logit per target: not a cross-entropy "
            "over classes"
        )
    if not isinstance(classes, int) and shape is not None and len(shape) >= 3 and targets.dim() == 1:
        # one label per example, but an output with more than a row of scores per example: an image-to-image network
        # (fast_neural_style's TransformerNet) or a feature map, whose last dimension is a width, not classes
        dlcheck.not_applicable(
            f"the model's output {tuple(shape)} is no row of class scores per example, and the targets hold one label "
            f"per example ({describe_batch(targets)}): not a classification head (an image-to-image network, a "
            "feature map), ln(classes) does not apply"
        )
    unaligned = _unaligned(shape, targets, batch) if not binary and not soft else None
    if unaligned:
        dlcheck.not_applicable(unaligned)
    scores = None
    if not binary and not soft:
        # integer targets: whether the user's own loss reads the output as class scores under a cross-entropy (a
        # 128-d embedding under a triplet loss is no 128-class classifier) is read by replaying it on outputs put
        # in place of the model's; a model's own loss and a torch CrossEntropyLoss / NLLLoss are cross-entropies
        scores = class_scores(dlcheck)
        if scores is not None and scores.kind == "other":
            dlcheck.not_applicable(f"not a cross-entropy over classes: ln(C) does not apply: {scores.showed()}")
        if scores is not None and scores.kind == "offset":
            dlcheck.skip(
                f"not judged: {scores.showed()}: the loss at the start is not a cross-entropy's alone, and ln(C) is "
                "no reference for it"
            )
    if not isinstance(classes, int):
        if shape is None or len(shape) < 2:
            dlcheck.skip(
                "missing role: define fixture dlcheck_num_classes in conftest.py: the model's output does not tell "
                "the number of classes"
            )
        classes = int(shape[-1])
        dense = tuple(targets.shape) == (int(shape[0]), *map(int, shape[2:])) or (
            # an image's class map against scores at a lower resolution, upsampled by the loss (Segformer's 1/4)
            len(shape) == 4 and targets.dim() == 3 and int(targets.shape[0]) == int(shape[0])
        )
        if len(shape) >= 3 and dense and tuple(targets.shape) != tuple(map(int, shape[:-1])):
            # a dense prediction, channels first: (batch, classes, H, W) scores against (batch, H, W) class maps (a
            # segmentation net); the last dimension is a width (the semantic_segmentation example's 48 was read as
            # the classes)
            classes = int(shape[1])
    if classes < 2:
        dlcheck.not_applicable(f"the model outputs {classes} value per example: not a classification over classes")
    value = float(loss)
    if not math.isfinite(value):
        dlcheck.skip(f"the initial loss is {value}: T5 owns non-finite values")
    weighted = replay is not None and replay.kind == "weighted"
    # a binary cross-entropy weighing the classes (pos_weight): its near-uniform cost is its own value at logit 0
    # on this batch (replayed), not ln 2
    ln_c = replay.at_uniform if weighted else math.log(classes)
    ref_name = "its cost at logit 0 on this batch (pos_weight weighs the classes)" if weighted else f"ln({classes})"
    ratio = value / ln_c
    soft_note = (
        "; a binary head: one logit per "
        + ("label of each example" if len(shape) >= 2 and shape[-1] != 1 else "example")
        + f" (output {tuple(shape)}) against 0/1 targets ({describe_batch(targets)}), "
        + (
            f"a logit of 0 (p = 0.5) costs {ln_c:.4g} on this batch under the loss's class weights"
            if weighted
            else "a logit of 0 (p = 0.5) costs ln(2) against either"
        )
        + f"; the loss is a binary cross-entropy ({replay.measured()})"
        if binary
        else f"; the targets are soft ({describe_batch(targets)}, rows summing to 1: Mixup/CutMix or label smoothing), "
        f"and a near-uniform prediction costs ln({classes}) against them too; the loss is a cross-entropy "
        f"({replay.measured()})"
        if soft
        else f"; {scores.showed()}"
        if scores is not None and scores.kind in ("ce", "softmax")
        else f"; whether the loss is a cross-entropy of the output was not told: {scores.showed()}"
        if scores is not None
        else ""
    )
    if ratio <= dlcheck.setting("max_ratio") or value - ln_c <= dlcheck.setting("min_excess"):
        dlcheck.measured(
            f"initial loss {value:.4g} on batch 0 = {ratio:.2f} x {ref_name} = {ln_c:.3f} (fails above "
            f"{dlcheck.setting('max_ratio')} x and {dlcheck.setting('min_excess')} nats over {'it' if weighted else ref_name}){soft_note}",
            initial_loss=round(value, 6),
            classes=classes,
            ratio=round(ratio, 4),
        )
        return

    evidence = [
        f"initial loss {value:.4g} on batch 0 = {ratio:.2f} x {ref_name} = {ln_c:.3f}; a model that predicts "
        f"near-uniformly starts at 1.0 x (limit {dlcheck.setting('max_ratio')} x){soft_note}"
    ]
    example = decode_example(dlcheck, batch)
    if example:
        evidence.append(f"batch 0, example 0: {example}")
    supervised = int(targets.shape[0]) if soft else int((targets != -100).sum())
    std = float(logits.float().std()) if logits is not None and logits.numel() > 1 else None
    if std is not None:
        evidence.append(
            f"output logits: std {std:.3g}, max |logit| {float(logits.float().abs().max()):.3g} "
            f"over {tuple(logits.shape)}"
        )
    info = frozen.trainable(model)
    if logits is not None and logits.dim() >= 2:
        with modes(model, train=False), torch.no_grad():
            info = frozen.trainable(model, lambda: fresh.forward(batch), int(logits.shape[-1]))
        start.restore(model)
    if info.frozen_random_head():
        # the start is the random head's, and it stays: a frozen output layer is not trained away from it
        evidence += info.evidence()
        cause = (
            f"the logits at step 0 come from the output layer {info.head_name}, frozen at its random initialisation "
            + (f"(logit std {std:.3g}) " if std is not None else "")
            + f"and never trained ({info.HOW}): "
            + info.consequence()
        )
        fix = info.fix()
    elif binary and logits is not None and abs(float(logits.float().mean())) > 2.0:
        mean = float(logits.float().mean())
        cause = (
            f"the binary head's logit starts far from 0 (mean {mean:.3g} over {tuple(logits.shape)}): the model "
            f"predicts p = {1 / (1 + math.exp(-mean)):.3g} for every example before any step, confidently wrong on "
            "the examples of the other class: the output layer's bias (or its scale) is too large"
        )
        fix = (
            "initialise the output layer's bias at 0 (or at log(p / (1 - p)) for the positive class's share p "
            "of the data) and its weights small"
        )
    elif std is not None and std > 2.0:
        cause = (
            f"the logits are far too large at initialisation (std {std:.3g}; near-uniform predictions need std "
            "well below 1): the initialisation scale of the weights (or of the output head) is too big"
        )
        fix = (
            "initialise as the architecture expects: keep config.initializer_range at its default (0.02 for "
            "transformers models), initialise the output head small or at zero, do not scale embeddings up; "
            "normalise the inputs"
        )
    elif supervised > 1 and abs(ratio - supervised) / supervised < 0.35:
        cause = (
            f"the loss is about {ratio:.0f} x ln(C) with {supervised} supervised targets in the batch: it is "
            "summed over the batch instead of averaged"
        )
        fix = "average the loss: nn.CrossEntropyLoss(reduction='mean') (the default), or divide the summed loss by the number of targets"
    else:
        cause = "the loss at step 0 is far above a near-uniform prediction's: the model starts confidently wrong or the loss is scaled"
        fix = (
            "check the loss scaling (reduction='mean', no extra multiplier), the initialisation scale of the output "
            "layer, and that the targets are the ones the outputs predict"
        )
    dlcheck.fail(evidence, cause, fix)


def _unaligned(shape, targets, batch) -> str | None:
    """Why integer (batch, L) labels are no per-position classes of a (batch, T, C) output: L is neither T nor
    T ± 1 (labels shifted inside the loss), and no other integer field of the batch has their shape (labels of
    the input tokens, with positions the model prepends: virtual or query tokens). None when they align."""
    if shape is None or len(shape) != 3 or not isinstance(targets, torch.Tensor) or targets.dim() != 2:
        return None
    n, steps = int(shape[0]), int(shape[1])
    length = int(targets.shape[1])
    if int(targets.shape[0]) != n or abs(length - steps) <= 1:
        return None
    fields = batch.values() if isinstance(batch, dict) else batch if isinstance(batch, (list, tuple)) else ()
    for value in fields:
        if (
            isinstance(value, torch.Tensor)
            and value is not targets
            and not value.is_floating_point()
            and tuple(value.shape) == tuple(targets.shape)
        ):
            return None
    return (
        f"the labels ({describe_batch(targets)}) do not sit one per position of the output {tuple(shape)}: "
        f"{length} labels per example against {steps} output positions, nor one per example, nor one per input "
        "token: a sequence loss over alignments (CTC), not a cross-entropy over classes per position, so "
        "ln(C) does not apply"
    )


def _zero_one(targets) -> bool:
    """Every target is 0 or 1 (a binary label, integer or float)."""
    if not isinstance(targets, torch.Tensor) or targets.numel() == 0 or targets.is_complex():
        return False
    return bool(((targets == 0) | (targets == 1)).all())


def _one_logit(shape, targets) -> bool:
    """The model's output is one value per target: (batch,) or (..., 1) with as many values as targets, or the
    targets' own shape (a multi-label head: one logit per label of each example, against multi-hot targets)."""
    if shape is None or len(shape) == 0 or not isinstance(targets, torch.Tensor):
        return False
    if len(shape) >= 2 and tuple(shape) == tuple(targets.shape):
        return True
    if len(shape) >= 2 and shape[-1] != 1:
        return False
    return math.prod(shape) == targets.numel() and shape[0] == targets.shape[0]


_NONE = object()  # the model has no forward of its own instance


@dataclass
class _Replayed:
    """What the user's loss is on outputs put in place of the model's (see :func:`_replay`)."""

    kind: str  # "ce": a cross-entropy as T1 judges it; "weighted": a binary one weighing the classes unequally;
    # "other": not a cross-entropy over the output; "unread": the loss does not read the output as returned
    at_uniform: float = math.nan  # the loss at the near-uniform output (logit 0, p = 0.5 or 1/C)
    scale: float = 1.0  # the loss over the cross-entropy's mean (the number of targets for a summed one)
    output: str = "logits"  # how the loss reads the model's output: logits, probabilities or log-probabilities
    probes: int = 0

    def measured(self) -> str:
        scale = "" if math.isclose(self.scale, 1.0, rel_tol=1e-3) else f"{self.scale:.4g} x "
        return (
            f"replayed on {self.probes} outputs put in place of the model's, read as {self.output}, it is "
            f"{scale}a cross-entropy's value; {self.at_uniform:.4g} at the near-uniform output"
        )


def _replay(fresh, batch, targets: torch.Tensor, soft: bool) -> _Replayed:
    """Whether the training's loss on ``batch`` is a cross-entropy of the model's output: the loss is replayed
    with the model's forward returning outputs of its shape put in its place (the near-uniform one and random
    ones, no model run) and its values are fitted, as a non-negative combination, to cross-entropies of those
    outputs read as logits (probabilities, log-probabilities): for one output per example against 0/1 targets,
    the binary cross-entropies of either class against the example's target and against the other one (label
    smoothing mixes them), which must weigh both classes alike; for soft targets, the softmax cross-entropy
    against the rows and against the uniform distribution (label smoothing). Only the output is replaced, so
    the loss's own reduction and scale stay (a summed loss is ``scale`` = the number of targets)."""
    model = fresh.model
    own = vars(model).get("forward", _NONE)
    forward = model.forward
    captured: list[Any] = []

    def spy(*args, **kwargs):
        out = forward(*args, **kwargs)
        captured.append(out)
        return out

    current: list[torch.Tensor] = []

    def replay(*_args, **_kwargs):
        reused()  # no model ran: this call returns the output put in place of the model's
        captured.append(current[0])
        return current[0]

    def loss_at(out: torch.Tensor) -> float:
        current[:] = [out]
        with preserved_rng():
            seed_all(SEED)
            return float(fresh.loss(batch))

    put_forward(model, spy)
    try:
        with preserved_rng():
            seed_all(SEED)
            first = float(fresh.loss(batch))
        out0 = captured[0] if len(captured) == 1 else None
        if not isinstance(out0, torch.Tensor) or not out0.is_floating_point():
            return _Replayed("unread")
        out0 = out0.detach()
        if (soft and tuple(out0.shape) != tuple(targets.shape)) or (not soft and out0.numel() != targets.numel()):
            return _Replayed("unread")
        put_forward(model, replay)
        if not math.isclose(loss_at(out0.clone()), first, rel_tol=1e-4, abs_tol=1e-6):
            return _Replayed("unread")  # the loss reads more than the output the model returned
        g = torch.Generator().manual_seed(SEED)
        probes = [torch.zeros(out0.shape)] + [torch.randn(out0.shape, generator=g) * 2 for _ in range(5)]
        basis = [_basis(z, targets, soft) for z in probes]
        half = out0.dtype in (torch.float16, torch.bfloat16)
        reads = (
            ("logits", lambda z: z),
            ("probabilities", torch.softmax if soft else (lambda z, dim: torch.sigmoid(z))),
            ("log-probabilities", torch.log_softmax if soft else (lambda z, dim: torch.nn.functional.logsigmoid(z))),
        )
        for name, read in reads:
            values = []
            for z in probes:
                out = (z if name == "logits" else read(z, dim=-1)).to(out0.dtype).to(out0.device)
                try:
                    values.append(loss_at(out))
                except Exception:  # noqa: BLE001 - a loss of probabilities may reject logits (BCELoss outside [0, 1]): not this reading
                    values = []
                    break
            if not values or not all(math.isfinite(v) for v in values):
                continue
            fit = _fit(basis, values, 1e-2 if half else 1e-4)
            if fit is None:
                continue
            kind, scale = fit
            return _Replayed(kind, values[0], scale, name, len(probes))
        return _Replayed("other", at_uniform=_first_value(loss_at, out0, soft))
    finally:
        restore_forward(model, ABSENT if own is _NONE else own)


def _first_value(loss_at, out0: torch.Tensor, soft: bool) -> float:
    """The loss at the near-uniform output read as logits (zeros), for the report."""
    try:
        return loss_at(torch.zeros_like(out0))
    except Exception:  # noqa: BLE001 - a loss that takes no logits: the value is only reported
        return math.nan


def _basis(z: torch.Tensor, targets: torch.Tensor, soft: bool) -> list[float]:
    """Cross-entropies of the outputs ``z`` read as logits, the mean over the batch: for soft targets, against
    the rows and against the uniform distribution; for one logit per example against 0/1 targets, each class's
    examples against their own class and against the other one (positives' -log p, negatives' -log(1 - p),
    positives' -log(1 - p), negatives' -log p)."""
    z = z.double()
    if soft:
        logp = torch.log_softmax(z, dim=-1)
        q = targets.double().to("cpu")
        return [float(-(q * logp).sum(-1).mean()), float(-logp.mean(-1).mean())]
    z = z.flatten()
    y = targets.double().flatten().to("cpu")
    sp_pos, sp_neg = torch.nn.functional.softplus(-z), torch.nn.functional.softplus(z)
    return [
        float((y * sp_pos).mean()),
        float(((1 - y) * sp_neg).mean()),
        float((y * sp_neg).mean()),
        float(((1 - y) * sp_pos).mean()),
    ]


def _fit(basis: list[list[float]], values: list[float], tol: float) -> tuple[str, float] | None:
    """(kind, scale) when ``values`` are a non-negative combination of ``basis`` within ``tol`` (relative), else
    None. Columns that are zero on every probe (a class absent from the batch) are left out."""
    a = torch.tensor(basis, dtype=torch.float64)
    b = torch.tensor(values, dtype=torch.float64)
    used = [j for j in range(a.shape[1]) if float(a[:, j].abs().max()) > 0]
    coef = torch.zeros(a.shape[1], dtype=torch.float64)
    coef[used] = torch.linalg.lstsq(a[:, used], b.unsqueeze(1)).solution.squeeze(1)
    size = float(b.abs().max())
    if float((a @ coef - b).abs().max()) > tol * max(size, 1e-6) or float(coef.min()) < -tol * max(
        1.0, float(coef.abs().max())
    ):
        return None
    if len(coef) == 2:  # soft: against the rows, and the uniform part of label smoothing
        return "ce", float(coef.sum())
    positives, negatives = float(coef[0] + coef[2]), float(coef[1] + coef[3])
    if not (0 in used or 2 in used):
        return "ce", negatives
    if not (1 in used or 3 in used):
        return "ce", positives
    if not math.isclose(positives, negatives, rel_tol=10 * tol):
        return "weighted", positives
    return "ce", positives
