"""L12: no doubled BOS; training conversations tokenize as tokenizer.apply_chat_template does."""

# Imported here, outside pytester's in-process runs (a run unloads the modules first imported inside it).
import datasets  # noqa: F401
import tokenizers.processors  # noqa: F401
from helpers import flat
from transformers import DataCollatorForLanguageModeling  # noqa: F401
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


def test_apply_chat_template_tokenization_passes(project):
    project.conftest(CHAT.format(tokenize=TEMPLATE_TOKENIZE))
    run = project.run("--dlcheck=L12")
    run.assert_outcome("L12", "passed")


def test_rendered_text_without_special_tokens_passes(project):
    project.conftest(CHAT.format(tokenize=RENDER_NO_SPECIAL))
    run = project.run("--dlcheck=L12")
    run.assert_outcome("L12", "passed")


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
    project.conftest(TRL_MESSAGES)
    run = project.run("--dlcheck=L12")
    run.assert_outcome("L12", "passed")


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
    assert "no BOS token" in run.text and "dlcheck_raw_dataset" in run.text


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
