from __future__ import annotations

from collections import Counter

from ...registry import check
from . import accelerate, measure
from .replicas import OPTIONAL, ROLES


def _few(xs: list[int], n: int = 8) -> str:
    xs = sorted(xs)
    return ", ".join(map(str, xs[:n])) + (", …" if len(xs) > n else "")


def _overlap_cause(loaders: list[dict], world: int) -> tuple[str, str | None]:
    """Why a distributed sampler's shards overlap, from what each rank's sampler holds: its num_replicas and
    rank against the process group's, then its seed."""
    shown = "; ".join(
        f"rank {r}: num_replicas={info['sampler_replicas']}, rank={info['sampler_rank']}, seed={info.get('sampler_seed')}"
        for r, info in enumerate(loaders)
    )
    if any(info["sampler_replicas"] != world for info in loaders) or [info["sampler_rank"] for info in loaders] != list(
        range(world)
    ):
        return (
            f"the sampler's num_replicas / rank do not match the process group's ({world} ranks; {shown})",
            None,
        )
    seeds = [info.get("sampler_seed") for info in loaders]
    if None not in seeds and len(set(seeds)) > 1:
        return (
            f"the sampler is seeded differently on each rank ({shown}): each rank shuffles its own permutation of the "
            "dataset and takes its slice of that one, so the slices overlap and leave examples out",
            "the same seed on every rank: DistributedSampler(ds, shuffle=True, seed=seed) with a seed that does not "
            "depend on the rank (seed + rank belongs in torch.manual_seed, for the augmentation, not in the sampler)",
        )
    return (
        f"the sampler's shards overlap although num_replicas, rank and seed match the process group ({shown}): "
        "its order differs between the ranks (a generator or a dataset order that depends on the rank)",
        None,
    )


def _selections(dlcheck, recs: list[dict], head: str, pad: int, world: int) -> str | None:
    """When the ranks' datasets select other examples of the data underneath (a ``random_split`` drawn in every
    process), the sampler's indices name different examples on each rank: judge the shards on the examples they
    select. Fails when the ranks share examples beyond the padding; returns what it measured, or None when every
    rank selects alike (the indices are then the examples, as judged by the caller)."""
    views = [r.get("resolved") for r in recs]
    if not all(views):
        return None
    if not all("digest" in v for v in views):
        probes = [v.get("probe") for v in views]
        if None not in probes and len(set(probes)) > 1:
            dlcheck.skip(
                "not judged: the ranks' datasets hold other examples at the same positions (examples 0, n/2 and n-1 "
                "fetched at one seed differ between the ranks: each rank builds its own shard, e.g. datasets' "
                "shard(num_shards, index) or a file list per rank), so the sampler's indices name different "
                "examples on each rank, and this selection is not one D3 resolves (a Subset, a datasets "
                "select/shuffle/split)"
            )
        return None
    if len({v["digest"] for v in views}) == 1:
        return None
    if len({v["base_len"] for v in views}) > 1 or None in {v["base_len"] for v in views}:
        dlcheck.skip(
            "not judged: the ranks' datasets are selections of data underneath of different sizes ("
            + ", ".join(f"rank {r}: {v['selected']} of {v['base_len']}" for r, v in enumerate(views))
            + "): which examples their shards share cannot be told"
        )
    counts = Counter(x for v in views for x in set(v["shard"]))
    shared = [x for x, c in counts.items() if c > 1]
    kind = " of a ".join(views[0]["kinds"])
    held = "; ".join(
        f"rank {r}'s selects {v['selected']} of the {v['base_len']} examples underneath (first: "
        f"{', '.join(map(str, v['head']))}, …)"
        for r, v in enumerate(views)
    )
    if len(shared) > pad:
        pairs = [
            (a, b, len(set(views[a]["shard"]) & set(views[b]["shard"])))
            for a in range(world)
            for b in range(a + 1, world)
        ]
        a, b, k = max(pairs, key=lambda p: p[2])
        dlcheck.fail(
            [
                head,
                f"each rank's dataset is a {kind} that selects other examples: {held}",
                f"resolved to the examples underneath, rank {a}'s and rank {b}'s shards share {k} examples "
                f"({_few(list(set(views[a]['shard']) & set(views[b]['shard'])))})",
            ],
            "every process draws its own selection of the data (a random_split, a shuffled select or a "
            "train_test_split without a generator or seed the ranks share): the sampler deals out disjoint "
            "indices, but they index different selections, so the ranks train on the same examples, leave others "
            "out, and one rank's held-out examples can be another rank's training examples",
            "draw the split with a fixed generator, the same on every rank: random_split(ds, lengths, "
            "generator=torch.Generator().manual_seed(seed)) (datasets: train_test_split(..., seed=seed)), or "
            "split once before the processes start",
            shared=len(shared),
        )
    return (
        f"each rank's dataset is a {kind} that selects other examples ({held}); resolved to the examples "
        f"underneath, the shards share none ({', '.join(str(len(v['shard'])) for v in views)} examples)"
    )


@check(
    "D3",
    domain="dist",
    title="the ranks' data shards overlap, leave examples out or never reshuffle",
    roles=ROLES,
    optional_roles=OPTIONAL,
)
def check_sampler_shards(dlcheck):
    """The ranks' shards are disjoint, cover the dataset together, and are reshuffled every epoch.

    What it does
        In the shared launch (see D1), every rank builds its dataloader (``dlcheck_make_dataloader``) and runs the
        top of your epoch loop (``dlcheck_start_epoch``) for epochs 0 and 1; after each, it lists the indices its
        sampler yields that epoch. Fails when two ranks share examples beyond the padding ``DistributedSampler``
        adds to make the shards equal, when examples are left out beyond those ``drop_last=True`` drops, or when
        a shuffling sampler gives every rank the same order in epoch 1 as in epoch 0. States the padding
        duplicates and the dropped examples. An index is a position in the rank's own dataset: when that dataset
        selects from data underneath (a ``Subset``, what ``random_split`` returns, or a ``datasets.Dataset``
        after ``select`` / ``shuffle`` / ``train_test_split``) and the ranks' selections differ (a split drawn in
        every process without a shared generator), the shards are judged on the examples underneath that the
        indices select: shared examples fail, and a dataset each rank slices for itself passes without a
        ``DistributedSampler``. Overlapping shards of a ``DistributedSampler`` are explained by what
        each rank's sampler holds: its ``num_replicas`` / ``rank`` against the process group's, then its seed (a
        seed that differs per rank gives each rank a slice of its own permutation).
    Why it is bad
        A dataloader built without a ``DistributedSampler`` (``shuffle=True`` alone) gives every rank the whole
        dataset: an epoch is N passes over the data, each example's gradient counted up to N times per step.
        A ``DistributedSampler`` whose ``set_epoch`` is never called shuffles with the same seed every epoch:
        every epoch repeats the first one's order on every rank.
    Example
        loader = DataLoader(ds, batch_size=8, shuffle=True)          # every rank iterates all of ds
        for epoch in range(epochs):
            for batch in loader: ...                                # sampler.set_epoch(epoch) never called
    Use instead
        ``sampler = DistributedSampler(ds, shuffle=True, seed=seed)``;
        ``DataLoader(ds, batch_size=8, sampler=sampler)``; at the top of every epoch ``sampler.set_epoch(epoch)``.
    Known problems
        A plain loop needs ``dlcheck_make_dataloader`` (the loader each process builds): the single-process
        ``dlcheck_dataloader`` says nothing about how your script shards. Reads the indices of samplers that can
        be iterated (``loader.sampler``); an IterableDataset sharded in its own way skips. Reshuffling is judged
        only through ``dlcheck_start_epoch`` (the top of your epoch loop); without it the pass says it was not
        judged. An Accelerate user's ranks list the indices Accelerate's ``BatchSamplerShard`` gives them from
        the DataLoader their factory prepared (the ``even_batches`` padding Accelerate's own sharding makes is
        allowed; reshuffling is judged on the loader's second pass); a DataLoader their factory holds but never
        prepared is what their ranks train on, as it is (the launch never prepares a stand-in), and fails when it
        is not sharded. A loader keyed as an evaluation one (a word of the key: eval, val, valid, test, dev) is
        never taken for the training loader. When the factory's dict holds no training DataLoader and its
        Accelerator prepared none (or only an evaluation loader), the script may prepare its loader outside the
        factory: D3 skips, saying so (return the prepared loader in ``dlcheck_make_training``'s dict to have it
        judged). A ``DataLoaderDispatcher`` skips. Selections are followed through ``Subset`` and
        ``datasets.Dataset`` indices only: two ranks' datasets that differ in another way (each built from its own
        file list) are compared by index, as if they held the same examples.
    Not applicable
        Training that does not run distributed: a single-process script of the user's own. A plain loop without
        ``dlcheck_dist_wrap`` is asked for it (a missing role: the wrap is what says the script runs distributed);
        an Accelerate user's ``accelerator.prepare`` wraps the model itself.
    """
    measure.the_setup(dlcheck, "make_dataloader")  # a plain loop's own loader; an Accelerate user's is prepared
    run = measure.get_launch(dlcheck)
    recs = measure.records(dlcheck, run, "train")
    idx0 = [r["indices"].get(0) for r in recs]
    idx1 = [r["indices"].get(1) for r in recs]
    info = recs[0]["loader"]
    if accelerate.from_role(info.get("built_by")):
        # the ranks iterate the plain fixture because the factory returned no prepared loader: a script may well
        # prepare its loader outside the factory, so what the fixture does on every rank says nothing of its shards
        dlcheck.skip(
            f"not judged: the ranks' shards of your training loader: {info['built_by']}, so the launch iterates "
            "dlcheck_dataloader as it is on every rank, and how your script shards its loader is not visible; return "
            "the loader your script trains on, passed to accelerator.prepare, in dlcheck_make_training's dict "
            "(model, optimizer, loader = accelerator.prepare(model, optimizer, loader); {..., 'train_dataloader': "
            "loader}) to have it judged"
        )
    if info.get("no_indices"):
        dlcheck.skip(f"the dataloader's shards are not judged: {info['no_indices']}")
    if any(i is None for i in idx0):
        dlcheck.skip(f"the dataloader's sampler ({info['sampler']}) yields no indices to compare")
    n = info["dataset_len"]
    if not n:
        dlcheck.skip("the dataset has no length: coverage cannot be judged")
    where = f"{info['sampler']}" + (
        f"(shuffle={info['shuffle']}, drop_last={info['drop_last']})" if info["shuffle"] is not None else ""
    )
    if info["sampler"] == "BatchSamplerShard":  # accelerator.prepare's: batches of the user's sampler dealt out
        where = (
            f"Accelerate's BatchSamplerShard over a {info['inner']} (batch_size={info['batch_size']}, "
            f"drop_last={info['drop_last']}, even_batches={info['even_batches']})"
        )
    world = run.world
    total = sum(len(i) for i in idx0)
    union = set().union(*map(set, idx0))
    drop_last = bool(info["drop_last"])
    pad = 0 if drop_last else (-n) % world
    dropped = n % world if drop_last else 0
    if "padding" in info:  # Accelerate's own sharding of n examples repeats / leaves out these many by design
        pad, dropped = info["padding"], info["dropped"]
    counts = Counter(x for i in idx0 for x in set(i))
    shared = [x for x, c in counts.items() if c > 1]
    evidence_head = f"epoch 0 on {world} ranks, dataset of {n} examples, sampler {where}: " + ", ".join(
        f"rank {r}: {len(i)} indices" for r, i in enumerate(idx0)
    )
    selections = _selections(dlcheck, recs, evidence_head, pad, world)
    if selections is None and len(shared) > pad:
        pairs = [(a, b, len(set(idx0[a]) & set(idx0[b]))) for a in range(world) for b in range(a + 1, world)]
        a, b, k = max(pairs, key=lambda p: p[2])
        same_order = all(i == idx0[0] for i in idx0[1:])
        evidence = [
            evidence_head,
            f"rank {a} and rank {b} share {k} examples (indices {_few(list(set(idx0[a]) & set(idx0[b])))})"
            + ("; every rank iterates them in the same order" if same_order else ""),
        ]
        fix = None
        if info.get("unsharded"):
            cause = (
                f"accelerator.prepare left the loader unsharded (its {info['sampler']} batches go to every rank): the "
                "Accelerator that prepared it ran as one process, so every rank iterates the whole dataset"
            )
        elif info["sampler_replicas"] is None and recs[0].get("accelerate") and not dlcheck.has("make_dataloader"):
            cause = (
                f"the DataLoader the ranks train on — {info.get('built_by')} — was not passed to accelerator.prepare: "
                f"its {info['sampler']} gives every rank the whole dataset, so each step trains on duplicates and an "
                "epoch is world-size passes"
            )
        elif info["sampler_replicas"] is None:
            cause = (
                f"the dataloader's sampler is a {info['sampler']}, not a DistributedSampler: every rank iterates the "
                "whole dataset, so each step trains on duplicates and an epoch is world-size passes"
            )
            if info.get("built_by") in ("dlcheck_make_dataloader", "dlcheck_dataloader"):
                # the same examples on every rank come from one dataset left unsharded, or from a dataset each rank
                # builds for itself (a rollout it collects, a generated set) that comes out the same: the evidence is
                # the same either way, the fix is not
                cause += (
                    "; or, if each rank is meant to train on data of its own (a rollout it collects, a set it "
                    "generates), the ranks' datasets come out identical: the same seed on every rank"
                )
                fix = (
                    "one dataset for all ranks: DataLoader(ds, batch_size=..., sampler=DistributedSampler(ds, "
                    "shuffle=True)) built in every process after init_process_group; data of each rank's own: seed "
                    "each process with its rank before building it (seed + rank: torch.manual_seed, env.reset(seed="
                    "seed + rank), Fabric's seed_everything(seed + fabric.global_rank))"
                )
        elif info["sampler"] == "BatchSamplerShard":
            cause = (
                f"accelerator.prepare sharded the loader for {info['sampler_replicas']} process(es) while {world} "
                "ranks run: the Accelerator that prepared it does not describe this process group"
            )
        else:
            cause, fix = _overlap_cause([r["loader"] for r in recs], world)
        fix = fix or (
            "DataLoader(ds, batch_size=..., sampler=DistributedSampler(ds, shuffle=True)) built in every process "
            "after init_process_group (it reads the rank and the world size itself), and no shuffle=True beside it"
        )
        if recs[0].get("accelerate"):
            fix = (
                "pass the DataLoader to accelerator.prepare (model, optimizer, loader = accelerator.prepare(model, "
                "optimizer, loader)) with an Accelerator built in the process: it deals each rank its own batches"
            )
        dlcheck.fail(evidence, cause, fix, shared=len(shared))
    # a sampler confined to a subset (a K-fold's SubsetRandomSampler of the training fold) covers that subset, not
    # the whole dataset (Fabric's kfold_cv had failed with the validation fold 'on no rank': blind set 11)
    subset = info.get("subset")
    base = set(subset) if subset else set(range(n))
    missing = sorted(base - union)
    if selections is None and len(missing) > dropped:
        dlcheck.fail(
            [
                evidence_head,
                f"{len(missing)} of {len(base)} examples"
                + (f" (the subset of {len(base)} indices its sampler draws)" if subset else "")
                + f" are on no rank (indices {_few(missing)})",
            ],
            "the shards together do not cover the dataset: the sampler's num_replicas is larger than the world "
            "size, or a filter per rank drops examples",
            "DistributedSampler(ds) built after init_process_group, with num_replicas = world size",
            missing=len(missing),
        )
    notes = [selections] if selections else []
    if selections:
        pass  # the padding and the left-out examples are those of each rank's own selection
    elif pad and "padding" in info:
        notes.append(
            f"{total - len(union)} index(es) repeated as padding: Accelerate's even_batches completes the last "
            f"batches from the start of the epoch ({n} examples dealt as {total} indices"
            + (f"; on two ranks: {_few(shared)})" if shared else ")")
        )
    elif pad:
        notes.append(
            f"{total - len(union)} example(s) appear on two ranks as padding (drop_last=False pads {n} to "
            f"{n + pad}: indices {_few(shared)})"
        )
    if dropped and not selections:
        notes.append(f"{len(missing)} example(s) are left out this epoch (drop_last=True: {_few(missing)})")
    # Accelerate's prepared loader counts its passes and sets its sampler's epoch itself: judged without the role
    sharded = info["sampler"] == "BatchSamplerShard"
    after = "after dlcheck_start_epoch" if dlcheck.has("start_epoch") else "(the prepared loader's second pass)"
    if not sharded and (recs[0].get("start_epoch_given", None) is False or not dlcheck.has("start_epoch")):
        notes.append("reshuffling not judged: define fixture dlcheck_start_epoch (the top of your epoch loop)")
        dlcheck.not_judged("reshuffling", "define fixture dlcheck_start_epoch (the top of your epoch loop)")
    elif info["shuffle"] is False:
        notes.append(
            "the sampler does not shuffle (shuffle=False): every epoch repeats one order on every rank; whether your "
            "training needs it reshuffled is T7's to judge, in one process (it reads dlcheck_num_epochs)"
        )
    elif all(i is not None for i in idx1):
        if all(a == b for a, b in zip(idx0, idx1)):
            dlcheck.fail(
                [
                    evidence_head,
                    f"epoch 1 {after}: every rank's order is the same as in epoch 0 (rank 0: "
                    f"{', '.join(map(str, idx0[0][:6]))}, … both times)",
                ],
                (
                    f"the {info['inner']} inside Accelerate's loader draws the same order every pass: its generator "
                    "is seeded anew each epoch with the same seed"
                    if sharded
                    else "the sampler shuffles with the same seed every epoch: DistributedSampler.set_epoch(epoch) is "
                    "not called at the top of the epoch loop, so every epoch repeats the first one's order"
                ),
                "DataLoader(ds, shuffle=True) passed to accelerator.prepare (its synchronised generator moves on "
                "every pass), or loader.set_epoch(epoch) at the top of every epoch"
                if sharded
                else "call loader.sampler.set_epoch(epoch) at the top of every epoch, before iterating the loader",
            )
        notes.append(f"epoch 1 reshuffled on every rank {after} (rank 0 starts {idx0[0][:4]} then {idx1[0][:4]})")
    dlcheck.measured(
        (
            f"the {world} ranks' shards of epoch 0, resolved through each rank's own selection, share no example"
            if selections
            else f"the {world} ranks' shards of epoch 0 are disjoint and cover the "
            + (f"{len(base)} examples their sampler draws of the dataset's {n}" if subset else f"{n} examples")
            + f" ({', '.join(str(len(i)) for i in idx0)} indices)"
        ),
        *notes,
        dataset=n,
        padding=total - len(union),
    )
