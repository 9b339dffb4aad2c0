"""Bounded, shared sampling of the user's data: a few examples and the batches their collator makes,
computed once per session per (collator, dataset) or dataloader and reused by every check.

Cost never grows with the dataset: a map-style dataset is indexed at ``samples`` evenly spread,
deterministic positions; an iterable one is read for its first ``samples`` examples; a dataloader gives
at most as many batches as needed to cover ``samples`` examples."""

from __future__ import annotations

import copy
import itertools
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from .errors import MISSING, RoleError
from .guard import kept, preserved_dataloader, preserved_rng, seed_everything
from .roles import ROLES
from .session import user_call


@dataclass
class Sample:
    #: the examples as the collator takes them; None when only a dataloader was given
    rows: list[Any] | None
    #: collated batches: mappings of the collator's outputs, of the type it returns (a dict, a BatchEncoding)
    batches: list[Mapping[str, Any]]
    #: for each batch, the indices into ``rows`` it was collated from (None for dataloader batches)
    batch_rows: list[list[int]] | None
    #: where it came from, for evidence lines
    source: str
    #: the dataset positions the rows were read from
    positions: list[int] | None = None
    #: the same examples with every field (prompt, completion, messages…) when a trainer removed some
    #: columns before collation; else ``rows``
    raw_rows: list[Any] | None = None
    #: the length of the dataset the rows were read from, when known
    total: int | None = None


class SampleError(Exception):
    """The sample cannot be drawn (an empty loader, no token batches): the check skips with this reason;
    ``not_applicable`` when the data are of another kind than the check concerns (images, generations)."""

    def __init__(self, message: str, not_applicable: bool = False):
        super().__init__(message)
        self.not_applicable = not_applicable


def spread_positions(length: int, n: int) -> list[int]:
    """``n`` deterministic positions spread evenly over ``range(length)`` (first and last included)."""
    if length <= n:
        return list(range(length))
    if n == 1:
        return [0]
    return sorted({round(i * (length - 1) / (n - 1)) for i in range(n)})


def indexable(dataset: Any) -> bool:
    """Whether a dataset is read by index (map-style): it has a length and a ``__getitem__`` of its own. A torch
    ``IterableDataset`` is read by iterating it even when it defines ``__len__`` (torchtext's datapipes, a stream that
    knows its size): the ``__getitem__`` it has is torch's ``Dataset.__getitem__``, which raises
    NotImplementedError, as does that of any Dataset subclass that defines ``__iter__`` only. Imports nothing."""
    try:
        len(dataset)
    except (TypeError, AttributeError, NotImplementedError):
        return False
    for cls in type(dataset).__mro__:
        if cls.__name__ in ("IterableDataset", "IterDataPipe") and cls.__module__.startswith("torch.utils.data"):
            return False
        if "__getitem__" in vars(cls):
            # the first class that defines it: torch's placeholder is no way to read the examples
            return not (cls.__name__ == "Dataset" and cls.__module__.startswith("torch.utils.data"))
    return False


def sample_rows(dataset: Any, n: int, role: str = "dataset") -> tuple[list[Any], list[int] | None]:
    """``n`` examples of a dataset: at spread positions of a map-style one (with the positions), else its first ``n``
    (positions None): an IterableDataset is iterated, never indexed."""
    if not indexable(dataset):
        return user_call(role, lambda: list(itertools.islice(iter(dataset), n))), None
    length, getitem = len(dataset), dataset.__getitem__
    positions = spread_positions(length, n)
    return [user_call(role, lambda p=p: getitem(p)) for p in positions], positions


def as_batch_dict(batch: Any, role: str) -> Mapping[str, Any]:
    """The batch as the checks read it: a mapping of fields, of its own type (a ``BatchEncoding`` stays one, so
    that the user's code handed a sampled batch gets what the pipeline gives it), a shallow copy (a check
    that sets a field leaves the user's object as it was)."""
    if isinstance(batch, Mapping):
        return _own_copy(batch)
    if isinstance(batch, (list, tuple)) and batch and all(isinstance(b, Mapping) for b in batch):
        # the trainer builds its token batches inside its own step (TRL's online trainers tokenize the prompts and
        # generate the completions there): a check of those batches concerns the pipeline, it cannot see them
        raise SampleError(
            f"not judged: dlcheck_{role} returns the examples uncollated (a list of dicts): the trainer builds its "
            "token batches inside its training step (as TRL's GRPO, RLOO and distillation trainers tokenize the "
            "prompts and generate the completions there), where pytest-dlcheck does not see them"
        )
    if role != "collator" and isinstance(batch, (list, tuple)) and batch:
        # (inputs, targets): a vision, detection or plain training loader, legitimately not a token batch (a
        # collator, the llm/vlm role, must return a mapping: there a list is the user's error)
        parts = ", ".join(str(tuple(b.shape)) if hasattr(b, "shape") else f"a {type(b).__name__}" for b in batch[:4])
        what = "tensors" if all(hasattr(b, "shape") for b in batch) else "values"
        raise SampleError(
            f"dlcheck_{role} yields {type(batch).__name__}s of {what} ({parts}), not mappings of token "
            "fields (input_ids, labels, …): there are no token batches to check",
            not_applicable=True,
        )
    if role != "collator" and hasattr(batch, "shape") and hasattr(batch, "dtype"):
        # one tensor per batch, no fields: a plain image or signal loader (a pixel-space diffusion's images). The
        # README asks a mapping of the collator only; a loader yields what its pipeline trains on
        raise SampleError(
            f"dlcheck_{role} yields bare {_tensor_words(batch)}, not mappings of token fields (input_ids, labels, "
            "…): no token ids and no text fields, so there are no token batches to check",
            not_applicable=True,
        )
    raise RoleError(
        role, f"returned a {type(batch).__name__}, expected a mapping of batch fields (input_ids, labels, …)"
    )


def _tensor_words(batch: Any) -> str:
    """'float Tensors (8, 3, 32, 32): a batch of images' for a loader's bare batch."""
    dtype = str(getattr(batch, "dtype", ""))
    kind = "float" if "float" in dtype or "half" in dtype else "integer" if "int" in dtype else dtype or "typed"
    shape = tuple(batch.shape)
    images = kind == "float" and len(shape) == 4 and shape[1] in (1, 3, 4)
    return f"{kind} {type(batch).__name__}s {shape}" + (" (a batch of images and nothing else)" if images else "")


def _own_copy(batch: Mapping) -> Mapping[str, Any]:
    if type(batch) is dict:
        return dict(batch)
    try:
        again = copy.copy(batch)
    except (TypeError, copy.Error):  # a mapping that cannot be copied: its fields in a plain dict
        return dict(batch.items())
    return again if isinstance(again, Mapping) and again is not batch else dict(batch.items())


def collate_rows(collator: Any, rows: list[Any], batch_size: int) -> tuple[list[dict[str, Any]], list[list[int]]]:
    batches, groups = [], []
    for start in range(0, len(rows), batch_size):
        idx = list(range(start, min(start + batch_size, len(rows))))
        batch = user_call("collator", lambda: collator([rows[i] for i in idx]))
        batches.append(as_batch_dict(batch, "collator"))
        groups.append(idx)
    return batches, groups


def draw_batches(
    dataloader: Any, n_examples: int, role: str = "dataloader", as_yielded: bool = False
) -> list[dict[str, Any]]:
    """Batches of the loader covering ``n_examples``: mappings of fields (:func:`as_batch_dict`); with ``as_yielded``,
    what is no mapping is kept as the loader yields it (a bare image tensor, a tuple), for code of the user's that
    takes the pipeline's own batches."""
    batches: list[Any] = []
    seen = 0
    with preserved_dataloader(dataloader):
        it = user_call(role, lambda: iter(dataloader))
        while seen < n_examples and len(batches) < n_examples:
            batch = user_call(role, lambda it=it: next(it, None))
            if batch is None:
                break
            batch = kept(batch)  # a loader may refill and yield the same buffers
            if not as_yielded or isinstance(batch, Mapping):
                batch = as_batch_dict(batch, role)
            batches.append(batch)
            seen += _n_examples(batch)
        del it  # stop worker processes now
    return batches


def _n_examples(batch: Any) -> int:
    if isinstance(batch, Mapping):
        batch = next(iter(batch.values()), None)
    elif isinstance(batch, (list, tuple)) and batch:
        batch = batch[0]
    return len(batch) if hasattr(batch, "__len__") else 1


def _raw_row(raw: Any, position: int, dataset: Any) -> Any:
    """Row ``position`` of dlcheck_raw_dataset, which holds the same examples as dlcheck_dataset in the
    same order; a raw dataset of another length (texts before grouping, say) is the user's error, said so."""
    try:
        size, expected = len(raw), len(dataset)
    except TypeError:
        size = expected = None
    if size is not None and size != expected:
        raise RoleError(
            "raw_dataset",
            f"holds {size} rows where the training dataset holds {expected}: it must be the same examples in the "
            "same order, with every field (for texts before tokenization and grouping, use dlcheck_documents)",
        )
    return raw[position]


def stored_tokens(dataset: Any) -> bool:
    """Whether reading a dataset's rows runs no code of the user's: a ``datasets.Dataset`` that stores its token ids
    (an ``input_ids`` column) with no transform set on it (``set_transform`` / ``with_transform``)."""
    cols = getattr(dataset, "column_names", None)
    fmt = getattr(dataset, "format", None)
    return (
        isinstance(cols, list)
        and "input_ids" in cols
        and not (isinstance(fmt, Mapping) and fmt.get("type") == "custom")
        and hasattr(dataset, "__len__")
    )


def get_sample(ctx: Any, split: str = "train", wide: int | None = None, as_yielded: bool = False) -> Sample:
    """The shared sample of the training (or eval) data, from the best source the user gave:
    collator + dataset (examples are known), else the dataloader. Skips naming the roles if none.

    ``wide``: for a check that only reads the tokens (no model call), up to this many examples instead of the
    session's ``samples`` when that is cheap: a dataset of stored token ids (:func:`stored_tokens`) collated by the
    collator. Elsewhere (a loader, a dataset that tokenizes or loads on access) the usual sample.

    ``as_yielded``: a dataloader's batches as it yields them when they are no mappings (a bare image tensor, a tuple),
    for a check that hands them to the user's own code (which takes what the pipeline gives it); the same batch
    objects as the usual sample's where they are mappings. A collator's batches are mappings by contract."""
    override = getattr(ctx, "sample_override", None)
    if override is not None and split == "train":
        return override  # property mode: the generated examples
    dataset_role = "dataset" if split == "train" else "eval_dataset"
    loader_role = "dataloader" if split == "train" else "eval_dataloader"
    collator, dataset = ctx.role("collator"), ctx.role(dataset_role)
    raw = ctx.role("raw_dataset") if split == "train" else MISSING
    n, bs = ctx.samples, ctx.batch_size
    widened = (
        wide is not None and wide > n and collator is not MISSING and dataset is not MISSING and stored_tokens(dataset)
    )
    if widened:
        n = wide
    if collator is not MISSING and dataset is not MISSING:

        def make() -> Sample:
            # drawn from the global RNGs at one seed: random transforms and shuffles give the same sample whichever
            # check draws it first (a verdict does not depend on the selection)
            with preserved_rng():
                seed_everything(0)
                rows, positions = sample_rows(dataset, n, dataset_role)
                if not rows:
                    raise SampleError(f"dlcheck_{dataset_role} is empty")
                batches, groups = collate_rows(collator, rows, bs)
                raw_rows = rows
                if raw is not MISSING and raw is not dataset and positions is not None:
                    raw_rows = [_raw_row(raw, p, dataset) for p in positions]
            total = len(dataset) if positions is not None else None
            of = f" of the {total}" if widened and total is not None else ""
            source = f"dlcheck_collator on {len(rows)}{of} examples of dlcheck_{dataset_role}"
            return Sample(rows, batches, groups, source, positions, raw_rows, total)

        return _memo_sample(ctx, (collator, dataset), f"sample:{split}:{n}:{bs}", make)
    loader = ctx.role(loader_role)
    if loader is not MISSING:

        def make_yielded() -> Sample:
            with preserved_rng():
                seed_everything(0)
                batches = draw_batches(loader, n, loader_role, as_yielded=True)
            if not batches:
                raise SampleError(f"dlcheck_{loader_role} yielded no batch")
            return Sample(None, batches, None, f"{len(batches)} batches of dlcheck_{loader_role}")

        yielded = _memo_sample(ctx, loader, f"sample:{split}:{n}:yielded", make_yielded)
        if as_yielded:
            return yielded

        def make_from_loader() -> Sample:
            # mappings of fields, the same objects as the yielded sample's (one draw of the loader)
            batches = [b if isinstance(b, Mapping) else as_batch_dict(b, loader_role) for b in yielded.batches]
            return Sample(None, batches, None, yielded.source)

        return _memo_sample(ctx, loader, f"sample:{split}:{n}", make_from_loader)
    ctx.skip(f"missing role: define fixture {ROLES[loader_role].hint()} in conftest.py")


def _memo_sample(ctx: Any, sources: Any, key: str, make: Any) -> Sample:
    result = ctx.memo(sources, key, lambda: _capture(make))
    if isinstance(result, BaseException):
        if isinstance(result, SampleError):
            if result.not_applicable:
                ctx.not_applicable(str(result))
            ctx.skip(str(result))
        raise result
    return result


def _capture(make: Any) -> Any:
    # a failure of the user's data is remembered too, so every check reports it without re-running it
    try:
        return make()
    except Exception as exc:  # noqa: BLE001 - re-raised by the caller, for each check
        return exc
