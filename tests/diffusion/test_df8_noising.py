"""DF8: timesteps uniform over [0, T), unit Gaussian noise, noisy latents from the scheduler's add_noise."""

import random
import re

import pytest
import tinydiff

from pytest_dlcheck.checks.diffusion import measure as D


def _fail(project, **knobs) -> str:
    project.conftest(tinydiff.conftest(**knobs))
    run = project.run("--dlcheck=DF8")
    run.assert_outcome("DF8", "failed")
    return tinydiff.flat(run.section("DF8"))


def test_fixed_timesteps(project):
    text = _fail(project, timesteps="fixed")
    assert "64 timesteps from 16 calls of dlcheck_training_inputs: all equal 500" in text
    assert "the timestep is fixed" in text
    assert "torch.randint(0, noise_scheduler.config.num_train_timesteps, (bsz,))" in text


def test_timesteps_drawn_from_num_inference_steps(project):
    text = _fail(project, timesteps="narrow")
    assert "64 timesteps from 16 calls of dlcheck_training_inputs lie in [" in text
    assert "for a scheduler of T = 1000 steps" in text
    assert "largest gap 0.9" in text and "above the DKW bound 0.34 for 64 draws (false alarm ≤ 1e-06)" in text


def test_a_cubic_schedule_that_draws_every_noise_level_is_not_failed(project):
    # train_t2i_adapter_sdxl.py draws t = (1 - u^3) T on purpose: not uniform, but every level is trained (DF8 had
    # failed it as a narrowed range: blind set 11); the range cut above still fails
    project.conftest(tinydiff.conftest(timesteps="cubic"))
    run = project.run("--dlcheck=DF8", "-rA")
    run.assert_outcome("DF8", "passed")
    assert "a weighting that draws every noise level (a cubic or SNR-weighted schedule) is not failed" in tinydiff.flat(
        run.text
    )


def test_scaled_noise(project):
    text = _fail(project, noise_scale=0.1)
    assert re.search(r"noise from dlcheck_training_inputs: std 0\.(09|1)", text), text
    assert "over 16384 values (wanted std 1 ± 0.1, mean 0)" in text
    assert "noise = torch.randn_like(latents)" in text


def test_noised_with_another_schedulers_add_noise(project):
    text = _fail(project, noising="linear")
    assert "noisy_latents ≠ noise_scheduler.add_noise(latents, noise, timesteps)" in text
    assert "DDPMScheduler.add_noise gives" in text
    assert "(scaled_linear, β 0.00085→0.012)" in text


def test_dkw_bound_and_cdf_gap():
    # 2·exp(−2nε²) = α at the returned ε
    eps = D.dkw_epsilon(64, 1e-6)
    assert abs(2 * 2.718281828 ** (-2 * 64 * eps * eps) - 1e-6) < 1e-9
    assert D.uniform_cdf_gap([500] * 10, 1000)[0] == pytest.approx(0.5, abs=1e-3)
    assert D.uniform_cdf_gap(list(range(1000)), 1000)[0] == pytest.approx(0.0, abs=1e-9)
    rng = random.Random(0)
    worst = max(D.uniform_cdf_gap([rng.randrange(1000) for _ in range(64)], 1000)[0] for _ in range(200))
    assert worst < eps  # 200 uniform samples of 64 draws all stay inside the 1e-6 bound


@pytest.mark.parametrize("target", ["noise - x0", "x0"], ids=["velocity", "preconditioned-x0"])
def test_flow_matching_training_is_not_misjudged(project, target):
    """SD3-style rectified flow: logit-normal sigmas, t = 1000·σ, noisy = (1 − σ)·x0 + σ·noise, target
    noise − x0 (or x0, SD3's DreamBooth script with its output preconditioned into x0: blind set 10's DF6 false
    alarm) with FlowMatchEulerDiscreteScheduler on both sides: no ᾱ_t and no prediction_type, so DF8 tests range
    and spread only, DF6 compares the target with no prediction_type, and nothing fails."""
    project.conftest(
        tinydiff.conftest(roles=("pipeline", "dataset", "collator"))
        + """
import torch
from diffusers import FlowMatchEulerDiscreteScheduler

@pytest.fixture(scope="session")
def dlcheck_noise_scheduler():
    return FlowMatchEulerDiscreteScheduler(shift=3.0)

@pytest.fixture(scope="session")
def dlcheck_inference_scheduler(dlcheck_noise_scheduler):
    return FlowMatchEulerDiscreteScheduler.from_config(dlcheck_noise_scheduler.config)

@pytest.fixture(scope="session")
def dlcheck_training_inputs(sd):
    def fn(batch):
        x0 = sd.vae.encode(batch["pixel_values"]).latent_dist.sample() * sd.vae.config.scaling_factor
        noise = torch.randn_like(x0)
        sigmas = torch.sigmoid(torch.randn(x0.shape[0]))            # logit-normal, on purpose
        noisy = (1 - sigmas[:, None, None, None]) * x0 + sigmas[:, None, None, None] * noise
        return {"latents": x0, "noise": noise, "timesteps": sigmas * 1000, "noisy_latents": noisy,
                "target": TARGET}
    return fn
""".replace("TARGET", target)
    )
    run = project.run("--dlcheck=DF3,DF4,DF6,DF8", "-rA")
    for cid in ("DF3", "DF4", "DF6", "DF8"):
        run.assert_outcome(cid, "passed")
    # what each measured, and what it could not judge without ᾱ_t
    run.fnmatch(
        [
            "*FlowMatchEulerDiscreteScheduler agrees with training FlowMatchEulerDiscreteScheduler: "
            "num_train_timesteps 1000, no prediction_type on either side (flow matching: the output is read as the "
            "flow's velocity), no ᾱ_t on either side (flow matching)*",
        ]
    )
    assert "prediction_type 'epsilon'" not in run.text  # a prediction_type the scheduler does not have
    for line in (
        "(1) training FlowMatchEulerDiscreteScheduler is a flow-matching scheduler with no prediction_type",
        "(2) training FlowMatchEulerDiscreteScheduler has no ᾱ_t schedule (flow matching): the zero-terminal-SNR "
        "spacing is not judged",
        "not tested against the uniform law: the scheduler has no ᾱ_t (flow matching)",
        "add_noise not fitted: dlcheck_training_inputs returns no 'latents' and 'noisy_latents' (or no ᾱ_t)",
    ):
        assert line in run.text, line


_EULER_SCHEDULER = """
from diffusers import EulerDiscreteScheduler

@pytest.fixture(scope="session")
def dlcheck_noise_scheduler(sd):
    return EulerDiscreteScheduler.from_config(sd.noise_scheduler.config)
"""


def test_euler_add_noise_for_training_is_named_variance_exploding(project):
    """Training noise from EulerDiscreteScheduler.add_noise (x0 + σ·noise) with a DDPM noise scheduler:
    the evidence shows the measured 1·latents + σ_t·noise and the VP form it should be."""
    text = _fail(project, noising="euler")
    assert "64 of 64 examples fit noisy_latents = 1·latents + σ_t·noise with σ_t = sqrt((1 − ᾱ_t)/ᾱ_t)" in text
    assert re.search(r"noisy = 1\.00\d·latents \+ \d+\.\d+·noise \(σ_t = \d+\.\d+\); the variance-preserving", text)
    assert "the training noise is variance-exploding (x + σ·noise" in text
    assert "DDPMScheduler.from_config(noise_scheduler.config).add_noise(latents, noise, timesteps)" in text
    assert "scale_model_input" in text


def test_euler_noise_scheduler_with_its_own_add_noise_fails_truthfully(project):
    """dlcheck_noise_scheduler is Euler and training calls its add_noise: DF8 fails and the evidence
    reports what the code computed (1·latents + σ_t·noise), not Euler's ᾱ_t coefficients."""
    project.conftest(tinydiff.conftest(noising="euler") + _EULER_SCHEDULER)
    run = project.run("--dlcheck=DF8")
    run.assert_outcome("DF8", "failed")
    text = tinydiff.flat(run.section("DF8"))
    assert "examples fit noisy_latents = 1·latents + σ_t·noise" in text
    assert "of EulerDiscreteScheduler's ᾱ_t (variance-exploding)" in text


def test_euler_noise_scheduler_with_ddpm_training_noise_passes(project):
    """Twin: Euler as the configured scheduler, training noise from the variance-preserving add_noise of
    the same ᾱ_t (what train_text_to_image.py does): passes, and says what it compared against."""
    project.conftest(tinydiff.conftest() + _EULER_SCHEDULER)
    run = project.run("--dlcheck=DF8", "-rA")
    run.assert_outcome("DF8", "passed")
    assert (
        "noisy_latents = a·latents + b·noise with the coefficients of the variance-preserving form of "
        "EulerDiscreteScheduler's ᾱ_t (its own add_noise is variance-exploding) in 64 of 64 examples"
    ) in tinydiff.flat(run.text)
