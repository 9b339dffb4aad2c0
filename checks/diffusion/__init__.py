"""Checks of diffusion training with diffusers: latent diffusion with a VAE, text-conditioned UNets,
DDPM/DDIM/Euler/DPM-Solver schedulers, EMAModel.

Roles of the domain. A user who already builds a diffusers pipeline writes ``dlcheck_pipeline`` and gets
the VAE, the denoiser (``dlcheck_model``), the sampling scheduler, the tokenizer, the text encoder and
the unconditional (empty-prompt) input derived from it; the training side (``dlcheck_noise_scheduler``,
``dlcheck_training_inputs``, ``dlcheck_ema``, ``dlcheck_sample_images``) is what only the user knows."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest

from ...errors import MISSING
from ...roles import deriver, role
from .measure import denoiser_of, is_pipeline, module_device_dtype

role(
    "pipeline",
    "a diffusers DiffusionPipeline built from your components (e.g. StableDiffusionPipeline); "
    "derives dlcheck_unet, dlcheck_vae, dlcheck_inference_scheduler, dlcheck_tokenizer, dlcheck_text_encoder "
    "and dlcheck_uncond",
)
role(
    "unet",
    "the denoiser being trained: the UNet (UNet2DConditionModel…), or the transformer of a DiT-style pipeline",
    "dlcheck_pipeline, or dlcheck_model",
)
role("vae", "the VAE whose latents the denoiser is trained on (diffusers AutoencoderKL)", "dlcheck_pipeline")
role(
    "text_encoder",
    "the text encoder that turns token ids into the denoiser's encoder_hidden_states (transformers CLIPTextModel, …)",
    "dlcheck_pipeline",
)
role("noise_scheduler", "the scheduler your training step noises with (e.g. DDPMScheduler): its config and add_noise")
role(
    "inference_scheduler",
    "the scheduler you sample with (e.g. DDIMScheduler, DPMSolverMultistepScheduler)",
    "dlcheck_pipeline",
)
role(
    "training_inputs",
    "callable batch -> dict of what your training step feeds the denoiser: 'latents' (clean, "
    "scaled), 'noise', 'timesteps', 'noisy_latents', and optionally 'target', 'encoder_hidden_states', "
    "'loss_weights'; called a few times on sampled batches, without gradients",
)
role(
    "condition",
    "callable batch -> the conditioning your training step gives the denoiser for that batch, caption/"
    "conditioning dropout applied (embeddings, token ids, class ids or captions); called a few hundred times",
    "dlcheck_training_inputs returning 'encoder_hidden_states'",
)
role(
    "uncond",
    "the unconditional input your sampler uses for classifier-free guidance (the empty prompt's "
    "embeddings, token ids, a null class id or caption)",
    "dlcheck_pipeline, or dlcheck_tokenizer + dlcheck_text_encoder",
)
role("ema", "the EMA of the denoiser's weights: diffusers EMAModel, torch AveragedModel, or an EMA copy of the module")
role(
    "sample_images",
    "callable () -> images: the sampling/validation routine your training runs (keep it cheap: "
    "one prompt, 2 steps); DF2 watches which weights the denoiser runs with",
)

#: roles a pipeline gives (DESIGN: vae, unet, scheduler, tokenizer, text encoder). The core ``tokenizer``
#: role is reused; the core ``model`` is not derived from a pipeline (other domains' checks would call the
#: UNet with their own batches): the denoiser is the ``unet`` role, which a given dlcheck_model also fills.
FROM_PIPELINE = ("vae", "text_encoder", "tokenizer", "unet", "inference_scheduler", "uncond")


def _get(get: Callable[[str], Any], name: str) -> Any:
    # a core default fixture resolves other roles by fixture lookup; a domain role may have no fixture
    try:
        return get(name)
    except pytest.FixtureLookupError:
        return MISSING


def empty_prompt_embeddings(tokenizer: Any, text_encoder: Any) -> Any:
    """What StableDiffusionPipeline.encode_prompt feeds as the unconditional input when no negative
    prompt is given: the text encoder's last hidden state for "" padded to the tokenizer's max length."""
    import torch

    from ...guard import eval_mode

    max_length = getattr(tokenizer, "model_max_length", None)
    kwargs = (
        dict(padding="max_length", max_length=max_length, truncation=True)
        if max_length and max_length < 100_000
        else {}
    )
    enc = tokenizer([""], return_tensors="pt", **kwargs)
    device, _ = module_device_dtype(text_encoder)
    call_kwargs = {}
    if getattr(getattr(text_encoder, "config", None), "use_attention_mask", False) and "attention_mask" in enc:
        call_kwargs["attention_mask"] = enc["attention_mask"].to(device)
    with eval_mode(text_encoder), torch.no_grad():
        out = text_encoder(enc["input_ids"].to(device), **call_kwargs)
    hidden = out[0] if isinstance(out, (tuple, list)) else getattr(out, "last_hidden_state", out[0])
    return hidden.detach()


#: a pipeline's second and third text encoders: its conditioning is not the first encoder's last hidden state alone
MORE_ENCODERS = ("text_encoder_2", "text_encoder_3")


def own_encoding_of_the_null(pipe: Any) -> bool:
    """The pipeline builds its unconditional input with more than its first text encoder (SDXL: both encoders'
    penultimate hidden states concatenated, or zeros with force_zeros_for_empty_prompt) and says how in its own
    ``encode_prompt(prompt, ..., do_classifier_free_guidance, negative_prompt, ...)``."""
    import inspect

    if not any(getattr(pipe, name, None) is not None for name in MORE_ENCODERS):
        return False
    encode = getattr(pipe, "encode_prompt", None)
    try:
        params = inspect.signature(encode).parameters if callable(encode) else {}
    except (TypeError, ValueError):
        return False
    return all(p in params for p in ("prompt", "device", "do_classifier_free_guidance", "negative_prompt"))


def pipeline_null_embeddings(pipe: Any, negative_prompt: str | None = None) -> Any:
    """What the pipeline's sampler feeds as the unconditional input for ``negative_prompt`` (None: none given, the
    pipeline's default), from its own ``encode_prompt`` with classifier-free guidance on (the second item it
    returns: negative_prompt_embeds), its text encoders in eval mode, without gradients."""
    from contextlib import ExitStack

    from ...guard import eval_mode

    encoders = [e for e in (getattr(pipe, n, None) for n in ("text_encoder", *MORE_ENCODERS)) if e is not None]
    device, _ = module_device_dtype(encoders[0])
    with ExitStack() as stack:
        for encoder in encoders:
            stack.enter_context(eval_mode(encoder))
        out = pipe.encode_prompt(
            prompt="",
            device=device,
            num_images_per_prompt=1,
            do_classifier_free_guidance=True,
            negative_prompt=negative_prompt,
        )
    return out[1].detach()


@deriver
def from_pipeline(name: str, get: Callable[[str], Any], cache: Callable[[Any, str, Callable[[], Any]], Any]) -> Any:
    if name not in FROM_PIPELINE:
        return MISSING
    pipe = _get(get, "pipeline")
    if pipe is not MISSING and is_pipeline(pipe):
        if name == "unet":
            return denoiser_of(pipe)
        if name == "inference_scheduler":
            value = getattr(pipe, "scheduler", None)
        elif name == "uncond":
            if own_encoding_of_the_null(pipe):
                return cache(pipe, "uncond", lambda: pipeline_null_embeddings(pipe))
            tok, enc = getattr(pipe, "tokenizer", None), getattr(pipe, "text_encoder", None)
            if tok is None or enc is None:
                return MISSING
            return cache(pipe, "uncond", lambda: empty_prompt_embeddings(tok, enc))
        else:
            value = getattr(pipe, name, None)
        return MISSING if value is None else value
    if name == "unet":
        return _get(get, "model")
    if name == "uncond":
        tok, enc = _get(get, "tokenizer"), _get(get, "text_encoder")
        if tok is not MISSING and enc is not MISSING:
            return cache((tok, enc), "uncond", lambda: empty_prompt_embeddings(tok, enc))
    return MISSING
