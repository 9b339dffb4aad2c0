from __future__ import annotations

import bisect
import contextlib
import hashlib
import math
from collections import Counter
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

import torch

from ...errors import MISSING
from ...guard import kept, preserved_dataloader, preserved_rng
from ...registry import Setting, check
from ...sampling import indexable
from ...training import batch_len, describe_batch

#: fields that are targets or derived from the inputs, not content
NOT_CONTENT = {
    "labels",
    "label",
    "attention_mask",
    "completion_mask",
    "token_type_ids",
    "position_ids",
    "assistant_masks",
    "seq_lengths",
    "target",
    "targets",
    "y",
}


def _bytes(value: Any) -> bytes:
    """Bytes that identify a value. Integer sequences (token ids) hash alike whether they come as a list, a
    numpy array or a tensor row of any integer dtype: a dataset's rows and a collated batch's rows match."""
    if isinstance(value, torch.Tensor):
        value = value.detach().cpu()
        if not value.is_floating_point() and not value.is_complex() and value.dtype != torch.bool:
            return b"i" + value.to(torch.int64).contiguous().numpy().tobytes()
        return value.contiguous().numpy().tobytes() + str(value.dtype).encode()
    if hasattr(value, "tobytes"):
        kind = getattr(getattr(value, "dtype", None), "kind", "")
        if kind in ("i", "u"):
            return b"i" + value.astype("int64").tobytes()
        return value.tobytes()
    if isinstance(value, (list, tuple)):
        if value and all(isinstance(v, int) and not isinstance(v, bool) for v in value):
            with contextlib.suppress(OverflowError, RuntimeError, ValueError):  # beyond int64: as written below
                return b"i" + torch.tensor(value, dtype=torch.int64).numpy().tobytes()
        return b"[" + b",".join(_bytes(v) for v in value) + b"]"
    if isinstance(value, Mapping):
        return b"{" + b",".join(k.encode() + b":" + _bytes(v) for k, v in sorted(value.items())) + b"}"
    return repr(value).encode()


def content(example: Any) -> Any:
    """The part of an example that identifies it: the inputs, not the targets."""
    if isinstance(example, Mapping):
        if "input_ids" in example:
            return example["input_ids"]
        return {k: v for k, v in example.items() if k not in NOT_CONTENT}
    if isinstance(example, (list, tuple)) and len(example) >= 2:
        return example[0]
    return example


def documents(example: Any, eos: int | None = None, pair: PairTemplate | None = None) -> list[Any]:
    """The documents packed in one example (TRL's packed rows: ``seq_lengths``, or ``position_ids`` restarting
    at 0; else, given ``eos``, the end-of-sequence token that closes each document of a row packed without
    them), each as ``{"input_ids": [...]}``; an unpacked example is its own single document. Packed rows hide
    duplicates: the same documents packed in another order make another row. A row laid out as the
    tokenizer's own pair template lays out two texts (``pair``: RoBERTa's ``<s>A</s></s>B</s>``) is one
    example, a sentence pair, however many EOS its separators hold."""
    if not isinstance(example, Mapping) or "input_ids" not in example:
        return [example]
    ids = example["input_ids"]
    ids = ids.tolist() if isinstance(ids, torch.Tensor) else list(ids) if isinstance(ids, (list, tuple)) else None
    if not ids or isinstance(ids[0], list):
        return [example]
    mask = example.get("attention_mask")
    mask = mask.tolist() if isinstance(mask, torch.Tensor) else mask
    if isinstance(mask, (list, tuple)) and len(mask) == len(ids) and not all(mask) and "position_ids" not in example:
        # a row padded to max_length (run_clip's captions): the pads (the EOS token, where pad = EOS) are no documents
        ids = [t for t, m in zip(ids, mask) if m]
        if not ids:
            return [example]
    lengths = example.get("seq_lengths")
    if isinstance(lengths, torch.Tensor):
        lengths = lengths.tolist()
    if not (isinstance(lengths, (list, tuple)) and len(lengths) > 1 and sum(lengths) == len(ids)):
        pos = example.get("position_ids")
        pos = pos.tolist() if isinstance(pos, torch.Tensor) else pos
        starts = (
            [i for i, p in enumerate(pos) if p == 0] if isinstance(pos, (list, tuple)) and len(pos) == len(ids) else []
        )
        if len(starts) < 2 and eos is not None and not (pair is not None and pair.holds(ids)):
            # each document ends with its EOS: a new one starts after every EOS but the row's last token
            starts = [0] + [i + 1 for i, t in enumerate(ids[:-1]) if t == eos]
        if len(starts) < 2:
            return [example]
        lengths = [b - a for a, b in zip(starts, starts[1:] + [len(ids)])]
    out, at = [], 0
    for n in lengths:
        out.append({"input_ids": ids[at : at + int(n)]})
        at += int(n)
    return out


#: elements of one example read for its surprisal, and training examples read for the frequencies: bounded cost
SURPRISAL_ELEMENTS = 512
FREQUENCY_ROWS = 2000


def _elements(value: Any, cap: int = SURPRISAL_ELEMENTS) -> list[Any]:
    """The symbols an example's content is made of (token ids, pixel values, characters; a record's fields tagged
    with their names), at most ``cap``."""
    if isinstance(value, torch.Tensor):
        return value.detach().flatten()[:cap].cpu().tolist()
    if hasattr(value, "ravel") and hasattr(value, "tolist"):
        return value.ravel()[:cap].tolist()
    if isinstance(value, str):
        return list(value[:cap])
    if isinstance(value, Mapping):
        out: list[Any] = []
        for k in sorted(value, key=str):
            out += [(str(k), e) for e in _elements(value[k], cap - len(out))]
            if len(out) >= cap:
                break
        return out
    if isinstance(value, (list, tuple)):
        out = []
        for v in value:
            out += _elements(v, cap - len(out)) if isinstance(v, (list, tuple, Mapping, str, torch.Tensor)) else [v]
            if len(out) >= cap:
                break
        return [e if isinstance(e, (int, float, str, tuple)) else repr(e) for e in out[:cap]]
    return [repr(value)]


class Surprisal:
    """How unlikely an example's content is to recur by chance: the sum of its symbols' surprisal (bits) under
    the training data's own symbol frequencies (add-half smoothing for unseen symbols)."""

    def __init__(self, rows: list[Any]):
        self.counts = Counter(e for r in rows[:FREQUENCY_ROWS] for e in _elements(content(r)))
        self.denominator = sum(self.counts.values()) + 0.5 * (len(self.counts) + 1)

    def bits(self, example: Any) -> float:
        return sum(-math.log2((self.counts.get(e, 0) + 0.5) / self.denominator) for e in _elements(content(example)))


def eos_boundary(tok: Any) -> int | None:
    """The end-of-sequence id that closes each document of a packed row; None without a tokenizer, or when its
    chat template ends every turn with it (an EOS inside a row then closes a turn, not a document)."""
    eos_id, eos = getattr(tok, "eos_token_id", None), getattr(tok, "eos_token", None)
    if tok is MISSING or not isinstance(eos_id, int) or isinstance(eos_id, bool):
        return None
    template = getattr(tok, "chat_template", None)
    template = " ".join(map(str, template.values())) if isinstance(template, Mapping) else template
    if isinstance(template, str) and isinstance(eos, str) and eos and eos in template:
        return None
    return eos_id


@dataclass
class PairTemplate:
    """The special tokens the tokenizer's own pair template (``tokenizer(text, text_pair)``) puts before the
    first text, between the two and after the second: RoBERTa's ``<s>``, ``</s></s>``, ``</s>``."""

    prefix: list[int]
    separator: list[int]
    suffix: list[int]
    eos: int
    pad: int | None

    def holds(self, ids: list[int]) -> bool:
        """Whether a row is two texts joined by this template (padding around it left out): it opens with the
        prefix, closes with the suffix, and holds the separator once, with no other EOS between."""
        if self.pad is not None and self.pad != self.eos:
            a, b = 0, len(ids)
            while a < b and ids[a] == self.pad:
                a += 1
            while b > a and ids[b - 1] == self.pad:
                b -= 1
            ids = ids[a:b]
        p, q, sep = len(self.prefix), len(self.suffix), self.separator
        if len(ids) < p + q + len(sep) or ids[:p] != self.prefix or (q and ids[len(ids) - q :] != self.suffix):
            return False
        middle = ids[p : len(ids) - q]
        at = [i for i in range(len(middle) - len(sep) + 1) if middle[i : i + len(sep)] == sep]
        if len(at) != 1:
            return False
        rest = middle[: at[0]] + middle[at[0] + len(sep) :]
        return self.eos not in rest


def pair_template(tok: Any, eos: int | None) -> PairTemplate | None:
    """The tokenizer's pair template when its separator holds the EOS (a RoBERTa, BART or XLM-R tokenizer:
    a pair row's EOS separate its two texts, not packed documents), read from ``tokenizer(text, text_pair)``;
    None otherwise, or without a tokenizer that encodes pairs."""
    if eos is None or tok is MISSING:
        return None
    try:
        enc = tok("a", "b", return_special_tokens_mask=True)
        ids, special = list(enc["input_ids"]), list(enc["special_tokens_mask"])
    except Exception:  # noqa: BLE001 - a processor that takes no text pair: no template to read
        return None
    if len(ids) != len(special) or not ids:
        return None
    runs, i = [], 0
    while i < len(ids):  # the texts: the runs of non-special tokens
        if not special[i]:
            j = i
            while j < len(ids) and not special[j]:
                j += 1
            runs.append((i, j))
            i = j
        else:
            i += 1
    if len(runs) != 2:
        return None
    separator = ids[runs[0][1] : runs[1][0]]
    if eos not in separator:
        return None
    pad = getattr(tok, "pad_token_id", None)
    return PairTemplate(ids[: runs[0][0]], separator, ids[runs[1][1] :], eos, pad if isinstance(pad, int) else None)


def tokens(example: Any) -> tuple[int, ...] | None:
    """The token ids of a tokenized example, its padding dropped (the positions its attention mask leaves out), or
    None when the example is not one sequence of token ids."""
    if not isinstance(example, Mapping) or "input_ids" not in example:
        return None
    ids, mask = example["input_ids"], example.get("attention_mask")
    if isinstance(ids, torch.Tensor):
        if ids.dim() != 1 or ids.is_floating_point() or ids.dtype == torch.bool:
            return None
        ids = ids.tolist()
    if not isinstance(ids, (list, tuple)) or not all(isinstance(t, int) and not isinstance(t, bool) for t in ids):
        return None
    mask = mask.tolist() if isinstance(mask, torch.Tensor) and mask.dim() == 1 else mask
    if isinstance(mask, (list, tuple)) and len(mask) == len(ids):
        ids = [t for t, m in zip(ids, mask) if m]
    return tuple(ids)


def prefix_matches(train_rows: list[Any], eval_rows: list[Any], skip: set[int]) -> dict[int, int]:
    """{eval index: training index} for the eval examples (but ``skip``) whose tokens, padding dropped, are the
    start of (or the whole of) a training example's tokens: the same example tokenized without its completion (an
    eval split of the training prompts for generation, the training rows carrying the answer and its EOS), or padded
    to another length. Sorted token tuples: the training sequences a given sequence begins come right after it."""
    train = sorted((t, i) for i, r in enumerate(train_rows) if (t := tokens(r)))
    keys = [t for t, _ in train]
    out: dict[int, int] = {}
    for j, row in enumerate(eval_rows):
        t = tokens(row) if j not in skip else None
        if not t:
            continue
        k = bisect.bisect_left(keys, t)
        if k < len(keys) and keys[k][: len(t)] == t:
            out[j] = train[k][1]
    return out


def fingerprint(example: Any) -> str:
    return hashlib.blake2b(_bytes(content(example)), digest_size=16).hexdigest()


def _examples(dataset: Any, limit: int) -> tuple[list[Any] | None, bool]:
    """Up to ``limit`` examples (columns read in one go for a datasets.Dataset); (examples, truncated). None for data
    that is not read by index (:func:`indexable`)."""
    if not indexable(dataset):
        return None, False
    n = len(dataset)
    take = min(n, limit)
    if hasattr(dataset, "column_names") and hasattr(dataset, "select"):
        part = dataset.select(range(take)) if take < n else dataset
        if hasattr(part, "with_format"):
            # the stored columns, without a with_transform / set_transform function: that function runs on whole
            # rows (a column read alone hands it a batch without the others: KeyError 'image'), and the content of
            # an example is what is stored, not one random augmentation of it
            part = part.with_format(None)
        cols = [c for c in part.column_names if c not in NOT_CONTENT]
        # a packed dataset's document boundaries travel with its ids (TRL's pack_dataset: seq_lengths), and a padded
        # one's padding with its attention_mask (the pads after a caption's EOS are no documents)
        bounds = [c for c in ("seq_lengths", "position_ids", "attention_mask") if c in part.column_names]
        key = ["input_ids", *bounds] if "input_ids" in cols else cols
        data = {c: part[c] for c in key}
        return [{c: data[c][i] for c in key} for i in range(take)], take < n
    return [dataset[i] for i in range(take)], take < n


def _sized(data: Any) -> bool:
    """Read by index: a length and a ``__getitem__`` of its own (an IterableDataset that defines ``__len__`` is
    iterated, never indexed)."""
    return indexable(data)


@dataclass
class Split:
    """Where one split's examples come from: a dataset with a length (read by index), or what can only be
    iterated (an IterableDataset, a loader without ``.dataset``, a generator-backed loader)."""

    dataset: Any  # a dataset with a length and __getitem__, or MISSING
    dataset_name: str
    iterable: Any  # an iterable dataset, or MISSING
    iterable_name: str
    loader: Any  # the dataloader, or MISSING
    loader_name: str

    @property
    def given(self) -> bool:
        return any(v is not MISSING for v in (self.dataset, self.iterable, self.loader))


def _split(dlcheck, split: str) -> Split:
    ds_role, dl_role = ("dataset", "dataloader") if split == "train" else ("eval_dataset", "eval_dataloader")
    ds, dl = dlcheck.role(ds_role), dlcheck.role(dl_role)
    dataset, dataset_name, iterable, iterable_name = MISSING, "", MISSING, ""
    subset = _sampler_subset(dl)
    if subset is not None and (ds is MISSING or ds is getattr(dl, "dataset", None)):
        # a loader that draws a subset of its dataset (K-fold's SubsetRandomSampler over the whole dataset): the split
        # is what its sampler selects, not the dataset it indexes (T8 had compared the whole dataset with itself)
        indices = subset
        return Split(
            torch.utils.data.Subset(dl.dataset, indices),
            f"dlcheck_{dl_role}.dataset at the {len(indices)} indices its {type(_inner_sampler(dl)).__name__} draws",
            MISSING,
            "",
            dl,
            f"dlcheck_{dl_role}",
        )
    for candidate, name in ((ds, f"dlcheck_{ds_role}"), (getattr(dl, "dataset", None), f"dlcheck_{dl_role}.dataset")):
        if candidate is None or candidate is MISSING:
            continue
        if _sized(candidate):
            dataset, dataset_name = candidate, name
            break
        if iterable is MISSING:
            iterable, iterable_name = candidate, name
    return Split(dataset, dataset_name, iterable, iterable_name, dl, f"dlcheck_{dl_role}")


def _inner_sampler(loader: Any) -> Any:
    batch_sampler = getattr(loader, "batch_sampler", None)
    inner = getattr(batch_sampler, "sampler", None)  # tested against None: bool() calls an unsized sampler's len()
    return getattr(loader, "sampler", None) if inner is None else inner


def _sampler_subset(loader: Any) -> list[int] | None:
    """The dataset indices a loader's sampler is restricted to (SubsetRandomSampler and any sampler holding a
    sequence of integer ``indices``), or None: the loader reads its whole dataset."""
    if loader is MISSING or loader is None or not hasattr(loader, "dataset"):
        return None
    indices = getattr(_inner_sampler(loader), "indices", None)
    if indices is None or isinstance(indices, (str, bytes)):
        return None
    try:
        out = [int(i) for i in indices]
    except (TypeError, ValueError):
        return None
    try:
        n = len(loader.dataset)
    except TypeError:
        return None
    return out if out and len(out) < n and all(0 <= i < n for i in out) else None


def _shape(value: Any) -> tuple[int, ...] | None:
    """The shape of an example's content when it is one tensor or array, else None."""
    if isinstance(value, torch.Tensor) or (hasattr(value, "shape") and hasattr(value, "dtype")):
        return tuple(int(d) for d in value.shape)
    return None


def _incomparable(train_rows: list[Any], eval_rows: list[Any]) -> tuple[str, str] | None:
    """(the training units, the eval units) in words when both splits are fixed-shape tensors of different shapes
    (each split one shape, but for a shorter last unit, the tail of a stream): no eval example can equal a
    training one. None when they can (same shapes, or contents of varying shape: token sequences)."""

    def fixed(rows: list[Any]) -> tuple[tuple[int, ...], int] | None:
        shapes = [_shape(content(r)) for r in rows]
        if len(rows) < 2 or any(s is None or not s for s in shapes):
            return None
        common, n = Counter(shapes).most_common(1)[0]
        return (common, len(rows), n) if n >= len(rows) - 1 else None

    a, b = fixed(train_rows), fixed(eval_rows)
    if a is None or b is None or a[0] == b[0]:
        return None
    word = lambda shape, n, k: f"{n} tensors of shape {shape}" + (" (one other: a shorter tail)" if k < n else "")  # noqa: E731
    return word(*a), word(*b)


def _natural_overlap(
    train_rows: list[Any], n_eval: int, counts: Callable[[Any], bool] = lambda _row: True
) -> tuple[float, int] | None:
    """(share of a held-out part of the training rows whose inputs appear in the rest, its size): how much
    two disjoint samples of this data overlap by nature, counting only the rows ``counts`` accepts. None with
    too few rows to hold a part out."""
    if len(train_rows) < 8:
        return None
    size = max(1, min(n_eval, len(train_rows) // 2))
    step = len(train_rows) / size
    held = {int(i * step) for i in range(size)}
    rest = {fingerprint(r) for i, r in enumerate(train_rows) if i not in held}
    hits = sum(fingerprint(train_rows[i]) in rest and counts(train_rows[i]) for i in held)
    return hits / len(held), len(held)


def _natural_bound(natural: float, n_eval: int) -> float:
    """The largest eval overlap a properly held-out split of data that repeats at rate ``natural`` shows:
    three binomial standard deviations above it (and one example)."""
    return natural + 3 * math.sqrt(natural * (1 - natural) / n_eval) + 1 / n_eval


def _examples_readable(side: Split) -> bool:
    """Whether a split's examples can be read from its dataset: one read by index, or an iterable dataset that starts
    over when iterated and yields examples (its loader batches them: a loader with ``batch_size=None`` takes batches
    the dataset makes itself)."""
    if side.dataset is not MISSING:
        return True
    if side.iterable is MISSING or _one_shot(side.iterable):
        return False
    return side.loader is MISSING or getattr(side.loader, "batch_size", None) is not None


def _one_shot(obj: Any) -> bool:
    """An iterator (a generator object): reading it consumes the user's data."""
    return hasattr(obj, "__next__") and iter(obj) is obj


def unbatch(batch: Any) -> list[Any]:
    """The examples of a collated batch: one mapping / (inputs, targets) / tensor per row; token ids with an
    attention mask keep only their attended positions (padding depends on the batch)."""
    n = batch_len(batch)
    if n is None:
        return [batch]
    if isinstance(batch, torch.Tensor):
        return list(batch)
    if isinstance(batch, Mapping):
        rows = []
        mask = batch.get("attention_mask")
        for i in range(n):
            row = {
                k: v[i]
                for k, v in batch.items()
                if (isinstance(v, torch.Tensor) and v.dim() > 0 and v.shape[0] == n)
                or (isinstance(v, (list, tuple)) and len(v) == n)
            }
            ids = row.get("input_ids")
            if (
                isinstance(ids, torch.Tensor)
                and isinstance(mask, torch.Tensor)
                and mask.shape == batch["input_ids"].shape
            ):
                row["input_ids"] = ids[mask[i].bool()]
            rows.append(row)
        return rows
    if isinstance(batch, (list, tuple)):
        if batch and isinstance(batch[0], torch.Tensor):
            return [
                tuple(v[i] if isinstance(v, torch.Tensor) and v.dim() > 0 and v.shape[0] == n else v for v in batch)
                for i in range(n)
            ]
        return list(batch)  # collate_fn=lambda rows: rows: the examples themselves
    return [batch]


def _iterated(data: Any, limit: int, batched: bool) -> tuple[list[Any], bool]:
    """Up to ``limit`` examples from one pass over an iterable dataset, or over a loader's batches split into
    examples; (examples, truncated). The loader's generators, epoch counters and the global RNGs are put back."""
    out: list[Any] = []
    with preserved_rng(), preserved_dataloader(data) if batched else contextlib.nullcontext():
        for item in data:
            item = kept(item)  # a loader may refill and yield the same buffers: keep copies, not references
            out.extend(unbatch(item) if batched else [item])
            if len(out) > limit:
                return out[:limit], True
    return out, False


@check(
    "T8",
    domain="train",
    title="the same examples in the training and the eval data",
    roles=(),
    optional_roles=("dataset", "eval_dataset", "dataloader", "eval_dataloader", "trainer", "tokenizer"),
    settings=(
        Setting(
            "max_shared_share",
            0.0,
            "share of eval examples allowed to also be in the training data; 0, because "
            "every shared example inflates the eval metric (deduplicate natural duplicates, or raise it)",
        ),
        Setting(
            "unique_bits",
            128.0,
            "an eval example whose content carries at least this many bits (the sum of its tokens', values' or "
            "characters' surprisal under the training data's own frequencies) is unique by chance, so its exact "
            "copy in the training data is a leak even when the training data repeats itself. The sum ignores "
            "context, so it overstates natural text's information about fourfold; the 32 bits that leaves make a "
            "chance repeat among 50,000 examples a 1-in-65,000 event. Shorter inputs (a character model's 3-token "
            "contexts carry ~10 bits) are judged against the rate at which the training data repeats them",
        ),
        Setting("max_examples", 50000, "examples hashed per split (the first ones); bounds the cost on large datasets"),
        Setting(
            "max_drawn",
            2048,
            "examples drawn per split from data without a length (an IterableDataset, a loader without "
            ".dataset); drawing runs the loader's whole pipeline, so fewer than max_examples",
        ),
    ),
)
def check_train_eval_leakage(dlcheck):
    """No example of the eval data also appears in the training data.

    What it does
        Hashes the content of every example (up to ``max_examples``) of the training and the eval data —
        the token ids of a tokenized example, the inputs of an ``(inputs, target)`` pair, every non-target
        field of a record — and fails when eval examples are found in the training data, showing them.
        Packed rows are compared by their documents: a row is split at its boundaries (TRL's
        ``seq_lengths``, ``position_ids`` restarting at 0, else the tokenizer's EOS closing each document,
        unless its chat template ends turns with it); a row laid out as the tokenizer's own pair template
        (``tokenizer(text, text_pair)``: RoBERTa's ``<s>A</s></s>B</s>``) is one example, a text pair, not
        documents. Token sequences (padding dropped) are also matched as the start of a training example's
        tokens: an eval row that is a training row's prompt without the completion and EOS the training row
        carries (a generation eval over the training prompts) is the same example; such a match counts only when
        the eval tokens carry ``unique_bits`` (a short text may begin another by chance). Batches drawn from a
        loader are copied as they come (a loader that refills and yields the same buffers would otherwise leave
        every kept example holding the last batch). When both splits are tensors of one fixed shape each and the shapes differ (a token stream
        batchified at two widths: (35, 20) training chunks, (35, 10) eval chunks), no eval example can equal a
        training one: the check says it is not judged (skipped) rather than passing on a count that is 0
        whatever the data. An eval example long enough to be unique by chance
        (``unique_bits``) is a leak wherever its copy is, even when the training data repeats itself;
        shorter inputs (a character model's contexts) are excused up to the rate at which two disjoint
        parts of the training data share them (three binomial standard deviations above it).
    Why it is bad
        An eval example the model was trained on measures memorisation, not generalisation: the eval loss
        and metrics look better than the model is, early stopping and model selection pick the wrong
        checkpoint, and the gap only shows in production. Typical causes: the eval split taken from the
        training data (``train.select(range(100))``), a split made before deduplication, augmented copies
        split apart.
    Example
        eval_dataset = train_dataset.select(range(4))
    Use instead
        split once, after deduplication: ``dataset.train_test_split(test_size=0.1, seed=0)`` on unique
        examples, or a held-out file.
    Known problems
        Exact duplicates and token prefixes only (after the dataset's own transforms: random augmentations hide
        duplicates; an eval row that carries more than its training row, or the same text tokenized another way,
        is not matched).
        Reads at most ``max_examples`` per split. Data that cannot be indexed (an IterableDataset, also one that
        defines ``__len__`` as torchtext's datapipes do; a loader without ``.dataset``) is read by iterating it once,
        at most ``max_drawn`` examples per split: an IterableDataset's items are its examples, whatever layout the
        loader's collate gives the batches (sequence first). When a split has only a loader to draw from and both
        have dataloaders, both splits are drawn from their loaders, so that both are compared as the same collator
        makes them (padding dropped; a batch is split into examples along its first dimension). A one-shot
        iterator (a generator object) is never read: it would consume your data. Rows packed without
        ``seq_lengths`` / ``position_ids`` are split at EOS only with dlcheck_tokenizer (or a Trainer's);
        the documents cut at a row's edges are compared as the fragments they are.
    Not applicable
        None: any pipeline with eval data can leak it into training.
    """
    train, ev = _split(dlcheck, "train"), _split(dlcheck, "eval")
    lacking = [
        hint
        for side, hint in (
            (train, "dlcheck_dataset or dlcheck_dataloader"),
            (ev, "dlcheck_eval_dataset or dlcheck_eval_dataloader (or a Trainer with an eval_dataset)"),
        )
        if not side.given
    ]
    if lacking:
        dlcheck.skip(f"missing role: define fixture {'; '.join(lacking)} in conftest.py")
    for a, b, a_name, b_name in (
        (train.dataset, ev.dataset, train.dataset_name, ev.dataset_name),
        (train.iterable, ev.iterable, train.iterable_name, ev.iterable_name),
        (train.loader, ev.loader, train.loader_name, ev.loader_name),
    ):
        if a is not MISSING and a is b:
            dlcheck.fail(
                [f"{b_name} is the very object of {a_name}"],
                "the model is evaluated on its training data",
                "hold out an eval split: dataset.train_test_split(test_size=0.1, seed=0)",
            )
    both_loaders = train.loader is not MISSING and ev.loader is not MISSING
    limit, drawn = dlcheck.setting("max_examples"), dlcheck.setting("max_drawn")

    def read(side: Split, from_loader: bool) -> tuple[list[Any], bool, str]:
        if not from_loader and side.dataset is not MISSING:
            rows, cut = dlcheck.memo(side.dataset, f"t8:rows:{limit}", lambda: _examples(side.dataset, limit))
            return rows, cut, side.dataset_name
        if not from_loader and side.iterable is not MISSING:
            source, name, batched = side.iterable, side.iterable_name, False
        else:
            source, name, batched = side.loader, side.loader_name, True
        if _one_shot(source):
            dlcheck.skip(
                f"{name} is a one-shot iterator ({type(source).__name__}): reading it would consume your data; "
                "return a re-iterable loader (a DataLoader, or an object whose __iter__ starts over) to compare "
                "the splits"
            )
        rows, cut = dlcheck.memo(source, f"t8:drawn:{drawn}:{batched}", lambda: _iterated(source, drawn, batched))
        how = "batches split into examples, padding dropped" if batched else "iterated once"
        return rows, cut, f"{name} ({len(rows)} examples drawn: {how})"

    # both splits read as their examples (a dataset by index, an IterableDataset by iterating it: its items are the
    # examples, whatever layout a collate gives the batches, sequence first included); else, with loaders on both
    # sides, both drawn from their loaders, as the same kind of collator makes them
    from_loaders = both_loaders and not (_examples_readable(train) and _examples_readable(ev))
    train_rows, train_cut, train_src = read(train, from_loaders)
    eval_rows, eval_cut, eval_src = read(ev, from_loaders)
    # packed rows are compared by the documents they hold; a sentence pair is one example, not two documents
    eos = eos_boundary(dlcheck.role("tokenizer"))
    pair = pair_template(dlcheck.role("tokenizer"), eos)
    sample = eval_rows[:64] + train_rows[:64]
    packed = any(len(documents(r, eos, pair)) > 1 for r in sample)
    if packed:
        train_rows = [d for r in train_rows for d in documents(r, eos, pair)]
        eval_rows = [d for r in eval_rows for d in documents(r, eos, pair)]
        train_src += ", unpacked into its documents"
        eval_src += ", unpacked into its documents"
    elif pair is not None and any(len(documents(r, eos)) > 1 for r in sample):
        # the EOS inside a pair row separate its two texts: one example, not packed documents
        train_src += ", text pairs"
        eval_src += ", text pairs as your tokenizer's pair template joins them: one example each, not packed documents"
    if not eval_rows:
        dlcheck.skip(f"{eval_src} holds no example")
    apart = _incomparable(train_rows, eval_rows)
    if apart is not None:
        # fixed-shape units of different shapes (a token stream batchified at two widths): no eval example can
        # equal a training one, so a count of shared examples would be 0 whatever the data: not judged
        dlcheck.skip(
            f"not judged: the training examples ({train_src}) are {apart[0]} and the eval examples ({eval_src}) "
            f"{apart[1]}: units of different shapes, so no eval example can equal a training one by content and a "
            "count of shared examples would be 0 even if the eval data were the training data (contiguous chunks "
            "of one token stream batchified at two widths, e.g. batchify(train, 20) and batchify(valid, 10)); give "
            "dlcheck_dataset / dlcheck_eval_dataset of the examples themselves (token sequences, or the two "
            "streams' chunks of one width) to compare them"
        )
    seen: dict[str, int] = {}
    for i, row in enumerate(train_rows):
        seen.setdefault(fingerprint(row), i)
    shared = [(j, seen[h]) for j, row in enumerate(eval_rows) if (h := fingerprint(row)) in seen]
    allowed = dlcheck.setting("max_shared_share")
    # an example long enough to be unique by chance is a copy wherever it recurs: the training data's own repeats
    # (a dataset that holds some conversations twice) excuse only the inputs that can recur by chance
    unique_bits = dlcheck.setting("unique_bits")
    starts = prefix_matches(train_rows, eval_rows, {j for j, _ in shared})
    surprisal = Surprisal(train_rows) if shared or starts else None
    bits = {j: surprisal.bits(eval_rows[j]) for j, _ in shared} if surprisal else {}
    # the start of a training example's tokens (its prompt without the completion): a copy only when long enough to
    # be unique by chance (a short eval text that begins some training text is no evidence)
    prefixed = []
    for j, i in starts.items():
        b = surprisal.bits({"input_ids": list(tokens(eval_rows[j]))})
        if b >= unique_bits:
            prefixed.append((j, i))
            bits[j] = b
    shared = sorted(shared + prefixed)
    share = len(shared) / len(eval_rows)
    copies = [(j, i) for j, i in shared if bits[j] >= unique_bits]
    by_chance = len(shared) - len(copies)
    natural = None
    if len(copies) / len(eval_rows) <= allowed and share > allowed:
        natural = _natural_overlap(train_rows, len(eval_rows), lambda row: surprisal.bits(row) < unique_bits)
    if (
        natural is not None
        and natural[0] > 0
        and by_chance / len(eval_rows) <= _natural_bound(natural[0], len(eval_rows))
    ):
        # inputs that repeat inside the training data itself (a character model's 3-token contexts, short
        # labels): an eval split held out properly shares them at the same rate
        dlcheck.measured(
            f"{len(shared)} of {len(eval_rows)} eval examples ({share:.0%}, {eval_src}) share their inputs with the "
            f"{len(train_rows)} training examples ({train_src}), no more than two disjoint parts of the training data "
            f"share with each other ({natural[0]:.0%} of {natural[1]} held-out training examples): these inputs "
            f"repeat by nature, not by a leaked split; each carries under {unique_bits:g} bits (the sum of its "
            "symbols' surprisal under the training data's frequencies), short enough to recur by chance",
            eval_examples=len(eval_rows),
            train_examples=len(train_rows),
            shared=len(shared),
            natural_share=round(natural[0], 4),
        )
        return
    if share <= dlcheck.setting("max_shared_share"):
        cut = " (the first examples only)" if train_cut or eval_cut else ""
        dlcheck.measured(
            f"{len(shared)} of {len(eval_rows)} eval examples ({eval_src}) are among the {len(train_rows)} training "
            f"examples ({train_src}){cut}, by the content of their inputs (targets ignored); "
            f"{dlcheck.setting('max_shared_share'):.0%} allowed",
            *(
                [
                    f"token sequences also matched as the start of a training example's tokens (padding dropped: a "
                    f"prompt without the completion its training row carries): {len(prefixed)} of ≥ {unique_bits:g} "
                    f"bits, {len(starts) - len(prefixed)} shorter ones not counted (a short text may begin another)"
                ]
                if any(tokens(r) for r in eval_rows[:8])
                else []
            ),
            eval_examples=len(eval_rows),
            train_examples=len(train_rows),
            shared=len(shared),
        )
        return
    j, i = shared[0]
    tok = dlcheck.role("tokenizer")
    shown = content(eval_rows[j])
    if tok is not MISSING and isinstance(shown, (list, torch.Tensor)):
        try:
            text = tok.decode(list(shown) if isinstance(shown, list) else shown.tolist())
            shown = repr(text[:120])
        except Exception:  # noqa: BLE001 - a processor without decode: show the ids' shape
            shown = describe_batch(shown)
    elif isinstance(shown, torch.Tensor) and shown.is_floating_point():
        values = ", ".join(f"{v:.4g}" for v in shown.flatten()[:6].tolist())
        shown = f"{describe_batch(shown)} [{values}{', …' if shown.numel() > 6 else ''}]"
    else:
        shown = describe_batch(shown) if isinstance(shown, (torch.Tensor, Mapping)) else repr(shown)[:120]
    cut = " (first examples only: raise T8.max_examples / T8.max_drawn to read more)" if train_cut or eval_cut else ""
    pairs = ", ".join(f"eval #{a} = train #{b}" for a, b in shared[:5])
    evidence = [
        f"{len(shared)} of {len(eval_rows)} eval examples ({len(shared) / len(eval_rows):.0%}) are also in the "
        f"{len(train_rows)} training examples, by content{cut}: {pairs}",
        f"eval #{j} ({eval_src}): {shown}",
    ]
    if prefixed:
        a, b = prefixed[0]
        evidence.append(
            f"{len(prefixed)} of them are not identical to a training example but are its start: their tokens "
            f"(padding dropped) begin a training example's tokens, each ≥ {unique_bits:g} bits (eval #{a} = the start "
            f"of train #{b}): the same examples tokenized without the completion the training rows carry (or padded "
            "to another length)"
        )
    prints = Counter(fingerprint(r) for r in train_rows) if copies else Counter()
    repeated = sum(n for n in prints.values() if n > 1)
    repeating = repeated > 0
    if copies:
        c = copies[0][0]
        evidence.append(
            f"{len(copies)} of them are long enough to be unique by chance (≥ {unique_bits:g} bits each, the sum of "
            f"their symbols' surprisal under the training data's own frequencies; eval #{c}: {bits[c]:.0f} bits): "
            "exact copies"
            + (" (or starts of one)" if prefixed else "")
            + ", not inputs that recur by nature"
            + (
                f"; the training data repeats itself too ({repeated} of its {len(train_rows)} examples occur more than "
                "once), which does not excuse copies"
                if repeating
                else ""
            )
        )
    elif natural is not None:
        evidence.append(
            f"two disjoint parts of the training data share only {natural[0]:.0%} of their inputs ({natural[1]} "
            "held-out training examples against the rest): the eval split shares far more than a held-out part would"
        )
    cause = "the eval split overlaps the training data: those examples measure memorisation, and the eval metric is inflated"
    fix = (
        "split once on deduplicated data (dataset.train_test_split(test_size=..., seed=...)) or hold out a separate "
        "file; drop eval examples whose content is in the training set"
        + ("; deduplicate the training data itself before splitting" if repeating else "")
    )
    dlcheck.fail(evidence, cause, fix)
