"""D3's view of the examples a rank's sampler indices select: an index is a position in *this rank's* dataset,
and when that dataset is a selection of a larger one (a ``torch.utils.data.Subset``, what ``random_split``
returns, or a ``datasets.Dataset`` after ``select`` / ``shuffle`` / ``train_test_split``), two ranks' equal
indices name the same example only if the two ranks selected alike. Each rank resolves its shard's indices
through the selections down to the dataset underneath, and a digest of its whole selection tells whether the
ranks selected alike."""

from __future__ import annotations

import hashlib
from typing import Any

#: selections deeper than this are not followed (a chain of Subsets is rarely more than three deep)
MAX_DEPTH = 8


def _selection(dataset: Any) -> tuple[list[int], Any] | None:
    """(the positions in the dataset underneath that ``dataset`` selects, that dataset), or None when
    ``dataset`` selects nothing of another one."""
    from torch.utils.data import Subset

    if isinstance(dataset, Subset):
        try:
            return [int(i) for i in dataset.indices], dataset.dataset
        except (TypeError, ValueError):
            return None
    table = getattr(dataset, "_indices", None)  # a datasets.Dataset after select / shuffle / split
    if table is not None and hasattr(table, "column") and hasattr(dataset, "_data"):
        try:
            positions = [int(i) for i in table.column(0).to_pylist()]
        except Exception:  # noqa: BLE001 - a datasets version that stores its indices otherwise: not resolved
            return None
        return positions, ("arrow", id(dataset._data), len(dataset._data))
    return None


def resolve(dataset: Any, shard: list[int] | None) -> dict[str, Any] | None:
    """How this rank's dataset selects from the dataset underneath, and its shard's indices resolved there;
    None when the dataset is no selection (the indices are the examples themselves)."""
    if shard is None:
        return None
    mapping: list[int] | None = None
    base: Any = dataset
    kinds: list[str] = []
    for _ in range(MAX_DEPTH):
        found = _selection(base)
        if found is None:
            break
        positions, under = found
        kinds.append(type(base).__name__)
        mapping = positions if mapping is None else [positions[i] for i in mapping]
        base = under
        if isinstance(under, tuple):  # a datasets.Dataset's arrow table: the bottom
            break
    if mapping is None:
        return None
    try:
        base_len = base[2] if isinstance(base, tuple) else len(base)
    except TypeError:
        base_len = None
    try:
        resolved = [mapping[i] for i in shard]
    except IndexError:
        return None
    return {
        "digest": hashlib.sha1(repr(mapping).encode()).hexdigest()[:16],
        "selected": len(mapping),
        "head": mapping[:6],
        "base_len": base_len,
        "base_type": "arrow table" if isinstance(base, tuple) else type(base).__name__,
        "kinds": kinds,
        "shard": resolved,
    }
