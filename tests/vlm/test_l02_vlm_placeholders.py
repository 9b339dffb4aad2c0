"""L2 judges the image placeholders in the labels whatever completion-only training says: TRL's
examples/scripts/sft_vlm.py (LLaVA under SFTTrainer, TRL's DataCollatorForVisionLanguageModeling,
assistant_only_loss=False) trains the LM to predict every <image> placeholder (TRL 1.16's collator masks
only padding: labels = input_ids.clone()); a collator that masks input_ids == image_token_id passes."""

import tinyvlm  # noqa: F401  (imports the libraries before the in-process runs)
from helpers import flat
from trl import SFTConfig, SFTTrainer  # noqa: F401  (imported outside the in-process runs)

TRAINER = """
    import pytest, tiny, tinyvlm
    from trl import SFTConfig, SFTTrainer

    @pytest.fixture(scope="session")
    def dlcheck_trainer(tmp_path_factory):
        proc = tinyvlm.processor()
        proc.chat_template = tinyvlm.{template}
        model = tinyvlm.llava(proc.tokenizer)
        args = tiny.trainer_args(tmp_path_factory.mktemp("o"), SFTConfig, max_length=None)
        collator = {collator}
        return SFTTrainer(
            model=model,
            args=args,
            processing_class=proc,
            train_dataset=tinyvlm.conversation_dataset(8),
            data_collator=collator,
        )
"""

COLLATED = """
    import pytest, tinyvlm

    @pytest.fixture(scope="session")
    def dlcheck_tokenizer():
        proc = tinyvlm.processor()
        proc.chat_template = tinyvlm.LLAVA_15_TEMPLATE
        return proc

    @pytest.fixture(scope="session")
    def dlcheck_dataset():
        return tinyvlm.conversations(8)

    @pytest.fixture(scope="session")
    def dlcheck_collator(dlcheck_tokenizer):
        return {collator}
"""


def test_sft_vlm_whole_sequence_training_supervises_the_image_placeholders(project):
    project.conftest(TRAINER.format(template="LLAVA_15_TEMPLATE", collator="None"))
    run = project.run("--dlcheck=L2")
    run.assert_outcome("L2", "failed")
    text = flat(run.section("L2"))
    # 8 conversations, one image each, 16 placeholders per image: all 128 supervised
    assert (
        "128 of the 128 image placeholder positions (<image>, id 300) in 8 sampled rows carry labels != -100 "
        "(label values there: 300 ×128)"
    ) in text
    assert "labels on the placeholders: '<image>'(300)→300" in text
    assert (
        "TRL's DataCollatorForVisionLanguageModeling builds labels = input_ids.clone() and masks only padding"
    ) in text
    assert "completion-only training is off (SFTConfig(assistant_only_loss=False))" in text
    assert "labels[batch['input_ids'] == 300] = -100 (processor.image_token_id)" in text
    assert "SFTTrainer(data_collator=...)" in text
    assert "SFTConfig(assistant_only_loss=True)" in text


def test_sft_vlm_with_the_placeholders_masked_passes(project):
    project.conftest(TRAINER.format(template="LLAVA_15_TEMPLATE", collator="tinyvlm.ImageMaskingCollator(proc)"))
    run = project.run("--dlcheck=L2", "-rA")
    run.assert_outcome("L2", "passed")
    assert "image placeholders: 0 of the 128 placeholder positions (<image>) in the sampled rows carry" in run.text
    assert "prompt: not judged, completion-only training is off (SFTConfig(assistant_only_loss=False))" in run.text


def test_whole_sequence_choice_still_judges_the_placeholders(project):
    """L2.completion_only=false says whole-sequence training is intended; the placeholders are still judged."""
    project.conftest(COLLATED.format(collator="tinyvlm.DataCollatorForVisionLanguageModeling(dlcheck_tokenizer)"))
    run = project.run("--dlcheck=L2", "--dlcheck-set", "L2.completion_only=false")
    run.assert_outcome("L2", "failed")
    text = flat(run.section("L2"))
    assert "128 of the 128 image placeholder positions (<image>, id 300) in 8 sampled rows" in text
    assert "completion-only training is off (L2.completion_only is false)" in text


def test_whole_sequence_choice_with_the_placeholders_masked_passes(project):
    project.conftest(COLLATED.format(collator="tinyvlm.ImageMaskingCollator(dlcheck_tokenizer)"))
    run = project.run("--dlcheck=L2", "--dlcheck-set", "L2.completion_only=false", "-rA")
    run.assert_outcome("L2", "passed")
    assert "image placeholders: 0 of the 128 placeholder positions (<image>) in the sampled rows carry" in run.text


BARE_TOKENIZER = """
    import pytest, tinyvlm

    PROC = tinyvlm.processor()
    PROC.chat_template = tinyvlm.LLAVA_15_TEMPLATE

    @pytest.fixture(scope="session")
    def dlcheck_tokenizer():
        return PROC.tokenizer  # the processor's text tokenizer: no image_token_id of its own

    @pytest.fixture(scope="session")
    def dlcheck_model():
        return tinyvlm.llava(PROC.tokenizer)

    @pytest.fixture(scope="session")
    def dlcheck_dataset():
        return tinyvlm.conversations(8)

    @pytest.fixture(scope="session")
    def dlcheck_collator():
        return {collator}
"""


def test_placeholder_id_from_the_model_config(project):
    """With the text tokenizer handed over, the placeholder id is the model config's image_token_id."""
    project.conftest(BARE_TOKENIZER.format(collator="tinyvlm.DataCollatorForVisionLanguageModeling(PROC)"))
    run = project.run("--dlcheck=L2", "--dlcheck-set", "L2.completion_only=false")
    run.assert_outcome("L2", "failed")
    text = flat(run.section("L2"))
    assert "128 of the 128 image placeholder positions (<image>, id 300) in 8 sampled rows" in text


def test_placeholder_id_from_the_model_config_masked_passes(project):
    project.conftest(BARE_TOKENIZER.format(collator="tinyvlm.ImageMaskingCollator(PROC)"))
    run = project.run("--dlcheck=L2", "--dlcheck-set", "L2.completion_only=false", "-rA")
    run.assert_outcome("L2", "passed")
    assert "image placeholders: 0 of the 128 placeholder positions (<image>) in the sampled rows carry" in run.text
