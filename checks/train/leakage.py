from __future__ import annotations

import hashlib
from collections.abc import Mapping
from typing import Any

import torch

from ...errors import MISSING
from ...registry import Setting, check
from ...training import describe_batch

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
    if isinstance(value, torch.Tensor):
        return value.detach().cpu().contiguous().numpy().tobytes() + str(value.dtype).encode()
    if hasattr(value, "tobytes"):
        return value.tobytes()
    if isinstance(value, (list, tuple)):
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


def fingerprint(example: Any) -> str:
    return hashlib.blake2b(_bytes(content(example)), digest_size=16).hexdigest()


def _examples(dataset: Any, limit: int) -> tuple[list[Any] | None, bool]:
    """Up to ``limit`` examples (columns read in one go for a datasets.Dataset); (examples, truncated)."""
    try:
        n = len(dataset)
    except TypeError:
        return None, False
    take = min(n, limit)
    if hasattr(dataset, "column_names") and hasattr(dataset, "select"):
        part = dataset.select(range(take)) if take < n else dataset
        cols = [c for c in part.column_names if c not in NOT_CONTENT]
        key = ["input_ids"] if "input_ids" in cols else cols
        data = {c: part[c] for c in key}
        return [{c: data[c][i] for c in key} for i in range(take)], take < n
    return [dataset[i] for i in range(take)], take < n


def _source(dlcheck, split: str) -> tuple[Any, str]:
    ds_role, dl_role = ("dataset", "dataloader") if split == "train" else ("eval_dataset", "eval_dataloader")
    ds = dlcheck.role(ds_role)
    if ds is not MISSING:
        return ds, f"dlcheck_{ds_role}"
    dl = dlcheck.role(dl_role)
    if dl is not MISSING and getattr(dl, "dataset", None) is not None:
        return dl.dataset, f"dlcheck_{dl_role}.dataset"
    return MISSING, ""


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
        Setting("max_examples", 50000, "examples hashed per split (the first ones); bounds the cost on large datasets"),
    ),
)
def check_train_eval_leakage(dlcheck):
    """No example of the eval data also appears in the training data.

    What it does
        Hashes the content of every example (up to ``max_examples``) of the training and the eval data —
        the token ids of a tokenized example, the inputs of an ``(inputs, target)`` pair, every non-target
        field of a record — and fails when eval examples are found in the training data, showing them.
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
        Exact duplicates only (after the dataset's own transforms: random augmentations hide duplicates).
        Reads at most ``max_examples`` per split.
    """
    train, train_src = _source(dlcheck, "train")
    ev, eval_src = _source(dlcheck, "eval")
    if train is MISSING or ev is MISSING:
        dlcheck.skip(
            "missing role: define fixtures dlcheck_dataset and dlcheck_eval_dataset (or the dataloaders, or a "
            "Trainer with an eval_dataset) in conftest.py"
        )
    if train is ev:
        dlcheck.fail(
            [f"{eval_src} is the very object of {train_src}"],
            "the model is evaluated on its training data",
            "hold out an eval split: dataset.train_test_split(test_size=0.1, seed=0)",
        )
    limit = dlcheck.setting("max_examples")
    train_rows, train_cut = dlcheck.memo(train, f"t8:rows:{limit}", lambda: _examples(train, limit))
    eval_rows, eval_cut = dlcheck.memo(ev, f"t8:rows:{limit}", lambda: _examples(ev, limit))
    if train_rows is None or eval_rows is None:
        dlcheck.skip("the data is iterable without a length: cannot be hashed in bounded time")
    seen: dict[str, int] = {}
    for i, row in enumerate(train_rows):
        seen.setdefault(fingerprint(row), i)
    shared = [(j, seen[h]) for j, row in enumerate(eval_rows) if (h := fingerprint(row)) in seen]
    if not eval_rows or len(shared) / len(eval_rows) <= dlcheck.setting("max_shared_share"):
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
    cut = " (first examples only: raise T8.max_examples to read more)" if train_cut or eval_cut else ""
    pairs = ", ".join(f"eval #{a} = train #{b}" for a, b in shared[:5])
    evidence = [
        f"{len(shared)} of {len(eval_rows)} eval examples ({len(shared) / len(eval_rows):.0%}) are also in the "
        f"{len(train_rows)} training examples, by content{cut}: {pairs}",
        f"eval #{j} ({eval_src}): {shown}",
    ]
    cause = "the eval split overlaps the training data: those examples measure memorisation, and the eval metric is inflated"
    fix = (
        "split once on deduplicated data (dataset.train_test_split(test_size=..., seed=...)) or hold out a separate "
        "file; drop eval examples whose content is in the training set"
    )
    dlcheck.fail(evidence, cause, fix)
