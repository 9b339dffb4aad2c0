"""L11: the EOS token must be a supervised label."""

import pytest

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
    assert "end without <|endoftext|>" in text
    assert "appends no EOS" in text


def test_own_pad_token_keeps_the_eos_label(project):
    project.conftest(LM_COLLATOR.format(pad="tiny.PAD", eos=True))
    run = project.run("--dlcheck=L11")
    run.assert_outcome("L11", "passed")
