"""DF7: a training schedule whose last ᾱ is far from 0 never shows the model the pure noise sampling starts from."""

import tinydiff


def test_short_linear_schedule_never_reaches_pure_noise(project):
    project.conftest(
        tinydiff.conftest(
            roles=("pipeline", "noise_scheduler"),
            scheduler=dict(num_train_timesteps=100, beta_schedule="linear", beta_start=0.0001, beta_end=0.02),
        )
    )
    run = project.run("--dlcheck=DF7")
    run.assert_outcome("DF7", "failed")
    text = tinydiff.flat(run.section("DF7"))
    assert "DDPMScheduler (linear, β 0.0001→0.02, num_train_timesteps 100) ends at ᾱ = 0.364 at t = 99" in text
    assert "still holds 0.60 × the signal (limit ᾱ ≤ 0.05" in text
    assert "never sees the input the sampler starts from" in text
    assert "rescale_betas_zero_snr=True" in text


def test_standard_sd_schedule_is_not_a_finding(project):
    """SD's scaled_linear 1000-step schedule ends at ᾱ 0.0047 (not zero-terminal-SNR, but the recipe
    every SD fine-tune uses): DF7 reports, it does not fail."""
    project.conftest(tinydiff.conftest(roles=("pipeline", "noise_scheduler")))
    run = project.run("--dlcheck=DF7", "-rs")
    run.assert_outcome("DF7", "skipped")
    assert "info: training SNR runs from" in run.text


_MIN_SNR = """
import torch
from diffusers.training_utils import compute_snr

@pytest.fixture(scope="session")
def dlcheck_training_inputs(sd):
    def fn(batch):
        out = dict(sd.training_inputs(batch))
        snr = compute_snr(sd.noise_scheduler, out["timesteps"])
        w = torch.stack([snr, 5.0 * torch.ones_like(snr)], dim=1).min(dim=1)[0]
        out["loss_weights"] = w / {denom}
        return out
    return fn
"""


def test_min_snr_epsilon_form_on_a_v_prediction_model(project):
    project.conftest(
        tinydiff.conftest(
            roles=("pipeline", "noise_scheduler", "dataset", "collator"),
            scheduler=dict(prediction_type="v_prediction"),
        )
        + _MIN_SNR.format(denom="snr")
    )
    run = project.run("--dlcheck=DF7")
    run.assert_outcome("DF7", "failed")
    text = tinydiff.flat(run.section("DF7"))
    assert "loss_weights of dlcheck_training_inputs equal min(snr, 5) / snr (the 'epsilon' form of Min-SNR-γ)" in text
    assert "DDPMScheduler trains prediction_type 'v_prediction'" in text
    assert ".min(dim=1)[0] / (snr + 1) for prediction_type 'v_prediction'" in text


def test_min_snr_v_form_on_a_v_prediction_model_is_not_a_finding(project):
    project.conftest(
        tinydiff.conftest(
            roles=("pipeline", "noise_scheduler", "dataset", "collator"),
            scheduler=dict(prediction_type="v_prediction"),
        )
        + _MIN_SNR.format(denom="(snr + 1)")
    )
    run = project.run("--dlcheck=DF7", "-rs")
    run.assert_outcome("DF7", "skipped")
    assert "loss_weights follow the 'v_prediction' form of Min-SNR-γ, as 'v_prediction' needs" in run.text
