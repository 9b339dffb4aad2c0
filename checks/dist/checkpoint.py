from __future__ import annotations

import os

from ...registry import check
from . import measure
from .replicas import OPTIONAL, ROLES


def _rel(path: str, base: str) -> str:
    try:
        return os.path.relpath(path, os.path.dirname(base))
    except ValueError:
        return path


@check(
    "D5",
    domain="dist",
    title="every rank writes the checkpoint, or a rank cannot load it",
    roles=(*ROLES, "save_checkpoint", "load_checkpoint"),
    optional_roles=tuple(r for r in OPTIONAL if r not in ("save_checkpoint", "load_checkpoint")),
)
def check_distributed_checkpoint(dlcheck):
    """A checkpoint is written once (by rank 0, or by one collective save) and loads on every rank.

    What it does
        In the shared launch (see D1), after the training steps every rank calls ``dlcheck_save_checkpoint`` with
        the same path, as your script does; the writes through ``torch.save``, safetensors' ``save_file`` and
        ``torch.distributed.checkpoint.save`` are recorded per rank. Once every rank has returned from the save,
        every rank builds fresh objects (``dlcheck_make_training`` + ``dlcheck_dist_wrap``) and loads the path with
        ``dlcheck_load_checkpoint``. Fails when two ranks write the same file, when a rank cannot load, or loads
        other weights than the saved ones. A ``torch.distributed.checkpoint`` (DCP) save is then loaded at world
        size 1 in one more process: fails when the checkpoint saved at world size N cannot be resumed alone.
    Why it is bad
        ``torch.save(state, path)`` on every rank has N processes truncate and write the same file at once: a
        reader can meet a half-written file, and on shared storage the result is any interleaving. A sharded
        checkpoint that only loads at the world size that wrote it ties the resume to the same number of GPUs.
    Example
        torch.save({"model": model.module.state_dict()}, path)   # run by every rank
    Use instead
        ``if dist.get_rank() == 0: torch.save(...)`` then ``dist.barrier()`` before anyone loads; or a collective
        ``torch.distributed.checkpoint.save({"model": get_model_state_dict(model)}, checkpoint_id=path)``, which
        every rank calls and which writes each rank's shard once, and loads at another world size.
    Known problems
        The check waits for every rank to return from the save before loading (your script needs its own
        barrier there). Writes through other means (``open().write``, pickle) are not attributed to a rank: the
        pass says so. The reload at world size 1 runs only for a DCP save; loading back at world size N is the
        load every rank did.
    Not applicable
        Training that does not run distributed (no ``dlcheck_dist_wrap``).
    """
    run = measure.get_launch(dlcheck)
    measure.records(dlcheck, run, "train")
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
    for r, rec in enumerate(recs):
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
        if rec["loaded"] is not None and rec["loaded"] != rec["saved"]:
            name = next(n for n in rec["saved"] if rec["loaded"].get(n) != rec["saved"][n])
            dlcheck.fail(
                [f"rank {r} loads the checkpoint, but parameter {measure.short(name)!r} is not the saved one"],
                "the checkpoint does not hold the trained weights of this rank's replica (written by another rank, "
                "at another step, or loaded into a part of the model only)",
                "save the wrapped model's weights once (rank 0) after the step, and load them into the same module",
                rank=r,
            )
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
    if dcp_ranks:
        again = measure.reload_at(dlcheck, run, 1, path)
        loaded = again.stage("load")
        if loaded is None:
            measure.raise_failure(dlcheck, again, "load")
        rec = loaded[0]
        if rec["load_error"] or rec["loaded"] != recs[0]["saved"]:
            dlcheck.fail(
                [
                    f"the torch.distributed.checkpoint saved on {run.world} ranks, loaded in 1 process "
                    "(init_process_group at world size 1, dlcheck_make_training + dlcheck_dist_wrap + "
                    "dlcheck_load_checkpoint): "
                    + (
                        f"raises {rec['load_error'][:300]}"
                        if rec["load_error"]
                        else "gives other weights than the saved ones"
                    )
                ],
                "the sharded checkpoint is tied to the world size that wrote it",
                "save and load through torch.distributed.checkpoint with full state dicts "
                "(get_model_state_dict / set_model_state_dict), which reshard on load",
            )
        notes.append(f"the DCP checkpoint saved at world size {run.world} loads at world size 1 with the same weights")
    dlcheck.measured(*notes, world=run.world)
