"""L2 on vision-language batches: the prompt is judged as the processor expands it (every <image> becomes
the image's 16 placeholder tokens), so supervised placeholders fail, a prompt length counted before the
expansion is named, and the fix counts tokens after it."""

import tinyvlm  # noqa: F401  (imports the libraries before the in-process runs)
from helpers import flat

PROJECT = """
    import pytest, torch, tinyvlm

    @pytest.fixture(scope="session")
    def dlcheck_tokenizer():
        return tinyvlm.processor()

    @pytest.fixture(scope="session")
    def dlcheck_dataset():
        return tinyvlm.rows(8)

    @pytest.fixture(scope="session")
    def dlcheck_collator(dlcheck_tokenizer):
        return {collator}
"""

FIX = "n_prompt = len(processor(text=prompt, images=images)['input_ids'][0]) (counted after each image placeholder"


def test_prompt_length_counted_before_the_image_expansion(project):
    """labels[:len(tokenizer(prompt))] = -100 masks 8 of the 23 prompt tokens of '<image>what is 2+2?':
    half the placeholders and the whole prompt text stay supervised."""
    project.conftest(PROJECT.format(collator="tinyvlm.PromptMaskingCollator(dlcheck_tokenizer, 'text')"))
    run = project.run("--dlcheck=L2")
    run.assert_outcome("L2", "failed")
    text = flat(run.section("L2"))
    assert (
        "8 of 8 sampled prompt/completion examples supervise prompt tokens: 120 of 172 prompt positions carry "
        "labels != -100"
    ) in text
    assert "supervised: '<image><image><image><image><image><image><image><image>what is 2+2? The answer is 4.'" in text
    assert "expected only: ' The answer is 4.' (prompt text: '<image>what is 2+2?')" in text
    assert "68 of the supervised prompt positions are image placeholders (<image> ×16 per example" in text
    assert (
        "the prompt length was counted before the processor expanded <image> into the image's 16 tokens: example "
        "0.0 (dataset row 0) has its first 8 tokens masked (len(tokenizer(prompt)) = 8), while its prompt is 23 "
        "tokens after the expansion, so 15 prompt tokens (image placeholders and the prompt text) keep their labels"
    ) in text
    assert FIX in text
    assert "DataCollatorForVisionLanguageModeling(processor)" in text


def test_labels_copied_over_the_image_placeholders(project):
    project.conftest(PROJECT.format(collator="tinyvlm.PromptMaskingCollator(dlcheck_tokenizer, 'none')"))
    run = project.run("--dlcheck=L2")
    run.assert_outcome("L2", "failed")
    text = flat(run.section("L2"))
    assert "172 of 172 prompt positions carry labels != -100" in text
    assert "labels on the prompt: '<image>'(300)→300" in text
    assert "120 of the supervised prompt positions are image placeholders (<image> ×16 per example" in text
    assert "the labels are a copy of input_ids over the whole example" in text
    assert FIX in text
    assert "len(tokenizer(prompt)['input_ids']);" not in text  # the text-only fix would repeat the bug


def test_prompt_length_counted_after_the_expansion_passes(project):
    project.conftest(PROJECT.format(collator="tinyvlm.PromptMaskingCollator(dlcheck_tokenizer, 'expanded')"))
    run = project.run("--dlcheck=L2", "-rA")
    run.assert_outcome("L2", "passed")
    # 16 placeholders + the prompt text per example are judged, not the 1 <image> of the text tokenization
    assert "prompt: 0 of 8 sampled prompt/completion examples supervise any of their 180 prompt tokens" in run.text


def test_trl_vision_collator_passes(project):
    project.conftest(PROJECT.format(collator="tinyvlm.collator(dlcheck_tokenizer)"))
    run = project.run("--dlcheck=L2", "-rA")
    run.assert_outcome("L2", "passed")
    assert "prompt: 0 of 8 sampled prompt/completion examples supervise any of their 180 prompt tokens" in run.text
