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
    """The model starts identical on every rank; the augmentation and the training step draw different numbers on each.

    What it does
        In the shared launch (see D1), every rank digests its parameters right after ``dlcheck_dist_wrap`` (DDP
        broadcasts rank 0's weights there), and fetches example 0 sixteen times through its dataloader's dataset
        and collate (same workers, ``worker_init_fn`` and generator; the rank's generators put back afterwards):
        a p = 0.5 flip comes out the same on all of them with probability 3e-5, and without DataLoader workers the
        fetches' draws from the global generators are followed too (no "no randomness" from a pipeline that draws).
        On the first micro-step of ``dlcheck_train_step``, with dropout off (its layers and float attention-dropout
        attributes), it reads which global generators (Python's random, NumPy's, torch's CPU and CUDA ones) the
        step moves — the noise and timesteps of a diffusion step (``torch.randn_like``, ``torch.randint``) — and
        whether they are identical on every rank when the step begins; when they are, the loss of that batch
        (``dlcheck_compute_loss`` or the model's own, no gradient) is computed under two different seeds to tell
        draws that change the loss from draws that change nothing (BART's LayerDrop number at layerdrop 0).
        Fails when the starting weights differ between ranks (naming a module created after the DDP wrap, whose
        weights DDP did not broadcast, as such), when the fetches differ on a rank (the pipeline is random) yet
        every rank's fetches are identical one by one (every rank draws the same augmentation), or when the step
        draws from a global generator that is identical on every rank and its draws change the loss (the same
        noise on every rank). States whether the ranks' torch generators, which dropout draws from, are
        identical at the first step. For a transformers / TRL Trainer, each rank's clone of it runs ``train()``
        (which calls ``set_seed(args.seed)`` in every process) and, when training begins, example 0 is fetched
        through the Trainer's own train DataLoader (its dataset, collator, ``dataloader_num_workers`` and
        ``seed_worker``), then again with the rank's global generators reseeded per rank: the cause says whether
        the shared draws come from the global streams the Trainer seeds alike (drawn in the main process: no
        DataLoader worker for ``seed_worker`` to reseed with the rank) or from a generator of the user's own. When
        the same fetches survive reseeding the global generators per rank (a plain loop's too), D4 looks for the
        generators of the user's own the dataset, the collate function and the ``worker_init_fn`` reach
        (``torch.Generator``, NumPy ``Generator`` / ``RandomState``, ``random.Random``, in attributes, closures and
        the module globals their code reads), tells those built in the rank (after the launch started it) from
        those built before it, in the pytest process, and fetches again with each group reseeded per rank. A
        generator built in every rank whose reseeding makes the ranks differ fails (seeded alike in every
        process: ``torch.Generator().manual_seed(0)`` in the dataset ``dlcheck_make_dataloader`` builds). One
        built before the launch is not judged (below).
    Why it is bad
        Ranks that start from different weights train different models (DDP only keeps them in step if it
        broadcast them). Ranks seeded alike — the same ``torch.manual_seed(seed)`` or Accelerate ``set_seed(seed)``
        on every rank, or no seed at all before torch 2.14 (its default seed is the same in every process; 2.14
        seeds each from the OS) — apply the same crops, flips and noise to their different examples, draw the same
        diffusion noise and timesteps in every step, and DataLoader workers inherit the same base seed: the
        randomness's diversity is divided by the world size.
    Example
        set_seed(args.seed)              # in every process (diffusers' scripts): the same flips, noise and
                                         # timesteps on every rank
    Use instead
        seed with the rank: Accelerate's ``set_seed(seed, device_specific=True)`` or ``torch.manual_seed(seed +
        rank)`` (numpy and random too), before building the data pipeline; wrap the model in DDP, which broadcasts
        rank 0's initial weights; or give the DataLoader a ``generator`` seeded with ``seed + rank``; a generator of
        your own seeded with the rank too (``torch.Generator().manual_seed(seed + rank)``, ``A.Compose(...,
        seed=seed + rank)``), or from the OS in each process.
    Known problems
        Identical dropout masks across ranks (the same seed on every rank, as transformers' ``set_seed`` does) are
        stated, not failed: many recipes do so on purpose; a dropout the step draws through a literal
        ``F.dropout(x, 0.1)`` cannot be turned off and reads as a draw of the step. Only the map-style dataset's
        example 0 is probed; an IterableDataset is not; a pipeline that changes example 0 rarely (p well under 0.5)
        may read as unchanged. Draws from a ``torch.Generator`` of the user's own are not followed in the step
        (they show in the augmentation's fetches only). When the loss of the batch cannot be computed (no
        ``dlcheck_compute_loss`` for a model that does not take the batch), a step drawing alike on every rank
        is said not judged (the draws may change nothing: a LayerDrop at 0); define ``dlcheck_compute_loss``.
        When the step moves several global generators, each is reseeded alone: one alike on every rank that
        leaves the loss as it is (a draw for logging) is not blamed. A Trainer's own training steps are not followed (its dropout
        is stated). The augmentation is probed through the loader each process builds:
        ``dlcheck_make_dataloader``'s, the one an Accelerate user's factory holds, or a Trainer's own; a
        Trainer's initial weights are a copy of your Trainer's model on every rank (your own initialisation is
        not what runs). The ranks are forked from the pytest process: an object built there — your Trainer's
        train dataset and its transform, always; a module-level dataset or generator a plain loop's
        ``dlcheck_make_dataloader`` hands out instead of building — reaches every rank in one state, whereas
        each process of a real launch builds its own. An identical stream from a generator of that kind is
        therefore not judged ("partly judged", naming the generator and what its state tells of its seed: a
        NumPy ``SeedSequence`` entropy of 128 bits is ``default_rng()``'s draw from the OS, as albumentations
        2.x's ``A.Compose`` makes without ``seed``; a torch initial seed): whether the script seeds it alike in
        every process (``A.Compose(..., seed=42)``, a real finding) or from the OS (correct) is not seen, and
        the seed its state shows cannot tell ``seed`` from ``seed + rank`` either (the pytest process is rank 0).
        A generator D4 cannot locate (held by C code, created in DataLoader workers only) is not judged alike.
    Not applicable
        Training that does not run distributed: a single-process script of the user's own. A plain loop without
        ``dlcheck_dist_wrap`` is asked for it (a missing role: the wrap is what says the script runs distributed);
        an Accelerate user's ``accelerator.prepare`` wraps the model itself.
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
        fetched = len(aug[0]["digests"])
        seqs = [tuple(a["digests"]) for a in aug]
        random_pipeline = any(len(set(q)) > 1 for q in seqs)
        if random_pipeline and len(set(seqs)) == 1:
            shown = ", ".join(
                f"rank {r}: {len(set(q))} different results, the first {q[0]}" for r, q in enumerate(seqs)
            )
            evidence = [
                notes[0],
                f"example {aug[0]['index']} fetched {fetched} times through the dataloader's pipeline on each rank: "
                "the fetches differ (random augmentation), yet every rank's fetches are identical, one by one "
                f"({shown})",
            ]
            source, gens = _own_source(aug)
            if source in ("inherited", "unlocated"):
                # a generator the forked ranks inherit in one state: a real launch builds one per process
                notes.append(evidence[1])
                notes.extend(_trainer_evidence(recs, aug)[1:] if trainer else _own_stream_lines(aug))
                dlcheck.not_judged(
                    "the augmentation's random stream across the ranks", _inherited_reason(source, gens, trainer)
                )
            elif trainer:
                dlcheck.fail(evidence + _trainer_evidence(recs, aug), *_trainer_cause(recs, aug, trainer, gens))
            elif source == "rank_built":
                dlcheck.fail(
                    evidence + _own_stream_lines(aug),
                    f"your data pipeline draws its augmentation from {_named(gens)}, built in every rank "
                    "(dlcheck_make_dataloader runs in each process) and seeded alike: every rank draws the same "
                    "stream from it, so the ranks' examples get the same crops, flips and noise; reseeded with the "
                    "rank, the ranks' fetches differ",
                    _own_fix("rank"),
                )
            else:
                step = _step_evidence(recs)
                dlcheck.fail(
                    evidence + step,
                    "every rank draws its augmentation from the same random stream: the same seed on every rank"
                    + (
                        " (or none: torch's default seed is the same in every process)"
                        if launch.fresh_process_seed() is not None
                        else ""
                    )
                    + ", so the ranks' examples get the same crops, flips and noise"
                    + (
                        ", and your training step draws the same random numbers (noise, timesteps) on every rank"
                        if step
                        else ""
                    ),
                    "seed each process with its rank before building the data pipeline: torch.manual_seed(seed + "
                    "rank) (and numpy / random; Accelerate: set_seed(seed, device_specific=True)), or DataLoader(..., "
                    "generator=torch.Generator().manual_seed(seed + rank)); DDP keeps the model's initial weights "
                    "identical (it broadcasts rank 0's)",
                )
        elif random_pipeline:
            notes.append(
                f"example {aug[0]['index']}'s augmentation differs between the ranks ({len(set(seqs))} different "
                f"sequences of {fetched} fetches on {run.world} ranks)"
            )
        if not random_pipeline:
            notes.append(_no_randomness_seen(aug, fetched))
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
    _judge_step(dlcheck, recs, run.world, notes)
    if recs[0]["dropout"]:
        same = len({r["rng_at_step0"] for r in recs}) == 1
        notes.append(
            f"dropout ({', '.join(recs[0]['dropout'][:3])}): the ranks' torch generators at the first step are "
            + ("identical (the same masks on every rank; stated, not judged)" if same else "different")
        )
    dlcheck.measured(*notes, world=run.world)


def _differs(aug: list[dict[str, Any]], key: str) -> bool:
    """Whether the fetches of the probe ``key`` were taken on every rank and differ between the ranks."""
    runs = [a.get(key) for a in aug]
    return all(runs) and len({tuple(r) for r in runs}) > 1


def _own_source(aug: list[dict[str, Any]]) -> tuple[str, list[dict[str, Any]]]:
    """Where the draws that are the same on every rank come from, and the generators of the user's own found:
    ``global`` (reseeding the global generators per rank makes the ranks differ, or that was not probed),
    ``rank_built`` (a generator built in the rank, after the fork: reseeding it per rank makes them differ),
    ``inherited`` (one built before the launch, in the pytest process, does) or ``unlocated`` (none found does)."""
    own = [a.get("own_stream") for a in aug]
    if not all(own) or len({tuple(o) for o in own}) > 1:
        return "global", []
    gens = aug[0].get("generators") or []
    if _differs(aug, "rank_built_stream"):
        return "rank_built", _responsible(aug, [g for g in gens if not g["inherited"]])
    if _differs(aug, "inherited_stream"):
        return "inherited", _responsible(aug, [g for g in gens if g["inherited"]])
    return "unlocated", gens


def _responsible(aug: list[dict[str, Any]], gens: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Of a group of generators whose reseeding made the ranks differ, those that do so alone (probed one by one
    when the group holds a few); the whole group when none was probed alone or none does it alone."""
    alone = []
    for g in gens:
        runs = [next((h.get("stream") for h in a.get("generators") or () if h["path"] == g["path"]), None) for a in aug]
        if all(runs) and len({tuple(r) for r in runs}) > 1:
            alone.append(g)
    return alone or gens


def _named(gens: list[dict[str, Any]]) -> str:
    """The generators as the evidence names them: type, where the pipeline holds it, what its state says of its
    seed."""
    if not gens:
        return "a generator of your own"
    shown = [f"{g['type']} at {g['path']}" + (f" ({g['seed']})" if g.get("seed") else "") for g in gens[:3]]
    return ", ".join(shown) + (f" and {len(gens) - 3} more" if len(gens) > 3 else "")


def _own_stream_lines(aug: list[dict[str, Any]]) -> list[str]:
    """The probes that locate a plain loop's shared draws: the global generators reseeded, then the generators of
    the user's own."""
    own = [a.get("own_stream") for a in aug]
    if not all(own):
        return []
    lines = [
        "fetched again with each rank's global generators (random, NumPy, torch) reseeded differently: the fetches "
        + (
            "are still identical on every rank, one by one (the draws come from a generator of your own)"
            if len({tuple(o) for o in own}) == 1
            else f"differ ({len({tuple(o) for o in own})} sequences on {len(own)} ranks)"
        )
    ]
    return lines + _generator_lines(aug)


def _generator_lines(aug: list[dict[str, Any]]) -> list[str]:
    gens = aug[0].get("generators")
    if gens is None:
        return []
    if not gens:
        return [
            "no generator of your own (torch.Generator, NumPy Generator / RandomState, random.Random) is reachable "
            "from the dataset, the collate function or the worker_init_fn"
        ]
    lines = []
    for key, inherited, what in (
        ("rank_built_stream", False, "built in the rank (after the launch started it)"),
        ("inherited_stream", True, "built before the launch (in the pytest process) and inherited by the rank"),
    ):
        part = [g for g in gens if g["inherited"] is inherited]
        if part:
            runs = [a.get(key) for a in aug]
            line = f"{_named(part)}: {what}; reseeded differently on each rank, the fetches " + (
                "differ" if _differs(aug, key) else "are still identical" if all(runs) else "were not taken"
            )
            alone = _responsible(aug, part) if _differs(aug, key) and len(part) > 1 else part
            if len(alone) < len(part):
                line += f" (reseeded alone, {_named(alone)} makes them differ)"
            lines.append(line)
    return lines


def _own_fix(rank: str) -> str:
    return (
        f"seed that generator with the process when you build it: torch.Generator().manual_seed(seed + {rank}), "
        f"np.random.default_rng(seed + {rank}), random.Random(seed + {rank}), albumentations' A.Compose(..., "
        f"seed=seed + {rank}); or draw from the global generators, seeded with the rank"
    )


def _inherited_reason(source: str, gens: list[dict[str, Any]], trainer: str | None) -> str:
    """Why an identical stream drawn from a generator of the user's own is not judged."""
    built = (
        f"your {trainer}'s train dataset (and its transform) was built in the pytest process and reaches every "
        "forked rank as it is"
        if trainer
        else "dlcheck_make_dataloader hands every rank an object built before the launch (a module-level dataset, "
        "transform or generator), which the forked ranks inherit instead of building"
    )
    if source == "inherited":
        head = f"the same draws on every rank come from {_named(gens)}, built before the launch: {built}"
    else:
        head = (
            "the same draws on every rank come from a generator of your own that D4 did not locate (reseeding "
            + ("the generators it found, " + _named(gens) + ", changes nothing" if gens else "none found reachable")
            + f"): it may be one built before the launch ({built})"
        )
    return (
        f"{head}. Forked, every rank starts from one state of it, whereas each process of a real launch builds its "
        "own: seeded alike in every process (a fixed seed: the ranks draw the same augmentation, a real finding) or "
        "from the OS (different on every rank, correct). Which of the two your script does is not seen here"
        + ("" if trainer else "; build it in dlcheck_make_dataloader, as each process does, to have it judged")
    )


def _trainer_evidence(recs: list[dict[str, Any]], aug: list[dict[str, Any]]) -> list[str]:
    """What the Trainer's seeding was, and whether the draws follow the global generators it seeds."""
    seeding = recs[0].get("trainer_seed") or {}
    lines = [
        f"the Trainer seeded every rank with set_seed(args.seed={seeding.get('seed')}) "
        f"(args.data_seed={seeding.get('data_seed')}); dataloader_num_workers={seeding.get('num_workers')}"
    ]
    own = [a.get("own_stream") for a in aug]
    if all(o for o in own):
        firsts = {tuple(o) for o in own}
        lines.append(
            "fetched again with each rank's global generators (random, NumPy, torch) reseeded differently: the "
            "fetches are "
            + (
                "still identical on every rank, one by one (the draws come from a generator of your own)"
                if len(firsts) == 1
                else f"different ({len(firsts)} sequences on {len(own)} ranks: the draws come from the global "
                "generators)"
            )
        )
        if len(firsts) == 1:
            lines += _generator_lines(aug)
    return lines


def _trainer_cause(
    recs: list[dict[str, Any]], aug: list[dict[str, Any]], trainer: str, gens: list[dict[str, Any]]
) -> tuple[str, str]:
    """(cause, fix) of a Trainer's ranks drawing the same augmentation: a generator of the user's own built in every
    rank (lazily, in the fetch) and seeded alike, or the global streams the Trainer seeds alike, drawn in the main
    process (no DataLoader worker for the Trainer's ``seed_worker`` to reseed with the rank)."""
    workers = (recs[0].get("trainer_seed") or {}).get("num_workers") or 0
    own = [a.get("own_stream") for a in aug]
    if all(o for o in own) and len({tuple(o) for o in own}) == 1:
        return (
            f"your dataset or data collator draws its augmentation from {_named(gens)}, built in every rank (while "
            f"the rank fetched, after the launch) and seeded alike: the {trainer}'s seeding never reaches it — "
            "set_seed(args.seed) seeds the global random / NumPy / torch generators"
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


def _no_randomness_seen(aug: list[dict[str, Any]], fetched: int) -> str:
    """What a pipeline whose example 0 came out the same on every fetch of every rank says: no randomness only when
    the fetches drew nothing from the global generators either (measured without DataLoader workers)."""
    head = f"example {aug[0]['index']} comes out the same on {fetched} fetches on every rank"
    moved = [a.get("moved") for a in aug]
    if any(m for m in moved):
        drawn = sorted({k for m in moved if m for k in m})
        return (
            f"{head}, although each fetch draws from {', '.join(map(launch.generator_name, drawn))}: no random change "
            f"of example {aug[0]['index']} seen in {fetched} fetches (a p = 0.5 flip would show with probability "
            f"1 - {2.0 ** -(fetched - 1):.0e})"
        )
    if all(m is not None for m in moved):
        return (
            f"{head}, and the fetch draws nothing from the global generators: the dataset's fetch has no randomness "
            "(what the script draws before its loader exists, a rollout collected with a seeded policy or a random "
            "split, is not seen here)"
        )
    return (
        f"{head} (in DataLoader workers, whose generators are not followed): no random augmentation seen (a p = 0.5 "
        f"flip comes out the same {fetched} times with probability {2.0 ** -(fetched - 1):.0e})"
    )


def _step_draws(recs: list[dict[str, Any]]) -> tuple[list[str], list[str], list[float] | None, str | None]:
    """(the global generators the first micro-step moved, those of them identical on every rank when it began, the
    loss of its batch under two different seeds, why that loss was not measured)."""
    step = [r["step_rng"] for r in recs]
    moved = sorted({k for s in step for k in s["moved"]})
    alike = [k for k in moved if len({s["at_step"].get(k) for s in step}) == 1]
    dep = step[0].get("depends") or {}
    by = dep.get("by") or {}
    # a generator alike on every rank whose reseeding alone leaves the loss as it is (a np.random draw for logging
    # beside noise drawn from torch seeded apart) is not what makes the ranks' draws matter: left out
    return moved, [k for k in alike if by.get(k, True)], dep.get("losses"), dep.get("error")


def _alike_but_idle(recs: list[dict[str, Any]]) -> list[str]:
    """The generators identical on every rank that the first micro-step moved, whose reseeding alone does not change
    the loss of its batch (measured when the step moved more than one generator)."""
    step = [r["step_rng"] for r in recs]
    by = (step[0].get("depends") or {}).get("by") or {}
    moved = sorted({k for s in step for k in s["moved"]})
    return [k for k in moved if len({s["at_step"].get(k) for s in step}) == 1 and by.get(k) is False]


def _loss_unchanged(losses: list[float] | None) -> bool:
    return losses is not None and abs(losses[0] - losses[1]) <= 1e-6 * max(1.0, abs(losses[0]))


def _step_evidence(recs: list[dict[str, Any]]) -> list[str]:
    """The evidence lines of a first micro-step that draws the same numbers on every rank (empty when it does not)."""
    if not all(r.get("step_rng") for r in recs):
        return []
    moved, alike, losses, error = _step_draws(recs)
    if not alike or _loss_unchanged(losses):
        return []
    key = alike[0]
    step = [r["step_rng"] for r in recs]
    values = "; ".join(
        f"rank {r}: " + ", ".join(f"{v:.4f}" for v in s["next"].get(key, [])) for r, s in enumerate(step)
    )
    lines = [
        "the first micro-step of dlcheck_train_step (dropout off) draws from "
        f"{', '.join(map(launch.generator_name, moved))}: its state moves over the step",
        f"{launch.generator_name(key)} is identical on every rank when that step begins (state "
        f"{step[0]['at_step'][key]} on the {len(recs)} ranks); its next numbers: {values}",
    ]
    if losses is not None:
        lines.append(
            f"the loss of that step's batch under two different seeds of the global generators: {losses[0]:.6g} vs "
            f"{losses[1]:.6g} (the draws change the loss)"
        )
    else:
        lines.append(f"whether the draws change the loss was not measured ({error})")
    return lines


def _judge_step(dlcheck: Any, recs: list[dict[str, Any]], world: int, notes: list[str]) -> None:
    """The random numbers the training step itself draws (noise, timesteps, masks), read on the first micro-step
    with dropout off: failed when they come from a global generator that is identical on every rank."""
    if not all(r.get("step_rng") for r in recs):
        return  # a Trainer's launch: its train() runs its own steps
    moved, alike, losses, error = _step_draws(recs)
    if not moved:
        notes.append(
            "the first micro-step of dlcheck_train_step (dropout off) draws nothing from the global generators "
            "(Python's random, NumPy's, torch's)"
        )
        return
    drawn = ", ".join(map(launch.generator_name, moved))
    if alike and _loss_unchanged(losses):
        notes.append(
            f"the first micro-step (dropout off) draws from {drawn}, identical on every rank, but the loss of its "
            f"batch is the same under two different seeds ({losses[0]:.6g}): draws that change nothing (a LayerDrop "
            "of 0)"
        )
        return
    idle = _alike_but_idle(recs)
    if not alike and idle:
        notes.append(
            f"the first micro-step (dropout off) draws from {drawn}; {', '.join(map(launch.generator_name, idle))} "
            "is identical on every rank, but reseeding it alone leaves the loss of the step's batch as it is: the "
            "draws that change the loss come from generators seeded apart"
        )
        return
    if not alike:
        states = "; ".join(
            f"{launch.generator_name(k)}: "
            + ", ".join(f"rank {r}: {rec['step_rng']['at_step'][k]}" for r, rec in enumerate(recs))
            for k in moved
        )
        notes.append(
            f"the first micro-step (dropout off) draws from {drawn}, whose state differs between the ranks when it "
            f"begins (the ranks are seeded apart: {states})"
        )
        return
    if losses is None:
        # draws alike on every rank whose effect on the loss is not known (no loss of the batch here: a step of its
        # own without dlcheck_compute_loss): a LayerDrop draw at 0 changes nothing, noise changes everything
        dlcheck.not_judged(
            "the training step's draws",
            f"the first micro-step (dropout off) draws from {', '.join(map(launch.generator_name, alike))}, identical "
            f"on every rank, and whether those draws change the loss was not measured ({error})"
            + ("" if dlcheck.has("compute_loss") else ": define dlcheck_compute_loss to have it judged"),
        )
        return
    seeded = (
        "dlcheck_dist_setup seeds every rank alike"
        if dlcheck.has("dist_setup")
        else "every rank is seeded alike"
        + (
            " (or not at all: torch's default seed is the same in every process)"
            if launch.fresh_process_seed() is not None
            else ""
        )
    )
    dlcheck.fail(
        [*notes, *_step_evidence(recs)],
        f"{seeded}, so the random numbers your training step draws — its noise, timesteps or masks "
        "(torch.randn_like, torch.randint, ...) — are the same on every rank: the ranks' different examples get the "
        f"same draws, and the step's randomness is divided by the world size ({world})",
        "seed each process with its rank: Accelerate's set_seed(seed, device_specific=True) (it adds the process "
        "index), or torch.manual_seed(seed + rank) (and numpy / random) before training; DDP keeps the model's "
        "initial weights identical (it broadcasts rank 0's)",
    )
