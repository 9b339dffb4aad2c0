"""The diffusion domain on a clean small text-to-image training setup: every check passes (DF1 and DF7
are information items and skip with their note), and nothing the checks touched is left changed."""

import tinydiff


def test_clean_setup_passes_the_whole_domain(project):
    project.conftest(tinydiff.conftest(steps=2))  # two real optimizer + EMA steps taken: mid-training
    run = project.run("--dlcheck=diffusion", "-rA")
    for cid in ("DF2", "DF3", "DF4", "DF5", "DF6", "DF8"):
        run.assert_outcome(cid, "passed")
    # every pass says what it measured: beside PASSED (-v) and in full under -rA
    run.fnmatch(
        [
            "*::DF2_ema_used PASSED (dlcheck_sample_images ran UNet2DConditionModel (dlcheck_unet) with*",
            "*::DF3_latent_scale PASSED (latents from dlcheck_training_inputs: std 1.01, within [[]0.5, 2]*",
            "*::DF4_scheduler_agreement PASSED (inference DDIMScheduler agrees with training DDPMScheduler*",
            "*::DF5_cfg_dropout PASSED (* of * embedding rows null (*%) from * calls of*",
            "*::DF6_sampler_settings PASSED (inference DDIMScheduler fits what training DDPMScheduler trains*",
            "*::DF8_noising PASSED (64 timesteps from 16 calls of dlcheck_training_inputs lie in*",
        ]
    )
    for line in (
        "dlcheck_sample_images ran UNet2DConditionModel (dlcheck_unet) with the EMA weights: all 208 tensors equal "
        "dlcheck_ema's (EMAModel (decay 0.999, optimization_step 2)), none the raw trained ones",
        "after sampling dlcheck_unet holds its own trained weights again (all 208 tensors unchanged)",
        "latents from dlcheck_training_inputs: std 1.01, within [0.5, 2]; the training path scales the VAE latents "
        "by 0.182, vae.config.scaling_factor = 0.18215 (rtol 0.25)",
        "inference DDIMScheduler agrees with training DDPMScheduler: num_train_timesteps 1000, prediction_type "
        "'epsilon', ᾱ_t equal over 1000 timesteps (max gap 0 ≤ 1e-05)",
        "every null row is the sampler's unconditional input",
        "(1) the training target equals the noise (epsilon) in 64 of 64 examples, as prediction_type='epsilon' says",
        "(3) latent space (dlcheck_vae): inference DDIMScheduler clip_sample=False, thresholding=False",
        "noise: std 0.999, mean 0.00286 over 16384 values (std 1 ± 0.1, mean 0 ± 0.1)",
    ):
        assert line in run.text, line
    run.assert_outcome("DF1", "skipped")
    run.assert_outcome("DF7", "skipped")
    assert "info: DF1 is not a test" in run.text
    assert "info: training SNR runs from" in run.text and "uniform over timesteps" in run.text
    ns = tinydiff.LAST[-1]
    tinydiff.assert_same_state(ns.snapshot, tinydiff.snapshot_state(ns))


def test_clean_setup_with_explicit_roles_and_no_pipeline(project):
    """The same project handing over its parts one by one (no dlcheck_pipeline): still all clean."""
    roles = (
        "vae",
        "model",
        "tokenizer",
        "text_encoder",
        "noise_scheduler",
        "inference_scheduler",
        "training_inputs",
        "condition",
        "dataset",
        "collator",
        "ema",
        "sample_images",
    )
    project.conftest(tinydiff.conftest(roles=roles))
    run = project.run("--dlcheck=DF2,DF3,DF4,DF5,DF6,DF8")
    for cid in ("DF2", "DF3", "DF4", "DF5", "DF6", "DF8"):
        run.assert_outcome(cid, "passed")
