from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

from ...registry import Setting, check
from ..shared import lm
from .common import locate, packed_examples, pipeline_kind, raw_given, raw_view, token_sample, unmatched

#: batch keys that carry images: token ids beside them, without labels, are captions conditioning an image model
IMAGE_KEYS = ("pixel_values", "images", "image")


def _flat_ids(value: Any) -> list[int] | None:
    """input_ids from whatever apply_chat_template returned: a BatchEncoding/dict (transformers 5), a
    list, a nested list or a tensor."""
    if isinstance(value, Mapping) or hasattr(value, "keys"):
        try:
            value = value["input_ids"]
        except Exception:
            return None
    if hasattr(value, "tolist"):
        value = value.tolist()
    if isinstance(value, (list, tuple)) and value and isinstance(value[0], (list, tuple)):
        value = value[0] if len(value) == 1 else None
    if not isinstance(value, (list, tuple)) or not all(isinstance(i, int) for i in value):
        return None
    return [int(i) for i in value]


def _is_messages(value: Any) -> bool:
    return (
        isinstance(value, (list, tuple))
        and bool(value)
        and all(isinstance(m, Mapping) and "role" in m and "content" in m for m in value)
    )


def conversation(raw: Any) -> tuple[list, dict] | None:
    """(messages, apply_chat_template kwargs) of a raw row: a ``messages`` column, or a conversational
    prompt + completion (TRL's formats); None for anything else."""
    if not isinstance(raw, Mapping):
        return None
    kwargs: dict[str, Any] = {}
    tools = raw.get("tools")
    if isinstance(tools, str):
        try:
            tools = json.loads(tools)
        except ValueError:
            tools = None
    if tools:
        kwargs["tools"] = tools
    extra = raw.get("chat_template_kwargs")
    if isinstance(extra, Mapping):
        kwargs.update(extra)
    if _is_messages(raw.get("messages")):
        return list(raw["messages"]), kwargs
    if _is_messages(raw.get("prompt")) and _is_messages(raw.get("completion")):
        return list(raw["prompt"]) + list(raw["completion"]), kwargs
    return None


def sequence_starts(row: lm.Row, bos: int, pad: int | None) -> list[int]:
    """Where each sequence of a row begins: the first real position (after left padding) and, for packed
    rows, every real position where position_ids restart. Empty when the start cannot be told (no
    attention mask and the pad id is the BOS id)."""
    ids = row.input_ids
    if row.attention_mask is not None:
        content = row.content
        if not content:
            return []
        starts = {content[0]}
        real = set(content)
    else:
        if pad is not None and pad == bos:
            return []
        first = 0
        while pad is not None and first < len(ids) and ids[first] == pad:
            first += 1
        if first == len(ids):
            return []
        starts, real = {first}, set(range(first, len(ids)))
    if row.position_ids is not None:
        starts |= {i for i, p in enumerate(row.position_ids) if p == 0 and i in real}
    return sorted(starts)


def compare(content: list[int], ref: list[int], tail_ok: set[int]) -> tuple[str, int]:
    """Compare the real tokens of one training sequence with the template's tokens: ('match' | 'prefix' |
    'differ', index of the first difference). Equal followed only by EOS/pad ids is a match; 'prefix'
    means the training sequence stops inside the template's (truncation, when it is a longest row)."""
    k = 0
    while k < len(content) and k < len(ref) and content[k] == ref[k]:
        k += 1
    if k == len(ref):
        return ("match" if all(t in tail_ok for t in content[k:]) else "differ"), k
    if k == len(content):
        return "prefix", k
    return "differ", k


def _content(row: lm.Row, start: int, end: int) -> list[int]:
    """The real tokens of ``row[start:end]``: those the attention mask keeps (all without a mask)."""
    if row.attention_mask is None:
        return row.input_ids[start:end]
    return [row.input_ids[p] for p in range(start, end) if row.attention_mask[p]]


def _template_source(tok: Any) -> str:
    template = getattr(tok, "chat_template", None)
    if isinstance(template, Mapping):
        template = template.get("default") or next(iter(template.values()), "")
    return template if isinstance(template, str) else ""


def captions(batches: list[dict], rows: list[lm.Row]) -> str | None:
    """The image key of batches whose token ids are captions (images beside them, no labels), else None."""
    keys = {k for b in batches for k in b}
    image = next((k for k in IMAGE_KEYS if k in keys), None)
    return image if image is not None and all(r.labels is None for r in rows) else None


def _chat_not_judged(ctx: Any, sample: Any, rows: list[lm.Row]) -> tuple[str, bool]:
    """(why no conversation was compared, whether that is because the data has none) when the sampled raw
    rows carry no conversation."""
    view = raw_view(ctx, sample)
    if view is None:  # a bare dataloader
        return f"no conversations L12 can see: {unmatched(sample)}", False
    if any(conversation(r) is not None for r in view.rows):  # rows the batches cannot be matched to
        return f"the data holds conversations, but {unmatched(sample)}", False
    if view.pre_tokenized():
        if not view.aligned:
            return f"no conversations L12 can see: {unmatched(sample)}", False
        if packed_examples(sample) or not locate(sample, rows):
            return (
                "the sampled rows pack several examples each: no raw conversation can be matched to its tokens",
                False,
            )
        if raw_given(ctx):
            return "the rows of dlcheck_raw_dataset hold token ids only: no conversation L12 can see", False
        return (
            "the examples hold token ids only; if they were conversations before tokenization, define "
            "dlcheck_raw_dataset with those rows, in the same order",
            False,
        )
    return "the sampled examples carry no conversations ('messages', or a conversational prompt + completion)", True


def _adds_bos(tok: Any, bos: int) -> bool:
    try:
        ids = tok("a")["input_ids"]
        return bool(ids) and ids[0] == bos
    except Exception:
        return False


@check(
    "L12",
    domain="llm",
    title="doubled BOS, or a training chat format that differs from inference",
    roles=("tokenizer", "dataloader"),
    optional_roles=("raw_dataset",),
    settings=(
        Setting(
            "max_mismatch_share",
            0.0,
            "share of sampled conversations allowed to tokenize differently from "
            "tokenizer.apply_chat_template; 0 because a pipeline renders every conversation the same way, so "
            "one difference is the pipeline's format, not an accident of one example",
        ),
    ),
)
def check_chat_format(dlcheck):
    """No sequence starts with two BOS tokens; training conversations tokenize as apply_chat_template does.

    What it does
        On the sampled training batches, looks at the first real token of every sequence (after left
        padding; every document of a packed row) and fails when it and the next are both the
        tokenizer's BOS. When the raw examples carry conversations (a ``messages`` column, or a
        conversational prompt + completion) and the tokenizer has a chat template, tokenizes each
        one with ``tokenizer.apply_chat_template(messages, tokenize=True)`` (what inference, pipelines
        and serving do) and compares the tokens with the training row: equal, or equal followed only
        by EOS/pad, or a truncated prefix of it, passes.
    Why it is bad
        A chat template that writes the BOS text itself (``{{ bos_token }}``), rendered to text and then
        tokenized with ``add_special_tokens=True``, gets a second BOS from the tokenizer's
        post-processor: every training example starts with ``<s><s>``, a context the model never sees at
        inference. A hand-written prompt format ("### User: ...") trains the model on role markers
        that ``apply_chat_template`` at inference never produces, so the fine-tuned behaviour does not
        show up in deployment.
    Example
        text = tok.apply_chat_template(messages, tokenize=False)   # starts with '<s>'
        ids = tok(text)["input_ids"]                                # [1, 1, ...]: '<s><s>'
    Use instead
        ids = tok.apply_chat_template(messages, tokenize=True)["input_ids"], or
        tok(text, add_special_tokens=False); TRL's SFTTrainer on a "messages" column does this.
    Known problems
        The chat comparison needs the raw conversations: from dlcheck_trainer (its train dataset keeps
        the messages column), or dlcheck_raw_dataset aligned with dlcheck_dataset. It compares text
        conversations with tokenizers; processors (VLMs) get the BOS check only. A pipeline that
        appends EOS after the template's end-of-turn token passes. When the BOS id is also the EOS id
        (GPT-2), two in a row are a document boundary in packed text, so the BOS check is off.
        Batches drawn from a dataloader alone cannot be matched to their conversations: the chat
        comparison then needs dlcheck_collator + dlcheck_dataset (or a Trainer).
    Not applicable
        Caption token ids beside images (text-to-image or CLIP training: batches with pixel_values
        and no labels). Tokenizers without a distinct BOS token (none, or BOS == EOS) on data without
        conversations, or with conversations but no chat template to compare them with (or a
        processor): there is neither a BOS to double nor a template to match. Models that never
        generate (masked LMs, sequence and token classifiers: BERT's [CLS] is no BOS, and no chat
        template is read), decided from the objects (checks.llm.common.pipeline_kind).
    """
    role = dlcheck.role("tokenizer")
    tok = lm.text_tokenizer(role)
    sample = token_sample(dlcheck)
    rows = lm.rows(sample.batches)
    image = captions(sample.batches, rows)
    if image is not None:
        dlcheck.not_applicable(
            f"the batches of {sample.source} pair token ids with {image!r} and carry no labels: the ids are captions "
            "conditioning an image model (text-to-image, CLIP), not a language model's training text"
        )
    kind = pipeline_kind(dlcheck)
    if not kind.generates:  # an encoder's [CLS] is no BOS, and it reads no chat template
        kind.not_for(dlcheck, "the BOS and chat template of models that generate (causal and seq2seq LMs)")
    bos = lm.special_id(tok, "bos")
    pad = lm.special_id(tok, "pad")
    eos = lm.special_id(tok, "eos")

    # 1. doubled BOS --------------------------------------------------------------------------------
    doubled, seen, single = [], 0, 0
    # with bos == eos (GPT-2 style) two of them in a row are also a document end and the next start
    if bos is not None and bos != eos:
        for row in rows:
            for s in sequence_starts(row, bos, pad):
                seen += 1
                single += row.input_ids[s] == bos
                if s + 1 < len(row.input_ids) and row.input_ids[s] == bos and row.input_ids[s + 1] == bos:
                    if row.attention_mask is None or row.attention_mask[s + 1]:
                        doubled.append((row, s))

    # 2. chat format --------------------------------------------------------------------------------
    convs = {}
    if sample.raw_rows is not None:
        for i, raw in enumerate(sample.raw_rows):
            conv = conversation(raw)
            if conv is not None:
                convs[i] = conv
    template = _template_source(role) or _template_source(tok)
    is_processor = role is not tok
    differ, judged, truncated, failed_render = [], 0, 0, 0
    if convs and template and not is_processor:
        where = locate(sample, rows)
        tail_ok = {t for t in (eos, pad) if t is not None}
        longest = max((len(_content(r, 0, len(r.input_ids))) for r in rows), default=0)
        for i, (messages, kwargs) in convs.items():
            if i not in where:
                continue
            try:
                ref = _flat_ids(tok.apply_chat_template(messages, tokenize=True, **kwargs))
            except Exception:
                ref = None
            if not ref:
                failed_render += 1
                continue
            row, s, e = where[i]
            content = _content(row, s, e)
            if row.attention_mask is None and pad is not None and ref[0] != pad:
                while content and content[0] == pad:  # left padding without a mask
                    content = content[1:]
            verdict, k = compare(content, ref, tail_ok)
            if verdict == "prefix" and (len(content) >= longest or e - s < len(row.input_ids)):
                truncated += 1  # a longest row (or a packed row's cut document) stopping inside the template
                continue
            judged += 1
            if verdict != "match":
                differ.append((row, content, ref, k))

    if doubled:
        row, s = doubled[0]
        bos_text = lm.token_text(tok, bos)
        content = [row.input_ids[p] for p in row.content] if row.attention_mask is not None else row.input_ids[s:]
        evidence = [
            f"{len(doubled)} of {seen} sampled sequences start with two BOS tokens {bos_text!r} (id {bos})",
            f"example {row.batch}.{row.index}: {lm.decode(tok, content)}  ids {row.input_ids[s : s + 4]} …",
        ]
        if differ:
            evidence.append(
                f"also: {len(differ)} of {judged} sampled conversations tokenize differently from "
                f"tokenizer.apply_chat_template(messages)"
            )
        adds = _adds_bos(tok, bos)
        template_bos = bool(template) and ("bos_token" in template or (bos_text and bos_text in template))
        if template_bos and adds:
            cause = (
                f"the chat template writes the BOS text itself ({'{{ bos_token }}' if 'bos_token' in template else bos_text}) "
                f"and the rendered text was tokenized with add_special_tokens=True, so the tokenizer's "
                f"post-processor prepends a second {bos_text!r}"
            )
            fix = (
                "tokenize with tokenizer.apply_chat_template(messages, tokenize=True), or tokenize the rendered "
                "text with tokenizer(text, add_special_tokens=False)"
            )
        elif adds:
            cause = (
                f"the text already starts with the BOS text {bos_text!r} (prepended by hand or by a template) and the "
                f"tokenizer's post-processor prepends another"
            )
            fix = "stop prepending tokenizer.bos_token to the text, or tokenize it with add_special_tokens=False"
        else:
            cause = (
                f"the pipeline prepends {bos_text!r} twice: once in the text or ids, once when tokenizing or collating"
            )
            fix = "prepend BOS in one place only: tokenize with add_special_tokens=False when the text already has it"
        dlcheck.fail(evidence, cause, fix)

    if differ and len(differ) / judged > dlcheck.setting("max_mismatch_share"):
        row, content, ref, k = differ[0]
        got = content[k] if k < len(content) else None
        want = ref[k] if k < len(ref) else None
        show = lambda t: "end of sequence" if t is None else f"{lm.token_text(tok, t)!r}({t})"  # noqa: E731
        evidence = [
            f"{len(differ)} of {judged} sampled conversations tokenize differently in training than with "
            f"tokenizer.apply_chat_template(messages, tokenize=True)",
            f"example {row.batch}.{row.index}, first difference at token {k}: training {show(got)}, template {show(want)}",
            f"training: {lm.decode(tok, content)}",
            f"template: {lm.decode(tok, ref)}",
        ]
        if bos is not None and content[:1] == [bos] and content[1 : len(ref) + 1] == ref:
            cause = (
                f"the training tokenization adds a BOS {lm.token_text(tok, bos)!r} (add_special_tokens=True) that "
                f"apply_chat_template does not, so inference prompts lack the token every training example starts with"
            )
            fix = (
                "tokenize the rendered conversation with add_special_tokens=False, or use "
                "tokenizer.apply_chat_template(messages, tokenize=True)"
            )
        elif bos is not None and ref[:1] == [bos] and ref[1 : len(content) + 1] == content[: len(ref) - 1]:
            cause = (
                f"the chat template starts with BOS {lm.token_text(tok, bos)!r} but the training tokens do not: "
                "the pipeline dropped it (add_special_tokens=False on text rendered without it)"
            )
            fix = "tokenize with tokenizer.apply_chat_template(messages, tokenize=True)"
        else:
            cause = (
                "the training pipeline renders conversations with its own format, not the tokenizer's chat template, "
                "so the model learns role markers that inference (apply_chat_template, pipelines, serving) never sends"
            )
            fix = (
                "render training conversations with tokenizer.apply_chat_template(messages, tokenize=True) (TRL "
                "SFTTrainer on a 'messages' column does this), or set tokenizer.chat_template to the training "
                "format and save it with the model"
            )
        dlcheck.fail(evidence, cause, fix)

    # 3. what was judged ----------------------------------------------------------------------------
    bos_na = bos is None or bos == eos  # no distinct BOS that could be doubled
    bos_why = (
        "the tokenizer has no BOS token"
        if bos is None
        else f"the BOS token is also the EOS ({lm.token_text(tok, bos)!r}), so a doubled BOS cannot be told from a document end"
        if bos == eos
        else "no sequence start can be told (no attention_mask, and the pad id is the BOS id)"
    )
    chat_na = False
    if convs and is_processor:
        chat_why, chat_na = (
            "the tokenizer is a processor: conversations of a multimodal pipeline are not compared",
            True,
        )
    elif convs and not template:
        chat_why, chat_na = "the tokenizer has no chat template to compare the conversations with", True
    elif convs:
        chat_why = f"{truncated} truncated, {failed_render} not renderable, none located in the batches"
    else:
        chat_why, chat_na = _chat_not_judged(dlcheck, sample, rows)
    if not seen and not judged:
        reason = f"{bos_why}; and no conversation compared: {chat_why}"
        if bos_na and chat_na:
            dlcheck.not_applicable(reason)
        dlcheck.skip(reason)
    lines = []
    if seen:
        lines.append(
            f"BOS: 0 of {seen} sampled sequences start with two BOS tokens {lm.token_text(tok, bos)!r} (id {bos}); "
            f"{single} start with one"
        )
    else:
        lines.append(f"BOS: not judged, {bos_why}")
        if not bos_na:
            dlcheck.not_judged("BOS", bos_why)
    if judged:
        lines.append(
            f"chat format: {judged - len(differ)} of {judged} sampled conversations tokenize as "
            "tokenizer.apply_chat_template(messages, tokenize=True)"
            + (f"; {truncated} truncated inside the template left out" if truncated else "")
        )
    else:
        lines.append(f"chat format: not judged, {chat_why}")
        if not chat_na:
            dlcheck.not_judged("chat format", chat_why)
    dlcheck.measured(
        *lines, sequences=seen, doubled_bos=0, conversations=judged, differ=len(differ), truncated=truncated
    )
