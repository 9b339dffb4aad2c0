from __future__ import annotations

import math
from collections import Counter
from typing import Any

from ...errors import MISSING
from ...registry import Setting, check
from ..shared.class_scores import not_class_scores
from . import measure as V


def _binom_sf(k: int, n: int, p: float) -> float:
    """P(X >= k) for X ~ Binomial(n, p), summed exactly in log space."""
    if k <= 0:
        return 1.0
    if p <= 0.0:
        return 0.0
    if p >= 1.0:
        return 1.0
    logs = [
        math.lgamma(n + 1) - math.lgamma(i + 1) - math.lgamma(n - i + 1) + i * math.log(p) + (n - i) * math.log1p(-p)
        for i in range(k, n + 1)
    ]
    top = max(logs)
    return min(1.0, math.exp(top) * sum(math.exp(v - top) for v in logs))


def _sampled_ratio_p(most: int, least: int, limit: float, classes: int) -> float:
    """How likely a sample shows the most frequent class ``most`` times and the least frequent ``least`` times
    when no pair of classes is further apart than ``limit``:1. Given the two counts' sum n, the most frequent's
    count is Binomial(n, limit / (1 + limit)) at the limit (less when the true ratio is below it); the
    smallest-versus-largest pair is the most extreme of ``classes`` * (classes - 1) / 2 pairs, so the tail is
    multiplied by that many (Bonferroni)."""
    n = most + least
    pairs = classes * (classes - 1) / 2
    return min(1.0, pairs * _binom_sf(most, n, limit / (1 + limit)))


def _balancing(loss_fn: Any, loader: Any) -> str | None:
    """How the pipeline compensates for imbalance, if it visibly does."""
    if loss_fn is not MISSING:
        name = type(loss_fn).__name__
        for attr in ("weight", "pos_weight", "alpha", "class_weights"):
            if getattr(loss_fn, attr, None) is not None:
                return f"{name}.{attr} is set"
        if "focal" in name.lower() or "balanced" in name.lower() or "ldam" in name.lower():
            return f"{name} is an imbalance-aware loss"
    sampler = getattr(loader, "sampler", None) if loader is not MISSING else None
    if type(sampler).__name__ in ("WeightedRandomSampler",) or "balanc" in type(sampler).__name__.lower():
        return f"the dataloader samples with {type(sampler).__name__}"
    return None


def _own_loss(dlcheck: Any) -> tuple[str | None, str | None]:
    """Without dlcheck_loss_fn, a transformers Trainer trains with the model's own loss: (what that loss is,
    when it is a plain unweighted cross-entropy; why the loss cannot be seen, when the trainer replaces it)."""
    from ...roles import is_hf_trainer

    trainer = dlcheck.role("trainer")
    if trainer is MISSING or not is_hf_trainer(trainer):
        return None, None
    from transformers import Trainer

    cls = type(trainer)
    if getattr(trainer, "compute_loss_func", None) is not None:
        return None, f"dlcheck_trainer was given compute_loss_func={V.short(trainer.compute_loss_func, 60)}"
    for name in ("compute_loss", "_get_train_sampler", "get_train_dataloader"):
        if getattr(cls, name, None) is not getattr(Trainer, name, None):
            return None, f"dlcheck_trainer's class {cls.__name__} overrides {name}"
    model = trainer.model
    cfg = getattr(model, "config", None)
    problem = getattr(cfg, "problem_type", None)
    if (
        cfg is None
        or not type(model).__name__.endswith("ForImageClassification")
        or not isinstance(getattr(cfg, "num_labels", None), int)
        or cfg.num_labels < 2
        or problem not in (None, "single_label_classification")
    ):
        return None, None
    smoothing = float(getattr(trainer.args, "label_smoothing_factor", 0.0) or 0.0)
    return (
        f"the loss is the model's own: {type(model).__name__} computes a cross-entropy on its logits from the "
        f"labels (config.problem_type={problem!r}), unweighted: no class weights"
        + (f" (label_smoothing_factor={smoothing:g} smooths it, unweighted too)" if smoothing else "")
        + f"; {cls.__name__} has no compute_loss override or compute_loss_func",
        None,
    )


@check(
    "V6",
    domain="vision",
    title="severe class imbalance trained with an unweighted loss",
    optional_roles=("dataset", "dataloader", "loss_fn", "num_classes", "model", "trainer"),
    settings=(
        Setting(
            "max_ratio",
            10.0,
            "largest allowed ratio between the most and least frequent class, trained with an unweighted loss; "
            "beyond 10:1 an unweighted loss is known to collapse onto the majority class (the minority's share of "
            "the gradient is under 10%, and a model that never predicts it loses little). With class weights or a "
            "balanced sampler any ratio passes: they give each class an equal share whatever the ratio",
        ),
        Setting(
            "label_samples",
            256,
            "labels read (spread over the dataset) when it exposes none cheaply "
            "(ImageFolder/CIFAR .targets, a datasets label column)",
        ),
        Setting(
            "false_alarm",
            1e-6,
            "when the labels are a sample (no cheap targets), the probability of failing a dataset whose true "
            "ratio is within max_ratio: an exact binomial test of the two extreme classes' counts, Bonferroni over "
            "the class pairs. A few hundred labels over 40 balanced classes show 13:1 by chance",
        ),
        Setting(
            "min_labels",
            40,
            "fewer labels than this cannot show a ratio reliably, even when they are the whole dataset "
            "(a 32-example fixture is a slice of the real data): skip, saying how many were read",
        ),
    ),
)
def check_class_imbalance(dlcheck):
    """A heavily imbalanced classification dataset is trained with class weights or a balanced sampler.

    What it does
        Builds the label histogram of the training data — from labels the dataset exposes (``targets``,
        through Subsets, or a datasets label column), else from up to 256 examples read at spread
        positions (from the dataloader's batches when its dataset gives its examples in another shape than its
        collate_fn makes of them: torchvision's video reference drops the audio of (video, audio, label,
        video_idx)); image and video (C, T, H, W) classification alike — and fails when the most frequent
        class outnumbers the least frequent by more than 10:1 (when the labels are a sample, by more than
        chance shows: an exact binomial test of the two extreme counts at 10:1, Bonferroni over the class pairs, false alarm ≤ 1e-6, so a balanced
        40-class dataset read through a sample passes; a sample that cannot tell is read again, four
        times larger, and skips as not conclusive if it still cannot) while dlcheck_loss_fn has no class weights (weight, pos_weight, alpha, focal loss) and the
        dataloader does not sample with a WeightedRandomSampler. A transformers Trainer user without a loss
        object is judged with the model's own loss (an image classifier's plain, unweighted cross-entropy).
    Why it is bad
        With 95 % of one class a model reaches 95 % accuracy by never predicting the other: the loss is
        dominated by the majority and the minority class, usually the one that matters, is not learned.
    Example
        95/5 split, loss_fn = nn.CrossEntropyLoss()
    Use instead
        nn.CrossEntropyLoss(weight=torch.tensor(inverse_frequencies)) (weights printed in the failure), or
        DataLoader(..., sampler=WeightedRandomSampler(1 / counts[labels], num_samples=len(labels))),
        or a focal loss; report per-class recall / balanced accuracy.
    Known problems
        Classification only: pixel imbalance in segmentation and box imbalance in detection are normal
        and left alone. Without dlcheck_loss_fn the check skips (it cannot see the weighting), except
        for a transformers Trainer that trains a ``…ForImageClassification`` model with its own loss (no
        compute_loss override, no compute_loss_func): that loss is a plain, unweighted cross-entropy.
        Imbalance handled by oversampling in the dataset itself is seen only through the labels drawn.
        Fewer than 40 labels (V6.min_labels) skip, even when they are the whole dataset.
    Not applicable
        Detection and segmentation data, data without targets (a diffusion or self-supervised training),
        self-supervised multi-view examples (a list of augmented crops of each image, collated into one (B, C, H, W) batch per view: SimCLR, BYOL, DINO, SwAV), whose labels, when the dataset yields any, train no class output, vision-language batches, and data without images; a training whose loss does not read the labels
        the batches carry (an autoencoder, a VAE: its loss is the same, to the bit, with them shuffled among the
        batch's examples, both computed from the same random state); a training whose loss is no classification loss
        of the model's output (an embedding under a triplet loss on P x K batches: replayed on outputs put in place
        of the model's, the loss is no cross-entropy of them, and weighs no class).
    """
    loss_fn, loader = dlcheck.role("loss_fn"), dlcheck.role("dataloader")
    sample = V.get_vision_sample(dlcheck, "train")
    V.require_task(dlcheck, sample, ("classification",), "single-label class imbalance")
    unused = V.labels_not_trained(dlcheck)
    if unused:
        dlcheck.not_applicable(f"V6 judges the class balance the loss trains on; {unused}")
    other = not_class_scores(dlcheck)
    if other:
        # a metric-learning loss on embeddings (a triplet loss on P x K batches) weighs no class: no class weights
        # to read, and no majority class for the model's output to collapse onto
        dlcheck.not_applicable(f"V6 judges the class balance a classification loss trains on; {other}")
    if any(i.soft for i in sample.items):
        dlcheck.skip(
            f"the sampled classification targets ({sample.source}) are soft labels (mixup/cutmix or one-hot): V6 "
            "reads one class id per example"
        )
    balancing = _balancing(loss_fn, loader)
    own, hidden = _own_loss(dlcheck) if loss_fn is MISSING else (None, None)
    if loss_fn is MISSING and not balancing and own is None:
        dlcheck.skip(
            "missing role: define fixture dlcheck_loss_fn in conftest.py (V6 reads its class weights)"
            + (f": {hidden}, so the loss it trains with is not visible" if hidden else "")
        )
    labels, source, complete = V.label_population(dlcheck, sample, dlcheck.setting("label_samples"))
    min_labels = dlcheck.setting("min_labels")
    if len(labels) < min_labels:
        if balancing:
            dlcheck.measured(
                f"the imbalance is compensated: {balancing} (only {len(labels)} labels could be read, "
                f"{source or sample.source}: too few to measure the ratio)",
                labels=len(labels),
                balancing=balancing,
            )
            return
        dlcheck.skip(
            f"only {len(labels)} labels ({source or sample.source}"
            + (", the whole dataset" if complete else "")
            + f"), below V6.min_labels = {min_labels}: too few to measure a class ratio; hand over the full "
            "training dataset"
        )
    limit = dlcheck.setting("max_ratio")
    if not complete and not balancing and len(set(labels)) >= 2:
        # a sample of labels whose extreme counts pass the limit no more than chance would: read four times as many
        # (the whole dataset when it is smaller) before judging
        first = Counter(labels).most_common()
        if first[0][1] / first[-1][1] > limit and _sampled_ratio_p(
            first[0][1], first[-1][1], limit, len(first)
        ) > dlcheck.setting("false_alarm"):
            labels, source, complete = V.label_population(dlcheck, sample, 4 * dlcheck.setting("label_samples"))
    counts = Counter(labels)
    if len(set(labels)) < 2:
        dlcheck.skip(f"all {len(labels)} labels read ({source}) are one class; V6 cannot see a ratio")
    n_classes, _ = V.num_classes(dlcheck, sample)
    classes = sorted(set(counts) | (set(range(n_classes)) if n_classes else set()))
    present = {c: counts[c] for c in classes if counts[c] > 0}
    most, least = max(present, key=present.get), min(present, key=present.get)
    ratio = present[most] / present[least]
    total = sum(counts.values())
    shown = sorted(present.items(), key=lambda kv: -kv[1])
    hist = ", ".join(f"class {c}: {k} ({100 * k / total:.1f}%)" for c, k in shown[:8]) + (
        " …" if len(shown) > 8 else ""
    )
    chance = None
    if ratio > limit and not balancing and not complete:
        # a sample of labels: the extreme counts of many classes stray from their true ratio by chance
        p_chance = _sampled_ratio_p(present[most], present[least], limit, len(classes))
        if p_chance > dlcheck.setting("false_alarm"):
            chance = (
                f"{total} labels sampled over {len(classes)} classes show {ratio:.3g}:1 with probability {p_chance:.2g} "
                f"even when no class outnumbers another more than {limit:g}:1 (exact binomial test of class {most}'s "
                f"{present[most]} against class {least}'s {present[least]}, Bonferroni over the class pairs; "
                f"V6.false_alarm = {dlcheck.setting('false_alarm'):g}): the sample does not show an imbalance beyond "
                "the limit"
            )
    if chance:
        dlcheck.skip(f"not conclusive: class {most} outnumbers class {least} {ratio:.3g}:1, but {chance}")
    if ratio <= limit or balancing:
        head = (
            f"the {len(present)} classes are equally frequent ({present[most]} labels each) over {total} labels, "
            f"ratio 1:1"
            if present[most] == present[least]
            else f"class {most} outnumbers class {least} {ratio:.3g}:1 over {total} labels"
        )
        dlcheck.measured(
            head + (f" (limit {limit:g}:1)" if ratio <= limit else f", compensated: {balancing}"),
            f"label histogram over {source}: {hist}",
            *([f"compensated: {balancing}"] if balancing and ratio <= limit else []),
            *([own] if own and not balancing else []),
            labels=total,
            ratio=round(ratio, 4),
            limit=limit,
            classes=len(present),
            balancing=balancing,
            sampled=not complete,
        )
        return
    absent = [c for c in classes if counts[c] == 0]
    evidence = [
        f"label histogram over {source}: {hist}",
        f"class {most} outnumbers class {least} {ratio:.0f}:1 (limit {dlcheck.setting('max_ratio'):g}:1)"
        + (
            ""
            if complete
            else f"; in a sample of {total} labels, beyond what chance shows at the limit (p = "
            f"{_sampled_ratio_p(present[most], present[least], limit, len(classes)):.1e}, Bonferroni over the class "
            "pairs)"
        ),
    ]
    if absent:
        evidence.append(f"classes never seen: {', '.join(map(str, absent[:10]))}")
    sampler = type(getattr(loader, "sampler", None)).__name__ if loader is not MISSING else "no dlcheck_dataloader"
    k = len(present)
    weights = [round(total / (k * present.get(c, 1)), 3) for c in range(max(present) + 1)]
    if own is not None:
        evidence.append(f"no dlcheck_loss_fn: {own}; sampler: the Trainer's own (no _get_train_sampler override)")
        dlcheck.fail(
            evidence,
            "the model's own loss weighs every example equally, so the majority class dominates the gradient and "
            "the model can score high accuracy by never predicting the rare class",
            "subclass Trainer and override compute_loss(self, model, inputs, return_outputs=False, **kwargs): "
            "labels = inputs.pop('labels'); outputs = model(**inputs); loss = nn.CrossEntropyLoss("
            f"weight=torch.tensor({weights}, device=outputs.logits.device))(outputs.logits, labels) (inverse class "
            "frequency), or pass Trainer(compute_loss_func=...) computing that weighted loss",
        )
    loss_desc = type(loss_fn).__name__ + " with weight=None"
    evidence.append(f"dlcheck_loss_fn is {loss_desc}; sampler: {sampler}")
    dlcheck.fail(
        evidence,
        "the loss weighs every example equally, so the majority class dominates the gradient and the model "
        "can score high accuracy by never predicting the rare class",
        f"{type(loss_fn).__name__}(weight=torch.tensor({weights})) (inverse class frequency), or "
        "sampler=WeightedRandomSampler(weights=1.0 / counts[labels], num_samples=len(labels)) in the DataLoader",
    )
