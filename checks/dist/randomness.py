from __future__ import annotations

from typing import Any

from ...registry import check
from . import launch, measure
from .replicas import OPTIONAL, ROLES, _modules


@check(
    "D4",
    domain="dist",
    title="ranks start from different weights, or augment with the same random stream",
    roles=ROLES,
    optional_roles=OPTIONAL,
)
def check_rank_randomness(dlcheck):
    """The model starts identical on every rank; the data augmentation draws different numbers on each.

    What it does
        In the shared launch (see D1), every rank digests its parameters right after ``dlcheck_dist_wrap`` (DDP
        broadcasts rank 0's weights there), and fetches example 0 twice through its dataloader's dataset and
        collate (same workers, ``worker_init_fn`` and generator; the rank's generators put back afterwards).
        Fails when the starting weights differ between ranks (naming a module created after the DDP wrap, whose
        weights DDP did not broadcast, as such), or when the two fetches differ on a rank
        (the pipeline is random) yet every rank's first fetch is identical (every rank draws the same
        augmentation). States whether the ranks' torch generators, which dropout draws from, are identical at
        the first step. For a transformers / TRL Trainer, each rank's clone of it runs ``train()`` (which calls
        ``set_seed(args.seed)`` in every process) and, when training begins, example 0 is fetched through the
        Trainer's own train DataLoader (its dataset, collator, ``dataloader_num_workers`` and ``seed_worker``),
        then once more with the rank's global generators reseeded per rank: the cause says whether the shared
        draws come from the global streams the Trainer seeds alike (drawn in the main process: no DataLoader
        worker for ``seed_worker`` to reseed with the rank) or from a generator of the user's own.
    Why it is bad
        Ranks that start from different weights train different models (DDP only keeps them in step if it
        broadcast them). Ranks seeded alike — the same ``torch.manual_seed(seed)`` on every rank, or no seed at
        all before torch 2.14 (its default seed is the same in every process; 2.14 seeds each from the OS) — apply the same crops, flips and noise to their
        different examples, and DataLoader workers inherit the same base seed: the augmentation's diversity is
        divided by the world size.
    Example
        torch.manual_seed(1234)          # in every process: the same augmentation stream on every rank
    Use instead
        seed with the rank, ``torch.manual_seed(seed + rank)`` (numpy and random too), before building the data
        pipeline; wrap the model in DDP, which broadcasts rank 0's initial weights; or give the DataLoader a
        ``generator`` seeded with ``seed + rank``.
    Known problems
        Identical dropout masks across ranks (the same seed on every rank, as transformers' ``set_seed`` does) are
        stated, not failed: many recipes do so on purpose. Only the map-style dataset's example 0 is probed; an
        IterableDataset is not. The augmentation is probed through the loader each process builds:
        ``dlcheck_make_dataloader``'s, the one an Accelerate user's factory holds, or a Trainer's own; a
        Trainer's initial weights are a copy of your Trainer's model on every rank (your own initialisation is
        not what runs).
    Not applicable
        Training that does not run distributed (a plain loop without ``dlcheck_dist_wrap``; an Accelerate
        user's ``accelerator.prepare`` wraps the model itself).
    """
    run = measure.get_launch(dlcheck)
    recs = measure.records(dlcheck, run, "train")
    trainer = recs[0].get("trainer")
    if trainer:
        after = f"when {trainer}.train() began (after its DistributedDataParallel wrap)"
    elif recs[0].get("accelerate") and not dlcheck.has("dist_wrap"):
        after = "after dlcheck_make_training (accelerator.prepare)"
    else:
        after = "after dlcheck_dist_wrap"
    diff = measure.first_difference([r["init"] for r in recs])
    if diff is not None:
        name, rank = diff
        differing = [n for n in recs[0]["init"] if any(r["init"].get(n) != recs[0]["init"][n] for r in recs[1:])]
        late = [n for n in recs[0].get("unsynced") or () if n in differing]
        if late:
            name = late[0]
            rank = next(i for i, r in enumerate(recs) if r["init"].get(name) != recs[0]["init"][name])
        size = (
            measure.max_diff(recs[0]["init_tensors"].get(name), recs[rank]["init_tensors"].get(name))
            if recs[0]["init_tensors"] is not None
            else None
        )
        evidence = [
            f"right {after}, parameter {measure.short(name)!r} differs between rank 0 and rank "
            f"{rank}" + (f" (max |diff| {size:.3g})" if size is not None else ""),
            f"{len(differing)} of {len(recs[0]['init'])} parameters differ between the ranks",
            f"the model each rank trains: {recs[0]['wrapped']}",
        ]
        wrapper = "accelerator.prepare" if recs[0].get("accelerate") else "DistributedDataParallel"
        if late:
            modules = _modules(late)
            evidence.append(
                f"parameters the {wrapper} wrap does not know (created after it): "
                + ", ".join(repr(measure.short(n)) for n in late[:6])
            )
            cause = (
                f"module {', '.join(map(repr, modules))} was created after the model was wrapped ({wrapper}): DDP "
                "broadcast rank 0's weights at construction for the parameters it had then only, so each rank keeps "
                "its own random initialisation of the module created afterwards (and DDP does not average its "
                "gradients either)"
            )
            fix = "build (or attach) every module before wrapping: model.head = nn.Linear(...) first, then " + (
                "model = accelerator.prepare(model)" if recs[0].get("accelerate") else "DistributedDataParallel(model)"
            )
        elif recs[0]["ddp"] or recs[0].get("fsdp"):
            cause = (
                f"the weights differ right after the wrap although the model is wrapped ({recs[0]['wrapped']}, which "
                "broadcasts rank 0's weights at construction): they were changed on some ranks after the wrap (a "
                "re-initialisation or a load that differs per rank)"
            )
            fix = "load or re-initialise the weights before wrapping, or identically on every rank"
        else:
            cause = (
                "each rank builds its model from its own random stream and nothing makes the replicas equal: no "
                "DistributedDataParallel wrap (which broadcasts rank 0's weights), and a seed that differs per rank"
            )
            fix = (
                "wrap the model in DistributedDataParallel (it broadcasts rank 0's weights at construction), or seed "
                "identically before building the model and with the rank only afterwards"
            )
        dlcheck.fail(evidence, cause, fix, tensor=name)
    notes = [f"{len(recs[0]['init'])} parameters identical on the {run.world} ranks {after}"]
    if trainer:
        notes[0] += " (each rank trains a copy of your Trainer's model, and DDP broadcasts rank 0's weights)"
    aug = [r.get("augment") for r in recs]
    # each rank's own loader: dlcheck_make_dataloader's, the one an Accelerate user's factory prepared, the Trainer's
    built_by = (recs[0].get("loader") or {}).get("built_by", "")
    own_loader = (
        dlcheck.has("make_dataloader") or built_by.startswith("dlcheck_make_training") or (trainer and bool(built_by))
    )
    if trainer and not own_loader:
        notes.append("the augmentation was not probed: the Trainer's train() handed its callbacks no train DataLoader")
    elif not own_loader:
        notes.append("the augmentation was not probed: define fixture dlcheck_make_dataloader (each rank's loader)")
    elif all(a is not None and "digests" in a for a in aug):
        random_pipeline = any(a["digests"][0] != a["digests"][1] for a in aug)
        firsts = {a["digests"][0] for a in aug}
        shown = ", ".join(f"rank {r}: {a['digests'][0]}" for r, a in enumerate(aug))
        if random_pipeline and len(firsts) == 1:
            evidence = [
                notes[0],
                f"example {aug[0]['index']} fetched twice through the dataloader's pipeline on each rank: the two "
                "fetches differ (random augmentation), yet every rank's first fetch is identical "
                f"({shown})",
            ]
            if trainer:
                dlcheck.fail(evidence + _trainer_evidence(recs, aug), *_trainer_cause(recs, aug, trainer))
            dlcheck.fail(
                evidence,
                "every rank draws its augmentation from the same random stream: the same seed on every rank"
                + (
                    " (or none: torch's default seed is the same in every process)"
                    if launch.fresh_process_seed() is not None
                    else ""
                )
                + ", so the ranks' examples get the same crops, flips and noise",
                "seed each process with its rank before building the data pipeline: torch.manual_seed(seed + rank) "
                "(and numpy / random), or DataLoader(..., generator=torch.Generator().manual_seed(seed + rank)); "
                "DDP keeps the model's initial weights identical (it broadcasts rank 0's)",
            )
        if random_pipeline:
            notes.append(
                f"example {aug[0]['index']}'s augmentation differs between the ranks "
                f"({len(firsts)} different first fetches on {run.world} ranks)"
            )
        else:
            notes.append(f"example {aug[0]['index']} comes out the same on two fetches: the pipeline has no randomness")
    elif any(a is not None and "error" in a for a in aug):
        notes.append(f"the augmentation was not probed: {next(a['error'] for a in aug if a and 'error' in a)}")
    elif trainer:
        notes.append("the augmentation was not probed: the Trainer's train dataset has no length (an iterable dataset)")
    if trainer:
        seeding = recs[0].get("trainer_seed") or {}
        notes.append(
            f"the Trainer seeded every rank with set_seed(args.seed={seeding.get('seed')}); "
            f"dataloader_num_workers={seeding.get('num_workers')}"
        )
    if recs[0]["dropout"]:
        same = len({r["rng_at_step0"] for r in recs}) == 1
        notes.append(
            f"dropout ({', '.join(recs[0]['dropout'][:3])}): the ranks' torch generators at the first step are "
            + ("identical (the same masks on every rank; stated, not judged)" if same else "different")
        )
    dlcheck.measured(*notes, world=run.world)


def _trainer_evidence(recs: list[dict[str, Any]], aug: list[dict[str, Any]]) -> list[str]:
    """What the Trainer's seeding was, and whether the draws follow the global generators it seeds."""
    seeding = recs[0].get("trainer_seed") or {}
    lines = [
        f"the Trainer seeded every rank with set_seed(args.seed={seeding.get('seed')}) "
        f"(args.data_seed={seeding.get('data_seed')}); dataloader_num_workers={seeding.get('num_workers')}"
    ]
    own = [a.get("own_stream") for a in aug]
    if all(o for o in own):
        firsts = {o[0] for o in own}
        lines.append(
            "fetched again with each rank's global generators (random, NumPy, torch) reseeded differently: the first "
            "fetches are "
            + (
                "still identical on every rank (the draws come from a generator of your own)"
                if len(firsts) == 1
                else f"different ({len(firsts)} on {len(own)} ranks: the draws come from the global generators)"
            )
        )
    return lines


def _trainer_cause(recs: list[dict[str, Any]], aug: list[dict[str, Any]], trainer: str) -> tuple[str, str]:
    """(cause, fix) of a Trainer's ranks drawing the same augmentation: a generator of the user's own seeded alike
    on every rank, or the global streams the Trainer seeds alike, drawn in the main process (no DataLoader worker
    for the Trainer's ``seed_worker`` to reseed with the rank)."""
    workers = (recs[0].get("trainer_seed") or {}).get("num_workers") or 0
    own = [a.get("own_stream") for a in aug]
    if all(o for o in own) and len({o[0] for o in own}) == 1:
        return (
            f"your dataset or data collator draws its augmentation from a generator of its own, seeded alike on every "
            f"rank (a fixed seed, at import or from args.seed): the {trainer}'s seeding never reaches it — set_seed("
            "args.seed) seeds the global random / NumPy / torch generators"
            + (
                f", and its seed_worker reseeds those (not yours) in each of the {workers} DataLoader worker(s)"
                if workers
                else ""
            ),
            "seed that generator with the process: torch.Generator().manual_seed(seed + args.process_index) (or + "
            "int(os.environ['RANK'])), or draw from torch's global generator with dataloader_num_workers >= 1, which "
            "the Trainer's seed_worker reseeds with the rank in every worker",
        )
    if not workers:
        return (
            f"the {trainer} seeds every rank alike — set_seed(args.seed) in each process — and with "
            "dataloader_num_workers=0 your dataset's __getitem__ and the data collator draw in the main process from "
            "that shared stream (the Trainer's seed_worker, which reseeds with the rank, runs in DataLoader workers "
            "only): the ranks' different examples get the same random draws",
            "dataloader_num_workers >= 1 in the TrainingArguments (the Trainer's seed_worker then reseeds random, "
            "NumPy and torch in every worker with its rank), or draw from a generator seeded with args.seed + "
            "args.process_index",
        )
    return (
        f"every rank draws its augmentation from the same random stream although the {trainer} runs "
        f"{workers} DataLoader worker(s): a worker_init_fn of yours, or a generator the workers share, "
        "reseeds them alike on every rank",
        "reseed each worker with the rank: the Trainer's own seed_worker, or a worker_init_fn that adds "
        "args.process_index * num_workers to torch.utils.data.get_worker_info().seed",
    )
