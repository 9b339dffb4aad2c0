from __future__ import annotations

from collections import Counter
from typing import Any

import pytest
import torch

from ...errors import RoleError
from ...registry import Setting, check
from ...sampling import Sample, get_sample
from ..shared import lm

FIX_RESIZE = (
    "model.resize_token_embeddings(len(tokenizer)) right after adding the tokens "
    "(before training and before building the optimizer)"
)


def _name(tok: Any, token_id: int | None) -> str:
    return "None" if token_id is None else f"{lm.token_text(tok, token_id)!r}(id {token_id})"


def _config_pad(model: Any) -> int | None:
    config = getattr(model, "config", None)
    value = getattr(config, "pad_token_id", None)
    if value is None and hasattr(config, "get_text_config"):
        try:
            value = getattr(config.get_text_config(), "pad_token_id", None)
        except Exception:
            value = None
    if isinstance(value, (list, tuple)):
        value = value[0] if value else None
    return int(value) if isinstance(value, int) else None


def _try_sample(dlcheck: Any) -> tuple[Sample | None, str | RoleError | None]:
    """The shared sample, or why there is none: a skip reason, or the collator's error."""
    try:
        return get_sample(dlcheck), None
    except pytest.skip.Exception as exc:
        return None, str(getattr(exc, "msg", exc))
    except RoleError as exc:
        return None, exc


def _is_pad_error(exc: Any) -> bool:
    text = str(exc).lower()
    return isinstance(exc, RoleError) and ("padding token" in text or "pad_token" in text or "pad token" in text)


def _ids(batch: dict, key: str) -> torch.Tensor | None:
    value = batch.get(key)
    if value is None:
        return None
    try:
        t = torch.as_tensor(value)
    except Exception:  # ragged lists: flatten
        try:
            t = torch.as_tensor([i for row in value for i in row])
        except Exception:
            return None
    return t if t.dtype in (torch.int64, torch.int32, torch.int16, torch.uint8, torch.int8) else None


def _real_occurrences(sample: Sample, token_id: int) -> int:
    count = 0
    for batch in sample.batches:
        ids, mask = _ids(batch, "input_ids"), _ids(batch, "attention_mask")
        if ids is None:
            continue
        hits = ids == token_id
        if mask is not None and mask.shape == ids.shape:
            hits &= mask.bool()
        count += int(hits.sum())
    return count


def _padded(sample: Sample) -> tuple[bool, str]:
    """Whether the sampled batches are padded, and the evidence: a zero in the attention mask, or rows of
    different lengths collated into one rectangle."""
    for b, batch in enumerate(sample.batches):
        mask = _ids(batch, "attention_mask")
        if mask is not None and mask.dim() == 2 and bool((mask == 0).any()):
            rows_ = int((mask == 0).any(1).sum())
            return (
                True,
                f"batch {b}: {rows_} of {mask.shape[0]} rows are padded ({int((mask == 0).sum())} positions with attention_mask 0)",
            )
    if sample.rows is not None and sample.batch_rows is not None:
        for b, (batch, group) in enumerate(zip(sample.batches, sample.batch_rows)):
            lengths = []
            for i in group:
                row = sample.rows[i]
                ids = row.get("input_ids") if hasattr(row, "get") else None
                if ids is None:
                    break
                lengths.append(len(ids))
            ids = _ids(batch, "input_ids")
            if (
                len(lengths) == len(group)
                and len(set(lengths)) > 1
                and ids is not None
                and ids.dim() == 2
                and ids.shape[0] == len(group)
                and ids.shape[1] >= max(lengths)
            ):
                return True, (
                    f"batch {b}: examples of {min(lengths)}..{max(lengths)} tokens collated to a "
                    f"{ids.shape[0]}x{ids.shape[1]} batch"
                )
    return False, ""


@check(
    "L3",
    domain="llm",
    title="pad token missing, or special tokens added without resizing the embeddings",
    roles=("tokenizer",),
    optional_roles=("model", "dataloader"),
    settings=(
        Setting(
            "require_pad_token",
            True,
            "fail when batches are padded but the tokenizer has no pad token; true "
            "because the collator then pads with an id of its own that tokenizer.pad, generate() and "
            "model.config do not know (or cannot pad at all)",
        ),
    ),
)
def check_special_tokens(dlcheck):
    """Every token id the pipeline emits has an embedding row, and the pad token is defined and agreed on.

    What it does
        Compares the largest id the tokenizer can emit (``len(tokenizer) - 1``) and every id in the
        sampled batches (input_ids, and labels other than -100) with the rows of
        ``model.get_input_embeddings()``; a negative input id is reported too. Checks that the
        tokenizer has a pad token when the sampled batches are padded (a zero in attention_mask, or
        examples of different lengths collated together) or when the collator fails for want of one.
        Checks that ``model.config.pad_token_id`` equals ``tokenizer.pad_token_id`` when both are set;
        a config without a pad id is harmless (the tokenizer's pad is what collators use) and
        ``pad_token == eos_token`` is accepted (L11/L14 look after its consequences).
    Why it is bad
        ``tokenizer.add_special_tokens({"pad_token": "<pad>"})`` gives the new token the id
        ``len(tokenizer) - 1``, one past the embedding table of a model built for the old vocabulary.
        The forward pass then dies with an IndexError on CPU, or a device-side assert on CUDA that
        names nothing useful. A tokenizer without a pad token cannot pad batches (most causal-LM
        tokenizers ship none). A config whose pad_token_id differs from the tokenizer's makes the
        embedding's padding_idx row (no gradient) a real token, and makes generate() and
        sequence-classification pooling look for the wrong pad id.
    Example
        tok.add_special_tokens({"pad_token": "<pad>"})    # id 32000
        model = AutoModelForCausalLM.from_pretrained(...)  # embedding table of 32000 rows
    Use instead
        tok.add_special_tokens({"pad_token": "<pad>"}); model.resize_token_embeddings(len(tok));
        model.config.pad_token_id = tok.pad_token_id. Or reuse a token: tok.pad_token = tok.eos_token.
    Known problems
        Needs dlcheck_model for the embedding comparison and the sampled data (dlcheck_dataloader, or
        dlcheck_collator + dlcheck_dataset, or dlcheck_trainer) to know whether batches are padded;
        skips naming what is missing when the other parts find nothing. An embedding table larger
        than the tokenizer (rounded up to a multiple of 64) is normal and passes.
    Not applicable
        None among token pipelines: every tokenizer and token model is judged. A model without
        get_input_embeddings() cannot be compared and skips.
    """
    tok = lm.text_tokenizer(dlcheck.role("tokenizer"))
    model = dlcheck.role("model") if dlcheck.has("model") else None
    table = lm.embedding_rows(model) if model is not None else None
    sample, no_sample = _try_sample(dlcheck)
    pad = lm.special_id(tok, "pad")
    eos = lm.special_id(tok, "eos")
    try:
        vocab = len(tok)
    except Exception:
        vocab = None

    problems = []  # (evidence lines, cause, fix), the root cause first

    # 1. ids beyond the embedding table -----------------------------------------------------------
    largest, n_ids = None, 0  # the largest id and the number of ids the sampled batches carry
    if table is not None:
        emb = lm.input_embeddings(model)
        emitted: Counter = Counter()  # id -> positions
        first_bad = None  # (batch, row, key) of the first offending row
        negative = []
        if sample is not None:
            for b, batch in enumerate(sample.batches):
                for key in ("input_ids", "labels"):
                    t = _ids(batch, key)
                    if t is None:
                        continue
                    real = t[t != lm.IGNORE] if key == "labels" else t
                    if real.numel():
                        largest = max(int(real.max()), largest if largest is not None else -1)
                        n_ids += int(real.numel())
                    if key == "input_ids" and bool((t < 0).any()):
                        negative.append((b, int(t.min()), int((t < 0).sum())))
                    bad = t >= table
                    if bool(bad.any()):
                        for value, count in zip(*torch.unique(t[bad], return_counts=True)):
                            emitted[int(value)] += int(count)
                        if first_bad is None and t.dim() == 2:
                            first_bad = (b, int(bad.any(1).nonzero()[0]), key)
        beyond_vocab = list(range(table, vocab)) if vocab is not None and vocab > table else []
        if emitted or beyond_vocab:
            added = beyond_vocab[:6]
            lines = []
            if emitted:
                top = max(emitted)
                total = sum(emitted.values())
                lines.append(
                    f"token id {top} {lm.token_text(tok, top)!r} is >= the {table} rows of "
                    f"model.get_input_embeddings() ({emb}); {total} positions of the sampled batches "
                    f"carry ids >= {table}: " + ", ".join(_name(tok, i) for i in sorted(emitted)[:6])
                )
                if first_bad is not None:
                    b, r, key = first_bad
                    ids_ = [int(i) for i in torch.as_tensor(sample.batches[b][key])[r].tolist() if i != lm.IGNORE]
                    lines.append(f"example {b}.{r} ({key}): {lm.decode(tok, ids_)}")
            if beyond_vocab:
                lines.append(
                    f"the tokenizer has {vocab} tokens (len(tokenizer)), so it can emit ids up to {vocab - 1}; "
                    f"ids {table}..{vocab - 1} have no embedding row: "
                    + ", ".join(_name(tok, i) for i in added)
                    + (" …" if len(beyond_vocab) > len(added) else "")
                )
            if beyond_vocab:
                names = ", ".join(repr(lm.token_text(tok, i)) for i in added)
                cause = (
                    f"tokens were added to the tokenizer ({names}: add_special_tokens / add_tokens) after the model "
                    f"was built for {table} tokens, and the embedding table was not resized: the forward pass "
                    f"indexes past it (IndexError on CPU, a device-side assert on CUDA)"
                )
                fix = FIX_RESIZE
            else:
                cause = (
                    f"the pipeline emits ids that the tokenizer (len {vocab}) never makes and the {table}-row "
                    f"embedding table does not have: ids from another tokenizer, or a collator's own fill value"
                )
                fix = (
                    "tokenize with the model's own tokenizer and pad input_ids with tokenizer.pad_token_id; "
                    "if the vocabulary really grew, " + FIX_RESIZE
                )
            problems.append((lines, cause, fix))
        for b, low, count in negative[:1]:
            problems.append(
                (
                    [
                        f"batch {b}: {count} input_ids are negative (smallest {low}); an embedding lookup needs ids in 0..{table - 1}"
                    ],
                    "the collator pads input_ids with a negative fill value (-100 belongs in labels only)",
                    "pad input_ids with tokenizer.pad_token_id and mark padding with attention_mask; use -100 only in labels",
                )
            )

    # 2. no pad token -----------------------------------------------------------------------------
    padded, how = _padded(sample) if sample is not None else (False, "")
    # a tokenizer that is no transformers tokenizer (litgpt's, nanochat's: no pad_token attribute at all) has no pad
    # token for tokenizer.pad / generate() / model.config to know: the collator's own pad id is the pipeline's choice
    foreign = (
        callable(getattr(tok, "encode", None))
        and callable(getattr(tok, "decode", None))
        and not hasattr(tok, "pad_token")
        and not hasattr(tok, "pad_token_id")
    )
    if pad is None and foreign and padded:
        dlcheck.not_judged(
            "pad token",
            f"the tokenizer ({type(tok).__name__}) is no transformers tokenizer (it has no pad_token): the pad id its "
            f"collator fills batches with is the pipeline's own ({how})",
        )
    if pad is None and dlcheck.setting("require_pad_token") and not foreign:
        eos_hint = f" (eos_token is {_name(tok, eos)})" if eos is not None else ""
        fix = (
            "tokenizer.pad_token = tokenizer.eos_token (then mask labels by attention_mask, see L11), or "
            "tokenizer.add_special_tokens({'pad_token': '<|pad|>'}) followed by "
            "model.resize_token_embeddings(len(tokenizer)); then model.config.pad_token_id = tokenizer.pad_token_id"
        )
        if _is_pad_error(no_sample):
            problems.append(
                (
                    [f"tokenizer.pad_token is None{eos_hint}", f"dlcheck_{no_sample.role}: {no_sample.message}"],
                    "the tokenizer has no pad token (most causal-LM tokenizers ship none), so the collator cannot pad "
                    "a batch of examples of different lengths",
                    fix,
                )
            )
        elif sample is not None:
            if padded:
                problems.append(
                    (
                        [f"tokenizer.pad_token is None{eos_hint}, yet the sampled batches are padded: {how}"],
                        "the tokenizer has no pad token, so the collator pads with an id of its own that tokenizer.pad, "
                        "generate() and model.config.pad_token_id do not know",
                        fix,
                    )
                )

    # 3. model.config.pad_token_id vs the tokenizer's ----------------------------------------------
    config_pad = _config_pad(model) if model is not None else None
    if config_pad is not None and pad is not None and config_pad != pad:
        lines = [
            f"model.config.pad_token_id = {config_pad} {lm.token_text(tok, config_pad)!r} but "
            f"tokenizer.pad_token_id = {pad} {lm.token_text(tok, pad)!r}"
        ]
        padding_idx = getattr(lm.input_embeddings(model), "padding_idx", None)
        if padding_idx is not None and padding_idx == config_pad:
            lines.append(
                f"the input embedding's padding_idx is {padding_idx} {lm.token_text(tok, padding_idx)!r}: "
                f"that row gets no gradient"
            )
        real = _real_occurrences(sample, config_pad) if sample is not None else 0
        if real:
            lines.append(
                f"id {config_pad} {lm.token_text(tok, config_pad)!r} occurs as a real token (attention_mask 1) "
                f"at {real} positions of the sampled batches"
            )
        problems.append(
            (
                lines,
                "the model was configured for another pad token than the one the tokenizer pads with: "
                + ("the embedding's padding_idx row never trains, and " if padding_idx == config_pad else "")
                + "generate() and sequence-classification pooling look for the wrong pad id",
                "model.config.pad_token_id = tokenizer.pad_token_id and model.generation_config.pad_token_id = "
                "tokenizer.pad_token_id"
                + (
                    "; model.get_input_embeddings().padding_idx = tokenizer.pad_token_id"
                    if padding_idx is not None
                    else ""
                ),
            )
        )

    if problems:
        lines, cause, fix = problems[0]
        extra = [f"also: {p[0][0]}" for p in problems[1:]]
        dlcheck.fail(lines + extra, cause, fix)

    if isinstance(no_sample, RoleError):
        raise no_sample
    if model is None:
        dlcheck.require("model")  # the embedding comparison, the heart of L3, needs it
    if table is None:
        dlcheck.skip(
            f"{type(model).__name__} has no get_input_embeddings(): cannot compare token ids with an embedding table"
        )
    if sample is None and pad is None:
        dlcheck.skip(
            f"the tokenizer has no pad token and no data was sampled ({no_sample}); "
            "cannot tell whether batches are padded"
        )
    lines = [
        f"every id has an embedding row: {table} rows in model.get_input_embeddings(), len(tokenizer) = {vocab}"
        + (
            f"; largest id in the sampled batches {largest} ({n_ids} input_ids and labels other than -100)"
            if largest is not None
            else f"; no data sampled ({no_sample})"
        )
    ]
    if pad is not None:
        agree = (
            f"model.config.pad_token_id = {config_pad} too"
            if config_pad is not None
            else "model.config.pad_token_id unset (harmless: collators use the tokenizer's)"
        )
        lines.append(f"pad token {_name(tok, pad)}; {agree}")
    else:
        lines.append(
            f"no pad token; the sampled batches are padded ({how}), accepted: L3.require_pad_token is off"
            if padded
            else "no pad token, and the sampled batches are not padded (no attention_mask zero, no examples of "
            "different lengths collated together)"
        )
    if sample is None:
        dlcheck.not_judged("the sampled batches' ids", str(no_sample))
    dlcheck.measured(
        *lines,
        embedding_rows=table,
        tokenizer_length=vocab,
        largest_id=largest,
        pad_token_id=pad,
        config_pad=config_pad,
    )
