"""DF2 on an EMA wrapper that holds the online denoiser as a submodule beside its averaged copy (the shape
of ``EMA(model)`` in lucidrains' ema_pytorch, written out here): its tensors had not lined up with the
denoiser's (twice as many) and DF2 judged nothing; the online model's tensors are the trained ones, the
``ema_model`` copy is the EMA's."""

import tinydiff

WRAPPER = """
import copy, torch
from torch import nn

class EMA(nn.Module):
    def __init__(self, model, beta=0.995, update_after_step=0, update_every=1):
        super().__init__()
        self.beta, self.update_after_step, self.update_every = beta, update_after_step, update_every
        self.online_model = model
        self.ema_model = copy.deepcopy(model).requires_grad_(False)
        self.register_buffer("step", torch.tensor(0))

    @torch.no_grad()
    def update(self):
        for e, o in zip(self.ema_model.parameters(), self.online_model.parameters()):
            e.lerp_(o, 1 - self.beta)
        self.step += 1

@pytest.fixture(scope="session")
def dlcheck_model(sd):
    return sd.unet

@pytest.fixture(scope="session")
def dlcheck_ema(sd):
    ema = EMA(sd.unet)
    sd.unet.conv_out.bias.data += 0.01       # one training step's worth of change
    ema.update()
    return ema

@pytest.fixture(scope="session")
def dlcheck_sample_images(sd, dlcheck_ema):
    pipe = copy.copy(sd.pipeline)
    {register}
    return lambda: pipe("a red square", num_inference_steps=2, height=16, width=16, output_type="pt").images
"""


def conftest(register):
    return tinydiff.conftest(roles=("noise_scheduler",)) + WRAPPER.format(register=register)


def test_sampling_with_the_wrappers_ema_model_passes(project):
    project.conftest(conftest("pipe.register_modules(unet=dlcheck_ema.ema_model)"))
    run = project.run("--dlcheck=DF2", "-rA")
    run.assert_outcome("DF2", "passed")
    run.fnmatch(
        [
            "*dlcheck evidence*",
            "dlcheck_sample_images ran UNet2DConditionModel (the EMA module) with the EMA weights: all 208 tensors equal "
            "dlcheck_ema's (EMA module; its online_model shared with dlcheck_unet (208 tensors) left out as the "
            "trained model itself), none the raw trained ones",
        ]
    )


def test_sampling_with_the_raw_weights_fails(project):
    project.conftest(conftest("pass  # samples with sd.unet, the raw weights"))
    run = project.run("--dlcheck=DF2")
    run.assert_outcome("DF2", "failed")
    text = " ".join(run.text.split())
    assert (
        "ran UNet2DConditionModel (dlcheck_unet) with the raw trained weights: all 208 tensors equal dlcheck_unet's, "
        "none the EMA's (dlcheck_ema: EMA module; its online_model shared with dlcheck_unet (208 tensors) left out "
        "as the trained model itself)" in text
    )
    assert "pipe.register_modules(unet=ema_model.ema_model)" in text
