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
    return sample


def labelled_rows(ctx: Any, sample: Sample) -> list[lm.Row]:
    rows = lm.rows(sample.batches)
    if all(r.labels is None for r in rows):
        ctx.skip(f"batches from {sample.source} carry no labels (the model derives them itself)")
    return rows
