"""X4: every example carries tokens-per-image × images placeholders."""

import tinyvlm  # noqa: F401  (imports the libraries before the in-process runs)
from helpers import flat

DATA = """
    import pytest, torch, tinyvlm

    @pytest.fixture(scope="session")
    def dlcheck_tokenizer():
        return tinyvlm.processor({processor})

    @pytest.fixture(scope="session")
    def dlcheck_model(dlcheck_tokenizer):
        return tinyvlm.llava(dlcheck_tokenizer.tokenizer)

    @pytest.fixture(scope="session")
    def dlcheck_dataset():
        return tinyvlm.rows(8)

    @pytest.fixture(scope="session")
    def dlcheck_collator(dlcheck_tokenizer):
        return {collator}
"""


def test_max_length_cuts_the_image_placeholders(project):
    """LLaVA-1.5's 576 image tokens under a text max_length of 512, in miniature: 16 tokens, max_length=12."""
    project.conftest(DATA.format(processor="", collator="tinyvlm.collator(dlcheck_tokenizer, max_length=12)"))
    run = project.run("--dlcheck=X4,X5")
    run.assert_outcome("X4", "failed")
    text = flat(run.section("X4"))
    assert (
        "8 of 8 sampled examples carry a different number of <image> tokens than their images expand to; the "
        "processor expands one <image> into 16 tokens, as the model's config says: its CLIPVision vision tower, run "
        "once on a 32x32 image, emits 16 features with vision_feature_select_strategy='default'"
    ) in text
    assert (
        "example 0.0: 12 <image> tokens, expected 16 (1 image × 16); the example is 12 tokens long, ending on <image> "
        "(max_length=12)"
    ) in text
    assert "collated: '<image>×12' before collation: '<image>what is 2+2? The answer is 4.'" in text
    assert "truncation to max_length=12 runs after the processor expanded each image into 16 placeholder tokens" in text
    assert "DataCollatorForVisionLanguageModeling(max_length=None)" in text
    # the forward pass cannot run: X5 skips naming X4 instead of crashing
    run.assert_outcome("X5", "skipped")
    assert "see X2 and X4" in run.text


def test_processor_truncation_refuses_the_batch(project):
    """The language-modeling path calls the processor with truncation=True: it raises, X4 explains."""
    project.conftest(
        DATA.format(
            processor="", collator="tinyvlm.collator(dlcheck_tokenizer, 12, completion_only_loss=False)"
        ).replace(
            "return tinyvlm.rows(8)",
            "return [{'images': r['images'], 'text': r['prompt'] + r['completion']} for r in tinyvlm.rows(8)]",
        )
    )
    run = project.run("--dlcheck=X4")
    run.assert_outcome("X4", "failed")
    text = flat(run.section("X4"))
    assert "collating the sampled examples fails: raised ValueError: Mismatch in `image` token count" in text
    assert "Got ids=[12, 12, 12, 12] and text=[16, 16, 16, 16]" in text
    assert "the collator calls the processor with truncation (max_length=12)" in text


def test_long_enough_max_length_passes(project):
    project.conftest(DATA.format(processor="", collator="tinyvlm.collator(dlcheck_tokenizer, max_length=64)"))
    run = project.run("--dlcheck=X4", "-rA")
    run.assert_outcome("X4", "passed")
    run.fnmatch(
        [
            "*::X4_image_tokens PASSED (8 of 8 sampled examples carry as many <image> tokens as their images*",
            "*dlcheck evidence*",
            "8 of 8 sampled examples carry as many <image> tokens as their images expand to (16 per example); the "
            "processor expands one <image> into 16 tokens, as the model's config says: *",
            "examples from dlcheck_collator on 8 examples of dlcheck_dataset; max_length=64; image counts from the raw "
            "examples",
        ]
    )


def test_a_text_tokenizer_without_an_image_processor_is_not_applicable(project):
    """A GPT-2 style text pipeline (no dlcheck_model): the tokenizer alone says there is no image token to count."""
    project.conftest("""
        import pytest, tiny
        from transformers import DataCollatorForLanguageModeling

        @pytest.fixture(scope="session")
        def dlcheck_tokenizer():
            return tiny.tokenizer()

        @pytest.fixture(scope="session")
        def dlcheck_collator(dlcheck_tokenizer):
            return DataCollatorForLanguageModeling(dlcheck_tokenizer, mlm=False)

        @pytest.fixture(scope="session")
        def dlcheck_dataset(dlcheck_tokenizer):
            return tiny.tokenized(dlcheck_tokenizer)
    """)
    run = project.run("--dlcheck=X4")
    run.assert_outcome("X4", "skipped")
    run.fnmatch(
        [
            "SKIPPED*not applicable: dlcheck_tokenizer (*) is a text tokenizer, with no image processor and no image token"
        ]
    )


def test_processor_and_config_disagree_on_tokens_per_image(project):
    project.conftest(DATA.format(processor="strategy='full'", collator="tinyvlm.collator(dlcheck_tokenizer)"))
    run = project.run("--dlcheck=X4")
    run.assert_outcome("X4", "failed")
    text = flat(run.section("X4"))
    assert "the processor expands one image into 17 <image> tokens, but the model makes 16 image features" in text
    assert "vision_feature_select_strategy='full'" in text
    assert "vision_feature_select_strategy='default'" in text


HAND = """
    import pytest, torch, tinyvlm

    @pytest.fixture(scope="session")
    def dlcheck_tokenizer():
        return tinyvlm.processor()

    @pytest.fixture(scope="session")
    def dlcheck_dataset():
        return tinyvlm.rows(8)

    @pytest.fixture(scope="session")
    def dlcheck_collator(dlcheck_tokenizer):
        tok, images = dlcheck_tokenizer.tokenizer, dlcheck_tokenizer.image_processor

        def collate(rows):
            batch = tok([r["prompt"] + r["completion"] for r in rows], padding=True, return_tensors="pt")
            batch["pixel_values"] = images([r["images"][0] for r in rows], return_tensors="pt")["pixel_values"]
            batch["labels"] = batch["input_ids"].masked_fill(batch["attention_mask"] == 0, -100)
            return dict(batch)

        return collate
"""


def test_text_tokenized_by_the_tokenizer_alone(project):
    project.conftest(HAND)
    run = project.run("--dlcheck=X4")
    run.assert_outcome("X4", "failed")
    text = flat(run.section("X4"))
    assert "example 0.0: 1 <image> tokens, expected 16 (1 image × 16)" in text
    assert "tokenized by the tokenizer alone" in text
    assert "processor(images=..., text=..., ...)" in text


SIGLIP = """
    import pytest, torch, tinyvlm
    from transformers import LlavaConfig, LlavaForConditionalGeneration, LlamaConfig, LlavaProcessor
    from transformers import SiglipImageProcessor, SiglipVisionConfig

    @pytest.fixture(scope="session")
    def dlcheck_tokenizer():
        tok = tinyvlm.tokenizer()
        ip = SiglipImageProcessor(size={"height": tinyvlm.SIZE, "width": tinyvlm.SIZE}, image_mean=[0.5] * 3,
                                  image_std=[0.5] * 3)
        # SigLIP has no CLS feature: every patch is an image token, nothing added
        return LlavaProcessor(image_processor=ip, tokenizer=tok, patch_size=tinyvlm.PATCH,
                              vision_feature_select_strategy="full", image_token=tinyvlm.IMAGE,
                              num_additional_image_tokens=0)

    @pytest.fixture(scope="session")
    def dlcheck_model(dlcheck_tokenizer):
        tok = dlcheck_tokenizer.tokenizer
        cfg = LlavaConfig(
            vision_config=SiglipVisionConfig(hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                                             num_attention_heads=4, image_size=tinyvlm.SIZE, patch_size=tinyvlm.PATCH),
            text_config=LlamaConfig(vocab_size=len(tok), hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                                    num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=256,
                                    pad_token_id=tok.pad_token_id),
            image_token_id=tok.convert_tokens_to_ids(tinyvlm.IMAGE), vision_feature_layer=-1,
            vision_feature_select_strategy="full")
        torch.manual_seed(0)
        return LlavaForConditionalGeneration(cfg)

    @pytest.fixture(scope="session")
    def dlcheck_dataset():
        return tinyvlm.rows()

    @pytest.fixture(scope="session")
    def dlcheck_collator(dlcheck_tokenizer):
        return tinyvlm.collator(dlcheck_tokenizer)
"""


def test_a_siglip_tower_without_a_cls_feature_is_not_told_to_add_a_token(project):
    project.conftest(SIGLIP)
    run = project.run("--dlcheck=X4", "-rA")
    assert "num_additional_image_tokens=1" not in run.text, run.text
    run.assert_outcome("X4", "passed")
    run.fnmatch(["*its SiglipVision vision tower, run once on a 32x32 image, emits 16 features*"])


def test_a_collator_that_stacks_two_rows_per_example_is_read_without_indexing_past_the_examples(project):
    # TRL's DataCollatorForVisionPreference stacks each example's chosen and rejected rows: 2 rows an example (X4 had
    # raised an IndexError, blind set 11's DPO VLM); the rows are judged by the images in the batch
    stacked = """
    class Stacked:
        def __init__(self, inner):
            self.inner = inner

        def __call__(self, examples):
            batch = self.inner(examples)
            return {k: torch.cat([v, v]) if isinstance(v, torch.Tensor) else v for k, v in batch.items()}

    @pytest.fixture(scope="session")
    def dlcheck_collator(dlcheck_tokenizer):
        return Stacked(tinyvlm.collator(dlcheck_tokenizer))
"""
    conftest = DATA.format(processor="", collator="tinyvlm.collator(dlcheck_tokenizer)")
    conftest = conftest[: conftest.index('    @pytest.fixture(scope="session")\n    def dlcheck_collator')] + stacked
    project.conftest(conftest)
    run = project.run("--dlcheck=X4", "-rA")
    assert "internal error" not in run.text, run.text
    run.assert_outcome("X4", "passed")
