"""DF3: the latents the denoiser trains on have std ≈ 1, scaled by the factor the decoder undoes."""

import pytest
import tinydiff


def _fail(project, roles=tinydiff.CLEAN_ROLES, **knobs) -> str:
    project.conftest(tinydiff.conftest(roles=roles, **knobs))
    run = project.run("--dlcheck=DF3")
    run.assert_outcome("DF3", "failed")
    return tinydiff.flat(run.section("DF3"))


def test_scaling_factor_omitted(project):
    """An SD-like VAE (latent std 5.5) whose training step never multiplies by scaling_factor."""
    text = _fail(project, factor=None)
    assert "latents from dlcheck_training_inputs: std 5.5" in text
    assert "the training path scales the VAE latents by 1: vae.config.scaling_factor = 0.18215" in text
    assert "is never applied" in text
    assert "latents = vae.encode(pixel_values).latent_dist.sample() * vae.config.scaling_factor" in text


def test_sd1_factor_kept_for_a_vae_of_other_statistics(project):
    """A VAE of unit latent std keeping AutoencoderKL's default 0.18215 (calibrated for SD's VAE)."""
    text = _fail(project, vae_stats="unit")
    assert (
        "latents from dlcheck_training_inputs: std 0.19" in text
        or "latents from dlcheck_training_inputs: std 0.2" in text
    )
    assert "(Stable Diffusion 1.x's value, calibrated for its VAE), which does not fit this VAE" in text
    assert "scaling_factor = 1 / std of its latents = 0.9" in text
    assert "vae.register_to_config(scaling_factor=0.9" in text


def test_sd1_factor_on_another_vae_seen_without_the_training_path(project):
    text = _fail(project, roles=("pipeline", "dataset", "collator"), vae_stats="unit")
    assert "gives latents of std 0.19" in text or "gives latents of std 0.2" in text
    assert "the training path was not observed: define dlcheck_training_inputs" in text


def test_hard_coded_factor_disagrees_with_the_config_the_pipeline_decodes_with(project):
    """SD-like VAE whose config says 0.13025 (an SDXL-style factor) while the step hard-codes 0.18215."""
    text = _fail(project, scaling_factor=0.13025, factor=0.18215)
    assert "the training path scales the VAE latents by 0.182, but vae.config.scaling_factor = 0.13025" in text
    assert "decoded samples are off by ×1.4" in text
    assert "vae.register_to_config(scaling_factor=0.18" in text


@pytest.mark.parametrize("knobs", [dict(vae_stats="unit", scaling_factor=0.92), dict()], ids=["calibrated", "sd-like"])
def test_calibrated_factor_passes(project, knobs):
    project.conftest(tinydiff.conftest(**knobs))
    run = project.run("--dlcheck=DF3", "-rA")
    run.assert_outcome("DF3", "passed")
    factor = "0.92" if knobs else "0.18215"
    run.fnmatch(
        [
            "*::DF3_latent_scale PASSED (latents from dlcheck_training_inputs: std *",
            "*dlcheck evidence*",
            "latents from dlcheck_training_inputs: std *, within [[]0.5, 2]; the training path scales the VAE latents "
            f"by *, vae.config.scaling_factor = {factor} (rtol 0.25)",
            "AutoencoderKL latents of 8 sampled images (dlcheck_collator on 8 examples of dlcheck_dataset): std * raw, "
            f"* × scaling_factor {factor}",
        ]
    )


def test_calibrated_factor_without_the_training_path(project):
    project.conftest(tinydiff.conftest(roles=("pipeline", "dataset", "collator")))
    run = project.run("--dlcheck=DF3", "-rA")
    run.assert_outcome("DF3", "passed")
    run.fnmatch(
        [
            "*dlcheck evidence*",
            "vae.config.scaling_factor = 0.18215 (Stable Diffusion 1.x's value, calibrated for its VAE) gives latents "
            "of std 1.01, within [[]0.5, 2]",
            "AutoencoderKL latents of 8 sampled images *",
            "the training path was not observed (define dlcheck_training_inputs to measure the factor it applies)",
        ]
    )


_HAND_DECODE = """
@pytest.fixture(scope="session")
def dlcheck_sample_images(sd):
    pipe = sd.pipeline

    def sample():
        latents = pipe("a red square", num_inference_steps=2, height=16, width=16, output_type="latent").images
        return pipe.vae.decode(latents{div}).sample

    return sample
"""


def test_sampler_decodes_without_dividing_by_scaling_factor(project):
    """A hand-written sampler: output_type="latent", then vae.decode(latents) without / scaling_factor."""
    project.conftest(
        tinydiff.conftest(roles=("pipeline", "noise_scheduler", "training_inputs", "dataset", "collator"))
        + _HAND_DECODE.format(div="")
    )
    run = project.run("--dlcheck=DF3")
    run.assert_outcome("DF3", "failed")
    text = tinydiff.flat(run.section("DF3"))
    assert "dlcheck_sample_images passes vae.decode 1 × the final latents of the sampling loop" in text
    assert "not 1 / scaling_factor = 5.49" in text
    assert "decodes the denoiser's latents without dividing by vae.config.scaling_factor (0.18215)" in text
    assert "vae.decode(latents / vae.config.scaling_factor)" in text


def test_sampler_that_divides_before_decoding_passes(project):
    project.conftest(
        tinydiff.conftest(roles=("pipeline", "noise_scheduler", "training_inputs", "dataset", "collator"))
        + _HAND_DECODE.format(div=" / pipe.vae.config.scaling_factor")
    )
    run = project.run("--dlcheck=DF3", "-rA")
    run.assert_outcome("DF3", "passed")
    assert "dlcheck_sample_images passes vae.decode 5.49 × the final latents = 1 / scaling_factor (5.49" in run.text
