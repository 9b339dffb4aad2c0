"""DF2: the sampling routine must run the denoiser with the EMA weights."""

import tinydiff


def test_ema_kept_but_never_used_for_sampling(project):
    project.conftest(tinydiff.conftest(ema_use="never", steps=2))
    run = project.run("--dlcheck=DF2")
    run.assert_outcome("DF2", "failed")
    text = tinydiff.flat(run.section("DF2"))
    assert "dlcheck_sample_images ran UNet2DConditionModel (dlcheck_unet) with the raw trained weights" in text
    assert "all 208 tensors equal dlcheck_unet's, none the EMA's" in text
    assert "EMAModel (decay 0.999, optimization_step 2)" in text
    assert "never copies the EMA weights in (ema.copy_to)" in text
    assert "ema.store(unet.parameters()); ema.copy_to(unet.parameters())" in text
    ns = tinydiff.LAST[-1]
    tinydiff.assert_same_state(ns.snapshot, tinydiff.snapshot_state(ns))  # the nudged EMA is put back


def test_ema_copied_in_and_never_restored(project):
    project.conftest(tinydiff.conftest(ema_use="no-restore", steps=2))
    run = project.run("--dlcheck=DF2")
    run.assert_outcome("DF2", "failed")
    text = tinydiff.flat(run.section("DF2"))
    assert "after dlcheck_sample_images, dlcheck_unet (UNet2DConditionModel) holds the EMA weights" in text
    assert "training continues from them" in text
    assert "ema.restore(unet.parameters())" in text
    ns = tinydiff.LAST[-1]
    tinydiff.assert_same_state(ns.snapshot, tinydiff.snapshot_state(ns))  # the trained weights are put back


def test_an_ema_that_is_the_model_itself(project):
    project.conftest(
        tinydiff.conftest(roles=("pipeline", "sample_images"))
        + """
@pytest.fixture(scope="session")
def dlcheck_ema(sd):
    return sd.unet          # ema_model = model: not a copy
"""
    )
    run = project.run("--dlcheck=DF2")
    run.assert_outcome("DF2", "failed")
    text = tinydiff.flat(run.section("DF2"))
    assert "dlcheck_ema (UNet2DConditionModel module) shares 208 of 208 tensors with dlcheck_unet" in text
    assert "copy.deepcopy(model)" in text


def test_sampling_with_an_averaged_model_copy_passes(project):
    """The twin with torch's AveragedModel: the pipeline samples with the EMA module itself."""
    project.conftest(
        tinydiff.conftest(roles=("noise_scheduler",))
        + """
import copy
from torch.optim.swa_utils import AveragedModel, get_ema_multi_avg_fn

@pytest.fixture(scope="session")
def dlcheck_model(sd):
    return sd.unet

@pytest.fixture(scope="session")
def dlcheck_ema(sd):
    ema = AveragedModel(sd.unet, multi_avg_fn=get_ema_multi_avg_fn(0.999))
    sd.unet.conv_out.bias.data += 0.01       # one more training step's worth of change
    ema.update_parameters(sd.unet)
    return ema

@pytest.fixture(scope="session")
def dlcheck_sample_images(sd, dlcheck_ema):
    pipe = copy.copy(sd.pipeline)
    pipe.register_modules(unet=dlcheck_ema.module)
    return lambda: pipe("a red square", num_inference_steps=2, height=16, width=16, output_type="pt").images
"""
    )
    run = project.run("--dlcheck=DF2", "-rA")
    run.assert_outcome("DF2", "passed")
    run.fnmatch(
        [
            "*::DF2_ema_used PASSED (dlcheck_sample_images ran UNet2DConditionModel (the EMA module) with*",
            "*dlcheck evidence*",
            "dlcheck_sample_images ran UNet2DConditionModel (the EMA module) with the EMA weights: all 208 tensors "
            "equal dlcheck_ema's (AveragedModel of UNet2DConditionModel), none the raw trained ones",
            "1 UNet2DConditionModel module(s) ran while sampling: the EMA module with the EMA weights",
            "after sampling dlcheck_unet holds its own trained weights again (all 208 tensors unchanged)",
        ]
    )


def test_ema_never_stepped_while_training(project):
    """EMAModel made before training, ema.step never called: optimization_step 0 and the trained UNet
    has moved away from the shadow params, so the EMA samples the initial weights."""
    project.conftest(tinydiff.conftest(ema_use="unstepped", steps=2))
    run = project.run("--dlcheck=DF2")
    run.assert_outcome("DF2", "failed")
    text = tinydiff.flat(run.section("DF2"))
    assert "dlcheck_ema (EMAModel (decay 0.999, optimization_step 0)) has optimization_step 0" in text
    assert "of 208 tensors of dlcheck_unet (UNet2DConditionModel) differ from the EMA's shadow params" in text
    assert "never calls ema.step(unet.parameters())" in text
    assert "if accelerator.sync_gradients: ema.step(unet.parameters())" in text


def test_deep_copied_ema_module_unused_gets_module_fix(project):
    """A plain deep-copied EMA module that the sampler ignores: the fix says to sample with that module,
    not EMAModel's store/copy_to API the user does not have."""
    project.conftest(
        tinydiff.conftest(roles=("pipeline",), ema_use="never", steps=2)
        + """
import copy

@pytest.fixture(scope="session")
def dlcheck_ema(sd):
    return copy.deepcopy(sd.unet).requires_grad_(False)

@pytest.fixture(scope="session")
def dlcheck_sample_images(sd):
    return sd.sample_images
"""
    )
    run = project.run("--dlcheck=DF2")
    run.assert_outcome("DF2", "failed")
    text = tinydiff.flat(run.section("DF2"))
    assert "with the raw trained weights" in text and "(dlcheck_ema: UNet2DConditionModel module)" in text
    assert (
        "sample with the EMA module itself: pipe = copy.copy(pipeline); pipe.register_modules(unet=ema_model)" in text
    )
    assert "runs the trained model, never the EMA module" in text
    assert "ema.copy_to" not in text
