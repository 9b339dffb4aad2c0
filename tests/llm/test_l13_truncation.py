"""L13: truncation must leave every example supervised tokens and most completions their end (EOS)."""

import pytest

# imported once here: pytester drops modules first imported inside a run, and datasets (pyarrow
# extension types) cannot be imported twice in one process
from datasets import Dataset  # noqa: F401
from helpers import flat
from transformers import AutoModelForCausalLM, LlamaConfig, PreTrainedTokenizerFast  # noqa: F401
from trl import SFTConfig, SFTTrainer  # noqa: F401

from pytest_dlcheck.checks.llm.labels_masked import Example, _relation
from pytest_dlcheck.checks.llm.truncation import _infer_limit
from pytest_dlcheck.checks.shared.lm import Row

# TRL SFTTrainer, prompt/completion data, completion-only loss (the default), SFTConfig.max_length=N
TRL_SFT = """
    import pytest, tiny
    from datasets import Dataset
    from trl import SFTConfig, SFTTrainer

    @pytest.fixture(scope="session")
    def dlcheck_trainer(tmp_path_factory):
        tok = tiny.tokenizer()
        ds = Dataset.from_dict({{"prompt": {prompts}, "completion": {completions}}})
        args = tiny.trainer_args(tmp_path_factory.mktemp("out"), SFTConfig, max_length={max_length})
        return SFTTrainer(model=tiny.llama(tok), args=args, train_dataset=ds, processing_class=tok)
"""

# a hand collator: tokenizer(prompt + completion + eos, truncation=True, max_length=N), prompt and
# padding masked (so L2 is clean: only the truncation is wrong)
HAND_COLLATOR = """
    import pytest, tiny

    LONG = "read this and answer: "

    class TruncatingCollator:
        def __init__(self, tok, max_length):
            self.tok, self.max_length = tok, max_length

        def __call__(self, rows):
            enc = self.tok([r["prompt"] + r["completion"] + self.tok.eos_token for r in rows], padding=True,
                           truncation=True, max_length=self.max_length, return_tensors="pt")
            labels = enc["input_ids"].clone()
            for i, r in enumerate(rows):
                labels[i, : len(self.tok(r["prompt"])["input_ids"])] = -100
            labels[enc["attention_mask"] == 0] = -100
            enc["labels"] = labels
            return enc

    @pytest.fixture(scope="session")
    def dlcheck_tokenizer():
        return tiny.tokenizer()

    @pytest.fixture(scope="session")
    def dlcheck_collator(dlcheck_tokenizer):
        return TruncatingCollator(dlcheck_tokenizer, max_length={max_length})

    @pytest.fixture(scope="session")
    def dlcheck_dataset():
        prompts = [(LONG if i % 2 else "") + p for i, p in enumerate(tiny.PROMPTS)]
        return [dict(prompt=p, completion=c) for p, c in zip(prompts * 2, tiny.COMPLETIONS * 2)]
"""

PROMPTS = "tiny.PROMPTS * 2"
COMPLETIONS = "tiny.COMPLETIONS * 2"


# ---- buggy ----------------------------------------------------------------------------------------


def test_trl_max_length_shorter_than_prompts(project):
    # prompts are 3-14 tokens: max_length=6 leaves 8 of 12 examples without any completion token
    project.conftest(TRL_SFT.format(prompts=PROMPTS, completions=COMPLETIONS, max_length=6))
    run = project.run("--dlcheck=L13")
    run.assert_outcome("L13", "failed")
    text = flat(run.section("L13"))
    assert (
        "TRL SFTTrainer dropped 8 of 12 training examples (67%) while preparing the dataset: after "
        "truncation to SFTConfig.max_length=6 every label was -100"
    ) in text
    assert "dropped: row 0 of the data given to SFTTrainer, prompt 'what is 2+2?' is 7 tokens, max_length 6" in text
    assert "TRL silently filters the examples out" in text
    assert "4 of 4 sampled examples (100%) lost the end of their completion, EOS included" in text
    assert (
        "max_length 6 (SFTConfig.max_length) example 0.0 (dataset row 0): 'hello wor' (6 of its 22 tokens "
        "kept, the prompt alone is 3)"
    ) in text
    assert "cut off: 'ld, how are you today?<|endoftext|>'" in text
    assert "raise SFTConfig(max_length=...)" in text
    assert "Traceback" not in run.text


def test_trl_max_length_shorter_than_every_prompt(project):
    # every example dropped: the trainer's dataset is empty, L13 still says why
    project.conftest(TRL_SFT.format(prompts=PROMPTS, completions=COMPLETIONS, max_length=2))
    run = project.run("--dlcheck=L13")
    run.assert_outcome("L13", "failed")
    text = flat(run.section("L13"))
    assert "dropped 12 of 12 training examples (100%)" in text


def test_hand_collator_truncating_into_the_completion(project):
    project.conftest(HAND_COLLATOR.format(max_length=16))
    run = project.run("--dlcheck=L13")
    run.assert_outcome("L13", "failed")
    text = flat(run.section("L13"))
    assert "4 of 8 sampled examples have no supervised token: every label is -100" in text
    assert (
        "max_length 16 (every cut example holds exactly 16 tokens) example 0.2 (dataset row 3): "
        "'read this and answer:' (16 of its 40 tokens kept, the prompt alone is 26)"
    ) in text
    assert "cut off: ' once upon a time there was a tiny model<|endoftext|>'" in text
    assert "truncation to 16 tokens keeps the start of prompt+completion" in text
    assert "the prompt alone is 26 tokens, so nothing of the completion survives" in text
    assert "6 of 8 sampled examples (75%) lost the end of their completion" in text
    assert "cut off: ' 4.<|endoftext|>'" in text
    assert "truncation_side='left'" in text


def test_cut_share_threshold_is_a_setting(project):
    project.conftest(TRL_SFT.format(prompts=PROMPTS, completions=COMPLETIONS, max_length=12))
    run = project.run("--dlcheck=L13")
    run.assert_outcome("L13", "failed")
    assert "lost the end of their completion" in flat(run.section("L13"))
    run = project.run(
        "--dlcheck=L13",
        "-rA",
        "--dlcheck-set",
        "L13.max_cut_share=1.0",
        "--dlcheck-set",
        "L13.max_unsupervised_share=1.0",
    )
    run.assert_outcome("L13", "passed")
    run.fnmatch(
        [
            "8 of 10 judged examples lost the end of their completion (threshold 100%); max_length 12 "
            "(SFTConfig.max_length); longest complete sequence 23 tokens",
            "TRL SFTTrainer dropped 2 of 12 examples while preparing the dataset",
        ]
    )


# ---- clean twins ----------------------------------------------------------------------------------


def test_trl_max_length_that_fits(project):
    project.conftest(TRL_SFT.format(prompts=PROMPTS, completions=COMPLETIONS, max_length=64))
    run = project.run("--dlcheck=L13", "-rA")
    run.assert_outcome("L13", "passed")
    # the Trainer's dataset stores token ids: all 12 are read (L13.max_examples), not the session's 8
    run.fnmatch(["*::L13_truncation PASSED (12 of 12 sampled examples keep supervised tokens after truncation*"])
    run.fnmatch(
        [
            "12 of 12 sampled examples keep supervised tokens after truncation; source: dlcheck_collator on 12 of "
            "the 12 examples of dlcheck_dataset",
            "0 of 12 judged examples lost the end of their completion (threshold 25%); max_length 64 "
            "(SFTConfig.max_length); longest complete sequence 31 tokens",
        ]
    )


def test_hand_collator_max_length_that_fits(project):
    project.conftest(HAND_COLLATOR.format(max_length=64))
    run = project.run("--dlcheck=L13", "-rA")
    run.assert_outcome("L13", "passed")
    run.fnmatch(
        ["0 of 8 judged examples lost the end of their completion (threshold 25%); longest complete sequence 40 tokens"]
    )


def test_without_raw_text_or_max_length_the_cut_share_is_not_judged(project):
    project.conftest(CLEAN_LEFT_PADDED)
    run = project.run("--dlcheck=L13", "-rA")
    run.assert_outcome("L13", "passed")
    run.fnmatch(
        [
            "8 of 8 sampled examples keep supervised tokens after truncation*",
            "cut completions not judged: no raw text to compare with and no max_length (give dlcheck_raw_dataset, or "
            "a Trainer whose arguments set max_length)",
        ]
    )


# clean real pipelines of other shapes: neither L2 nor L13 may fail on them
CLEAN_TRL = """
    import pytest, tiny
    from datasets import Dataset
    from trl import SFTConfig, SFTTrainer

    MESSAGES = [[{{"role": "user", "content": p}}, {{"role": "assistant", "content": c.strip()}}]
                for p, c in zip(tiny.PROMPTS, tiny.COMPLETIONS)]

    @pytest.fixture(scope="session")
    def dlcheck_trainer(tmp_path_factory):
        tok = tiny.tokenizer()
        args = tiny.trainer_args(tmp_path_factory.mktemp("out"), SFTConfig, {kwargs})
        return SFTTrainer(model=tiny.llama(tok), args=args, train_dataset=Dataset.from_dict({data}),
                          processing_class=tok)
"""
CLEAN_LEFT_PADDED = """
    import pytest, tiny
    from transformers import DataCollatorForLanguageModeling

    @pytest.fixture(scope="session")
    def dlcheck_tokenizer():
        return tiny.tokenizer(padding_side="left")

    @pytest.fixture(scope="session")
    def dlcheck_collator(dlcheck_tokenizer):
        return DataCollatorForLanguageModeling(dlcheck_tokenizer, mlm=False)

    @pytest.fixture(scope="session")
    def dlcheck_dataset(dlcheck_tokenizer):
        return tiny.tokenized(dlcheck_tokenizer)
"""


@pytest.mark.parametrize(
    "conftest",
    [
        CLEAN_TRL.format(data='{"text": tiny.texts(12)}', kwargs=""),
        CLEAN_TRL.format(
            data='{"prompt": [m[:1] for m in MESSAGES] * 2, "completion": [m[1:] for m in MESSAGES] * 2}', kwargs=""
        ),
        CLEAN_TRL.format(
            data='{"messages": MESSAGES * 2}', kwargs="packing=True, max_length=32, assistant_only_loss=True"
        ),
        CLEAN_LEFT_PADDED,
    ],
    ids=["trl-text", "trl-conversational-prompt-completion", "trl-packed-assistant-only", "left-padded-lm-collator"],
)
def test_clean_pipelines_do_not_fail(project, conftest):
    project.conftest(conftest)
    run = project.run("--dlcheck=L2,L13")
    assert run.outcome("L13") == "passed", run.text
    assert run.outcome("L2") in ("passed", "skipped"), run.text


# ---- detection logic ------------------------------------------------------------------------------


def _example(ids, eos=0):
    row = Row(0, 0, ids, [1] * len(ids), list(ids), None)
    return Example(row, list(range(len(ids))), None, targets=list(range(1, len(ids))))


@pytest.mark.parametrize(
    "lengths,ends,expected",
    [
        ([8, 8, 8, 5], [9, 9, 9, 0], 8),  # three stop at 8 without EOS, a shorter one ends with EOS
        ([8, 7, 6, 5], [9, 0, 0, 0], None),  # one at the longest length: a long example, not a limit
        ([8, 8, 6, 5], [9, 9, 9, 9], None),  # the pipeline appends no EOS at all: no evidence of a limit
    ],
)
def test_inferred_truncation_limit(lengths, ends, expected):
    examples = [_example([5] * (n - 1) + [e]) for n, e in zip(lengths, ends)]
    assert _infer_limit(examples, eos=0) == expected


@pytest.mark.parametrize(
    "content,full,expected",
    [
        ([1, 2, 3, 0], [1, 2, 3, 0], "none"),  # complete
        ([1, 2, 3, 0], [1, 2, 3], "none"),  # the collator appended EOS itself
        ([7, 1, 2, 3], [1, 2, 3], "none"),  # a BOS the reference tokenization lacks
        ([1, 2], [1, 2, 3, 0], "end"),  # keep_start truncation: end and EOS cut
        ([3, 0], [1, 2, 3, 0], "start"),  # truncation_side="left"
        ([1, 5, 3], [1, 2, 3, 0], None),  # not this example's tokens: undecided
    ],
)
def test_relation_to_the_complete_tokenization(content, full, expected):
    assert _relation(content, full) == expected
