from __future__ import annotations

from ...errors import MISSING
from ...registry import Setting, check
from ..shared import lm
from .common import labelled_rows, pipeline_kind, raw_view, token_sample


def _raw_texts(dlcheck) -> list[str]:
    """The texts of ``dlcheck_documents`` (before tokenization and grouping; a bounded read: the first 64)."""
    raw = dlcheck.role("documents")
    if raw is MISSING:
        return []
    texts = []
    try:
        for i in range(min(64, len(raw))):
            row = raw[i]
            text = row.get("text") if isinstance(row, dict) else row if isinstance(row, str) else None
            if isinstance(text, str) and text.strip():
                texts.append(text)
    except Exception:  # noqa: BLE001 - an iterable or exotic dataset: no documents to count
        return []
    return texts


def _separators_in_stream(dlcheck, tok, rows, stops, pad) -> bool:
    """Rows that are blocks of one token stream (documents closed by EOS, then grouped: run_clm with EOS,
    no position_ids): judge the stop tokens inside the rows, the documents' real ends."""
    inner = [
        (row, i)
        for row in rows
        if row.labels is not None
        for i in range(len(row.input_ids) - 1)
        if row.input_ids[i] in stops and i in set(row.content) and (i + 1) in set(row.content)
    ]
    if not inner:
        return False
    masked = [
        (row, i)
        for row, i in inner
        if row.labels[i] == lm.IGNORE and not (i > 0 and row.labels[i - 1] == row.input_ids[i])
    ]
    n_rows = len({id(r) for r, _ in inner})
    if len(masked) / len(inner) <= dlcheck.setting("max_missing_share"):
        dlcheck.measured(
            f"{len(inner)} stop tokens close documents inside {n_rows} of {len(rows)} sampled rows (texts grouped "
            f"into blocks after an EOS was appended to each): all {len(inner)} supervised",
            documents=len(inner),
            unsupervised=0,
        )
        return True
    row, pos = masked[0]
    window = list(range(max(0, pos - 3), min(len(row.input_ids), pos + 2)))
    evidence = [
        f"{len(masked)} of {len(inner)} stop tokens that close documents inside the sampled rows have label -100",
        f"example {row.batch}.{row.index}: labels around the document end: {lm.show_labels(tok, row, window)}",
    ]
    if pad is not None and pad in stops:
        cause = "pad_token == eos_token and the collator masks every pad id, so every document's EOS is masked too"
        fix = (
            "give the tokenizer its own pad token (tok.add_special_tokens({'pad_token': '<|pad|>'}) + "
            "model.resize_token_embeddings(len(tok))), or mask labels by attention_mask, not by token id"
        )
    else:
        cause = "the labelling code sets the label of every EOS to -100, so the model never learns to end a document"
        fix = "keep labels[i] = input_ids[i] at EOS positions; mask only padding (attention_mask == 0) and prompts"
    dlcheck.fail(evidence, cause, fix)
    return True


def _stream_without_separators(dlcheck, tok, rows, stops) -> None:
    """Every sampled row is a full block of one token stream (no padding, equal lengths) holding no stop
    token at all: texts grouped into blocks without a document separator (run_clm's group_texts on texts
    tokenized without EOS). Fails when dlcheck_documents shows the texts are separate documents;
    otherwise skips saying what was seen (one continuous text needs no separator)."""
    lengths = {len(r.input_ids) for r in rows}
    full = all(len(r.content) == len(r.input_ids) for r in rows)
    if not rows or len(lengths) != 1 or not full or any(t in stops for r in rows for t in r.input_ids):
        return
    (length,) = lengths
    stop_text = ", ".join(f"{lm.token_text(tok, s)} (id {s})" for s in sorted(stops))
    seen = (
        f"{len(rows)} of {len(rows)} sampled rows are full {length}-token blocks of one token stream (no padding) "
        f"and hold no stop token [{stop_text}] anywhere in their {len(rows) * length} tokens"
    )
    texts = _raw_texts(dlcheck)
    if len(texts) >= 2:
        dlcheck.fail(
            [
                seen,
                f"dlcheck_documents holds {len(texts)} separate texts among its first rows, e.g. "
                f"{texts[0][:60]!r} and {texts[1][:60]!r}",
                f"example 0: {lm.decode(tok, rows[0].input_ids)}",
            ],
            "the texts are concatenated into blocks with no separator between documents (transformers' "
            "run_clm.py group_texts on texts tokenized without EOS): the model never sees where a document ends, "
            "learns to run one document into the next, and never learns to stop",
            "append the EOS to every text before grouping: tokenizer([t + tokenizer.eos_token for t in "
            "examples['text']]) in the tokenize function (or tokenizer.add_eos_token / a post-processor that "
            "appends it)",
        )
    dlcheck.skip(
        f"{seen}: the texts are grouped into blocks without a document separator (run_clm.py's group_texts "
        "without EOS). If they are separate documents, append tokenizer.eos_token to each before grouping; a "
        "single continuous text needs none. Define fixture dlcheck_documents (the texts before tokenization) "
        "to have this judged"
    )


@check(
    "L11",
    domain="llm",
    title="end-of-sequence token is never supervised",
    roles=("tokenizer", "dataloader"),
    optional_roles=("model", "documents", "collator"),
    property_mode=True,
    settings=(
        Setting(
            "max_missing_share",
            0.0,
            "share of sampled, untruncated documents allowed to end without a "
            "supervised EOS; 0 because one masked EOS is already a collator that masks the real EOS",
        ),
    ),
)
def check_eos_supervised(dlcheck):
    """Every training document ends with an EOS token whose label is supervised.

    What it does
        On the sampled training batches, finds the last real token of every document (by attention
        mask, and by position_ids restarts for packed rows) and checks that it is a stop token and
        that its label is not -100 (labels aligned with input_ids, or pre-shifted by one). Stop tokens
        are the tokenizer's EOS plus the model's ``generation_config.eos_token_id`` (chat models stop
        on an end-of-turn token such as ``<|im_end|>``). Documents that fill the whole row without a
        stop token are counted as truncated and left to L13. When pad_token == eos_token, the padding after a document is
        not its EOS: a row that carries no EOS of its own (a row of the sample ends with its content, no stop
        token, no padding; or the data are conversations, to which TRL's SFTTrainer appends no EOS) is told
        from an EOS that the attention mask shuts out, and a chat template's end-of-turn token (``<|im_end|>``
        before its newline) is named with the fix (``SFTConfig(eos_token=...)`` under TRL); a chat template that
        ends an assistant turn with no stop token at all (LLaVA-1.5's ``content + ' '``) is named as such. With a
        processor (a vision-language model's) as dlcheck_tokenizer, the EOS is its ``.tokenizer``'s.
    Why it is bad
        A model that never sees EOS as a target never learns to stop: generation runs to max_new_tokens
        and rambles. The classic cause: ``tokenizer.pad_token = tokenizer.eos_token`` with
        ``DataCollatorForLanguageModeling(mlm=False)``, which sets the label of every pad id to -100,
        the real EOS included. Another: a tokenizer (Llama, Mistral) that appends no EOS.
    Example
        tok.pad_token = tok.eos_token
        collator = DataCollatorForLanguageModeling(tok, mlm=False)   # masks the real EOS too
    Use instead
        tok.add_special_tokens({"pad_token": "<|pad|>"}); model.resize_token_embeddings(len(tok)),
        or mask labels by attention_mask instead of by token id; append tok.eos_token to every text.
    Known problems
        Needs labels in the batch; skips when the collator leaves them to the model. A pipeline that
        deliberately trains without EOS (pure continuation pretraining) should ignore L11.
        An encoder-decoder is not measured yet (a skip: its EOS is in the decoder's labels, which do
        not line up with input_ids).
    Not applicable
        Batches that are not token batches (images, (inputs, targets) tuples). Models that never
        generate: masked LMs, sequence and token classifiers, extractive question-answering models
        (an encoder such as BERT has no EOS by design, found blind on run_qa); a permutation LM (XLNet's
        DataCollatorForPermutationLanguageModeling masks spans and never targets a special token, by design, like a
        masked LM); what the pipeline trains is decided once from its objects (a permutation-LM collator, then the
        model's head in transformers' task mappings, else the collator, else the labels' shape).
    """
    tok = dlcheck.role("tokenizer")
    sample = token_sample(dlcheck)
    kind = pipeline_kind(dlcheck)
    if not kind.generates:  # an encoder that never generates has no EOS to learn (BERT has none by design)
        kind.not_for(dlcheck, "models that generate and must learn where to stop (causal and seq2seq LMs)")
    unmeasured = kind.unmeasured("the EOS in the decoder's labels")
    if unmeasured:
        dlcheck.skip(unmeasured)
    eos = lm.special_id(tok, "eos")
    if eos is None:
        dlcheck.skip("the tokenizer has no eos_token_id; L3 owns a missing special token")
    stops = {eos} | lm.generation_stop_ids(dlcheck.role("model"))
    rows = labelled_rows(dlcheck, sample)
    pad = lm.special_id(tok, "pad")

    docs = []  # (row, real positions, packed?)
    for row in rows:
        if row.labels is None:
            continue
        content = set(row.content)
        spans = row.documents()
        for start, end in spans:
            real = [p for p in range(start, end) if p in content]
            if real:
                docs.append((row, real, end, len(spans) > 1))
    longest = max((len(real) for _, real, _, _ in docs), default=0)

    # a pad token that is also a generation stop (Qwen's <|endoftext|> in generation_config.eos_token_id)
    # fills the padding: after the content it is padding, not an EOS shut out by the attention mask
    pad_is_eos = pad is not None and pad == eos
    shut_out = stops if pad_is_eos or pad is None else stops - {pad}
    masked, no_eos, outside_mask, truncated, judged = [], [], [], 0, 0
    filled = 0  # documents whose real tokens reach the row's end with no stop token: no EOS was appended
    for row, real, end, packed in docs:
        last = _end_of_document(tok, row, real, stops)
        if row.input_ids[last] not in stops and not packed and last == len(row.input_ids) - 1:
            filled += 1
        if row.input_ids[last] not in stops:
            # the EOS right after the content, shut out by the attention mask, is L14's bug
            if last + 1 < end and row.input_ids[last + 1] in shut_out and (last + 1) not in row.content:
                outside_mask.append((row, last + 1))
                judged += 1
            elif len(real) == longest or (packed and last == len(row.input_ids) - 1):
                truncated += 1  # the longest document, or a packed row's cut tail: L13's business
            else:
                no_eos.append((row, last))
                judged += 1
            continue
        judged += 1
        shifted_ok = last > 0 and row.labels[last - 1] == row.input_ids[last]
        if row.labels[last] == lm.IGNORE and not shifted_ok:
            masked.append((row, last))

    conversational = _conversational(dlcheck, sample)
    if pad_is_eos and outside_mask and (filled or conversational):
        # pad == eos: the token after the content is padding, not an EOS the mask shuts out, when the rows carry
        # no EOS at all: a row of the sample ends with its content and no stop token (no padding after it), or
        # the data are conversations (TRL appends the EOS to non-conversational data only)
        no_eos += [(row, pos - 1) for row, pos in outside_mask]
        outside_mask = []
    if judged == 0:
        if _separators_in_stream(dlcheck, tok, rows, stops, pad):
            return
        _stream_without_separators(dlcheck, tok, rows, stops)
        dlcheck.skip(f"all {truncated} sampled documents fill their row without EOS (truncated?); see L13")
    bad = masked + no_eos + outside_mask
    if len(bad) / judged <= dlcheck.setting("max_missing_share"):
        stop_names = ", ".join(sorted({lm.token_text(tok, i) for i in stops}))
        dlcheck.measured(
            f"{judged - len(bad)} of {judged} sampled documents end with a supervised stop token ({stop_names})"
            + (f"; {truncated} cut at the row's end left to L13" if truncated else ""),
            documents=judged,
            unsupervised=len(bad),
            truncated=truncated,
        )
        return

    row, pos = bad[0]
    ending = lm.token_text(tok, row.input_ids[pos])
    window = list(range(max(0, pos - 3), min(len(row.input_ids), pos + 2)))
    example = [
        f"example {row.batch}.{row.index}: {lm.decode(tok, [row.input_ids[p] for p in row.content] or row.input_ids)}",
        f"labels at the end: {lm.show_labels(tok, row, window)}",
    ]
    if masked and len(masked) >= len(no_eos):
        evidence = [
            f"{len(masked)} of {judged} sampled documents: final token {ending} (id {row.input_ids[pos]}) has label -100"
        ] + example
        if pad is not None and pad == eos:
            cause = "pad_token == eos_token and the collator masks every pad id, so the real EOS is masked too"
            fix = (
                "give the tokenizer its own pad token (tok.add_special_tokens({'pad_token': '<|pad|>'}) + "
                "model.resize_token_embeddings(len(tok))), or mask labels by attention_mask, not by token id"
            )
        else:
            cause = "the collator or the labelling code sets the label of the final EOS to -100"
            fix = "keep labels[i] = input_ids[i] at the EOS position; mask only padding (attention_mask == 0) and prompt tokens"
    elif outside_mask and len(outside_mask) >= len(no_eos):
        evidence = [
            f"{len(outside_mask)} of {judged} sampled documents: the EOS after the last real token has "
            f"attention_mask 0, so it is treated as padding"
        ] + example
        cause = "pad_token == eos_token and the attention mask was built as input_ids != pad_token_id (see L14)"
        fix = "take attention_mask from the tokenizer's padding (tokenizer.pad / DataCollatorWithPadding), or give the tokenizer its own pad token"
    else:
        stop_text = ", ".join(f"{lm.token_text(tok, s)} (id {s})" for s in sorted(stops))
        evidence = [
            f"{len(no_eos)} of {judged} sampled documents end without a stop token [{stop_text}]: the last real "
            f"token (by attention_mask) is {ending}, not the EOS; {truncated} more fill the row (truncated?)"
        ] + example
        if pad_is_eos and pos + 1 < len(row.input_ids) and row.input_ids[pos + 1] == pad:
            evidence.append(
                f"what follows is padding ({lm.token_text(tok, pad)}, attention_mask 0): pad_token == eos_token, "
                "but the row carries no EOS of its own"
                + (
                    f" ({filled} sampled rows end with their content and no stop token, with no padding after it)"
                    if filled
                    else ""
                )
            )
        turn_end = _turn_end(tok, row, pos, stops)
        trl = _trl_sft(dlcheck.role("trainer"))
        if row.input_ids[pos] in lm.special_ids(tok):
            cause = (
                f"the documents end with the special token {ending}, but generation stops only on [{stop_text}]: "
                "the model learns to end its turn with a token that never stops generation"
            )
            fix = (
                (
                    f"SFTConfig(eos_token={ending!r}) (TRL makes it the EOS of the tokenizer and the model), or "
                    if trl and conversational
                    else ""
                )
                + f"add {ending} to model.generation_config.eos_token_id (a list may hold several ids), or make it the "
                "tokenizer's eos_token, as chat models do"
            )
        elif conversational and turn_end is not None:
            turn = lm.token_text(tok, turn_end)
            cause = (
                f"the data are conversations and the chat template ends each turn with {turn}, but the tokenizer's "
                f"EOS (what generation stops on: [{stop_text}]) never ends a row"
                + (" (pad_token == eos_token: it is there as padding only)" if pad_is_eos else "")
                + (
                    f": {trl} appends the EOS to non-conversational data only; a conversation ends where the "
                    "template ends it"
                    if trl
                    else ""
                )
                + f", so the model learns to end its turn with {turn}, a token that never stops generation"
            )
            fix = (
                (f"SFTConfig(eos_token={turn!r}) (TRL makes it the EOS of the tokenizer and the model)" if trl else "")
                + (", or " if trl else "")
                + f"make {turn} the tokenizer's eos_token and add it to model.generation_config.eos_token_id, or use a "
                "chat template whose turns end with the model's EOS"
            )
        elif conversational:
            eos_text = lm.token_text(tok, eos)
            cause = (
                f"the data are conversations and the chat template ends an assistant turn without a stop token "
                f"[{stop_text}]"
                + (
                    f": {trl} appends the EOS to non-conversational data only; a conversation ends where the "
                    "template ends it"
                    if trl
                    else ""
                )
                + f", so {eos_text} never appears in the labels and the model never learns to stop"
            )
            fix = (
                f"render the conversations with a chat template that closes every assistant turn with {eos_text} "
                "(append {{ eos_token }} after the assistant's content, inside its {% generation %} block), set as "
                "the tokenizer's or processor's chat_template,"
                + (" or passed as SFTConfig(chat_template_path='template.jinja')" if trl else "")
            )
        elif trl and _trl_vision_collator(dlcheck):
            eos_text = lm.token_text(tok, eos)
            cause = (
                f"{trl} appends the EOS to the texts/completions of a text-only dataset (its dataset preparation) "
                "but prepares no vision dataset, and DataCollatorForVisionLanguageModeling appends none: the "
                f"completions end without {eos_text}, so the model never learns to stop"
            )
            fix = (
                f"append the EOS (processor.tokenizer.eos_token, {eos_text}) to every completion (or text) of the "
                "vision dataset before training"
            )
        else:
            cause = "the tokenizer appends no EOS (add_eos_token is off, as for Llama/Mistral) and the data pipeline does not add one"
            fix = "append tokenizer.eos_token to every training text (or completion) before tokenizing, or enable the tokenizer's EOS post-processor"
    dlcheck.fail(evidence, cause, fix)


#: blank tokens a chat template may put after a turn's stop token (ChatML renders "<|im_end|>\n")
MAX_TRAILING_BLANKS = 2


def _end_of_document(tok, row, real: list[int], stops: set[int]) -> int:
    """The position that ends a document: its last real token, or a stop token followed only by the
    template's blank tokens (ChatML's newline after <|im_end|>) — the stop token is what the model must
    learn to emit; the newline after it is never generated."""
    last = real[-1]
    for back in range(1, MAX_TRAILING_BLANKS + 1):
        if back >= len(real) or row.input_ids[real[-back]] in stops:
            break
        if not _blank(tok, row.input_ids[real[-back]]):
            break  # a word, not the template's newline
        if row.input_ids[real[-back - 1]] in stops:
            return real[-back - 1]
    return last


def _blank(tok, token_id: int) -> bool:
    try:
        return not lm.text_tokenizer(tok).decode([int(token_id)]).strip()
    except Exception:  # noqa: BLE001 - a tokenizer that cannot decode one id: not known to be blank
        return False


def _turn_end(tok, row, pos: int, stops: set[int]) -> int | None:
    """The special token that ends the document before the template's trailing blanks (ChatML's <|im_end|>
    then a newline), when it is no stop token; else None."""
    specials = set(lm.special_ids(tok))
    try:  # tokens added as special (tok.add_tokens([...], special_tokens=True)) are not in all_special_ids
        added = lm.text_tokenizer(tok).added_tokens_decoder
        specials |= {int(i) for i, t in added.items() if getattr(t, "special", False)}
    except Exception:  # noqa: BLE001 - a tokenizer without added tokens
        pass
    for back in range(MAX_TRAILING_BLANKS + 1):
        p = pos - back
        if p < 0:
            return None
        token = row.input_ids[p]
        if token in specials:
            return None if token in stops else token
        if not _blank(tok, token):
            return None
    return None


def _conversational(dlcheck, sample) -> bool:
    """The raw examples behind the sample are conversations (a ``messages`` column, or a conversational prompt
    and completion: lists of {role, content} turns)."""

    def turns(value) -> bool:
        return (
            isinstance(value, (list, tuple))
            and bool(value)
            and all(hasattr(t, "get") and "role" in t and "content" in t for t in value)
        )

    try:
        view = raw_view(dlcheck, sample)
    except Exception:  # noqa: BLE001 - raw rows that cannot be read: not known to be conversations
        return False
    if view is None:
        return False
    return any(
        hasattr(r, "get") and (turns(r.get("messages")) or turns(r.get("prompt")) or turns(r.get("completion")))
        for r in view.rows
    )


def _trl_vision_collator(dlcheck) -> bool:
    """The collator is TRL's DataCollatorForVisionLanguageModeling (or a subclass)."""
    collator = dlcheck.role("collator") if dlcheck.has("collator") else None
    return collator is not None and any(
        c.__module__.startswith("trl.") and c.__name__ == "DataCollatorForVisionLanguageModeling"
        for c in type(collator).__mro__
    )


def _trl_sft(trainer) -> str | None:
    """The class name of a TRL SFTTrainer (or a subclass), else None."""
    if trainer is MISSING or trainer is None:
        return None
    for cls in type(trainer).__mro__:
        if cls.__module__.startswith("trl.") and cls.__name__ == "SFTTrainer":
            return type(trainer).__name__
    return None
