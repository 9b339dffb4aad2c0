"""What the llm checks share: the sampled training batches as token rows, with the tokenizer."""

from __future__ import annotations

from typing import Any

from ... import lm
from ...sampling import Sample, get_sample


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
        view.append({
            "name": f"{row.batch}.{row.index}",
            "input_ids": row.input_ids[:n],
            "tokens": [lm.token_piece(tok if tok else None, i) for i in row.input_ids[:n]],
            "labels": row.labels[:n] if row.labels is not None else None,
            "attention_mask": row.attention_mask[:n] if row.attention_mask is not None else None,
            "doc_starts": [s for s, _ in row.documents() if s < n],
        })
    ctx.attach("tokens", rows=view, caption=sample.source)


def labelled_rows(ctx: Any, sample: Sample) -> list[lm.Row]:
    rows = lm.rows(sample.batches)
    if all(r.labels is None for r in rows):
        ctx.skip(f"batches from {sample.source} carry no labels (the model derives them itself)")
    return rows
