from __future__ import annotations

from typing import Any

from ...errors import MISSING
from ...registry import Setting, check, load_checks
from ...training import fresh_probe, get_setup, memo_or_skip, run_or_skip, smoke_baseline
from ...training.resume import (
    DATA_FIX,
    MID_EPOCH,
    ResumeLoadFailed,
    ResumeRun,
    count_examples,
    counted,
    holders_of,
    keys_mismatch,
    refused_global,
)
from ...training.runs import generation_cycle

#: the order pieces are tried in: the usual culprits first, the weights last (the RNG states are C3's: C1
#: puts them back in every resumed run)
ORDER = ("optimizer", "lr_scheduler", "hand-stepped scheduler", "scaler", "data position", "ema", "model")

#: the checks that read the resume runs (and the uninterrupted run's saved state, freed once both are decided)
RESUME_CHECKS = ("C1", "C3")

WHAT = {
    "optimizer": "the optimizer state (its per-parameter buffers, such as Adam's moments, and step counts): the "
    "resumed run restarts them from zero",
    "lr_scheduler": "the LR scheduler's position: the resumed run restarts the warmup/decay from its first step",
    "scaler": "the GradScaler's loss scale and growth tracker",
    "rng": "the random number generators (python, numpy, torch): dropout masks and shuffling differ after the resume",
    "data position": "the dataloader position: the resumed run starts again from the first batch of the epoch",
    "ema": "the EMA weights",
    "model": "the model weights",
}


def _hand_what(run: Any) -> str:
    """The cause's words for LR schedulers a LightningModule keeps in its attributes and steps by hand."""
    found = run.uninterrupted.notes.get("hand_schedulers") or {}
    names = ", ".join(f"{label} ({kind})" for label, kind in found.items()) or "a scheduler stepped by hand"
    return (
        f"the LR scheduler {names} that the module creates and steps by hand: Lightning knows only the schedulers "
        "configure_optimizers returns, so it is not in the checkpoint, and the resumed run starts it again from its "
        "first step (the warmup/decay restarts)"
    )


def _attributes(run: Any) -> str:
    names = run.uninterrupted.notes.get("module_attributes") or []
    shown = ", ".join(f"self.{n}" for n in names[:5]) or "its attributes"
    return shown + (f" and {len(names) - 5} more" if len(names) > 5 else "")


def _attributes_what(run: Any) -> str:
    """The cause's words for a LightningModule's own attributes (outside its state_dict) that training changes."""
    return (
        f"the LightningModule's own attributes {_attributes(run)}, which training changed: Lightning's .ckpt holds "
        "the module's state_dict() (parameters and buffers), the optimizers and the loops' counters, not the "
        "module's other attributes, so the resumed fit trains on with them as a new module holds them (a replay "
        "buffer refilled from scratch, an environment's episode or a counter started over)"
    )


def _callback_what(run: Any, piece: str, lost_emas: dict[str, Any]) -> str:
    """The cause's words for a Lightning callback whose state the checkpoint does not restore: the EMA it keeps
    when that is what differs, else the attributes that changed during training."""
    label = piece.removeprefix("callback ")
    held = (run.uninterrupted.notes.get("callbacks") or {}).get(label, {})
    saves = run.pieces.get(piece) == "callbacks"
    how = (
        "its state_dict() leaves them out"
        if saves
        else f"{label} defines no state_dict(), so Lightning saves nothing of it in the .ckpt"
    )
    emas = [d for name, d in lost_emas.items() if name.startswith(piece + ".")]
    if emas:
        return _ema_what(emas[0]) + f" ({how})"
    attrs = ", ".join(f"self.{a}" for a in held.get("changed", [])[:4]) or "its attributes"
    return (
        f"the state of your callback {label} ({attrs} changed during training): Lightning keeps a callback's state "
        f"only through its state_dict(), and {how}: the resumed fit starts the callback over"
    )


def _lr_side(run: Any) -> str | None:
    """``step 3: 0.0033 vs 0.01, ...``: the learning rates of the resumed steps beside the uninterrupted
    run's, when they differ somewhere (None otherwise)."""
    base = {s.step: s.lr for s in run.uninterrupted.steps}
    resumed = [(s.step, s.lr) for s in run.resumed.steps if s.step > run.saved_at and s.lr is not None]
    pairs = [(st, lr, base[st]) for st, lr in resumed if base.get(st) is not None]
    if not any(lr != ref for _, lr, ref in pairs):
        return None
    return ", ".join(f"step {st}: {lr:.6g} vs {ref:.6g}" for st, lr, ref in pairs[:4])


def data_probe(dlcheck: Any, setup: Any) -> Any:
    """C1's and C10's data-position run (:meth:`LoopSetup.data_resume`, C1's :meth:`LightningSetup.data_resume`,
    made once per session): the DataResume, None when the training dict holds no dataloader, or the SetupError it
    ended with."""
    from ...training.setup import memo_captured

    if setup.kind != "lightning" and (setup.kind not in ("loop", "accelerate") or not setup.can_resume()):
        return None
    total = int(dlcheck.state.setting(load_checks()["C1"], "steps"))
    return memo_captured(dlcheck, setup.sources, f"resume:data:{total}", lambda: _data_resume(setup, total))


def _data_resume(setup: Any, total: int) -> Any:
    """The data-position run, doubled in length (up to :data:`DATA_STEPS_LIMIT` micro-steps) while a gradient
    accumulation leaves no optimizer step in its second half to save after, as a loop saves only after one. A
    plain or Accelerate loop whose training dict holds no torch DataLoader to draw from gets :class:`NoLoader`,
    saying what the dict holds instead."""
    from ...training.runs import past_accumulation

    _, result = past_accumulation(setup.data_resume, total, DATA_STEPS_LIMIT)
    if result is None and setup.kind in ("loop", "accelerate"):
        # the state the factory built for the run, handed back unused for the next run to take
        return NoLoader(no_loader(vars(setup).get("_kept")))
    return result


class NoLoader:
    """The data-position run was not made: the training dict holds no torch DataLoader to draw from (``why``)."""

    def __init__(self, why: str) -> None:
        self.why = why


#: the names a training dict's loader goes by (:func:`pytest_dlcheck.training.loop.loader_key`)
LOADER_NAMES = ("dataloader", "train_dataloader", "train_loader")


def no_loader(state: Any) -> str:
    """Why the training dict ``state`` gives the data-position run no loader: none there, a loader that is not a
    torch DataLoader (a generator, an iterable class of the pipeline's own), or several, none so named."""
    from torch.utils.data import DataLoader

    if not isinstance(state, dict):
        return "the dlcheck_make_training dict holds no dataloader"
    loaders = [k for k, v in state.items() if isinstance(k, str) and isinstance(v, DataLoader)]
    if len(loaders) > 1:
        return (
            f"the dlcheck_make_training dict holds {len(loaders)} DataLoaders ({', '.join(loaders[:4])}), none named "
            f"{' / '.join(LOADER_NAMES)}, so which one trains is not told"
        )
    for name in LOADER_NAMES:
        value = state.get(name)
        if value is not None:
            return (
                f"state['{name}'] is a {type(value).__name__}, not a torch DataLoader (dlcheck draws the "
                "save-and-resume runs from a torch DataLoader only)"
            )
    return "the dlcheck_make_training dict holds no dataloader"


#: the longest data-position run made to reach past one gradient accumulation (micro-steps)
DATA_STEPS_LIMIT = 64


def data_verdict(dlcheck: Any, setup: Any, how: str, loaded_by: str) -> list[str]:
    """The data position of a plain or Accelerate loop: fails when the resumed run, drawing from the loader its
    training dict holds after the user's load, trains examples twice or never (counted by content); else the
    lines of what was measured (or not judged, and why)."""
    if setup.kind == "lightning":
        return _lightning_data(dlcheck, setup)
    if setup.kind == "accelerate" and setup.load is MISSING:  # C10: the user's save, dlcheck's load_state
        reason = (
            "no dlcheck_load_checkpoint: the load was dlcheck's own stand-in (accelerator.load_state), not your "
            "resume, so where your loop resumes the epoch is not visible to dlcheck"
        )
        dlcheck.not_judged("data position", reason)
        return [f"data position: not judged: {reason}"]
    probe = data_probe(dlcheck, setup)
    if probe is None or isinstance(probe, NoLoader):
        if setup.kind not in ("loop", "accelerate"):
            return []
        why = probe.why if probe is not None else no_loader(None)
        reason = (
            f"{why}; dlcheck feeds the runs its own batches (return your training DataLoader in it, as "
            "state['dataloader'] (an IterableDataset over your loader's batches is one), and the resumed run draws "
            "from it after your load"
            + (
                ": the position that accelerator.skip_first_batches or a stateful dataloader restores is then judged)"
                if setup.kind == "accelerate"
                else ")"
            )
        )
        dlcheck.not_judged("data position", reason)
        return [f"data position: not judged: {reason}"]
    if isinstance(probe, Exception):
        dlcheck.not_judged("data position", str(probe))
        return []
    if probe.not_seen:  # the data path after the resume is not the user's own, or not visible: said, not judged
        dlcheck.not_judged("data position", probe.not_seen)
        return [
            f"data position: not judged: {probe.not_seen} (define dlcheck_resume_dataloader (state, dataloader, "
            "resumed_step) returning what your epoch loop trains on for the rest of the epoch after a resume — "
            "accelerator.skip_first_batches(dataloader, resumed_step), itertools.islice(dataloader, resumed_step, "
            "None), or dataloader itself when your loop starts the epoch again — and it is judged)"
        ]
    if probe.load_error:  # C1's own resume loaded (it reports a load that raises): this one did not
        dlcheck.not_judged(
            "data position",
            f"your load raised on the checkpoint saved by the run drawn from state['{probe.key}']: {probe.load_error}",
        )
        return []
    if probe.unreadable:
        dlcheck.not_judged("data position", f"drawn from state['{probe.key}']: {probe.unreadable}")
        return []
    c = probe.count()
    n, k, m = probe.steps, probe.saved_at, probe.drawn
    whole = probe.whole
    span = probe.span()
    if probe.through_role is not None:
        source = (
            f"what your dlcheck_resume_dataloader makes of their state['{probe.key}'] after the load (a "
            f"{probe.through_role}, given resumed_step={probe.resumed_step})"
        )
    else:
        source = f"their state['{probe.key}']" + (
            f" (a {probe.resumed_loader} after the load)" if probe.resumed_loader != probe.loader else ""
        )
    at = f" ({probe.cadence})" if getattr(probe, "cadence", None) else ""
    drawn = (
        f"the uninterrupted run draws steps 1-{n}{span} from state['{probe.key}'] ({probe.loader}){probe.rest()} and saves "
        f"after step {k}{at} through {how}; fresh objects loaded by {loaded_by} draw steps {k + 1}-{m} from {source}"
    )
    if c.conclusive:
        evidence = [drawn, f"over steps 1-{m}: {counted(c, m, k, whole)}"]
        replayed = probe.replayed()
        if replayed:
            evidence.append(
                "the resumed steps train batches already trained before the save: "
                + ", ".join(f"step {a} = step {b}'s batch" for a, b in replayed[:4])
            )
        what = (
            f"what your loop trains on after the load (dlcheck_resume_dataloader on state['{probe.key}'])"
            if probe.through_role is not None
            else f"after the load, state['{probe.key}']"
        )
        if getattr(probe, "cadence", None) and setup.checkpoint_every == "epoch":
            dlcheck.fail(
                evidence,
                cause=(
                    f"the resume does not start the epoch after the saved one: {what} yields examples of the epoch "
                    "trained before the save ("
                    + (
                        "the saved epoch again, in its order: the loop resumes at the saved epoch, not the next one"
                        if replayed
                        else "another order of the examples the uninterrupted run's next epoch holds"
                    )
                    + "), so the resumed run trains an epoch's examples twice and never reaches as many others"
                ),
                fix=(
                    "resume at the epoch after the saved one: save the epoch just finished and start the loop at "
                    "checkpoint['epoch'] + 1 (for epoch in range(start_epoch, epochs)), with the sampler's "
                    "set_epoch(epoch) given that epoch"
                ),
            )
        fix = DATA_FIX[setup.kind].replace("state['dataloader']", f"state['{probe.key}']")
        if setup.kind in ("loop", "accelerate") and not getattr(probe, "cadence", None):
            fix += (
                f" (C1 saved after step {k}, in the middle of an epoch: if your loop checkpoints only at epoch ends, "
                "say so with dlcheck_checkpoint_every = 'epoch', or = N for a checkpoint every N optimizer steps, "
                "and C1 saves there)"
            )
        dlcheck.fail(
            evidence,
            cause=(
                "the resume does not restore the data position: "
                + what
                + " does not continue the epoch where the save left it — it yields examples already trained before "
                "the save ("
                + (
                    "the epoch starts again from its first batch"
                    if replayed
                    else "a new iterator over the epoch, or a skip over a reshuffled epoch"
                )
                + "), so the resumed epoch trains some examples twice and never reaches others"
            ),
            fix=fix,
        )
    if c.same and _alike(dlcheck, probe, drawn):
        return []
    if c.same:
        return [
            f"data position: {drawn}: the uninterrupted run's batches, step by step (over steps 1-{m}: "
            f"{c.before + c.trained} examples, none trained twice, none lost)"
        ]
    dlcheck.not_judged(
        "data position",
        f"{drawn}: other batches than the uninterrupted run's, whose examples are not recognised by content "
        f"({c.other} of {c.trained} not among the uninterrupted run's, none trained twice): not counted",
    )
    return []


def _alike(dlcheck: Any, probe: Any, drawn: str) -> bool:
    """When the uninterrupted run's drawn examples are not all distinct by content (DreamBooth: one prompt for every
    example, images alike), batches equal by content do not show that the same examples were trained: the data
    position is said not judged (True)."""
    drawn_all = [d for step in list(probe.before) + list(probe.expected) for d in step]
    distinct = len(set(drawn_all))
    if distinct == len(drawn_all):
        return False
    if getattr(probe, "cadence", None):
        # a run saved at the user's cadence spans more than an epoch: an example comes back once per epoch, so the
        # examples are told apart within the epoch(s) before the save and within the steps after it
        size = probe.epoch or len(probe.before) or 1
        epochs = [probe.before[i : i + size] for i in range(0, len(probe.before), size)]
        parts = [[d for step in part for d in step] for part in (*epochs, probe.expected)]
        if all(len(set(part)) == len(part) for part in parts):
            return False
        drawn_all = max(parts, key=lambda part: len(part) - len(set(part)))
        distinct = len(set(drawn_all))
    dlcheck.not_judged(
        "data position",
        f"{drawn}: the resumed steps draw batches equal by content to the uninterrupted run's, but the uninterrupted "
        f"run's {len(drawn_all)} drawn examples hold {distinct} distinct contents: examples that look alike are not "
        "told apart, so whether the same ones were trained is not known",
    )
    return True


#: the fix for a Lightning loader whose position a mid-epoch checkpoint does not hold
LIGHTNING_DATA_FIX = (
    "make the training dataloader resumable: return torchdata.stateful_dataloader.StatefulDataLoader(...) from "
    "train_dataloader() (the same arguments as DataLoader; Lightning saves its state_dict() in the .ckpt and calls "
    "its load_state_dict() on fit(ckpt_path=...)), or give your loader state_dict() / load_state_dict() that save "
    "and restore its position in the epoch; or checkpoint only at epoch ends (ModelCheckpoint without "
    "every_n_train_steps / train_time_interval, no validation-time saves inside the epoch, "
    "SLURMEnvironment(auto_requeue=False))"
)


def _lightning_data(dlcheck: Any, setup: Any) -> list[str]:
    """The data position of a Lightning user across a mid-epoch checkpoint and fit(ckpt_path=...): fails when the
    resumed epoch trains examples twice or never (counted by content against the uninterrupted epoch's); else the
    line of what was measured, or the part recorded as not judged, and why. Judged only when the user's Trainer
    (or checkpoint callbacks) writes checkpoints in the middle of an epoch: at epoch ends, Lightning starts every
    loader's epoch anew and the resume above is the whole story."""
    saves = setup.checkpointing()
    if saves is None:
        return [
            "data position: not judged: how your runs checkpoint is not visible (hand over your Lightning Trainer as "
            "dlcheck_trainer, or its ModelCheckpoint among dlcheck_lightning_callbacks, and it is judged): from a "
            "checkpoint in the middle of an epoch (ModelCheckpoint(every_n_train_steps=...) or train_time_interval, "
            "one at every validation with val_check_interval < 1, a SLURM requeue) Lightning resumes a loader "
            "without state_dict() / load_state_dict() from its first batch"
        ]
    mid, ends = saves
    if not mid:
        held = ", ".join(ends) or "no checkpoint callback"
        return [
            f"data position: your Trainer writes no checkpoint in the middle of an epoch ({held}): at an epoch end "
            "Lightning starts every loader's epoch anew, as the resume above "
            "does (a mid-epoch checkpoint, every_n_train_steps or a SLURM requeue, would be judged across the epoch)"
        ]
    probe = data_probe(dlcheck, setup)
    if isinstance(probe, Exception):
        dlcheck.not_judged("data position", f"the mid-epoch save and resume of your train_dataloader(): {probe}")
        return []
    if probe.load_error:
        dlcheck.not_judged("data position", f"the resume from the mid-epoch checkpoint: {probe.load_error}")
        return []
    if probe.unreadable:
        dlcheck.not_judged("data position", f"your train_dataloader() ({probe.loader}): {probe.unreadable}")
        return []
    c = probe.count()
    n, k = probe.steps, probe.saved_at
    whole = probe.epoch is not None and probe.epoch == n
    span = (
        " (the whole first epoch)"
        if whole
        else f" ({n} of the epoch's {probe.epoch} batches)"
        if probe.epoch and probe.epoch > n
        else " (of an epoch whose length the loader does not tell)"
        if probe.epoch is None
        else ""
    )
    drawn = (
        f"the uninterrupted fit trains batches 1-{n}{span} of {setup.train_loader} ({probe.loader}) "
        f"and saves a mid-epoch checkpoint after batch {k} (trainer.save_checkpoint, as ModelCheckpoint("
        f"every_n_train_steps=...) or a SLURM requeue does); fit(ckpt_path=...) on fresh copies trains batches "
        f"{k + 1}-{n} from it"
    )
    if c.conclusive:
        held = probe.notes.get("held")
        evidence = [
            f"your Trainer writes checkpoints in the middle of an epoch: {', '.join(mid)}",
            drawn,
            f"over batches 1-{n}: {counted(c, n, k, whole).replace('in steps', 'in batches')}",
        ]
        replayed = probe.replayed()
        if replayed:
            evidence.append(
                "the resumed batches are ones already trained before the save: "
                + ", ".join(f"batch {a} = batch {b}'s examples" for a, b in replayed[:4])
            )
        evidence.append(
            f"the .ckpt holds {'a' if held else 'no'} dataloader state (its fit loop's 'combined_loader')"
            + (
                ""
                if probe.notes.get("stateful")
                else f": {probe.loader} defines no state_dict() / load_state_dict(), so Lightning cannot save "
                "where the epoch stood"
            )
        )
        if probe.notes.get("stateful"):
            cause = (
                f"the loader's own state_dict() / load_state_dict() ({probe.loader}) does not restore its position: "
                "fit(ckpt_path=...) from the mid-epoch checkpoint loads it, and the resumed epoch still trains some "
                "examples twice and never reaches others"
            )
            fix = (
                "make state_dict() return the loader's position in the epoch (the batches yielded, the sampler's "
                "and its generator's state) and load_state_dict() restore it before the next iteration; or use "
                "torchdata.stateful_dataloader.StatefulDataLoader, whose state Lightning saves and restores"
            )
        else:
            cause = (
                "Lightning restarts a non-resumable loader's epoch from its first batch after a mid-epoch checkpoint "
                f"(yours: {', '.join(mid)}): fit(ckpt_path=...) restores the batch counter and iterates "
                "train_dataloader() anew, so the resumed epoch trains the examples of its first batches again and "
                "never reaches its last ones (Lightning only warns: \"You're resuming from a checkpoint that ended "
                'before the epoch ended and your dataloader is not resumable")'
            )
            fix = LIGHTNING_DATA_FIX
        dlcheck.fail(evidence, cause=cause, fix=fix, repeated=c.repeated, never_seen=c.never)
    if c.same and _alike(dlcheck, probe, f"the mid-epoch save and resume of your train_dataloader() ({probe.loader})"):
        return []
    if c.same:
        return [
            f"data position: {drawn}: the uninterrupted fit's batches, batch by batch (over batches 1-{n}: "
            f"{c.before + c.trained} examples, none trained twice, none lost)"
        ]
    dlcheck.not_judged(
        "data position",
        f"{drawn}: other batches than the uninterrupted fit's, whose examples are not recognised by content "
        f"({c.other} of {c.trained} not among the uninterrupted fit's, none trained twice): not counted",
    )
    return []


def _trainer_counts(run: Any) -> list[str]:
    """A Trainer's resumed run against the uninterrupted one: the examples trained twice and never, by content
    (the steps' recorded example digests), when the resumed steps train other batches."""
    from ...training.resume import count_examples

    last = max((s.step for s in run.resumed.steps), default=run.saved_at)
    base = {s.step: s.examples for s in run.uninterrupted.steps}
    before = [base[t] for t in sorted(base) if t <= run.saved_at and base[t]]
    expected = [base[t] for t in sorted(base) if run.saved_at < t <= last and base[t]]
    resumed = [s.examples for s in run.resumed.steps if s.step > run.saved_at and s.examples]
    if not before or not expected or not resumed:
        return []
    c = count_examples(before, expected, resumed)
    if c.same or not c.conclusive:
        return []
    return [f"over steps 1-{last}: {counted(c, last, run.saved_at, False)}"]


def _curves(dlcheck, run: Any) -> None:
    """The report's picture: the resumed run's losses over the uninterrupted run's, the save marked, and
    the first step where they part (learning rates on the second axis when both runs logged them)."""
    base = {s.step: s for s in run.uninterrupted.steps}
    steps = sorted(base)
    resumed = {s.step: s for s in run.resumed.steps if s.step > run.saved_at}
    if not steps or not any(s.loss is not None for s in base.values()):
        return
    bad = run.mismatch()
    marks = [{"x": run.saved_at + 0.5, "label": "saved"}]
    if bad is not None:
        marks.append({"x": bad[0], "label": f"parts at step {bad[0]}"})
    series2 = {}
    if any(s.lr is not None for s in base.values()):
        series2 = {
            "LR uninterrupted": [base[t].lr for t in steps],
            "LR resumed": [resumed[t].lr if t in resumed else None for t in steps],
        }
    dlcheck.attach(
        "series",
        title="C1: the resumed run over the uninterrupted one",
        x={"uninterrupted": steps, "resumed": steps, **{k: steps for k in series2}},
        series={
            "uninterrupted": [base[t].loss for t in steps],
            "resumed": [resumed[t].loss if t in resumed else None for t in steps],
        },
        series2=series2,
        ylabel="loss",
        ylabel2="learning rate",
        marks=marks,
        caption=f"saved after step {run.saved_at}; "
        + (f"the runs part at step {bad[0]} ({bad[1]})" if bad else "the resumed steps equal the uninterrupted ones"),
    )


def _other_batches(dlcheck, run: Any, how: str, label: str) -> None:
    """When putting every piece back does not make the resumed run identical, but the resumed run trains
    on other batches than the uninterrupted one at the same steps, the data order is what the resume lost
    (a DataLoader's own generator seeded anew at every start replays the first epoch's order; a sampler
    whose epoch is not restored): conclusive, and named."""
    base = {s.step: s.batch for s in run.uninterrupted.steps if s.batch is not None}
    after = [(s.step, s.batch) for s in run.resumed.steps if s.step > run.saved_at and s.batch is not None]
    differ = [(st, b) for st, b in after if st in base and base[st] != b]
    if not after or not differ:
        return
    step = differ[0][0]
    first = {b: st for st, b in sorted(base.items(), reverse=True)}
    replayed = [(st, first[b]) for st, b in after if b in first and first[b] <= run.saved_at]
    evidence = [
        f"{label}, saved after step {run.saved_at} through {how}, "
        f"resumed on fresh objects: from step {step} the resumed run trains on other batches than the "
        f"uninterrupted run ({len(differ)} of {len(after)} resumed steps)",
    ]
    if replayed:
        evidence.append(
            "the resumed run's batches are the ones already trained before the save: "
            + ", ".join(f"step {a} = step {b}'s batch" for a, b in replayed[:4])
        )
    dlcheck.fail(
        evidence,
        cause="the data order is not restored by the resume: "
        + (
            "the resumed epoch replays the first epoch's order (a DataLoader generator or sampler seeded anew at "
            "every start, whose state the checkpoint does not hold)"
            if replayed
            else "the sampler's or its generator's state at the save is not in the checkpoint"
        ),
        fix="derive the shuffling seed from the epoch (DistributedSampler(seed=...) with set_epoch(epoch), or a "
        "generator reseeded with base_seed + epoch in your dataloader), or save the generator's get_state() in "
        "the checkpoint and set_state() it on load",
    )


def _trainer_order(dlcheck, setup: Any, run: Any, how: str, label: str) -> None:
    """When putting every piece back does not make a Trainer's resumed run identical, but the rest of the saved
    epoch trains other examples, or the same in another order, than the uninterrupted run's (by content): the
    resumed epoch's order was drawn anew. The Trainer draws it when it skips the epoch's trained batches, before
    it puts the saved RNG states back, so a sampler that draws its order from the global RNG (group_by_length's
    LengthGroupedSampler) orders a resumed epoch otherwise. Conclusive, and named."""
    epoch = setup.epoch_steps() if hasattr(setup, "epoch_steps") else None
    k = run.saved_at
    if not epoch or k % epoch == 0:
        return
    start, end = k - k % epoch + 1, k - k % epoch + epoch
    base = {s.step: s.examples for s in run.uninterrupted.steps}
    resumed = {s.step: s.examples for s in run.resumed.steps if s.step > k}
    steps = [t for t in range(k + 1, end + 1) if base.get(t) and resumed.get(t)]
    before = [base[t] for t in range(start, k + 1) if base.get(t)]
    if not steps or not before:
        return
    c = count_examples(before, [base[t] for t in steps], [resumed[t] for t in steps])
    if c.same:
        return
    e = k // epoch + 1
    span = f"step {steps[0]}" if len(steps) == 1 else f"steps {steps[0]}-{steps[-1]}"
    where = f"{span}, the rest of epoch {e} of {epoch} optimizer steps"
    evidence = [
        f"{label}, saved after step {k} through {how}, in the middle of epoch {e}; resumed on fresh objects with "
        "every piece of the state put back, the resumed run trains other batches than the uninterrupted run in "
        + where,
        f"over {where}: {counted(c, steps[-1], k, True)}"
        if c.conclusive
        else f"over {where}: the same examples in another order",
        RNG_LINE,
    ]
    dlcheck.fail(
        evidence,
        cause="the resumed epoch's order of examples is drawn anew: the Trainer builds the epoch's order when it skips "
        "the batches trained before the save, before it puts the saved RNG states back, so a sampler that draws its "
        "order from the global RNG without a seed per epoch (group_by_length's LengthGroupedSampler, a sampler of "
        "your own) orders the resumed epoch otherwise than the epoch the save was made in; an epoch-end save hides "
        "it (the RNG states are loaded before the next epoch's order is drawn)",
        fix="draw the sampler's order from a generator seeded with the seed and the epoch (a set_epoch(epoch) that "
        "reseeds it, as accelerate's SeedableRandomSampler does), or checkpoint at epoch ends only "
        "(save_strategy='epoch')",
    )


def _ema_lines(run: Any) -> list[str]:
    """What a passing C1 says of the EMAs it compared at the end of both runs."""
    ends = run.resumed.notes.get("ema") or {}
    lines = []
    for what in run.emas():
        end = next(e for e in ends.values() if e["what"] == what)
        counter = f", {end['counter'][0]} {end['counter'][1]} in both runs" if end["counter"] else ""
        lines.append(
            f"the EMA {what} at the end of the resumed run equals the uninterrupted run's, bitwise "
            f"({len(end['tensors'])} tensors{counter})"
        )
    return lines


def _callback_lines(run: Any) -> list[str]:
    """Which of your Lightning callbacks ran in C1's runs, and which were left out."""
    ran = run.uninterrupted.notes.get("user_callbacks") or []
    left = run.uninterrupted.notes.get("left_out_callbacks") or []
    if not ran and not left:
        return []
    line = f"your callbacks ran in every run: {', '.join(ran)}" if ran else "none of your callbacks ran"
    if left:
        line += f" (left out: {', '.join(left)}: they checkpoint, log or stop, none trains)"
    return [line]


def _ema_what(lost: dict[str, Any]) -> str:
    """The cause's words for an EMA the checkpoint does not restore."""
    counters = lost["counters"]
    restart = (
        f" ({counters[0][0]} {counters[0][1]} after the resume vs {counters[1][1]} uninterrupted)"
        if counters[0] is not None and counters[1] is not None
        else ""
    )
    return (
        f"the EMA {lost['what']}: the resumed run's EMA starts over from a fresh one{restart}, so it averages "
        "other weights than the uninterrupted run's, while the losses and the model's weights match"
    )


def _candidates(setup: Any, pieces: dict[str, str]) -> list[str]:
    return sorted({p for p in pieces if p != "rng"}, key=lambda p: (ORDER.index(p) if p in ORDER else len(ORDER), p))


def resume_run(setup: Any, total: int, restore: frozenset[str], baseline: Any) -> Any:
    """A resumed run: from ``baseline`` (the smoke run that saved for C1) where there is one."""
    return setup.resume(total, restore, baseline) if baseline is not None else setup.resume(total, restore)


def resume_baseline(dlcheck: Any, setup: Any) -> tuple[int, Any, str]:
    """(the steps of the uninterrupted run, the smoke run's baseline or None, the evidence's words for it): the
    shared smoke run is the uninterrupted run when the session makes it anyway and it saved for C1; else C1's
    own run of ``C1.steps`` (C3 resumes the same runs)."""
    total = int(dlcheck.state.setting(load_checks()["C1"], "steps"))
    if total < 2:
        dlcheck.skip("C1.steps must be at least 2")
    smoke = smoke_baseline(dlcheck, setup)
    baseline = smoke.baseline if smoke is not None else None
    if smoke is not None:
        total = smoke.steps
        # where the smoke run saved, moved off the epoch's ends (TrainerSetup.save_point), and why
        setup.__dict__["_resume_lines"] = list(getattr(setup.__dict__.get("_save_point"), "lines", []))
    elif hasattr(setup, "resume_plan"):  # where C1's own run saves (a trainer's generation cycle)
        total, _, setup.__dict__["_resume_lines"], setup.__dict__["_mid_cycle"] = setup.resume_plan(total)
    return total, baseline, f"{total} steps" + (" (the shared smoke run)" if smoke is not None else "")


def run_end(run: Any, total: int) -> int:
    """The last step of a resumed run: ``total``, or past it in a run saved at the user's checkpoint cadence."""
    return max([s.step for s in run.resumed.steps] + [total])


def cadence_words(setup: Any) -> str:
    """`` (the end of epoch 1 of 10 micro-steps, where your loop checkpoints: dlcheck_checkpoint_every = 'epoch')``
    for a run saved at the user's cadence; empty otherwise."""
    every = getattr(setup, "checkpoint_every", MISSING)
    if every is MISSING or setup.kind not in ("loop", "accelerate"):
        return ""
    judged_at = setup.__dict__.get("_judged_at")
    if judged_at and every != "epoch":  # N optimizer steps past reach: saved at a reachable step, said so
        return f" ({judged_at})"
    where = "at an epoch's end" if every == "epoch" else f"after an optimizer step that is a multiple of {every}"
    counted = setup.__dict__.get("_epoch_counted") if every == "epoch" else ""
    return f" ({where}{f': {counted}' if counted else ''}, where your loop checkpoints: dlcheck_checkpoint_every = {every!r})"


def _plan_lines(setup: Any) -> list[str]:
    """Why C1's own run saved where it did (a trainer's generation cycle), for the evidence."""
    return list(setup.__dict__.get("_resume_lines", []))


def shared_resume(dlcheck: Any, setup: Any, total: int, restore: frozenset[str], baseline: Any) -> ResumeRun:
    """A resumed run C1 and C3 share (made once per session): ``restore`` names what is put back from the
    uninterrupted run after the resume's own loading."""
    key = f"resume:{total}:{'+'.join(sorted(restore))}"
    return memo_or_skip(dlcheck, setup.sources, key, lambda: resume_run(setup, total, restore, baseline))


def how_saved(setup: Any, run: ResumeRun) -> str:
    return {
        "trainer": f"the Trainer's {run.checkpoint.name} directory and train(resume_from_checkpoint=...)",
        "lightning": f"ModelCheckpoint's {run.checkpoint.name} and fit(ckpt_path=...)",
        "loop": "dlcheck_save_checkpoint / dlcheck_load_checkpoint",
        "accelerate": getattr(setup, "checkpoint_how", lambda: "")(),
    }[setup.kind]


def compared(run: ResumeRun, reference: Any = None) -> list[str]:
    """What the resumed steps were compared on (losses, learning rates, weights, EMA)."""
    base = {s.step: s for s in (reference or run.uninterrupted).steps}
    after = [s for s in run.resumed.steps if s.step > run.saved_at]
    return [
        what
        for what, ok in (
            ("losses", any(s.loss is not None and base.get(s.step) and base[s.step].loss is not None for s in after)),
            (
                "learning rates",
                any(s.lr is not None and base.get(s.step) and base[s.step].lr is not None for s in after),
            ),
            ("weights", any(st > run.saved_at for st, _ in run.resumed.digests)),
            ("EMA", bool(run.emas())),
            ("GradScaler", bool(run.resumed.notes.get("scalers")) and bool(run.uninterrupted.notes.get("scalers"))),
        )
        if ok
    ]


def release_after(dlcheck: Any, setup: Any, cid: str) -> None:
    """Once every selected check of C1 and C3 is decided, the uninterrupted run's saved state (model and
    optimizer copies, which serve the diagnostic resumes only) is freed: at most one extra copy of the
    trainable state is held across checks."""
    done = setup.__dict__.setdefault("_resume_checks_done", set())
    done.add(cid)
    if not {c.id for c in dlcheck.state.selected} & set(RESUME_CHECKS) <= done:
        return
    setup.__dict__.pop("_baselines", None)
    smoke = smoke_baseline(dlcheck, setup, make_it=False)
    if smoke is not None:  # the smoke run's part as C1's baseline: its EMA copies at the end
        smoke.trajectory.notes.pop("ema", None)
        smoke.baseline = None


def _diagnose(
    dlcheck, setup, total: int, candidates: list[str], suspects: list[str], baseline: Any = None
) -> tuple[list[str] | None, int, dict[frozenset[str], Any]]:
    """The smallest set of pieces that, put back from the uninterrupted run after the user's own loading
    (with the RNG states: C3's, put back in every run), makes the resumed run identical. When the checkpoint
    visibly lacks some pieces (``suspects``), they are put back together and then dropped one at a time;
    otherwise each piece is tried alone, then cumulatively (then pruned one at a time). Also returns, per set
    tried, where the resumed run still parted (None where it did not)."""
    runs = 0
    tried: dict[frozenset[str], Any] = {}

    def matches(pieces: list[str]) -> bool:
        nonlocal runs
        key = frozenset(pieces)
        if key not in tried:
            runs += 1
            tried[key] = run_or_skip(dlcheck, lambda: resume_run(setup, total, key | {"rng"}, baseline)).mismatch()
        return tried[key] is None

    def prune(chosen: list[str]) -> list[str]:
        for p in list(chosen):
            rest = [x for x in chosen if x != p]
            if rest and matches(rest):
                chosen = rest
        return chosen

    if suspects and matches(suspects):
        return prune(list(suspects)), runs, tried
    for piece in candidates:
        if matches([piece]):
            return [piece], runs, tried
    chosen: list[str] = []
    for piece in candidates:
        chosen.append(piece)
        if len(chosen) > 1 and matches(chosen):
            return prune(chosen), runs, tried
    return None, runs, tried


def _lr_after_load(run: Any, missing: list[str]) -> tuple[list[str], list[str], str, str] | None:
    """When the pieces the diagnosis names among the optimizer and the LR scheduler were saved and loaded (right
    after the user's load the optimizer's per-parameter state equals the saved one, the scheduler's state is the
    saved one or was moved off it, never left fresh) and what differs is the learning rate the resume leaves (the
    optimizer's param_groups, the scheduler's position): (the pieces so explained, evidence lines, cause, fix).
    None when a piece was not loaded, or when what the load restored cannot be told (nothing per parameter saved)."""
    loaded = run.resumed.notes.get("after_load") or {}
    named = [p for p in missing if p in ("optimizer", "lr_scheduler")]
    if not named or any(p not in loaded for p in named):
        return None
    opt, sched = loaded.get("optimizer"), loaded.get("lr_scheduler")
    if opt is None or not opt.moments:
        return None  # the optimizer's moments were not put back by the load (or nothing per parameter to tell by)
    if sched is not None and not sched.restored and sched.untouched:
        return None  # the scheduler was left as a fresh one: not loaded
    if not opt.groups and (sched is None or sched.restored):
        return None  # nothing the load left differs from the save: not the LR
    opt_line = (
        f"right after your load, state['optimizer'] ({opt.kind})'s per-parameter state ({opt.tensors} tensors: "
        "moments, step counts) equals the saved one"
        + (f", but its param_groups differ: {'; '.join(opt.groups[:3])}" if opt.groups else "")
    )
    lines = [opt_line]
    if sched is not None:
        lines.append(
            f"state['lr_scheduler'] ({sched.kind})'s state equals the saved one"
            if sched.restored
            else f"state['lr_scheduler'] ({sched.kind}) was loaded and then moved off the saved state: "
            f"{sched.difference}"
        )
    lr = next((g for g in opt.groups if "'lr'" in g), None)
    cause = (
        "the checkpoint saves and loads "
        + ("the optimizer and the LR scheduler" if sched is not None else "the optimizer")
        + ", but the learning rate your resume leaves in the optimizer is not the one at the save"
        + (f" ({lr.split(' ', 1)[1]})" if lr else "")
        + ": after loading, the resume moves the LR scheduler (a scheduler.step(epoch) call whose epoch is one off "
        "from the one your loop passes it, or a step() too many), so the resumed steps train at the learning rate of "
        "another step than the uninterrupted run's at the same step"
    )
    fix = (
        "leave the learning rate where the save left it: do not step the scheduler in the resume (the loaded "
        "optimizer state already holds the LR of the save, a loaded torch scheduler its position), or step it with "
        "the value your loop passed it right before the save (a loop that calls scheduler.step(epoch) after training "
        "epoch `epoch` resumes with step(start_epoch - 1); timm's train.py steps step(epoch + 1) in its loop and "
        "step(start_epoch) in its resume, which agree)"
    )
    return named, lines, cause, fix


def _fix(setup: Any, missing: list[str], run: Any = None) -> str:
    if setup.kind == "trainer":
        args = setup.trainer.args
        parts = []
        if getattr(args, "save_only_model", False) and set(missing) & {"optimizer", "lr_scheduler", "scaler"}:
            parts.append(
                "drop save_only_model=True from the training arguments: it saves the weights only, and "
                "resume_from_checkpoint needs optimizer.pt, scheduler.pt and rng_state.pth"
            )
        if getattr(args, "ignore_data_skip", False) and "data position" in missing:
            parts.append("set ignore_data_skip=False so resume_from_checkpoint skips the batches already trained on")
        if not parts:
            parts.append(
                "let the Trainer save and load every piece (a custom _save_checkpoint/_load_* override or a "
                "callback holding state must save it too: make such a callback an ExportableState)"
            )
        return "; ".join(parts)
    if setup.kind == "lightning":
        parts = []
        if "hand-stepped scheduler" in missing:
            parts.append(
                'return the scheduler from configure_optimizers: {"optimizer": opt, "lr_scheduler": {"scheduler": '
                'sched, "interval": "step"}} (Lightning then steps, saves and restores it), or save and restore it '
                'yourself: checkpoint["lr_scheduler"] = sched.state_dict() in on_save_checkpoint, '
                "sched.load_state_dict(...) from on_load_checkpoint's checkpoint once the scheduler exists"
            )
        if set(missing) & {"optimizer", "lr_scheduler"}:
            parts.append(
                "return the optimizer and the scheduler from configure_optimizers (a scheduler stepped by hand is "
                "not saved) and do not checkpoint with save_weights_only=True"
            )
        if "model" in missing:
            parts.append("keep every trained tensor registered (a Parameter or buffer) so it lands in state_dict")
        if "module attributes" in missing and run is not None:
            parts.append(
                f"save {_attributes(run)} in the module's on_save_checkpoint(checkpoint) (checkpoint['...'] = a "
                "copy, or their state) and set them back in on_load_checkpoint(checkpoint), which fit(ckpt_path=...) "
                "calls before the training starts and before train_dataloader() builds its loader (a loader over a replay "
                "buffer then reads the restored buffer)"
            )
        held = (run.uninterrupted.notes.get("callbacks") or {}) if run is not None else {}
        lost = [d["name"] for d in run.ema_mismatch()] if run is not None else []
        for piece in (p for p in missing if p.startswith("callback ")):
            label = piece.removeprefix("callback ")
            attrs = ", ".join(f"self.{a}" for a in held.get(label, {}).get("changed", [])[:4]) or "its state"
            ema = any(name.startswith(piece + ".") for name in lost)
            parts.append(
                f"give your callback {label.split('#')[0]} state_dict() returning {attrs}"
                + (" (the EMA module's state_dict(), not the module)" if ema else "")
                + " and load_state_dict() putting "
                + ("it back into the EMA once the callback has built it" if ema else "them back")
                + ": Lightning saves a callback's state_dict() in the .ckpt and hands it back on fit(ckpt_path=...)"
                + (" (or use Lightning's EMAWeightAveraging callback, which saves its average)" if ema else "")
            )
        return "; ".join(parts) or "save and restore every piece of the training state in the checkpoint"
    if setup.kind == "accelerate" and setup.checkpoint_how().startswith("accelerator."):
        pieces = [p for p in missing if p != "data position"]
        if pieces:
            return "accelerator.save_state saves only what accelerator.prepare() returned and what " + (
                "accelerator.register_for_checkpointing() registered: "
                + "; ".join(
                    f"prepare the scheduler (state['{p}'] = accelerator.prepare(state['{p}']))"
                    if "sched" in p
                    else f"accelerator.register_for_checkpointing(state['{p}'])"
                    for p in pieces
                )
            )
        return "save and restore every piece of the training state with save_state / load_state"
    saves = [p for p in missing if p != "data position"]
    if saves:
        return (
            "in dlcheck_save_checkpoint save "
            + ", ".join(f"state['{p}'].state_dict()" for p in saves)
            + ", and load_state_dict them in dlcheck_load_checkpoint"
        )
    return "save the data position (the step, the sampler's epoch) and restore it in dlcheck_load_checkpoint"


@check(
    "C1",
    domain="ckpt",
    title="resuming from a checkpoint does not continue the same run",
    roles=(),
    optional_roles=(
        "trainer",
        "lightning_module",
        "datamodule",
        "make_training",
        "save_checkpoint",
        "load_checkpoint",
        "dataloader",
        "resume_dataloader",
        "checkpoint_every",
        "start_epoch",
    ),
    settings=(
        Setting(
            "steps",
            4,
            "steps of the uninterrupted run (calls of dlcheck_train_step for a plain loop); the checkpoint "
            "is saved half way (after an "
            "optimizer step, at an epoch boundary for Lightning, and in the middle of an epoch of that many batches "
            "for Lightning's data position) and the resumed run continues to the end; "
            "when the shared smoke run is the uninterrupted run, it saves steps // 2 steps before its end "
            "(C3 resumes the same runs)",
        ),
    ),
)
def check_resume(dlcheck):
    """A run resumed from a checkpoint continues exactly as the uninterrupted run does.

    What it does
        Runs your training for ``steps`` optimizer steps on fresh objects, saving half way through your own
        checkpoint path: the Trainer's ``checkpoint-*`` directory, Lightning's ``ModelCheckpoint`` .ckpt, or
        your ``dlcheck_save_checkpoint``. Then builds fresh objects again (a new Trainer clone, a new module
        copy, a new ``dlcheck_make_training()``, with the global RNGs elsewhere, as in a new process),
        resumes (``train(resume_from_checkpoint=...)``, ``fit(ckpt_path=...)``, your
        ``dlcheck_load_checkpoint``), puts the RNG states back from the uninterrupted run at the save (whether
        your resume restores them is C3's question: here random draws alone never fail) and continues. The
        losses, learning rates and weights of the resumed steps must equal the uninterrupted run's, bitwise (on
        CPU); for a plain loop, so must every EMA in the state (an AveragedModel with its ``n_averaged``, an
        EMAModel's shadow params and ``optimization_step``) and every enabled ``torch.amp.GradScaler``
        (``state['scaler']``, an Accelerator's ``scaler``: its scale and growth tracker, which a resume with a fresh
        scaler restarts while the losses match as long as the scale has not moved) at the end of both runs, and
        for Lightning every EMA
        your Trainer's callbacks keep (``dlcheck_lightning_callbacks``, or the callbacks of your lightning
        Trainer given as ``dlcheck_trainer``: every Lightning run includes them). On a mismatch, the pieces
        of the state (optimizer, LR scheduler, GradScaler, dataloader position, EMA, weights, each Lightning
        callback whose attributes changed in training, and a LightningModule's own attributes outside its
        state_dict that training changed: a replay buffer, an agent, counters) are put back one at a time from the uninterrupted run
        after your own loading, and the check names the piece(s) that make the runs identical. It names a piece
        "not restored" only when the checkpoint lacks it: for a plain or Accelerate loop the optimizer and the LR
        scheduler are read right after your load against their states at the save; when the optimizer's
        per-parameter state (moments, step counts) and the scheduler's state came back, yet the learning rate in
        the optimizer's param_groups differs from the save's (a resume that steps the scheduler after loading it,
        ``scheduler.step(epoch)`` one epoch off from your loop's own call), the failure says so, with a fix that
        leaves the LR where the save left it (an optimizer with nothing per parameter, plain SGD, cannot be told
        apart so: its cause stays "not restored"). When no piece put back makes the runs identical, the uninterrupted run is run a second time the same way: if the
        two agree, the run is reproducible and the resume is broken (the check fails, saying where the runs
        part and what putting every piece back could not repair); only if they differ is the run not
        reproducible. What your load's ``load_state_dict`` leaves missing or unexpected (a strict=False load)
        and PEFT's "missing adapter keys" are shown as evidence. When the session runs the shared smoke run
        anyway (S1, S2 or S3 selected), that run is the uninterrupted one: it saves ``steps // 2`` optimizer
        steps before its end (``S1.steps``) and C1 trains only the resumed steps (a Lightning fit runs its own
        two epochs). When the resume's own loading raises on the checkpoint the pipeline's own save wrote (your
        load, ``fit(ckpt_path=...)`` or ``train(resume_from_checkpoint=...)`` on fresh objects), no checkpoint the
        pipeline writes can be resumed: the check fails with the exception as evidence, and a class that
        ``torch.load(weights_only=True)`` refuses is named with where the checkpoint holds it.
        The data position: when the ``dlcheck_make_training`` dict of a plain or Accelerate loop holds its
        training DataLoader (``state['dataloader']``, ``state['train_dataloader']``, or the only one), fresh
        objects train ``steps`` steps drawn from it, saved half way through your save, and other fresh objects
        loaded by your load draw the rest of the epoch from their own ``state['dataloader']`` as your load
        leaves it (``accelerator.skip_first_batches(...)``, ``itertools.islice``, a restored stateful loader),
        or, with ``dlcheck_resume_dataloader`` (state, dataloader, resumed_step), from what that returns: what
        your epoch loop trains on after a resume (``accelerator.skip_first_batches(dataloader, resumed_step)``
        in the loop, as transformers' ``run_clm_no_trainer.py`` does, or ``dataloader`` itself when the loop
        starts the epoch again); ``resumed_step`` is the number of the epoch's batches trained before the save.
        The data position is judged only on that data path of yours: when your load leaves the loader untouched
        (neither replaced nor its state loaded) and no ``dlcheck_resume_dataloader`` says what your loop does,
        or when the load is dlcheck's own default (``accelerator.load_state``, no ``dlcheck_load_checkpoint``),
        the pass says the data position was not judged and why. The examples are told apart by content (a digest per example row, the padding trimmed; a map-style
        dataset read in the process is read with the RNGs seeded by the example's index, so that a random
        augmentation does not hide an example); when the epoch is longer than ``steps`` (up to 256 batches), both
        runs draw on to its end without training, so that every example of the epoch is known and a resumed
        epoch that starts again on another shuffle is counted too. The check fails when the resumed epoch trains
        examples twice or never, with the counts and the fix for that kind of user. A Trainer's resume is its own
        (``ignore_data_skip``): its failure counts the same from the examples each step trained. Lightning's resume
        above is at an epoch boundary, where Lightning starts every loader's epoch anew. When your Trainer
        (``dlcheck_trainer``, or the checkpoint callbacks among ``dlcheck_lightning_callbacks``) writes checkpoints
        in the middle of an epoch — ``ModelCheckpoint(every_n_train_steps=...)`` or ``train_time_interval``, a
        ModelCheckpoint saving at every validation with ``val_check_interval`` < 1, ``OnExceptionCheckpoint``, a
        SLURM requeue (``SLURMEnvironment(auto_requeue=True)``) — and the epoch-boundary resume is exact, the data
        position is judged across a mid-epoch checkpoint with two more fits of fresh copies: one epoch of
        ``steps`` batches of your datamodule's ``train_dataloader()``, ``trainer.save_checkpoint`` after the first
        optimizer step at or past half way, then ``fit(ckpt_path=...)`` from it to the epoch's end, each fit
        recording the examples of every batch it trains. Lightning saves and restores a loader's position only
        through its ``state_dict()`` / ``load_state_dict()`` (torchdata's ``StatefulDataLoader``): it iterates a
        plain ``DataLoader`` anew while its batch counter goes on, and the check fails with the examples trained
        twice and never seen. A Trainer that checkpoints at epoch ends only is not concerned (said, no fit run);
        without the Trainer or its checkpoint callbacks, the data position is said not judged.
        A plain or Accelerate loop says where it saves with ``dlcheck_checkpoint_every``: ``"epoch"`` (a save only
        at epoch ends, the resume starting the next epoch: mae's ``main_pretrain.py``, pytorch/examples' imagenet
        and DDP tutorial, torchvision's references, ``--checkpointing_steps epoch``) or N (every N optimizer
        steps). C1 (and C3, which resumes the same runs, and D5's data position) then saves right after the last
        micro-step of the first epoch of ``len(training loader)`` micro-steps, or after the first optimizer step
        that is a multiple of N, at or past half way (else the first such point), and trains ``steps - steps // 2``
        micro-steps more; in the data-position runs ``dlcheck_start_epoch`` is called at the top of every epoch,
        and after the load the next epoch is drawn from what ``dlcheck_resume_dataloader`` returns (given
        ``resumed_step=0``; it sees your own epoch counter as your load left it) or from the loader as your load
        leaves it. A resume that starts the saved epoch again trains its batches a second time and fails with
        the counts. The save point is looked for within ``max(2 x steps, 64)`` micro-steps. A
        loader without a length (a sampler without ``__len__``) has its epoch counted by iterating its batch
        sampler once from two RNG states, no data loaded; an epoch longer than the bound, or whose length differs
        between the two counts, leaves the resume not judged at your cadence (the check skips, saying why). A
        cadence of N optimizer steps past the bound (minGPT's every 500 iterations, diffusers'
        ``checkpointing_steps=500``) is judged at a reachable step instead: what a resume loses (optimizer
        moments, scheduler, RNG states, the position within an epoch) does not depend on which mid-run step the
        save is at, so the run saves half way, with your own save and load, your step counters holding the step
        they hold there (a resume that computes its position from the step gets that step); the pass or failure
        says "judged at optimizer step s, not at your cadence". Not judged there: what your code does only at
        multiples of N (a save that decides by your step counter writes nothing when dlcheck calls it: the check
        skips, saying so), and whether N happens to be a multiple of your real epoch's optimizer steps (a save
        every N steps then lands at epoch ends, where an epoch started again loses nothing). Without the role, a plain or
        Accelerate loop is saved half way, in the middle of an epoch, and a data-position failure names the role.
        A transformers Trainer's save is moved off the epoch's ends (an epoch of ``ceil(batches / gradient
        accumulation)`` optimizer steps, counted from the length of its train dataset): to the step nearest the
        planned one that is in the middle of an epoch after the first when the run reaches one, else in the middle
        of the first; the pass says where. At an epoch end the Trainer loads the saved RNG states before it draws
        the next epoch's order; in the middle of one it draws the order first (when it skips the trained batches),
        so a sampler that draws its order from the global RNG (``group_by_length``'s ``LengthGroupedSampler``)
        trains other examples after a mid-epoch resume, and the first epoch's order, drawn right after the
        Trainer's seeding, often comes back alike. When putting every piece back leaves the resumed run other, and
        the rest of the saved epoch trains other examples (or the same in another order) by content, the check fails
        on the epoch's order. With ``save_strategy='epoch'`` it saves at the epoch end nearest the planned step. When
        every save falls at an epoch end (an epoch of one optimizer step, ``save_strategy='epoch'``,
        ``dlcheck_checkpoint_every = 'epoch'``), the pass says the mid-epoch resume was not judged.
    Why it is bad
        A resume that restores the weights only is a different run: Adam restarts with zero moments (a
        jolt of large updates), the LR schedule starts over (warmup again, or no decay), an EMA starts anew.
        Preemptible and time-limited jobs resume dozens of times, and the final model is not the one the
        recipe describes. A resume that loses the data position trains the examples before the save a second
        time and never reaches as many others before the run's planned steps end.
    Example
        TrainingArguments(..., save_only_model=True)                  # weights only
        torch.save({"model": ..., "optimizer": ..., "lr_scheduler": ...}, path)   # state["ema"] left out
        torch.save({"model": model.state_dict(), "optimizer": opt.state_dict()}, path)   # no scheduler
        lr = base_lr * warmup(state["step"])   # a counter the checkpoint does not hold: restarts at 0
        class EMA(L.Callback): ...             # keeps self.ema, defines no state_dict(): a resumed fit starts it anew
        model.load_state_dict(torch.load(path)["model"], strict=False)   # "module."-prefixed keys: nothing loads
        SFTTrainer(model=llava, ...).train(resume_from_checkpoint=...)   # transformers 5: no weight restored
        torch.save({..., "args": args}, path); torch.load(path)   # torchvision references: torch >= 2.6 refuses
                                                                  # the argparse.Namespace (weights_only=True)
        accelerator.load_state(path)   # then `for batch in train_dataloader`: the epoch starts again
        def train_dataloader(self): return DataLoader(ds, shuffle=True)   # Lightning, with
        ModelCheckpoint(every_n_train_steps=500)   # or a SLURM requeue: the resumed epoch starts again
        TrainingArguments(..., ignore_data_skip=True)                 # the resumed epoch from its first batch
        TrainingArguments(..., train_sampling_strategy="group_by_length")   # a mid-epoch resume reorders the epoch
    Use instead
        save and load the optimizer, the scheduler, the GradScaler, every counter your loop reads, and the
        step: the Trainer does it unless save_only_model=True; Lightning does it for what configure_optimizers
        returns, and for a callback through its state_dict() / load_state_dict(). Load weights with
        strict=True. For a model whose checkpoint names are converted (LLaVA and
        other VLMs in transformers 5), load the weights through from_pretrained in a Trainer subclass's
        _load_from_checkpoint.
        Load a checkpoint you wrote yourself with torch.load(path, weights_only=False) (Lightning:
        fit(..., weights_only=False)), or save plain types (vars(args)), or add_safe_globals([...]) the class.
        Resume mid-epoch where the save left the data: a stateful dataloader, or the step saved and the
        epoch's trained batches skipped with the same shuffle (``accelerator.skip_first_batches`` with
        ``use_seedable_sampler=True``; a DataLoader generator seeded per epoch); the Trainer's default
        ``ignore_data_skip=False``; for Lightning, ``torchdata.stateful_dataloader.StatefulDataLoader`` from
        ``train_dataloader()`` (or a loader with ``state_dict`` / ``load_state_dict``), or checkpoints at epoch
        ends only.
    Known problems
        Compares bitwise: on GPU, nondeterministic kernels can make even the uninterrupted run differ from
        itself; the check then skips (not reproducible). A resume that loses only the RNG states passes here and
        fails C3. A GradScaler's own state is compared for a plain or Accelerate loop only (a Trainer's or a
        Lightning precision plugin's scaler is not read yet: there only a scale that moved shows, in the losses).
        For a plain or Accelerate loop whose ``dlcheck_make_training`` dict holds no torch DataLoader (none, or
        a loader of its own kind: a generator, an iterable class), the data position is not judged (a partly
        judged pass that says so and names what the dict holds: dlcheck feeds the runs its own batches), nor when the
        skip happens in your epoch loop and no ``dlcheck_resume_dataloader`` hands it over; the losses and
        weights are always compared on dlcheck's batches, the data position on the loader's. Examples are told
        apart by content: identical examples count as one multiset; examples whose content changes from draw to
        draw (an augmentation drawn in spawned DataLoader workers or by an iterable dataset) are not recognised,
        and the data position is then not judged; a masked LM's examples are recognised by the tokens their
        labels restore (``where(labels != -100, labels, input_ids)``), whatever positions the collator masks at
        each draw, and so are a permutation LM's (DataCollatorForPermutationLanguageModeling), whose perm_mask and
        target_mapping, drawn with its spans, are left out of what an example is: a collator's new masks are no
        reordering (a resume whose masks differ is judged by its losses and weights, not as a data position); over a window shorter than an epoch (an epoch of more than 256 batches, whose rest is not
        drawn), "never seen" means not trained in the compared steps.
        Lightning's optimizer, scheduler, callbacks and EMAs are compared across an epoch boundary; its data
        position across a mid-epoch checkpoint only once those resume exactly (two more fits of up to ``steps``
        batches), and only when your checkpoint settings are visible: a ``trainer.save_checkpoint`` of your own
        inside the epoch is not seen. Both fits start the epoch from the same RNG states, so a loader whose epoch
        starts again replays the same order (a real resumed process draws another one, which changes the counts,
        not the finding); batches without a tensor with a batch dimension (python lists) leave the data position
        not judged, said so. With torchdata 0.11, Lightning 2.6 resumes a shuffling ``StatefulDataLoader`` from an
        epoch-end checkpoint with the first epoch's order again: the epoch-boundary resume fails on it (the
        resumed run trains other batches than the uninterrupted one), before the data position is judged. EMAs are compared
        for a plain loop (entries of the dlcheck_make_training dict) and in Lightning callbacks, not for a
        transformers Trainer's callbacks or a LightningModule's attributes. A Lightning callback's attributes are
        put back as they stood at the save (copies; its references to the Trainer and the module are left).
        Lightning's own checkpointing, logging, progress, early-stopping and tuning callbacks are left out of
        the runs (they write into your folders or need a logger or validation the runs do not have).
        A Trainer that keeps the completions it generated in a buffer across a cycle of steps (TRL's GRPOTrainer
        and RLOOTrainer with ``steps_per_generation`` × ``num_iterations`` more than the gradient accumulation: the
        checkpoint does not hold the buffer) is saved where your own cadence saves in that cycle: at a cycle
        boundary when ``save_steps`` is a multiple of the cycle (or ``save_strategy`` is not "steps"), at the
        same place inside the cycle when it is not (the check then fails as your resumes do); the run is then
        longer than ``steps`` by up to a cycle.
        A Trainer's epoch is counted from its train dataset's length in one process (a Trainer subclass whose
        ``get_train_dataloader`` batches otherwise is not seen; an IterableDataset leaves the save where planned).
        A run too short to reach a later epoch (an epoch longer than the run) saves in the first one, said in the
        pass: a sampler whose first epoch's order comes back after a seeded start is then not caught. A save every
        N steps that is a multiple of your real epoch's steps is not recognised (the tiny data's epoch is not your
        data's), and Lightning is saved as above. A plain or Accelerate loop that hands over
        ``dlcheck_save_checkpoint`` and no ``dlcheck_load_checkpoint`` (a script that writes its weights and never
        resumes) is not resumed: the check names the missing load. dlcheck pairs Accelerate's ``save_state`` /
        ``load_state`` only with each other or with your own load: never its ``load_state`` with your save, whose
        files it may not read.
    Not applicable
        None: every run that saves checkpoints may be resumed from one.
    """
    setup = get_setup(dlcheck)
    try:
        _resume_verdict(dlcheck, setup)
    finally:
        release_after(dlcheck, setup, "C1")


RNG_LINE = (
    "the RNG states are put back from the uninterrupted run at the save in every resumed run of C1 (whether your "
    "resume restores them is C3's finding)"
)


def _resume_verdict(dlcheck: Any, setup: Any) -> None:
    # the shared smoke run, when the session makes it anyway, is the uninterrupted run: it saved for C1
    # C1.steps // 2 steps before its end, and only the resumed steps are C1's own
    total, baseline, label = resume_baseline(dlcheck, setup)
    try:
        run = shared_resume(dlcheck, setup, total, frozenset({"rng"}), baseline)
    except ResumeLoadFailed as exc:
        # a run lengthened to where the loop checkpoints (dlcheck_checkpoint_every) saved past the planned steps
        _load_raises(dlcheck, setup, exc, label if exc.saved_at < total else "the run")
    _curves(dlcheck, run)
    how = how_saved(setup, run)
    loaded_by = setup.loaded_by() if setup.kind == "accelerate" else LOADED_BY.get(setup.kind, "the resume")
    # Lightning's resume above is at an epoch boundary: the mid-epoch data position is judged once it resumes
    # exactly (its own two fits), so that what it finds there is said as before
    data_lines = data_verdict(dlcheck, setup, how, loaded_by) if setup.kind != "lightning" else None
    bad = run.mismatch()
    if bad is None:
        if data_lines is None:
            data_lines = data_verdict(dlcheck, setup, how, loaded_by)
        after = [s for s in run.resumed.steps if s.step > run.saved_at]
        losses = ", ".join(f"step {s.step}: {s.loss:.6g}" for s in after[:4] if s.loss is not None)
        what = compared(run)
        emas = _ema_lines(run) + _callback_lines(run)
        end = run_end(run, total)
        if end != total:  # a run as long as the user's checkpoint cadence needs (dlcheck_checkpoint_every)
            label = f"{end} steps"
        dlcheck.measured(
            f"{label}, saved after step {run.saved_at}{cadence_words(setup)} through {how}, resumed on fresh "
            f"objects: the {', '.join(what) or 'steps'} of steps {run.saved_at + 1}-{end} equal the uninterrupted "
            "run's, bitwise",
            *([f"resumed losses: {losses}"] if losses else []),
            *emas,
            *data_lines,
            *_plan_lines(setup),
            RNG_LINE,
            steps=total,
            saved_at=run.saved_at,
            resumed_steps=len(after),
        )
        point = setup.__dict__.get("_save_point")
        if point is not None and point.unjudged and point.at == run.saved_at:  # every save at an epoch end
            dlcheck.not_judged(MID_EPOCH, point.unjudged)
        elif setup.kind in ("loop", "accelerate") and getattr(setup, "checkpoint_every", MISSING) == "epoch":
            dlcheck.not_judged(
                MID_EPOCH,
                "your loop checkpoints at epoch ends only (dlcheck_checkpoint_every = 'epoch'), so the resume was "
                "made there; a resume in the middle of an epoch is not made",
            )
        return
    step, what = bad
    candidates = _candidates(setup, run.pieces)
    suspects = [p for p in candidates if p in run.pieces and not run.pieces[p]] if setup.kind == "trainer" else []
    missing, runs, tried = _diagnose(dlcheck, setup, total, candidates, suspects, baseline)
    if missing is None:
        _other_batches(dlcheck, run, how, label)
        if setup.kind == "trainer":
            _trainer_order(dlcheck, setup, run, how, label)
        _broken_resume(dlcheck, setup, run, total, label, how, candidates, runs, tried, baseline)
    if run_end(run, total) != total:  # a run as long as the user's checkpoint cadence needs
        label = f"{run_end(run, total)} steps"
    evidence = _parting(run, label, how, step, what, setup.kind == "trainer", cadence_words(setup))
    evidence.append(
        f"putting back {' + '.join(missing)} from the uninterrupted run after the load makes the resumed run "
        f"identical ({runs} diagnostic resumes)"
    )
    evidence.append(RNG_LINE)
    evidence.extend(_plan_lines(setup))
    if "data position" in missing:
        evidence[2:2] = _trainer_counts(run)
    lost_emas = {d["name"]: d for d in run.ema_mismatch()}
    if lost_emas and bad[1] == next(iter(lost_emas.values()))["text"]:
        evidence.insert(
            2,
            "the losses and the model's weights of the resumed steps match: the EMA does not feed the loss, only "
            "its own tensors show what the resume lost",
        )
    # the optimizer and the scheduler saved and loaded, the LR the resume leaves differing: not "not restored"
    lr_moved = _lr_after_load(run, missing) if setup.kind in ("loop", "accelerate") else None
    unrestored = [p for p in missing if lr_moved is None or p not in lr_moved[0]]
    cause = (
        "the checkpoint does not restore "
        + "; nor ".join(
            _ema_what(lost_emas[p])
            if p in lost_emas
            else _callback_what(run, p, lost_emas)
            if p.startswith("callback ")
            else _hand_what(run)
            if p == "hand-stepped scheduler"
            else _attributes_what(run)
            if p == "module attributes"
            else WHAT.get(p, f"state['{p}']")
            for p in unrestored
        )
        if unrestored
        else ""
    )
    fix = _fix(setup, unrestored, run) if unrestored else ""
    if lr_moved is not None:
        named, lr_lines, lr_cause, lr_fix = lr_moved
        at = next(i for i, line in enumerate(evidence) if line.startswith("putting back "))
        if "optimizer" in named:
            evidence[at] += ": the optimizer's param_groups carry the learning rate"
        evidence[at + 1 : at + 1] = lr_lines
        cause = lr_cause + (f"; and {cause}" if cause else "")
        fix = lr_fix + (f"; {fix}" if fix else "")
    if "model" in missing and run.loads:
        evidence.extend(f"your load reported: {line}" for line in run.loads)
    if "model" in missing and keys_mismatch(run.loads):
        cause = cause.replace(
            WHAT["model"],
            "the model weights: the load's load_state_dict finds other keys in what it loads than the model's "
            "(see its report), and a strict=False load skips them without a word",
        )
        rest = [p for p in missing if p != "model"]
        fix = _keys_fix(run.loads) + ("; " + _fix(setup, rest) if rest else "")
    if "model" in missing and setup.kind in ("loop", "accelerate") and _is_peft(dlcheck, setup):
        cause += (
            " (a PEFT model: the adapter being trained does not get the saved adapter weights back — "
            "load_adapter(path, adapter_name=...) adds a second adapter beside it without activating it, and "
            "PeftModel.from_pretrained loads it frozen unless is_trainable=True)"
        )
        fix = (
            "load the saved adapter into the adapter you train: set_peft_model_state_dict(state['model'], "
            "load_file(f'{path}/adapter_model.safetensors')) (or load_adapter(path, adapter_name='default', "
            "is_trainable=True), or set_adapter(name) after loading under another name); " + fix
        )
    if set(missing) & set(lost_emas):
        fix += (
            " (an AveragedModel's state_dict holds its averaged weights and n_averaged; a diffusers EMAModel's its "
            "shadow_params and optimization_step)"
        )
    renamed = _renamed_weights(setup, run.checkpoint) if setup.kind == "trainer" and "model" in missing else None
    if renamed:
        n_saved, n_foreign, saved_name, own_name = renamed
        evidence.append(
            f"{n_foreign} of the {n_saved} tensor names in {run.checkpoint.name}'s weights file are not the "
            f"model's: e.g. {saved_name!r}" + (f" where the model has {own_name!r}" if own_name else "")
        )
        cause = (
            "save_pretrained wrote the weights under the checkpoint's original (converted-back) names, and "
            "Trainer._load_from_checkpoint loads them with load_state_dict(strict=False), which skips every "
            "name it does not know: the resumed run trains on from its fresh initial weights, with only a logged "
            "warning (transformers issues #40187, #43701: models with a checkpoint conversion mapping, such as "
            "LLaVA and other VLMs)"
        )
        fix = (
            "load through the conversion in a Trainer subclass: def _load_from_checkpoint(self, checkpoint, model=None): "
            "model = model or self.model; model.load_state_dict(type(model).from_pretrained(checkpoint, "
            "dtype=model.dtype).state_dict()) — or upgrade transformers once the Trainer applies the mapping"
        )
    dlcheck.fail(evidence, cause, fix)


SAVED_BY = {
    "trainer": "the Trainer's save (its checkpoint-* directory)",
    "lightning": "Lightning's ModelCheckpoint",
    "loop": "your dlcheck_save_checkpoint",
}
LOADED_BY = {
    "trainer": "train(resume_from_checkpoint=...)",
    "lightning": "fit(ckpt_path=...)",
    "loop": "your dlcheck_load_checkpoint",
}


def _load_raises(dlcheck: Any, setup: Any, exc: ResumeLoadFailed, label: str) -> None:
    """The resume's loading raised on the checkpoint the pipeline's own save wrote (fresh objects, the path the
    save was given: the pipeline's own conditions): no checkpoint this pipeline writes can be resumed. The
    exception is the evidence; a global that torch.load(weights_only=True) refuses is named with where the
    checkpoint holds it."""
    loaded_by = setup.loaded_by() if setup.kind == "accelerate" else LOADED_BY.get(setup.kind, "the resume")
    saved_by = setup.saved_by() if setup.kind == "accelerate" else SAVED_BY.get(setup.kind, "the save")
    evidence = [
        f"{label}, saved after step {exc.saved_at} by {saved_by} "
        f"({exc.checkpoint.name}); {loaded_by} on fresh objects raised on it, before any step was resumed:",
        exc.message,
    ]
    refused = refused_global(exc.error)
    if refused is None:
        dlcheck.fail(
            evidence,
            cause=f"{loaded_by} raises on the checkpoint the pipeline's own save writes: no checkpoint this "
            "pipeline writes can be resumed (the exception above says what the load could not read)",
            fix="make the load read exactly what the save writes (the same keys, the same file names, the same "
            "objects), and resume once from a checkpoint of a short run to see it work",
        )
    where = holders_of(exc.checkpoint, refused)
    evidence.append(
        (
            f"{', '.join(where)} {'is' if len(where) == 1 else 'are'} {_article(refused)} {refused}"
            if where
            else f"the checkpoint holds {_article(refused)} {refused}"
        )
        + ", pickled: torch.load(weights_only=True) refuses it (only tensors, plain containers, numbers and "
        "strings, and the globals allowed by torch.serialization.add_safe_globals, load)"
    )
    name = refused.rsplit(".", 1)[-1]
    default = "which the Trainer's resume passes" if setup.kind == "trainer" else "its default since torch 2.6"
    if setup.kind == "lightning":
        knob = "trainer.fit(model, ckpt_path=path, weights_only=False) for a checkpoint you wrote yourself"
        plain = "save plain types as hyperparameters (vars(args), numbers, strings) instead of the object"
    elif setup.kind == "trainer":  # the Trainer's own loading passes weights_only=True itself
        knob = (
            "keep plain types (dicts, numbers, strings) in what the Trainer saves: the state_dict of your scheduler, "
            "optimizer or stateful callback"
        )
        plain = "override the Trainer's _load_* method that reads the file with torch.load(..., weights_only=False)"
    else:
        knob = "torch.load(path, weights_only=False) in your load, for a checkpoint you wrote yourself"
        plain = (
            "save plain types instead of the object (vars(args) for an argparse.Namespace)"
            if refused == "argparse.Namespace"
            else f"save plain types instead of the {name} object (its fields as a dict)"
        )
    dlcheck.fail(
        evidence,
        cause=f"torch.load's weights_only=True ({default}) refuses the {refused} that the save "
        f"put in the checkpoint: {loaded_by} raises on every checkpoint this pipeline writes, so no run can be "
        "resumed",
        fix=f"{knob}; or {plain}; or allow the class: torch.serialization.add_safe_globals([{refused}]) before loading",
    )


def _article(name: str) -> str:
    return "an" if name[:1].lower() in "aeiou" else "a"


def _parting(run: ResumeRun, label: str, how: str, step: int, what: str, trainer: bool, where: str = "") -> list[str]:
    """The evidence of where the resumed run parts from the uninterrupted one: the step (``where``: the user's
    cadence, :func:`cadence_words`), the losses and learning rates side by side, and (a Trainer's) what its
    checkpoint directory holds."""
    base = {s.step: s.loss for s in run.uninterrupted.steps}
    resumed = [(s.step, s.loss) for s in run.resumed.steps if s.step > run.saved_at and s.loss is not None]
    side = ", ".join(f"step {s}: {v:.6g} vs {base.get(s, float('nan')):.6g}" for s, v in resumed[:4])
    evidence = [
        f"{label}, saved after step {run.saved_at}{where} through {how}, resumed on fresh objects: at step {step} "
        f"{what}",
        f"losses resumed vs uninterrupted: {side}" if side else "the resumed run logged no loss",
    ]
    lrs = _lr_side(run)
    if lrs:
        evidence.append(f"learning rates resumed vs uninterrupted: {lrs}")
    if trainer:  # what its checkpoint directory holds, by the Trainer's file names
        held = [f for f in run.pieces.values() if f]
        lacking = [p for p, f in run.pieces.items() if not f]
        evidence.append(
            f"{run.checkpoint.name} holds: {', '.join(held) or 'nothing'}"
            + (f"; nothing for: {', '.join(lacking)}" if lacking else "")
        )
    return evidence


def _second(text: str) -> str:
    """A mismatch's words for the uninterrupted run against its second run."""
    return text.replace(" resumed vs ", " in the second run vs ").replace(" uninterrupted", " in the first")


def _keys_fix(loads: list[str]) -> str:
    if any(line.startswith("PEFT:") for line in loads):
        return (
            "load the adapter into the PEFT model you train, not around it: set_peft_model_state_dict(model, "
            "load_file(f'{path}/adapter_model.safetensors')) or model.load_adapter(path, adapter_name='default', "
            "is_trainable=True) — PeftModel.from_pretrained(model, path) on a model get_peft_model already wrapped "
            "wraps it a second time, and the saved adapter keys no longer match"
        )
    return (
        "save and load the same module's state_dict, wrapped or not (state['model'].module inside a "
        "DataParallel / DistributedDataParallel, ._orig_mod inside torch.compile), or strip / add the 'module.' / "
        "'_orig_mod.' prefix before loading, and load with strict=True so that a mismatch raises instead of "
        "loading nothing"
    )


def _broken_resume(
    dlcheck: Any,
    setup: Any,
    run: ResumeRun,
    total: int,
    label: str,
    how: str,
    candidates: list[str],
    runs: int,
    tried: dict[frozenset[str], Any],
    baseline: Any,
) -> None:
    """No piece put back makes the resumed run identical: the uninterrupted run, run a second time the same
    way, says whether the run reproduces itself. If it does, the resume is broken (fail, with where the runs
    part and what the diagnosis could not put back); if it does not, the resume cannot be judged (skip)."""
    # as long as the first run: its last step recorded (a plain loop's micro-steps, under a gradient
    # accumulation more than its optimizer steps)
    last = max([s.step for s in run.uninterrupted.steps] + [st for st, _ in run.uninterrupted.digests] + [total])
    again = run_or_skip(dlcheck, lambda: setup.uninterrupted_again(last, run.saved_at))
    twice = ResumeRun(run.uninterrupted, again, run.saved_at, run.checkpoint, run.pieces).mismatch()
    if twice is not None:
        dlcheck.skip(
            f"the resumed run differs from the uninterrupted one at step {run.mismatch()[0]} even with every piece "
            f"({', '.join(candidates)}, rng) put back, and the uninterrupted run, run a second time the same way, "
            f"differs from the first at step {twice[0]} ({_second(twice[1])}): the run is "
            "not reproducible (nondeterministic ops) and a resume cannot be judged"
        )
    step, what = run.mismatch()
    every = tried.get(frozenset(candidates))
    evidence = _parting(run, label, how, step, what, setup.kind == "trainer", cadence_words(setup))
    evidence.append(
        f"the uninterrupted run, run a second time the same way, equals the first bitwise (steps "
        f"{run.saved_at + 1}-{last}): the run is reproducible, the resume is not"
    )
    evidence.append(
        f"putting back every piece of the state from the uninterrupted run after the load ({', '.join(candidates)}, "
        "and the RNG states) does not make the resumed run identical"
        + (f": it still parts at step {every[0]} ({every[1]})" if every else "")
        + f" ({runs} diagnostic resumes)"
    )
    evidence.extend(f"your load reported: {line}" for line in run.loads)
    evidence.extend(_plan_lines(setup))
    lr_first = what.startswith("learning rate") or (every is not None and every[1].startswith("learning rate"))
    if setup.__dict__.get("_mid_cycle"):
        args, (steps, _) = setup.trainer.args, generation_cycle(setup.trainer)
        cause = (
            "the save falls inside the trainer's generation cycle: the completions it generated for the cycle are "
            "kept in a buffer (and a step counter) the checkpoint does not hold, so the resumed run generates anew "
            "at the save, out of phase with the uninterrupted run"
        )
        fix = (
            f"save at generation-cycle boundaries: set save_steps to a multiple of {steps} (optimizer steps: "
            f"steps_per_generation {args.steps_per_generation} x num_iterations "
            f"{getattr(setup.trainer, 'num_iterations', 1)} training steps, {args.gradient_accumulation_steps} per "
            "optimizer step)"
        )
    elif keys_mismatch(run.loads):
        cause = (
            "the load does not put the saved weights into the model being trained: its load_state_dict finds "
            "other keys than the model's (see its report), so the resumed run trains other weights, and the "
            "saved state cannot be put back into the model the load built"
        )
        fix = _keys_fix(run.loads)
    elif lr_first:
        cause = (
            "the resumed run's learning rates are not the uninterrupted run's, and putting back the LR scheduler "
            "and the optimizer does not repair them: the schedule is computed from state the checkpoint does not "
            "hold (a step or epoch counter of your loop or module that starts again from 0 at the resume)"
        )
        fix = (
            "derive the learning rate from state the checkpoint holds: a torch LR scheduler saved and loaded with "
            "the optimizer, or save your step counter in the checkpoint and restore it on load"
        )
    else:
        cause = (
            "the resume loses state that none of the pieces put back holds: a counter, an attribute of the model "
            "or module, or a structure the load changes, starts again after the resume"
        )
        fix = (
            "save every piece of state your training step reads (counters included) in the checkpoint and "
            "restore it on load, into the objects the training goes on with"
        )
    dlcheck.fail(evidence, cause, fix)


def _is_peft(dlcheck: Any, setup: Any) -> bool:
    """Whether the model the user's factory builds is a PEFT model (the fresh probe other checks share)."""
    try:
        model = fresh_probe(dlcheck, setup).model
    except BaseException:  # noqa: BLE001 - a skip or a factory error: no PEFT wording, the diagnosis stands
        return False
    return any(c.__module__.startswith("peft.") for c in type(model).__mro__)


def _renamed_weights(setup: Any, checkpoint: Any) -> tuple[int, int, str, str] | None:
    """(saved names, names the model does not have, one of them, the model's closest name) when the
    Trainer checkpoint's weights file names tensors the model does not have; None otherwise."""
    import json
    from pathlib import Path

    folder = Path(checkpoint)
    names: list[str] = []
    index = folder / "model.safetensors.index.json"
    try:
        if index.is_file():
            names = list(json.loads(index.read_text()).get("weight_map", {}))
        elif (folder / "model.safetensors").is_file():
            from safetensors import safe_open

            with safe_open(str(folder / "model.safetensors"), framework="pt") as f:
                names = list(f.keys())
    except Exception:  # an unreadable file: no diagnosis, the generic one stands
        return None
    model = getattr(setup.trainer, "model", None)
    if not names or model is None or not hasattr(model, "state_dict"):
        return None
    own = set(model.state_dict())
    foreign = sorted(n for n in names if n not in own)
    if not foreign:
        return None
    parts = foreign[0].split(".")

    def shared_tail(name: str) -> int:
        other = name.split(".")
        k = 0
        while k < min(len(parts), len(other)) and parts[-1 - k] == other[-1 - k]:
            k += 1
        return k

    best = max(sorted(own), key=shared_tail, default="")
    return len(names), len(foreign), foreign[0], best if best and shared_tail(best) >= 2 else ""
