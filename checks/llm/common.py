"""What the llm checks share: the sampled training batches as token rows, with the tokenizer."""

from __future__ import annotations

from typing import Any

from ...errors import MISSING
from ...sampling import Sample, get_sample
from ..shared import lm


def token_sample(ctx: Any, split: str = "train") -> Sample:
    """The shared sample; skips unless its batches carry input_ids (a GRPO prompt loader does not)."""
    sample = get_sample(ctx, split)
    if not lm.has_token_batches(sample.batches):
        keys = sorted(sample.batches[0]) if sample.batches else []
        ctx.skip(f"batches from {sample.source} carry no input_ids (keys: {', '.join(map(str, keys)) or 'none'})")
    attach_tokens(ctx, sample)
    return sample


def attach_tokens(ctx: Any, sample: Sample, max_rows: int = 8, max_tokens: int = 128) -> None:
    """The report's picture of the batch: each token with its label and attention state."""
    tok = ctx.role("tokenizer")
    view = []
    for row in lm.rows(sample.batches)[:max_rows]:
        n = min(len(row.input_ids), max_tokens)
        view.append(
            {
                "name": f"{row.batch}.{row.index}",
                "input_ids": row.input_ids[:n],
                "tokens": [lm.token_piece(tok if tok else None, i) for i in row.input_ids[:n]],
                "labels": row.labels[:n] if row.labels is not None else None,
                "attention_mask": row.attention_mask[:n] if row.attention_mask is not None else None,
                "doc_starts": [s for s, _ in row.documents() if s < n],
            }
        )
    ctx.attach("tokens", rows=view, caption=sample.source)


def labelled_rows(ctx: Any, sample: Sample) -> list[lm.Row]:
    rows = lm.rows(sample.batches)
    if all(r.labels is None for r in rows):
        ctx.skip(f"batches from {sample.source} carry no labels (the model derives them itself)")
    return rows


def locate(sample: Sample, rows: list[lm.Row]) -> dict[int, tuple[lm.Row, int, int]]:
    """Example index -> (row, start, end) of its tokens in the collated batches: a row per example, or
    one document of a packed row when the batch packs exactly its examples."""
    if sample.batch_rows is None:
        return {}
    by_batch: dict[int, list[lm.Row]] = {}
    for r in rows:
        by_batch.setdefault(r.batch, []).append(r)
    out = {}
    for b, group in enumerate(sample.batch_rows):
        brows = by_batch.get(b, [])
        if len(brows) == len(group):
            for j, i in enumerate(group):
                out[i] = (brows[j], 0, len(brows[j].input_ids))
        elif len(brows) == 1 and len(brows[0].documents()) == len(group):
            for j, (s, e) in enumerate(brows[0].documents()):
                out[group[j]] = (brows[0], s, e)
    return out


#: TRL trainers that generate from batches of prompts during training (they left-pad the prompts themselves)
ONLINE_TRAINERS = ("GRPOTrainer", "RLOOTrainer")


def online_trainer(trainer: Any) -> str | None:
    """The class name of a TRL online (generating) trainer, else None."""
    if trainer is MISSING or trainer is None:
        return None
    for cls in type(trainer).__mro__:
        if cls.__module__.startswith("trl.") and cls.__name__ in ONLINE_TRAINERS:
            return type(trainer).__name__
    return None
