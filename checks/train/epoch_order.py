from __future__ import annotations

import contextlib
import itertools
import math
import random
import sys
from collections.abc import Iterator
from typing import Any

import torch

from ...errors import MISSING
from ...guard import kept, preserved_dataloader, preserved_rng, seed_everything
from ...registry import Setting, check
from ...training import find_setup, memo_or_skip
from . import worker_streams

#: entries of an epoch's order that are compared (the first ones): bounded cost on any dataset
COMPARED = 64
#: epochs read at most, for the shortest orders
MAX_EPOCHS = 21
#: batches drawn from each of two iterations of a loader whose order is its own (an IterableDataset's): bounded cost
STREAM_BATCHES = 8


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
        if getattr(args, "max_steps", -1) and args.max_steps > 0:
            if not batches:
                return None  # max_steps over a loader of unknown length (a stream): the epochs are not known
            accum = max(1, int(getattr(args, "gradient_accumulation_steps", 1) or 1))
            return args.max_steps * accum / batches, f"max_steps={args.max_steps} of {batches} batches an epoch"
        return float(args.num_train_epochs), f"num_train_epochs={args.num_train_epochs}"
    if setup is not None and setup.kind in ("loop", "accelerate") and epochs_role not in (MISSING, None):
        return float(epochs_role), f"dlcheck_num_epochs={epochs_role}"
    trainer = getattr(setup, "l_trainer", None) if setup is not None and setup.kind == "lightning" else None
    if trainer is None or trainer is MISSING:
        return None
    if (getattr(trainer, "max_steps", -1) or -1) > 0:
        if not batches:
            return None  # max_steps over a loader of unknown length: whichever ends first is not known
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


@contextlib.contextmanager
def _kept_dataset(dataset: Any) -> Iterator[None]:
    """Put back what iterating a dataset may move in it: the random generators it holds of its own (a shuffle buffer's
    ``random.Random``, a ``torch.Generator``), and its own numbers (an epoch counter its ``__iter__`` or ``set_epoch``
    advances, also a one-element tensor in shared memory, as datasets' ``IterableDataset._epoch``); an attribute
    the iterations added is dropped. The dataset it wraps (``.dataset``) too."""
    owners = [d for d in (dataset, getattr(dataset, "dataset", None)) if d is not None and hasattr(d, "__dict__")]
    np = sys.modules.get("numpy")
    gens: list[tuple[Any, Any]] = []
    for owner in owners:
        for _, gen in worker_streams.own_generators(owner, most=16):
            if isinstance(gen, random.Random):
                gens.append((gen, gen.getstate()))
            elif np is not None and isinstance(gen, np.random.Generator):
                gens.append((gen, gen.bit_generator.state))
            else:  # torch.Generator, numpy RandomState
                gens.append((gen, gen.get_state()))
    numbers = []
    for owner in owners:
        attrs = vars(owner)
        saved = {
            k: v.detach().clone() if isinstance(v, torch.Tensor) else v
            for k, v in attrs.items()
            if (isinstance(v, (int, float)) and not isinstance(v, bool))
            or (isinstance(v, torch.Tensor) and v.numel() == 1)
        }
        numbers.append((owner, set(attrs), saved))
    try:
        yield
    finally:
        for gen, state in gens:
            if isinstance(gen, random.Random):
                gen.setstate(state)
            elif np is not None and isinstance(gen, np.random.Generator):
                gen.bit_generator.state = state
            else:
                gen.set_state(state)
        for owner, names, saved in numbers:
            attrs = vars(owner)
            for k in set(attrs) - names:
                attrs.pop(k, None)
            for k, v in saved.items():
                now = attrs.get(k)
                if isinstance(v, torch.Tensor) and isinstance(now, torch.Tensor) and now.shape == v.shape:
                    with torch.no_grad():
                        now.copy_(v)  # in place: the tensor may be shared with worker processes
                else:
                    attrs[k] = v


def _stream_batches(dlcheck: Any, loader: Any, own: Any, role: str) -> tuple[int, bool, int | None, bool]:
    """Draw the first :data:`STREAM_BATCHES` batches of two fresh iterations of the user's loader, epochs 0 and 1 as
    the loop sees them (``set_epoch`` applied where the loader or its dataset has it, as the Trainer and a correct loop
    do, or the user's own ``dlcheck_start_epoch``), the global RNGs seeded once before the first: (batches of epoch 0
    compared, whether they are the whole epoch, the first batch of epoch 1 that differs or None, whether set_epoch
    was applied). The RNGs, the loader's generators and epoch counters, and the dataset's own generators and counters are put back."""
    from ..shared.digest import nested_digest

    dataset = getattr(loader, "dataset", None)
    owners = [o for o in (loader, dataset, getattr(dataset, "dataset", None)) if o is not None]
    set_epoch = own is None and any(hasattr(o, "set_epoch") for o in owners)

    def start(epoch: int) -> None:
        if own is not None:
            own(loader, epoch)
            return
        for owner in owners:
            if hasattr(owner, "set_epoch"):
                dlcheck.call(role, lambda owner=owner: owner.set_epoch(epoch))

    def draw(epoch: int, until: list[str] | None) -> list[str]:
        start(epoch)
        digests: list[str] = []
        it = dlcheck.call(role, lambda: iter(loader))
        while len(digests) < (len(until) if until is not None else STREAM_BATCHES):
            batch = dlcheck.call(role, lambda it=it: next(it, None))
            if batch is None:
                break
            digests.append(nested_digest(kept(batch)))
            if until is not None and digests[-1] != until[len(digests) - 1]:
                break
        del it  # stop worker processes now
        return digests

    with preserved_rng(), preserved_dataloader(loader), _kept_dataset(dataset):
        seed_everything(0)
        first = draw(0, None)
        whole = len(first) < STREAM_BATCHES
        if len(first) < 2:
            return len(first), whole, None, set_epoch
        second = draw(1, first)
    differ = next((i for i, (a, b) in enumerate(zip(first, second)) if a != b), None)
    if differ is None and len(second) < len(first):
        differ = len(second)  # epoch 1 ended sooner: other batches
    return len(first), whole, differ, set_epoch


def _epochs_unseen(setup: Any, what: str) -> str:
    """Why the number of epochs is not known, naming what would tell it."""
    if setup is not None and setup.kind == "lightning":
        return (
            "how many epochs your run trains is not visible (hand over your Lightning Trainer as dlcheck_trainer and "
            "its max_epochs is read)"
        )
    if what == "loop":
        return (
            "how many epochs your loop trains is in your own code (define fixture dlcheck_num_epochs returning it, "
            "and T7 judges it)"
        )
    return "how many epochs your run trains is not visible (define fixture dlcheck_num_epochs returning it, and T7 judges it)"


def _judge_own_order(dlcheck, setup, loader, where) -> tuple[str, str]:
    """A loader whose order is its own (an IterableDataset's, or a loader without a sampler), in a run whose plan trains
    more than one epoch: two fresh iterations of it, epochs 0 and 1, are compared by their first batches. Passes
    (``("judged", what)``) when they differ; fails when they are identical; ("not judged", why) when the plan is not
    visible (nothing is drawn), or the loader cannot be read so; ("not applicable", why) for one epoch, or one batch
    per epoch."""
    dataset = getattr(loader, "dataset", None)
    head = (
        f"{where} reads {type(dataset).__name__}, an IterableDataset"
        if _iterable(loader)
        else f"{where} is a {type(loader).__name__} without a sampler"
    )
    if hasattr(loader, "__next__") and iter(loader) is loader:
        return "not judged", f"{head}: a one-shot iterator, whose order is not read (reading it would consume it)"
    plan = _planned_epochs(setup, loader, dlcheck.role("num_epochs"))
    if plan is None:
        return "not judged", (
            f"{head}: its order is its own, which T7 reads by drawing the first batches of two epochs of it when the "
            "run trains more than one epoch (one epoch repeats no order), and " + _epochs_unseen(setup, "run")
        )
    if plan[0] <= 1:
        return "not applicable", f"{head}, and the run trains one epoch ({plan[1]}): no order repeats"
    role = (
        "dataloader"
        if dlcheck.has("dataloader")
        else "trainer"
        if setup is not None and setup.kind == "trainer"
        else "datamodule"
        if dlcheck.has("datamodule")
        else "lightning_module"
    )
    own = _own_epoch_start(dlcheck, setup)
    compared, whole, differ, set_epoch = _stream_batches(dlcheck, loader, own, role)
    if compared < 2:
        if compared == 1:
            return "not applicable", (
                f"{head} that yields one batch per epoch: the epochs train on the same full batch, whatever its order"
            )
        return "not judged", f"{head}: it yielded no batch, no order to compare"
    how = (
        "your dlcheck_start_epoch (the top of your epoch loop) run before each"
        if own is not None
        else "set_epoch(epoch) applied before each, as a Trainer and a correct loop do"
        if set_epoch
        else "neither the loader nor its dataset has a set_epoch"
    )
    what = f"two iterations of it (epochs 0 and 1 as your loop sees them; {how})"
    if differ is not None:
        return "judged", (
            f"{head}: {what} give other batches or another order (batch {differ} of epoch 1 differs; the first "
            f"{compared} batches of epoch 0 drawn)"
        )
    same = (
        f"{head}: {what} give the same {compared} batches, the whole epoch, identical in content and order"
        if whole
        else f"{head}: {what} give the same first {compared} batches, identical in content and order ({compared} "
        "batches of each compared)"
    )
    epochs, read = plan
    dlcheck.fail(
        [same, f"the run trains {epochs:g} epochs ({read})"],
        "the training data comes in one fixed order that nothing shuffles: the "
        + ("loader's IterableDataset" if _iterable(loader) else "loader")
        + " yields its examples in the same order at every iteration, so every epoch presents the same batches, with "
        "the same neighbours and the same last batch, epoch after epoch",
        "shuffle the stream anew every epoch: a shuffle buffer seeded with seed + epoch (datasets: "
        "IterableDataset.shuffle(seed=..., buffer_size=...) and set_epoch(epoch) each epoch; a datapipe's .shuffle() "
        "stage, which DataLoader(..., shuffle=True) turns on), or load the examples into a map-style dataset and use "
        "DataLoader(..., shuffle=True)",
        epochs=epochs,
        batches_compared=compared,
    )
    raise AssertionError("unreachable: dlcheck.fail raises")


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
        return "not judged", (
            f"{where} does not shuffle ({kind}): every epoch visits the examples in the same order, which matters "
            "when the run trains more than one epoch; "
            + _epochs_unseen(setup, "loop")
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
        2 or for samplers that draw with replacement). A loader whose order is its own (over an IterableDataset,
        also one that defines ``__len__`` as torchtext's datapipes do; a hand-written loader without a sampler), in a
        run whose plan trains more than one epoch: draws the first 8 batches of two fresh iterations of your own
        loader, epochs 0 and 1 as the loop sees them (``set_epoch(epoch)`` applied where the loader or its dataset has
        it, or your ``dlcheck_start_epoch``), and fails when both give the same batches in the same order (the
        evidence says how many batches were compared); passes when they differ (a dataset that shuffles itself: a
        shuffle buffer seeded per epoch, an order drawn at every iteration). The global RNGs are seeded once before
        the first draw and put back afterwards, with the loader's generators and the dataset's own generators and
        counters (an epoch counter its ``__iter__`` or ``set_epoch`` moves). Then, when the loader has
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
        as your loop leaves it (a ``set_epoch`` called only when distributed is seen). The order of an IterableDataset
        (or of a loader without a sampler) is read from its batches only when the run's plan is visible and trains
        more than one epoch (a loop's ``dlcheck_num_epochs``, a Trainer's ``num_train_epochs``, a Lightning Trainer's
        ``max_epochs``; a ``max_steps`` over a loader of unknown length says no number of epochs): otherwise it is not
        judged; only its first 8 batches of each epoch are compared (a stream that kept its first 8 batches in place
        every epoch and shuffled only later ones would be taken for one fixed order); a one-shot iterator is never
        read. ``worker_init_fn``s that need a real worker are not judged
        either: with nothing else to judge, the check skips. The worker streams are compared on whole examples: an
        augmentation with few outcomes (a flip alone) agrees by chance too often to tell and is said not judged;
        one replayed stream mixed with another drawn anew in each worker makes the examples differ and passes.
        A training loader that does not shuffle (a SequentialSampler, ``shuffle=False``) gives every epoch the
        same order: it fails when the run's plan is visible and trains more than one epoch (a Trainer's
        ``num_train_epochs`` / ``max_steps``, a Lightning Trainer handed over as ``dlcheck_trainer``: its
        ``max_epochs`` / ``max_steps``, a plain or Accelerate loop's ``dlcheck_num_epochs``); a loop that does
        not say how many epochs it trains is said not judged (a skip naming the fixture).
    Not applicable
        A training loader that does not shuffle, or whose order is its own (an IterableDataset's), in a run of one
        epoch (no order repeats), or that yields one batch per epoch.
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
    own_order = None
    if _iterable(loader) or (
        getattr(loader, "sampler", None) is None and getattr(loader, "batch_sampler", None) is None
    ):
        # the order is the loader's own (an IterableDataset's, a hand-written loader's): two epochs of it are drawn
        own_order = _judge_own_order(dlcheck, setup, loader, where)
        if own_order[0] == "judged":
            judged.append(own_order[1])
        elif own_order[0] == "not judged":
            unjudged.append(own_order[1])
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
    if own_order is not None:
        dlcheck.not_applicable(own_order[1])
    dlcheck.not_applicable(
        f"{where} does not shuffle ({type(getattr(loader, 'sampler', None)).__name__}) and has no multi-worker "
        "worker_init_fn: no random order or worker stream to judge"
    )
