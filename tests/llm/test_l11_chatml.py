"""L11 on ChatML-style templates (Qwen2-Instruct): a turn ends with its stop token and then the template's
newline, "<|im_end|>\\n"; the pad token (<|endoftext|>) is also a stop token in generation_config. The
stop token before the newline is the document's end, padding after the content is no EOS shut out by the
mask — and an end-of-turn token left out of the supervised span is still caught."""

from llm.test_l11_eos_supervised import CHAT_SFT

NEWLINE_TEMPLATE = (
    "{{% for m in messages %}}"
    "{{% if m['role'] == 'user' %}}<|user|>{{{{ m['content'] }}}}<|end|>{{{{ '\\n' }}}}"
    "{{% else %}}<|assistant|>{{% generation %}}{{{{ m['content'] }}}}{end_inside}{{% endgeneration %}}{end_outside}"
    "{{{{ '\\n' }}}}{{% endif %}}{{% endfor %}}"
)

STOPS = (
    "tok.chat_template = {template!r}\n"
    "        model.generation_config.eos_token_id = [tok.eos_token_id, tok.convert_tokens_to_ids(tiny.END)]\n"
    "        model.generation_config.pad_token_id = tok.pad_token_id"
)


def project_with(end_inside: str, end_outside: str) -> str:
    template = NEWLINE_TEMPLATE.format(end_inside=end_inside, end_outside=end_outside)
    return CHAT_SFT.format(stop=STOPS.format(template=template))


def test_stop_token_then_the_templates_newline_is_a_supervised_end(project):
    project.conftest(project_with(end_inside="<|end|>", end_outside=""))
    run = project.run("--dlcheck=L11", "-rA")
    run.assert_outcome("L11", "passed")
    run.fnmatch(["6 of 6 sampled documents end with a supervised stop token (<|endoftext|>, <|end|>)"])


def test_end_of_turn_outside_the_supervised_span_fails(project):
    project.conftest(project_with(end_inside="", end_outside="<|end|>"))
    run = project.run("--dlcheck=L11")
    run.assert_outcome("L11", "failed")
    assert "<|end|>" in run.section("L11")


# Qwen2.5-base's layout under TRL's SFT on conversations: pad == eos (<|endoftext|>), the only stop token; the
# template ends each turn with <|end|> and a newline. TRL appends the EOS to non-conversational data only, so the
# rows end "<|end|>\n" and then padding: the row carries no EOS at all (not an EOS shut out by the attention mask)
PAD_IS_EOS = """
    import pytest, tiny
    from datasets import Dataset
    from trl import SFTConfig, SFTTrainer

    @pytest.fixture(scope="session")
    def dlcheck_trainer(tmp_path_factory):
        tok = tiny.tokenizer(pad=tiny.EOS, chat_template={template!r})
        rows = [[{{"role": "user", "content": p}}, {{"role": "assistant", "content": c.strip()}}]
                for p, c in zip(tiny.PROMPTS, tiny.COMPLETIONS)]
        model = tiny.llama(tok)
        model.generation_config.eos_token_id = tok.eos_token_id
        args = tiny.trainer_args(tmp_path_factory.mktemp("o"), SFTConfig{eos})
        return SFTTrainer(model=model, args=args, processing_class=tok, train_dataset=Dataset.from_dict({{"messages": rows}}))
"""


def test_conversations_without_the_eos_under_pad_equal_eos_name_the_missing_eos(project):
    template = NEWLINE_TEMPLATE.format(end_inside="<|end|>", end_outside="")
    project.conftest(PAD_IS_EOS.format(template=template, eos=""))
    run = project.run("--dlcheck=L11")
    run.assert_outcome("L11", "failed")
    text = " ".join(line.strip() for line in run.section("L11").splitlines())
    assert "end without a stop token [<|endoftext|> (id 0)]: the last real token (by attention_mask) is" in text
    assert "the chat template ends each turn with <|end|>" in text
    assert "SFTTrainer appends the EOS to non-conversational data only" in text
    assert "SFTConfig(eos_token='<|end|>')" in text
    assert "attention mask was built" not in text and "its own pad token" not in text


def test_conversations_with_the_end_of_turn_as_eos_pass(project):
    template = NEWLINE_TEMPLATE.format(end_inside="<|end|>", end_outside="")
    project.conftest(PAD_IS_EOS.format(template=template, eos=', eos_token="<|end|>"'))
    run = project.run("--dlcheck=L11", "-rA")
    run.assert_outcome("L11", "passed")
    run.fnmatch(["* sampled documents end with a supervised stop token (*<|end|>*"])
