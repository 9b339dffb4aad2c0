from __future__ import annotations

from typing import Any

from ...errors import MISSING, RoleError
from ...registry import check
from ...training import get_setup, run_or_skip
from ...training.resume import GLOBAL_ONLY, OTHER_RNG, OWN_ONLY, ResumeRun
from .resume import (
    cadence_words,
    compared,
    how_saved,
    release_after,
    resume_baseline,
    resume_run,
    run_end,
    shared_resume,
)


def _versus(reference: ResumeRun, other: ResumeRun) -> tuple[int, str] | None:
    """Where ``other``'s resumed steps first differ from ``reference``'s (losses, learning rates, weights, EMAs),
    or None."""
    return ResumeRun(reference.resumed, other.resumed, reference.saved_at, reference.checkpoint, {}).mismatch()


def _fix(setup: Any) -> str:
    if setup.kind == "trainer":
        if getattr(setup.trainer.args, "save_only_model", False):
            return (
                "drop save_only_model=True from the training arguments: it saves no rng_state.pth, which "
                "resume_from_checkpoint restores the RNG states from"
            )
        return (
            "let the Trainer write and read rng_state.pth (a custom _save_checkpoint must call _save_rng_state, a "
            "custom resume _load_rng_state)"
        )
    if setup.kind == "lightning":
        return (
            "Lightning checkpoints hold no RNG state: save them in the module's on_save_checkpoint(checkpoint) "
            "(checkpoint['rng'] = {'torch': torch.get_rng_state(), 'python': random.getstate()}, and numpy's "
            "state as tensors if you draw from it: Lightning loads the .ckpt with weights_only) and set them back in "
            "on_load_checkpoint (torch.set_rng_state, random.setstate); or ignore C3 (dlcheck_ignore = C3) if an "
            "exact resume of the random draws does not matter to you"
        )
    if setup.kind == "accelerate" and setup.checkpoint_how().startswith("accelerator."):
        return "keep the RNG states that save_state writes (random_states_*.pkl) and load them with load_state"
    return (
        "save torch.get_rng_state() (and random.getstate(), numpy.random.get_state(), "
        "torch.cuda.get_rng_state_all()) in dlcheck_save_checkpoint and set them back in dlcheck_load_checkpoint"
    )


@check(
    "C3",
    domain="ckpt",
    title="a resumed run draws other random numbers than the uninterrupted run",
    roles=(),
    optional_roles=(
        "trainer",
        "lightning_module",
        "datamodule",
        "make_training",
        "save_checkpoint",
        "load_checkpoint",
        "dataloader",
    ),
)
def check_resume_rng(dlcheck):
    """A run resumed from a checkpoint draws the random numbers the uninterrupted run draws.

    What it does
        Resumes your training from the checkpoint saved half way, as C1 does (the same runs: ``C1.steps``, or
        the shared smoke run), on fresh objects with the global RNGs elsewhere, as in a new process: once as
        your resume leaves the RNG states, once with the RNG states put back from the uninterrupted run at the
        save, after your own load. The RNG states are the global ones (python, numpy, torch, CUDA) and, for a
        plain or Accelerate loop, those of the ``torch.Generator`` objects your training holds itself: found in
        what ``dlcheck_make_training`` returns (``state['generator']``, a loader's or a module's attribute, a
        few levels deep) and in your ``dlcheck_train_step`` (its closure variables, default arguments,
        attributes), by where they are, so that the uninterrupted run's are put back on the fresh objects'.
        Everything else is the same in both resumes, so where their losses, learning rates, weights (or a plain
        loop's EMAs) differ, only the random draws can make them differ: the resume does not restore the RNG
        states. When your own generators are among those your load does not put back, two more resumes tell
        which RNGs make the difference (only the global ones put back, only your generators), and the failure
        names the generator and where it was found. When both agree, the pass says the resumed steps draw the
        uninterrupted run's numbers only when the resumed run equals the uninterrupted run itself; when both
        resumes differ from it alike (a piece C1 finds lost), it passes only where it sees, right after your
        load, the states of every generator the resumed steps draw from equal the uninterrupted run's at the
        save (a plain loop), and otherwise skips saying that what makes the runs differ is not a random state it
        finds. What tells a resume that restores them (pass) from a run whose resumed steps draw no random
        numbers (not applicable) is, for a
        plain loop (dlcheck feeds the batches: only your step draws), whether the global RNGs' states move over
        the resumed steps; for a Trainer or a Lightning fit (whose own dataloaders draw too), a third resume
        with other RNG states set after the load. A plain loop's data path (dlcheck draws its batches
        beforehand, so the resumed runs never show it) is asked on its own: the first batches of your training
        loader drawn with each global generator (torch, python, numpy) set elsewhere tell which ones it draws
        from (a RandomSampler without generator=, random transforms, a Mixup in the collate, the workers'
        seeds), and the global states right after your load, compared with those at the save, tell whether
        your load puts them back. With your epoch loop handed over (``dlcheck_resume_dataloader``), what it
        draws between the load and the first resumed step (a new iterator's base seed, a sampler's shuffle seed,
        the batches it skips or a loader that fetches ahead fetches again) is measured without training: fresh
        objects loaded by your load from the same checkpoint, the global RNG states at the save put back, your
        loop yields its first resumed batch; the uninterrupted run's loader, iterated from the run's start, yields
        the same step's batch from the same states at the save. Each example is read with the RNGs seeded by its
        index (the stream put back after it), so both sides read it alike. When the two batches hold the same
        examples, the global RNG states right after them are compared (how many numbers torch's is ahead), and
        the batches themselves (a collator's masking drawn again).
    Why it is bad
        After such a resume, dropout masks, the shuffling drawn from the global generator and random
        augmentations differ from the uninterrupted run: the run is not the one that was saved, and a resumed
        job cannot be reproduced or compared bitwise with an uninterrupted one. Less grave than a lost optimizer
        or schedule (C1), which is why it is a check of its own: a pipeline that accepts it ignores C3 only.
    Example
        pl.Trainer(...).fit(module, ckpt_path=...)   # a module with dropout: Lightning's .ckpt holds no RNG state
        torch.save({"model": ..., "optimizer": ..., "lr_scheduler": ...}, path)   # no torch.get_rng_state()
        DataLoader(train_set, shuffle=True)   # its RandomSampler draws from torch's global RNG every epoch
        TrainingArguments(..., save_only_model=True)   # no rng_state.pth
        accelerator.load_state(path)   # transformers' run_mlm_no_trainer.py: the RNG states put back, then the
        for batch in accelerator.skip_first_batches(train_dataloader, resume_step):   # new iterator draws its base
            ...                        # seed from them and fetches the first batch again (its masks drawn anew)
        generator = torch.Generator().manual_seed(seed)   # diffusers' train_instruct_pix2pix.py: the step's
        torch.rand(bsz, generator=generator)              # conditioning dropout; save_state does not hold it
    Use instead
        save the RNG states with the checkpoint and set them back on load: the Trainer's rng_state.pth,
        Accelerate's save_state / load_state; torch.get_rng_state(), random.getstate(),
        numpy.random.get_state() (and the CUDA states) in a plain loop's checkpoint or a LightningModule's
        on_save_checkpoint / on_load_checkpoint; a ``torch.Generator`` of your own: its ``get_state()`` in the
        checkpoint and ``set_state(...)`` on load. An epoch loop that builds a new iterator after the load: put
        the RNG states back once it has fetched its first batch, or give the loader (``generator=``) and the
        collator (``seed=``) generators of their own.
    Known problems
        The RNG states are put back where the framework restores its own (after a plain loop's load, the
        Trainer's _load_rng_state, a Lightning callback's on_load_checkpoint): a resume that sets them later
        than that (in a Lightning on_train_start) reads as a run that draws no random numbers (not applicable).
        A generator of your own is found only where listed above, and only for a plain or Accelerate loop (not
        in a Trainer's or a LightningModule's attributes yet): one kept elsewhere (a module-level global your
        step reads by name) is not put back, and a run that draws only from it reads as drawing no random
        numbers. A data order a DataLoader's generator= or a sampler's seed replays after a resume is C1's
        finding (dlcheck feeds a plain loop's resumed steps their batches). Compares bitwise: on GPU,
        nondeterministic kernels can make two resumes differ; the check then skips.
        A plain loop's data path is drawn once per generator set elsewhere, from a new iteration of the
        loader: a draw that depends on the global RNGs only from a later epoch on is not seen.
        Your epoch loop's draws after the load are compared at the first resumed step only, and only when its
        first resumed batch holds the uninterrupted run's examples (else C1's data position fails, and this part
        says it was not judged); what later draws from a generator the loop moved (the next epoch's shuffle), and
        a generator of the data path's own (a collator's ``seed=``), are not compared. A loader in spawned worker
        processes draws the examples' augmentations there: only the main process's states are compared.
        A plain or Accelerate loop that hands over ``dlcheck_save_checkpoint`` and no ``dlcheck_load_checkpoint``
        (a script that writes its weights and never resumes) is not resumed: the check names the missing load
        (dlcheck loads with Accelerate's ``load_state`` only when neither save nor load is given).
    Not applicable
        Runs whose resumed steps draw no random numbers that change them (no dropout, no shuffling or
        augmentation from the global generators): with any RNG state after the load, they are the same.
    """
    setup = get_setup(dlcheck)
    try:
        _rng_verdict(dlcheck, setup)
    finally:
        release_after(dlcheck, setup, "C3")


def _rng_verdict(dlcheck: Any, setup: Any) -> None:
    total, baseline, label = resume_baseline(dlcheck, setup)
    try:
        put = shared_resume(dlcheck, setup, total, frozenset({"rng"}), baseline)
        own = shared_resume(dlcheck, setup, total, frozenset(), baseline)
    except RoleError as exc:  # root cause first: a resume that raises is C1's finding
        dlcheck.skip(f"the resume itself fails, before any random draw can be compared (C1 reports it): {exc}")
    how = how_saved(setup, put)
    end = run_end(put, total)
    if end != total:  # a run as long as the user's checkpoint cadence needs (dlcheck_checkpoint_every)
        label = f"{end} steps"
    head = f"{label}, saved after step {put.saved_at}{cadence_words(setup)} through {how}, resumed on fresh objects"
    steps = f"steps {put.saved_at + 1}-{end}"
    differ = _versus(put, own)
    if differ is None:
        drawn = put.resumed.notes.get("rng_drawn")
        data = None  # what the data path draws from (a plain loop's, asked below)
        if drawn is None:  # a Trainer's, a Lightning fit's own dataloaders draw too: a third resume tells
            other = run_or_skip(dlcheck, lambda: resume_run(setup, total, frozenset({OTHER_RNG}), baseline))
            moved = _versus(put, other)
            shown = (
                f"with other RNG states set after the load they differ at step {moved[0]} ({_words(moved[1], 'set to others')})"
                if moved
                else ""
            )
        else:  # a plain loop: dlcheck feeds the batches, only the user's step draws
            moved = drawn or None
            shown = _drawn_words(put, steps)
            # dlcheck drew the batches beforehand: whether the user's data path draws from the global RNGs too
            # (fails here when it draws from one the load does not put back)
            data = _data_path(dlcheck, setup, own, head, steps)
            if data is UNKNOWN and not drawn:
                dlcheck.skip(
                    "the resumed steps draw no random numbers, and whether your data path draws from the global "
                    "RNGs cannot be told: your training loader does not yield the same batches twice from the "
                    "same global RNG states (a generator of its own that its iteration advances)"
                )
            if data is UNKNOWN:
                dlcheck.not_judged(
                    "your data path's draws",
                    "your training loader does not yield the same batches twice from the same global RNG states",
                )
            elif data and not drawn:
                loop = _loop_draws(dlcheck, setup, own, head, data)
                dlcheck.measured(
                    f"{head} (the global RNGs elsewhere first, as in a new process): {data[0]}",
                    data[1],
                    *loop,
                    steps=total,
                )
                return
            elif data:
                shown = f"{shown}; {data[0]}: {data[1]}"
        if moved is None:
            dlcheck.not_applicable(
                f"the resumed steps draw no random numbers that change them: resumed with the RNG states put back "
                f"from the uninterrupted run, or set to others after the load, the {', '.join(compared(put, put.resumed)) or 'steps'} "
                f"of {steps} are the same bitwise"
                if drawn is None
                else f"the resumed steps draw no random numbers: the global RNGs' states do not move over {steps}"
                + (
                    f", nor do those of your own generators ({', '.join(put.resumed.notes['generators'])})"
                    if put.resumed.notes.get("generators")
                    else ""
                )
            )
        gens = own.resumed.notes.get("generators") or []
        put_back = "the uninterrupted run's RNG states put back" + (
            f" (the global ones and your own generator{'s' if len(gens) > 1 else ''} {', '.join(gens)})" if gens else ""
        )
        parted = own.mismatch()
        if parted is None:  # compared with the uninterrupted run itself
            what = ", ".join(compared(own)) or "steps"
            loop = _loop_draws(dlcheck, setup, own, head, data)
            dlcheck.measured(
                f"{head} (the global RNGs elsewhere first, as in a new process): the resumed steps draw the "
                f"uninterrupted run's random numbers: the {what} of {steps} equal the uninterrupted run's, bitwise, "
                f"as those of the resume with {put_back} do",
                shown,
                *loop,
                steps=total,
                saved_at=put.saved_at,
            )
            return
        # the resumed run is not the uninterrupted run, with or without the RNG states put back: whether its steps
        # draw the uninterrupted run's numbers is known only where the load is seen to put back what they draw from
        parted_words = f"at step {parted[0]} ({parted[1]})"
        restored = _restores_what_it_draws(own)
        if restored:
            loop = _loop_draws(dlcheck, setup, own, head, data)
            dlcheck.measured(
                f"{head} (the global RNGs elsewhere first, as in a new process): right after your load, the states "
                f"of the generators the resumed steps draw from ({', '.join(restored)}) are those of the "
                "uninterrupted run at the save",
                f"the resumed run differs from the uninterrupted run {parted_words} for another reason: the resume "
                f"with {put_back} differs alike (C1 judges the rest of the resume)",
                shown,
                *loop,
                steps=total,
                saved_at=put.saved_at,
            )
            return
        dlcheck.skip(
            f"{head}: the resumed run differs from the uninterrupted run {parted_words}, and the resume with "
            f"{put_back} after your load differs alike: what makes it differ is not a random state C3 finds and "
            "puts back, so whether the resumed steps draw the uninterrupted run's random numbers is not known "
            "(C1 judges the rest of the resume; a generator of your own that dlcheck does not find, or RNG states "
            "drawn from before the point where they are put back, would be C3's)"
        )
    # the two resumes differ by the RNG states alone; conclusive when a resume is deterministic: proven when the
    # one with the RNG states put back equals the uninterrupted run, else by making it a second time
    exact = put.mismatch() is None
    if not exact:
        again = run_or_skip(dlcheck, lambda: resume_run(setup, total, frozenset({"rng"}), baseline))
        twice = _versus(put, again)
        if twice is not None:
            dlcheck.skip(
                f"the resume with the RNG states put back differs from itself at step {twice[0]} "
                f"({_words(twice[1], 'put back (second resume)')}): the resumed run is not reproducible (nondeterministic ops) and its random "
                "draws cannot be judged"
            )
    step, what = differ
    # the training's own generators the load left behind, among those the resumed steps draw from (a loader's
    # generator the batches moved but no step reads is not named: its order is C1's data position)
    drawn_own = own.resumed.notes.get("own_drawn_from")
    lost = [
        w
        for w, ok in (own.resumed.notes.get("generators_restored") or {}).items()
        if not ok and (drawn_own is None or w in drawn_own)
    ]
    if lost:  # the training's own generators are not put back by the load: which of the RNGs make the difference
        globs = run_or_skip(dlcheck, lambda: resume_run(setup, total, frozenset({"rng", GLOBAL_ONLY}), baseline))
        if _versus(put, globs) is not None:
            mine = run_or_skip(dlcheck, lambda: resume_run(setup, total, frozenset({"rng", OWN_ONLY}), baseline))
            _own_generators_fail(dlcheck, setup, put, globs, mine, lost, head, exact)
    evidence = [
        f"{head} with the global RNGs elsewhere, as in a new process: at step {step} {_words(what)}",
        "the two resumes differ only by the RNG states put back after your load; "
        + (
            "with them put back, the resumed run equals the uninterrupted run bitwise: only the random draws differ"
            if exact
            else "with them put back, the resume is the same when made twice (it differs from the uninterrupted "
            "run for another reason: C1's finding)"
        ),
    ]
    if setup.kind == "trainer":
        evidence.append(f"{put.checkpoint.name} holds: {put.pieces.get('rng') or 'no rng_state.pth'}")
    dlcheck.fail(
        evidence,
        cause="the checkpoint does not restore the random number generators (python, numpy, torch): dropout masks "
        "and the shuffling or augmentations drawn from them differ after the resume",
        fix=_fix(setup),
    )


#: what a global generator's draws in a data path are, in words
_DRAWS = {
    "torch": "a RandomSampler / shuffle=True without generator=, torch random transforms, the workers' seeds",
    "python": "random transforms drawn with python's random",
    "numpy": "numpy draws: a Mixup/CutMix in the collate, numpy augmentations",
}


#: :func:`_data_path`'s answer when what the data path draws from cannot be told
UNKNOWN = ("", "", [])


def _data_path(dlcheck: Any, setup: Any, own: ResumeRun, head: str, steps: str) -> tuple[str, str, list[str]] | None:
    """Whether the user's data path draws from the global RNGs (its first batches drawn with each global
    generator set elsewhere: dlcheck feeds the resumed steps batches drawn beforehand, so the resumed runs
    never show it) and whether the user's load puts those generators back where they were at the save.
    Fails when the data path draws from one the load does not put back; returns what was measured (the
    load's part, the data path's part, the generators it draws from) when it puts back every one it draws from,
    None when the data path draws from none, :data:`UNKNOWN` when that cannot be told."""
    data = run_or_skip(dlcheck, setup.data_rng)
    if data is None:
        return UNKNOWN
    where, moved = data
    if not moved:
        return None
    restored = own.resumed.notes.get("rng_restored") or {}
    lost = [name for name in moved if not restored.get(name)]
    draws = "; ".join(f"{name}: {_DRAWS[name]}" for name in moved)
    seen = (
        f"your data path draws from the global RNGs: with {_each(moved)} set elsewhere, "
        f"{where} yields other batches ({draws}); dlcheck feeds the resumed steps ({steps}) batches it drew "
        "beforehand, so only this tells"
    )
    if lost:
        dlcheck.fail(
            [
                f"{head} (the global RNGs elsewhere first, as in a new process): right after your load, the "
                f"global {' / '.join(lost)} RNG state{'s are not those' if len(lost) > 1 else ' is not the one'} at "
                "the save",
                seen,
                "so after a resume your loop's shuffling or augmentations draw other random numbers than the "
                "uninterrupted run's, from the first batch the resumed loop draws",
            ],
            cause="the checkpoint does not restore the random number generators (python, numpy, torch) that your "
            "data path draws from: the shuffling or augmentations after the resume differ from the uninterrupted run",
            fix=_fix(setup),
        )
    return (
        f"right after your load, the global {' / '.join(moved)} RNG state{'s are those' if len(moved) > 1 else ' is the one'} "
        "at the save",
        seen,
        moved,
    )


def _each(names: list[str]) -> str:
    """``only the global torch RNG``, or ``the global torch, python or numpy RNG (each alone)``."""
    if len(names) == 1:
        return f"only the global {names[0]} RNG"
    return f"the global {', '.join(names[:-1])} or {names[-1]} RNG (each alone)"


def _words(text: str, first: str = "as your resume leaves them", second: str = "put back") -> str:
    """A mismatch's words with the two resumes named by their RNG states: ``loss 1.2 resumed vs 1.1
    uninterrupted`` reads ``loss 1.2 with the RNG states as your resume leaves them vs 1.1 with them put back``."""
    return text.replace(" resumed vs ", f" with the RNG states {first} vs ").replace(
        " uninterrupted", f" with the uninterrupted run's RNG states {second}"
    )


def _loop_draws(
    dlcheck: Any, setup: Any, own: ResumeRun, head: str, data: tuple[str, str, list[str]] | None
) -> list[str]:
    """With the user's epoch loop handed over (``dlcheck_resume_dataloader``), what it draws from the global RNGs
    between the load and the first resumed step (a new iterator's base seed, a sampler's shuffle seed, the batches
    it skips or fetches again), which the compared steps (fed their batches) never show: the global RNG states
    right after the loop yields its first resumed batch, compared with the uninterrupted loop's at the same step
    (:meth:`~pytest_dlcheck.training.loop.LoopSetup.loop_draws`). Fails when they differ and the resumed steps draw
    from a generator that moved, or the batch's own draws differ; else returns what was measured (for the pass's
    evidence), or records why it was not judged."""
    if getattr(setup, "resume_loader", MISSING) is MISSING:
        return []
    part = "your epoch loop's draws after the load"
    try:
        got = setup.loop_draws(own)
    except RoleError as exc:  # the user's loop raising on the objects their load left: C1's data position reports it
        dlcheck.not_judged(part, f"dlcheck_resume_dataloader's loop raises after your load: {exc}")
        return []
    if got is None:
        dlcheck.not_judged(
            part,
            "no first resumed batch to draw: dlcheck_make_training's dict holds no training loader, or your load or "
            "dlcheck_resume_dataloader's loop yields none (C1 judges the resume)",
        )
        return []
    step, loop = got.step, f"your epoch loop after the load (dlcheck_resume_dataloader's {got.through})"
    if not got.same_examples:
        dlcheck.not_judged(
            part,
            f"the first batch {loop} yields (step {step}) holds other examples than the uninterrupted run's (C1's "
            "data position), so the random numbers its loading draws cannot be compared",
        )
        return []
    batch = (
        f"its {', '.join(got.batch_differs)} differ{'s' if len(got.batch_differs) == 1 else ''}"
        if got.batch_differs
        else ""
    )
    if not got.moved:
        if got.batch_differs:
            dlcheck.not_judged(
                part,
                f"the first resumed batch (step {step}) holds the uninterrupted run's examples, but {batch}, with the "
                "global RNG states the same right after it: what it draws from (a generator of the data path's "
                "own) is not a state C3 compares",
            )
            return []
        return [
            f"{loop}: with the RNG states at the save put back after your load, the first resumed batch (step "
            f"{step}) is the uninterrupted run's, bitwise, and right after it the global RNG states are the "
            "uninterrupted run's at that step: the loop draws nothing of its own between the load and the first "
            "resumed step"
        ]
    drawn = own.resumed.notes.get("rng_drawn_from") or []
    fed = data[2] if data else []  # the global generators the data path draws from (its augmentations, shuffles)
    stepped = [name for name in got.moved if name in drawn]
    fed_from = [name for name in got.moved if name in fed and name not in stepped]
    hit = stepped + fed_from
    apart = got.torch_ahead
    far = {
        name: (
            ("ahead of" if apart > 0 else "behind")
            + f" the uninterrupted run's by {abs(apart)} number{'s' if abs(apart) != 1 else ''} of 32 bits (a new "
            "DataLoader iterator's 64-bit base seed is 2)"
            if name == "torch" and apart is not None
            else "not the uninterrupted run's"
        )
        for name in got.moved
    }
    where = "; ".join(f"the global {name} RNG is {far[name]}" for name in got.moved)
    if not hit and not got.batch_differs and data is UNKNOWN:
        dlcheck.not_judged(
            part,
            f"right after the first resumed batch (step {step}) {where}; the resumed steps do not draw from "
            f"{'it' if len(got.moved) == 1 else 'them'}, and whether your data path does cannot be told",
        )
        return []
    if not hit and not got.batch_differs:
        dlcheck.not_judged(
            "later draws from the RNG your epoch loop moved",
            f"the {' / '.join(got.moved)} RNG is moved on by your loop after the load: what draws from it later (a "
            "next epoch's shuffle without generator=) is not compared",
        )
        return [
            f"{loop}: right after the first resumed batch (step {step}) {where}, but neither that batch (the "
            f"uninterrupted run's, bitwise) nor the resumed steps draw from {'it' if len(got.moved) == 1 else 'them'}"
        ]
    evidence = [
        f"{head}, the uninterrupted run's RNG states at the save put back after your load: {loop} draws from the "
        f"global RNGs before the first resumed step: right after it yields the first resumed batch (step {step}) "
        f"{where} at the same step (its iterator, continued from the run's start, yields the same examples from "
        "the same states at the save)",
    ]
    if got.batch_differs:
        evidence.append(
            f"the first resumed batch (step {step}) holds the uninterrupted run's examples drawn with other random "
            f"numbers: {batch} (the collation's or the transforms' draws)"
        )
    if stepped:
        evidence.append(
            f"the resumed steps draw from the global {' / '.join(stepped)} RNG (its state advances over them: "
            f"dropout, noise), so from step {step} on they draw other numbers than the uninterrupted run's"
        )
    if fed_from:
        evidence.append(
            f"your data path draws from the global {' / '.join(fed_from)} RNG (its batches change with it), so the "
            f"random augmentations or shuffles of the resumed batches, from step {step} on, draw other numbers than "
            "the uninterrupted run's"
        )
    fix = (
        "put the global RNG states back once your epoch loop's resumed iterator exists and has fetched what it "
        "fetches (rng = torch.get_rng_state() right after the load; it = iter(loader); first = next(it); "
        "torch.set_rng_state(rng), random / numpy alike), or give the data path generators of its own saved with "
        "the checkpoint (DataLoader(..., generator=g), a sampler's generator), so that a new iterator draws nothing "
        "from the global RNGs"
    )
    if got.batch_differs:
        fix += (
            "; the first resumed batch's own random draws (a collator's masking, random transforms) are made again "
            "after the load, while the uninterrupted run made them before the save when its loader fetches ahead: "
            "draw them from a generator of the collator's own (DataCollatorForLanguageModeling(..., seed=...)) or "
            "in the step, after the RNG states are put back"
        )
    dlcheck.fail(
        evidence,
        cause="your epoch loop draws from the global random number generators between the load and the first "
        "resumed step (a new DataLoader iterator draws its base seed from torch's global RNG, a RandomSampler "
        "without generator= its shuffle seed, a loader that fetches ahead fetches the first resumed batch again): "
        "the RNG states the checkpoint restores are moved on before the resumed steps draw, so dropout and the "
        "data path's random draws differ from the uninterrupted run's",
        fix=fix,
    )


def _restores_what_it_draws(own: ResumeRun) -> list[str]:
    """The generators the resumed steps draw from (a plain loop's: the global ones whose states move over the
    resumed steps, the training's own), when the user's load put every one of them back where it was at the save
    (compared with the uninterrupted run's states at the save); else []."""
    notes = own.resumed.notes
    drawn, mine = notes.get("rng_drawn_from"), notes.get("own_drawn_from") or []
    if drawn is None or not (drawn or mine):
        return []
    globs, gens = notes.get("rng_restored") or {}, notes.get("generators_restored") or {}
    if all(globs.get(name) for name in drawn) and all(gens.get(where) for where in mine):
        return [f"the global {name} RNG" for name in drawn] + list(mine)
    return []


def _where(found: str) -> str:
    """Where a generator of the training's own was found, in words."""
    if found.startswith("state"):
        return f"{found} (in what dlcheck_make_training returns)"
    return found


def _own_generators_fail(
    dlcheck: Any,
    setup: Any,
    put: ResumeRun,
    globs: ResumeRun,
    mine: ResumeRun,
    lost: list[str],
    head: str,
    exact: bool,
) -> None:
    """The resume does not put back generators the training creates itself (not torch's global ones): with only
    the global RNG states put back the resumed run still differs, with those generators put back too it does not."""
    step, what = _versus(put, globs)
    names = ", ".join(_where(w) for w in lost)
    also_global = _versus(put, mine) is not None
    evidence = [
        f"{head} with the global RNGs elsewhere, as in a new process: your training's own torch.Generator "
        f"{names} is not put back by your load (right after it, its state is not the one at the save)",
        f"with only the global RNG states put back after your load, the resumed run differs at step {step} "
        f"({_words(what, 'put back but your generators as your resume leaves them', 'put back, your generators too')})",
        "with your generators put back too, the resumed run "
        + (
            "equals the uninterrupted run bitwise: only the random draws differ"
            if exact
            else "is the same when made twice (it differs from the uninterrupted run for another reason: C1's finding)"
        ),
    ]
    if also_global:
        evidence.append("with your generators put back and not the global RNG states, it differs too: both are lost")
    gens = " / ".join(lost)
    fix = (
        f"save the generator's state with the checkpoint ({gens}.get_state()) and set it back on load "
        f"({gens}.set_state(saved)): a fresh process makes it anew from its seed"
    )
    if setup.kind == "accelerate" and setup.checkpoint_how().startswith("accelerator."):
        fix += (
            " (accelerator.save_state does not hold it: register_for_checkpointing an object whose state_dict() "
            "returns {'generator': generator.get_state()} and whose load_state_dict() calls generator.set_state)"
        )
    if also_global:
        fix += "; and " + _fix(setup)
    dlcheck.fail(
        evidence,
        cause="the checkpoint does not hold the state of a torch.Generator your training creates itself: a resumed "
        "process makes it anew from its seed, so what the steps draw from it (a conditioning dropout, noise drawn "
        "with generator=) after the resume repeats the run's first draws instead of the uninterrupted run's"
        + (", and it does not restore the global random number generators either" if also_global else ""),
        fix=fix,
    )


def _drawn_words(run: ResumeRun, steps: str) -> str:
    """What a plain loop's resumed steps draw from: the global RNGs whose states advance over them, the training's
    own generators whose states do."""
    notes = run.resumed.notes
    glob, mine = notes.get("rng_drawn_from"), notes.get("own_drawn_from") or []
    named = f" ({' / '.join(glob)})" if glob else ""
    if not mine:
        return f"the resumed steps draw from the global RNGs: their states advance over {steps}{named}"
    own = f"your own generator{'s' if len(mine) > 1 else ''} {', '.join(mine)}"
    return f"the resumed steps draw from {own}{f' and the global RNGs{named}' if glob else ''}: their states advance over {steps}"
