"""A tiny aMUSEd training set-up (diffusers' examples/amused/train_amused.py), built offline from configs: a
VQModel whose codebook tokens a UVit2DModel learns to unmask, a CLIP text encoder, an AmusedPipeline with its
AmusedScheduler (a mask schedule over token ids, no noise scheduler). The pipeline's image processor keeps images
in [0, 1] (do_normalize=False) and so does the training data, as upstream's ToTensor() does; ``pixels="[-1, 1]"``
adds the Normalize([0.5], [0.5]) that would break it. Imported by the tests and the user projects they write."""

from __future__ import annotations

import textwrap
from types import SimpleNamespace

import tiny  # noqa: F401  (offline environment first)
import tinydiff

# imported once per process (tinydiff explains why): the in-process runs would import them again each time
from diffusers import AmusedPipeline, AmusedScheduler, UVit2DModel, VQModel  # noqa: F401
from transformers import CLIPTextConfig, CLIPTextModelWithProjection  # noqa: F401

CODEBOOK = 16


def setup(*, pixels: str = "[0, 1]") -> SimpleNamespace:
    import torch

    torch.manual_seed(0)
    tok = tinydiff.tokenizer()
    te = CLIPTextModelWithProjection(
        CLIPTextConfig(
            vocab_size=len(tok),
            hidden_size=16,
            intermediate_size=32,
            num_hidden_layers=1,
            num_attention_heads=2,
            max_position_embeddings=tok.model_max_length,
            projection_dim=16,
            pad_token_id=tok.pad_token_id,
            bos_token_id=tok.bos_token_id,
            eos_token_id=tok.eos_token_id,
        )
    ).eval()
    vq = VQModel(
        in_channels=3,
        out_channels=3,
        down_block_types=("DownEncoderBlock2D",) * 2,
        up_block_types=("UpDecoderBlock2D",) * 2,
        block_out_channels=(8, 16),
        layers_per_block=1,
        latent_channels=4,
        num_vq_embeddings=CODEBOOK,
        vq_embed_dim=4,
        norm_num_groups=4,
        sample_size=tinydiff.SIZE,
        lookup_from_codebook=True,
        force_upcast=False,
    ).eval()
    transformer = UVit2DModel(
        hidden_size=16,
        cond_embed_dim=16,
        micro_cond_encode_dim=2,
        micro_cond_embed_dim=10,
        encoder_hidden_size=16,
        vocab_size=CODEBOOK + 1,
        codebook_size=CODEBOOK,
        in_channels=16,
        block_out_channels=16,
        num_res_blocks=1,
        downsample=False,
        upsample=False,
        block_num_heads=2,
        num_hidden_layers=1,
        num_attention_heads=2,
        intermediate_size=32,
    )
    pipe = AmusedPipeline(
        transformer=transformer,
        tokenizer=tok,
        text_encoder=te,
        vqvae=vq,
        scheduler=AmusedScheduler(mask_token_id=CODEBOOK),
    )
    pipe.set_progress_bar_config(disable=True)
    imgs = (tinydiff.images() + 1) / 2  # ToTensor(): [0, 1]
    if pixels == "[-1, 1]":
        imgs = imgs * 2 - 1  # Normalize([0.5], [0.5]) added
    data = [{"pixel_values": imgs[i], "caption": tinydiff.CAPTIONS[i]} for i in range(len(imgs))]

    def collate(examples):
        ids = tok([e["caption"] for e in examples], padding="max_length", truncation=True, return_tensors="pt")
        return {"pixel_values": torch.stack([e["pixel_values"] for e in examples]), "prompt_input_ids": ids.input_ids}

    return SimpleNamespace(pipeline=pipe, model=transformer, dataset=data, collator=collate)


ROLES = ("pipeline", "dataset", "collator")


def conftest(roles=ROLES, **knobs) -> str:
    """A user conftest.py exposing ``setup(**knobs)``'s objects as dlcheck_<role> fixtures."""
    out = [
        f"""
        import pytest, tinyamused

        @pytest.fixture(scope="session")
        def amused():
            return tinyamused.setup(**{knobs!r})
        """
    ]
    for role in roles:
        out.append(f"""
        @pytest.fixture(scope="session")
        def dlcheck_{role}(amused):
            return amused.{role}
        """)
    return "\n".join(textwrap.dedent(block) for block in out)
