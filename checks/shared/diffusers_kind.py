"""What a diffusers model is, read from the object (its classes' module, its forward's parameters, its config): a
denoiser (a UNet, a DiT-style transformer, a prior: its forward takes the timestep; a masked-token generator that
predicts codebook entries) or a model that denoises nothing (VQModel, AutoencoderKL: an image autoencoder, whose
forward takes no timestep). Shared by the domains that tell a diffusion training from another kind of pipeline."""

from __future__ import annotations

import inspect
from typing import Any

#: forward parameters that carry the diffusion time: a denoiser's input
TIME_PARAMS = ("timestep", "timesteps", "t")
#: config keys of a denoiser that predicts codebook entries (aMUSEd's UVit2DModel, VQ-Diffusion's transformer)
CODEBOOK_KEYS = ("codebook_size", "num_vector_embeds")


def is_diffusers(obj: Any) -> bool:
    return any(c.__module__.startswith("diffusers.") for c in type(obj).__mro__)


def is_denoiser(obj: Any) -> bool:
    """A diffusers model whose forward takes a timestep, or one that predicts codebook entries; False for a
    diffusers model that denoises nothing (an autoencoder), and for anything not of diffusers."""
    if not is_diffusers(obj) or not callable(getattr(obj, "forward", None)):
        return False
    try:
        params = inspect.signature(obj.forward).parameters
    except (TypeError, ValueError):
        return True  # unreadable: taken as diffusers' usual trained model
    if any(p in params for p in TIME_PARAMS):
        return True
    config = getattr(obj, "config", None)
    return any(
        (config.get(k) if hasattr(config, "get") else getattr(config, k, None)) is not None for k in CODEBOOK_KEYS
    )


def what_it_is(obj: Any) -> str:
    """'a denoiser' or 'an image autoencoder (its forward takes no timestep: it denoises nothing)' for a diffusers
    model."""
    if is_denoiser(obj):
        return "a denoiser"
    return "an image autoencoder (its forward takes no timestep: it denoises nothing)"


def trained_autoencoder(obj: Any) -> bool:
    """A diffusers model that denoises nothing and trains (some parameter requires gradients): an autoencoder this
    script trains itself, whose input range is its own (not a pretrained VAE's convention)."""
    if not is_diffusers(obj) or is_denoiser(obj) or not hasattr(obj, "parameters"):
        return False
    return any(p.requires_grad for p in obj.parameters())
