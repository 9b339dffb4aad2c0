from __future__ import annotations

from pathlib import Path

from ...registry import check
from ...training import get_setup, memo_or_skip


def _short(path: str) -> str:
    parts = Path(path).parts
    return str(Path(*parts[-2:])) if len(parts) >= 2 else path


@check(
    "C2",
    domain="ckpt",
    title="a save interrupted half way leaves no loadable checkpoint",
    roles=(),
    optional_roles=("trainer", "lightning_module", "make_training", "save_checkpoint", "load_checkpoint"),
)
def check_atomic_save(dlcheck):
    """An interruption in the middle of a save leaves the previous checkpoint loadable.

    What it does
        Saves a checkpoint through your own path, trains an optimizer step, saves again — and interrupts that second
        save half way, the way a kill, a preemption or a full disk does: ``torch.save`` and safetensors'
        ``save_file`` write the first half of their bytes and stop. Then loads what is on disk into fresh
        objects (your ``dlcheck_load_checkpoint``; for a Trainer, ``resume_from_checkpoint`` of the previous
        ``checkpoint-*``; for Lightning, the previous ``.ckpt``). Fails when the load raises, or loads weights
        that are neither the previous nor the new ones. A save that names its files after a counter of your
        training dict (``netG_epoch_{epoch}.pth``) is saved the second time with that counter one on, as your
        loop advances it between saves. When the interrupted file is a new one beside the previous checkpoint
        and your load raises on it (it takes the newest), the half-written file is put aside and the load made
        again, and the evidence says whether the previous checkpoint restores the previous weights; the load
        taking the half-written newest one still fails (an automatic resume 'latest' stops there). When a person
        picks the checkpoint to resume from, write ``dlcheck_load_checkpoint`` as that choice (the newest complete
        one) and C2 judges it.
    Why it is bad
        Saving straight onto the path of the only checkpoint (``torch.save(state, "last.pt")``) truncates it
        first: a job killed during the save — the usual moment for preemption, since saves are slow — has
        lost both the old checkpoint and the new one, and days of training with them.
    Example
        torch.save(state, "checkpoint.pt")       # overwrites the previous checkpoint in place
    Use instead
        write to a temporary file in the same directory, then ``os.replace(tmp, path)`` (atomic on POSIX);
        or keep the previous checkpoint until the new one is complete (versioned names, as the Trainer's
        checkpoint-N directories).
    Known problems
        Only writes through ``torch.save`` and safetensors' ``save_file`` (also under the names loaded modules
        import them as: peft's and transformers' ``safe_save_file``) can be interrupted; others skip. When
        your load fails even on an uninterrupted checkpoint (C1's finding: a ``weights_only`` load refusing an
        ``argparse.Namespace``), a save that cut the previous checkpoint's own file still fails, judged on the
        file's bytes; a save beside it cannot be judged without a working load and skips. A
        Trainer's interrupted ``checkpoint-N`` directory stays on disk, and ``resume_from_checkpoint=True`` (or
        ``get_last_checkpoint``, as transformers' example scripts resume) picks the newest directory: the pass
        says so as not judged (partly judged), since how the script picks its checkpoint is not handed over;
        resume from the newest directory that holds ``trainer_state.json`` (the Trainer writes it last). An Accelerate
        training without ``dlcheck_save_checkpoint`` is not judged (``save_state`` writes where your loop
        points it; the check would only judge its own choice of path), nor one with your save and no
        ``dlcheck_load_checkpoint`` (the check names the missing load: no load of dlcheck's own is paired with
        your save). A save named after a counter is judged
        as made once per value of it: a loop saving several times per epoch under an epoch-named file
        overwrites it, and C2 does not see that cadence.
    Not applicable
        None: every run that saves checkpoints can be interrupted while saving.
    """
    setup = get_setup(dlcheck)
    if setup.kind == "accelerate" and not dlcheck.has("save_checkpoint"):
        dlcheck.skip(
            "missing role: define fixture dlcheck_save_checkpoint (state, path) with your own save: with "
            "accelerator.save_state, where each save goes is your loop's choice (versioned checkpoint-N "
            "directories keep the previous one; one reused directory does not), and only your save shows it"
        )
    result = memo_or_skip(dlcheck, setup.sources, "ckpt:interrupted-save", setup.interrupted_save)
    cadence = (
        [
            f"the second save was made with the training dict's {result.advanced}, as your loop advances them between saves"
        ]
        if result.advanced
        else []
    )
    if result.error is None and result.loaded in ("previous", "new"):
        same = result.previous == result.target
        if result.latest is not None and result.latest_complete is False:
            # the previous checkpoint is intact, but the Trainer's own automatic resume takes the half-written one:
            # whether the script resumes that way (or from a path a person picks) is not handed over
            dlcheck.not_judged(
                "automatic resume",
                f"the Trainer's automatic resume (resume_from_checkpoint=True, get_last_checkpoint(output_dir) as "
                f"transformers' example scripts resume) takes {_short(result.latest)}, which the interrupted save left "
                "without trainer_state.json (the Trainer writes it last): a restart that resumes that way stops there "
                "until the directory is deleted; how your script picks its checkpoint is not handed over to the check",
            )
        dlcheck.measured(
            f"a save through {result.how} was interrupted half way while writing {_short(result.target)}: "
            + (
                f"{_short(result.previous)} still loads afterwards"
                if same
                else f"the previous checkpoint {_short(result.previous)} still loads afterwards"
            )
            + (f", with the {result.loaded} weights" if setup.kind in ("loop", "accelerate") else ""),
            *([f"file sizes before and after the interrupted save: {result.sizes}"] if result.sizes else []),
            *cadence,
            loaded=result.loaded,
        )
        return
    evidence = [f"a save through {result.how} was interrupted half way while writing {_short(result.target)}"]
    evidence += cadence
    if result.sizes:
        evidence.append(f"file sizes before and after the interrupted save: {result.sizes}")
    if result.error is not None and result.overwrote is False:
        evidence.append(
            f"the interrupted file is new (the previous checkpoint was not touched), yet loading "
            f"{_short(result.previous)} afterwards raises {result.error.split('. ')[0][:200]}"
        )
        if result.without_new == "previous":
            evidence.append(
                "with the half-written checkpoint put aside, your dlcheck_load_checkpoint restores the previous "
                "weights: the previous checkpoint is intact, the load takes the newest"
            )
        cause = (
            "each save writes a new checkpoint beside the previous one, and the load picks the newest: after a "
            "crash during a save, the resume loads the half-written checkpoint instead of the complete one (a "
            "resume 'latest', a restart after preemption, fails until someone deletes it)"
        )
        fix = (
            "write the new checkpoint under a temporary name and rename it when complete (os.replace), or make the "
            "resume skip a newest checkpoint that is incomplete (a marker file written last) and take the one before"
        )
        dlcheck.fail(evidence, cause, fix)
    if result.error is not None:
        if result.error.startswith("(not loaded: "):
            # the user's load fails on any checkpoint (C1's finding): the verdict stands on the bytes of the file
            evidence.append(f"{_short(result.previous)} afterwards: {result.error}")
        else:
            evidence.append(f"loading {_short(result.previous)} afterwards raises {result.error}")
        cause = (
            "the save writes straight onto the previous checkpoint's path: the file is truncated first, so an "
            "interruption leaves neither the old checkpoint nor the new one"
        )
        if setup.kind in ("loop", "accelerate"):
            cause += (
                " (your dlcheck_save_checkpoint is given the same path at both saves, as a script with one checkpoint "
                "path gives it, and writes the save at that path)"
            )
    else:
        evidence.append(
            f"loading {_short(result.previous)} afterwards gives weights that are neither the previous nor the new ones"
        )
        cause = "the checkpoint is written piece by piece onto the previous one: an interruption leaves a mix of both"
    fix = (
        "save to a temporary file in the same directory and rename it: torch.save(state, tmp); os.replace(tmp, path) "
        "(or keep the previous checkpoint until the new one is complete)"
    )
    if setup.kind in ("loop", "accelerate"):
        fix += (
            "; if your script versions its checkpoints instead (a new checkpoint-{step} directory each save), write "
            "dlcheck_save_checkpoint the same way, under the path it is given, and dlcheck_load_checkpoint taking the "
            "newest one: C2 then judges that"
        )
    dlcheck.fail(evidence, cause, fix)
