"""Hypothesis strategies for the data pipeline of a language model, shaped like *your* data.

Sampling a few real batches finds the common bugs; collators break at the edges — an example of exactly
``max_length``, an empty completion, a prompt that fills the window, a one-token document — and only
generated inputs reach those. Every strategy here favours such edge lengths::

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


def _perturb_text(text: str, max_length: int | None) -> st.SearchStrategy[str]:
    cuts = st.integers(0, len(text)).map(lambda k: text[:k])
    longer = st.integers(2, 4).map(lambda k: (text + " ") * k)
    return st.one_of(st.just(text), st.just(""), cuts, longer)


def _perturb_row(row: Any, max_length: int | None) -> st.SearchStrategy[Any]:
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
            parts[key] = _perturb_text(value, max_length)
        elif isinstance(value, list) and value and all(isinstance(m, Mapping) and "content" in m for m in value):
            parts[key] = st.tuples(*[_perturb_text(m["content"], max_length) for m in value]).map(
                lambda contents, msgs=value: [{**m, "content": c} for m, c in zip(msgs, contents)]
            )
        else:
            parts[key] = st.just(value)

    def build(drawn: dict[str, Any]) -> dict[str, Any]:
        out = {k: v for k, v in drawn.items() if k != "__len__"}
        if fields:
            for key in fields:
                out[key] = _resize(row[key], drawn["__len__"])
        return {k: out.get(k, row[k]) for k in row}

    return st.fixed_dictionaries(parts).map(build)


def examples_like(
    dataset: Any, *, tokenizer: Any = None, max_length: int | None = None, n: int = 8
) -> st.SearchStrategy[Any]:
    """Examples drawn from ``dataset`` (a bounded, evenly spread sample of it, or a list of rows) and
    perturbed at the edges: per-token fields (input_ids with their attention_mask, labels, …) resized
    together to 1, max_length - 1, max_length, max_length + 1…; text fields emptied, cut or repeated;
    chat turns emptied or cut. ``tokenizer`` is accepted for symmetry with the other strategies."""
    rows = list(dataset) if isinstance(dataset, (list, tuple)) else sample_rows(dataset, n)[0]
    if not rows:
        raise ValueError("examples_like needs at least one example to shape the generated ones")
    return st.sampled_from(rows).flatmap(lambda row: _perturb_row(row, max_length))


def collated_batches(
    collator: Callable[[list[Any]], Any], examples: st.SearchStrategy[Any], *, min_size: int = 1, max_size: int = 4
) -> st.SearchStrategy[Any]:
    """Batches made by *your* collator from lists of generated examples."""
    return st.lists(examples, min_size=min_size, max_size=max_size).map(collator)
