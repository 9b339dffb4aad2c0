"""Hypothesis strategies for the data pipeline of a language model, shaped like *your* data.

Sampling a few real batches finds the common bugs; collators break at the edges — an example of exactly
``max_length``, an empty completion, a prompt that fills the window, a one-token document, a prompt
ending in a space the tokenizer merges with the completion's first word, a conversation of several
turns where the data has one — and only generated inputs reach those. Every strategy here favours such
edges::

    from hypothesis import given
    from pytest_dlcheck import strategies as dls

    @given(dls.collated_batches(my_collator, dls.examples_like(my_dataset, tokenizer=tok, max_length=64)))
    def test_padding_is_never_supervised(batch):
        assert (batch["labels"][batch["attention_mask"] == 0] == -100).all()

The same strategies drive the property mode of the data checks (``--dlcheck-property``).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any

from hypothesis import strategies as st

from .sampling import sample_rows

__all__ = [
    "edge_lengths",
    "token_ids",
    "texts",
    "prompt_completion_pairs",
    "conversations",
    "packed_documents",
    "boundary_merge_pairs",
    "prompt_boundary",
    "multi_turn_conversations",
    "examples_like",
    "collated_batches",
]


def edge_lengths(max_length: int | None, *, low: int = 0, typical: int = 16) -> st.SearchStrategy[int]:
    """Lengths where collators break, favoured over the rest: 0, 1, max_length - 1, max_length,
    max_length + 1 (one past the window), and anything in between."""
    top = max_length if max_length else typical
    edges = sorted({n for n in (low, low + 1, top - 1, top, top + 1) if n >= low})
    return st.one_of(st.sampled_from(edges), st.integers(low, top + 1))


def _vocabulary(tokenizer: Any) -> list[int]:
    special = set(getattr(tokenizer, "all_special_ids", []) or [])
    return [i for i in range(len(tokenizer)) if i not in special]


def token_ids(tokenizer: Any, *, max_length: int | None = None, min_size: int = 0) -> st.SearchStrategy[list[int]]:
    """Lists of ordinary (non-special) token ids of ``tokenizer``, of edge lengths."""
    vocab = _vocabulary(tokenizer)
    return edge_lengths(max_length, low=min_size).flatmap(
        lambda n: st.lists(st.sampled_from(vocab), min_size=n, max_size=n)
    )


def texts(tokenizer: Any, *, max_tokens: int | None = None, min_tokens: int = 0) -> st.SearchStrategy[str]:
    """Text made of the tokenizer's own pieces (so it tokenizes to roughly the drawn length)."""
    return token_ids(tokenizer, max_length=max_tokens, min_size=min_tokens).map(
        lambda ids: tokenizer.decode(ids, skip_special_tokens=True)
    )


def prompt_completion_pairs(tokenizer: Any, *, max_length: int = 32) -> st.SearchStrategy[dict[str, str]]:
    """``{"prompt", "completion"}`` pairs: empty prompts and completions, prompts that fill the window,
    pairs whose total is exactly ``max_length`` tokens."""
    return st.fixed_dictionaries(
        {
            "prompt": texts(tokenizer, max_tokens=max_length),
            "completion": texts(tokenizer, max_tokens=max_length).map(
                lambda t: t if not t or t.startswith(" ") else " " + t
            ),
        }
    )


def conversations(
    tokenizer: Any, *, max_turns: int = 3, max_tokens: int = 16, system: bool = True
) -> st.SearchStrategy[list[dict[str, str]]]:
    """Chat conversations (``messages``) alternating user/assistant, optionally opened by a system turn,
    with empty and long turns."""
    turn = texts(tokenizer, max_tokens=max_tokens)

    def build(parts: tuple[str | None, list[tuple[str, str]]]) -> list[dict[str, str]]:
        head, pairs = parts
        msgs = [{"role": "system", "content": head}] if head is not None else []
        for user, assistant in pairs:
            msgs += [{"role": "user", "content": user}, {"role": "assistant", "content": assistant}]
        return msgs

    heads = st.one_of(st.none(), turn) if system else st.none()
    return st.tuples(heads, st.lists(st.tuples(turn, turn), min_size=1, max_size=max_turns)).map(build)


def packed_documents(
    tokenizer: Any, *, max_length: int = 64, max_documents: int = 6
) -> st.SearchStrategy[list[list[int]]]:
    """Documents (token id lists ending with EOS) to pack into one row of at most ``max_length``:
    one-token documents and a document that fills the row are favoured."""
    eos = tokenizer.eos_token_id
    doc = token_ids(tokenizer, max_length=max_length - 1).map(lambda ids: ids + [eos] if eos is not None else ids)

    def fit(docs: list[list[int]]) -> list[list[int]]:
        out, used = [], 0
        for d in docs:
            if d and used + len(d) <= max_length:
                out.append(d)
                used += len(d)
        # nothing fitted whole: one document cut to the row, its EOS kept
        return out or [docs[0][: max_length - 1] + [eos]]

    return st.lists(doc, min_size=1, max_size=max_documents).map(fit)


# ---- the prompt/completion boundary and multi-turn conversations -----------------------------------

#: whitespace a prompt may end in, tried in this order for a tokenizer that merges it with the next word
_WHITESPACE = (" ",)
#: per tokenizer (by identity): (tokenizer, [(whitespace, word)]); the tokenizer is kept so its id stays its own
_MERGING: dict[int, tuple[Any, list[tuple[str, str]]]] = {}


def _encode(tokenizer: Any, texts: list[str]) -> list[list[int]]:
    return [list(ids) for ids in tokenizer(texts, add_special_tokens=False)["input_ids"]]


def _merging_words(tokenizer: Any, *, scan: int = 20_000, limit: int = 256) -> list[tuple[str, str]]:
    """(whitespace, word) pairs where ``tokenizer(whitespace + word)`` is not ``tokenizer(whitespace)``
    followed by ``tokenizer(word)``: the tokenizer merges the whitespace into the word's first token. The
    words are the tokenizer's own (alphabetic pieces of its first ``scan`` ids)."""
    cached = _MERGING.get(id(tokenizer))
    if cached is not None and cached[0] is tokenizer:
        return cached[1]
    special = set(getattr(tokenizer, "all_special_ids", []) or [])
    seen: dict[str, None] = {}
    for i in range(min(len(tokenizer), scan)):
        if i in special:
            continue
        word = tokenizer.decode([i]).strip()
        if word.isalpha():
            seen[word] = None
            if sum(len(w) >= 3 for w in seen) >= limit:
                break
    # words rather than the first merges' fragments, where the vocabulary has enough of them
    longer = [w for w in seen if len(w) >= 3]
    words = longer if len(longer) >= 8 else list(seen)[:limit]
    found: list[tuple[str, str]] = []
    if words:
        apart = _encode(tokenizer, words)
        for ws in _WHITESPACE:
            alone = _encode(tokenizer, [ws])[0]
            joined = _encode(tokenizer, [ws + w for w in words])
            found += [(ws, w) for w, j, a in zip(words, joined, apart) if j != alone + a]
    _MERGING[id(tokenizer)] = (tokenizer, found)
    return found


def _pairs_of(rows: Sequence[Any]) -> list[tuple[str, str]]:
    return [
        (r["prompt"], r["completion"])
        for r in rows
        if isinstance(r, Mapping) and isinstance(r.get("prompt"), str) and isinstance(r.get("completion"), str)
    ]


def boundary_merge_pairs(
    tokenizer: Any, *, like: Sequence[Any] | None = None, max_tokens: int = 16
) -> st.SearchStrategy[dict[str, str]]:
    """``{"prompt", "completion"}`` pairs where the prompt ends in whitespace and the completion starts with
    a word the tokenizer merges with it ("Answer: " + "Paris."): ``tokenizer(prompt)`` ends in a lone
    whitespace token that ``tokenizer(prompt + completion)`` does not hold, so a collator that masks
    ``len(tokenizer(prompt))`` tokens masks the completion's first token, and one that counts the
    completion's tokens apart may leave the prompt's last token supervised. The prompts (and the
    completions after the first word) are those of ``like`` (rows with "prompt" and "completion"
    strings) when given, else text of the tokenizer's own pieces; the first words are the tokenizer's
    own. Compare a collator's masking with :func:`prompt_boundary`."""
    merging = _merging_words(tokenizer)
    if not merging:
        raise ValueError(f"{type(tokenizer).__name__} merges no whitespace into a following word")
    pairs = _pairs_of(like or [])
    if like is not None and not pairs:
        raise ValueError('boundary_merge_pairs(like=...) needs rows with "prompt" and "completion" strings')
    if pairs:
        prompts = st.sampled_from([p.rstrip() for p, _ in pairs])
        # the completions after their first word
        rests = sorted({" " + c.split(None, 1)[1] for _, c in pairs if len(c.split(None, 1)) == 2})
        tails = st.one_of(st.just(""), st.sampled_from(rests)) if rests else st.just("")
    else:
        prompts = texts(tokenizer, max_tokens=max_tokens).map(str.rstrip)
        tails = texts(tokenizer, max_tokens=max_tokens).map(lambda t: " " + t.strip() if t.strip() else "")

    def build(parts: tuple[str, tuple[str, str], str]) -> dict[str, str]:
        prompt, (ws, word), tail = parts
        return {"prompt": prompt + ws, "completion": word + tail}

    made = st.tuples(prompts, st.sampled_from(merging), tails).map(build)
    # the data's own pairs whose completion's first word merges: the leading space moved onto the prompt
    own = [
        {"prompt": p.rstrip() + " ", "completion": c.lstrip()} for p, c in pairs if _merges(tokenizer, _first_word(c))
    ]
    return st.one_of(st.sampled_from(own), made) if own else made


def _first_word(text: str) -> str:
    word = ""
    for ch in text.lstrip():
        if not ch.isalpha():
            break
        word += ch
    return word


def _merges(tokenizer: Any, word: str, ws: str = " ") -> bool:
    if not word:
        return False
    joined, alone, apart = _encode(tokenizer, [ws + word, ws, word])
    return joined != alone + apart


def prompt_boundary(tokenizer: Any, prompt: str, completion: str, *, add_special_tokens: bool = True) -> int:
    """How many leading tokens of ``tokenizer(prompt + completion)`` are the prompt's: the tokens whose text
    ends inside the prompt (character offsets, for a fast tokenizer), else the common prefix of
    ``tokenizer(prompt)`` and ``tokenizer(prompt + completion)`` (TRL's boundary). A token that merges the
    prompt's trailing whitespace with the completion's first word is the completion's: a completion-only
    collator masks exactly these ``n`` tokens and supervises token ``n``."""
    try:
        enc = tokenizer(
            prompt + completion,
            add_special_tokens=add_special_tokens,
            return_offsets_mapping=True,
            return_special_tokens_mask=True,
        )
        offsets = [tuple(o) for o in enc["offset_mapping"]]
        specials = list(enc["special_tokens_mask"])
    except Exception:  # a slow tokenizer has no offsets
        offsets = None
    if offsets is not None:
        n, text_seen = 0, False
        for (_, end), special in zip(offsets, specials):
            if (special and text_seen) or (not special and end > len(prompt)):  # past the prompt's text
                break
            text_seen |= not special
            n += 1
        return n
    p = tokenizer(prompt, add_special_tokens=add_special_tokens)["input_ids"]
    full = tokenizer(prompt + completion, add_special_tokens=add_special_tokens)["input_ids"]
    n = 0
    for x, y in zip(p, full):
        if x != y:
            break
        n += 1
    return n


def _turns_of(rows: Sequence[Any]) -> tuple[list[Any], list[tuple[Any, Any]]]:
    """(system messages, (user message, assistant message) pairs) of single- or multi-turn rows: rows
    with "messages", rows with "prompt"/"completion" strings, or messages lists."""
    systems: list[Any] = []
    pairs: list[tuple[Any, Any]] = []
    for row in rows:
        msgs = row.get("messages") if isinstance(row, Mapping) else row
        if isinstance(row, Mapping) and isinstance(row.get("prompt"), str) and isinstance(row.get("completion"), str):
            pairs.append(
                ({"role": "user", "content": row["prompt"]}, {"role": "assistant", "content": row["completion"]})
            )
            continue
        if not isinstance(msgs, (list, tuple)) or not all(isinstance(m, Mapping) and "role" in m for m in msgs):
            continue
        systems += [m for m in msgs if m["role"] == "system"]
        turns = [m for m in msgs if m["role"] != "system"]
        pairs += [(u, a) for u, a in zip(turns[::2], turns[1::2]) if u["role"] == "user" and a["role"] == "assistant"]
    return systems, pairs


def multi_turn_conversations(
    examples: Any, *, min_turns: int = 2, max_turns: int = 4
) -> st.SearchStrategy[list[dict[str, Any]]]:
    """Conversations (``messages``) of ``min_turns`` to ``max_turns`` user/assistant turns chained from
    single-turn data, so a masker that trains only the first (or the last) assistant turn, or everything
    after the first assistant header, shows. ``examples``: a list (or a dataset, sampled) of rows with
    "messages", rows with "prompt"/"completion" strings, or messages lists; a system turn of the data
    opens some of the conversations."""
    rows = list(examples) if isinstance(examples, (list, tuple)) else sample_rows(examples, 16)[0]
    systems, pairs = _turns_of(rows)
    if not pairs:
        raise ValueError("multi_turn_conversations needs examples holding a user turn and an assistant answer")
    heads = st.one_of(st.none(), st.sampled_from(systems)) if systems else st.none()

    def build(parts: tuple[Any, list[tuple[Any, Any]]]) -> list[dict[str, Any]]:
        head, chosen = parts
        msgs = [dict(head)] if head is not None else []
        for user, assistant in chosen:
            msgs += [dict(user), dict(assistant)]
        return msgs

    return st.tuples(heads, st.lists(st.sampled_from(pairs), min_size=min_turns, max_size=max_turns)).map(build)


# ---- examples shaped like the user's own ----------------------------------------------------------


def _token_fields(row: Mapping[str, Any]) -> list[str]:
    """The row's per-token int-list fields (input_ids, attention_mask, labels, completion_mask…), which
    must keep one length."""
    n = len(row["input_ids"]) if _is_int_list(row.get("input_ids")) else None
    return [k for k, v in row.items() if _is_int_list(v) and (n is None or len(v) == n)]


def _is_int_list(value: Any) -> bool:
    if hasattr(value, "tolist"):
        value = value.tolist()
    return isinstance(value, (list, tuple)) and all(isinstance(v, int) and not isinstance(v, bool) for v in value)


def _resize(values: Sequence[int], n: int) -> list[int]:
    """A shorter or longer example of the same kind: the body is cut, or lengthened by repeating it,
    and the last element (the EOS a pipeline appended, often) stays last."""
    values = list(values.tolist() if hasattr(values, "tolist") else values)
    if not values or n <= 0:
        return []
    body, last = values[:-1], values[-1:]
    if not body:
        return (last * n)[:n]
    out = (body * (n // len(body) + 1))[: n - 1]
    return out + last


def _perturb_text(text: str, max_length: int | None, blank: bool = True) -> st.SearchStrategy[str]:
    """The text as it is, cut, or repeated; emptied (or cut to whitespace) only when ``blank``: the field is blank
    in some example of the data, so the user's pipeline meets blank ones."""
    if blank:
        return st.one_of(st.just(text), st.just(""), st.integers(0, len(text)).map(lambda k: text[:k]), _longer(text))
    first = next((i for i, ch in enumerate(text) if not ch.isspace()), len(text))
    cuts = st.integers(min(first + 1, len(text)), len(text)).map(lambda k: text[:k])
    return st.one_of(st.just(text), cuts, _longer(text))


def _longer(text: str) -> st.SearchStrategy[str]:
    return st.integers(2, 4).map(lambda k: (text + " ") * k)


def _blank(value: Any) -> bool:
    return isinstance(value, str) and not value.strip()


def _blank_fields(rows: Sequence[Any]) -> set[Any]:
    """The text fields (``key``), and the chat turns (``(key, role)``), blank in some sampled example: only those
    may be generated blank. A field never blank in the sample is never blank in a generated example."""
    out: set[Any] = set()
    for row in rows:
        if not isinstance(row, Mapping):
            continue
        for key, value in row.items():
            if _blank(value):
                out.add(key)
            elif isinstance(value, list):
                out |= {(key, m.get("role")) for m in value if isinstance(m, Mapping) and _blank(m.get("content"))}
    return out


def _move_space_onto_prompt(
    row: dict[str, Any], tokenizer: Any = None, word: tuple[str, str] | None = None
) -> dict[str, Any]:
    """The prompt ending in whitespace and the completion starting with a word the tokenizer merges with it
    ("Answer: " + "Paris."), the boundary a tokenizer merges across (see :func:`boundary_merge_pairs`). The
    completion's own first word when the tokenizer merges it; else ``word`` (whitespace, a word of the tokenizer's
    own that it merges) opens the completion, so the merge is built, not left to the draw. Without a tokenizer the
    completion's leading space moves onto the prompt. A blank prompt or completion is left as it is."""
    prompt, completion = row["prompt"], row["completion"]
    if not prompt.strip() or not completion.strip():
        return row
    if tokenizer is None or word is None or _merges(tokenizer, _first_word(completion)):
        return {**row, "prompt": prompt.rstrip() + " ", "completion": completion.lstrip()}
    ws, first = word
    return {**row, "prompt": prompt.rstrip() + ws, "completion": first + " " + completion.lstrip()}


def _more_turns(messages: list[Any], pool: list[tuple[Any, Any]]) -> st.SearchStrategy[list[Any]]:
    """The conversation continued by 1-3 user/assistant turns of the data (2-4 turns in all for
    single-turn data)."""
    return st.lists(st.sampled_from(pool), min_size=1, max_size=3).map(
        lambda more: [dict(m) for m in messages] + [dict(m) for pair in more for m in pair]
    )


def _perturb_row(
    row: Any,
    max_length: int | None,
    pool: list[tuple[Any, Any]] | None = None,
    blank: set[Any] | None = None,
    tokenizer: Any = None,
    merging: list[tuple[str, str]] | None = None,
) -> st.SearchStrategy[Any]:
    blank = set() if blank is None else blank
    if not isinstance(row, Mapping):
        return st.just(row)
    row = dict(row)
    parts: dict[str, st.SearchStrategy[Any]] = {}
    fields = _token_fields(row)
    if fields:
        n0 = len(row[fields[0]])
        lengths = st.one_of(st.just(n0), edge_lengths(max_length or n0, low=1))
        parts["__len__"] = lengths
    for key, value in row.items():
        if key in fields:
            continue
        if isinstance(value, str):
            parts[key] = _perturb_text(value, max_length, key in blank)
        elif isinstance(value, list) and value and all(isinstance(m, Mapping) and "content" in m for m in value):
            texts = [
                _perturb_text(m["content"], max_length, (key, m.get("role")) in blank)
                if isinstance(m["content"], str)
                else st.just(m["content"])
                for m in value
            ]
            parts[key] = st.tuples(*texts).map(
                lambda contents, msgs=value: [{**m, "content": c} for m, c in zip(msgs, contents)]
            )
            if pool and value[-1].get("role") == "assistant":
                parts[key] = st.one_of(parts[key], _more_turns(value, pool))
        else:
            parts[key] = st.just(value)
    boundary = isinstance(row.get("prompt"), str) and isinstance(row.get("completion"), str)
    if boundary:
        parts["__boundary__"] = st.booleans()
        if merging:
            parts["__word__"] = st.sampled_from(merging)

    def build(drawn: dict[str, Any]) -> dict[str, Any]:
        out = {k: v for k, v in drawn.items() if k not in ("__len__", "__boundary__", "__word__")}
        if fields:
            for key in fields:
                out[key] = _resize(row[key], drawn["__len__"])
        out = {k: out.get(k, row[k]) for k in row}
        if drawn.get("__boundary__"):
            return _move_space_onto_prompt(out, tokenizer, drawn.get("__word__"))
        return out

    return st.fixed_dictionaries(parts).map(build)


def examples_like(
    dataset: Any, *, tokenizer: Any = None, max_length: int | None = None, n: int = 8
) -> st.SearchStrategy[Any]:
    """Examples drawn from ``dataset`` (a bounded, evenly spread sample of it, or a list of rows) and
    perturbed at the edges, only into examples the data could hold: per-token fields (input_ids with their
    attention_mask, labels, …) resized together to 1, max_length - 1, max_length, max_length + 1…; text
    fields and chat turns cut or repeated, and emptied only when that field (that role's turns) is blank
    in some sampled example (one never blank in the sample is never blank); a conversation continued by
    1-3 user/assistant turns of the data's own (2-4 turns for single-turn data, see
    :func:`multi_turn_conversations`); a prompt/completion pair built across the boundary a tokenizer
    merges: the prompt ending in whitespace and the completion opening with a word the tokenizer merges
    into it ("Answer: " + "Paris.", see :func:`boundary_merge_pairs`) — the completion's own first word
    when ``tokenizer`` merges it, else one of the tokenizer's own merging words put in front, so the merge
    is constructed rather than left to chance (without ``tokenizer``, only the completion's leading space
    moves onto the prompt)."""
    rows = list(dataset) if isinstance(dataset, (list, tuple)) else sample_rows(dataset, n)[0]
    if not rows:
        raise ValueError("examples_like needs at least one example to shape the generated ones")
    pool = _turns_of(rows)[1]
    blank = _blank_fields(rows)
    text_tok = _text_tokenizer(tokenizer) if _pairs_of(rows) else None
    merging = None
    if text_tok is not None:
        try:
            merging = _merging_words(text_tok) or None
        except Exception:  # a tokenizer that cannot be probed: the boundary is moved, not built
            text_tok = None
    return st.sampled_from(rows).flatmap(
        lambda row: _perturb_row(row, max_length, pool, blank, text_tok if merging else None, merging)
    )


def _text_tokenizer(tokenizer: Any) -> Any:
    """The text tokenizer of a tokenizer or a processor (its ``tokenizer``), None without one."""
    if tokenizer is None:
        return None
    inner = getattr(tokenizer, "tokenizer", None)
    return inner if inner is not None and callable(inner) else tokenizer


def collated_batches(
    collator: Callable[[list[Any]], Any], examples: st.SearchStrategy[Any], *, min_size: int = 1, max_size: int = 4
) -> st.SearchStrategy[Any]:
    """Batches made by *your* collator from lists of generated examples."""
    return st.lists(examples, min_size=min_size, max_size=max_size).map(collator)
