"""D3's view of the examples a rank's sampler indices select: an index is a position in *this rank's* dataset,
and when that dataset is a selection of a larger one (a ``torch.utils.data.Subset``, what ``random_split``
returns, or a ``datasets.Dataset`` after ``select`` / ``shuffle`` / ``train_test_split``), two ranks' equal
indices name the same example only if the two ranks selected alike. Each rank resolves its shard's indices
through the selections down to the dataset underneath, and a digest of its whole selection tells whether the
ranks selected alike. A digest of a few examples fetched at fixed positions (with the global generators at one
seed) tells whether the ranks' datasets hold the same examples at all (``datasets``' ``shard(world, rank)``
slices its table and keeps no indices to resolve)."""

from __future__ import annotations

import hashlib
from typing import Any

from ...sampling import indexable

#: selections deeper than this are not followed (a chain of Subsets is rarely more than three deep)
MAX_DEPTH = 8


def _selection(dataset: Any) -> tuple[Any, Any] | None:
    """(the positions, a numpy array, in the dataset underneath that ``dataset`` selects, that dataset), or None
    when ``dataset`` selects nothing of another one."""
    import numpy as np
    from torch.utils.data import Subset

    if isinstance(dataset, Subset):
        try:
            return np.asarray(dataset.indices, dtype=np.int64), dataset.dataset
        except (TypeError, ValueError):
            return None
    table = getattr(dataset, "_indices", None)  # a datasets.Dataset after select / shuffle / split
    if table is not None and hasattr(table, "column") and hasattr(dataset, "_data"):
        try:
            positions = np.asarray(table.column(0).to_numpy(), dtype=np.int64)
        except Exception:  # noqa: BLE001 - a datasets version that stores its indices otherwise: not resolved
            return None
        return positions, ("arrow", id(dataset._data), len(dataset._data))
    return None


def probe(dataset: Any) -> str | None:
    """A digest of the examples at positions 0, n // 2 and n - 1 of ``dataset``, each fetched with the global
    generators at one seed (a random transform draws alike on every rank), the generators put back; None when
    they cannot be fetched."""
    import random

    import numpy as np
    import torch

    from .launch import _saved_rng, nested_digest

    try:
        n = len(dataset)
    except TypeError:
        return None
    if not n or not indexable(dataset):
        return None
    parts = []
    try:
        with _saved_rng():
            for i in [0, *sorted({0, n // 2, n - 1})]:
                random.seed(0)
                np.random.seed(0)
                torch.manual_seed(0)
                parts.append(nested_digest(dataset[i]))
    except Exception:  # noqa: BLE001 - an example that cannot be fetched here: the datasets are not compared
        return None
    if parts[0] != parts[1]:
        return None  # example 0 differs from itself at one seed (a generator of its own): nothing to compare
    return hashlib.sha1("|".join(parts[1:]).encode()).hexdigest()[:16]


def resolve(dataset: Any, shard: list[int] | None) -> dict[str, Any] | None:
    """What D3 needs to know of this rank's dataset: ``probe`` (see :func:`probe`), and, when the dataset is a
    selection of data underneath, how it selects and its shard's indices resolved there (``digest``, ``selected``,
    ``head``, ``base_len``, ``kinds``, ``shard``); None without a shard."""
    import numpy as np

    if shard is None or dataset is None:
        return None
    found: dict[str, Any] = {"probe": probe(dataset)}
    mapping = None
    base: Any = dataset
    kinds: list[str] = []
    for _ in range(MAX_DEPTH):
        selected = _selection(base)
        if selected is None:
            break
        positions, under = selected
        kinds.append(type(base).__name__)
        mapping = positions if mapping is None else positions[mapping]
        base = under
        if isinstance(under, tuple):  # a datasets.Dataset's arrow table: the bottom
            break
    if mapping is None:
        return found
    try:
        base_len = base[2] if isinstance(base, tuple) else len(base)
    except TypeError:
        base_len = None
    index = np.asarray(shard, dtype=np.int64)
    if index.size and (index.min() < 0 or index.max() >= mapping.size):
        return found
    return found | {
        "digest": hashlib.sha1(mapping.tobytes()).hexdigest()[:16],
        "selected": int(mapping.size),
        "head": [int(i) for i in mapping[:6]],
        "base_len": base_len,
        "base_type": "arrow table" if isinstance(base, tuple) else type(base).__name__,
        "kinds": kinds,
        "shard": [int(i) for i in mapping[index]],
    }
