"""The public Hypothesis strategies: edge lengths are favoured, per-token fields keep one length, and
the README's example property test runs as written."""

import pytest
import tiny
from hypothesis import given, settings
from hypothesis import strategies as st

from pytest_dlcheck import strategies as dls

TOK = tiny.tokenizer()


@settings(max_examples=200, derandomize=True, database=None)
@given(st.data())
def test_edge_lengths_are_favoured(data):
    n = data.draw(dls.edge_lengths(16))
    assert 0 <= n <= 17


def test_edge_lengths_hit_every_edge():
    seen = set()

    @settings(max_examples=300, derandomize=True, database=None)
    @given(dls.edge_lengths(16))
    def collect(n):
        seen.add(n)

    collect()
    assert {0, 1, 15, 16, 17} <= seen


@settings(max_examples=60, derandomize=True, database=None, deadline=None)
@given(dls.examples_like(tiny.tokenized(TOK, 4), max_length=24))
def test_examples_like_resizes_token_fields_together(row):
    assert len(row["input_ids"]) == len(row["attention_mask"]) >= 1
    assert row["input_ids"][-1] == TOK.eos_token_id  # the row's own ending survives resizing


@settings(max_examples=40, derandomize=True, database=None, deadline=None)
@given(
    dls.examples_like([{"prompt": "what is 2+2?", "completion": " 4", "messages": [{"role": "user", "content": "hi"}]}])
)
def test_examples_like_perturbs_text_and_turns(row):
    assert set(row) == {"prompt", "completion", "messages"}
    assert row["messages"][0]["role"] == "user"


@settings(max_examples=40, derandomize=True, database=None, deadline=None)
@given(dls.packed_documents(TOK, max_length=32))
def test_packed_documents_fit_and_end_with_eos(docs):
    assert sum(map(len, docs)) <= 32
    assert all(d[-1] == TOK.eos_token_id for d in docs)


@settings(max_examples=30, derandomize=True, database=None, deadline=None)
@given(dls.conversations(TOK))
def test_conversations_alternate(messages):
    roles = [m["role"] for m in messages if m["role"] != "system"]
    assert roles[::2] == ["user"] * len(roles[::2]) and roles[1::2] == ["assistant"] * len(roles[1::2])


@settings(max_examples=30, derandomize=True, database=None, deadline=None)
@given(dls.prompt_completion_pairs(TOK, max_length=16))
def test_prompt_completion_pairs(pair):
    assert set(pair) == {"prompt", "completion"}


# the README's worked example, as written there
from transformers import DataCollatorForLanguageModeling  # noqa: E402

tok = TOK
my_collator = DataCollatorForLanguageModeling(tok, mlm=False)
my_dataset = tiny.tokenized(tok)


@settings(max_examples=25, derandomize=True, database=None, deadline=None)
@given(dls.collated_batches(my_collator, dls.examples_like(my_dataset, tokenizer=tok, max_length=64)))
def test_padding_is_never_supervised(batch):
    assert (batch["labels"][batch["attention_mask"] == 0] == -100).all()


# ---- the prompt/completion boundary a tokenizer merges across ---------------------------------------


def common_prefix(a, b):
    return next((i for i, (x, y) in enumerate(zip(a, b)) if x != y), min(len(a), len(b)))


PAIRS = [{"prompt": p, "completion": c} for p, c in zip(tiny.PROMPTS, tiny.COMPLETIONS)]


@settings(max_examples=40, derandomize=True, database=None, deadline=None)
@given(st.one_of(dls.boundary_merge_pairs(TOK), dls.boundary_merge_pairs(TOK, like=PAIRS)))
def test_boundary_merge_pairs_merge_across_the_boundary(pair):
    prompt, completion = pair["prompt"], pair["completion"]
    assert prompt.endswith(" ") and completion[:1].isalpha()
    alone, whole = TOK(prompt)["input_ids"], TOK(prompt + completion)["input_ids"]
    n = common_prefix(alone, whole)
    assert n == len(alone) - 1  # the prompt's trailing space is not a token of the whole example
    assert dls.prompt_boundary(TOK, prompt, completion) == n  # offsets agree with TRL's common prefix


def test_boundary_merge_pairs_keep_the_datas_own_pairs():
    seen = []

    @settings(max_examples=40, derandomize=True, database=None, deadline=None)
    @given(dls.boundary_merge_pairs(TOK, like=PAIRS))
    def collect(pair):
        seen.append(pair)

    collect()
    assert {"prompt": "hello ", "completion": "world, how are you today?"} in seen  # ' world' → 'Ġw'
    assert {p["prompt"].rstrip() for p in seen} <= set(tiny.PROMPTS)


def test_prompt_boundary_of_pairs_that_do_not_merge():
    assert dls.prompt_boundary(TOK, "what is 2+2?", " The answer is 4.") == len(TOK("what is 2+2?")["input_ids"])
    assert dls.prompt_boundary(TOK, "what is 2+2? ", "The answer is 4.") == 8  # 'Ġ' stays alone before 'T'
    assert dls.prompt_boundary(TOK, "hello", "") == len(TOK("hello")["input_ids"])


class PromptLengthMasker:
    """labels[:len(tokenizer(prompt))] = -100: masks the completion's first token when the tokenizer merges it
    with the prompt's trailing space (L2 does not see a completion token masked too many)."""

    def __init__(self, tok):
        self.tok = tok

    def n_prompt(self, prompt, ids):
        return len(self.tok(prompt)["input_ids"])

    def __call__(self, rows):
        import torch

        out = []
        for r in rows:
            ids = self.tok(r["prompt"] + r["completion"] + self.tok.eos_token)["input_ids"]
            n = self.n_prompt(r["prompt"], ids)
            out.append((ids, [-100] * n + ids[n:]))
        width = max(len(ids) for ids, _ in out)
        pad = self.tok.pad_token_id
        return {
            "input_ids": torch.tensor([ids + [pad] * (width - len(ids)) for ids, _ in out]),
            "attention_mask": torch.tensor([[1] * len(ids) + [0] * (width - len(ids)) for ids, _ in out]),
            "labels": torch.tensor([lab + [-100] * (width - len(lab)) for _, lab in out]),
        }


class CommonPrefixMasker(PromptLengthMasker):
    """TRL's boundary: the common prefix of tokenizer(prompt) and tokenizer(prompt + completion)."""

    def n_prompt(self, prompt, ids):
        return common_prefix(self.tok(prompt)["input_ids"], ids)


def completion_starts_where_the_tokenizer_says(my_collator, my_pairs):
    # the README's example, as written there
    @settings(max_examples=30, derandomize=True, database=None, deadline=None)
    @given(dls.boundary_merge_pairs(tok, like=my_pairs))
    def test_completion_starts_where_the_tokenizer_says(pair):
        labels = my_collator([pair])["labels"][0].tolist()
        n = dls.prompt_boundary(tok, pair["prompt"], pair["completion"])
        assert labels[:n] == [-100] * n  # every prompt token masked
        assert labels[n] != -100  # the completion's first token (merged with the prompt's space) trained

    return test_completion_starts_where_the_tokenizer_says


def test_prompt_length_masker_masks_the_merged_completion_token():
    property_test = completion_starts_where_the_tokenizer_says(PromptLengthMasker(tok), PAIRS)
    with pytest.raises(AssertionError, match=r"assert -100 != -100"):
        property_test()


def test_common_prefix_masker_trains_the_merged_completion_token():
    completion_starts_where_the_tokenizer_says(CommonPrefixMasker(tok), PAIRS)()


# ---- conversations of several turns made from single-turn data -------------------------------------

SINGLE_TURN = [
    {"messages": [{"role": "user", "content": p}, {"role": "assistant", "content": c.strip()}]}
    for p, c in zip(tiny.PROMPTS, tiny.COMPLETIONS)
]


@settings(max_examples=40, derandomize=True, database=None, deadline=None)
@given(
    st.one_of(
        dls.multi_turn_conversations(SINGLE_TURN),
        dls.multi_turn_conversations(PAIRS),
        dls.multi_turn_conversations(
            [[{"role": "system", "content": "be brief"}] + r["messages"] for r in SINGLE_TURN]
        ),
    )
)
def test_multi_turn_conversations_chain_two_to_four_turns(messages):
    turns = [m for m in messages if m["role"] != "system"]
    assert 4 <= len(turns) <= 8
    assert [m["role"] for m in turns] == ["user", "assistant"] * (len(turns) // 2)
    assert all(m["role"] == "system" for m in messages[: len(messages) - len(turns)])


def test_examples_like_continues_single_turn_conversations():
    lengths = set()

    @settings(max_examples=60, derandomize=True, database=None, deadline=None)
    @given(dls.examples_like(SINGLE_TURN))
    def collect(row):
        roles = [m["role"] for m in row["messages"]]
        assert roles == ["user", "assistant"] * (len(roles) // 2)
        lengths.add(len(roles) // 2)

    collect()
    assert lengths == {1, 2, 3, 4}


def test_examples_like_moves_the_completions_space_onto_the_prompt():
    seen = []

    @settings(max_examples=60, derandomize=True, database=None, deadline=None)
    @given(dls.examples_like(PAIRS))
    def collect(row):
        seen.append(row)

    collect()
    assert any(r["prompt"].endswith(" ") and r["completion"][:1].isalpha() for r in seen)
    assert any(r["completion"].startswith(" ") for r in seen)  # the data's own form stays


# ---- only examples the user's data could hold; the boundary merge built, on every seed ---------------------


def test_examples_like_never_blanks_a_field_the_data_never_holds_blank():
    seen = []

    @settings(max_examples=150, derandomize=True, database=None, deadline=None)
    @given(st.one_of(dls.examples_like(PAIRS, tokenizer=TOK), dls.examples_like(SINGLE_TURN)))
    def collect(row):
        seen.append(row)
        texts = [row["prompt"], row["completion"]] if "prompt" in row else [m["content"] for m in row["messages"]]
        assert all(t.strip() for t in texts), row

    collect()
    assert any("prompt" in r and r["prompt"] not in tiny.PROMPTS for r in seen)  # still cut and repeated


def test_examples_like_may_blank_a_field_the_data_holds_blank():
    blank = []

    @settings(max_examples=150, derandomize=True, database=None, deadline=None)
    @given(dls.examples_like(PAIRS + [{"prompt": "", "completion": " 4"}], tokenizer=TOK))
    def collect(row):
        assert row["completion"].strip(), row  # never blank in the data
        if not row["prompt"].strip():
            blank.append(row)

    collect()
    assert blank


@pytest.mark.parametrize("seed", [0, 1, 2, 3, 4, 5, 6, 7])
def test_examples_like_builds_the_boundary_merge_on_every_seed(seed):
    from hypothesis import seed as with_seed

    merged = []

    @with_seed(seed)
    @settings(max_examples=25, database=None, deadline=None)
    @given(dls.examples_like(PAIRS, tokenizer=TOK))
    def collect(row):
        prompt, completion = row["prompt"], row["completion"]
        if prompt[-1:].isspace() and completion[:1].isalpha():  # the boundary pair
            alone, whole = TOK(prompt)["input_ids"], TOK(prompt + completion)["input_ids"]
            assert whole[: len(alone)] != alone, row  # built: the tokenizer merges across it, every time
            merged.append(row)

    collect()
    assert merged  # reached on this seed
