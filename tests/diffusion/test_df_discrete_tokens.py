"""aMUSEd (diffusers' examples/amused/train_amused.py) generates the discrete tokens of a VQ model: its
AmusedScheduler masks token ids by a mask schedule and a UVit2DModel predicts their codebook entries. There is no
noise scheduler to hand over, so the checks of a noise process (DF3's latent scale, DF4/DF6's schedulers, DF7's
SNR, DF8's noising) say not applicable, with that reason, instead of asking for dlcheck_noise_scheduler (blind set
12). A latent-diffusion project that leaves out its noise scheduler is still asked for it."""

import tinyamused
import tinydiff

NOISE_CHECKS = ("DF4", "DF6", "DF7", "DF8")


def test_amused_is_not_asked_for_a_noise_scheduler(project):
    project.conftest(tinyamused.conftest())
    run = project.run("--dlcheck=DF3," + ",".join(NOISE_CHECKS), "-rA")
    for cid in ("DF3", *NOISE_CHECKS):
        run.assert_outcome(cid, "skipped")
    text = tinydiff.flat(run.text)
    assert "missing role" not in text, run.text
    assert "denoises pixels" not in text, run.text
    why = (
        "not applicable: dlcheck_pipeline's scheduler (AmusedScheduler, mask_token_id=16) works on the discrete token "
        "ids of a VQ model; the pipeline's VQModel (vqvae) turns images into those tokens; the denoiser UVit2DModel "
        "predicts their codebook entries (codebook_size=16): it generates discrete tokens (masked-token prediction), "
        "with no noise scheduler, Gaussian noise or continuous latents; "
    )
    assert text.count(why) >= 5, run.text  # each check's own line (the summary groups DF4 and DF6)
    assert why + "its autoencoder's codes are token ids, not latents with a scale to check" in text
    assert why + "there are no timesteps or noise of a noise scheduler to check" in text


def test_a_latent_diffusion_project_without_its_noise_scheduler_is_still_asked_for_it(project):
    project.conftest(tinydiff.conftest(roles=("pipeline", "training_inputs", "dataset", "collator")))
    run = project.run("--dlcheck=" + ",".join(NOISE_CHECKS))
    for cid in NOISE_CHECKS:
        run.assert_outcome(cid, "skipped")
    assert tinydiff.flat(run.text).count("missing role: define fixture dlcheck_noise_scheduler") >= 4, run.text
    assert "discrete token" not in run.text
