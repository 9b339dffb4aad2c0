"""DF6: the sampler reads the objective really trained, and its options fit that model."""

import tinydiff

ROLES = tinydiff.CLEAN_ROLES + ("inference_scheduler",)


def test_target_hard_coded_to_noise_while_both_schedulers_say_v(project):
    project.conftest(tinydiff.conftest(scheduler=dict(prediction_type="v_prediction"), target="noise"))
    run = project.run("--dlcheck=DF4,DF6")
    run.assert_outcome("DF4", "passed")  # the configs agree with each other: DF6 owns this one
    run.assert_outcome("DF6", "failed")
    text = tinydiff.flat(run.section("DF6"))
    assert "the training target of dlcheck_training_inputs equals the noise (epsilon) in 64 of 64 examples" in text
    assert "both schedulers say prediction_type='v_prediction'" in text
    assert "the model learns to predict 'epsilon' but the sampler reads its output as 'v_prediction'" in text
    assert "noise_scheduler.get_velocity(latents, noise, timesteps)" in text


def test_zero_snr_training_sampled_with_leading_spacing_and_clipped_latents(project):
    project.conftest(
        tinydiff.conftest(
            roles=ROLES,
            scheduler=dict(rescale_betas_zero_snr=True, prediction_type="v_prediction"),
            inference=dict(clip_sample=True),
        )
    )
    run = project.run("--dlcheck=DF6")
    run.assert_outcome("DF6", "failed")
    text = tinydiff.flat(run.section("DF6"))
    assert "training DDPMScheduler has zero terminal SNR (ᾱ at t = 999 is 0, rescale_betas_zero_snr=True)" in text
    assert "timestep_spacing='leading' starts 10-step sampling at t = 901, never at t = 999" in text
    assert "clip_sample=True clamps every predicted x0 to ±1" in text
    assert "of their values lie outside ±1" in text
    assert "timestep_spacing='trailing'" in text and "clip_sample=False" in text


def test_zero_snr_with_trailing_spacing_passes(project):
    project.conftest(
        tinydiff.conftest(
            roles=ROLES,
            scheduler=dict(rescale_betas_zero_snr=True, prediction_type="v_prediction"),
            inference=dict(timestep_spacing="trailing"),
        )
    )
    run = project.run("--dlcheck=DF4,DF6", "-rA")
    run.assert_outcome("DF4", "passed")
    run.assert_outcome("DF6", "passed")
    run.fnmatch(
        [
            "*dlcheck evidence*",
            "(1) the training target equals the velocity v (v_prediction) in 64 of 64 examples, as "
            "prediction_type='v_prediction' says",
            "(2) zero terminal SNR sampled with timestep_spacing='trailing': 10-step sampling starts at t = 999",
            "(3) latent space (dlcheck_vae): inference DDIMScheduler clip_sample=False, thresholding=False",
        ]
    )


def test_sampling_routine_that_swaps_in_leading_spacing_is_judged(project):
    """The pipeline's scheduler is trailing (as zero-SNR needs), but the sampling routine swaps in a
    'leading' copy right before sampling: DF6 reads the scheduler that really steps."""
    project.conftest(
        tinydiff.conftest(
            roles=tuple(r for r in ROLES if r != "sample_images"),
            scheduler=dict(rescale_betas_zero_snr=True, prediction_type="v_prediction"),
            inference=dict(timestep_spacing="trailing"),
        )
        + """
from diffusers import DDIMScheduler

@pytest.fixture(scope="session")
def dlcheck_sample_images(sd):
    def sample():
        sd.pipeline.scheduler = DDIMScheduler.from_config(sd.pipeline.scheduler.config, timestep_spacing="leading")
        return sd.pipeline("a red square", num_inference_steps=2, height=16, width=16, output_type="pt").images
    return sample
"""
    )
    run = project.run("--dlcheck=DF6")
    run.assert_outcome("DF6", "failed")
    text = tinydiff.flat(run.section("DF6"))
    assert "timestep_spacing='leading' starts 10-step sampling at t = 901, never at t = 999" in text
    assert "dlcheck_sample_images steps, not pipeline.scheduler" in text
