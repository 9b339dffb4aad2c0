"""L11: the EOS token must be a supervised label."""

LM_COLLATOR = """
    import pytest, tiny
    from transformers import DataCollatorForLanguageModeling

    @pytest.fixture(scope="session")
    def dlcheck_tokenizer():
        return tiny.tokenizer(pad={pad})

    @pytest.fixture(scope="session")
    def dlcheck_collator(dlcheck_tokenizer):
        return DataCollatorForLanguageModeling(dlcheck_tokenizer, mlm=False)

    @pytest.fixture(scope="session")
    def dlcheck_dataset(dlcheck_tokenizer):
        return tiny.tokenized(dlcheck_tokenizer, eos={eos})
"""


def test_pad_equals_eos_masks_the_real_eos(project):
    project.conftest(LM_COLLATOR.format(pad="tiny.EOS", eos=True))
    run = project.run("--dlcheck=L11")
    run.assert_outcome("L11", "failed")
    text = run.section("L11")
    assert "8 of 8 sampled documents: final token <|endoftext|> (id 0) has label -100" in text
    assert "pad_token == eos_token" in text
    assert "'<|endoftext|>'(0)→-100" in text
    assert "fix" in text and "pad_token" in text
    assert "Traceback" not in run.text


def test_tokenizer_that_appends_no_eos(project):
    project.conftest(LM_COLLATOR.format(pad="tiny.PAD", eos=False))
    run = project.run("--dlcheck=L11")
    run.assert_outcome("L11", "failed")
    text = run.section("L11")
    assert "end without a stop token [<|endoftext|> (id 0)]" in text
    assert "appends no EOS" in text


def test_own_pad_token_keeps_the_eos_label(project):
    project.conftest(LM_COLLATOR.format(pad="tiny.PAD", eos=True))
    run = project.run("--dlcheck=L11", "-rA")
    run.assert_outcome("L11", "passed")
    run.fnmatch(["8 of 8 sampled documents end with a supervised stop token (<|endoftext|>)"])


CHAT_SFT = """
    import pytest, tiny
    from datasets import Dataset
    from trl import SFTConfig, SFTTrainer

    @pytest.fixture(scope="session")
    def dlcheck_trainer(tmp_path_factory):
        tok = tiny.tokenizer()
        rows = [[{{"role": "user", "content": p}}, {{"role": "assistant", "content": c.strip()}}]
                for p, c in zip(tiny.PROMPTS, tiny.COMPLETIONS)]
        model = tiny.llama(tok)
        {stop}
        args = tiny.trainer_args(tmp_path_factory.mktemp("o"), SFTConfig, assistant_only_loss=True)
        return SFTTrainer(model=model, args=args, processing_class=tok, train_dataset=Dataset.from_dict({{"messages": rows}}))
"""


def test_chat_turns_end_with_a_token_generation_does_not_stop_on(project):
    project.conftest(CHAT_SFT.format(stop="pass"))
    run = project.run("--dlcheck=L11")
    run.assert_outcome("L11", "failed")
    text = run.section("L11")
    assert "end without a stop token [<|endoftext|> (id 0)]" in text
    assert "end with the special token <|end|>" in text
    assert "generation_config.eos_token_id" in text


def test_chat_end_of_turn_declared_as_a_stop_token_passes(project):
    project.conftest(
        CHAT_SFT.format(
            stop="model.generation_config.eos_token_id = [tok.eos_token_id, tok.convert_tokens_to_ids(tiny.END)]"
        )
    )
    run = project.run("--dlcheck=L11", "-rA")
    run.assert_outcome("L11", "passed")
    run.fnmatch(["6 of 6 sampled documents end with a supervised stop token (<|endoftext|>, <|end|>)"])
