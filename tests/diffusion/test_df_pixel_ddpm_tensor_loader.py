"""A pixel-space DDPM trained in a plain loop, lucidrains-style: a GaussianDiffusion module wraps the denoiser,
draws the timesteps and the noise itself and returns the scalar loss from ``forward(img)``; the dataloader yields
bare float image tensors (B, 3, H, W), with no tokenizer, no VAE, no diffusers scheduler and no condition. The
checks that do not concern it say why (no token batches, no VAE, no condition) and none blames the dataloader;
T4 says the model's scalar output cannot be judged per example."""

import pytest

from pytest_dlcheck.errors import RoleError
from pytest_dlcheck.sampling import SampleError, as_batch_dict

DDPM = """
    import pytest, torch
    from torch import nn
    from torch.utils.data import DataLoader, Dataset

    class Unet(nn.Module):  # the denoiser: forward(x, time), no condition
        def __init__(self, ch=8):
            super().__init__()
            self.time = nn.Linear(1, ch)
            self.inp = nn.Conv2d(3, ch, 3, padding=1)
            self.norm = nn.GroupNorm(4, ch)
            self.out = nn.Conv2d(ch, 3, 3, padding=1)

        def forward(self, x, time):
            h = self.inp(x) + self.time(time.float()[:, None] / 100)[:, :, None, None]
            return self.out(nn.functional.silu(self.norm(h)))

    class GaussianDiffusion(nn.Module):  # forward(img) draws t and noise and returns the loss
        def __init__(self, model, timesteps=100):
            super().__init__()
            self.model, self.num_timesteps = model, timesteps
            ac = torch.cumprod(1 - torch.linspace(1e-4, 0.02, timesteps), 0)
            self.register_buffer("sqrt_ac", ac.sqrt())
            self.register_buffer("sqrt_1mac", (1 - ac).sqrt())

        def q_sample(self, x_start, t, noise):
            return self.sqrt_ac[t][:, None, None, None] * x_start + self.sqrt_1mac[t][:, None, None, None] * noise

        def inputs(self, img):
            x_start = img * 2 - 1
            t = torch.randint(0, self.num_timesteps, (img.shape[0],))
            noise = torch.randn_like(x_start)
            return x_start, t, noise, self.q_sample(x_start, t, noise)

        def forward(self, img):
            x_start, t, noise, x = self.inputs(img)
            return nn.functional.mse_loss(self.model(x, t), noise)

    class Images(Dataset):  # an image folder: one float tensor per example
        def __init__(self, n=32):
            self.x = torch.rand(n, 3, 8, 8, generator=torch.Generator().manual_seed(0))

        def __len__(self):
            return len(self.x)

        def __getitem__(self, i):
            return self.x[i]

    def build():
        torch.manual_seed(0)
        diffusion = GaussianDiffusion(Unet())
        return {"model": diffusion, "optimizer": torch.optim.Adam(diffusion.parameters(), lr=1e-3)}

    @pytest.fixture(scope="session")
    def _diffusion():
        return build()["model"]

    @pytest.fixture(scope="session")
    def dlcheck_unet(_diffusion):
        return _diffusion.model

    @pytest.fixture(scope="session")
    def dlcheck_training_inputs(_diffusion):
        def training_inputs(batch):
            x_start, t, noise, x = _diffusion.inputs(batch)
            return {"latents": x_start, "noise": noise, "timesteps": t, "noisy_latents": x, "target": noise}
        return training_inputs

    @pytest.fixture(scope="session")
    def dlcheck_dataloader():
        return DataLoader(Images(), batch_size=8, shuffle=True)

    @pytest.fixture(scope="session")
    def dlcheck_make_training():
        return build

    @pytest.fixture(scope="session")
    def dlcheck_compute_loss():
        return lambda model, batch: model(batch)
"""

LLM = ("L1", "L2", "L3", "L4", "L5", "L7", "L8", "L11", "L12", "L13", "L14", "L15")


def test_pixel_ddpm_with_an_image_tensor_loader_is_not_blamed(project):
    project.conftest(DDPM)
    run = project.run("--dlcheck=llm,vlm,diffusion,T4", "-rA")
    assert "your role raised" not in run.text, run.text
    assert "internal error" not in run.text, run.text
    assert "expected a mapping" not in run.text, run.text
    for cid in (*LLM, "X5", "DF3", "DF5", "T4"):
        run.assert_outcome(cid, "skipped")
    # the llm and vlm checks: the batches are bare image tensors, no token fields
    assert "dlcheck_dataloader yields bare float Tensors (8, 3, 8, 8)" in run.text, run.text
    # DF3: no VAE, decided from the 3-channel images the training step noises
    assert (
        "not applicable: the training step's 'latents' have 3 channels ((8, 3, 8, 8)): it denoises pixels; there is no "
        "VAE, so no latent scale to check"
    ) in run.text, run.text
    # DF5: nothing in the data or the training inputs conditions the denoiser
    run.fnmatch(["*not applicable: the batches of dlcheck_dataloader are bare image tensors*classifier-free guidance*"])
    # T4: the model's forward returns the batch's loss, a 0-d tensor
    run.fnmatch(["*T4*the model's output is a 0-d tensor*not per example*"])


def test_a_collator_must_still_return_a_mapping():
    """The README's contract for dlcheck_collator is 'list of examples -> batch dict': a tensor from it is the
    user's error; from a dataloader, whose contract is 'the training DataLoader', it is data of another kind."""
    import torch

    with pytest.raises(RoleError, match="expected a mapping"):
        as_batch_dict(torch.zeros(2, 3), "collator")
    with pytest.raises(SampleError) as exc:
        as_batch_dict(torch.zeros(2, 3, 4, 4), "dataloader")
    assert exc.value.not_applicable


CLASS_CONDITIONAL = """
    @pytest.fixture(scope="session")
    def dlcheck_training_inputs(_diffusion):
        def training_inputs(batch):  # a class id per image, drawn by the step (never the null class 0)
            x_start, t, noise, x = _diffusion.inputs(batch)
            labels = torch.randint(1, 10, (batch.shape[0],)){drop}
            return {{"latents": x_start, "noise": noise, "timesteps": t, "noisy_latents": x, "class_labels": labels}}
        return training_inputs

    @pytest.fixture(scope="session")
    def dlcheck_uncond():
        return 0  # the null class the sampler guides with
"""


def test_a_condition_fed_by_the_step_is_judged_on_a_bare_tensor_loader(project):
    """The buggy twin of DF5's narrowing: the same loader of bare image tensors, but the training step conditions the
    denoiser on class ids it never drops to the sampler's null class: DF5 fails, it is not 'not applicable'."""
    project.conftest(DDPM + CLASS_CONDITIONAL.format(drop=""))
    run = project.run("--dlcheck=DF5")
    run.assert_outcome("DF5", "failed")
    assert "class labels from 300 calls of the 'encoder_hidden_states' of" in run.text, run.text
    assert "your role raised" not in run.text and "internal error" not in run.text, run.text


def test_a_condition_dropped_by_the_step_passes_on_a_bare_tensor_loader(project):
    drop = ".masked_fill(torch.rand(batch.shape[0]) < 0.1, 0)"
    project.conftest(DDPM + CLASS_CONDITIONAL.format(drop=drop))
    run = project.run("--dlcheck=DF5", "-rA")
    run.assert_outcome("DF5", "passed")
