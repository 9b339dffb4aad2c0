from __future__ import annotations

import itertools
import math
import random
import sys
from typing import Any

import torch

from ...errors import MISSING
from ...guard import preserved_dataloader, preserved_rng
from ...registry import Setting, check
from ...training import find_setup, memo_or_skip
from . import worker_streams

#: entries of an epoch's order that are compared (the first ones): bounded cost on any dataset
COMPARED = 64
#: epochs read at most, for the shortest orders
MAX_EPOCHS = 21


def epochs_needed(order: list[Any], false_alarm: float) -> int:
    """Epochs whose orders must all be equal for T7 to fail, so that a correct shuffle does that with
    probability ≤ false_alarm: k distinct entries (indices, or disjoint batches) come in a given order
    with probability ≤ 1/k!, so E epochs agree with probability ≤ (1/k!)^(E−1). Orders with repeated
    entries (sampling with replacement) get the most epochs."""
    k = len(order)
    if k < 2 or len(set(order)) < k:
        return MAX_EPOCHS
    log_p = -math.lgamma(k + 1)  # log(1/k!)
    return min(MAX_EPOCHS, 1 + math.ceil(math.log(false_alarm) / log_p - 1e-9))


def _sampler_of(loader: Any) -> Any:
    """The loader's batch sampler, else its sampler. Tested against None, never for truth: a sampler without
    ``__len__`` (an endless or a class-balanced PK sampler) raises TypeError under ``bool()``."""
    sampler = getattr(loader, "batch_sampler", None)
    return getattr(loader, "sampler", None) if sampler is None else sampler


def _order(loader: Any, epoch: int, start_epoch: Any = None) -> list[Any] | None:
    """The index order the loader's sampler gives in ``epoch`` (``set_epoch`` applied, as the Trainer,
    Lightning and a correct loop do; or the top of the user's own epoch loop, ``start_epoch``, when they hand it
    over), read from the sampler without loading any data."""
    sampler = _sampler_of(loader)
    inner = getattr(sampler, "sampler", sampler)
    if start_epoch is not None:
        start_epoch(loader, epoch)
    else:
        if hasattr(loader, "set_epoch"):
            loader.set_epoch(epoch)
        for owner in (sampler, inner, getattr(inner, "sampler", None)):
            if hasattr(owner, "set_epoch"):
                owner.set_epoch(epoch)
    if sampler is None:
        return None
    return [_entry(b) for b in itertools.islice(iter(sampler), COMPARED)]


def _entry(b: Any) -> Any:
    """A sampler's entry as a hashable, comparable value: an index, or a tuple of indices for a batch."""
    if isinstance(b, (list, tuple)):
        return tuple(_entry(x) for x in b)
    if hasattr(b, "tolist"):  # a tensor or numpy scalar/array
        b = b.tolist()
        return tuple(b) if isinstance(b, list) else b
    try:
        hash(b)
    except TypeError:
        return repr(b)
    return b


def _iterable(loader: Any) -> bool:
    """A loader over an IterableDataset: its order is the dataset's own, its sampler a placeholder that
    yields None forever."""
    return isinstance(getattr(loader, "dataset", None), torch.utils.data.IterableDataset) or (
        type(getattr(loader, "sampler", None)).__name__ == "_InfiniteConstantSampler"
    )


def _shuffles(loader: Any) -> bool:
    sampler = getattr(loader, "sampler", None)
    inner = getattr(getattr(loader, "batch_sampler", None), "sampler", sampler)
    for s in (sampler, inner):
        if s is None or isinstance(s, torch.utils.data.SequentialSampler):
            continue
        if getattr(s, "shuffle", True) is False:
            continue
        return True
    return False


def _worker_states(fn: Any) -> list[tuple] | None:
    """Run ``worker_init_fn`` in-process as three workers would start (two ids, two epochs' base seeds) and
    return the python/numpy RNG states it leaves; None when it needs a real worker."""
    np = sys.modules.get("numpy")
    states = []
    for base, wid in ((1000, 0), (1000, 1), (2000, 0)):
        torch.manual_seed(base + wid)
        random.seed(12345)
        if np is not None:
            np.random.seed(12345)
        try:
            fn(wid)
        except Exception:  # noqa: BLE001 - it reads get_worker_info() or the like: cannot be simulated
            return None
        states.append((random.getstate()[1][:4], tuple(np.random.get_state()[1][:4]) if np is not None else None))
    return states


def _pristine() -> tuple:
    np = sys.modules.get("numpy")
    random.seed(12345)
    if np is not None:
        np.random.seed(12345)
    return random.getstate()[1][:4], tuple(np.random.get_state()[1][:4]) if np is not None else None


def _planned_epochs(setup: Any, loader: Any, epochs_role: Any = MISSING) -> tuple[float, str] | None:
    """(how many epochs the user's run trains, where that is read), when the run's plan is visible: a Trainer's
    args (max_steps, else num_train_epochs), a handed-over Lightning Trainer (max_steps, else max_epochs), a loop's
    ``dlcheck_num_epochs``; None for a loop that does not say, whose epochs live in its own code."""
    try:
        batches = len(loader)
    except TypeError:
        batches = 0
    if setup is not None and setup.kind == "trainer":
        args = setup.trainer.args
        if getattr(args, "max_steps", -1) and args.max_steps > 0 and batches:
            accum = max(1, int(getattr(args, "gradient_accumulation_steps", 1) or 1))
            return args.max_steps * accum / batches, f"max_steps={args.max_steps} of {batches} batches an epoch"
        return float(args.num_train_epochs), f"num_train_epochs={args.num_train_epochs}"
    if setup is not None and setup.kind in ("loop", "accelerate") and epochs_role not in (MISSING, None):
        return float(epochs_role), f"dlcheck_num_epochs={epochs_role}"
    trainer = getattr(setup, "l_trainer", None) if setup is not None and setup.kind == "lightning" else None
    if trainer is None or trainer is MISSING:
        return None
    if (getattr(trainer, "max_steps", -1) or -1) > 0 and batches:
        accum = max(1, int(getattr(trainer, "accumulate_grad_batches", 1) or 1))
        return trainer.max_steps * accum / batches, f"max_steps={trainer.max_steps} of {batches} batches an epoch"
    epochs = getattr(getattr(trainer, "fit_loop", None), "max_epochs", None)
    if epochs is None or epochs < 0:
        return None
    return float(epochs), f"max_epochs={epochs}"


def _own_epoch_start(dlcheck: Any, setup: Any) -> Any:
    """The top of the user's own epoch loop (``dlcheck_start_epoch``, the dist domain's role) as ``(loader, epoch)
    -> None``, for a plain or Accelerate loop that hands it over: T7 then reads each epoch's order as the user's
    loop leaves it (a loop that never calls set_epoch outside distributed runs: MAE's main_pretrain), on fresh
    objects of dlcheck_make_training. None otherwise (dlcheck calls set_epoch itself, as a correct loop does)."""
    fn = dlcheck.role("start_epoch")
    if fn is MISSING or setup is None or setup.kind not in ("loop", "accelerate"):
        return None
    state = setup.state()
    return lambda loader, epoch: dlcheck.call("start_epoch", lambda: fn(state, loader, epoch))


def _fail_or_judge_no_shuffle(dlcheck, setup, loader, where) -> tuple[str, str]:
    """A training loader that does not shuffle gives every epoch the same order: fails when the run's plan is
    visible and trains more than one epoch; ("not applicable", why) for one epoch; ("not judged", why) when the
    number of epochs lives in the user's own loop."""
    kind = type(getattr(loader, "sampler", None)).__name__
    try:
        batches = len(loader)
    except TypeError:
        batches = None
    if batches == 1:
        # full-batch training (time_sequence_prediction's LBFGS on all 97 rows): every epoch trains on the one
        # batch that holds every example, in whatever order (T7 had failed it: blind set 11)
        size = (
            len(getattr(loader, "dataset", None) or []) if hasattr(getattr(loader, "dataset", None), "__len__") else 0
        )
        return "not applicable", (
            f"{where} does not shuffle ({kind}), but yields one batch"
            + (f" holding all {size} examples" if size else "")
            + " per epoch: the epochs train on the same full batch, whatever its order"
        )
    try:
        with preserved_rng():
            first = list(itertools.islice(iter(_sampler_of(loader)), 2))
    except Exception:  # noqa: BLE001 - a sampler that cannot be iterated without data: its order is not read
        first = []
    plan = _planned_epochs(setup, loader, dlcheck.role("num_epochs"))
    if plan is None:
        lightning = setup is not None and setup.kind == "lightning"
        return "not judged", (
            f"{where} does not shuffle ({kind}): every epoch visits the examples in the same order, which matters "
            "when the run trains more than one epoch; "
            + (
                "how many epochs your run trains is not visible (hand over your Lightning Trainer as dlcheck_trainer "
                "and its max_epochs is read)"
                if lightning
                else "how many epochs your loop trains is in your own code (define fixture dlcheck_num_epochs "
                "returning it, and T7 judges it)"
            )
            + ", so it is not judged (shuffle=True gives each epoch its own order)"
        )
    epochs, read = plan
    if epochs <= 1:
        return "not applicable", (
            f"{where} does not shuffle ({kind}), and the run trains one epoch ({read}): no order repeats"
        )
    dlcheck.fail(
        [
            f"{where} does not shuffle: its {kind} gives every epoch the same order"
            + (f" (the first batches: {[_entry(b) for b in first]})" if first else ""),
            f"the run trains {epochs:g} epochs ({read})",
        ],
        "the training DataLoader is built without shuffle=True: every epoch presents the examples in the same "
        "order, so the batches, their neighbours and the last batch of each epoch repeat epoch after epoch",
        "shuffle the training data: DataLoader(..., shuffle=True) (seeded with a generator for reproducibility), or "
        "a DistributedSampler(shuffle=True) with sampler.set_epoch(epoch) each epoch",
        epochs=epochs,
    )
    raise AssertionError("unreachable: dlcheck.fail raises")


def _judge_worker_streams(dlcheck, loader, where) -> tuple[str | None, str | None]:
    """Run the loader's dataset in its own worker setup (:mod:`.worker_streams`) and fail when the workers, or
    each epoch's fresh workers, replay one random stream. Returns (what was judged, what was not) — None where
    there is nothing of the kind."""
    workers = int(getattr(loader, "num_workers", 0) or 0)
    persistent = bool(getattr(loader, "persistent_workers", False))
    if workers < 1 or _iterable(loader) or not hasattr(getattr(loader, "dataset", None), "__getitem__"):
        return None, None
    if workers < 2 and persistent:
        return None, None  # one worker that lives across the epochs: one stream, never replayed
    got = worker_streams.probe(loader)
    n = worker_streams.FETCHES
    if "error" in got:
        return None, (
            f"worker streams: fetching one example {n} times in {min(2, workers)} workers of a loader built like "
            f"yours raised {got['error']}"
        )
    fetches, index, used = got["fetches"], got["index"], got["workers"]
    distinct = len({d for ds in fetches.values() for d in ds})
    if all(len(set(ds)) == 1 for ds in fetches.values()):
        return (
            f"num_workers={workers}: example {index} fetched {n} times in each of {used} worker(s), in two epochs, "
            "is the same every time: the examples draw no random augmentation that workers could repeat"
        ), None
    w0, w1, e1 = fetches.get((0, 0)), fetches.get((0, 1)), fetches.get((1, 0))
    same_workers = w1 is not None and w0 == w1
    same_epochs = not persistent and e1 is not None and e1 == w0
    chance = worker_streams.chance_alike(fetches)
    if same_workers or same_epochs:
        if chance > dlcheck.setting("false_alarm"):
            return None, (
                f"worker streams: example {index} fetched {n} times gives the same results in "
                + ("both workers" if same_workers else "each epoch's fresh worker")
                + f", but its augmentation has only {distinct} distinct results: two independent streams agree so "
                f"with probability {chance:.1e}, too likely to tell"
            )
        gens = worker_streams.private_generators(loader.dataset)
        replay = " and ".join(
            part
            for part, on in (
                (f"worker 0 and worker 1 give the same {n} results in the same order", same_workers),
                ("epoch 1's fresh worker 0 gives them again", same_epochs),
            )
            if on
        )
        dlcheck.fail(
            [
                f"{where}: num_workers={workers}"
                + (", persistent_workers=True" if persistent else "")
                + f"; example {index} fetched {n} times in each worker of a loader built like yours (its "
                "worker_init_fn and start method): "
                + replay
                + f" ({distinct} distinct results among them; independent streams agree so with probability "
                f"{chance:.1e})",
                "the dataset holds its own random generator(s): " + ", ".join(gens)
                if gens
                else "no generator of the dataset's own was found in its attributes (it may live in a closure or a "
                "module)",
            ],
            "the examples' random augmentation draws from a generator that every DataLoader worker copies from the "
            "main process (torch seeds each worker's global torch, python and numpy generators, never one that a "
            "dataset or a transform owns): "
            + (
                "the workers replay one stream, so each augmentation is repeated num_workers times"
                if same_workers
                else ""
            )
            + ("; " if same_workers and same_epochs else "")
            + (
                "each epoch's workers start again from the main process's copy, so every epoch repeats the "
                "augmentations of the first"
                if same_epochs
                else ""
            ),
            "reseed the dataset's own generator in each worker from the seed torch gives it, in a worker_init_fn: "
            "info = torch.utils.data.get_worker_info(); info.dataset.<generator> = numpy.random.default_rng(info.seed) "
            "(an albumentations Compose: info.dataset.<transform>.set_random_seed(info.seed % 2**32)); or draw from "
            "torch's or numpy's global generator, which torch seeds per worker and per epoch",
            chance=chance,
        )
    return (
        f"num_workers={workers}: example {index} fetched {n} times in each of {used} worker(s), in two epochs: "
        f"{distinct} distinct results, and "
        + ("the workers' streams differ" if used > 1 else "one worker")
        + (", and epoch 1's workers draw anew" if not persistent else " (persistent workers keep their stream)")
    ), None


def _train_loader(dlcheck, setup) -> tuple[Any, str]:
    if setup is not None and setup.kind == "trainer":

        def make() -> Any:
            clone = setup.clone("order")
            return clone.get_train_dataloader()

        return memo_or_skip(dlcheck, setup.sources, "t7:trainer-loader", make), f"your {setup.name}'s train dataloader"
    loader = dlcheck.role("dataloader")
    return (
        loader,
        "dlcheck_dataloader"
        if setup is None or setup.kind in ("loop", "accelerate")
        else setup.train_loader
        if setup.own_loaders or getattr(setup, "given_loaders", False)
        else "the datamodule's train_dataloader()",
    )


@check(
    "T7",
    domain="train",
    title="every epoch sees the same order, or every worker the same random stream",
    roles=(),
    optional_roles=(
        "trainer",
        "lightning_module",
        "datamodule",
        "make_training",
        "dataloader",
        "num_epochs",
        "start_epoch",
    ),
    settings=(
        Setting(
            "false_alarm",
            1e-6,
            "probability that a correct shuffle gives the same order in every epoch "
            "compared; sets how many epochs are read (2 from 10 entries up, 21 for 2 entries)",
        ),
    ),
)
def check_epoch_order(dlcheck):
    """A shuffling dataloader gives a new order every epoch, and its workers get distinct random seeds.

    What it does
        Reads the index order of the training dataloader's sampler (its first 64 entries: indices, or
        batches of indices) for consecutive epochs (``set_epoch`` applied where the sampler has it, as
        the Trainer, Lightning and a correct loop do; no data is loaded) and fails when a sampler that
        shuffles gives the same order in every one. k distinct entries repeat their order by chance with
        probability 1/k!, so it reads E epochs with (1/k!)^(E−1) ≤ false_alarm: the false-alarm
        probability of a correct shuffle is ≤ 1e-6 (2 epochs from 10 entries up, 9 for 3 entries, 21 for
        2 or for samplers that draw with replacement). Then, when the loader has
        several workers and a ``worker_init_fn``, runs that function in-process as two workers of one
        epoch and one of the next would, and fails when it leaves python's and numpy's random state
        identical for all of them. When the loader has workers (a map-style dataset), it also builds a loader like
        the user's (their dataset, worker count, ``worker_init_fn``, start method and ``persistent_workers``) that
        fetches one example 24 times in each of two workers, in two epochs, and fails when the workers give the
        same results in the same order, or each epoch's fresh workers give them again: the augmentation draws from
        a generator the dataset owns (an albumentations ``Compose``'s, a ``numpy.random.default_rng`` made in
        ``__init__``), which every worker copies from the main process. The fetches run in the workers only, so
        the dataset's generators in the user's process are left as they are.
    Why it is bad
        The same order every epoch makes the batches — and the gradient noise — repeat: the model sees
        the same neighbours and the same last batch each epoch, which biases it and can look like an
        epoch-periodic loss. A ``worker_init_fn`` that seeds every worker with a constant gives all workers
        the same augmentations: with 8 workers, 8 copies of each random crop per epoch, and again the next
        epoch. A generator the dataset owns does the same without any ``worker_init_fn``: torch seeds each
        worker's global torch, python and numpy generators, never a private one.
    Example
        class Sampler: __iter__: g = torch.Generator(); g.manual_seed(self.seed)   # ignores the epoch
        DataLoader(..., num_workers=4, worker_init_fn=lambda wid: numpy.random.seed(42))
        class Images(Dataset): __init__: self.rng = numpy.random.default_rng(0)   # drawn in __getitem__, 4 workers
    Use instead
        seed the sampler with seed + epoch and call ``sampler.set_epoch(epoch)`` each epoch (as
        DistributedSampler does); seed workers from torch: ``numpy.random.seed(torch.initial_seed() % 2**32)``
        (torch already seeds each worker differently); reseed a generator the dataset owns in ``worker_init_fn``
        from ``torch.utils.data.get_worker_info().seed``.
    Known problems
        For a plain loop, dlcheck calls ``set_epoch`` itself, as a correct loop does, unless you hand over the
        top of your epoch loop as ``dlcheck_start_epoch`` (the dist domain's role): then each epoch's order is read
        as your loop leaves it (a ``set_epoch`` called only when distributed is seen). The order of an IterableDataset is its own (no sampler to read without loading
        data) and is not judged; ``worker_init_fn``s that need a real worker are not judged either: with
        nothing else to judge, the check skips. The worker streams are compared on whole examples: an
        augmentation with few outcomes (a flip alone) agrees by chance too often to tell and is said not judged;
        one replayed stream mixed with another drawn anew in each worker makes the examples differ and passes.
        A training loader that does not shuffle (a SequentialSampler, ``shuffle=False``) gives every epoch the
        same order: it fails when the run's plan is visible and trains more than one epoch (a Trainer's
        ``num_train_epochs`` / ``max_steps``, a Lightning Trainer handed over as ``dlcheck_trainer``: its
        ``max_epochs`` / ``max_steps``, a plain or Accelerate loop's ``dlcheck_num_epochs``); a loop that does
        not say how many epochs it trains is said not judged (a skip naming the fixture).
    Not applicable
        A training loader that does not shuffle in a run of one epoch (no order repeats).
    """
    setup = find_setup(dlcheck)
    loader, where = _train_loader(dlcheck, setup)
    if loader is MISSING or not hasattr(loader, "__iter__"):
        dlcheck.skip(
            "missing role: define fixture dlcheck_dataloader"
            + (
                " (or dlcheck_datamodule, or a train_dataloader() in your LightningModule)"
                if setup is not None and setup.kind == "lightning"
                else ""
            )
            + " in conftest.py"
        )
    judged: list[str] = []
    unjudged: list[str] = []
    if _iterable(loader):
        unjudged.append(
            f"{where} reads {type(getattr(loader, 'dataset', None)).__name__}, an IterableDataset: its order is the "
            "dataset's own, with no sampler to read it from without loading the data"
        )
    elif getattr(loader, "sampler", None) is None and getattr(loader, "batch_sampler", None) is None:
        unjudged.append(
            f"{where} is a {type(loader).__name__} without a sampler: its order is its own, not readable without "
            "loading the data"
        )
    elif _shuffles(loader):
        own = _own_epoch_start(dlcheck, setup)
        with preserved_rng(), preserved_dataloader(loader):
            orders = [_order(loader, 0, own)]
            if orders[0] is not None and len(orders[0]) > 1:
                for epoch in range(1, epochs_needed(orders[0], dlcheck.setting("false_alarm"))):
                    orders.append(_order(loader, epoch, own))
                    if orders[-1] != orders[0]:
                        break
        if len(orders) > 1 and all(o is not None for o in orders):
            if all(o == orders[0] for o in orders):
                sampler = _sampler_of(loader)
                inner = getattr(sampler, "sampler", sampler)
                first = orders[0][0]
                dlcheck.fail(
                    [
                        f"{where}: its {type(inner).__name__} gives the same order in epochs 0 to {len(orders) - 1} "
                        f"(first {len(orders[0])} {'batches' if isinstance(first, tuple) else 'indices'} compared; "
                        f"the first is {list(first) if isinstance(first, tuple) else first} every time"
                        + (
                            f"; a correct shuffle does that with probability ≤ "
                            f"{math.exp(-(len(orders) - 1) * math.lgamma(len(orders[0]) + 1)):.1e})"
                            if len(set(orders[0])) == len(orders[0])
                            else ")"
                        ),
                        "your dlcheck_start_epoch (the top of your epoch loop) ran before each epoch"
                        if own is not None
                        else "set_epoch(epoch) was called before each epoch"
                        if hasattr(inner, "set_epoch")
                        else f"{type(inner).__name__} has no set_epoch",
                    ],
                    f"your epoch loop does not call {type(inner).__name__}.set_epoch(epoch): it gives every epoch the "
                    "order of its first (DistributedSampler seeds its shuffle with seed + epoch)"
                    if own is not None and hasattr(inner, "set_epoch")
                    else f"the {type(inner).__name__} re-seeds its shuffle identically every epoch (a fixed seed that "
                    "ignores the epoch)",
                    "seed the shuffle with seed + epoch and give the sampler a set_epoch(epoch) method (or use RandomSampler / "
                    "DistributedSampler, and call sampler.set_epoch(epoch) at the start of each epoch)",
                )
            sampler = _sampler_of(loader)
            inner = getattr(sampler, "sampler", sampler)
            kind = "batches" if isinstance(orders[0][0], tuple) else "indices"
            judged.append(
                f"{where}: its {type(inner).__name__} gives epoch {len(orders) - 1} an order other than epoch 0's "
                f"(first {len(orders[0])} {kind} compared)"
            )
        elif orders[0] is None:
            unjudged.append(f"{where}: its sampler's order could not be read")
        else:
            unjudged.append(f"{where}: fewer than 2 entries per epoch, no order to compare")
    fn = getattr(loader, "worker_init_fn", None)
    if fn is not None and getattr(loader, "num_workers", 0) > 1:
        with preserved_rng():
            pristine = _pristine()
            states = _worker_states(fn)
        if states is None:
            unjudged.append(
                f"worker_init_fn ({getattr(fn, '__qualname__', type(fn).__name__)}) needs a real worker: not run"
            )
        else:
            if len(set(states)) == 1 and states[0] != pristine:
                dlcheck.fail(
                    [
                        f"{where}: num_workers={loader.num_workers}; its worker_init_fn "
                        f"({getattr(fn, '__qualname__', type(fn).__name__)}) leaves the same python/numpy random "
                        "state in worker 0 and worker 1, and again in the next epoch's worker 0"
                    ],
                    "worker_init_fn seeds every worker with the same constant: all workers draw the same random "
                    "augmentations, and every epoch repeats them",
                    "derive the seed from torch's per-worker seed: numpy.random.seed(torch.initial_seed() % 2**32); "
                    "random.seed(torch.initial_seed()) — or drop worker_init_fn (torch seeds each worker)",
                )
            judged.append(
                f"num_workers={loader.num_workers}: worker_init_fn "
                f"({getattr(fn, '__qualname__', type(fn).__name__)}) leaves "
                + (
                    "python's and numpy's random state alone (torch seeds each worker differently)"
                    if states[0] == pristine and len(set(states)) == 1
                    else f"{len(set(states))} distinct python/numpy random states in workers 0, 1 and the next "
                    "epoch's worker 0"
                )
            )
    streams, unstreamed = _judge_worker_streams(dlcheck, loader, where)
    if streams is not None:
        judged.append(streams)
        # the real workers ran the worker_init_fn: the in-process simulation's "needs a real worker" is answered
        unjudged = [u for u in unjudged if not u.startswith("worker_init_fn")]
    if unstreamed is not None:
        unjudged.append(unstreamed)
    no_shuffle = None
    if (
        not _shuffles(loader)
        and not _iterable(loader)
        and (getattr(loader, "sampler", None) is not None or getattr(loader, "batch_sampler", None) is not None)
    ):
        no_shuffle = _fail_or_judge_no_shuffle(dlcheck, setup, loader, where)
        if no_shuffle[0] == "not judged":
            unjudged.append(no_shuffle[1])
        elif judged:
            judged.append(no_shuffle[1])
    if judged:
        for u in unjudged:
            dlcheck.not_judged("worker streams" if u.startswith(("worker", "worker_init_fn")) else "epoch order", u)
        dlcheck.measured(*judged, *(f"not judged: {u}" for u in unjudged), judged=len(judged))
        return
    if unjudged:
        dlcheck.skip("; ".join(unjudged))
    if no_shuffle is not None:
        dlcheck.not_applicable(no_shuffle[1])
    dlcheck.not_applicable(
        f"{where} does not shuffle ({type(getattr(loader, 'sampler', None)).__name__}) and has no multi-worker "
        "worker_init_fn: no random order or worker stream to judge"
    )
