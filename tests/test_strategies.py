"""The public Hypothesis strategies: edge lengths are favoured, per-token fields keep one length, and
the README's example property test runs as written."""

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
