"""A diffusers model that denoises nothing (a VQModel trained as the model, diffusers' examples/vqgan/train_vqgan.py,
found blind, set 15) is no diffusion training: the diffusion checks are not applicable, saying the model is an
autoencoder (its forward takes no timestep), instead of asking for a noise scheduler; the llm and vlm checks say the
same instead of calling it a denoiser; V1 does not hold the images to a pretrained VAE's [-1, 1] convention for an
autoencoder the script trains itself. The twin: the same loop around a diffusers UNet2DModel is a diffusion training
(the diffusion checks ask for its noise scheduler)."""

MODEL = {
    "vq": """VQModel(in_channels=3, out_channels=3, down_block_types=("DownEncoderBlock2D",),
                    up_block_types=("UpDecoderBlock2D",), block_out_channels=(8,), layers_per_block=1,
                    latent_channels=4, num_vq_embeddings=16, norm_num_groups=4, vq_embed_dim=4, sample_size=8)""",
    "unet": """UNet2DModel(sample_size=8, in_channels=3, out_channels=3, layers_per_block=1,
                    block_out_channels=(8, 8), norm_num_groups=4, down_block_types=("DownBlock2D", "DownBlock2D"),
                    up_block_types=("UpBlock2D", "UpBlock2D"))""",
}

CONFTEST = """
import pytest, torch
from torch.utils.data import DataLoader, TensorDataset
from diffusers import UNet2DModel, VQModel


def make():
    torch.manual_seed(0)
    model = {model}
    return {{"model": model, "optimizer": torch.optim.Adam(model.parameters(), 1e-3)}}


@pytest.fixture(scope="session")
def dlcheck_make_training():
    return make


@pytest.fixture(scope="session")
def dlcheck_train_step():
    def step(state, batch):
        x, y = batch
        model = state["model"]
        if isinstance(model, VQModel):
            out = model(x)
            loss = torch.nn.functional.mse_loss(out.sample, x) + out.commit_loss.mean()
        else:
            noise = torch.randn_like(x)
            loss = torch.nn.functional.mse_loss(model(x + noise, torch.zeros(len(x))).sample, noise)
        loss.backward()
        state["optimizer"].step()
        state["optimizer"].zero_grad()
        return loss.detach()
    return step


@pytest.fixture(scope="session")
def dlcheck_dataloader():
    g = torch.Generator().manual_seed(0)
    images = torch.rand(16, 3, 8, 8, generator=g)  # [0, 1]: the script trains its own autoencoder on them
    return DataLoader(TensorDataset(images, torch.zeros(16, dtype=torch.long)), batch_size=4, shuffle=True)
"""


def _flat(text: str) -> str:
    return " ".join(text.split())


def test_a_vq_model_trained_as_the_model_is_no_diffusion_training(project):
    project.conftest(CONFTEST.format(model=MODEL["vq"]))
    run = project.run("--dlcheck=DF4,DF6,DF8,L1,X1", "-rA")
    text = _flat(run.text)
    for cid in ("DF4", "DF6", "DF8", "L1", "X1"):
        run.assert_outcome(cid, "skipped")
    assert "missing role" not in text
    assert (
        "DF4 concerns diffusion training, and no diffusion role is given (dlcheck_pipeline, dlcheck_noise_scheduler, "
        "dlcheck_vae, dlcheck_training_inputs, … or a diffusers denoiser as dlcheck_model): the model is a diffusers "
        "VQModel, an image autoencoder (its forward takes no timestep: it denoises nothing)" in text
    )
    assert "dlcheck_model is a diffusers VQModel, an image autoencoder (its forward takes no timestep" in text
    assert "a denoiser" not in text and "denoises pixels" not in text


def test_v1_does_not_hold_a_trained_autoencoder_to_the_vae_convention(project):
    project.conftest(CONFTEST.format(model=MODEL["vq"]))
    run = project.run("--dlcheck=V1", "-rA")
    assert "[-1, 1]" not in _flat(run.text)
    assert run.outcome("V1") != "failed"


def test_the_same_loop_around_a_unet_is_a_diffusion_training(project):
    project.conftest(CONFTEST.format(model=MODEL["unet"]))
    run = project.run("--dlcheck=DF4,L1", "-rA")
    text = _flat(run.text)
    run.assert_outcome("DF4", "skipped")
    assert "missing role: define fixture dlcheck_noise_scheduler" in text
    assert "dlcheck_model is a diffusers UNet2DModel, a denoiser" in text
