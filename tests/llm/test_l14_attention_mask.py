"""L14: the attention mask is 0 exactly on padding, even when pad == eos."""

# Imported here, outside pytester's in-process runs (a run unloads the modules first imported inside it).
import datasets  # noqa: F401
import transformers.models.llama.modeling_llama  # noqa: F401
from helpers import flat
from hypothesis import given, settings
from hypothesis import strategies as st
from transformers import (  # noqa: F401
    AutoModelForCausalLM,
    DataCollatorForLanguageModeling,
    DataCollatorWithPadding,
    LlamaConfig,
)
from trl import DPOConfig, DPOTrainer  # noqa: F401

from pytest_dlcheck.checks.llm.attention_mask import expected_mask, fill_ids, structural
from pytest_dlcheck.checks.shared.lm import Row

# Pre-tokenized examples (true lengths known); the first one has an EOS inside it, as documents joined
# with the EOS separator do.
PRETOKENIZED = """
    import pytest, tiny, torch
    from transformers import DataCollatorForLanguageModeling, DataCollatorWithPadding

    @pytest.fixture(scope="session")
    def dlcheck_tokenizer():
        return tiny.tokenizer(pad={pad}, padding_side="{side}")

    @pytest.fixture(scope="session")
    def dlcheck_dataset(dlcheck_tokenizer):
        tok = dlcheck_tokenizer
        texts = ["hello" + tok.eos_token + "world"] + tiny.texts(11)
        return [tok(t + tok.eos_token) for t in texts]

    @pytest.fixture(scope="session")
    def dlcheck_collator(dlcheck_tokenizer):
        tok = dlcheck_tokenizer
        {collator}
"""

MASK_FROM_IDS = """
        def collate(features):
            batch = tok.pad(features, return_tensors="pt")
            batch["attention_mask"] = (batch["input_ids"] != tok.pad_token_id).long()   # pad == eos: wrong
            batch["labels"] = batch["input_ids"].masked_fill(batch["attention_mask"] == 0, -100)
            return batch
        return collate
"""

MASK_ALL_ONES = """
        def collate(features):
            batch = tok.pad(features, return_tensors="pt")
            batch["attention_mask"] = torch.ones_like(batch["input_ids"])                # pads unmasked
            return batch
        return collate
"""


def test_mask_built_from_pad_id_when_pad_is_eos(project):
    project.conftest(PRETOKENIZED.format(pad="tiny.EOS", side="right", collator=MASK_FROM_IDS))
    run = project.run("--dlcheck=L14")
    run.assert_outcome("L14", "failed")
    text = flat(run.section("L14"))
    assert "8 of 8 sampled rows: attention_mask is 0 on 9 real tokens" in text
    assert "judged by: the true length of each pre-tokenized example (8 of 8 rows)" in text
    assert "example 0.0: 'hello<|endoftext|>world<|endoftext|>'" in text
    assert (
        "the example has 10 tokens, the mask has 8 ones; masked: '<|endoftext|>'(0) at 3, '<|endoftext|>'(0) at 9"
        in text
    )
    assert "pad_token == eos_token and the attention mask is built as input_ids != pad_token_id" in text
    assert "DataCollatorWithPadding" in text and "tokenizer.pad" in text
    assert "Traceback" not in run.text


def test_collator_that_pads_with_a_mask_of_ones(project):
    project.conftest(PRETOKENIZED.format(pad="tiny.PAD", side="right", collator=MASK_ALL_ONES))
    run = project.run("--dlcheck=L14")
    run.assert_outcome("L14", "failed")
    text = flat(run.section("L14"))
    assert "6 of 8 sampled rows:" in text and "padding positions have attention_mask 1" in text
    assert "6 of 8 sampled rows: 91 padding positions have attention_mask 1" in text
    assert (
        "example 0.0: 'hello<|endoftext|>world<|endoftext|>' + 21 x '<|pad|>'(1) with attention_mask 1; "
        "the example has 10 tokens, the mask has 31 ones" in text
    )
    assert "pads input_ids but returns an attention_mask of ones" in text
    assert "0 on every padded position" in text


def test_left_padding_with_a_mask_of_ones(project):
    project.conftest(PRETOKENIZED.format(pad="tiny.EOS", side="left", collator=MASK_ALL_ONES))
    run = project.run("--dlcheck=L14")
    run.assert_outcome("L14", "failed")
    assert "padding positions have attention_mask 1" in flat(run.section("L14"))


def test_tokenizer_padding_is_right_when_pad_is_eos(project):
    project.conftest(
        PRETOKENIZED.format(
            pad="tiny.EOS", side="right", collator="return DataCollatorForLanguageModeling(tok, mlm=False)"
        )
    )
    run = project.run("--dlcheck=L14", "-rA")
    run.assert_outcome("L14", "passed")
    run.fnmatch(["*::L14_attention_mask PASSED (8 of 8 sampled rows: attention_mask is 0 on the 91 padding pos*"])
    run.fnmatch(
        [
            "8 of 8 sampled rows: attention_mask is 0 on the 91 padding positions only and 1 on all 157 real tokens "
            "(judged by: the true length of each pre-tokenized example (8 of 8 rows), the mask's structure for the "
            "rest)"
        ]
    )


def test_left_padding_with_data_collator_with_padding_passes(project):
    project.conftest(PRETOKENIZED.format(pad="tiny.EOS", side="left", collator="return DataCollatorWithPadding(tok)"))
    run = project.run("--dlcheck=L14", "-rA")
    run.assert_outcome("L14", "passed")
    run.fnmatch(["8 of 8 sampled rows: attention_mask is 0 on the 91 padding positions only and 1 on all 157 real*"])


# A bare dataloader over raw text whose collate_fn tokenizes: no true lengths, the structure decides.
TEXT_LOADER = """
    import pytest, tiny, torch
    from torch.utils.data import DataLoader

    @pytest.fixture(scope="session")
    def dlcheck_tokenizer():
        return tiny.tokenizer(pad=tiny.EOS, padding_side="{side}")

    @pytest.fixture(scope="session")
    def dlcheck_dataloader(dlcheck_tokenizer):
        tok = dlcheck_tokenizer
        texts = ["hello" + tok.eos_token + "world" + tok.eos_token] + [t + tok.eos_token for t in tiny.texts(7)]

        def collate(texts):
            batch = tok(texts, padding=True, return_tensors="pt")
            {fix_mask}
            return dict(batch)

        return DataLoader(texts, batch_size=4, collate_fn=collate)
"""


def test_structure_finds_a_masked_eos_inside_the_sequence(project):
    project.conftest(
        TEXT_LOADER.format(
            side="right", fix_mask='batch["attention_mask"] = (batch["input_ids"] != tok.pad_token_id).long()'
        )
    )
    run = project.run("--dlcheck=L14")
    run.assert_outcome("L14", "failed")
    text = flat(run.section("L14"))
    assert "1 of 8 sampled rows: attention_mask is 0 on 1 real tokens" in text
    assert "example 0.0: 'hello<|endoftext|>world'" in text
    assert "masked inside the sequence or on non-pad tokens: '<|endoftext|>'(0) at 3" in text
    assert "judged by: the mask's structure" in text
    assert "pad_token == eos_token" in text


def test_structure_finds_unmasked_left_padding(project):
    project.conftest(TEXT_LOADER.format(side="left", fix_mask='batch["attention_mask"][:] = 1'))
    run = project.run("--dlcheck=L14")
    run.assert_outcome("L14", "failed")
    text = flat(run.section("L14"))
    assert "padding positions have attention_mask 1" in text and "judged by: the mask's structure" in text
    assert "x '<|endoftext|>'(0) with attention_mask 1" in text


def test_structure_passes_the_tokenizer_mask(project):
    project.conftest(TEXT_LOADER.format(side="left", fix_mask="pass"))
    run = project.run("--dlcheck=L14", "-rA")
    run.assert_outcome("L14", "passed")
    run.fnmatch(
        [
            "8 of 8 sampled rows: attention_mask is 0 on the 62 padding positions only and 1 on all 150 real tokens "
            "(judged by: the mask's structure (the collator's examples carry no input_ids, so their lengths are "
            "unknown))"
        ]
    )


TRL_DPO = """
    import copy, pytest, tiny
    from datasets import Dataset
    from trl import DPOConfig, DPOTrainer

    @pytest.fixture(scope="session")
    def dlcheck_trainer(tmp_path_factory):
        tok = tiny.tokenizer(pad=tiny.EOS)
        model = tiny.llama(tok)
        data = Dataset.from_dict({"prompt": tiny.PROMPTS, "chosen": tiny.COMPLETIONS,
                                  "rejected": tiny.COMPLETIONS[::-1]})
        return DPOTrainer(model=model, ref_model=copy.deepcopy(model), processing_class=tok, train_dataset=data,
                          args=tiny.trainer_args(tmp_path_factory.mktemp("out"), DPOConfig, max_length=64))
"""


def test_trl_dpo_batches_pass(project):
    # chosen and rejected stacked, pad == eos: judged by structure, and right
    project.conftest(TRL_DPO)
    run = project.run("--dlcheck=L14", "-rA")
    run.assert_outcome("L14", "passed")
    run.fnmatch(["12 of 12 sampled rows: attention_mask is 0 on the 74 padding positions only and 1 on all 242 real*"])


def test_padding_free_batches_are_not_applicable(project):
    project.conftest("""
        import pytest, tiny
        from transformers import DataCollatorWithFlattening

        @pytest.fixture
        def dlcheck_tokenizer():
            return tiny.tokenizer()

        @pytest.fixture
        def dlcheck_collator():
            return DataCollatorWithFlattening()

        @pytest.fixture
        def dlcheck_dataset(dlcheck_tokenizer):
            return tiny.tokenized(dlcheck_tokenizer)
    """)
    run = project.run("--dlcheck=L14")
    run.assert_outcome("L14", "skipped")
    run.fnmatch(
        [
            "*::L14_attention_mask SKIPPED (not applicable: *",
            "SKIPPED * not applicable: batches from dlcheck_collator on 8 examples of dlcheck_dataset carry no "
            "attention_mask (padding-free or packed batches, or the model builds the mask itself): no mask to "
            "disagree with padding",
        ]
    )


# ---- unit tests of the detection logic -----------------------------------------------------------

EOS = 0


def test_expected_mask_right_left_and_truncated():
    ex = [5, 6, EOS]
    assert expected_mask([5, 6, EOS, EOS, EOS], [1, 1, 0, 0, 0], ex) == [1, 1, 1, 0, 0]
    assert expected_mask([EOS, EOS, 5, 6, EOS], [0, 0, 1, 1, 1], ex) == [0, 0, 1, 1, 1]
    assert expected_mask([5, 6], [1, 1], ex) == [1, 1]  # the collator truncated
    assert expected_mask([5, 9, 6, EOS], [1, 1, 1, 1], ex) is None  # the collator rewrote the ids


def test_structural_rules():
    fill = {EOS}
    # right padding, pad == eos, real EOS kept: clean
    assert structural([5, 6, EOS, EOS, EOS], [1, 1, 1, 0, 0], fill) == ([], [])
    # a zero inside the sequence masks a real token
    assert structural([5, EOS, 6, EOS, EOS], [1, 0, 1, 0, 0], fill) == ([1], [])
    # a zero at the edge on a non-pad token
    assert structural([5, 6, 7, EOS], [1, 1, 0, 0], fill) == ([2], [])
    # padding with mask 1 beyond the first of the run (right), all but the last of the run (left)
    assert structural([5, 6, EOS, EOS, EOS], [1, 1, 1, 1, 1], fill) == ([], [3, 4])
    assert structural([EOS, EOS, EOS, 5, 6], [1, 1, 1, 1, 1], fill) == ([], [0, 1])
    # pad == eos: a text ending in a doubled EOS is not taken for padding, a longer run is
    assert structural([5, 6, EOS, EOS, EOS], [1, 1, 1, 1, 0], fill, min_extra=2) == ([], [])
    assert structural([5, 6, EOS, EOS, EOS], [1, 1, 1, 1, 1], fill, min_extra=2) == ([], [3, 4])


def test_fill_id_of_a_collator_padding_with_zero():
    # pad id 1, but the collator pads input_ids with 0: 0 is recognised as its fill value
    rows = [Row(0, 0, [5, 6, 0, 0], [1, 1, 0, 0], None, None), Row(0, 1, [5, 6, 7, 0], [1, 1, 1, 0], None, None)]
    fill, inferred = fill_ids(rows, pad=1)
    assert fill == {0, 1} and inferred == 0
    assert structural(rows[0].input_ids, rows[0].attention_mask, fill) == ([], [])


# ---- property: tokenizer-style padding is never flagged, an id-based mask always is ---------------

WORD = st.sampled_from([5, 6, 7])
EXAMPLE = st.builds(
    lambda head, body, last: [head] + body + [last, EOS],
    WORD,
    st.lists(st.sampled_from([EOS, 5, 6, 7]), max_size=6),
    WORD,
)


def _pad(examples, side):
    width = max(len(e) for e in examples)
    rows = []
    for e in examples:
        pads = [EOS] * (width - len(e))
        ids = pads + e if side == "left" else e + pads
        mask = [0] * len(pads) + [1] * len(e) if side == "left" else [1] * len(e) + [0] * len(pads)
        rows.append((ids, mask))
    return rows


@settings(max_examples=200, deadline=None)
@given(st.lists(EXAMPLE, min_size=1, max_size=4), st.sampled_from(["left", "right"]))
def test_pad_equal_to_eos_property(examples, side):
    for e, (ids, mask) in zip(examples, _pad(examples, side)):
        # the tokenizer's mask (from lengths): clean by length and by structure
        assert expected_mask(ids, mask, e) == mask
        assert structural(ids, mask, {EOS}, min_extra=2) == ([], [])
        # the mask input_ids != pad: every real EOS is reported, nothing else
        wrong = [int(t != EOS) for t in ids]
        exp = expected_mask(ids, wrong, e)
        assert [p for p in range(len(ids)) if exp[p] and not wrong[p]] == [
            p for p in range(len(ids)) if mask[p] and ids[p] == EOS
        ]
