"""L12: no doubled BOS; training conversations tokenize as tokenizer.apply_chat_template does."""

# Imported here, outside pytester's in-process runs (a run unloads the modules first imported inside it).
import datasets  # noqa: F401
import pytest
import tokenizers.processors  # noqa: F401
from helpers import flat
from transformers import CLIPTokenizer, DataCollatorForLanguageModeling  # noqa: F401
from trl import SFTConfig, SFTTrainer  # noqa: F401

from pytest_dlcheck.checks.llm.chat_format import compare, conversation

# A tokenizer whose post-processor prepends BOS (as Llama's and Gemma's do) and whose chat template
# writes the BOS text itself: rendering to text and tokenizing with add_special_tokens=True doubles it.
CHAT = """
    import pytest, tiny
    from tokenizers import processors
    from transformers import DataCollatorForLanguageModeling

    def bos_tokenizer():
        tok = tiny.tokenizer()
        bos = tok.bos_token_id
        tok.backend_tokenizer.post_processor = processors.TemplateProcessing(
            single="<|bos|> $A", pair="<|bos|> $A <|bos|> $B", special_tokens=[("<|bos|>", bos)])
        tok.chat_template = "{{{{ bos_token }}}}" + tiny.CHAT_TEMPLATE
        return tok

    CONVERSATIONS = [[{{"role": "user", "content": p}}, {{"role": "assistant", "content": c}}]
                     for p, c in zip(tiny.PROMPTS, tiny.COMPLETIONS)]

    def hand_format(messages):
        return "".join(f"### {{m['role'].title()}}: {{m['content']}}\\n" for m in messages)

    @pytest.fixture(scope="session")
    def dlcheck_tokenizer():
        return bos_tokenizer()

    @pytest.fixture(scope="session")
    def dlcheck_raw_dataset():
        return [{{"messages": m}} for m in CONVERSATIONS]

    @pytest.fixture(scope="session")
    def dlcheck_dataset(dlcheck_tokenizer, dlcheck_raw_dataset):
        tok = dlcheck_tokenizer
        out = []
        for row in dlcheck_raw_dataset:
            m = row["messages"]
            out.append({{"input_ids": {tokenize}}})
        return out

    @pytest.fixture(scope="session")
    def dlcheck_collator(dlcheck_tokenizer):
        return DataCollatorForLanguageModeling(dlcheck_tokenizer, mlm=False)
"""

RENDER_THEN_TOKENIZE = 'tok(tok.apply_chat_template(m, tokenize=False))["input_ids"]'
TEMPLATE_TOKENIZE = 'tok.apply_chat_template(m, tokenize=True)["input_ids"]'
RENDER_NO_SPECIAL = 'tok(tok.apply_chat_template(m, tokenize=False), add_special_tokens=False)["input_ids"]'
HAND_FORMAT = 'tok(hand_format(m), add_special_tokens=False)["input_ids"]'


def test_template_bos_plus_add_special_tokens_doubles_bos(project):
    project.conftest(CHAT.format(tokenize=RENDER_THEN_TOKENIZE))
    run = project.run("--dlcheck=L12")
    run.assert_outcome("L12", "failed")
    text = flat(run.section("L12"))
    assert "6 of 6 sampled sequences start with two BOS tokens '<|bos|>' (id 2)" in text
    assert "example 0.0: '<|bos|><|bos|><|user|>what is 2+2?<|end|>" in text
    assert "ids [2, 2, 3," in text
    assert "also: 6 of 6 sampled conversations tokenize differently" in text
    assert "the chat template writes the BOS text itself ({{ bos_token }})" in text
    assert "add_special_tokens=True" in text
    assert "apply_chat_template(messages, tokenize=True)" in text and "add_special_tokens=False" in text


def test_hand_written_format_differs_from_the_template(project):
    project.conftest(CHAT.format(tokenize=HAND_FORMAT))
    run = project.run("--dlcheck=L12")
    run.assert_outcome("L12", "failed")
    text = flat(run.section("L12"))
    assert (
        "6 of 6 sampled conversations tokenize differently in training than with "
        "tokenizer.apply_chat_template(messages, tokenize=True)" in text
    )
    assert "first difference at token 0: training '#'" in text and "template '<|bos|>'(2)" in text
    assert "training: '### User: what is 2+2?" in text
    assert "template: '<|bos|><|user|>what is 2+2?<|end|><|assistant|> The answer is 4.<|end|>'" in text
    assert "its own format" in text
    assert "tokenizer.chat_template" in text


def test_bos_added_by_tokenization_but_not_by_the_template(project):
    # the template writes no BOS, the training tokenization adds one: inference prompts lack it
    source = CHAT.format(tokenize=RENDER_THEN_TOKENIZE).replace('"{{ bos_token }}" + ', "")
    project.conftest(source)
    run = project.run("--dlcheck=L12")
    run.assert_outcome("L12", "failed")
    text = flat(run.section("L12"))
    assert "training '<|bos|>'(2), template '<|user|>'(3)" in text
    assert "adds a BOS '<|bos|>' (add_special_tokens=True) that apply_chat_template does not" in text


@pytest.mark.parametrize("tokenize", [TEMPLATE_TOKENIZE, RENDER_NO_SPECIAL], ids=["template", "no-special-tokens"])
def test_one_bos_and_the_template_format_pass(project, tokenize):
    project.conftest(CHAT.format(tokenize=tokenize))
    run = project.run("--dlcheck=L12", "-rA")
    run.assert_outcome("L12", "passed")
    run.fnmatch(["*::L12_chat_format PASSED (BOS: 0 of 6 sampled sequences start with two BOS tokens*"])
    run.fnmatch(
        [
            "BOS: 0 of 6 sampled sequences start with two BOS tokens '<|bos|>' (id 2); 6 start with one",
            "chat format: 6 of 6 sampled conversations tokenize as tokenizer.apply_chat_template(messages, "
            "tokenize=True)",
        ]
    )


TRL_MESSAGES = """
    import pytest, tiny
    from datasets import Dataset
    from trl import SFTConfig, SFTTrainer

    @pytest.fixture(scope="session")
    def dlcheck_trainer(tmp_path_factory):
        tok = tiny.tokenizer()
        data = Dataset.from_dict({"messages": [[{"role": "user", "content": p}, {"role": "assistant", "content": c}]
                                               for p, c in zip(tiny.PROMPTS, tiny.COMPLETIONS)]})
        return SFTTrainer(model=tiny.llama(tok), processing_class=tok, train_dataset=data,
                          args=tiny.trainer_args(tmp_path_factory.mktemp("out"), SFTConfig, assistant_only_loss=True))
"""


def test_trl_sft_trainer_on_messages_passes(project):
    # TRL drops the messages column before collation; the raw_dataset role (the trainer's train_dataset) keeps it
    project.conftest(TRL_MESSAGES)
    run = project.run("--dlcheck=L12", "-rA")
    run.assert_outcome("L12", "passed")
    run.fnmatch(
        [
            "BOS: 0 of 6 sampled sequences start with two BOS tokens '<|bos|>' (id 2); 0 start with one",
            "chat format: 6 of 6 sampled conversations tokenize as tokenizer.apply_chat_template(messages, "
            "tokenize=True)",
        ]
    )


# the same training handed over as TRL's own dataloader, the raw examples beside it, and a tokenizer without BOS
# (Qwen-style): the batches cannot be matched to their conversations, which dlcheck_raw_dataset does not change
TRL_DATALOADER = (
    TRL_MESSAGES.replace(
        "def dlcheck_trainer(tmp_path_factory):\n        tok = tiny.tokenizer()",
        "def trainer(tmp_path_factory):\n        tok = tiny.tokenizer()\n        tok.bos_token = None",
    )
    + """
    @pytest.fixture(scope="session")
    def dlcheck_tokenizer(trainer):
        return trainer.processing_class

    @pytest.fixture(scope="session")
    def dlcheck_dataloader(trainer):
        return trainer.get_train_dataloader()

    @pytest.fixture(scope="session")
    def dlcheck_raw_dataset(trainer):
        return trainer.train_dataset
"""
)


def test_dataloader_batches_name_the_fixtures_that_match_them(project):
    project.conftest(TRL_DATALOADER)
    run = project.run("--dlcheck=L12")
    run.assert_outcome("L12", "skipped")
    run.fnmatch(
        [
            "SKIPPED * the tokenizer has no BOS token; and no conversation compared: the data holds conversations, "
            "but the rows of 3 batches of dlcheck_dataloader cannot be matched to their raw examples: define "
            "dlcheck_collator and dlcheck_dataset (the examples as the collator takes them; dlcheck_raw_dataset in "
            "the same order when the dataset lost its text columns), or dlcheck_trainer"
        ]
    )
    assert "carry no conversations" not in run.text


# a text-to-image training set-up as diffusers' train_text_to_image.py builds it: a real CLIP tokenizer (vocabulary
# made in place: bytes, no merges) tokenizes captions padded to max_length, beside the images
CLIP_CAPTIONS = """
    import pytest, torch
    from tokenizers import pre_tokenizers
    from transformers import CLIPTokenizer

    @pytest.fixture(scope="session")
    def dlcheck_tokenizer():
        chars = sorted(set(pre_tokenizers.ByteLevel.alphabet()))
        tokens = chars + [c + "</w>" for c in chars] + ["<|startoftext|>", "<|endoftext|>"]
        return CLIPTokenizer(vocab={t: i for i, t in enumerate(tokens)}, merges=[], model_max_length=16)

    @pytest.fixture(scope="session")
    def dlcheck_dataset():
        captions = ["a red square", "a blue circle", "a green triangle", "a yellow star"] * 2
        images = torch.rand(len(captions), 3, 8, 8, generator=torch.Generator().manual_seed(0)) * 2 - 1
        return [{"pixel_values": images[i], "caption": c} for i, c in enumerate(captions)]

    @pytest.fixture(scope="session")
    def dlcheck_collator(dlcheck_tokenizer):
        def collate(examples):
            ids = dlcheck_tokenizer([e["caption"] for e in examples], padding="max_length",
                                    max_length=dlcheck_tokenizer.model_max_length, truncation=True,
                                    return_tensors="pt").input_ids
            return {"pixel_values": torch.stack([e["pixel_values"] for e in examples]), "input_ids": ids}
        return collate
"""


def test_clip_caption_ids_are_not_applicable(project):
    # CLIP's tokenizer has a BOS of its own (<|startoftext|>) and no chat template: its caption ids are no
    # language-model training text, so L12 does not pass on them, it says it does not concern them
    project.conftest(CLIP_CAPTIONS)
    run = project.run("--dlcheck=L12")
    run.fnmatch(
        [
            "*::L12_chat_format SKIPPED (not applicable: *",
            "SKIPPED * not applicable: the batches of dlcheck_collator on 8 examples of dlcheck_dataset pair token "
            "ids with 'pixel_values' and carry no labels: the ids are captions conditioning an image model "
            "(text-to-image, CLIP), not a language model's training text",
        ]
    )


def test_plain_text_without_bos_is_not_applicable(project):
    # a GPT-2-style tokenizer (no BOS of its own) on plain text: no BOS to double, no conversation to compare
    project.conftest("""
        import pytest, tiny
        from datasets import Dataset
        from trl import SFTConfig, SFTTrainer

        @pytest.fixture(scope="session")
        def dlcheck_trainer(tmp_path_factory):
            tok = tiny.tokenizer()
            tok.bos_token = None
            return SFTTrainer(model=tiny.llama(tok), processing_class=tok,
                              train_dataset=Dataset.from_dict({"text": tiny.texts(8)}),
                              args=tiny.trainer_args(tmp_path_factory.mktemp("out"), SFTConfig))
    """)
    run = project.run("--dlcheck=L12")
    run.fnmatch(
        [
            "SKIPPED * not applicable: the tokenizer has no BOS token; and no conversation compared: the sampled "
            "examples carry no conversations ('messages', or a conversational prompt + completion)"
        ]
    )


def test_skips_without_bos_or_conversations(project):
    project.conftest("""
        import pytest, tiny
        from transformers import DataCollatorForLanguageModeling

        @pytest.fixture
        def dlcheck_tokenizer():
            tok = tiny.tokenizer()
            tok.bos_token = None
            return tok

        @pytest.fixture
        def dlcheck_collator(dlcheck_tokenizer):
            return DataCollatorForLanguageModeling(dlcheck_tokenizer, mlm=False)

        @pytest.fixture
        def dlcheck_dataset(dlcheck_tokenizer):
            return tiny.tokenized(dlcheck_tokenizer)
    """)
    run = project.run("--dlcheck=L12")
    run.assert_outcome("L12", "skipped")
    # pre-tokenized examples: the rows before tokenization would let the chat comparison run
    run.fnmatch(
        [
            "SKIPPED * the tokenizer has no BOS token; and no conversation compared: the examples hold token ids "
            "only; if they were conversations before tokenization, define dlcheck_raw_dataset with those rows, in "
            "the same order"
        ]
    )
    assert "not applicable" not in run.text


# ---- unit tests of the comparison ----------------------------------------------------------------


def test_compare_accepts_trailing_eos_and_truncation():
    ref = [2, 3, 10, 11, 6]
    assert compare([2, 3, 10, 11, 6], ref, {0, 1}) == ("match", 5)
    assert compare([2, 3, 10, 11, 6, 0], ref, {0, 1}) == ("match", 5)  # EOS appended after the template
    assert compare([2, 3, 10], ref, {0, 1}) == ("prefix", 3)  # cut short
    assert compare([2, 3, 10, 11, 6, 42], ref, {0, 1}) == ("differ", 5)  # extra content
    assert compare([2, 2, 3, 10, 11, 6], ref, {0, 1}) == ("differ", 1)  # doubled BOS


def test_conversation_formats():
    msgs = [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "yo"}]
    assert conversation({"messages": msgs}) == (msgs, {})
    assert conversation({"prompt": msgs[:1], "completion": msgs[1:]}) == (msgs, {})
    assert conversation({"prompt": "hi", "completion": "yo"}) is None
    assert conversation({"messages": msgs, "tools": '[{"name": "f"}]'})[1] == {"tools": [{"name": "f"}]}
