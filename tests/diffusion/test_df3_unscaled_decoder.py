"""DF3 on a VQModel whose pipeline decodes the denoiser's latents as they are (diffusers'
examples/kandinsky2_2/text_to_image/train_text_to_image_decoder.py, found blind in set 13): the training
step trains on the raw latents and KandinskyV22Pipeline decodes ``movq.decode(latents)`` without dividing
by the VQModel's config.scaling_factor (its default 0.18215, which nothing uses): train and sample agree.
DF3 reads what the sampler's decode receives instead of assuming the pipeline divides; a training step
that multiplies by 0.18215 for that pipeline fails, and without a sampling routine a VQModel's scale is not
judged against a factor nobody may use. Stable Diffusion's twins stay in test_df3_latent_scale.py."""

import pytest
import tinydiff
import tinykandinsky
from diffusers import VQModel


@pytest.mark.parametrize("sampler", ["pipeline", "pipeline-copy"])
def test_raw_latents_decoded_as_they_are_pass(project, sampler):
    decode = VQModel.__dict__["decode"]
    project.conftest(tinykandinsky.conftest(sampler=sampler))
    run = project.run("--dlcheck=DF3", "-rA")
    assert VQModel.__dict__["decode"] is decode  # the class's decode, wrapped for the sampling run, is put back
    run.assert_outcome("DF3", "passed")
    text = tinydiff.flat(run.text)
    assert "is never applied" not in text
    assert (
        "KandinskyV22Pipeline (called by dlcheck_sample_images) passes VQModel.decode 1 × the final latents of the sampling loop"
        in text
    ), run.text
    assert "the training path scales the VAE latents by 1: train and sample agree" in text, run.text
    assert "not judged against unit variance" in text, run.text


def test_scaling_factor_applied_for_a_pipeline_that_decodes_raw_latents_fails(project):
    project.conftest(tinykandinsky.conftest(factor="config"))
    run = project.run("--dlcheck=DF3")
    run.assert_outcome("DF3", "failed")
    text = tinydiff.flat(run.section("DF3"))
    assert "the training path scales the VAE latents by 0.182" in text, text
    assert (
        "KandinskyV22Pipeline (called by dlcheck_sample_images) passes VQModel.decode 1 × the final latents of the sampling loop"
        in text
    ), text
    assert "latents = vq.encode(pixel_values).latents" not in text  # no project-specific fix text
    assert "drop the factor" in text, text


def test_a_vq_model_without_a_sampling_routine_is_not_judged_against_its_default_factor(project):
    project.conftest(tinykandinsky.conftest(roles=tinykandinsky.ROLES, sampler="none"))
    run = project.run("--dlcheck=DF3", "-rA")
    run.assert_outcome("DF3", "skipped")
    text = tinydiff.flat(run.text)
    assert "is never applied" not in text
    assert "missing role: define fixture dlcheck_sample_images" in text, run.text
    assert "whether the sampler divides by vae.config.scaling_factor" in text, run.text
