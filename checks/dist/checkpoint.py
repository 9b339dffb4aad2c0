from __future__ import annotations

import os

from ...registry import check
from ...training.resume import DATA_FIX, DataResume, count_examples, counted, epoch_examples
from . import measure
from .replicas import OPTIONAL


def _rel(path: str, base: str) -> str:
    try:
        return os.path.relpath(path, os.path.dirname(base))
    except ValueError:
        return path


def _fail_local_shards(dlcheck, run, recs, shards, fsdp, path, rank, wrong) -> None:
    """The checkpoint holds rank-local shards (DTensors written by torch.save / save_file) and a rank does not
    get the saved weights back."""
    first = shards[0][1]
    name, local, full = first["tensors"][0]
    savers = sorted({r for r, _ in shards})
    several = len(savers) > 1
    dlcheck.fail(
        [
            f"rank{'s' if several else ''} {', '.join(map(str, savers))} of {run.world} "
            f"save{'' if several else 's'} {len(first['tensors'])} sharded tensors (DTensor) with {first['fn']} "
            f"to {_rel(first['target'], path)}: {measure.short(name)!r} is the rank's own shard {_shape(local)} of "
            f"{_shape(full)}",
            f"loaded on {run.world} ranks, rank {rank} "
            + (
                _raised(recs[rank]["load_error"], path)
                if recs[rank]["load_error"]
                else f"gets another {measure.short(wrong)!r} than the saved one (another rank's shard in its place)"
            ),
            f"the model each rank trains: {fsdp or 'sharded'} over {run.world} ranks",
        ],
        "model.state_dict() of a sharded model (FSDP's fully_shard) holds each rank's own shards only: "
        + (
            "written by rank 0 alone, the checkpoint lacks the other ranks' shards, and every rank loads rank 0's "
            "shard in place of its own"
            if not several
            else "written by every rank, the files are tied to this world size and this placement of the shards"
        ),
        "save collectively with torch.distributed.checkpoint on every rank: dcp.save({'model': "
        "get_model_state_dict(model), 'optim': get_optimizer_state_dict(model, optimizer)}, checkpoint_id=path), and "
        "load with dcp.load + set_model_state_dict / set_optimizer_state_dict; or gather a full state dict "
        "(get_model_state_dict(model, options=StateDictOptions(full_state_dict=True, cpu_offload=True))) and save it "
        "on rank 0",
        rank=rank,
        shards_saved_by=savers,
    )


def _raised(error: str, path: str) -> str:
    """A load's error for the evidence: "raised …", the checkpoint's directory left out of the paths."""
    error = error.replace(os.path.dirname(path) + os.sep, "")
    return (error if error.startswith("raised") else f"raised {error}")[:300]


def _emulated_device(rec: dict, rank: int) -> str | None:
    """Why a rank's load is not judged when its torch.load could not map the storages to the ranks' indexed CPU
    device (``map_location=accelerator.device`` = ``cpu:0`` in these CPU ranks), or None."""
    errors = rec.get("device_errors") or []
    if not errors:
        return None
    return (
        f"on rank {rank}, {errors[0][:240]} — these ranks run on CPU as Accelerate's MULTI_CPU processes, whose "
        "accelerator.device is cpu:0 (as under `accelerate launch --cpu`), and torch.load cannot map storages to an "
        "indexed CPU device; on GPU ranks the device is cuda:N and the same load runs (on a multi-CPU launch it "
        "fails for real: map_location=accelerator.device.type loads there)"
    )


def _shape(shape) -> str:
    return "x".join(map(str, shape)) or "scalar"


def _reshard(dlcheck, run, recs, path, kind) -> list[str]:
    """Load the checkpoint saved at world size N in one process, and one saved in one process on N ranks."""
    notes = []
    again = measure.reload_at(dlcheck, run, 1, path)
    loaded = again.stage("load")
    if loaded is None:
        measure.raise_failure(dlcheck, again, "load")
    rec = loaded[0]
    device = _emulated_device(rec, 0)
    if device and (rec["load_error"] or rec["loaded"] != recs[0]["saved"]):
        dlcheck.skip(f"the {kind} checkpoint's load at world size 1 is not judged: dlcheck_load_checkpoint {device}")
    if rec["load_error"] or rec["loaded"] != recs[0]["saved"]:
        dlcheck.fail(
            [
                f"the {kind} checkpoint saved on {run.world} ranks, loaded in 1 process "
                "(init_process_group at world size 1, dlcheck_make_training + dlcheck_dist_wrap + "
                "dlcheck_load_checkpoint): "
                + (
                    _raised(rec["load_error"], path) if rec["load_error"] else "gives other weights than the saved ones"
                ),
                f"files written on {run.world} ranks: {', '.join(recs[0]['files'][:6]) or 'none'}",
            ],
            "the sharded checkpoint is tied to the world size that wrote it",
            "save and load through torch.distributed.checkpoint (dcp.save / dcp.load of get_model_state_dict / "
            "get_optimizer_state_dict, set_model_state_dict on load), which reshards on load",
            saved_world=run.world,
            loaded_world=1,
        )
    notes.append(f"the {kind} checkpoint saved at world size {run.world} loads at world size 1 with the same weights")
    alone = measure.save_at(dlcheck, run, 1)
    saved = measure.records(dlcheck, alone, "ckpt")[0]
    trained = len(measure.records(dlcheck, alone, "train")[0]["steps"])
    if saved["load_error"] or saved["loaded"] != saved["saved"]:
        dlcheck.fail(
            [
                "dlcheck_save_checkpoint then dlcheck_load_checkpoint in 1 process (world size 1): "
                + (_raised(saved["load_error"], saved["path"]) if saved["load_error"] else "loads other weights")
            ],
            "the checkpoint does not load back even at world size 1, in the process that wrote it",
            "save and load the same objects: dcp.save / dcp.load of get_model_state_dict(model)",
            saved_world=1,
            loaded_world=1,
        )
    wide = measure.reload_at(dlcheck, alone, run.world, saved["path"])
    got = wide.stage("load")
    if got is None:
        measure.raise_failure(dlcheck, wide, "load")
    for r, rec in enumerate(got):
        device = _emulated_device(rec, r)
        if device and (rec["load_error"] or rec["loaded"] != saved["saved"]):
            dlcheck.skip(f"the load on {run.world} ranks is not judged: dlcheck_load_checkpoint {device}")
    # a rank that raised first: the others then have no gathered weights to compare
    for r, rec in sorted(enumerate(got), key=lambda item: item[1]["load_error"] is None):
        if rec["load_error"] or rec["loaded"] is None or rec["loaded"] != saved["saved"]:
            wrong = (
                next((n for n in saved["saved"] if rec["loaded"].get(n) != saved["saved"][n]), "?")
                if rec["loaded"] is not None
                else None
            )
            dlcheck.fail(
                [
                    f"the checkpoint saved in 1 process (world size 1, after {trained} micro-steps), loaded on "
                    f"{run.world} ranks (dlcheck_make_training + dlcheck_dist_wrap + dlcheck_load_checkpoint on "
                    f"each): rank {r} "
                    + (
                        _raised(rec["load_error"], saved["path"])
                        if rec["load_error"]
                        else f"gets another {measure.short(wrong)!r} than the saved one"
                        if wrong
                        else "loaded, but another rank raised (the loaded weights were not gathered)"
                    ),
                    f"files written at world size 1: {', '.join(saved['files'][:6]) or 'none'}",
                ],
                "the checkpoint is tied to the world size that wrote it: "
                + (
                    "each rank saves and loads its own file, so a rank that did not exist at save time finds none, "
                    "and a resume on more GPUs fails"
                    if kind == "per-rank"
                    else "it cannot be resumed on more processes than wrote it"
                ),
                "save and load through torch.distributed.checkpoint, collectively on every rank: "
                "dcp.save({'model': get_model_state_dict(model)}, checkpoint_id=path), and on load dcp.load into "
                "get_model_state_dict(fresh_model) + set_model_state_dict, which reshards to any world size; or one "
                "full state dict saved by rank 0 and loaded by every rank",
                rank=r,
                saved_world=1,
                loaded_world=run.world,
            )
    notes.append(
        f"the {kind} checkpoint saved at world size 1 (after {trained} micro-steps) loads at world size "
        f"{run.world} with the same weights on every rank"
    )
    return notes


#: how a line of :func:`_data_position` that judged nothing begins
NOT_JUDGED = "data position: not judged"


def _data_position(dlcheck, run, kind: str | None) -> list[str]:
    """The data position across a mid-epoch save and resume on every rank (the launch's "position" stage): the
    examples the ranks train together after the resume against the uninterrupted ranks'. Fails when some are
    trained twice or never; else the lines of what was measured, or why it was not judged."""
    recs = measure.records(dlcheck, run, "position")
    if all(rec["result"] is None and rec["error"] is None for rec in recs):
        if kind not in ("loop", "accelerate"):
            return []
        return [
            "data position: not judged: the dlcheck_make_training dict holds no dataloader (return the training "
            "DataLoader in it, as state['dataloader'], and the ranks' resume is drawn from it after your load)"
        ]
    device = next(
        (_emulated_device(rec, r) for r, rec in enumerate(recs) if rec.get("device_errors")),
        None,
    )
    if device:
        return [f"data position: not judged: the save-and-resume run's load, {device}"]
    errors = [(r, rec["error"]) for r, rec in enumerate(recs) if rec["error"]]
    if errors:
        r, error = errors[0]
        return [f"data position: not judged: the save-and-resume run on rank {r} ended with {error[:300]}"]
    results = [DataResume(**rec["result"]) for rec in recs]
    first = results[0]
    for r, res in enumerate(results):
        why = res.not_seen or res.unreadable or (res.load_error and f"your load raised: {res.load_error[:300]}")
        if why:
            return [f"data position: not judged on {run.world} ranks: rank {r}: {why}"]
    flat = lambda name: [step for res in results for step in getattr(res, name)]  # noqa: E731
    everything = count_examples(flat("before"), flat("expected"), flat("resumed"))
    # an example trained twice or never is counted within the epoch the save interrupted; the steps past its end
    # (all of them when the save is at an epoch's end) are a new epoch, judged as one: each example once
    parts = [res.parts() for res in results]
    within = lambda name: [step for part in parts for step in getattr(part, name)]  # noqa: E731
    c = count_examples(within("before"), within("expected"), within("resumed"))
    n, k, m = first.steps, first.saved_at, min(res.drawn for res in results)
    whole = first.whole
    span = " (each rank's whole epoch)" if whole and m == n else first.span("each rank's")
    source = (
        f"what your dlcheck_resume_dataloader makes of their state['{first.key}'] (a {first.through_role}, given "
        f"resumed_step={first.resumed_step})"
        if first.through_role is not None
        else f"their state['{first.key}']"
        + (f" (a {first.resumed_loader} after the load)" if first.resumed_loader != first.loader else "")
    )
    drawn = (
        f"on each of {run.world} ranks the uninterrupted run draws steps 1-{n}{span} from state['{first.key}'] "
        f"({first.loader}){first.rest()} and saves after step {k}{f' ({first.cadence})' if first.cadence else ''} "
        "through dlcheck_save_checkpoint (one path for every rank); "
        f"fresh objects loaded by dlcheck_load_checkpoint draw steps {k + 1}-{m} from {source}"
    )
    if everything.same:
        return [
            f"data position: {drawn}: the uninterrupted ranks' batches, step by step (over the {run.world} ranks: "
            f"{everything.before + everything.trained} examples, none trained twice, none lost)"
        ]
    first_part = parts[0]
    last = min(m, first_part.end)  # the last compared step of the epoch the save interrupted (k: none)
    if c.conclusive:
        per_rank = [count_examples(p.before, p.expected, p.resumed) for p in parts]
        fix = DATA_FIX["accelerate" if kind == "accelerate" else "loop"].replace(
            "state['dataloader']", f"state['{first.key}']"
        )
        if c.repeated:
            cause = (
                "does not continue the epoch where the save left it: it yields examples already trained before the "
                "save (each rank's shard started again, or skipped over another shuffle), so the resumed epoch trains "
                "some examples twice and never reaches others"
            )
            fix += "; on every rank, with the shuffle of the uninterrupted epoch (the sampler's seed and set_epoch)"
            if not first.cadence:
                fix += (
                    f" (D5 saved after step {k}, in the middle of an epoch: if your loop checkpoints only at epoch "
                    "ends, say so with dlcheck_checkpoint_every = 'epoch')"
                )
        else:
            cause = (
                "skips past batches it never trained: the resumed ranks train fewer examples than the uninterrupted "
                "ones and never reach the rest of their shards (a skip counted in steps of all ranks, or in examples, "
                "where each rank's loader counts its own batches)"
            )
            fix = (
                "skip, on each rank, the batches that rank trained in the epoch: accelerator.skip_first_batches("
                "loader, the rank's own micro-steps in the epoch) — not a step multiplied by num_processes, nor a "
                "count of examples"
            )
        beyond = f" (the epoch the save interrupted; steps {last + 1}-{m} start a new epoch)" if last < m else ""
        dlcheck.fail(
            [
                drawn,
                f"over the {run.world} ranks together, steps {first_part.start + 1}-{last}: "
                f"{counted(c, last, k, whole and last == m)}{beyond}",
                "per rank, against its own shard: "
                + "; ".join(f"rank {r}: {pc.repeated} twice, {pc.never} never seen" for r, pc in enumerate(per_rank)),
            ],
            cause=f"the resume on {run.world} ranks does not restore the data position: after the load, the ranks' "
            f"state['{first.key}'] " + cause,
            fix=fix,
            repeated=c.repeated,
            never_seen=c.never,
        )
    lines = []
    if last > k:
        if not c.same:
            return [
                f"data position: not judged: {drawn}: other batches than the uninterrupted ranks' in steps "
                f"{k + 1}-{last}, whose examples are not recognised by content ({c.other} of {c.trained} not among "
                "the uninterrupted run's, none trained twice)"
            ]
        lines.append(
            f"steps {k + 1}-{last} continue the epoch the save interrupted with the uninterrupted ranks' batches, step "
            f"by step (over the {run.world} ranks: {c.before + c.trained} examples of that epoch, none trained twice, "
            "none lost)"
        )
    if m > last:
        lines.append(_new_epoch(dlcheck, run, first, parts, drawn, k, last, m))
        if lines[-1].startswith(NOT_JUDGED):
            return [f"{NOT_JUDGED}: {drawn}: {lines[-1][len(NOT_JUDGED) :].lstrip(': ')}"]
    return [f"data position: {drawn}: " + "; ".join(lines)]


def _new_epoch(dlcheck, run, first, parts, drawn, k, last, m) -> str:
    """The resumed ranks' steps ``last + 1 .. m``, past the end of the epoch the save interrupted (all the compared
    steps when the save is at an epoch's end): a new epoch, which a new shuffle may order otherwise than the
    uninterrupted run's. Fails when it replays the saved epoch in its order (the loop resumed at the saved epoch),
    or when it is not a whole epoch: examples twice within it, or (drawn whole) examples it never reaches. Else the
    line of what was measured, or one starting with :data:`NOT_JUDGED`."""
    e = first.epoch
    ended = "the end of each rank's epoch" if k == last else f"the end of the epoch the save interrupted (step {last})"
    if all(p.resumed_new == p.expected_new for p in parts):
        return f"steps {last + 1}-{m}, past {ended}, the uninterrupted ranks' batches of the next epoch, step by step"
    replays = [
        p.reference and p.resumed_new == p.reference[: len(p.resumed_new)] != p.expected_new[: len(p.resumed_new)]
        for p in parts
    ]
    if k == last and all(replays):
        at = k - e + 1
        dlcheck.fail(
            [
                drawn,
                f"the save is at {ended}: the resumed ranks train the saved epoch again, in its order: "
                + ", ".join(f"step {last + 1 + i} = step {at + i}'s batch" for i in range(min(4, m - last)))
                + " (on every rank), where the uninterrupted ranks start the next epoch",
            ],
            cause=f"the resume on {run.world} ranks does not start the epoch after the saved one: after the load, the "
            f"ranks' state['{first.key}'] yields the epoch trained before the save (the loop resumes at the saved "
            "epoch, not the next one), so the resumed run trains an epoch's examples twice",
            fix="resume at the epoch after the saved one: start the loop at checkpoint['epoch'] + 1, with the "
            "sampler's set_epoch(epoch) given that epoch",
            replayed=m - last,
        )
    whole = k == last and all(p.whole_new for p in parts)
    new = [step for p in parts for step in (p.whole_new if whole else p.resumed_new)]
    reference = [step for p in parts for step in p.reference]
    if not reference:
        return f"{NOT_JUDGED}: steps {last + 1}-{m} start a new epoch, and no whole epoch of the uninterrupted ranks' to count its examples against"
    ex = epoch_examples(new, reference, whole)
    steps = f"steps {last + 1}-{last + e}" if whole else f"steps {last + 1}-{m}"
    if ex.conclusive:
        per_rank = [epoch_examples(p.whole_new if whole else p.resumed_new, p.reference, whole) for p in parts]
        dlcheck.fail(
            [
                drawn,
                f"the save is at {ended}: the resumed ranks start a new epoch"
                + (
                    f", drawn whole ({steps}: steps {m + 1}-{last + e} without training them)"
                    if whole and last + e > m
                    else f" ({steps})"
                ),
                f"over the {run.world} ranks together, that new epoch: {ex.repeated} examples twice, "
                + (f"{ex.never} never seen " if whole else "")
                + f"({ex.drawn} examples drawn, {ex.distinct} distinct; an uninterrupted epoch holds {ex.reference}"
                + (f", {ex.own_repeats} of them repeats" if ex.own_repeats else "")
                + ")",
                "per rank: "
                + "; ".join(
                    f"rank {r}: {pe.repeated} twice{f', {pe.never} never seen' if whole else ''}"
                    for r, pe in enumerate(per_rank)
                ),
            ],
            cause=f"the resume on {run.world} ranks does not give the ranks a whole epoch after the save at {ended}: "
            "the new epoch trains some examples twice and never reaches others (the load skips batches into the "
            "new epoch, as if the save were in the middle of one, or the ranks' shards of it overlap)",
            fix="skip only the batches each rank trained in the epoch the save interrupted — none when the save is at "
            "an epoch's end: resumed_step = the rank's micro-steps in that epoch (optimizer steps x "
            "gradient_accumulation_steps, modulo len(dataloader)), not the optimizer steps; and shuffle every rank's "
            "sampler with the same seed and epoch",
            repeated=ex.repeated,
            never_seen=ex.never,
        )
    if whole and ex.other:
        return (
            f"{NOT_JUDGED}: the resumed ranks' new epoch after the save at {ended} ({steps}, drawn whole) holds "
            f"{ex.other} examples not among an uninterrupted epoch's (not recognised by content): not counted"
        )
    order = "in another order than the uninterrupted ranks' (a new epoch's shuffle, not a data position)"
    if whole:
        return (
            f"steps {last + 1}-{m}, past {ended}, start a new epoch {order}: that epoch, drawn whole ({steps}"
            + (f": steps {m + 1}-{last + e} without training them" if last + e > m else "")
            + f"), is a whole epoch over the {run.world} ranks ({ex.distinct} examples, none twice, none lost)"
        )
    return (
        f"steps {last + 1}-{m}, past {ended}, start a new epoch {order}: no example twice in them over the "
        f"{run.world} ranks ({ex.drawn} examples; the rest of that epoch not drawn)"
    )


@check(
    "D5",
    domain="dist",
    title="every rank writes the checkpoint, a rank cannot load it, it is tied to one world size, or the ranks' resume "
    "loses the data position",
    roles=(),
    optional_roles=tuple(
        dict.fromkeys((*OPTIONAL, "make_training", "save_checkpoint", "load_checkpoint", "checkpoint_every"))
    ),
)
def check_distributed_checkpoint(dlcheck):
    """A checkpoint is written once (by rank 0, or by one collective save), loads on every rank, and a sharded
    one loads at another world size.

    What it does
        In the shared launch (see D1), after the training steps every rank calls ``dlcheck_save_checkpoint`` with
        the same path, as your script does; the writes through ``torch.save``, safetensors' ``save_file`` and
        ``torch.distributed.checkpoint.save`` are recorded per rank, with the sharded tensors (DTensors: FSDP2's
        ``fully_shard`` parameters) a plain write saves. Once every rank has returned from the save, every rank
        builds fresh objects (``dlcheck_make_training`` + ``dlcheck_dist_wrap``) and loads the path with
        ``dlcheck_load_checkpoint``; the full weights (a sharded model's gathered) are compared with the saved
        ones. Fails when two ranks write the same file, when a rank cannot load, or loads other weights than the
        saved ones (named as rank-local shards when the save held DTensors). A checkpoint of shards — a
        ``torch.distributed.checkpoint`` (DCP) save, a file per rank, or a sharded (FSDP) model — is then moved
        across world sizes in both directions: the one saved at world size N is loaded in one process, and one
        saved in one process (the launch's micro-steps, ``dlcheck_save_checkpoint``) is loaded on N ranks. Fails when either
        raises or gives other weights.

        The data position on N ranks: when the ``dlcheck_make_training`` dict holds the training DataLoader (an
        Accelerate-prepared one, sharded per rank), every rank runs C1's data-position run on its own shard — fresh
        objects train one epoch of the rank's batches (at most 8), save half way through your save (one path for
        every rank), and other fresh objects, loaded by your load once every rank has saved, draw the rest from
        their ``state['dataloader']`` as your load leaves it. The examples the ranks train together after the resume
        are counted by content against the uninterrupted ranks', within the epoch the save interrupted. Fails when
        some are trained twice or never (a skip over a reshuffled epoch; a skip of ``step * num_processes`` batches,
        which one process never shows). The steps past that epoch's end — all of them when the save is at an
        epoch's end (``dlcheck_checkpoint_every``) — are a new epoch, which another shuffle may order otherwise than
        the uninterrupted run's: it is judged as an epoch, not by that order. After a save at an epoch's end the
        resumed ranks' new epoch is drawn whole (its rest without training, up to 256 batches); it fails when it
        holds an example twice or (drawn whole) never reaches one that an uninterrupted epoch holds (a skip into the new epoch, shards that overlap), or when it
        replays the saved epoch in its order (the loop resumed at the saved epoch, not the next one).
    Why it is bad
        ``torch.save(state, path)`` on every rank has N processes truncate and write the same file at once: a
        reader can meet a half-written file, and on shared storage the result is any interleaving.
        ``model.state_dict()`` of a sharded model holds each rank's own shards only: saved by rank 0, the other
        ranks' shards are lost and every rank loads rank 0's in place of its own, silently. A checkpoint that
        only loads at the world size that wrote it (one file per rank, read back by rank number) ties the
        resume to the same number of GPUs: a run resumed on more GPUs fails on the ranks that had no file. A resume
        that does not put each rank back where its shard was trains the first examples twice and never reaches
        others, silently, every time the job is preempted.
    Example
        torch.save({"model": model.module.state_dict()}, path)               # run by every rank
        torch.save(model.state_dict(), f"{path}.rank{dist.get_rank()}")     # one file per rank
        if rank == 0: torch.save(fsdp_model.state_dict(), path)             # rank 0's shards only
        loader = accelerator.skip_first_batches(loader, step * accelerator.num_processes)  # past the shard
    Use instead
        ``if dist.get_rank() == 0: torch.save(...)`` then ``dist.barrier()`` before anyone loads; or a collective
        ``torch.distributed.checkpoint.save({"model": get_model_state_dict(model), "optim":
        get_optimizer_state_dict(model, optimizer)}, checkpoint_id=path)``, which every rank calls, which writes
        each rank's shard once, and whose ``dcp.load`` + ``set_model_state_dict`` reshards to any world size.
        On resume, skip on each rank the batches that rank trained in the epoch, on the same shuffle
        (``DataLoaderConfiguration(use_seedable_sampler=True)``), or use a stateful dataloader.
    Known problems
        The check waits for every rank to return from the save before loading (your script needs its own
        barrier there). Writes through other means (``open().write``, pickle) are not attributed to a rank: the
        pass says so. The moves across world sizes go between N and 1 only (not N to M), and a checkpoint of
        full tensors written by one rank is not moved (it is the same at any world size). Only the parameters
        are compared after a load (optimizer state and schedulers are C1's, in one process). When the replicas
        already differ before the save (D1's or D4's finding), a rank loading other weights than its own replica's
        follows from that: the check skips naming D1 (or D4); several ranks writing one file is still judged. FSDP is judged for
        FSDP2 (``fully_shard``, which runs on CPU with gloo in torch 2.14); FSDP1 (``FullyShardedDataParallel``)
        runs on CPU with gloo too, but its flat parameter is each rank's own shard: the dist checks skip it,
        naming FSDP1. The data position is judged only when the training dict holds the loader and your load
        replaces or restores it (else the pass says it was not judged); ``dlcheck_resume_dataloader`` is used in
        the ranks when they are forked (not under ``spawn``, where a conftest's lambda need not pickle). With
        ``dlcheck_checkpoint_every`` ("epoch", or N optimizer steps) each rank saves where your loop saves, as C1
        does (an epoch's end: a resume that starts the saved epoch again fails); without it the save is half way
        through each rank's epoch, and a failure names the role. The ranks run on CPU as Accelerate's MULTI_CPU
        processes, whose ``accelerator.device`` is ``cpu:0`` (as under ``accelerate launch --cpu``): a load through
        ``torch.load(path, map_location=accelerator.device)`` cannot map its storages there (on GPU ranks the device
        is ``cuda:N`` and it loads). When a rank's load met that error — raised, or caught by your load — that rank's
        load (and the data position it ends) is not judged, and the check skips saying so unless another rank fails
        on its own; a ``torch.load`` imported by name before the launch is not seen.
    Not applicable
        Training that does not run distributed (no ``dlcheck_dist_wrap``).
    """
    if not dlcheck.has("make_training") and (dlcheck.has("lightning_module") or dlcheck.has("trainer")):
        # a LightningModule is said not launched, a Trainer's checkpoints not yet recorded: neither is asked for a
        # plain loop's roles
        measure.the_setup(dlcheck)
    dlcheck.require("make_training", "save_checkpoint", "load_checkpoint")
    run = measure.get_launch(dlcheck)
    train = measure.records(dlcheck, run, "train")
    recs = measure.records(dlcheck, run, "ckpt")
    path = recs[0]["path"]
    writers: dict[str, list[int]] = {}
    dcp_ranks = []
    for r, rec in enumerate(recs):
        for fn, target in rec["events"]:
            if fn.startswith("torch.distributed.checkpoint"):
                dcp_ranks.append(r)
                continue
            writers.setdefault(os.path.abspath(target), []).append(r)
    shared = {t: rs for t, rs in writers.items() if len(set(rs)) > 1}
    if shared:
        target, ranks = next(iter(shared.items()))
        dlcheck.fail(
            [
                f"dlcheck_save_checkpoint on {run.world} ranks, given the same path: ranks "
                f"{', '.join(map(str, sorted(set(ranks))))} each write {_rel(target, path)} "
                f"({', '.join(sorted({fn for rec in recs for fn, t in rec['events'] if os.path.abspath(t) == target}))})",
            ],
            "every rank saves the checkpoint: the processes truncate and write the same file at once, so a reader can "
            "load a half-written file (and on shared storage the result is any interleaving)",
            "save on rank 0 only and wait before loading: if dist.get_rank() == 0: torch.save(...); dist.barrier() — "
            "or a collective torch.distributed.checkpoint.save that every rank calls",
            writers=len(set(ranks)),
        )
    shards = [(r, sh) for r, rec in enumerate(recs) for sh in rec.get("shards", [])]
    fsdp = train[0].get("fsdp")
    drifted = measure.drift(train)
    emulated: list[str] = []
    for r, rec in enumerate(recs):
        wrong = (
            next((n for n in rec["saved"] if rec["loaded"].get(n) != rec["saved"][n]), None)
            if rec["loaded"] is not None
            else None
        )
        device = _emulated_device(rec, r)
        if device and (rec["load_error"] or wrong is not None):
            # not this rank's verdict; another rank's conclusive failure still fails below
            emulated.append(device)
            continue
        if wrong is not None and not rec["load_error"] and drifted is not None:
            # each rank saved its own replica: one checkpoint cannot give every rank its own weights back
            dlcheck.skip(
                f"rank {r} loads other weights than its own replica's ({measure.short(wrong)!r}), but {drifted}"
            )
        if shards and (rec["load_error"] or wrong):
            _fail_local_shards(dlcheck, run, recs, shards, fsdp, path, r, wrong)
        if rec["load_error"]:
            dlcheck.fail(
                [
                    f"after the save on {run.world} ranks, dlcheck_load_checkpoint on rank {r} raises: "
                    f"{rec['load_error'][:300]}",
                    f"files written: {', '.join(rec['files'][:6]) or 'none'}",
                ],
                "the checkpoint cannot be loaded on every rank: it lives where only one rank sees it, or "
                "holds what the fresh objects on that rank cannot take",
                "save to storage every rank reads, and load into the same kind of objects (wrapped or not) that saved it",
                rank=r,
            )
        if wrong is not None:
            dlcheck.fail(
                [f"rank {r} loads the checkpoint, but parameter {measure.short(wrong)!r} is not the saved one"],
                "the checkpoint does not hold the trained weights of this rank's replica (written by another rank, "
                "at another step, or loaded into a part of the model only)",
                "save the wrapped model's weights once (rank 0) after the step, and load them into the same module",
                rank=r,
            )
    if emulated:
        dlcheck.skip(f"whether every rank loads the checkpoint is not judged: dlcheck_load_checkpoint {emulated[0]}")
    per_rank_files = len(writers) > 1 and len({rs[0] for rs in writers.values()}) > 1
    notes = [
        f"dlcheck_save_checkpoint on {run.world} ranks: "
        + (
            "one collective torch.distributed.checkpoint save"
            if dcp_ranks and not writers
            else "; ".join(
                f"{_rel(t, path)} written by rank {', '.join(map(str, sorted(set(rs))))}" for t, rs in writers.items()
            )
            or "no write seen through torch.save, save_file or DCP (writers not attributed)"
        ),
        f"loaded on every rank with the saved weights ({len(recs[0]['saved'])} parameters); files: "
        f"{', '.join(recs[0]['files'][:5])}",
    ]
    # a checkpoint of shards (DCP, a file per rank, a sharded model) is loaded at the other world size too
    if run.world > 1 and (dcp_ranks or shards or fsdp or per_rank_files):
        kind = "DCP" if dcp_ranks else "sharded" if shards or fsdp else "per-rank"
        notes += _reshard(dlcheck, run, recs, path, kind)
    else:
        notes.append(
            "one checkpoint of full tensors written by one rank: the same at any world size, not reloaded at another"
        )
    position = _data_position(dlcheck, run, getattr(measure.the_setup(dlcheck), "kind", None))
    for line in position:
        if line.startswith(NOT_JUDGED):  # the pass says so, and the summary counts it as partly judged
            dlcheck.not_judged("the data position", line[len(NOT_JUDGED) :].lstrip(": "))
    judged = [line for line in position if not line.startswith(NOT_JUDGED)]
    dlcheck.measured(*notes, *judged, world=run.world)
