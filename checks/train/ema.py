"""T12: the EMA of the model is never updated."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import torch

from ...registry import check
from ...training import fresh_probe, get_setup, smoke_run
from ...training.runs import averaged_module, ema_counter, ema_describe, ema_difference, ema_kind, find_emas
from ..shared.ema_own import held_model_parts, own_parameters


def _weights(ema: Any, trained: Any) -> tuple[dict[str, torch.Tensor], int]:
    """(the EMA's averaged weights, copied, how many of its tensors were left out as the trained model's own):
    EMAModel's shadow params, an EMA module's parameters (buffers such as BatchNorm statistics and the
    counter are not averaged weights) but those that share storage with the trained model (``trained``: the
    online model an EMA wrapper holds as a submodule moves with training whether or not the EMA updates)."""
    with torch.no_grad():
        if isinstance(getattr(ema, "shadow_params", None), list):
            return {f"shadow_params[{i}]": t.detach().clone() for i, t in enumerate(ema.shadow_params)}, 0
        ema = averaged_module(ema)  # timm's ModelEma: a plain object keeping the averaged copy as .ema
        if isinstance(ema, torch.nn.Module):
            own, left = own_parameters(ema, trained)
            return {n: p.detach().clone() for n, p in own.items()}, left
    return {}, 0


def _trained_parts(model: Any, ema_names: set[str]) -> Any:
    """The trained model's modules, the EMAs it holds as attributes left out (a LightningModule keeping its EMA
    as ``self.ema``): the tensors an EMA may share with the training."""
    if not ema_names or not isinstance(model, torch.nn.Module):
        return model
    return [child for name, child in model.named_children() if name not in ema_names]


def _moved(before: Any, after: Any, skip: str) -> tuple[float, int, int]:
    """(largest absolute change of a parameter, parameters changed, parameters compared) between the model
    before and after the run, leaving out the EMA's own parameters (a submodule named ``skip``)."""
    old = dict(before.named_parameters())
    largest, changed, total = 0.0, 0, 0
    with torch.no_grad():
        for name, p in after.named_parameters():
            if skip and (name == skip or name.startswith(skip + ".")) or name not in old:
                continue
            total += 1
            q = old[name]
            if p.shape == q.shape and not torch.equal(p.detach().cpu(), q.detach().cpu()):
                changed += 1
                largest = max(largest, float((p.detach().double().cpu() - q.detach().double().cpu()).abs().max()))
    return largest, changed, total


def _update_call(kind: str | None, ema: Any = None) -> str:
    if kind == "module" and callable(getattr(ema, "update", None)):
        return "ema.update()"
    if kind == "AveragedModel":
        return "ema.update_parameters(model)"
    if kind == "EMAModel":
        return "ema.step(model.parameters())"
    if kind and kind.startswith("ModelEma"):
        return "ema.update(model)"
    return "the EMA update (ema_p.lerp_(p, 1 - decay) for each parameter)"


@check(
    "T12",
    domain="train",
    title="the EMA is never updated",
    roles=(),
    optional_roles=("trainer", "lightning_module", "make_training", "train_step", "dataloader"),
)
def check_ema_updated(dlcheck):
    """The EMA kept in the training state follows the model as it trains.

    What it does
        Finds the EMA in the training state: an entry of the dict from ``dlcheck_make_training`` (or an
        attribute of the LightningModule) that is a ``torch.optim.swa_utils.AveragedModel``, a diffusers
        ``EMAModel``, a timm ``ModelEmaV2``/``V3``, or a module under a name like ``ema`` / ``model_ema``.
        Compares its weights after the shared smoke run (S1-S5's) with the fresh state's, bit for bit,
        and reads its counter (``n_averaged``, ``optimization_step``). An EMA module that holds the trained
        model itself as a submodule beside its averaged copy (``EMA(model)`` keeping ``online_model`` and
        ``ema_model``) is judged on the copy: its tensors that are the trained model's (the same module, or
        storage shared with it) move with training whether or not the EMA updates, and are left out (an
        EMA whose tensors are all the model's fails: it is the model itself). Fails when the model's weights
        moved over the optimizer steps but the EMA still holds exactly its initial weights, or its counter
        stayed 0.
    Why it is bad
        The EMA is usually what is evaluated, sampled from and shipped. If nothing updates it, the
        "EMA" is the model at initialisation: evaluation shows chance-level numbers (or the saved model is
        untrained) while the training loss looks fine, and nothing raises.
    Example
        ema = AveragedModel(model, multi_avg_fn=get_ema_multi_avg_fn(0.999))
        loss.backward(); optimizer.step(); optimizer.zero_grad()        # ema.update_parameters never called
    Use instead
        optimizer.step(); ema.update_parameters(model)      # EMAModel: ema.step(model.parameters())
        under Accelerate: if accelerator.sync_gradients: ema.step(unet.parameters())
    Known problems
        Reads the EMA of a plain loop's state dict and the attributes of a LightningModule; an EMA kept in a
        Lightning callback or a Trainer callback is not seen. Judges the smoke run only (S1.steps steps):
        an EMA updated from a later step on (``update_after_step`` beyond the run) reads as never updated; one
        updated every N calls (``update_every``) needs a call that updates within the run (an EMA wrapper
        that copies the model during its warm-up moves at its first call).
    Not applicable
        Trainings that keep no EMA in their state (nothing of the kinds above in dlcheck_make_training's dict
        or on the LightningModule), and transformers / TRL Trainers (they keep none).
    """
    setup = get_setup(dlcheck)
    fresh = fresh_probe(dlcheck, setup)
    initial = dict(find_emas(fresh.owner))
    if not initial:  # read on the fresh objects: no training run for a state without an EMA
        held = (
            "dlcheck_make_training's dict holds: " + ", ".join(map(str, fresh.owner))
            if isinstance(fresh.owner, Mapping)
            else f"{setup.describe()}: no EMA attribute"
        )
        dlcheck.not_applicable(
            f"no EMA in the training state ({held}): T12 concerns trainings that keep an AveragedModel, an "
            "EMAModel, a timm ModelEma or a module named like 'ema'"
        )
    run = smoke_run(dlcheck)
    emas = find_emas(run.trained.owner)
    if not emas:
        dlcheck.skip(f"the EMA of the fresh state ({', '.join(initial)}) is not in the trained state to compare")
    steps = run.trajectory.calls.count("opt")
    loop = isinstance(run.trained.owner, Mapping)
    skip_name = "" if loop else emas[0][0]
    largest, changed, total = _moved(fresh.model, run.trained.model, skip_name)
    if not changed:
        dlcheck.skip(
            f"the model's weights did not move over the {run.steps}-step smoke run ({steps} optimizer steps): "
            "no update for the EMA to follow (T3 / S1 judge a model that does not train)"
        )
    moved = (
        f"the {run.steps}-step smoke run made {steps} optimizer steps; the model's weights moved ({changed} of "
        f"{total} parameter tensors changed, by up to {largest:.4g})"
    )
    passed = []
    for name, ema in emas:
        where = f"state['{name}']" if loop else f"self.{name} of the LightningModule"
        what = ema_describe(where, ema)
        kind = ema_kind(ema, name)
        before_ema = initial.get(name)
        if before_ema is None:
            dlcheck.skip(f"the fresh training state has no {where}: the EMA's initial weights cannot be read")
        names = {n for n, _ in emas}
        (before, _), (after, left) = (
            _weights(before_ema, _trained_parts(fresh.model, names)),
            _weights(ema, _trained_parts(run.trained.model, names)),
        )
        held = held_model_parts(ema, _trained_parts(run.trained.model, names))
        if left and not after:
            dlcheck.fail(
                [
                    moved,
                    f"all {left} parameter tensors of the EMA {what} share their storage with the trained model: "
                    "it holds no averaged copy of its own",
                ],
                "the EMA is the trained model itself (the same module, or tensors shared with it), not a copy, so "
                "it never averages anything",
                "keep a copy: ema_model = copy.deepcopy(model).requires_grad_(False) (or AveragedModel(model, ...)) "
                "and update it after each optimizer.step()",
            )
        if left:
            what += (
                f" (its {', '.join(held) or 'tensors'} shared with the trained model, {left} tensors, left out: "
                "they move with training whether or not the EMA updates)"
            )
        if not after:
            dlcheck.skip(f"the EMA {what} holds no tensors T12 can read")
        diff = ema_difference(after, before)
        start, end = ema_counter(before_ema), ema_counter(ema)
        stuck = end is not None and start is not None and end[1] == start[1] == 0
        count = f"{end[0]} {end[1]}" if end is not None else "no update counter"
        if diff is None or stuck:
            evidence = [moved]
            if diff is None:
                evidence.append(
                    f"the EMA {what} still holds exactly its initial weights: all {len(after)} tensors equal the "
                    "fresh state's, bit for bit"
                )
            else:
                evidence.append(
                    f"the EMA {what} changed ({diff[3]} of {diff[4]} tensors, by up to {diff[2]:.4g}) but not "
                    "through its update"
                )
            evidence.append(
                f"its counter: {count} after {steps} optimizer steps" + (" (never updated)" if stuck else "")
            )
            call = _update_call(kind, ema)
            if end is not None and end[1] > 0 and diff is None:
                cause = (
                    f"the EMA is updated ({end[0]} {end[1]}) but its weights never move: its decay keeps the old "
                    "average entirely, or it is updated from a model that is not the one trained"
                )
                fix = f"{call} with the trained model right after optimizer.step(), with a decay below 1 (e.g. 0.999)"
            else:
                cause = (
                    "the training loop never updates the EMA: it stays the model at initialisation, so whatever "
                    "is evaluated, sampled or saved from it ignores the training"
                )
                fix = (
                    f"call {call} right after each optimizer.step() in your step (under Accelerate: "
                    f"if accelerator.sync_gradients: {call})"
                )
            dlcheck.fail(evidence, cause, fix)
        passed.append((what, diff, count))
    dlcheck.measured(
        moved,
        *(
            f"the EMA {what} moved with it: {diff[3]} of {diff[4]} tensors changed, by up to {diff[2]:.4g}; {count}"
            for what, diff, count in passed
        ),
        optimizer_steps=steps,
        model_change=largest,
        ema_change=max(d[2] for _, d, _ in passed),
    )
