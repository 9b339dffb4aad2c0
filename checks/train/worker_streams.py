"""T7's worker streams, measured in real workers: a map-style training loader's workers fetch one example many
times, and the random draws of its augmentation are compared across workers and epochs.

A dataset (or its transform) that draws from a generator of its own — an albumentations ``Compose``'s, a
``numpy.random.default_rng(seed)`` made in ``__init__`` — hands every DataLoader worker a copy of that
generator as the main process holds it: torch seeds the global torch, python and numpy generators of each
worker, never a private one. Every worker then replays one stream, and, since the main process never draws,
every epoch's fresh workers replay it again. This module runs the user's own dataset in the user's own worker
setup (worker count, ``worker_init_fn``, start method, persistent workers) and reads what the workers yield."""

from __future__ import annotations

import math
import random
import sys
from collections import Counter
from typing import Any

import torch

#: fetches of the one example per worker: a fair coin's 24 draws agree by chance with probability 6e-8
FETCHES = 24
#: seconds a probe worker may take for its batch before the probe gives up (the user's data is too slow)
TIMEOUT = 120


def _probe_collate(items: list[Any]) -> tuple[int, list[str]]:
    """Runs in the worker: which worker fetched, and a content digest of each fetch."""
    from ..shared.digest import nested_digest

    info = torch.utils.data.get_worker_info()
    return (info.id if info is not None else -1), [nested_digest(_plain(x)) for x in items]


def _plain(x: Any) -> Any:
    """A PIL image as its bytes, so that the digest sees its pixels."""
    if hasattr(x, "tobytes") and hasattr(x, "size") and hasattr(x, "mode"):
        return (x.mode, x.size, x.tobytes())
    if isinstance(x, dict):
        return {k: _plain(v) for k, v in x.items()}
    if isinstance(x, (list, tuple)):
        return [_plain(v) for v in x]
    return x


def private_generators(dataset: Any, limit: int = 2000) -> list[str]:
    """Where the dataset holds a random generator of its own (a numpy Generator / RandomState, a
    ``random.Random``, a ``torch.Generator`` other than the global ones), as attribute paths from the dataset;
    a bounded walk of its attributes, lists and dicts (never its data tensors)."""
    return [f"{path} ({type(gen).__module__}.{type(gen).__qualname__})" for path, gen in own_generators(dataset, limit)]


def own_generators(dataset: Any, limit: int = 2000, most: int = 4) -> list[tuple[str, Any]]:
    """(attribute path, generator) of the random generators the dataset holds of its own (:func:`private_generators`),
    at most ``most``."""
    np = sys.modules.get("numpy")
    kinds: list[type] = [random.Random, torch.Generator]
    globals_ = {id(random._inst), id(torch.default_generator)}  # type: ignore[attr-defined]
    if np is not None:
        kinds += [np.random.Generator, np.random.RandomState]
        globals_.add(id(np.random.mtrand._rand))
    found: list[tuple[str, Any]] = []
    seen: set[int] = set()
    queue: list[tuple[Any, str, int]] = [(dataset, "dataset", 0)]
    while queue and len(seen) < limit and len(found) < most:
        obj, path, depth = queue.pop(0)
        if id(obj) in seen or depth > 6:
            continue
        seen.add(id(obj))
        if isinstance(obj, tuple(kinds)):
            if id(obj) not in globals_:
                found.append((path, obj))
            continue
        if isinstance(obj, (str, bytes, int, float, bool, type(None), torch.Tensor)) or (
            np is not None and isinstance(obj, np.ndarray)
        ):
            continue
        if isinstance(obj, dict):
            items = list(obj.items())[:50]
            queue += [(v, f"{path}[{k!r}]", depth + 1) for k, v in items if isinstance(k, (str, int))]
        elif isinstance(obj, (list, tuple)):
            queue += [(v, f"{path}[{i}]", depth + 1) for i, v in enumerate(obj[:50])]
        elif hasattr(obj, "__dict__") and not isinstance(obj, type) and type(obj).__module__ != "builtins":
            for name, value in list(vars(obj).items())[:80]:
                queue.append((value, f"{path}.{name}", depth + 1))
    return found


def _first_index(loader: Any) -> Any:
    sampler = getattr(loader, "sampler", None)
    if sampler is None:
        return 0
    try:
        return next(iter(sampler))
    except (StopIteration, TypeError):
        return 0


def probe(loader: Any) -> dict[str, Any]:
    """Fetch one example of the loader's dataset FETCHES times in each of (up to) two workers, in two epochs,
    with the loader's own worker setup. Returns what was measured: ``fetches`` {(epoch, worker): [digest...]}, or
    ``error`` (the probe could not run, with why)."""
    from ...guard import preserved_dataloader, preserved_rng

    workers = min(2, int(loader.num_workers))
    with preserved_rng(), preserved_dataloader(loader):
        index = _first_index(loader)
    gen = torch.Generator()
    gen.manual_seed(20261129)
    probe_loader = torch.utils.data.DataLoader(
        loader.dataset,
        batch_sampler=[[index] * FETCHES for _ in range(workers)],
        num_workers=workers,
        collate_fn=_probe_collate,
        worker_init_fn=getattr(loader, "worker_init_fn", None),
        multiprocessing_context=getattr(loader, "multiprocessing_context", None),
        persistent_workers=bool(getattr(loader, "persistent_workers", False)),
        generator=gen,
        timeout=TIMEOUT,
    )
    fetches: dict[tuple[int, int], list[str]] = {}
    try:
        with preserved_rng():
            for epoch in (0, 1):
                for n, (worker, digests) in enumerate(probe_loader):
                    fetches[(epoch, worker if worker >= 0 else n)] = digests
    except Exception as exc:  # noqa: BLE001 - the user's dataset in a worker: said, not judged
        return {"error": f"{type(exc).__name__}: {str(exc).strip().splitlines()[0][:200] if str(exc).strip() else ''}"}
    finally:
        del probe_loader
    return {"fetches": fetches, "index": index, "workers": workers}


def chance_alike(fetches: dict[tuple[int, int], list[str]]) -> float:
    """How likely two independent runs of FETCHES draws agree at every fetch, from the pooled frequencies of
    the examples seen: (Σ p²)^FETCHES."""
    pooled = Counter(d for ds in fetches.values() for d in ds)
    total = sum(pooled.values())
    q = sum((c / total) ** 2 for c in pooled.values())
    return math.exp(FETCHES * math.log(q)) if q > 0 else 0.0
