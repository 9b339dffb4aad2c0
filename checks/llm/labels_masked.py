"""L2: labels are -100 on padding and, under completion-only training, on the prompt.

The first half of this module is the per-example analysis L2 and L13 share (which collated tokens belong
to which sampled example, which of them are supervised, where the prompt ends, whether the example was
cut); it is computed once per sample and tokenizer through ``dlcheck.memo``. It belongs in
``checks/llm/common.py`` once the lead integrates it."""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from ...guard import preserved_tokenizer
from ...registry import Setting, check
from ...sampling import Sample
from ..shared import lm
from .common import labelled_rows, packed_examples, pipeline_kind, raw_given, raw_view, token_sample, unmatched

# --------------------------------------------------------------------------------------------------
# shared analysis (L2, L13)

PROMPT_COMPLETION, MESSAGES, COMPLETION_MASK, ASSISTANT_MASKS, TEXT = (
    "prompt/completion",
    "messages",
    "completion_mask",
    "assistant_masks",
    "text",
)
#: the kinds that carry a prompt/completion (or user/assistant) split
SPLIT_KINDS = (PROMPT_COMPLETION, MESSAGES, COMPLETION_MASK, ASSISTANT_MASKS)


@dataclass
class Example:
    """One sampled example inside the collated batches, with what its raw row says about it."""

    row: lm.Row
    #: row positions of this example's real tokens, in order
    positions: list[int]
    #: index into ``Sample.rows`` / ``Sample.raw_rows``, None when unknown (dataloader batches)
    index: int | None
    raw: Any = None
    #: its position in the dataset, when known
    position: int | None = None
    #: the row positions whose label is a training target (label shift undone; position 0 dropped for
    #: aligned labels, since a causal LM never predicts the first token)
    targets: list[int] = field(default_factory=list)
    kind: str | None = None
    #: positions of this example that hold prompt (non-completion / non-assistant) tokens; None: unknown
    prompt_side: list[int] | None = None
    prompt_text: str = ""
    #: the completion (or the assistant turns) as text, for evidence
    expected: str = ""
    #: tokens of the prompt alone, when known (after a processor expanded its image placeholders)
    n_prompt: int | None = None
    #: tokens of the prompt tokenized as text, image placeholders not expanded (set only when the
    #: processor's expansion made the prompt longer)
    n_prompt_text: int | None = None
    #: the example's complete tokenization (prompt+completion, text, conversation), when known
    full: list[int] | None = None
    #: another candidate for ``full`` (prompt and completion tokenized apart), when there is one
    alt_full: list[int] | None = None
    #: how the collated tokens relate to ``full``: "none" (complete), "end" (the end is cut), "start"
    #: (the start is cut), None (unknown)
    cut: str | None = None
    #: positions of the tokens inside each assistant turn's text, turn by turn (messages data; turns
    #: holding no whole token, or cut away, left out); None: unknown
    assistant_turns: list[list[int]] | None = None
    #: example-local index of the token that merges the prompt's trailing whitespace with the completion's
    #: first word (tokenizer(prompt) is then no prefix of the example), None when there is none
    merged: int | None = None

    @property
    def ids(self) -> list[int]:
        return [self.row.input_ids[p] for p in self.positions]


@dataclass
class Analysis:
    examples: list[Example]
    #: 1 when labels are pre-shifted (labels[i] == input_ids[i + 1]), else 0
    shift: int
    #: whether the pipeline ends sequences with EOS (some sampled example does)
    appends_eos: bool


def tokenizer_of(tok: Any) -> Any:
    """The text tokenizer of a tokenizer or processor."""
    inner = getattr(tok, "tokenizer", None)
    return inner if inner is not None and callable(inner) else tok


def _as_ids(value: Any) -> list[int] | None:
    if value is None:
        return None
    if isinstance(value, Mapping) or hasattr(value, "keys"):
        value = value["input_ids"]
    if hasattr(value, "tolist"):
        value = value.tolist()
    if value and isinstance(value[0], (list, tuple)):
        value = value[0]
    return [int(v) for v in value]


def encode(tok: Any, text: str, special: bool = True) -> list[int] | None:
    try:
        return _as_ids(tokenizer_of(tok)(text, add_special_tokens=special))
    except Exception:
        return None


def placeholder_ids(tok: Any) -> set[int]:
    """The image/video placeholder ids of a processor (``image_token_id``, or its ``image_token`` looked up
    in its tokenizer); empty for a text tokenizer."""
    t = tokenizer_of(tok)
    if t is tok:
        return set()
    out: set[int] = set()
    for kind in ("image", "video"):
        value = getattr(tok, f"{kind}_token_id", None)
        if not isinstance(value, int):
            token = getattr(tok, f"{kind}_token", None)
            try:
                value = t.convert_tokens_to_ids(token) if isinstance(token, str) else None
            except Exception:
                value = None
        if isinstance(value, int) and value != getattr(t, "unk_token_id", None):
            out.add(value)
    return out


def raw_images(raw: Any) -> list | None:
    """The images of a raw vision-language row (TRL's "images" list, or one "image")."""
    if not isinstance(raw, Mapping):
        return None
    images = raw.get("images", raw.get("image"))
    if images is None:
        return None
    return list(images) if isinstance(images, (list, tuple)) else [images]


def expand(tok: Any, text: str, raw: Any, special: bool = True) -> list[int] | None:
    """``text`` as the processor ``tok`` tokenizes it with the raw row's images: each image placeholder
    expanded into the image's tokens (None for a text tokenizer, a row without images, or a processor
    that refuses the call)."""
    images = raw_images(raw)
    if not images or not placeholder_ids(tok):
        return None
    try:
        return _as_ids(tok(text=[text], images=[images], add_special_tokens=special))
    except Exception:
        return None


def chat_encode(tok: Any, messages: list, **kwargs: Any) -> Any:
    """apply_chat_template as a dict (input_ids, maybe assistant_masks), or None without a template."""
    t = tokenizer_of(tok)
    if not getattr(t, "chat_template", None):
        return None
    try:
        out = t.apply_chat_template(messages, tokenize=True, return_dict=True, **kwargs)
        return {k: (v.tolist() if hasattr(v, "tolist") else list(v)) for k, v in out.items()}
    except Exception:
        return None


def text_of(tok: Any, ids: Sequence[int]) -> str:
    """Decoded text with special tokens kept; token by token when decoding fails (ids past the vocabulary
    are L3's to report)."""
    try:
        return tokenizer_of(tok).decode([int(i) for i in ids], skip_special_tokens=False)
    except Exception:
        return " ".join(lm.token_text(tok, i) for i in ids)


def common_prefix(a: Sequence[int], b: Sequence[int]) -> int:
    n = 0
    for x, y in zip(a, b):
        if x != y:
            break
        n += 1
    return n


def _tolist(value: Any) -> list[list[Any]] | None:
    if value is None:
        return None
    if hasattr(value, "tolist"):
        value = value.tolist()
    if isinstance(value, (list, tuple)) and value and not isinstance(value[0], (list, tuple)):
        return [list(value)]
    return [list(v) for v in value]


def label_shift(rows: Sequence[lm.Row]) -> int:
    """1 when the labels are pre-shifted for the loss (labels[i] == input_ids[i+1]), 0 when aligned with
    input_ids as transformers models expect (they shift inside the loss)."""
    aligned = shifted = 0
    for row in rows:
        if row.labels is None:
            continue
        n = len(row.input_ids)
        for i in row.supervised:
            aligned += row.labels[i] == row.input_ids[i]
            shifted += i + 1 < n and row.labels[i] == row.input_ids[i + 1]
    return 1 if shifted > aligned else 0


def row_targets(row: lm.Row, shift: int) -> list[int]:
    """Positions whose token is a training target."""
    if row.labels is None:
        return []
    n = len(row.input_ids)
    out = [i + shift for i in row.supervised if i + shift < n]
    return [t for t in out if t > 0] if shift == 0 else out


def label_position(t: int, shift: int) -> int:
    return t - shift


def mask_is_flat(row: lm.Row) -> bool:
    m = row.attention_mask
    return m is not None and (not m or isinstance(m[0], (int, bool)))


def _units(row: lm.Row) -> list[list[int]]:
    """The examples in a collated row: one, or the documents of a packed row (position_ids restarts)."""
    content = set(row.content) if mask_is_flat(row) else set(range(len(row.input_ids)))
    packed = row.position_ids is not None and bool(row.position_ids) and isinstance(row.position_ids[0], int)
    spans = row.documents() if packed else [(0, len(row.input_ids))]
    out = [[p for p in range(s, e) if p in content] for s, e in spans]
    return [u for u in out if u]


def examples_of(sample: Sample, rows: list[lm.Row]) -> list[Example]:
    """Every sampled example as it sits in the collated batches, mapped back to its (raw) row when the
    sample knows which rows each batch was collated from."""
    by_batch: dict[int, list[lm.Row]] = {}
    for row in rows:
        by_batch.setdefault(row.batch, []).append(row)
    raw_rows = sample.raw_rows if sample.raw_rows is not None else sample.rows
    out: list[Example] = []
    for b, brows in sorted(by_batch.items()):
        units = [(row, u) for row in brows for u in _units(row)]
        group = sample.batch_rows[b] if sample.batch_rows is not None and b < len(sample.batch_rows) else None
        mapped = group is not None and len(units) == len(group)
        for k, (row, u) in enumerate(units):
            index = group[k] if mapped else None
            raw = raw_rows[index] if index is not None and raw_rows is not None and index < len(raw_rows) else None
            position = sample.positions[index] if index is not None and sample.positions is not None else None
            out.append(Example(row, u, index, raw, position=position))
    return out


class Decoded:
    """Character spans of tokens, from decoding prefixes (binary searched, so a few decodes per span)."""

    def __init__(self, tok: Any, ids: Sequence[int]):
        self.tok = tokenizer_of(tok)
        self.ids = list(ids)
        self._len: dict[int, int] = {}
        self.text = self._decode(len(self.ids))

    def _decode(self, k: int) -> str:
        return self.tok.decode(self.ids[:k], skip_special_tokens=False, clean_up_tokenization_spaces=False)

    def prefix_len(self, k: int) -> int:
        if k not in self._len:
            self._len[k] = len(self._decode(k))
        return self._len[k]

    def tokens_within(self, a: int, b: int) -> list[int]:
        """Indices of the tokens whose text lies entirely inside characters [a, b)."""
        n = len(self.ids)
        lo, hi = 0, n
        while lo < hi:  # first k whose start >= a
            mid = (lo + hi) // 2
            if self.prefix_len(mid) >= a:
                hi = mid
            else:
                lo = mid + 1
        start = lo
        lo, hi = start, n
        while lo < hi:  # last k whose end (prefix_len(k + 1)) <= b
            mid = (lo + hi + 1) // 2
            if self.prefix_len(mid) <= b:
                lo = mid
            else:
                hi = mid - 1
        return list(range(start, lo))


def _content_text(content: Any) -> str:
    if isinstance(content, str):
        return content
    if isinstance(content, list):  # multimodal content parts
        return "".join(p.get("text", "") for p in content if isinstance(p, Mapping) and isinstance(p.get("text"), str))
    return ""


def _is_messages(value: Any) -> bool:
    return (
        isinstance(value, list)
        and bool(value)
        and all(isinstance(m, Mapping) and "role" in m and "content" in m for m in value)
    )


def raw_kind(raw: Any) -> str | None:
    """What a raw row says about its example: a prompt/completion (or user/assistant) split, or text."""
    if not isinstance(raw, Mapping):
        return None
    if "prompt" in raw and "completion" in raw:
        return PROMPT_COMPLETION
    if _is_messages(raw.get("messages")):
        return MESSAGES
    if "completion_mask" in raw and "input_ids" in raw:
        return COMPLETION_MASK
    if "assistant_masks" in raw and "input_ids" in raw:
        return ASSISTANT_MASKS
    if isinstance(raw.get("text"), str):
        return TEXT
    return None


def _spans_in(text: str, pieces: Sequence[tuple[bool, str]]) -> list[tuple[bool, int, int]] | None:
    """Locate each (is_prompt_side, piece) in order in ``text``; None if one is missing."""
    out, cursor = [], 0
    for side, piece in pieces:
        if not piece.strip():
            continue
        at = text.find(piece, cursor)
        if at < 0:
            piece = piece.strip()
            at = text.find(piece, cursor)
            if at < 0:
                return None
        out.append((side, at, at + len(piece)))
        cursor = at + len(piece)
    return out


def _text_prompt_side(tok: Any, ids: list[int], pieces: Sequence[tuple[bool, str]]) -> list[int] | None:
    """Token indices lying entirely inside the prompt-side pieces' text, the pieces located in order in
    the decoded example (conservative: template tokens between them are not judged). A truncated
    example is judged on the leading pieces it still holds."""
    spans = _text_spans(tok, ids, pieces)
    return None if spans is None else [j for side, within in spans if side for j in within]


def _text_spans(tok: Any, ids: list[int], pieces: Sequence[tuple[bool, str]]) -> list[tuple[bool, list[int]]] | None:
    """(is_prompt_side, token indices lying entirely inside the piece's text) for each piece located."""
    try:
        dec = Decoded(tok, ids)
    except Exception:  # ids the tokenizer cannot decode: not judged here (L3 reports them)
        return None
    spans = _spans_in(dec.text, pieces)
    if spans is None:
        spans = []
        cursor = 0
        for side, piece in pieces:
            at = dec.text.find(piece.strip(), cursor) if piece.strip() else -1
            if at < 0:
                break
            spans.append((side, at, at + len(piece.strip())))
            cursor = at + len(piece.strip())
        if not spans:
            return None
    return [(side, dec.tokens_within(a, b)) for side, a, b in spans]


def _relation(content: list[int], full: list[int]) -> str | None:
    """How the collated tokens relate to the complete tokenization."""
    if not content or not full:
        return None
    for oc, of in ((0, 0), (1, 0), (0, 1), (1, 1)):
        c, f = content[oc:], full[of:]
        if not c or not f:
            continue
        cp = common_prefix(c, f)
        if cp == len(f):
            return "none"
        if cp == len(c):
            return "end"
    for oc in (0, 1):
        c = content[oc:]
        if c and len(c) < len(full) and full[-len(c) :] == c:
            return "start"
    return None


def _set_turns(ex: Example, spans: list[tuple[bool, list[int]]] | None) -> None:
    """The prompt side and the assistant turns of a conversation located in its tokens."""
    if spans is None:
        return
    ex.prompt_side = [j for side, within in spans if side for j in within]
    ex.assistant_turns = [within for side, within in spans if not side and within]


def _analyse_example(tok: Any, ex: Example, specials: set[int], eos: int | None, appends_eos: bool) -> None:
    raw = ex.raw
    ids = ex.ids
    kind = raw_kind(raw)
    ex.kind = kind
    if kind is None:
        return
    if kind in (COMPLETION_MASK, ASSISTANT_MASKS):
        mask, own = raw.get(kind), raw.get("input_ids")
        if mask is None or own is None:
            return
        mask, own = list(mask), [int(i) for i in own]
        o = next(
            (o for o in (0, 1) if len(ids) > o and common_prefix(ids[o:], own) >= min(len(ids) - o, len(own))), None
        )
        if o is None or len(mask) != len(own):
            return
        n = min(len(own), len(ids) - o)
        ex.prompt_side = [o + j for j in range(n) if not mask[j] and ids[o + j] not in specials]
        ex.expected = text_of(tok, [own[j] for j in range(len(own)) if mask[j]])
        ex.full, ex.n_prompt = own, next((j for j, m in enumerate(mask) if m), len(mask))
    elif kind == PROMPT_COMPLETION:
        prompt, completion = raw["prompt"], raw["completion"]
        if isinstance(prompt, str) and isinstance(completion, str):
            ex.prompt_text, ex.expected = prompt, completion
            best = None
            # the prompt may start after tokens the collator put first (a BOS, a template's specials), never
            # after text: a prompt of whitespace the tokenizer merged into the completion's first word is
            # not found one token later
            lead = set(getattr(tokenizer_of(tok), "all_special_ids", []) or []) | placeholder_ids(tok)
            # a processor expands each image placeholder of the prompt into the image's N tokens: the
            # prompt as the collated example holds it is the processor's, not the tokenizer's
            for special in (True, False):
                for expanded in (True, False):
                    p = expand(tok, prompt, raw, special) if expanded else encode(tok, prompt, special)
                    if not p:
                        continue
                    for o in (0, 1, 2):
                        if o and not all(t in lead for t in ids[:o]):
                            continue
                        cp = common_prefix(p, ids[o:])
                        whole = cp >= max(1, len(p) - 1) or (cp and cp == len(ids) - o)
                        if whole and (best is None or cp > best[1]):
                            best = (o, cp, len(p), expanded)
            if best is not None:
                o, cp, n_prompt, expanded = best
                ex.prompt_side = [o + j for j in range(cp) if ids[o + j] not in specials]
                ex.n_prompt = n_prompt
                if cp < n_prompt and o + cp < len(ids) and prompt[-1:].isspace() and completion[:1].isalnum():
                    ex.merged = o + cp
                if expanded:
                    ex.n_prompt_text = len(encode(tok, prompt) or []) or None
            else:
                ex.prompt_side = _text_prompt_side(tok, ids, [(True, prompt), (False, completion)])
                ex.n_prompt = len(encode(tok, prompt) or []) or None
            ex.full = encode(tok, prompt + completion)
            # a collator may tokenize the two parts apart and concatenate them
            p, c = encode(tok, prompt), encode(tok, completion, special=False)
            ex.alt_full = p + c if p and c else None
        elif _is_messages(prompt) and _is_messages(completion):
            pieces = [(m["role"] != "assistant", _content_text(m["content"])) for m in prompt + completion]
            ex.prompt_text = " | ".join(t for side, t in pieces if side)
            ex.expected = " | ".join(_content_text(m["content"]) for m in completion)
            # the prompt's assistant turns are context here (masked by design): no assistant turns judged
            ex.prompt_side = _text_prompt_side(tok, ids, pieces)
            p = chat_encode(tok, prompt, add_generation_prompt=True)
            ex.n_prompt = len(p["input_ids"]) if p else None
            full = chat_encode(tok, prompt + completion)
            ex.full = full["input_ids"] if full else None
    elif kind == MESSAGES:
        msgs = raw["messages"]
        pieces = [(m["role"] != "assistant", _content_text(m["content"])) for m in msgs]
        ex.prompt_text = " | ".join(t for side, t in pieces if side)
        ex.expected = " | ".join(t for side, t in pieces if not side)
        _set_turns(ex, _text_spans(tok, ids, pieces))
        full = chat_encode(tok, msgs)
        ex.full = full["input_ids"] if full else None
    elif kind == TEXT:
        ex.full = encode(tok, raw["text"])
    for full in (ex.full, ex.alt_full):
        if not full:
            continue
        if appends_eos and eos is not None and full[-1] != eos:
            full = full + [eos]  # the pipeline ends every sequence with EOS (some sampled one shows it)
        cut = _relation(ids, full)
        if cut is not None:
            ex.full, ex.cut = full, cut
            break


def analyse(ctx: Any, sample: Sample, tok: Any) -> Analysis:
    """The shared per-example analysis of the sample (memoised per sample and tokenizer)."""

    def make() -> Analysis:
        rows = lm.rows(sample.batches)
        shift = label_shift(rows)
        examples = examples_of(sample, rows)
        eos = lm.special_id(tok, "eos")
        placeholders = placeholder_ids(tok)
        # image placeholders are prompt tokens (never a completion's): judged, though a processor's are special
        specials = set(getattr(tokenizer_of(tok), "all_special_ids", []) or []) - placeholders
        appends_eos = eos is not None and any(ex.ids and ex.ids[-1] == eos for ex in examples)
        with preserved_tokenizer(tok):
            for ex in examples:
                own = set(ex.positions)
                ex.targets = [t for t in row_targets(ex.row, shift) if t in own]
                _analyse_example(tok, ex, specials, eos, appends_eos)
                if ex.prompt_side is not None and ex.kind in SPLIT_KINDS:
                    ids = ex.ids
                    side = set(ex.prompt_side) | {j for j, t in enumerate(ids) if t in placeholders}
                    # example-local indices -> row positions (left padding, packed rows)
                    ex.prompt_side = [ex.positions[j] for j in sorted(side) if j < len(ex.positions)]
                    if ex.assistant_turns is not None:
                        ex.assistant_turns = [
                            [ex.positions[j] for j in turn if j < len(ex.positions)] for turn in ex.assistant_turns
                        ]
        return Analysis(examples, shift, appends_eos)

    return ctx.memo((sample, tok), "llm:label-analysis", make)


def example_name(ex: Example) -> str:
    where = f" (dataset row {ex.position})" if ex.position is not None else ""
    return f"example {ex.row.batch}.{ex.row.index}{where}"


def short(text: str, limit: int = 100) -> str:
    if len(text) > limit:
        text = text[: limit // 2 - 2] + " … " + text[-(limit // 2 - 2) :]
    return repr(text)


# --------------------------------------------------------------------------------------------------
# L2


def _pad_positions(row: lm.Row, pad: int | None, eos: int | None) -> list[int] | None:
    """Padding positions: attention_mask 0 (never the pad id, which may be the EOS); without a mask,
    leading/trailing runs of a pad id distinct from EOS; None when padding cannot be told."""
    if mask_is_flat(row):
        return [i for i, m in enumerate(row.attention_mask) if not m]
    if row.attention_mask is not None or pad is None or pad == eos or row.position_ids is not None:
        return None
    ids = row.input_ids
    n = len(ids)
    lead = next((i for i, t in enumerate(ids) if t != pad), n)
    trail = next((i for i, t in enumerate(reversed(ids)) if t != pad), n)
    return sorted(set(range(lead)) | set(range(n - trail, n)))


def _prompt_opt_out(ctx: Any, kinds: set[str]) -> str | None:
    if not ctx.setting("completion_only"):
        return "L2.completion_only is false"
    args = ctx.role("training_args") if ctx.has("training_args") else None
    if args is None:
        return None
    if kinds & {PROMPT_COMPLETION, COMPLETION_MASK} and getattr(args, "completion_only_loss", None) is False:
        return f"{type(args).__name__}(completion_only_loss=False)"
    if kinds & {MESSAGES, ASSISTANT_MASKS} and getattr(args, "assistant_only_loss", None) is False:
        return f"{type(args).__name__}(assistant_only_loss=False)"
    return None


NO_SPLIT = "the data has no prompt/completion or messages split"


def _prompt_not_judged(ctx: Any, sample: Sample, examples: list[Example], kinds: set[str], opt_out: str | None) -> str:
    """Why the prompt half judged nothing: completion-only training is off, the prompts could not be located,
    the split exists in the raw data but not in rows matched to the batches, or there is no split at all."""
    if opt_out:
        return f"completion-only training is off ({opt_out})"
    if kinds:
        return f"the prompt of no sampled {'/'.join(sorted(kinds))} example could be located in its tokens"
    view = raw_view(ctx, sample)
    split = view is not None and any(raw_kind(r) in SPLIT_KINDS for r in view.rows)
    if split and not view.aligned:
        return unmatched(sample)
    if split:
        return "the sampled rows pack several examples each, so no raw example can be matched to its tokens"
    if view is None:  # a bare dataloader
        return f"{NO_SPLIT} that L2 can see: {unmatched(sample)}"
    if view.pre_tokenized():
        if not view.aligned:
            return f"{NO_SPLIT} that L2 can see: {unmatched(sample)}"
        if packed_examples(sample) or not any(ex.index is not None for ex in examples):
            return "the sampled rows pack several examples each, so no raw example can be matched to its tokens"
        if raw_given(ctx):
            return f"{NO_SPLIT} that L2 can see: the rows of dlcheck_raw_dataset hold token ids only"
        return (
            f"{NO_SPLIT} that L2 can see: the examples hold token ids only; if they were prompt/completion or "
            "messages before tokenization, define dlcheck_raw_dataset with those rows, in the same order"
        )
    if view.other_text():
        # a split there may be, under names of the user's own: not seen, not "none"
        return (
            f"no prompt/completion or messages split that L2 can see: the raw examples hold their text in "
            f"{', '.join(view.other_text())}, none of the fields L2 reads as one ('prompt'/'completion', "
            "'messages'/'conversations', 'chosen'/'rejected'); which of them is the prompt is the script's own choice"
        )
    return NO_SPLIT


def _placeholder_text(tok: Any, placeholders: set[int]) -> str:
    token = getattr(tok, "image_token", None)
    if isinstance(token, str):
        return token
    return "/".join(sorted(lm.token_text(tok, t) for t in placeholders)) or "the image placeholder"


def _placeholder_note(tok: Any, prompt_bad: list, placeholders: set[int]) -> str | None:
    """Evidence on the supervised image placeholders (a processor's expanded image tokens), if any."""
    if not placeholders:
        return None
    per_example = [sum(1 for t in bad if e.row.input_ids[t] in placeholders) for e, bad in prompt_bad]
    total = sum(per_example)
    if not total:
        return None
    held = [sum(1 for p in e.positions if e.row.input_ids[p] in placeholders) for e, _ in prompt_bad]
    return (
        f"{total} of the supervised prompt positions are image placeholders ({_placeholder_text(tok, placeholders)}, "
        f"{min(held)}-{max(held)} per example after the processor's expansion): the loss asks the language model to "
        "predict the placeholder token where the image features stand"
        if min(held) != max(held)
        else f"{total} of the supervised prompt positions are image placeholders ({_placeholder_text(tok, placeholders)}"
        f" ×{held[0]} per example after the processor's expansion): the loss asks the language model to predict the "
        "placeholder token where the image features stand"
    )


def _counted_before_expansion(prompt_bad: list, shift: int) -> tuple[Example, int] | None:
    """(example, masked tokens) when the examples' prompt masking stops exactly at the length of the prompt
    tokenized as text (image placeholders not expanded), in every failing example that was expanded."""
    expanded = [(e, bad) for e, bad in prompt_bad if e.n_prompt_text and e.n_prompt and e.n_prompt > e.n_prompt_text]
    if not expanded or len(expanded) != len(prompt_bad):
        return None
    for e, bad in expanded:
        first = e.positions.index(bad[0]) if bad[0] in e.positions else None
        if first is None or abs(first - e.n_prompt_text) > 1:
            return None
    e, bad = expanded[0]
    return e, e.positions.index(bad[0])


def _is_hf_lm_collator(collator: Any) -> bool:
    return any(
        c.__module__.startswith("transformers.") and c.__name__ == "DataCollatorForLanguageModeling"
        for c in type(collator).__mro__
    )


@dataclass
class LabelComparison:
    """The collated labels compared with the labels the dataset's examples already carry."""

    #: examples whose own labels mask positions (-100) and were found in the collated rows
    compared: int = 0
    #: positions those labels mask, among the tokens the collated rows hold
    masked: int = 0
    #: (example name, row, [(row position of the token, index of its collated label)]) per example whose masked
    #: positions the collator supervises
    lost: list[tuple[str, lm.Row, list[tuple[int, int]]]] = field(default_factory=list)
    #: whether every supervised masked position carries its own input id (labels rebuilt from input_ids)
    copied: bool = True


def _find(haystack: list[int], needle: list[int]) -> int | None:
    n = len(needle)
    if not n or n > len(haystack):
        return None
    first = needle[0]
    for o in range(len(haystack) - n + 1):
        if haystack[o] == first and haystack[o : o + n] == needle:
            return o
    return None


def _own_shift(ids: list[int], labels: list[int]) -> int:
    aligned = sum(1 for i, v in enumerate(labels) if v != -100 and v == ids[i])
    shifted = sum(1 for i, v in enumerate(labels) if v != -100 and i + 1 < len(ids) and v == ids[i + 1])
    return 1 if shifted > aligned else 0


def compare_dataset_labels(sample: Sample, rows: list[lm.Row], shift: int) -> LabelComparison:
    """Each sampled example that carries its own ``labels`` with -100 in them (a prompt the user masked in the
    dataset), found in the collated rows of its batch: which of the positions it masks the collated labels
    supervise. Examples padded in the dataset are found by their real tokens (attention_mask 1)."""
    out = LabelComparison()
    if not sample.rows or not sample.batch_rows:
        return out
    by_batch: dict[int, list[lm.Row]] = {}
    for row in rows:
        by_batch.setdefault(row.batch, []).append(row)
    for b, indices in enumerate(sample.batch_rows):
        brows = [r for r in by_batch.get(b, []) if r.labels is not None]
        for j, i in enumerate(indices):
            src = sample.rows[i] if i < len(sample.rows) else None
            if not isinstance(src, Mapping) or src.get("labels") is None or src.get("input_ids") is None:
                continue
            ids, given = _as_ids(src.get("input_ids")), _as_ids(src.get("labels"))
            if not ids or not given or len(ids) != len(given) or -100 not in given:
                continue
            mask = _as_ids(src["attention_mask"]) if src.get("attention_mask") is not None else None
            real = [k for k in range(len(ids)) if mask is None or len(mask) != len(ids) or mask[k]]
            if not real or real != list(range(real[0], real[-1] + 1)):
                continue
            ids, given = ids[real[0] : real[-1] + 1], given[real[0] : real[-1] + 1]
            if -100 not in given:  # only the dataset's own padding was masked (padding is judged apart)
                continue
            s = shift - _own_shift(ids, given)
            # its own row first (one example per row), then the other rows of the batch (packed rows)
            order = ([brows[j]] if len(brows) == len(indices) and j < len(brows) else []) + brows
            for row in order:
                o = _find(row.input_ids, ids)
                if o is None:
                    continue
                content = set(row.content) if mask_is_flat(row) else set(range(len(row.input_ids)))
                out.compared += 1
                bad = []
                for k, value in enumerate(given):
                    p, at = o + k, o + k - s  # the token, and the collated label that holds its target
                    if value != -100 or p not in content or not 0 <= at < len(row.labels) or (shift == 0 and at == 0):
                        continue
                    out.masked += 1
                    if row.labels[at] != -100:
                        bad.append((p, at))
                        own = at + shift < len(row.input_ids) and row.labels[at] == row.input_ids[at + shift]
                        out.copied &= own
                if bad:
                    where = f" (dataset row {sample.positions[i]})" if sample.positions is not None else ""
                    out.lost.append((f"example {row.batch}.{row.index}{where}", row, bad))
                break
    return out


def _labels_discarded(dlcheck: Any, comparison: LabelComparison, tok: Any) -> None:
    """The dataset's examples already carry labels with -100 (a prompt the user masked) and the collated batch
    supervises those very positions: the collator replaced the dataset's labels (DataCollatorForLanguageModeling
    rebuilds them from input_ids), so the masking the user did is lost."""
    if not comparison.lost:
        return
    name, row, bad = comparison.lost[0]
    n_lost = sum(len(b) for _, _, b in comparison.lost)
    tokens = [row.input_ids[p] for p, _ in bad]
    collator = dlcheck.role("collator") if dlcheck.has("collator") else None
    if collator is None:
        what = "your collator"
    else:  # a function by its name, a collator object by its class
        what = getattr(collator, "__name__", None) or type(collator).__name__
    if comparison.copied:
        cause = (
            f"the collator rebuilds labels from input_ids ({what} sets labels = input_ids), throwing away the labels "
            "your dataset carries: the masking you did (the prompt at -100) is lost and the model trains on it"
        )
    else:
        cause = (
            f"the collator's labels differ from the labels your dataset carries ({what} replaces them): positions "
            "the dataset masks with -100 are supervised, so the masking you did is lost"
        )
    dlcheck.fail(
        [
            f"{len(comparison.lost)} of {comparison.compared} sampled examples arrive with labels that mask positions "
            f"(-100) and leave the collator with those positions supervised ({n_lost} of the {comparison.masked} "
            "positions the dataset's labels mask)",
            f"{name}: {lm.decode(tok, [row.input_ids[c] for c in row.content])}",
            f"  masked by the dataset, supervised by the collator ({len(bad)} tokens, positions {bad[0][0]}-"
            f"{bad[-1][0]}): {short(text_of(tok, tokens))}",
            f"  collated labels there: {lm.show_labels(tok, row, [at for _, at in bad[:5]])}",
        ],
        cause=cause,
        fix="use a collator that keeps the dataset's labels and only pads them with -100: "
        "DataCollatorForSeq2Seq(tokenizer, padding=True) (or TRL's completion-only training), not "
        "DataCollatorForLanguageModeling(mlm=False); if training on the whole sequence is intended, "
        "--dlcheck-set L2.completion_only=false",
    )


#: the model config's fields naming the placeholder ids the image/video features replace
MODEL_PLACEHOLDERS = ("image_token_id", "image_token_index", "video_token_id", "video_token_index")


def _model_placeholders(ctx: Any, sample: Sample) -> set[int]:
    """The model config's image/video placeholder ids (``image_token_id``, LLaVA's older ``image_token_index``),
    counted only when the batches carry images (pixel_values …): a text-only run of such a model has none."""
    if not any(any("pixel_values" in str(k) or str(k).startswith("image") for k in b) for b in sample.batches):
        return set()  # no image in the batches: the model is not read (a text run of it has no placeholder)
    if not ctx.has("model"):
        return set()
    cfg = getattr(ctx.role("model"), "config", None)
    out = set()
    for name in MODEL_PLACEHOLDERS:
        value = getattr(cfg, name, None)
        if isinstance(value, int) and value >= 0:
            out.add(value)
    return out


def _is_trl_vlm_collator(collator: Any) -> bool:
    return any(
        c.__module__.startswith("trl.") and c.__name__ == "DataCollatorForVisionLanguageModeling"
        for c in type(collator).__mro__
    )


def _placeholder_failure(
    dlcheck: Any,
    tok: Any,
    placeholders: set[int],
    found: tuple[list, int, int],
    opt_out: str | None,
    out: tuple[list, list, list],
) -> None:
    """Evidence, cause and fix for supervised image/video placeholders (``found``: the rows with their supervised
    placeholder positions, all placeholder positions, the label shift)."""
    ph_bad, ph_positions, shift = found
    evidence, causes, fixes = out
    row, bad = ph_bad[0]
    n_bad = sum(len(b) for _, b in ph_bad)
    token = _placeholder_text(tok, placeholders)
    ids = "/".join(str(i) for i in sorted(placeholders))
    values = Counter(r.labels[label_position(t, shift)] for r, b in ph_bad for t in b)
    shown = ", ".join(f"{v} ×{k}" for v, k in values.most_common(3))
    evidence += [
        f"{n_bad} of the {ph_positions} image placeholder positions ({token}, id {ids}) in {len(ph_bad)} sampled "
        f"rows carry labels != -100 (label values there: {shown}): the loss asks the language model to predict the "
        "placeholder token where the image features stand",
        f"example {row.batch}.{row.index}: {lm.decode(tok, [row.input_ids[c] for c in row.content])} "
        f"({len(bad)} supervised placeholders)",
        f"  labels on the placeholders: {lm.show_labels(tok, row, [label_position(t, shift) for t in bad[:4]])}",
    ]
    collator = dlcheck.role("collator") if dlcheck.has("collator") else None
    trl = collator is not None and _is_trl_vlm_collator(collator)
    copied = all(r.labels[label_position(t, shift)] == r.input_ids[t] for r, b in ph_bad for t in b)
    if trl:
        cause = (
            f"TRL's {type(collator).__name__} builds labels = input_ids.clone() and masks only padding (and the "
            "prompt under completion-only / assistant-only training), never the image placeholders"
        )
    elif copied:
        cause = "the collator copies input_ids into labels and masks padding only, not the image placeholders"
    else:
        cause = "labels at the image placeholder positions are not -100"
    if opt_out:
        cause += f"; completion-only training is off ({opt_out}), so no prompt masking removes them either"
    causes.append(cause)
    fixes.append(
        "set labels to -100 where input_ids is the image placeholder, after collating: "
        f"labels[batch['input_ids'] == {min(placeholders)}] = -100 (processor.image_token_id)"
        + (
            f", in a subclass of {type(collator).__name__} (override torch_call) passed as "
            "SFTTrainer(data_collator=...)"
            if trl
            else " in your collator"
        )
        + (
            "; or train on the assistant turns only (SFTConfig(assistant_only_loss=True) with a {% generation %} "
            "template), which masks them with the user turns"
            if opt_out and "assistant_only_loss" in opt_out
            else ""
        )
    )


def _untrained_turns(judged: list[Example]) -> tuple[list[Example], list[tuple[Example, list[bool]]]]:
    """The conversations with two or more assistant turns located in their tokens, and those of them that
    leave a whole assistant turn unsupervised while another turn is supervised (with which turns are)."""
    multi = [ex for ex in judged if ex.assistant_turns is not None and len(ex.assistant_turns) >= 2]
    bad = []
    for ex in multi:
        targets = set(ex.targets)
        trained = [any(p in targets for p in turn) for turn in ex.assistant_turns]
        if any(trained) and not all(trained):
            bad.append((ex, trained))
    return multi, bad


def _turns_pattern(bad: list[tuple[Example, list[bool]]]) -> str | None:
    """ "first" / "last" when every failing conversation trains exactly its first / last assistant turn."""
    if all(trained == [True] + [False] * (len(trained) - 1) for _, trained in bad):
        return "first"
    if all(trained == [False] * (len(trained) - 1) + [True] for _, trained in bad):
        return "last"
    return None


@check(
    "L2",
    domain="llm",
    property_mode=True,
    title="labels not -100 on padding or on the prompt",
    roles=("tokenizer", "dataloader"),
    optional_roles=("raw_dataset", "training_args", "collator"),
    settings=(
        Setting(
            "max_padding_share",
            0.0,
            "share of sampled examples allowed to carry a supervised label on a "
            "padding position (attention_mask 0); 0 because a correct collator never supervises padding, "
            "so one such example is already the bug",
        ),
        Setting(
            "max_prompt_share",
            0.0,
            "share of judged examples allowed to supervise a token of the prompt "
            "(or of a non-assistant turn) under completion-only training; 0 because the prompt boundary is "
            "taken where TRL takes it (common token prefix, boundary merges count as completion) and only "
            "tokens inside the prompt's own text are judged, so a correct collator supervises none",
        ),
        Setting(
            "completion_only",
            True,
            "train on the completion / assistant turns only when the data has a "
            "prompt/completion or messages split; set false when whole-sequence training is intended "
            "(SFTConfig(completion_only_loss=False) / assistant_only_loss=False are read as that too)",
        ),
        Setting(
            "every_assistant_turn",
            True,
            "under assistant-only training every assistant turn of a conversation is trained, as TRL's "
            "assistant_only_loss and apply_chat_template's assistant_masks do: a conversation that trains one "
            "assistant turn and leaves another whole turn at -100 fails; set false when training on the last "
            "(or first) turn only is intended",
        ),
        Setting(
            "max_placeholder_share",
            0.0,
            "share of the image/video placeholder positions of the sampled rows allowed to carry a label != -100, "
            "whatever completion-only training says; 0 because no model is meant to generate a placeholder: a "
            "supervised one is loss spent on predicting the token that stands where the image features go",
        ),
    ),
)
def check_labels_masked(dlcheck):
    """Padding, and the prompt under completion-only training, carry label -100.

    What it does
        On the sampled training batches: every position with attention_mask 0 must have label -100
        (padding is told by the attention mask, never by the pad id, which may be the EOS). When the
        data has a prompt/completion split (raw rows with "prompt" and "completion", a
        "completion_mask" column, or "messages" with roles / an "assistant_masks" column), no token
        of the prompt (or of a system/user turn) may be supervised: the prompt boundary is found as
        TRL finds it (the tokenized prompt as a prefix of the example), or by locating the prompt's
        text in the decoded example; labels pre-shifted by one are recognised. With a vision-language
        processor as dlcheck_tokenizer, the prompt is taken as the processor expands it with the row's
        images (every image placeholder becomes the image's N tokens), so the placeholders and the
        prompt text after them are judged as prompt; a masking that stops at
        len(tokenizer(prompt)), counted before the expansion, is named as such. In a conversation of
        several assistant turns, a turn left entirely at -100 while another turn is trained fails
        (a masker written for single-turn data that trains only the first or the last answer). A
        prompt ending in a space the tokenizer merges into the completion's first word is judged at
        TRL's boundary (the merged token is the completion's). When the dataset's examples carry their
        own `labels` with -100 (a prompt masked in the dataset, padded there or not), each is found in
        the collated rows and compared: a position the dataset masks that the collated labels supervise
        fails (the collator threw the dataset's labels away, e.g. DataCollatorForLanguageModeling
        rebuilding them from input_ids); a pass says how many examples' labels were compared. Image/video
        placeholder tokens (the processor's ``image_token_id``, or the model config's ``image_token_id`` /
        ``image_token_index`` when the batches carry images) are judged whatever completion-only training
        says: whole-sequence training of a VLM (TRL's assistant_only_loss=False) still must not supervise
        them.
    Why it is bad
        Supervised padding trains the model to emit pad tokens (with pad == eos, to emit EOS after
        EOS) and dilutes the loss with free tokens. Supervised prompts turn an instruction tune into
        a language model of the prompts: capacity goes to predicting questions, the loss is
        dominated by prompt tokens, and a completion-only objective silently becomes a full-sequence
        one. Supervised image placeholders ask the LM to predict the placeholder id where the image
        features stand (576 of them per image in LLaVA-1.5: most of the loss). A masker that trains
        only one assistant turn of each conversation never trains the other answers, silently, since
        single-turn data looks right.
    Example
        collator = DataCollatorForLanguageModeling(tok, mlm=False)     # labels = input_ids
        Trainer(model, args, train_dataset=prompt_completion_tokenized, data_collator=collator)
        # or a hand collator: batch["labels"] = batch["input_ids"].clone()  (padding supervised)
        # a VLM collator: labels[i, :len(processor.tokenizer(prompt)["input_ids"])] = -100  (counted
        # before <image> became N tokens: most placeholders and the prompt text stay supervised)
        # multi-turn: n = len(tok.apply_chat_template(messages[:-1], add_generation_prompt=True))
        # labels[:n] = -100  (only the last answer is trained)
    Use instead
        TRL SFTTrainer on the prompt/completion dataset (SFTConfig.completion_only_loss defaults to
        True for it), SFTConfig(assistant_only_loss=True) on messages with a {% generation %}
        template; in a hand collator labels[:n_prompt] = -100 and labels[attention_mask == 0] = -100
        (for a VLM, n_prompt = len(processor(text=prompt, images=images)["input_ids"][0]), or TRL's
        DataCollatorForVisionLanguageModeling(processor)). Image placeholders, in any collator:
        labels[batch["input_ids"] == processor.image_token_id] = -100 (TRL 1.16's
        DataCollatorForVisionLanguageModeling masks them only with the prompt, under completion-only or
        assistant-only training).
        Several turns: labels = -100 where apply_chat_template(messages,
        return_assistant_tokens_mask=True)["assistant_masks"] is 0. Training one turn only is a choice:
        --dlcheck-set L2.every_assistant_turn=false.
        Whole-sequence training on such data is a choice: say so with
        SFTConfig(completion_only_loss=False) / assistant_only_loss=False, or
        --dlcheck-set L2.completion_only=false.
    Known problems
        Needs labels in the batch (skips when the model derives them) and, for the prompt half, the
        raw rows behind the sample (a dlcheck_dataset / dlcheck_raw_dataset with the prompt/completion
        or messages fields, or a Trainer): batches drawn from a bare dataloader are judged on padding
        only. Only tokens inside the prompt's own text are judged, so supervised template tokens
        (role headers, separators) are not reported. TRL's default assistant_only_loss=False is read
        as a deliberate choice to train on whole conversations. Batches drawn from a dataloader
        alone cannot be matched to their raw examples: the prompt half then needs dlcheck_collator +
        dlcheck_dataset (or a Trainer); rows packed by TRL (SFTConfig(packing=True)) keep no raw
        example to match either. A completion token masked too many (len(tokenizer(prompt)) tokens
        masked where the tokenizer merged the prompt's trailing space into the completion's first
        word) is not reported: test it with strategies.boundary_merge_pairs and prompt_boundary
        (README). Turns are judged only where the data holds several (property mode makes them from
        single-turn data); an assistant turn partly masked is not reported. The dataset's own labels
        are compared only when the collator and dataset are known (not for a bare dataloader) and the
        example's token ids appear whole in a collated row (an example the collator truncated is not
        compared); L2.completion_only=false accepts labels the collator supervises on purpose.
        Placeholders are judged in the batches' labels: a model whose own loss dropped the placeholder
        positions (transformers' LlavaForConditionalGeneration does not) would make that part a false alarm.
    Not applicable
        Padding-free (flattened, position_ids and no attention_mask) batches of data with no
        prompt/completion or messages split, or with completion-only training switched off: there
        is neither padding nor a prompt to mask. Batches that are not token batches. A sequence
        classifier (one label per sequence: no token is supervised), an extractive question-answering model
        (its targets are an answer span's start and end positions, no per-token labels). A masked LM or token classifier
        has no prompt: only its padding is judged, and the prompt part is no part left unjudged.
    """
    tok = dlcheck.role("tokenizer")
    sample = token_sample(dlcheck)
    kind = pipeline_kind(dlcheck)
    if not kind.token_labels:
        kind.not_for(dlcheck, "per-token labels (-100 on padding and prompts)")
    rows = labelled_rows(dlcheck, sample)
    analysis = analyse(dlcheck, sample, tok)
    shift = analysis.shift
    pad, eos = lm.special_id(tok, "pad"), lm.special_id(tok, "eos")

    comparison = compare_dataset_labels(sample, rows, shift)
    if dlcheck.setting("completion_only"):
        _labels_discarded(dlcheck, comparison, tok)

    # (a) padding
    pad_judged, pad_positions, pad_bad = 0, 0, []  # (row, offending target positions)
    padding_free = True  # no row can hold padding: no attention_mask, position_ids given (flattened rows)
    for row in rows:
        if row.labels is None:
            continue
        padding_free &= row.attention_mask is None and row.position_ids is not None
        pads = _pad_positions(row, pad, eos)
        if pads is None:
            continue
        pad_judged += 1
        pad_positions += len(pads)
        bad = sorted(set(row_targets(row, shift)) & set(pads))
        if bad:
            pad_bad.append((row, bad))

    # (c) image/video placeholders: never a target, whatever completion-only training says
    placeholders = placeholder_ids(tok) | _model_placeholders(dlcheck, sample)
    ph_positions, ph_bad = 0, []  # (row, supervised placeholder positions)
    for row in rows if placeholders else []:
        if row.labels is None:
            continue
        held = {p for p in row.content if row.input_ids[p] in placeholders}
        ph_positions += len(held)
        bad = sorted(set(row_targets(row, shift)) & held)
        if bad:
            ph_bad.append((row, bad))
    n_ph_bad = sum(len(b) for _, b in ph_bad)
    ph_fail = bool(ph_bad) and n_ph_bad / ph_positions > dlcheck.setting("max_placeholder_share")

    # (b) prompt
    examples = [ex for ex in analysis.examples if ex.row.labels is not None]
    kinds = {ex.kind for ex in examples if ex.kind in SPLIT_KINDS}
    opt_out = _prompt_opt_out(dlcheck, kinds) if kinds else None
    judged = [] if opt_out else [ex for ex in examples if ex.kind in SPLIT_KINDS and ex.prompt_side is not None]
    prompt_bad = [(ex, sorted(set(ex.targets) & set(ex.prompt_side))) for ex in judged]
    prompt_bad = [(ex, bad) for ex, bad in prompt_bad if bad]

    prompt_why = "" if judged else _prompt_not_judged(dlcheck, sample, examples, kinds, opt_out)
    if not judged and not kind.generates:  # a masked LM or token classifier has no prompt to mask
        prompt_why = f"{NO_SPLIT}: {kind.why}"
        if pad_positions == 0 and not comparison.compared:
            dlcheck.not_applicable(
                f"{kind.why}, whose labels hold no prompt, and the {len(rows)} sampled rows of {sample.source} hold no "
                "padding (attention_mask 0): no position whose label must be -100"
            )
    if pad_judged == 0 and not judged and not ph_positions:
        padding = (
            f"batches from {sample.source} are padding-free (position_ids, no attention_mask): no padding to judge"
            if padding_free
            else f"batches from {sample.source} have no attention_mask to tell padding"
        )
        reason = f"{padding}, and {prompt_why}"
        if padding_free and (opt_out or prompt_why == NO_SPLIT or not kind.generates):
            dlcheck.not_applicable(reason)
        dlcheck.skip(reason)

    pad_fail = bool(pad_bad) and len(pad_bad) / pad_judged > dlcheck.setting("max_padding_share")
    prompt_fail = bool(prompt_bad) and len(prompt_bad) / len(judged) > dlcheck.setting("max_prompt_share")
    multi, turn_bad = _untrained_turns(judged) if dlcheck.setting("every_assistant_turn") else ([], [])
    turn_fail = bool(turn_bad)
    if not pad_fail and not prompt_fail and not turn_fail and not ph_fail:
        lines = []
        if pad_judged:
            lines.append(
                f"padding: {len(pad_bad)} of {pad_judged} sampled rows supervise any of their {pad_positions} padding "
                f"positions (attention_mask 0); source: {sample.source}"
            )
        elif padding_free:
            lines.append("padding: none to judge, the batches are padding-free (position_ids, no attention_mask)")
        else:
            lines.append("padding: not judged, the batches have no attention_mask to tell padding")
            dlcheck.not_judged("padding", "the batches have no attention_mask to tell padding")
        if judged:
            judged_kinds = {ex.kind for ex in judged}
            side = " or ".join(
                name
                for name, group in (
                    ("prompt", {PROMPT_COMPLETION, COMPLETION_MASK}),
                    ("user/system-turn", {MESSAGES, ASSISTANT_MASKS}),
                )
                if judged_kinds & group
            )
            n_prompt = sum(len(ex.prompt_side) for ex in judged)
            lines.append(
                f"prompt: {len(prompt_bad)} of {len(judged)} sampled {'/'.join(sorted(judged_kinds))} examples "
                f"supervise any of their {n_prompt} {side} tokens"
            )
        elif not kind.generates:
            lines.append(f"prompt: none to judge, {kind.why} (no prompt in its labels)")
        else:
            lines.append(f"prompt: not judged, {prompt_why}")
            if not opt_out and prompt_why != NO_SPLIT:  # a prompt there is, but it was not seen
                dlcheck.not_judged("prompt", prompt_why)
        if comparison.compared:
            lines.append(
                f"dataset labels: the labels {comparison.compared} sampled examples carry were compared with the "
                f"collated ones: all {comparison.masked} positions they mask (-100) stay -100"
                if not comparison.lost
                else f"dataset labels: the labels {comparison.compared} sampled examples carry were compared with the "
                f"collated ones: {sum(len(b) for _, _, b in comparison.lost)} of the {comparison.masked} positions they "
                "mask are supervised (L2.completion_only=false: whole-sequence training intended)"
            )
        if ph_positions:
            lines.append(
                f"image placeholders: {n_ph_bad} of the {ph_positions} placeholder positions "
                f"({_placeholder_text(tok, placeholders)}) in the sampled rows carry labels != -100"
            )
        if multi:
            lines.append(
                f"assistant turns: 0 of {len(multi)} sampled conversations with several assistant turns leave a "
                "whole assistant turn unsupervised"
            )
        dlcheck.measured(
            *lines,
            padded_rows=pad_judged,
            padding_positions=pad_positions,
            prompt_examples=len(judged),
            prompt_positions=sum(len(ex.prompt_side) for ex in judged),
            multi_turn_examples=len(multi),
            dataset_labels_compared=comparison.compared,
            placeholder_positions=ph_positions,
        )
        return

    evidence, causes, fixes = [], [], []
    images = None  # the prompt's failure tells of its own supervised placeholders
    if pad_fail:
        n_pos = sum(len(b) for _, b in pad_bad)
        row, bad = pad_bad[0]
        values = Counter(r.labels[label_position(t, shift)] for r, b in pad_bad for t in b)
        shown = ", ".join(
            f"{v} ({lm.token_text(tok, v)!r}) ×{k}" if v >= 0 else f"{v} ×{k}" for v, k in values.most_common(3)
        )
        evidence += [
            f"{len(pad_bad)} of {pad_judged} sampled examples supervise padding: {n_pos} positions with "
            f"attention_mask 0 have labels != -100 (label values there: {shown})",
            f"example {row.batch}.{row.index}: {lm.decode(tok, row.input_ids)} "
            f"({len(row.content)} real tokens, {len(row.input_ids) - len(row.content)} padding)",
            f"labels at the padding: {lm.show_labels(tok, row, [label_position(t, shift) for t in bad[:4]])}",
        ]
        copied = all(r.labels[label_position(t, shift)] == r.input_ids[t] for r, b in pad_bad for t in b)
        if copied:
            cause = "the collator copies input_ids into labels and never sets the padding to -100"
            if pad is not None and pad == eos:
                cause += (
                    " (here pad_token == eos_token: masking by token id would also mask the real EOS, "
                    "see L11, so mask by attention_mask)"
                )
        elif len(values) == 1:
            cause = f"the labels are padded with {next(iter(values))} instead of -100"
        else:
            cause = "labels at padded positions (attention_mask 0) are not -100"
        causes.append(cause)
        fixes.append(
            "after padding set labels[attention_mask == 0] = -100 (by attention_mask, not by pad id), "
            "or pad labels with -100 (DataCollatorForSeq2Seq(label_pad_token_id=-100))"
        )
    if prompt_fail:
        ex, bad = prompt_bad[0]
        n_pos = sum(len(b) for _, b in prompt_bad)
        eligible = {id(e): [p for p in e.prompt_side if shift or p > 0] for e, _ in prompt_bad}
        n_prompt_pos = sum(len(v) for v in eligible.values())
        kind = ex.kind
        what = "prompt" if kind in (PROMPT_COMPLETION, COMPLETION_MASK) else "user/system-turn"
        whole = [e for e, b in prompt_bad if set(eligible[id(e)]) <= set(b)]
        labelled = [i + shift for i in ex.row.supervised if i + shift in set(ex.positions)]
        shown = [label_position(t, shift) for t in labelled if t in set(ex.prompt_side)][:5]
        supervised_text = text_of(tok, [ex.row.input_ids[t] for t in labelled])
        images = _placeholder_note(tok, prompt_bad, placeholders)
        evidence += [
            f"{len(prompt_bad)} of {len(judged)} sampled {kind} examples supervise {what} tokens: {n_pos} of "
            f"{n_prompt_pos} {what} positions carry labels != -100",
            f"{example_name(ex)}: {lm.decode(tok, ex.ids)}",
            f"  supervised:    {short(supervised_text)}",
            f"  expected only: {short(ex.expected)}"
            + (f"   ({what} text: {short(ex.prompt_text, 60)})" if ex.prompt_text else ""),
            f"  labels on the {what}: {lm.show_labels(tok, ex.row, shown)}",
        ]
        if images:
            evidence.append(images)
        early = _counted_before_expansion(prompt_bad, shift)
        merged = [e for e, _ in prompt_bad if e.merged is not None]
        collator = dlcheck.role("collator") if dlcheck.has("collator") else None
        if collator is not None and _is_hf_lm_collator(collator):
            causes.append(
                "transformers DataCollatorForLanguageModeling(mlm=False) copies input_ids into labels and "
                f"masks only padding: on {kind} data the {what} is trained as well"
            )
        elif early is not None:
            e, first = early
            token = _placeholder_text(tok, placeholders)
            n_image = sum(1 for p in e.positions if e.row.input_ids[p] in placeholders)
            causes.append(
                f"the prompt length was counted before the processor expanded {token} into the image's {n_image} "
                "tokens: "
                f"{example_name(e)} has its first {first} tokens masked (len(tokenizer(prompt)) = "
                f"{e.n_prompt_text}), while its prompt is {e.n_prompt} tokens after the expansion, so "
                f"{e.n_prompt - first} prompt tokens (image placeholders and the prompt text) keep their labels"
            )
        elif merged and len(merged) == len(prompt_bad) and not whole:
            e = merged[0]
            token = lm.token_text(tok, e.ids[e.merged])
            causes.append(
                f"the tokenizer merges the prompt's trailing whitespace into the completion's first word ({token!r} "
                f"in {example_name(e)}), and the masking stops before the boundary: a prompt length taken from the "
                "parts tokenized apart (len(tokenizer(completion)) counted from the end: the word alone takes "
                "other tokens than in context) leaves the prompt's last token supervised"
            )
        elif len(whole) == len(prompt_bad):
            causes.append(
                f"the labels are a copy of input_ids over the whole example: no {what} token is masked, "
                "so the completion-only objective became a full-sequence one"
            )
        else:
            causes.append(
                f"the {what} masking stops short: some {what} tokens keep their labels (an off-by-one, or a "
                "prompt length counted without the BOS/template tokens)"
            )
        if kind in (MESSAGES, ASSISTANT_MASKS) or (
            kind == PROMPT_COMPLETION and not isinstance(ex.raw.get("prompt"), str)
        ):
            fixes.append(
                "train with TRL SFTConfig(assistant_only_loss=True) and a chat template with {% generation %}, "
                "or set labels to -100 where tokenizer.apply_chat_template(messages, return_dict=True, "
                "return_assistant_tokens_mask=True)['assistant_masks'] is 0; if whole-conversation training is "
                "intended, set assistant_only_loss=False or --dlcheck-set L2.completion_only=false"
            )
        elif images:
            fixes.append(
                "mask the prompt as the processor expands it: n_prompt = len(processor(text=prompt, "
                "images=images)['input_ids'][0]) (counted after each image placeholder became the image's "
                "tokens, not len(tokenizer(prompt))), labels[:n_prompt] = -100; or collate with TRL's "
                "DataCollatorForVisionLanguageModeling(processor) (completion_only_loss=True, its default); if "
                "whole-sequence training is intended, SFTConfig(completion_only_loss=False) or --dlcheck-set "
                "L2.completion_only=false"
            )
        elif merged and len(merged) == len(prompt_bad) and not whole:
            fixes.append(
                "take the prompt boundary where TRL takes it: n_prompt = the common prefix of "
                "tokenizer(prompt)['input_ids'] and tokenizer(prompt + completion)['input_ids'] (not "
                "len(tokenizer(prompt)), which masks the merged token, nor a count of the completion's tokens "
                "apart), labels[:n_prompt] = -100; or end the prompts on a token boundary (no trailing space)"
            )
        elif kind == COMPLETION_MASK:
            fixes.append(
                "set labels to -100 where completion_mask is 0 (TRL SFTTrainer does it with "
                "completion_only_loss=True); if whole-sequence training is intended, "
                "SFTConfig(completion_only_loss=False) or --dlcheck-set L2.completion_only=false"
            )
        else:
            fixes.append(
                "train with TRL SFTTrainer on the prompt/completion dataset (SFTConfig.completion_only_loss "
                "defaults to True for it), or in your collator set labels[:n_prompt] = -100 with n_prompt = "
                "len(tokenizer(prompt)['input_ids']); if whole-sequence training is intended, "
                "SFTConfig(completion_only_loss=False) or --dlcheck-set L2.completion_only=false"
            )
    if ph_fail and not images:
        _placeholder_failure(
            dlcheck, tok, placeholders, (ph_bad, ph_positions, shift), opt_out, (evidence, causes, fixes)
        )
    if turn_fail:
        ex, trained = turn_bad[0]
        n_turns = sum(len(t) for _, t in turn_bad)
        n_untrained = sum(t.count(False) for _, t in turn_bad)
        targets = set(ex.targets)
        states = ", ".join(
            f"turn {k + 1} {short(text_of(tok, [ex.row.input_ids[p] for p in turn]), 40)}: "
            + (f"{sum(p in targets for p in turn)} of {len(turn)} tokens supervised" if ok else "all -100")
            for k, (turn, ok) in enumerate(zip(ex.assistant_turns, trained))
        )
        untrained = next(turn for turn, ok in zip(ex.assistant_turns, trained) if not ok)
        evidence += [
            f"{len(turn_bad)} of {len(multi)} sampled conversations with several assistant turns leave whole "
            f"assistant turns unsupervised: {n_untrained} of their {n_turns} assistant turns have every label -100 "
            "while another turn of the same conversation is trained",
            f"{example_name(ex)}: {lm.decode(tok, ex.ids)}",
            f"  assistant turns: {states}",
            f"  labels on an untrained turn: {lm.show_labels(tok, ex.row, [label_position(p, shift) for p in untrained[:4]])}",
        ]
        pattern = _turns_pattern(turn_bad)
        if pattern == "first":
            causes.append(
                "the masker supervises only the first assistant turn (it stops at the first end of turn, or "
                "was written for single-turn data): the later answers of every conversation are never trained"
            )
        elif pattern == "last":
            causes.append(
                "the masker supervises only the last assistant turn (the prompt is taken as everything before "
                "the last answer, e.g. apply_chat_template(messages[:-1], add_generation_prompt=True)): the "
                "earlier answers of every conversation are never trained"
            )
        else:
            causes.append("the masker leaves some assistant turns of a conversation entirely at -100")
        fixes.append(
            "mask by turn: labels = -100 where tokenizer.apply_chat_template(messages, return_dict=True, "
            "return_assistant_tokens_mask=True)['assistant_masks'] is 0 (a chat template with {% generation %}), "
            "or TRL SFTConfig(assistant_only_loss=True); if training on one turn only is intended, "
            "--dlcheck-set L2.every_assistant_turn=false"
        )
    dlcheck.fail(evidence, "; and ".join(causes), "; and ".join(fixes))
