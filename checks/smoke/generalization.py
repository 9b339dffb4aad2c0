from __future__ import annotations

import contextlib
import math

from ... import detectors
from ...registry import check, load_checks
from ...sampling import indexable
from ...session import made_up
from ...training import (
    as_soft_targets,
    describe_batch,
    eval_batches,
    mean_loss,
    probe,
    run_or_skip,
    smoke_run,
    soft_targets,
    targets_of,
    training_batches,
)


@check(
    "S5",
    domain="smoke",
    title="train/eval loss gap beyond a threshold after a short run",
    roles=(),
    optional_roles=("trainer", "lightning_module", "make_training", "dataloader", "eval_dataloader", "eval_dataset"),
    settings=detectors.SETTINGS["S5"],
)
def check_train_eval_gap(dlcheck):
    """After a short real run, the eval loss stays close to the train loss.

    What it does
        After the shared smoke run (see S1), computes the mean loss in eval mode on the sampled training
        batches and on the sampled eval batches (``dlcheck_eval_dataloader``, or derived from the Trainer's
        eval_dataset / the datamodule's val_dataloader), and the same before training, on the initial
        model. Fails when the eval loss is above ``max_ratio`` x the train loss and ``min_gap`` nats above it,
        telling a gap that was there before training (the eval data differs) from one that grew (the
        model memorises the training data).
    Why it is bad
        A gap that opens within a few dozen steps means the model learns the training examples, not the
        task: labels misaligned with their inputs (it can only memorise them), a tiny or duplicated
        training set, or a model far too large for the data. A gap at step 0 means the eval data is
        preprocessed or distributed differently from the training data, and the eval metric measures
        something else.
    Example
        labels shuffled against their inputs by a misaligned join: train loss falls, eval loss rises
    Use instead
        check that every label belongs to its input; use more data, regularisation or early stopping;
        preprocess eval exactly as train.
    Known problems
        A run that diverged (S2 fails it: a spike over its running mean, or losses ending above ``S2.rise`` x
        where they began) is not judged: its gap, whatever its size, measures a broken model, not
        memorisation or different eval data, and S5 skips naming S2, the one true cause. Needs eval data;
        skips without it. Eval batches that lack the targets every training batch carries (transformers'
        run_qa.py builds its eval features without start/end positions and scores post-processed answers) give
        no eval loss: S5 says it is not judged, naming the fields. Short runs see only fast overfitting: slow
        overfitting over epochs is for the eval metric of the real run (``pytest_dlcheck.watch`` judges it there with these
        thresholds).
        When the training batches hold soft targets (Mixup/CutMix in the collate) and the eval batches class
        indices, the indices are handed to the training's loss as one-hot rows (on which a soft-target
        cross-entropy is the cross-entropy of the index). Against the mixed targets the train loss keeps their
        entropy, which hides memorisation, so the train loss is measured on the training dataset's first
        examples collated by the eval loader's collate_fn (class indices, no mixing), handed to the loss as
        one-hot rows too: like is compared with like. When they cannot be collated so (the loaders are not
        DataLoaders, the training dataset is not indexable, the eval collate does not take its examples), the
        mixed batches are used and a pass says memorisation was not judged. Eval targets the training's loss
        cannot take are not judged. A model whose losses
        exist in train mode only (a torchvision detector) is measured in train mode with its BatchNorm and
        dropout layers in eval mode.
    Not applicable
        Losses that take negative values, in the smoke run or measured on the sampled batches (GRPO and other
        policy-gradient objectives, centred on 0 by their baseline): they measure no fit, so a train/eval ratio or
        gap of their values means nothing (S2 is not applicable to them for the same reason). Any other run with
        eval data can overfit.
    """
    run = smoke_run(dlcheck)
    _not_a_fit_measure(dlcheck, [(f"step {s}", v) for s, v in run.trajectory.losses()])
    _not_diverged(dlcheck, run)
    ev = run_or_skip(dlcheck, lambda: eval_batches(dlcheck, run.setup))
    if not ev:
        dlcheck.skip(
            "missing role: define fixture dlcheck_eval_dataloader (or dlcheck_eval_dataset, or a Trainer with "
            "eval_dataset, or a datamodule with val_dataloader) in conftest.py"
        )
    tr = run_or_skip(dlcheck, lambda: training_batches(dlcheck, run.setup))
    ev, soft_note = _eval_targets_as_trained(dlcheck, tr, ev)
    initial, _, _ = probe(dlcheck)
    # soft training targets (Mixup/CutMix in the collate) keep the train loss at their entropy at least, while the
    # eval loss of class indices can go to 0: memorisation hides under that floor. Like is compared with like: the
    # training examples collated as the eval loader collates its own (class indices, no mixing)
    plain, plain_note, unmixed_why = (None, None, None)
    if soft_note:
        plain, plain_note, unmixed_why = _training_examples_as_eval(dlcheck, tr)
    train_note = plain_note if plain is not None else None
    train_batches = plain if plain is not None else tr

    reasons: list[str] = []

    def eval_loss(fresh):
        with made_up(soft_note) if soft_note else contextlib.nullcontext():
            return mean_loss(fresh, ev, reasons)

    def train_loss_of(fresh):
        with made_up(train_note) if train_note else contextlib.nullcontext():
            return mean_loss(fresh, train_batches, reasons)

    only_trained = _targets_only_in_training(tr, ev)
    try:
        initial_eval = eval_loss(initial)
    except Exception as exc:
        if not only_trained:
            raise
        # the pipeline's own eval data holds no targets (run_qa.py's eval features carry no answer positions; the
        # answers are scored from post-processed predictions): there is no eval loss to compare
        said = str(exc).strip().splitlines()[0][:160] if str(exc).strip() else ""
        dlcheck.skip(
            "not judged: no eval loss: the eval batches hold no targets the model computes a loss from (the "
            f"training batches carry {', '.join(only_trained)}; the eval batches do not, and the loss on them "
            f"raised {type(exc).__name__}{': ' + said if said else ''})"
        )
    before = (train_loss_of(initial), initial_eval)
    after = (train_loss_of(run.trained), eval_loss(run.trained))
    if None in after:
        dlcheck.skip(
            "the loss could not be computed on the sampled batches in eval mode"
            + (f": {reasons[0]}" if reasons else "")
        )
    train_loss, eval_loss = after
    _not_a_fit_measure(
        dlcheck,
        [
            ("the train loss before training", before[0]),
            ("the eval loss before training", before[1]),
            ("the train loss after training", train_loss),
            ("the eval loss after training", eval_loss),
        ],
    )
    exceeded, ratio = detectors.gap_exceeded(
        train_loss, eval_loss, dlcheck.setting("max_ratio"), dlcheck.setting("min_gap")
    )
    if not exceeded:
        dlcheck.measured(
            f"after {_steps(run)}: eval loss {eval_loss:.4g} vs train loss {train_loss:.4g} on the sampled batches "
            f"= {ratio:.2f} x, {eval_loss - train_loss:.3g} nats apart (fails when above {dlcheck.setting('max_ratio')} x "
            f"and more than {dlcheck.setting('min_gap')} nats apart)",
            *([f"before training: eval {before[1]:.4g}, train {before[0]:.4g}"] if None not in before else []),
            *([soft_note] if soft_note else []),
            *([train_note] if train_note else []),
            train_loss=train_loss,
            eval_loss=eval_loss,
            ratio=round(ratio, 4),
        )
        if soft_note and train_note is None:
            dlcheck.not_judged(
                "memorisation",
                "the train loss is measured against the mixed soft targets, whose entropy keeps it high, and the "
                f"training examples could not be collated without the mixing ({unmixed_why}): a gap of memorisation "
                "reads smaller than it is",
            )
        return
    if before[0] is not None and train_loss > before[0]:
        # memorisation needs a training loss that fell; one that rose is a diverging run (S2/S3 judge it)
        dlcheck.skip(
            f"not conclusive: the training loss rose over the smoke run's {_steps(run)} ({before[0]:.4g} -> "
            f"{train_loss:.4g}), so the eval/train gap ({eval_loss:.4g} vs {train_loss:.4g}) is no sign of "
            "memorisation: the run diverged (see S2/S3, and the learning rate)"
        )
    evidence = [
        f"after {_steps(run)}: eval loss {eval_loss:.4g} vs train loss {train_loss:.4g} on the sampled batches "
        f"= {ratio:.2f} x (limit {dlcheck.setting('max_ratio')} x and {dlcheck.setting('min_gap')} nats)"
    ]
    if None not in before:
        evidence.append(f"before training: eval {before[1]:.4g}, train {before[0]:.4g}")
    if soft_note:
        evidence.append(soft_note)
    if train_note:
        evidence.append(train_note)
    gap_before = None if None in before else before[1] - before[0]
    if (
        gap_before is not None
        and gap_before > dlcheck.setting("min_gap")
        and before[1] > dlcheck.setting("max_ratio") * before[0]
    ):
        cause = (
            "the gap is there before any step: the eval data is preprocessed or distributed differently from the "
            "training data, so the eval loss measures something else"
        )
        fix = "build the eval data with the same preprocessing (tokenisation, normalisation, label masking) as the training data"
    else:
        cause = (
            f"the model memorises the training batches: their loss fell to {train_loss:.4g} while the eval loss "
            f"{'rose' if before[1] is not None and eval_loss > before[1] else 'stayed at'} {eval_loss:.4g} within "
            f"{_steps(run)} (labels that do not belong to their inputs can only be memorised; so can a tiny "
            "or duplicated training set)"
        )
        fix = detectors.MEMORISE_FIX
    dlcheck.fail(evidence, cause, fix)


def _not_a_fit_measure(dlcheck, losses) -> None:
    """Not applicable, as S2 is and for S2's reason, when a loss takes negative values (a policy-gradient objective
    such as GRPO's: centred on 0 by its baseline, of either sign, whatever the model fits): a ratio or gap of its
    train and eval values measures no memorisation and no difference of the eval data."""
    negative = detectors.first_negative(losses)
    if negative:
        dlcheck.not_applicable(
            detectors.NEGATIVE_LOSS.format(where=negative[0], value=negative[1])
            + ": it is no measure of how well the model fits its data, and a train/eval ratio or gap of its values "
            "measures no fit (S2 is not applicable to it either)"
        )


def _not_diverged(dlcheck, run) -> None:
    """Skip naming S2 when the smoke run diverged by S2's own detector and settings (a spike over the
    running mean, or losses ending far above where they began): the train/eval gap of an exploded model
    is no sign of memorisation, and a pass would call a broken run generalising."""
    s2 = load_checks()["S2"]
    setting = lambda name: dlcheck.state.setting(s2, name)  # noqa: E731 - S2's thresholds, as S2 reads them
    losses = [(s, v) for s, v in run.trajectory.losses() if v is not None and math.isfinite(v)]
    if not losses or any(v <= 0 for _, v in losses):
        return  # S2 cannot judge a loss at or below 0; S5 judges the gap as it is
    hit, _, _ = detectors.divergence(losses, setting("factor"), setting("window"), setting("warmup"), setting("rise"))
    if hit is None:
        return
    if isinstance(hit, detectors.Spike):
        what = f"a loss of {hit.loss:.4g} at {run.at(hit.step)}, {hit.ratio:.1f} x the mean of the steps before it"
    else:
        what = (
            f"losses from {hit.start:.4g} at step {hit.start_step} to a median {hit.level:.4g} by {run.at(hit.step)} "
            f"({hit.ratio:.1f} x where they began)"
        )
    dlcheck.skip(
        f"not judged: the smoke run diverged ({what}; S2 fails it): the eval/train gap of a diverged model is no "
        "sign of memorisation or of different eval data (see S2, and the learning rate)"
    )


def _training_examples_as_eval(dlcheck, tr) -> tuple[list | None, str | None, str | None]:
    """(batches, note, None): the training dataset's first examples collated by the eval loader's collate_fn (no
    Mixup/CutMix: class indices), as many batches as ``tr``, their indices handed to the training's loss as one-hot
    rows as the eval batches' are; or (None, None, why not) when the loaders are not DataLoaders over a dataset of
    known length, or the eval collate does not give class indices for the training examples."""
    from torch.utils.data import DataLoader

    train_loader, eval_loader = dlcheck.role("dataloader"), dlcheck.role("eval_dataloader")
    if not isinstance(train_loader, DataLoader) or not isinstance(eval_loader, DataLoader):
        return None, None, "the training and eval loaders are not both torch DataLoaders"
    dataset = train_loader.dataset
    if not indexable(dataset):  # an IterableDataset with a length inherits a __getitem__ that only raises
        return None, None, "the training dataset is not indexable"
    size = eval_loader.batch_size or train_loader.batch_size or len(targets_of(tr[0]))
    want = min(len(tr) * size, len(dataset))
    try:
        rows = [dataset[i] for i in range(want)]
        batches = [eval_loader.collate_fn(rows[i : i + size]) for i in range(0, want, size)]
    except Exception as exc:  # noqa: BLE001 - the eval collate may not take the training examples: not judged, said so
        return None, None, f"the eval loader's collate_fn raised {type(exc).__name__} on the training examples"
    converted = [as_soft_targets(b, tr[0]) for b in batches]
    if not converted or any(b is None for b in converted):
        return None, None, "the eval loader's collate_fn gives the training examples no class indices"
    classes = int(targets_of(tr[0]).shape[-1])
    return (
        converted,
        f"the train loss is measured on the training dataset's first {want} examples collated as the eval loader "
        f"collates (its collate_fn: class indices, no mixing), handed to the training's loss as one-hot rows over "
        f"{classes} classes: against the mixed targets their entropy keeps the loss high and hides memorisation",
        None,
    )


def _targets_only_in_training(tr, ev) -> list[str]:
    """The fields every training batch carries and no eval batch does (the targets a model computes its loss
    from: ``labels``, ``start_positions``/``end_positions``), sorted; [] when the batches are not mappings or the
    eval batches carry every training field."""
    from collections.abc import Mapping

    if not tr or not ev or not all(isinstance(b, Mapping) for b in (*tr, *ev)):
        return []
    common = set.intersection(*(set(b) for b in tr))
    return sorted(str(k) for k in common if not any(k in b for b in ev))


def _steps(run) -> str:
    """``40 steps``, or ``20 optimizer steps (80 micro-steps)`` under gradient accumulation."""
    if run.micro_steps > run.opt_steps > 0:
        return f"{run.opt_steps} optimizer steps ({run.micro_steps} micro-steps)"
    return f"{run.steps} steps"


def _eval_targets_as_trained(dlcheck, tr, ev):
    """The eval batches as the training's loss takes them: when the training batches hold soft targets (Mixup /
    CutMix in the collate, a float (batch, classes) distribution per row) and the eval batches class indices, the
    indices as one-hot distributions (a loss built for soft targets computes on a one-hot row the cross-entropy
    of the index) and a note saying so; eval batches of another kind are not judged (the training's loss would be
    fed targets its pipeline never gives it)."""
    if not tr or not soft_targets(targets_of(tr[0])) or all(soft_targets(targets_of(b)) for b in ev):
        return ev, None
    converted = [as_soft_targets(b, tr[0]) for b in ev]
    if any(b is None for b in converted):
        dlcheck.skip(
            f"not judged: the training batches hold soft targets ({describe_batch(targets_of(tr[0]))}: Mixup/CutMix or "
            f"label smoothing) and the eval batches {describe_batch(targets_of(ev[0]))}, which the training's loss "
            "does not take as they are: the eval loss cannot be computed the way the pipeline computes it"
        )
    classes = int(targets_of(tr[0]).shape[-1])
    return converted, (
        f"the training batches hold soft targets ({describe_batch(targets_of(tr[0]))}); the eval batches' class "
        f"indices were handed to the training's loss as one-hot rows over {classes} classes"
    )
