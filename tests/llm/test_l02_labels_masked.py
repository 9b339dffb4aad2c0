"""L2: labels are -100 on padding and, under completion-only training, on the prompt."""

import pytest

# imported once here: pytester drops modules first imported inside a run, and datasets (pyarrow
# extension types) cannot be imported twice in one process
from datasets import Dataset  # noqa: F401
from helpers import flat
from transformers import (  # noqa: F401
    AutoModelForCausalLM,
    DataCollatorForLanguageModeling,
    LlamaConfig,
    PreTrainedTokenizerFast,
    Trainer,
    TrainingArguments,
)
from trl import SFTConfig, SFTTrainer  # noqa: F401

HEAD = """
    import pytest, tiny, torch
    from datasets import Dataset

    @pytest.fixture(scope="session")
    def tok():
        return tiny.tokenizer(pad={pad})
"""

# transformers Trainer + DataCollatorForLanguageModeling(mlm=False) on a dataset tokenized from
# prompt+completion that keeps its prompt/completion columns: the prompt is trained too
HF_LM_COLLATOR_ON_PROMPT_COMPLETION = (
    HEAD.format(pad="tiny.PAD")
    + """
    from transformers import DataCollatorForLanguageModeling, Trainer

    @pytest.fixture(scope="session")
    def dlcheck_trainer(tok, tmp_path_factory):
        ds = Dataset.from_dict({"prompt": tiny.PROMPTS * 2, "completion": tiny.COMPLETIONS * 2})
        ds = ds.map(lambda r: tok(r["prompt"] + r["completion"] + tok.eos_token))
        return Trainer(model=tiny.llama(tok), args=tiny.trainer_args(tmp_path_factory.mktemp("out")),
                       train_dataset=ds, processing_class=tok,
                       data_collator=DataCollatorForLanguageModeling(tok, mlm=False))
"""
)

# the same without a Trainer: the collated columns as dlcheck_dataset, every column as dlcheck_raw_dataset
HF_LM_COLLATOR_FIXTURES = (
    HEAD.format(pad="tiny.PAD")
    + """
    from transformers import DataCollatorForLanguageModeling

    @pytest.fixture(scope="session")
    def dlcheck_tokenizer(tok):
        return tok

    @pytest.fixture(scope="session")
    def dlcheck_collator(tok):
        return DataCollatorForLanguageModeling(tok, mlm=False)

    @pytest.fixture(scope="session")
    def dlcheck_raw_dataset(tok):
        ds = Dataset.from_dict({"prompt": tiny.PROMPTS * 2, "completion": tiny.COMPLETIONS * 2})
        return ds.map(lambda r: tok(r["prompt"] + r["completion"] + tok.eos_token))

    @pytest.fixture(scope="session")
    def dlcheck_dataset(dlcheck_raw_dataset):
        return dlcheck_raw_dataset.remove_columns(["prompt", "completion"])
"""
)

# a user collator that formats and tokenizes prompt+completion itself; it masks the prompt fully
# ("full"), two tokens short ("short") or not at all ("none"); labels aligned with input_ids, or
# pre-shifted by one for a custom loss (shift=True)
USER_COLLATOR = (
    HEAD.format(pad="tiny.PAD")
    + """
    class PromptCompletionCollator:
        def __init__(self, tok, template, mask, shift):
            self.tok, self.template, self.mask, self.shift = tok, template, mask, shift

        def __call__(self, rows):
            head = [self.template.split("{completion}")[0].format(prompt=r["prompt"]) for r in rows]
            texts = [self.template.format(**r) + self.tok.eos_token for r in rows]
            enc = self.tok(texts, padding=True, return_tensors="pt")
            ids, attn = enc["input_ids"], enc["attention_mask"]
            labels = ids.clone()
            for i, h in enumerate(head):
                n = len(self.tok(h)["input_ids"])
                labels[i, : {"full": n, "short": n - 2, "none": 0}[self.mask]] = -100
            labels[attn == 0] = -100
            if self.shift:  # labels[j] is the target of position j: the next token
                labels = torch.cat([labels[:, 1:], torch.full_like(labels[:, :1], -100)], dim=1)
            enc["labels"] = labels
            return enc

    @pytest.fixture(scope="session")
    def dlcheck_tokenizer(tok):
        return tok

    @pytest.fixture(scope="session")
    def dlcheck_collator(tok):
        return PromptCompletionCollator(tok, {template!r}, {mask!r}, {shift})

    @pytest.fixture(scope="session")
    def dlcheck_dataset():
        return [dict(prompt=p, completion=c) for p, c in zip(tiny.PROMPTS * 2, tiny.COMPLETIONS * 2)]
"""
)
PLAIN = "{prompt}{completion}"
FORMATTED = "### Question: {prompt}\n### Answer:{completion}"


def user_collator(template=PLAIN, mask="full", shift=False):
    return (
        USER_COLLATOR.replace("{template!r}", repr(template))
        .replace("{mask!r}", repr(mask))
        .replace("{shift}", str(shift))
    )


# a hand collator over pre-tokenized text: labels = input_ids (padding kept) or masked by attention
HAND_PAD_COLLATOR = (
    HEAD.format(pad="{pad}")
    + """
    class Collate:
        def __init__(self, tok):
            self.tok = tok

        def __call__(self, rows):
            batch = self.tok.pad(rows, return_tensors="pt")
            batch["labels"] = batch["input_ids"].clone()
            if {mask_pad}:
                batch["labels"][batch["attention_mask"] == 0] = -100
            return batch

    @pytest.fixture(scope="session")
    def dlcheck_tokenizer(tok):
        return tok

    @pytest.fixture(scope="session")
    def dlcheck_collator(tok):
        return Collate(tok)

    @pytest.fixture(scope="session")
    def dlcheck_dataset(tok):
        return tiny.tokenized(tok)
"""
)

TRL_SFT = (
    HEAD.format(pad="tiny.PAD")
    + """
    from trl import SFTConfig, SFTTrainer

    MESSAGES = [[{{"role": "user", "content": p}}, {{"role": "assistant", "content": c.strip()}}]
                for p, c in zip(tiny.PROMPTS, tiny.COMPLETIONS)]

    @pytest.fixture(scope="session")
    def dlcheck_trainer(tok, tmp_path_factory):
        if {messages}:
            ds = Dataset.from_dict({{"messages": MESSAGES * 2}})
        else:
            ds = Dataset.from_dict({{"prompt": tiny.PROMPTS * 2, "completion": tiny.COMPLETIONS * 2}})
        args = tiny.trainer_args(tmp_path_factory.mktemp("out"), SFTConfig, {kwargs})
        return SFTTrainer(model=tiny.llama(tok), args=args, train_dataset=ds, processing_class=tok)
"""
)

# a hand collator over conversations: chat template applied, labels copied (padding masked)
CHAT_COLLATOR = (
    HEAD.format(pad="tiny.PAD")
    + """
    MESSAGES = [[{"role": "system", "content": "be brief"}, {"role": "user", "content": p},
                 {"role": "assistant", "content": c.strip()}] for p, c in zip(tiny.PROMPTS, tiny.COMPLETIONS)]

    class ChatCollator:
        def __init__(self, tok):
            self.tok = tok

        def __call__(self, rows):
            enc = [self.tok.apply_chat_template(r["messages"], tokenize=True, return_dict=True) for r in rows]
            batch = self.tok.pad([{"input_ids": e["input_ids"]} for e in enc], return_tensors="pt")
            batch["labels"] = batch["input_ids"].masked_fill(batch["attention_mask"] == 0, -100)
            return batch

    @pytest.fixture(scope="session")
    def dlcheck_tokenizer(tok):
        return tok

    @pytest.fixture(scope="session")
    def dlcheck_collator(tok):
        return ChatCollator(tok)

    @pytest.fixture(scope="session")
    def dlcheck_dataset():
        return [{"messages": m} for m in MESSAGES * 2]
"""
)


# ---- buggy ----------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "conftest", [HF_LM_COLLATOR_ON_PROMPT_COMPLETION, HF_LM_COLLATOR_FIXTURES], ids=["trainer", "raw_dataset"]
)
def test_hf_lm_collator_trains_the_prompt(project, conftest):
    project.conftest(conftest)
    run = project.run("--dlcheck=L2")
    run.assert_outcome("L2", "failed")
    text = flat(run.section("L2"))
    assert "8 of 8 sampled prompt/completion examples supervise prompt tokens" in text
    assert "supervised: 'what is 2+2? The answer is 4.<|endoftext|>'" in text
    assert "expected only: ' The answer is 4.'" in text
    assert "(prompt text: 'what is 2+2?')" in text
    assert "labels on the prompt: 'w'(93)→93, 'hat'(274)→274" in text
    assert "DataCollatorForLanguageModeling(mlm=False) copies input_ids into labels" in text
    assert "completion_only_loss" in text and "labels[:n_prompt] = -100" in text
    assert "Traceback" not in run.text


def test_user_collator_tokenizing_prompt_plus_completion(project):
    project.conftest(user_collator(mask="none"))
    run = project.run("--dlcheck=L2")
    run.assert_outcome("L2", "failed")
    text = flat(run.section("L2"))
    assert "8 of 8 sampled prompt/completion examples supervise prompt tokens" in text
    assert "labels are a copy of input_ids over the whole example" in text


def test_prompt_masking_that_stops_short(project):
    project.conftest(user_collator(mask="short"))
    run = project.run("--dlcheck=L2")
    run.assert_outcome("L2", "failed")
    text = flat(run.section("L2"))
    assert "supervise prompt tokens: 16 of 42 prompt positions carry labels != -100" in text
    assert "masking stops short" in text


def test_formatted_prompt_located_by_its_text(project):
    # "### Question: {prompt}\n### Answer:{completion}": the prompt is found in the decoded example
    project.conftest(user_collator(template=FORMATTED, mask="none"))
    run = project.run("--dlcheck=L2")
    run.assert_outcome("L2", "failed")
    text = flat(run.section("L2"))
    assert "8 of 8 sampled prompt/completion examples supervise prompt tokens" in text
    assert "'### Question: what is 2+2?\\n### Answer: The answer is 4.<|endoftext|>'" in text


def test_hand_collator_supervises_padding(project):
    project.conftest(HAND_PAD_COLLATOR.replace("{pad}", "tiny.EOS").replace("{mask_pad}", "False"))
    run = project.run("--dlcheck=L2")
    run.assert_outcome("L2", "failed")
    text = flat(run.section("L2"))
    assert "sampled examples supervise padding" in text
    assert "positions with attention_mask 0 have labels != -100 (label values there: 0 ('<|endoftext|>')" in text
    assert "'<|endoftext|>'(0)→0" in text
    assert "copies input_ids into labels and never sets the padding to -100" in text
    assert "pad_token == eos_token" in text
    assert "labels[attention_mask == 0] = -100" in text


def test_chat_collator_trains_user_turns(project):
    project.conftest(CHAT_COLLATOR)
    run = project.run("--dlcheck=L2")
    run.assert_outcome("L2", "failed")
    text = flat(run.section("L2"))
    assert "sampled messages examples supervise user/system-turn tokens" in text
    assert "assistant_only_loss=True" in text and "{% generation %}" in text


# ---- clean twins ----------------------------------------------------------------------------------


def test_trl_sft_prompt_completion_is_completion_only(project):
    project.conftest(TRL_SFT.format(messages=False, kwargs=""))
    run = project.run("--dlcheck=L2", "-rA")
    run.assert_outcome("L2", "passed")
    run.fnmatch(["*::L2_labels_masked PASSED (padding: 0 of 8 sampled rows supervise any of their 48 paddin*"])
    run.fnmatch(
        [
            "padding: 0 of 8 sampled rows supervise any of their 48 padding positions (attention_mask 0); source: "
            "dlcheck_collator on 8 examples of dlcheck_dataset",
            "prompt: 0 of 8 sampled prompt/completion examples supervise any of their 50 prompt tokens",
        ]
    )


def test_trl_sft_assistant_only_loss_on_messages(project):
    # TRL drops the messages column before collation (remove_unused_columns); the raw_dataset role derived
    # from the trainer still holds it, so the user turns are located and judged
    project.conftest(TRL_SFT.format(messages=True, kwargs="assistant_only_loss=True"))
    run = project.run("--dlcheck=L2", "-rA")
    run.assert_outcome("L2", "passed")
    run.fnmatch(["prompt: 0 of 8 sampled messages examples supervise any of their 50 user/system-turn tokens"])


# the same messages training, handed over as TRL's own train dataloader and the raw examples beside it
TRL_DATALOADER = """
    import pytest, tiny
    from datasets import Dataset
    from trl import SFTConfig, SFTTrainer

    @pytest.fixture(scope="session")
    def trainer(tmp_path_factory):
        tok = tiny.tokenizer()
        {bos}
        ds = Dataset.from_dict({{"messages": [[{{"role": "user", "content": p}}, {{"role": "assistant", "content": c}}]
                                             for p, c in zip(tiny.PROMPTS, tiny.COMPLETIONS)]}})
        args = tiny.trainer_args(tmp_path_factory.mktemp("out"), SFTConfig, assistant_only_loss=True)
        return SFTTrainer(model=tiny.llama(tok), args=args, train_dataset=ds, processing_class=tok)

    @pytest.fixture(scope="session")
    def dlcheck_tokenizer(trainer):
        return trainer.processing_class

    @pytest.fixture(scope="session")
    def dlcheck_dataloader(trainer):
        return trainer.get_train_dataloader()   # the messages column is dropped before collation

    @pytest.fixture(scope="session")
    def dlcheck_raw_dataset(trainer):
        return trainer.train_dataset            # still holds it
"""


def test_dataloader_batches_do_not_ask_for_the_raw_dataset_already_given(project):
    project.conftest(TRL_DATALOADER.format(bos="pass"))
    run = project.run("--dlcheck=L2", "-rA")
    run.assert_outcome("L2", "passed")
    run.fnmatch(
        [
            "padding: 0 of 6 sampled rows supervise any of their * padding positions (attention_mask 0); source: "
            "3 batches of dlcheck_dataloader",
            "prompt: not judged, the rows of 3 batches of dlcheck_dataloader cannot be matched to their raw examples: "
            "define dlcheck_collator and dlcheck_dataset (the examples as the collator takes them; "
            "dlcheck_raw_dataset in the same order when the dataset lost its text columns), or dlcheck_trainer",
        ]
    )
    assert "no prompt/completion or messages split" not in run.text


def test_hand_collator_masking_prompt_and_padding(project):
    project.conftest(user_collator(mask="full"))
    run = project.run("--dlcheck=L2", "-rA")
    run.assert_outcome("L2", "passed")
    run.fnmatch(["prompt: 0 of 8 sampled prompt/completion examples supervise any of their 50 prompt tokens"])


@pytest.mark.parametrize("template,shift,n_prompt", [(FORMATTED, False, 46), (PLAIN, True, 50)])
def test_formatted_or_pre_shifted_labels_masking_the_prompt(project, template, shift, n_prompt):
    project.conftest(user_collator(template=template, mask="full", shift=shift))
    run = project.run("--dlcheck=L2", "-rA")
    run.assert_outcome("L2", "passed")
    run.fnmatch([f"prompt: 0 of 8 sampled prompt/completion examples supervise any of their {n_prompt} prompt tokens"])


def test_pad_eq_eos_masked_by_attention_is_fine(project):
    project.conftest(HAND_PAD_COLLATOR.replace("{pad}", "tiny.EOS").replace("{mask_pad}", "True"))
    run = project.run("--dlcheck=L2", "-rA")
    run.assert_outcome("L2", "passed")
    run.fnmatch(
        [
            "padding: 0 of 8 sampled rows supervise any of their 48 padding positions (attention_mask 0)*",
            "prompt: not judged, the data has no prompt/completion or messages split that L2 can see: the examples "
            "hold token ids only; if they were prompt/completion or messages before tokenization, define "
            "dlcheck_raw_dataset with those rows, in the same order",
        ]
    )


def test_packed_batches_without_split_skip_naming_why(project):
    project.conftest(
        HEAD.format(pad="tiny.PAD")
        + """
    from transformers import DataCollatorWithFlattening

    @pytest.fixture(scope="session")
    def dlcheck_tokenizer(tok):
        return tok

    @pytest.fixture(scope="session")
    def dlcheck_collator():
        return DataCollatorWithFlattening()

    @pytest.fixture(scope="session")
    def dlcheck_dataset(tok):
        return tiny.tokenized(tok)
"""
    )
    run = project.run("--dlcheck=L2")
    run.assert_outcome("L2", "skipped")
    # padding-free rows hold no padding; whether the pre-tokenized examples had a prompt is unknown: unsure
    run.fnmatch(
        [
            "SKIPPED * batches from dlcheck_collator on 8 examples of dlcheck_dataset are padding-free "
            "(position_ids, no attention_mask): no padding to judge, and the data has no prompt/completion or "
            "messages split that L2 can see: the examples hold token ids only*define dlcheck_raw_dataset*"
        ]
    )
    assert "not applicable" not in run.text


def test_packed_plain_text_is_not_applicable(project):
    # flattened rows of plain text: no padding to supervise, no prompt to mask
    project.conftest(
        HEAD.format(pad="tiny.PAD")
        + """
    from transformers import DataCollatorWithFlattening

    class TokenizeText:
        def __init__(self, tok):
            self.tok, self.flatten = tok, DataCollatorWithFlattening()

        def __call__(self, rows):
            return self.flatten([self.tok(r["text"] + self.tok.eos_token) for r in rows])

    @pytest.fixture(scope="session")
    def dlcheck_tokenizer(tok):
        return tok

    @pytest.fixture(scope="session")
    def dlcheck_collator(tok):
        return TokenizeText(tok)

    @pytest.fixture(scope="session")
    def dlcheck_dataset():
        return [{"text": t} for t in tiny.texts()]
"""
    )
    run = project.run("--dlcheck=L2")
    run.fnmatch(
        [
            "*::L2_labels_masked SKIPPED (*not applicable: *",
            "SKIPPED * not applicable: batches from dlcheck_collator on 8 examples of dlcheck_dataset are "
            "padding-free (position_ids, no attention_mask): no padding to judge, and the data has no "
            "prompt/completion or messages split",
        ]
    )


# ---- explicit opt-outs ----------------------------------------------------------------------------


def test_setting_opts_out_of_completion_only(project):
    project.conftest(HF_LM_COLLATOR_ON_PROMPT_COMPLETION)
    run = project.run("--dlcheck=L2", "-rA", "--dlcheck-set", "L2.completion_only=false")
    run.assert_outcome("L2", "passed")
    run.fnmatch(["prompt: not judged, completion-only training is off (L2.completion_only is false)"])


@pytest.mark.parametrize(
    "messages,kwargs,opt_out",
    [(False, "completion_only_loss=False", "completion_only_loss=False"), (True, "", "assistant_only_loss=False")],
)
def test_trl_full_sequence_training_is_respected(project, messages, kwargs, opt_out):
    project.conftest(TRL_SFT.format(messages=messages, kwargs=kwargs))
    run = project.run("--dlcheck=L2", "-rA")
    run.assert_outcome("L2", "passed")
    run.fnmatch([f"prompt: not judged, completion-only training is off (SFTConfig({opt_out}))"])


MASKED_DATASET = """
    import pytest, tiny
    from transformers import {collator}

    @pytest.fixture(scope="session")
    def dlcheck_tokenizer():
        return tiny.tokenizer()

    @pytest.fixture(scope="session")
    def dlcheck_dataset(dlcheck_tokenizer):
        tok, rows = dlcheck_tokenizer, []
        for prompt, completion in zip(tiny.PROMPTS, tiny.COMPLETIONS):
            p = tok(prompt)["input_ids"]
            ids = tok(prompt + completion + tok.eos_token)["input_ids"]
            # the user masked the prompt in the dataset itself
            rows.append({{"input_ids": ids, "attention_mask": [1] * len(ids), "labels": [-100] * len(p) + ids[len(p):]}})
        return rows

    @pytest.fixture(scope="session")
    def dlcheck_collator(dlcheck_tokenizer):
        return {make}
"""


def test_a_collator_that_rebuilds_labels_throws_the_prompt_masking_away(project):
    project.conftest(
        MASKED_DATASET.format(
            collator="DataCollatorForLanguageModeling",
            make="(lambda c: lambda rows: c([{k: r[k] for k in ('input_ids', 'attention_mask')} for r in rows]))"
            "(DataCollatorForLanguageModeling(dlcheck_tokenizer, mlm=False))",
        )
    )
    run = project.run("--dlcheck=L2")
    run.assert_outcome("L2", "failed")
    text = flat(run.section("L2"))
    assert "sampled examples arrive with labels that mask positions (-100)" in text
    assert "the collator rebuilds labels from input_ids" in text and "DataCollatorForSeq2Seq" in text


def test_a_collator_that_keeps_the_datasets_labels_passes(project):
    project.conftest(
        MASKED_DATASET.format(
            collator="DataCollatorForSeq2Seq", make="DataCollatorForSeq2Seq(dlcheck_tokenizer, padding=True)"
        )
    )
    run = project.run("--dlcheck=L2", "-rA")
    run.assert_outcome("L2", "passed")
    run.fnmatch(
        [
            "dataset labels: the labels 6 sampled examples carry were compared with the collated ones: all * positions "
            "they mask (-100) stay -100"
        ]
    )


# the dataset tokenized as many tutorials do it: padded to max_length, the prompt and the padding masked in its labels
PADDED_MASKED_DATASET = """
    import pytest, tiny
    from transformers import {collator}

    @pytest.fixture(scope="session")
    def dlcheck_tokenizer():
        return tiny.tokenizer()

    @pytest.fixture(scope="session")
    def dlcheck_dataset(dlcheck_tokenizer):
        tok, rows = dlcheck_tokenizer, []
        for prompt, completion in zip(tiny.PROMPTS, tiny.COMPLETIONS):
            n = len(tok(prompt)["input_ids"])
            enc = tok(prompt + completion + tok.eos_token, padding="max_length", max_length=40)
            ids, mask = enc["input_ids"], enc["attention_mask"]
            rows.append({{"input_ids": ids, "attention_mask": mask,
                         "labels": [t if k >= n and m else -100 for k, (t, m) in enumerate(zip(ids, mask))]}})
        return rows

    @pytest.fixture(scope="session")
    def dlcheck_collator(dlcheck_tokenizer):
        return {make}
"""


def test_a_collator_that_rebuilds_the_labels_of_padded_examples(project):
    # DataCollatorForLanguageModeling(mlm=False) on examples the dataset padded itself: labels = input_ids with the
    # padding masked, the prompt the dataset masked supervised again
    project.conftest(
        PADDED_MASKED_DATASET.format(
            collator="DataCollatorForLanguageModeling",
            make="DataCollatorForLanguageModeling(dlcheck_tokenizer, mlm=False)",
        )
    )
    run = project.run("--dlcheck=L2")
    run.assert_outcome("L2", "failed")
    text = flat(run.section("L2"))
    assert (
        "6 of 6 sampled examples arrive with labels that mask positions (-100) and leave the collator with those "
        "positions supervised (36 of the 36 positions the dataset's labels mask)"
    ) in text
    # the example, and the positions the dataset masked that the collator supervises, decoded
    assert "example 0.0 (dataset row 0): 'what is 2+2? The answer is 4.<|endoftext|>'" in text
    assert "masked by the dataset, supervised by the collator (6 tokens, positions 1-6): 'hat is 2+2?'" in text
    assert "collated labels there: 'hat'(274)→274, 'Ġis'(271)→271" in text
    assert (
        "the collator rebuilds labels from input_ids (DataCollatorForLanguageModeling sets labels = input_ids)" in text
    )
    assert "DataCollatorForSeq2Seq(tokenizer, padding=True)" in text


def test_a_collator_that_keeps_the_labels_of_padded_examples_passes(project):
    project.conftest(
        PADDED_MASKED_DATASET.format(
            collator="DataCollatorForSeq2Seq", make="DataCollatorForSeq2Seq(dlcheck_tokenizer, padding=True)"
        )
    )
    run = project.run("--dlcheck=L2", "-rA")
    run.assert_outcome("L2", "passed")
    run.fnmatch(
        [
            "dataset labels: the labels 6 sampled examples carry were compared with the collated ones: all * positions "
            "they mask (-100) stay -100"
        ]
    )


# alpaca-style raw rows: the text sits in columns of the script's own names, and dlcheck_raw_dataset is given
CUSTOM_TEXT_COLUMNS = (
    HAND_PAD_COLLATOR
    + """
    ROWS = [{{"instruction": p, "output": c}} for p, c in zip(tiny.PROMPTS * 2, tiny.COMPLETIONS * 2)]

    @pytest.fixture(scope="session")
    def dlcheck_raw_dataset():
        return ROWS

    @pytest.fixture(scope="session")
    def dlcheck_dataset(tok):
        return [tok(r["instruction"] + r["output"] + tok.eos_token) for r in ROWS]
"""
)


@pytest.mark.parametrize("mask_pad", [True, False], ids=["masked", "padding_trained"])
def test_raw_rows_with_text_under_other_names_are_not_asked_for_again(project, mask_pad):
    """A dlcheck_raw_dataset whose text sits in instruction/output: the prompt half is not judged and says which
    columns hold the text, never asking for the fixture already given; the padding half still judges (its buggy
    twin fails)."""
    project.conftest(
        CUSTOM_TEXT_COLUMNS.replace("{{", "{")
        .replace("}}", "}")
        .replace("{pad}", "tiny.EOS")
        .replace("{mask_pad}", str(mask_pad))
    )
    run = project.run("--dlcheck=L2", "-rA")
    run.assert_outcome("L2", "passed" if mask_pad else "failed")
    text = flat(run.section("L2")) if not mask_pad else run.text
    assert "define dlcheck_raw_dataset" not in run.text
    if mask_pad:
        run.fnmatch(
            [
                "prompt: not judged, no prompt/completion or messages split that L2 can see: the raw examples hold "
                "their text in instruction, output, none of the fields L2 reads as one*"
            ]
        )
    else:
        assert "sampled examples supervise padding" in text
