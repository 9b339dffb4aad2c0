"""A tiny image-conditioned latent-diffusion decoder training (diffusers'
examples/kandinsky2_2/text_to_image/train_text_to_image_decoder.py), built offline from configs: a VQModel
(MoVQ layout, spatial norm) whose raw ``latents`` a UNet2DConditionModel conditioned on image embeddings
learns to denoise, with the DDPMScheduler it trains with and a KandinskyV22Pipeline that samples. That
pipeline decodes ``movq.decode(latents, force_not_quantize=True)``, without dividing by the VQModel's
config.scaling_factor (0.18215 by default), so the training step applies no factor either: ``factor``
("none", the upstream step; "config": × vq.config.scaling_factor, which would not match the sampler).
Imported by the tests and the user projects they write."""

from __future__ import annotations

import copy
import textwrap
from types import SimpleNamespace

import tiny  # noqa: F401  (offline environment first)
import tinydiff

# imported once per process (tinydiff explains why): the in-process runs would import them again each time
from diffusers import DDPMScheduler, KandinskyV22Pipeline, UNet2DConditionModel, VQModel  # noqa: F401

EMB = 16  # the image embedding's width (the prior's output)


def setup(*, factor: str = "none", sampler: str = "pipeline") -> SimpleNamespace:
    """factor: "none" (upstream: raw latents) or "config" (× vq.config.scaling_factor); sampler: "pipeline"
    (the KandinskyV22Pipeline samples, as log_validation does), "pipeline-copy" (the same, with the
    pipeline's own copy of the VQModel) or "none" (no sampling routine handed over)."""
    import torch

    torch.manual_seed(0)
    unet = UNet2DConditionModel(
        sample_size=tinydiff.SIZE // 2,
        in_channels=4,
        out_channels=8,  # eps + learned variance
        addition_embed_type="image",
        down_block_types=("ResnetDownsampleBlock2D", "SimpleCrossAttnDownBlock2D"),
        up_block_types=("SimpleCrossAttnUpBlock2D", "ResnetUpsampleBlock2D"),
        mid_block_type="UNetMidBlock2DSimpleCrossAttn",
        block_out_channels=(16, 32),
        layers_per_block=1,
        norm_num_groups=8,
        encoder_hid_dim=EMB,
        encoder_hid_dim_type="image_proj",
        cross_attention_dim=16,
        attention_head_dim=4,
        resnet_time_scale_shift="scale_shift",
        class_embed_type=None,
    )
    movq = VQModel(
        block_out_channels=[32, 32],
        down_block_types=["DownEncoderBlock2D", "DownEncoderBlock2D"],
        up_block_types=["UpDecoderBlock2D", "UpDecoderBlock2D"],
        in_channels=3,
        out_channels=3,
        latent_channels=4,
        layers_per_block=1,
        norm_num_groups=8,
        norm_type="spatial",
        num_vq_embeddings=12,
        vq_embed_dim=4,
        sample_size=tinydiff.SIZE,
    ).eval()
    sched = DDPMScheduler(beta_schedule="linear", beta_start=0.00085, beta_end=0.012, clip_sample=False, steps_offset=1)
    # "pipeline-copy": the pipeline holds its own VQModel with the same weights (a pipeline loaded with
    # from_pretrained beside the training's VQModel, as the upstream log_validation does)
    pipe_movq = copy.deepcopy(movq) if sampler == "pipeline-copy" else movq
    pipe = KandinskyV22Pipeline(unet=unet, scheduler=DDPMScheduler.from_config(sched.config), movq=pipe_movq)
    pipe.set_progress_bar_config(disable=True)
    imgs = tinydiff.images()
    embeds = torch.randn(len(imgs), EMB)
    data = [{"pixel_values": imgs[i], "image_embeds": embeds[i]} for i in range(len(imgs))]

    def collate(examples):
        return {k: torch.stack([e[k] for e in examples]) for k in ("pixel_values", "image_embeds")}

    def training_inputs(batch):  # the step up to the UNet call
        latents = movq.encode(batch["pixel_values"]).latents
        if factor == "config":
            latents = latents * movq.config.scaling_factor
        noise = torch.randn_like(latents)
        t = torch.randint(0, sched.config.num_train_timesteps, (latents.shape[0],))
        return {
            "latents": latents,
            "noise": noise,
            "timesteps": t,
            "noisy_latents": sched.add_noise(latents, noise, t),
            "target": noise,
        }

    def sample_images():  # log_validation: the decoder pipeline on an image embedding
        emb = embeds[:1]
        return pipe(
            image_embeds=emb,
            negative_image_embeds=torch.zeros_like(emb),
            height=tinydiff.SIZE,
            width=tinydiff.SIZE,
            num_inference_steps=2,
            output_type="pt",
        ).images

    torch.manual_seed(0)
    return SimpleNamespace(
        unet=unet,
        vae=movq,
        noise_scheduler=sched,
        inference_scheduler=pipe.scheduler,
        pipeline=pipe,
        dataset=data,
        collator=collate,
        training_inputs=training_inputs,
        sample_images=sample_images if sampler != "none" else None,
    )


ROLES = ("unet", "vae", "noise_scheduler", "inference_scheduler", "training_inputs", "dataset", "collator")


def conftest(roles=ROLES + ("sample_images",), **knobs) -> str:
    """A user conftest.py exposing ``setup(**knobs)``'s objects as dlcheck_<role> fixtures."""
    out = [
        f"""
        import pytest, tinykandinsky

        @pytest.fixture(scope="session")
        def kd():
            return tinykandinsky.setup(**{knobs!r})
        """
    ]
    for role in roles:
        out.append(f"""
        @pytest.fixture(scope="session")
        def dlcheck_{role}(kd):
            return kd.{role}
        """)
    return "\n".join(textwrap.dedent(block) for block in out)
