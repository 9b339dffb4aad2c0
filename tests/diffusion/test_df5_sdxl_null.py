"""DF5 on SDXL: the sampler's unconditional input is what StableDiffusionXLPipeline.encode_prompt builds with
classifier-free guidance and no negative prompt — both text encoders' penultimate hidden states concatenated, or a
zero embedding of that width with force_zeros_for_empty_prompt (SDXL base's config). DF5 used to derive it from the
first text encoder alone, (1, seq, 16) against training rows (seq, 32), and skipped asking for dlcheck_uncond
"(or dlcheck_pipeline)" though the pipeline was given (blind set 12, bl12_sdxl_lora)."""

import pytest
import tinydiff
import tinysdxl


def test_no_caption_dropout_fails_against_the_pipelines_own_null(project):
    """train_text_to_image_lora_sdxl.py: no proportion_empty_prompts."""
    project.conftest(tinysdxl.conftest())
    run = project.run("--dlcheck=DF5")
    run.assert_outcome("DF5", "failed")
    text = tinydiff.flat(run.section("DF5"))
    assert "were null (0.0%)" in text
    assert "null = dlcheck_uncond, an all-zero embedding" in text
    assert "does not match" not in run.text


@pytest.mark.parametrize(
    "knobs, null",
    [
        (dict(null="zeros", p_null=0.1), "dlcheck_uncond, an all-zero embedding"),  # SDXL's own null
        (dict(null="", p_null=0.1, force_zeros=False), "dlcheck_uncond, an embedding of norm"),  # "" by both encoders
    ],
    ids=["zeros-force-zeros", "empty-prompt-no-force-zeros"],
)
def test_dropout_to_the_samplers_null_passes(project, knobs, null):
    project.conftest(tinysdxl.conftest(**knobs))
    run = project.run("--dlcheck=DF5", "-rA")
    run.assert_outcome("DF5", "passed")
    text = tinydiff.flat(run.text)
    assert f"null = {null}" in text
    assert "every null row is the sampler's unconditional input" in text


def test_dropout_to_the_empty_prompt_while_the_sampler_forces_zeros_fails(project):
    """proportion_empty_prompts ("" encoded by both encoders) with force_zeros_for_empty_prompt=True: the trained null
    is not the one guidance feeds (diffusers issue #7920)."""
    project.conftest(tinysdxl.conftest(null="", p_null=0.1))
    run = project.run("--dlcheck=DF5")
    run.assert_outcome("DF5", "failed")
    text = tinydiff.flat(run.section("DF5"))
    assert (
        "null rows are the empty prompt's embedding (text_encoder('')); the sampler's unconditional input is "
        "dlcheck_uncond, an all-zero embedding" in text
    )
    assert "or the pipeline built with force_zeros_for_empty_prompt=False" in text
