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
