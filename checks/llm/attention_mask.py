from __future__ import annotations

from collections import Counter
from collections.abc import Mapping, Sequence
from typing import Any

from ...registry import check
from ..shared import lm
from .common import locate, token_sample


def example_ids(example: Any) -> list[int] | None:
    """The token ids of a pre-tokenized example (its true length is then known), or None: not a mapping
    with input_ids, or already padded (its own mask has zeros, so its length is not known)."""
    if not isinstance(example, Mapping) and not hasattr(example, "keys"):
        return None
    try:
        ids = example["input_ids"]
    except (KeyError, TypeError):
        return None
    mask = example.get("attention_mask") if hasattr(example, "get") else None
    ids, mask = _flat(ids), _flat(mask) if mask is not None else None
    if ids is None or (mask is not None and (len(mask) != len(ids) or not all(mask))):
        return None
    return ids


def _flat(value: Any) -> list[int] | None:
    if hasattr(value, "tolist"):
        value = value.tolist()
    if isinstance(value, (list, tuple)) and len(value) == 1 and isinstance(value[0], (list, tuple)):
        value = value[0]
    if not isinstance(value, (list, tuple)) or not all(isinstance(i, (int, bool)) for i in value):
        return None
    return [int(i) for i in value]


def expected_mask(ids: Sequence[int], mask: Sequence[int], example: Sequence[int]) -> list[int] | None:
    """The mask a row must have, knowing the example it was collated from: ones exactly where the
    example's tokens sit (right or left of the padding; a collator's truncation is allowed). None when
    the example's tokens are not found in the row (the collator rewrote them)."""
    n, width = len(example), len(ids)
    if n > width:  # the collator truncated: the row is all content
        ok = list(ids) == list(example[:width]) or list(ids) == list(example[n - width :])
        return [1] * width if ok else None
    candidates = []
    for start in {0, width - n}:
        if list(ids[start : start + n]) == list(example):
            candidates.append([1 if start <= p < start + n else 0 for p in range(width)])
    if not candidates:
        return None
    return min(candidates, key=lambda exp: sum(a != bool(b) for a, b in zip(exp, mask)))


def added_by_collator(ids: Sequence[int], expected: Sequence[int], p: int, specials: set[int | None]) -> bool:
    """An EOS/BOS right after (or before) the example's tokens is one the collator added: content, even
    when pad == eos. (Tokens other than the pad ids are never padding at all.)"""
    ones = [i for i, a in enumerate(expected) if a]
    return bool(ones) and p in (ones[0] - 1, ones[-1] + 1) and ids[p] in specials


def structural(
    ids: Sequence[int], mask: Sequence[int], fill: set[int], min_extra: int = 1
) -> tuple[list[int], list[int]]:
    """(real positions masked, padding positions unmasked) of a row whose true length is unknown:
    zeros must form one run at an end of the row, on fill (pad) ids only; a run of fill ids at an end
    with mask 1 beyond its first token (the first may be a real EOS when pad == eos) is unmasked
    padding, once at least ``min_extra`` such positions are seen (2 when the pad id is also the EOS/BOS,
    so that a text ending in a doubled EOS is not mistaken for padding)."""
    width = len(ids)
    ones = [p for p, m in enumerate(mask) if m]
    if not ones:
        return [], []
    first, last = ones[0], ones[-1]
    masked = [p for p in range(first, last + 1) if not mask[p]]
    if fill:
        masked += [p for p in list(range(first)) + list(range(last + 1, width)) if ids[p] not in fill]
    unmasked: list[int] = []
    if fill:
        end = width
        while end > 0 and ids[end - 1] in fill:
            end -= 1
        right = [p for p in range(end + 1, width) if mask[p]]
        unmasked += right if len(right) >= min_extra else []
        start = 0
        while start < width and ids[start] in fill:
            start += 1
        if start < width:  # a row made only of fill ids is judged from the right
            left = [p for p in range(0, start - 1) if mask[p]]
            unmasked += left if len(left) >= min_extra else []
    return sorted(set(masked)), sorted(set(unmasked))


def fill_ids(rows: Sequence[lm.Row], pad: int | None) -> tuple[set[int], int | None]:
    """The ids the collator pads with: the tokenizer's pad id, plus the one id found at every masked
    position outside the content when that is not the pad id (a collator padding with 0, say). Also
    returns that inferred id (or None)."""
    at_edges: Counter = Counter()
    for row in rows:
        if row.attention_mask is None:
            continue
        ones = [p for p, m in enumerate(row.attention_mask) if m]
        if not ones:
            continue
        for p in list(range(ones[0])) + list(range(ones[-1] + 1, len(row.input_ids))):
            if not row.attention_mask[p]:
                at_edges[row.input_ids[p]] += 1
    fill = {pad} if pad is not None else set()
    others = {t: n for t, n in at_edges.items() if t not in fill}
    inferred = None
    if len(others) == 1 or (pad is None and others):
        inferred = max(others, key=others.get)
        fill.add(inferred)
    return fill, inferred


def _show(tok: Any, row: lm.Row, positions: Sequence[int], limit: int = 6) -> str:
    parts = [f"{lm.token_text(tok, row.input_ids[p])!r}({row.input_ids[p]}) at {p}" for p in positions[:limit]]
    return ", ".join(parts) + (f" … ({len(positions)} in all)" if len(positions) > limit else "")


@check(
    "L14",
    domain="llm",
    property_mode=True,
    title="attention mask disagrees with padding",
    roles=("tokenizer", "dataloader"),
)
def check_attention_mask(dlcheck):
    """attention_mask is 0 exactly on padding and 1 on every real token, even where pad == eos.

    What it does
        On the sampled training batches: when the collator's input examples carry input_ids, their
        true length is known, and the row must have exactly that many ones, on the positions where
        the example's tokens sit (right or left of the padding). Otherwise the mask is judged by its
        structure: zeros form one run at an end of the row on pad ids only (a zero inside the
        sequence, or on a non-pad token, masks a real token), and a run of pad ids at an end with
        mask 1 beyond its first token is unmasked padding (the first may be a real EOS when
        pad == eos; then two such positions are needed, so that a text ending in a doubled EOS is
        not taken for padding). A collator that pads with another constant than
        tokenizer.pad_token_id is recognised by that constant. No threshold: one real token masked,
        or one pad attended to, is already a collator that builds the mask wrongly.
    Why it is bad
        A mask built as ``input_ids != pad_token_id`` when ``pad_token == eos_token`` masks the real
        EOS and every EOS inside a sequence: the model never attends to them, and with labels masked
        by the same rule it never learns to stop (L11). A collator that pads but returns a mask of
        ones lets every token attend to padding; with left padding the pads change every real
        token's context, and losses and generations differ from the unpadded run.
    Example
        batch["attention_mask"] = (batch["input_ids"] != tok.pad_token_id).long()   # pad == eos
    Use instead
        tokenizer.pad(features, return_tensors="pt"), DataCollatorWithPadding or
        DataCollatorForLanguageModeling: their masks come from the sequence lengths and are right
        even when pad == eos. Or give the tokenizer its own pad token.
    Known problems
        Skips batches without attention_mask (padding-free / packed batches, which rely on
        position_ids instead). Without pre-tokenized examples (a collator that tokenizes text, or a
        bare dataloader), a masked final EOS that looks exactly like padding (pad == eos, at the end
        of the row) cannot be told apart; L11 reports an EOS outside the mask.
    Not applicable
        Batches without an attention_mask (padding-free or packed batches that rely on position_ids,
        or a model that builds its mask itself), and batches that are not token batches.
    """
    tok = lm.text_tokenizer(dlcheck.role("tokenizer"))
    sample = token_sample(dlcheck, predicts_tokens=False)
    rows = [r for r in lm.rows(sample.batches) if r.attention_mask is not None]
    if not rows:
        dlcheck.not_applicable(
            f"batches from {sample.source} carry no attention_mask (padding-free or packed batches, "
            "or the model builds the mask itself): no mask to disagree with padding"
        )
    pad = lm.special_id(tok, "pad")
    eos = lm.special_id(tok, "eos")
    fill, _ = fill_ids(rows, pad)
    min_extra = 2 if pad is not None and pad in (eos, lm.special_id(tok, "bos")) else 1

    known = {}
    if sample.rows is not None:
        for i, (row, s, e) in locate(sample, lm.rows(sample.batches)).items():
            ex = example_ids(sample.rows[i])
            if ex is not None and s == 0 and e == len(row.input_ids):
                known[(row.batch, row.index)] = (ex, i)

    masked, unmasked, by_length = [], [], 0
    for row in rows:
        mask = [int(bool(m)) for m in row.attention_mask]
        exp = None
        if (row.batch, row.index) in known:
            ex, _ = known[(row.batch, row.index)]
            exp = expected_mask(row.input_ids, mask, ex)
        if exp is not None:
            by_length += 1
            bad_zero = [p for p, (a, m) in enumerate(zip(exp, mask)) if a and not m]
            bad_one = [p for p, (a, m) in enumerate(zip(exp, mask)) if m and not a and row.input_ids[p] in fill]
            bad_one = [
                p for p in bad_one if not added_by_collator(row.input_ids, exp, p, {eos, lm.special_id(tok, "bos")})
            ]
            true_len = sum(exp)
        else:
            bad_zero, bad_one = structural(row.input_ids, mask, fill, min_extra)
            true_len = None
        if bad_zero:
            masked.append((row, bad_zero, true_len, mask))
        if bad_one:
            unmasked.append((row, bad_one, true_len, mask))

    how = (
        f"judged by: the true length of each pre-tokenized example ({by_length} of {len(rows)} rows), "
        f"the mask's structure for the rest"
        if by_length
        else "judged by: the mask's structure (the collator's examples carry no input_ids, so their lengths are unknown)"
    )
    if masked:
        row, bad, true_len, mask = masked[0]
        total = sum(len(b) for _, b, _, _ in masked)
        bad_set = set(bad)
        ids = [t for p, t in enumerate(row.input_ids) if mask[p] or p in bad_set]
        evidence = [
            f"{len(masked)} of {len(rows)} sampled rows: attention_mask is 0 on {total} real tokens",
            f"example {row.batch}.{row.index}: {lm.decode(tok, ids)}",
            (
                f"the example has {true_len} tokens, the mask has {sum(mask)} ones; masked: "
                if true_len is not None
                else "masked inside the sequence or on non-pad tokens: "
            )
            + _show(tok, row, bad),
        ]
        masked_ids = {row_.input_ids[p] for row_, b, _, _ in masked for p in b}
        if pad is not None and masked_ids == {pad}:
            if pad == eos:
                cause = (
                    "pad_token == eos_token and the attention mask is built as input_ids != pad_token_id, so every "
                    "real EOS (the final one, and any inside a sequence) is masked as if it were padding"
                )
            else:
                cause = (
                    f"the pad id {pad} also occurs as a real token and the attention mask is built as "
                    f"input_ids != pad_token_id, so those real tokens are masked as padding"
                )
        else:
            cause = (
                "the collator's attention_mask marks real tokens as padding (it is not built from the sequence lengths)"
            )
        fix = (
            "build attention_mask from the sequence lengths, never from input_ids != pad_token_id: use "
            "tokenizer.pad(features, return_tensors='pt'), DataCollatorWithPadding or DataCollatorForLanguageModeling "
            "(right even when pad == eos), or give the tokenizer its own pad token"
        )
        if unmasked:
            evidence.append(f"also: {len(unmasked)} rows have padding with attention_mask 1")
        evidence.append(how)
        dlcheck.fail(evidence, cause, fix)
    if not unmasked:
        padding = sum(len(r.attention_mask) - sum(1 for m in r.attention_mask if m) for r in rows)
        real = sum(1 for r in rows for m in r.attention_mask if m)
        dlcheck.measured(
            f"{len(rows)} of {len(rows)} sampled rows: attention_mask is 0 on the {padding} padding positions only "
            f"and 1 on all {real} real tokens ({how})",
            rows=len(rows),
            padding_positions=padding,
            real_tokens=real,
            judged_by_length=by_length,
        )
        return
    row, bad, true_len, mask = unmasked[0]
    total = sum(len(b) for _, b, _, _ in unmasked)
    content = [row.input_ids[p] for p in range(len(row.input_ids)) if p not in set(bad)]
    pad_tok = Counter(row.input_ids[p] for p in bad).most_common(1)[0][0]
    evidence = [
        f"{len(unmasked)} of {len(rows)} sampled rows: {total} padding positions have attention_mask 1",
        f"example {row.batch}.{row.index}: {lm.decode(tok, content)} + {len(bad)} x "
        f"{lm.token_text(tok, pad_tok)!r}({pad_tok}) with attention_mask 1"
        + (f"; the example has {true_len} tokens, the mask has {sum(mask)} ones" if true_len is not None else ""),
        how,
    ]
    all_ones = all(all(m) for _, _, _, m in unmasked)
    cause = (
        "the collator pads input_ids but returns an attention_mask of ones"
        if all_ones
        else "the collator's attention_mask marks padding as real tokens"
    ) + (
        ", so every real token attends to the pads: with left padding they change every token's context, and the "
        "results differ from the unpadded run"
    )
    fix = (
        "return the attention_mask of tokenizer.pad(features, return_tensors='pt') / DataCollatorWithPadding, "
        "0 on every padded position (or build it from the sequence lengths when padding by hand)"
    )
    dlcheck.fail(evidence, cause, fix)
