"""L11 with a processor as the tokenizer role: the EOS is the processor's tokenizer's (a LlavaProcessor has
no eos_token_id of its own). TRL's examples/scripts/sft_vlm.py trains LLaVA-1.5 on conversations whose chat
template ends an assistant turn with a space and no EOS, and TRL appends none to conversational data: EOS
never appears in the labels. The same template closing the assistant turn with {{ eos_token }} passes."""

import tinyvlm
from helpers import flat
from trl import SFTConfig, SFTTrainer  # noqa: F401  (imported outside the in-process runs)

from pytest_dlcheck.checks.shared import lm
from pytest_dlcheck.guard import preserved_tokenizer

TRAINER = """
    import pytest, tiny, tinyvlm
    from trl import SFTConfig, SFTTrainer

    @pytest.fixture(scope="session")
    def dlcheck_trainer(tmp_path_factory):
        proc = tinyvlm.processor()
        proc.chat_template = tinyvlm.{template}
        model = tinyvlm.llava(proc.tokenizer)
        args = tiny.trainer_args(tmp_path_factory.mktemp("o"), SFTConfig, max_length=None)
        return SFTTrainer(
            model=model, args=args, processing_class=proc, train_dataset=tinyvlm.conversation_dataset(8)
        )
"""


def test_llava_template_without_eos_fails(project):
    project.conftest(TRAINER.format(template="LLAVA_15_TEMPLATE"))
    run = project.run("--dlcheck=L11")
    run.assert_outcome("L11", "failed")
    text = flat(run.section("L11"))
    assert "the tokenizer has no eos_token_id" not in text
    assert "sampled documents end without a stop token [<|endoftext|> (id 0)]" in text
    assert "ASSISTANT: The answer is 4. '" in text
    assert (
        "the data are conversations and the chat template ends an assistant turn without a stop token "
        "[<|endoftext|> (id 0)]: SFTTrainer appends the EOS to non-conversational data only"
    ) in text
    assert "so <|endoftext|> never appears in the labels and the model never learns to stop" in text
    assert "closes every assistant turn with <|endoftext|> (append {{ eos_token }}" in text
    assert "SFTConfig(chat_template_path='template.jinja')" in text


def test_template_closing_the_assistant_turn_with_eos_passes(project):
    project.conftest(TRAINER.format(template="LLAVA_15_EOS_TEMPLATE"))
    run = project.run("--dlcheck=L11", "-rA")
    run.assert_outcome("L11", "passed")
    assert "sampled documents end with a supervised stop token (<|endoftext|>)" in run.text


PROMPT_COMPLETION = """
    import pytest, tiny, tinyvlm
    from trl import SFTConfig, SFTTrainer

    @pytest.fixture(scope="session")
    def dlcheck_trainer(tmp_path_factory):
        proc = tinyvlm.processor()
        model = tinyvlm.llava(proc.tokenizer)
        args = tiny.trainer_args(tmp_path_factory.mktemp("o"), SFTConfig, max_length=None)
        return SFTTrainer(
            model=model, args=args, processing_class=proc, train_dataset=tinyvlm.dataset(8, end={end})
        )
"""


def test_vision_prompt_completion_without_eos_fails(project):
    """TRL appends the EOS to a text-only dataset's completions while preparing it; a vision dataset is not
    prepared and its collator appends none."""
    project.conftest(PROMPT_COMPLETION.format(end='""'))
    run = project.run("--dlcheck=L11")
    run.assert_outcome("L11", "failed")
    text = flat(run.section("L11"))
    assert "7 of 7 sampled documents end without a stop token [<|endoftext|> (id 0)]" in text
    assert (
        "SFTTrainer appends the EOS to the texts/completions of a text-only dataset (its dataset preparation) but "
        "prepares no vision dataset, and DataCollatorForVisionLanguageModeling appends none"
    ) in text
    assert "append the EOS (processor.tokenizer.eos_token, <|endoftext|>) to every completion" in text


def test_vision_prompt_completion_ending_with_eos_passes(project):
    project.conftest(PROMPT_COMPLETION.format(end="tiny.EOS"))
    run = project.run("--dlcheck=L11", "-rA")
    run.assert_outcome("L11", "passed")
    assert "8 of 8 sampled documents end with a supervised stop token (<|endoftext|>)" in run.text


def test_token_attributes_of_a_processor_are_its_tokenizers():
    """The shared readers resolve a processor to its tokenizer for token attributes, and keep the processor's
    own chat template (a VLM's lives on the processor); preserved_tokenizer restores the inner tokenizer."""
    proc = tinyvlm.processor()
    proc.chat_template = tinyvlm.LLAVA_15_TEMPLATE
    tok = proc.tokenizer
    assert not hasattr(proc, "eos_token_id")
    assert lm.special_id(proc, "eos") == tok.eos_token_id == 0
    assert lm.special_id(proc, "pad") == tok.pad_token_id
    assert lm.special_ids(proc) == lm.special_ids(tok) and tok.eos_token_id in lm.special_ids(proc)
    assert lm.token_attr(proc, "padding_side") == "right"
    assert lm.token_attr(proc, "eos_token") == "<|endoftext|>"
    assert lm.chat_template(proc) == tinyvlm.LLAVA_15_TEMPLATE
    with preserved_tokenizer(proc):
        tok.padding_side = "left"
    assert tok.padding_side == "right"
