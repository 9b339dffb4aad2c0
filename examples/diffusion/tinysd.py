"""A tiny but real text-to-image latent-diffusion project, built offline in a second: drawn coloured
shapes with captions, a word-level tokenizer and a CLIP text encoder, an AutoencoderKL, a conditional
UNet, DDPM for training, DDIM for sampling, an EMA of the UNet — the parts of diffusers'
train_text_to_image.py. Stands in for your own project."""

import os
import random

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")


def _one_thread():
    import torch

    torch.set_num_threads(1)  # models this small run fastest on one CPU thread (and do not spin under load)


_one_thread()

SIZE = 16
COLOURS = {"red": (1.0, -1.0, -1.0), "green": (-1.0, 1.0, -1.0), "blue": (-1.0, -1.0, 1.0), "white": (1.0, 1.0, 1.0)}
SHAPES = ("square", "circle", "cross")
CAPTIONS = [f"a {c} {s}" for c in COLOURS for s in SHAPES]


def draw(colour, shape):
    """A SIZE×SIZE RGB image in [-1, 1]: a coloured shape on a grey background."""
    import torch

    yy, xx = torch.meshgrid(torch.arange(SIZE), torch.arange(SIZE), indexing="ij")
    c = (SIZE - 1) / 2
    if shape == "square":
        mask = ((xx - c).abs() < 5) & ((yy - c).abs() < 5)
    elif shape == "circle":
        mask = (xx - c) ** 2 + (yy - c) ** 2 < 30
    else:
        mask = ((xx - c).abs() < 2) | ((yy - c).abs() < 2)
    img = torch.full((3, SIZE, SIZE), -0.2)
    for ch, v in enumerate(COLOURS[colour]):
        img[ch][mask] = v
    return img


def dataset():
    return [{"pixel_values": draw(*caption.split()[1:]), "caption": caption} for caption in CAPTIONS]


def build_tokenizer():
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    words = sorted({w for caption in CAPTIONS for w in caption.split()})
    vocab = {"<pad>": 0, "<unk>": 1, "<bos>": 2, "<eos>": 3, **{w: i + 4 for i, w in enumerate(words)}}
    word_level = Tokenizer(models.WordLevel(vocab, unk_token="<unk>"))
    word_level.pre_tokenizer = pre_tokenizers.Whitespace()
    return PreTrainedTokenizerFast(
        tokenizer_object=word_level,
        pad_token="<pad>",
        unk_token="<unk>",
        bos_token="<bos>",
        eos_token="<eos>",
        model_max_length=8,
    )


def build_text_encoder(tok):
    import torch
    from transformers import CLIPTextConfig, CLIPTextModel

    torch.manual_seed(0)
    return CLIPTextModel(
        CLIPTextConfig(
            vocab_size=len(tok),
            hidden_size=16,
            intermediate_size=32,
            num_hidden_layers=1,
            num_attention_heads=2,
            max_position_embeddings=8,
            pad_token_id=0,
            bos_token_id=2,
            eos_token_id=3,
        )
    ).eval()


def build_vae():
    """Stands in for Stable Diffusion's pretrained VAE: its latents have SD's statistics (std ≈ 5.5), so
    SD's scaling_factor 0.18215 (the AutoencoderKL default) is the right one for it."""
    import torch
    from diffusers import AutoencoderKL

    torch.manual_seed(0)
    vae = AutoencoderKL(
        in_channels=3,
        out_channels=3,
        latent_channels=4,
        down_block_types=("DownEncoderBlock2D",) * 2,
        up_block_types=("UpDecoderBlock2D",) * 2,
        block_out_channels=(8, 16),
        layers_per_block=1,
        norm_num_groups=4,
        sample_size=SIZE,
    ).eval()
    with torch.no_grad():  # "pretraining": a sharp posterior, and latents of SD's scale
        vae.quant_conv.weight[4:] = 0
        vae.quant_conv.bias[4:] = -30.0
        mean = vae.encode(torch.stack([d["pixel_values"] for d in dataset()])).latent_dist.mean
        vae.quant_conv.weight[:4] *= (1 / 0.18215) / float(mean.std())
        vae.quant_conv.bias[:4] *= (1 / 0.18215) / float(mean.std())
    return vae.requires_grad_(False)


def build_unet():
    import torch
    from diffusers import UNet2DConditionModel

    torch.manual_seed(0)
    return UNet2DConditionModel(
        sample_size=SIZE // 2,
        in_channels=4,
        out_channels=4,
        layers_per_block=1,
        block_out_channels=(16, 32),
        norm_num_groups=8,
        cross_attention_dim=16,
        attention_head_dim=4,
        down_block_types=("CrossAttnDownBlock2D", "DownBlock2D"),
        up_block_types=("UpBlock2D", "CrossAttnUpBlock2D"),
    )


def collate_fn(tok, proportion_empty_prompts):
    """Batches of pixels and token ids; a share of captions replaced by "" (classifier-free guidance)."""
    import torch

    def collate(examples):
        captions = ["" if random.random() < proportion_empty_prompts else e["caption"] for e in examples]
        input_ids = tok(
            captions, padding="max_length", max_length=tok.model_max_length, truncation=True, return_tensors="pt"
        ).input_ids
        return {"pixel_values": torch.stack([e["pixel_values"] for e in examples]), "input_ids": input_ids}

    return collate


def pipeline(vae, text_encoder, tok, unet, scheduler):
    from diffusers import StableDiffusionPipeline

    pipe = StableDiffusionPipeline(
        vae=vae,
        text_encoder=text_encoder,
        tokenizer=tok,
        unet=unet,
        scheduler=scheduler,
        safety_checker=None,
        feature_extractor=None,
        requires_safety_checker=False,
    )
    pipe.set_progress_bar_config(disable=True)
    return pipe


def log_validation(pipe):
    return pipe("a red circle", num_inference_steps=2, height=SIZE, width=SIZE, output_type="pt").images


def train(unet, ema, training_inputs, batches):
    """The training loop: the denoiser predicts the target from the noisy latents; EMA after each step."""
    import torch
    import torch.nn.functional as F

    opt = torch.optim.AdamW(unet.parameters(), lr=1e-3)
    for batch in batches:
        with torch.no_grad():
            x = training_inputs(batch)
        pred = unet(x["noisy_latents"], x["timesteps"], x["encoder_hidden_states"]).sample
        F.mse_loss(pred, x["target"]).backward()
        opt.step()
        opt.zero_grad()
        ema.step(unet.parameters())


def role_fixtures(*roles):
    """Session fixtures ``dlcheck_<role>`` returning ``project[role]`` from the ``project`` fixture:
    ``globals().update(role_fixtures("pipeline", ...))`` in a conftest.py defines them there."""
    import pytest

    def fixture_for(role):
        @pytest.fixture(scope="session", name=f"dlcheck_{role}")
        def role_fixture(project):
            return project[role]

        return role_fixture

    return {f"dlcheck_{role}": fixture_for(role) for role in roles}
