"""A pixel-space, unconditional DDPM training (diffusers' train_unconditional.py: UNet2DModel, DDPMScheduler,
DDPMPipeline, images normalised to [-1, 1]): the checks that concern latents, a condition or an EMA say
they are not applicable instead of asking for a VAE, a condition or an EMA; the others pass with what
they measured. V1 judges the pixels against diffusion's [-1, 1] convention. A text-only project is not a
diffusion training at all."""

import tinydiff
import torchvision.tv_tensors  # noqa: F401  (V1 reads tv_tensors: imported once, outside the in-process runs)


def test_pixel_space_unconditional_ddpm(project):
    project.conftest(tinydiff.pixel_conftest())
    run = project.run("--dlcheck=diffusion,V1,V7", "-rA")
    for cid in ("DF4", "DF6", "DF8", "V1"):
        run.assert_outcome(cid, "passed")
    for cid in ("DF1", "DF2", "DF3", "DF5", "DF7", "V7"):
        run.assert_outcome(cid, "skipped")
    assert "missing role" not in run.text, run.text
    run.fnmatch(
        [
            "n/a:*not applicable: dlcheck_pipeline is a DDPMPipeline, which has no VAE: it denoises pixels; there is "
            "no VAE, so no latent scale to check (1 check)",
        ]
    )
    run.fnmatch(
        [
            "n/a:*not applicable: no EMA configured (no dlcheck_ema): DF2 concerns trainings that sample from an EMA "
            "of the denoiser; define dlcheck_ema (and dlcheck_sample_images) if yours keeps one (1 check)",
        ]
    )
    run.fnmatch(
        [
            "n/a:*not applicable: the denoiser UNet2DModel is unconditional (no cross-attention, no class embedding): "
            "classifier-free guidance has no condition to drop (1 check)",
        ]
    )
    run.fnmatch(
        [
            "n/a:*not applicable: UNet2DModel has no BatchNorm layer (it normalises with GroupNorm): the per-device "
            "batch size does not affect its normalisation (1 check)",
        ]
    )
    # the passes, with what they measured
    run.fnmatch(
        [
            "*::V1_normalization PASSED (8 train images: |values| ≤ 0.998*",
            "*::DF4_scheduler_agreement PASSED (inference DDPMScheduler agrees with training DDPMScheduler*",
            "*::DF6_sampler_settings PASSED (inference DDPMScheduler fits what training DDPMScheduler trains*",
            "*::DF8_noising PASSED (64 timesteps from 16 calls of dlcheck_training_inputs lie in*",
        ]
    )
    for line in (
        "train: pixels range -0.991 to 0.998, within [-1, 1] (± 0.05), the range diffusers' VAEs and pipelines "
        "assume (dlcheck_pipeline is a diffusers DDPMPipeline)",
        "inference DDPMScheduler agrees with training DDPMScheduler: num_train_timesteps 1000, prediction_type "
        "'epsilon', ᾱ_t equal over 1000 timesteps (max gap 0 ≤ 1e-05)",
        "(1) the training target equals the noise (epsilon) in 64 of 64 examples, as prediction_type='epsilon' says",
        "(3) dlcheck_pipeline is a DDPMPipeline, which has no VAE: it denoises pixels: clip_sample clamps the "
        "predicted x0 to ±1, which fits [-1, 1] images",
        "noisy_latents = a·latents + b·noise with DDPMScheduler.add_noise's coefficients in 64 of 64 examples",
    ):
        assert line in run.text, line


def test_pixel_space_denoiser_given_alone_is_not_asked_for_a_vae(project):
    """No pipeline: the UNet2DModel's in_channels=3 says it denoises pixels."""
    project.conftest(
        tinydiff.pixel_conftest(roles=("model", "noise_scheduler", "training_inputs", "dataset", "collator"))
    )
    run = project.run("--dlcheck=DF3,DF5")
    run.assert_outcome("DF3", "skipped")
    run.assert_outcome("DF5", "skipped")
    assert (
        "not applicable: the denoiser UNet2DModel takes in_channels=3: it denoises pixels; there is no VAE, so no "
        "latent scale to check"
    ) in run.text
    assert "the denoiser UNet2DModel is unconditional" in run.text
    assert "dlcheck_vae" not in run.text


def test_pixels_in_0_1_for_a_diffusion_model(project):
    """train_unconditional.py without its Normalize([0.5], [0.5]): the model trains on [0, 1] while the
    pipeline maps its samples back with image / 2 + 0.5."""
    project.conftest(tinydiff.pixel_conftest(pixels="[0, 1]"))
    run = project.run("--dlcheck=V1")
    run.assert_outcome("V1", "failed")
    text = tinydiff.flat(run.section("V1"))
    assert "the pixels lie in [0, 1] (0.00443 to 0.999); dlcheck_pipeline is a diffusers DDPMPipeline" in text
    assert "the images are scaled to [0, 1] but diffusion models work on [-1, 1]" in text
    assert "append T.Normalize([0.5], [0.5]) after ToDtype(torch.float32, scale=True)" in text


def test_a_declared_ema_without_its_fixture_is_a_missing_role(project):
    """use_ema=True in the training arguments (diffusers' scripts' flag): dlcheck_ema would make DF2 run."""
    project.conftest(
        tinydiff.pixel_conftest()
        + """
from types import SimpleNamespace

@pytest.fixture(scope="session")
def dlcheck_training_args():
    return SimpleNamespace(use_ema=True, ema_decay=0.9999)
"""
    )
    run = project.run("--dlcheck=DF2")
    run.assert_outcome("DF2", "skipped")
    assert "missing role: define fixture dlcheck_ema in conftest.py" in run.text


def test_a_text_only_project_is_not_a_diffusion_training(project):
    """A GPT-2 fine-tune under --dlcheck=diffusion: nothing asks for a scheduler or a VAE."""
    project.conftest("""
        import pytest, tiny
        from transformers import DataCollatorForLanguageModeling

        @pytest.fixture(scope="session")
        def dlcheck_tokenizer():
            return tiny.tokenizer()

        @pytest.fixture(scope="session")
        def dlcheck_model(dlcheck_tokenizer):
            return tiny.gpt2(dlcheck_tokenizer)

        @pytest.fixture(scope="session")
        def dlcheck_collator(dlcheck_tokenizer):
            return DataCollatorForLanguageModeling(dlcheck_tokenizer, mlm=False)

        @pytest.fixture(scope="session")
        def dlcheck_dataset(dlcheck_tokenizer):
            return tiny.tokenized(dlcheck_tokenizer)
    """)
    run = project.run("--dlcheck=DF2,DF3,DF4,DF5,DF6,DF7,DF8")
    for cid in ("DF2", "DF3", "DF4", "DF5", "DF6", "DF7", "DF8"):
        run.assert_outcome(cid, "skipped")
    assert "missing role" not in run.text, run.text
    run.fnmatch(
        [
            # the same reason of six checks, grouped in one summary line (each check's own line names it)
            "n/a:*not applicable: concerns diffusion training, and no diffusion role is given (dlcheck_pipeline, "
            "dlcheck_noise_scheduler, dlcheck_vae, dlcheck_training_inputs, … or a diffusers denoiser as dlcheck_model) (6 checks)"
        ]
    )
    assert "not applicable: no diffusion role: DF5 judges the conditioning of a text-to-image training" in run.text
