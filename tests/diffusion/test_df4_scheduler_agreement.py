"""DF4: the sampler's noise process and prediction type are the training scheduler's."""

import tinydiff


def test_v_prediction_model_sampled_as_epsilon(project):
    """DDPM trained with v_prediction (scaled_linear betas); the pipeline samples with DDIMScheduler()."""
    project.conftest(tinydiff.conftest(scheduler=dict(prediction_type="v_prediction"), inference="defaults"))
    run = project.run("--dlcheck=DF4")
    run.assert_outcome("DF4", "failed")
    text = tinydiff.flat(run.section("DF4"))
    assert "prediction_type: training DDPMScheduler 'v_prediction', inference DDIMScheduler 'epsilon'" in text
    assert "beta_schedule: training DDPMScheduler 'scaled_linear', inference DDIMScheduler 'linear'" in text
    assert "beta_start: training DDPMScheduler 0.00085, inference DDIMScheduler 0.0001" in text
    assert "ᾱ_t differ by up to 0.23" in text
    assert "equals the velocity v (v_prediction) in 64 of 64 examples" in text
    assert "it reads a 'v_prediction' model's output as 'epsilon'" in text
    assert "DDIMScheduler.from_config(noise_scheduler.config)" in text
    assert "fields to align: beta_schedule, beta_start, beta_end, prediction_type" in text


def test_num_train_timesteps_differ(project):
    project.conftest(
        tinydiff.conftest(roles=("noise_scheduler",))
        + """
from diffusers import DDIMScheduler

@pytest.fixture
def dlcheck_inference_scheduler(sd):
    return DDIMScheduler.from_config(sd.noise_scheduler.config, num_train_timesteps=500)
"""
    )
    run = project.run("--dlcheck=DF4")
    run.assert_outcome("DF4", "failed")
    text = tinydiff.flat(run.section("DF4"))
    assert "num_train_timesteps: training DDPMScheduler 1000, inference DDIMScheduler 500" in text


def test_sampler_from_the_training_config_passes_with_v_prediction(project):
    project.conftest(tinydiff.conftest(scheduler=dict(prediction_type="v_prediction")))
    run = project.run("--dlcheck=DF4,DF6", "-rA")
    run.assert_outcome("DF4", "passed")
    run.fnmatch(
        [
            "*dlcheck evidence*",
            "inference DDIMScheduler agrees with training DDPMScheduler: num_train_timesteps 1000, prediction_type "
            "'v_prediction', ᾱ_t equal over 1000 timesteps (max gap 0 ≤ 1e-05)",
            "beta fields: beta_schedule='scaled_linear', beta_start=0.00085, beta_end=0.012, trained_betas=None, "
            "rescale_betas_zero_snr=False",
        ]
    )


SAMPLERS = [
    "EulerDiscreteScheduler",
    "DPMSolverMultistepScheduler",
    "UniPCMultistepScheduler",
    "PNDMScheduler",
    "EulerAncestralDiscreteScheduler",
]


def test_any_sampler_class_built_from_the_training_config_passes(project):
    """diffusers' usual swap, pipeline.scheduler = X.from_config(noise_scheduler.config), for five samplers
    (one directory each, one run): DF4 and DF6 pass for all of them."""
    for name in SAMPLERS:
        project.conftest(
            tinydiff.conftest(
                roles=("noise_scheduler", "vae", "training_inputs", "dataset", "collator"),
                scheduler=dict(prediction_type="v_prediction"),
            )
            + f"""
import diffusers

@pytest.fixture(scope="session")
def dlcheck_inference_scheduler(sd):
    return diffusers.{name}.from_config(sd.noise_scheduler.config)
""",
            path=f"{name}/conftest.py",
        )
    result = project.pytester.runpytest_inprocess("-p", "no:cacheprovider", "-v", "--dlcheck=DF4,DF6")
    text = result.stdout.str()
    for name in SAMPLERS:
        for cid in ("DF4", "DF6"):
            assert f"{name}/conftest.py::{cid}_" in text, text
    assert "FAILED" not in text and "ERROR" not in text, text
    assert text.count("PASSED") == 2 * len(SAMPLERS), text


_V_CHECKPOINT = """
import copy
from diffusers import DDIMScheduler, DDPMScheduler, StableDiffusionPipeline

@pytest.fixture(scope="session")
def ckpt(sd, tmp_path_factory):
    # a checkpoint pre-trained with v-prediction: its saved scheduler config says so
    path = tmp_path_factory.mktemp("sd-v")
    v = DDIMScheduler.from_config(sd.noise_scheduler.config, prediction_type="v_prediction")
    StableDiffusionPipeline(**{**sd.pipeline.components, "scheduler": v}).save_pretrained(path)
    return str(path)

@pytest.fixture(scope="session")
def dlcheck_pipeline(ckpt):
    return StableDiffusionPipeline.from_pretrained(ckpt, safety_checker=None, requires_safety_checker=False)
"""


def test_v_prediction_checkpoint_fine_tuned_as_epsilon_blames_training(project):
    """The pipeline is loaded from a v-prediction checkpoint (its scheduler/scheduler_config.json says
    v_prediction); the fine-tuning scheduler is DDPMScheduler(...) left at epsilon: the training side is
    wrong, and the fix loads the training scheduler from the checkpoint, not the sampler from training."""
    project.conftest(
        tinydiff.conftest(roles=("noise_scheduler", "training_inputs", "dataset", "collator")) + _V_CHECKPOINT
    )
    run = project.run("--dlcheck=DF4")
    run.assert_outcome("DF4", "failed")
    text = tinydiff.flat(run.section("DF4"))
    assert "prediction_type: training DDPMScheduler 'epsilon', inference DDIMScheduler 'v_prediction'" in text
    assert "scheduler_config.json) says prediction_type 'v_prediction'" in text
    assert (
        "the checkpoint was pre-trained with 'v_prediction'" in text
        and "the training scheduler is what is wrong" in text
    )
    assert "DDPMScheduler.from_pretrained(model_path, subfolder='scheduler')" in text
    assert "pipeline.scheduler =" not in text


def test_v_prediction_checkpoint_fine_tuned_with_its_scheduler_passes(project):
    project.conftest(
        tinydiff.conftest(roles=())
        + _V_CHECKPOINT
        + """
@pytest.fixture(scope="session")
def dlcheck_noise_scheduler(ckpt):
    return DDPMScheduler.from_pretrained(ckpt, subfolder="scheduler")
"""
    )
    run = project.run("--dlcheck=DF4", "-rA")
    run.assert_outcome("DF4", "passed")
    assert "prediction_type 'v_prediction'" in run.text


def test_scheduler_swapped_at_sampling_time_is_the_one_judged(project):
    """pipeline.scheduler agrees with training, but the sampling routine swaps in DDIMScheduler() (defaults)
    right before sampling: DF4 judges the scheduler that really steps, and leaves pipeline.scheduler as it was."""
    project.conftest(
        tinydiff.conftest(roles=("pipeline", "noise_scheduler"))
        + """
from diffusers import DDIMScheduler

@pytest.fixture(scope="session")
def dlcheck_sample_images(sd):
    def sample():
        sd.pipeline.scheduler = DDIMScheduler()          # swapped at sampling time: linear betas
        return sd.pipeline("a red square", num_inference_steps=2, height=16, width=16, output_type="pt").images
    return sample
"""
    )
    run = project.run("--dlcheck=DF4")
    run.assert_outcome("DF4", "failed")
    text = tinydiff.flat(run.section("DF4"))
    assert "beta_schedule: training DDPMScheduler 'scaled_linear', sampling DDIMScheduler (the one " in text
    assert "dlcheck_sample_images steps, not pipeline.scheduler) 'linear'" in text
    ns = tinydiff.LAST[-1]
    assert (
        type(ns.pipeline.scheduler).__name__ == "DDIMScheduler"
        and ns.pipeline.scheduler.config.beta_schedule == "scaled_linear"
    )
