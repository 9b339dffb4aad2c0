"""A tiny SDXL text-to-image set-up (diffusers' train_text_to_image_sdxl.py / train_text_to_image_lora_sdxl.py),
built offline from configs: two CLIP text encoders whose penultimate hidden states are concatenated (16 + 16 = 32
wide), a text_time UNet, a StableDiffusionXLPipeline. Only the conditioning path is exercised (DF5): the scripts'
encode_prompt with caption dropout to ``null`` ("" or zeros) at rate ``p_null``. Imported by the tests and the user
projects they write."""

from __future__ import annotations

import random
import textwrap
from types import SimpleNamespace

import tiny  # noqa: F401  (offline environment first)
import tinydiff

# imported once per process (tinydiff explains why)
from diffusers import EulerDiscreteScheduler, StableDiffusionXLPipeline, UNet2DConditionModel  # noqa: F401
from transformers import CLIPTextConfig, CLIPTextModel, CLIPTextModelWithProjection  # noqa: F401


def _text_config(tok) -> CLIPTextConfig:
    return CLIPTextConfig(
        vocab_size=len(tok),
        hidden_size=16,
        intermediate_size=32,
        num_hidden_layers=2,
        num_attention_heads=2,
        max_position_embeddings=tok.model_max_length,
        projection_dim=16,
        pad_token_id=tok.pad_token_id,
        bos_token_id=tok.bos_token_id,
        eos_token_id=tok.eos_token_id,
    )


def setup(*, null: str | None = None, p_null: float = 0.0, force_zeros: bool = True) -> SimpleNamespace:
    """``null``: what the training's caption dropout puts in place of the caption: "" (the empty caption, encoded
    like any other: train_text_to_image_sdxl.py's proportion_empty_prompts) or "zeros" (a zero embedding); None:
    no dropout (train_text_to_image_lora_sdxl.py). ``force_zeros``: the pipeline's force_zeros_for_empty_prompt
    (SDXL base's config: True, its sampler's null is then a zero embedding)."""
    import torch

    torch.manual_seed(0)
    tok = tinydiff.tokenizer()
    te1 = CLIPTextModel(_text_config(tok)).eval()
    te2 = CLIPTextModelWithProjection(_text_config(tok)).eval()
    unet = UNet2DConditionModel(
        sample_size=8,
        in_channels=4,
        out_channels=4,
        layers_per_block=1,
        block_out_channels=(8, 16),
        down_block_types=("DownBlock2D", "CrossAttnDownBlock2D"),
        up_block_types=("CrossAttnUpBlock2D", "UpBlock2D"),
        attention_head_dim=(2, 2),
        use_linear_projection=True,
        addition_embed_type="text_time",
        addition_time_embed_dim=4,
        projection_class_embeddings_input_dim=6 * 4 + 16,
        cross_attention_dim=32,
        norm_num_groups=4,
    )
    pipe = StableDiffusionXLPipeline(
        vae=tinydiff.vae("unit"),
        text_encoder=te1,
        text_encoder_2=te2,
        tokenizer=tok,
        tokenizer_2=tok,
        unet=unet,
        scheduler=EulerDiscreteScheduler(beta_schedule="scaled_linear", beta_start=0.00085, beta_end=0.012),
        force_zeros_for_empty_prompt=force_zeros,
    )
    pipe.set_progress_bar_config(disable=True)
    data = tinydiff.dataset()

    def collate(examples):
        caps = ["" if null == "" and random.random() < p_null else e["caption"] for e in examples]
        ids = tok(caps, padding="max_length", max_length=tok.model_max_length, truncation=True, return_tensors="pt")
        return {"pixel_values": torch.stack([e["pixel_values"] for e in examples]), "input_ids": ids.input_ids}

    def condition(batch):  # the scripts' encode_prompt: both encoders' hidden_states[-2], concatenated
        ehs = torch.cat([te(batch["input_ids"], output_hidden_states=True).hidden_states[-2] for te in (te1, te2)], -1)
        if null == "zeros":
            drop = torch.rand(ehs.shape[0]) < p_null
            ehs = torch.where(drop[:, None, None], torch.zeros_like(ehs), ehs)
        return ehs

    return SimpleNamespace(pipeline=pipe, dataset=data, collator=collate, condition=condition)


ROLES = ("pipeline", "dataset", "collator", "condition")


def conftest(roles=ROLES, **knobs) -> str:
    """A user conftest.py exposing ``setup(**knobs)``'s objects as dlcheck_<role> fixtures."""
    out = [
        f"""
        import pytest, tinysdxl

        @pytest.fixture(scope="session")
        def sdxl():
            return tinysdxl.setup(**{knobs!r})
        """
    ]
    for role in roles:
        out.append(f"""
        @pytest.fixture(scope="session")
        def dlcheck_{role}(sdxl):
            return sdxl.{role}
        """)
    return "\n".join(textwrap.dedent(block) for block in out)
