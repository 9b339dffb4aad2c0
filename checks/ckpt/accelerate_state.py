from __future__ import annotations

from ...errors import MISSING
from ...registry import Setting, check
from ...training import get_setup, memo_or_skip


def _name(piece) -> str:
    return f"state['{piece.key}'] ({piece.kind})"


def _fix_for(piece) -> str:
    if "Scheduler" in piece.kind or "LR" in piece.kind:
        return (
            f"prepare it: state['{piece.key}'] = accelerator.prepare(state['{piece.key}']) (a prepared scheduler is "
            "saved by save_state and steps only when gradients sync), or accelerator.register_for_checkpointing"
            f"(state['{piece.key}'])"
        )
    return (
        f"accelerator.register_for_checkpointing(state['{piece.key}']) once, after creating it (any object with "
        "state_dict() / load_state_dict()); or save and load it in save/load-state hooks "
        "(accelerator.register_save_state_pre_hook / register_load_state_pre_hook)"
    )


@check(
    "C10",
    domain="ckpt",
    title="accelerator.save_state / load_state leaves a piece of the training state behind",
    optional_roles=(
        "make_training",
        "dataloader",
        "train_step",
        "compute_loss",
        "save_checkpoint",
        "load_checkpoint",
        "trainer",
        "lightning_module",
    ),
    settings=(
        Setting(
            "micro_steps",
            4,
            "micro-steps trained before the save, doubled (up to 64, as C1's runs are) while a gradient "
            "accumulation leaves no optimizer step in them; the pieces must have moved to be judged",
        ),
    ),
)
def check_accelerate_state(dlcheck):
    """Every stateful piece of an Accelerate training comes back from ``save_state`` / ``load_state``.

    What it does
        Builds fresh objects from your ``dlcheck_make_training`` (whose dict holds your ``Accelerator``),
        trains them a few micro-steps with your step (``C10.micro_steps``, doubled up to 64 as C1's runs are while
        a gradient accumulation leaves no optimizer step in them: the save comes after one), saves them the Accelerate way
        (``accelerator.save_state(path)``, or your ``dlcheck_save_checkpoint``), loads the directory into
        other fresh objects (your ``dlcheck_load_checkpoint``, or ``accelerator.load_state(path)`` when you hand
        over none: the evidence says it was dlcheck's stand-in) and
        compares, piece by piece, every object of the training dict that has a state (model, optimizer, LR
        scheduler, EMA, GradScaler, anything with ``state_dict``/``load_state_dict``) and that training
        changed. Fails naming each piece that does not come back bit for bit, with its first difference and
        how Accelerate knows it (prepared, registered, or not at all). The data position is a piece too: when
        the dict holds the prepared training DataLoader, C1's data-position run (fresh objects trained C1's steps drawn from it,
        saved half way, the rest of the epoch drawn without training when it is longer, up to 256 batches; other
        fresh objects loaded, drawing the rest from their own
        ``state['dataloader']`` as your load leaves it, or from what your ``dlcheck_resume_dataloader``
        returns for it: what your epoch loop trains on after a resume) counts the examples the resumed epoch
        trains twice or never, and the check fails on them, naming ``skip_first_batches`` with the same shuffle
        (``use_seedable_sampler=True``) or ``use_stateful_dataloader=True``.
    Why it is bad
        ``save_state`` saves what ``accelerator.prepare`` returned, the RNG states and what
        ``register_for_checkpointing`` registered — nothing else. An LR scheduler built but not prepared
        restarts its warmup at resume; an EMA (diffusers' ``EMAModel``, ``AveragedModel``) not registered
        comes back at its initial weights and the sampled images of the resumed run are those of an
        untrained model, while the training loss looks perfectly resumed (the EMA does not feed the loss;
        C1 sees the EMA differ at the end of its resumed run, C10 says which piece Accelerate left out and
        why). Nothing warns.
    Example
        ema = EMAModel(unet.parameters())
        unet, optimizer, lr_scheduler = accelerator.prepare(unet, optimizer, lr_scheduler)
        accelerator.save_state(out)          # the EMA is not in it
        accelerator.load_state(out)          # then `for batch in train_dataloader`: the epoch starts again
    Use instead
        accelerator.register_for_checkpointing(ema) (or save it in a save-state hook, as diffusers'
        text-to-image script does with ``register_save_state_pre_hook``); prepare every scheduler you step.
        After ``load_state``, skip the epoch's trained batches with ``accelerator.skip_first_batches(loader, n)``
        on the same shuffle (``DataLoaderConfiguration(use_seedable_sampler=True)``), or use
        ``use_stateful_dataloader=True``.
    Known problems
        Judges only pieces that training changed (a frozen module is not judged) and that live in the dict
        your factory returns. The data position is judged only when that dict holds the training
        DataLoader and the data path after the resume is yours and visible: your ``dlcheck_load_checkpoint``
        replaces or restores the loader (``skip_first_batches``, a stateful loader), or
        ``dlcheck_resume_dataloader`` says what your epoch loop trains on after the resume (a skip in the loop,
        outside the load, as in transformers' ``run_clm_no_trainer.py``). With dlcheck's own default load
        (``accelerator.load_state``, no ``dlcheck_load_checkpoint``) and no ``dlcheck_resume_dataloader``, or a
        load that leaves the loader untouched and no such role, the pass says it was not judged, and why. When
        that stand-in ``load_state`` raises on what your own save wrote through ``save_state``, the check names
        the missing ``dlcheck_load_checkpoint`` (dlcheck's pairing, not your code, failed).
        Examples are told apart by content, as in C1. A gradient accumulation longer than 64 micro-steps (or
        ``C10.micro_steps`` when higher) leaves no optimizer step to save after: skipped, saying so.
    Not applicable
        A ``dlcheck_save_checkpoint`` that never calls ``accelerator.save_state`` (its own ``torch.save`` of a
        dict, as lucidrains' denoising-diffusion Trainer does on an Accelerate loop; a ``save_pretrained`` of the
        unwrapped model's weights): C1 judges that resume, with your ``dlcheck_load_checkpoint`` (nothing is
        loaded here: ``load_state`` would look for files such a save never writes).
        Trainings without an ``Accelerator`` in the ``dlcheck_make_training`` dict (a Trainer — which runs
        on Accelerate but checkpoints its own way, C1 —, Lightning, a plain loop). A Trainer or Lightning
        user (``dlcheck_trainer`` or ``dlcheck_lightning_module``, no ``dlcheck_make_training``) is not
        asked for a ``dlcheck_make_training`` either: the check is not applicable to them.
    """
    from ...training.accelerate import round_trip

    if not dlcheck.has("make_training"):
        for role, kind in (
            ("trainer", "a Trainer (transformers/TRL or Lightning)"),
            ("lightning_module", "a Lightning module"),
        ):
            if dlcheck.has(role):
                dlcheck.not_applicable(
                    f"dlcheck_{role} is {kind}, which checkpoints its own way, not with accelerator.save_state / "
                    "load_state of a training you drive (C1 judges its resume)"
                )
        dlcheck.require("make_training")
    setup = get_setup(dlcheck)
    if setup.kind != "accelerate":
        dlcheck.not_applicable(
            f"{setup.describe()}: no Accelerator in the training state (C10 judges accelerator.save_state / "
            "load_state; C1 judges this training's resume)"
        )
    steps = int(dlcheck.setting("micro_steps"))
    trip = memo_or_skip(dlcheck, setup.sources, f"accelerate:round-trip:{steps}", lambda: round_trip(setup, steps))
    how = setup.checkpoint_how()
    if not trip.via_save_state:
        shown = ", ".join(trip.files[:4]) + (", ..." if len(trip.files) > 4 else "") if trip.files else "one file"
        dlcheck.not_applicable(
            f"your dlcheck_save_checkpoint writes its own checkpoint ({shown}) without accelerator.save_state: C10 "
            "judges what save_state / load_state leave behind; C1 judges this training's resume, its data position "
            "included"
            + (" (once dlcheck_load_checkpoint hands over your resume)" if setup.user_load is MISSING else "")
        )
    lengthened = (
        f", C10.micro_steps = {steps} doubled while your gradient accumulation left no optimizer step in them"
        if trip.steps > steps
        else ""
    )
    head = (
        f"fresh objects trained {trip.steps} micro-steps ({trip.opt_steps} optimizer "
        f"step{'s' if trip.opt_steps != 1 else ''}{lengthened}), saved through {how} ({len(trip.files)} files), "
        "loaded into other fresh objects"
    )
    lost = [p for p in trip.pieces if p.restored is False]
    if not trip.pieces:
        dlcheck.skip(f"{head}: no piece of the training state with a readable state changed in training")
    if lost:
        evidence = [head]
        for p in lost:
            known = f"known to Accelerate as {p.registered}" if p.registered else "neither prepared nor registered"
            evidence.append(f"{_name(p)} does not come back: {p.detail} ({known})")
        kept = [p for p in trip.pieces if p.restored]
        if kept:
            evidence.append("restored bit for bit: " + ", ".join(f"state['{p.key}']" for p in kept))
        unregistered = [p for p in lost if not p.registered]
        if unregistered:
            cause = (
                "accelerator.save_state saves only what accelerator.prepare() returned and what "
                "register_for_checkpointing() registered: "
                + ", ".join(_name(p) for p in unregistered)
                + (" is" if len(unregistered) == 1 else " are")
                + " neither, so a resumed run starts "
                + ("them" if len(unregistered) > 1 else "it")
                + " from scratch"
            )
            fix = "; ".join(_fix_for(p) for p in unregistered)
        else:
            cause = (
                f"{', '.join(_name(p) for p in lost)} is saved by Accelerate but {setup.loaded_by()} does not restore "
                "it (a save/load hook that skips it, or a load_state into other objects than the ones you train)"
            )
            fix = "load_state into the objects prepare() returned, and restore every piece your save hooks write"
        dlcheck.fail(evidence, cause, fix)
    from .resume import data_verdict

    loaded_by = setup.loaded_by()
    data_lines = data_verdict(dlcheck, setup, how, loaded_by)
    restored = [p for p in trip.pieces if p.restored]
    if not restored:
        unread = ", ".join(f"state['{p.key}']" for p in trip.pieces)
        dlcheck.skip(f"{head}: the state of {unread} cannot be read back after the load, so nothing was compared")
    dlcheck.measured(
        f"{head}: every piece training changed came back bit for bit: "
        + "; ".join(f"state['{p.key}'] ({p.kind}: {p.detail})" for p in restored),
        *data_lines,
        pieces=[p.key for p in restored],
        micro_steps=trip.steps,
    )
