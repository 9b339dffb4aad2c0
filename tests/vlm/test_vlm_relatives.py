"""Llava's relatives: towers found by name on LLaVA-NeXT, Qwen2-VL, PaliGemma and Idefics3; LLaVA-NeXT's
any-resolution processor (token count per image depends on its size) checked per example; a dataloader
handed over alone."""

import pytest
import tinyvlm
from helpers import flat

from pytest_dlcheck.checks.vlm import measure as vlm


def _qwen2_vl():
    return tinyvlm.Qwen2VLForConditionalGeneration(
        tinyvlm.Qwen2VLConfig(
            text_config=dict(
                vocab_size=300,
                hidden_size=32,
                intermediate_size=64,
                num_hidden_layers=1,
                num_attention_heads=4,
                num_key_value_heads=2,
                rope_scaling={"type": "mrope", "mrope_section": [1, 1, 2]},
            ),
            vision_config=dict(
                depth=1,
                embed_dim=32,
                hidden_size=32,
                num_heads=4,
                patch_size=4,
                spatial_merge_size=2,
                temporal_patch_size=2,
            ),
        )
    )


def _paligemma():
    return tinyvlm.PaliGemmaForConditionalGeneration(
        tinyvlm.PaliGemmaConfig(
            text_config=dict(
                vocab_size=300,
                hidden_size=32,
                intermediate_size=64,
                num_hidden_layers=1,
                num_attention_heads=4,
                num_key_value_heads=1,
                head_dim=8,
            ),
            vision_config=dict(
                hidden_size=32,
                intermediate_size=64,
                num_hidden_layers=1,
                num_attention_heads=4,
                image_size=16,
                patch_size=8,
            ),
            projection_dim=32,
        )
    )


def _idefics3():
    return tinyvlm.Idefics3ForConditionalGeneration(
        tinyvlm.Idefics3Config(
            text_config=dict(
                vocab_size=300,
                hidden_size=32,
                intermediate_size=64,
                num_hidden_layers=1,
                num_attention_heads=4,
                num_key_value_heads=1,
            ),
            vision_config=dict(
                hidden_size=32,
                intermediate_size=64,
                num_hidden_layers=1,
                num_attention_heads=4,
                image_size=16,
                patch_size=8,
            ),
        )
    )


@pytest.mark.parametrize(
    "build, paths",
    [
        (
            lambda: tinyvlm.llava_next(tinyvlm.tokenizer()),
            {
                "vision": ["model.vision_tower"],
                "projector": ["model.multi_modal_projector", "model.image_newline"],
                "language_model": ["model.language_model", "lm_head"],
            },
        ),
        (
            _qwen2_vl,
            {
                "vision": ["model.visual"],
                "projector": ["model.visual.merger"],
                "language_model": ["model.language_model", "lm_head"],
            },
        ),
        (
            _paligemma,
            {
                "vision": ["model.vision_tower"],
                "projector": ["model.multi_modal_projector"],
                "language_model": ["model.language_model", "lm_head"],
            },
        ),
        (
            _idefics3,
            {
                "vision": ["model.vision_model"],
                "projector": ["model.connector"],
                "language_model": ["model.text_model", "lm_head"],
            },
        ),
    ],
    ids=["llava_next", "qwen2_vl", "paligemma", "idefics3"],
)
def test_towers_found_by_name(build, paths):
    model = build()
    found = vlm.find_towers(model)
    assert found.paths == paths
    counts = vlm.count(model, found).counts
    assert counts["other"].total == 0 and all(counts[t].total for t in vlm.TOWERS)


def test_a_text_only_model_has_no_towers():
    import tiny

    assert vlm.find_towers(tiny.llama(tiny.tokenizer())) is None


NEXT = """
    import pytest, torch, tinyvlm
    from torch.utils.data import DataLoader

    @pytest.fixture(scope="session")
    def dlcheck_tokenizer():
        return tinyvlm.processor_next()

    @pytest.fixture(scope="session")
    def dlcheck_model(dlcheck_tokenizer):
        return tinyvlm.llava_next(dlcheck_tokenizer.tokenizer)

    @pytest.fixture(scope="session")
    def dlcheck_dataset():
        return tinyvlm.rows_mixed_sizes(8)

    @pytest.fixture(scope="session")
    def dlcheck_collator(dlcheck_tokenizer):
        return tinyvlm.collator(dlcheck_tokenizer, max_length={max_length})

    @pytest.fixture(scope="session")
    def dlcheck_stages():
        return tinyvlm.STAGES

    @pytest.fixture(scope="session")
    def dlcheck_stage_setup():
        return tinyvlm.setup_clean(tinyvlm.STAGES)
"""


def test_llava_next_any_resolution_clean(project):
    project.conftest(NEXT.format(max_length=None))
    run = project.run("--dlcheck=vlm")
    for cid in ("X1", "X2", "X3", "X4", "X5"):
        run.assert_outcome(cid, "passed")


def test_llava_next_truncation_is_judged_per_image_size(project):
    """36 tokens for a square picture, 52 for a wide one: max_length=40 cuts only the wide ones."""
    project.conftest(NEXT.format(max_length=40))
    run = project.run("--dlcheck=X4")
    run.assert_outcome("X4", "failed")
    text = flat(run.section("X4"))
    assert "4 of 8 sampled examples carry a different number of <image> tokens" in text
    assert (
        "example 0.1: 40 <image> tokens, expected 52 (1 image × 52); the example is 40 tokens long, ending on <image> (max_length=40)"
        in text
    )


LOADER = """
    import pytest, torch, tinyvlm
    from torch.utils.data import DataLoader

    @pytest.fixture(scope="session")
    def dlcheck_tokenizer():
        return tinyvlm.processor()

    @pytest.fixture(scope="session")
    def dlcheck_dataloader(dlcheck_tokenizer):
        return DataLoader(tinyvlm.rows(8), batch_size=4, collate_fn=tinyvlm.collator(dlcheck_tokenizer, max_length={max_length}))
"""


def test_dataloader_alone_truncated(project):
    project.conftest(LOADER.format(max_length=12))
    run = project.run("--dlcheck=X4")
    run.assert_outcome("X4", "failed")
    text = flat(run.section("X4"))
    assert (
        "example 0.0: 12 <image> tokens, expected 16 (1 image × 16); the example is 12 tokens long, ending on <image>"
        in text
    )
    assert "before collation" not in text  # a dataloader alone does not show its raw examples


def test_dataloader_alone_text_cut_but_not_the_image(project):
    """max_length=20 keeps the 16 image tokens at the front and cuts only text: not X4's business."""
    project.conftest(LOADER.format(max_length=20))
    project.run("--dlcheck=X4").assert_outcome("X4", "passed")


def test_dataloader_alone_clean(project):
    project.conftest(LOADER.format(max_length=None))
    project.run("--dlcheck=X4").assert_outcome("X4", "passed")
