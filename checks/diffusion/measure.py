"""What the diffusion checks share: the user's diffusers objects read the way a training script uses
them, the shared draws of the training path (``dlcheck_training_inputs``), fresh redraws of the data
path for statistics, and the exact binomial / DKW bounds the statistical checks use.

Imports nothing heavy at module import; torch and diffusers are imported inside functions."""

from __future__ import annotations

import contextlib
import math
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any

from ...cost import users_routine
from ...errors import MISSING, RoleError
from ...guard import preserved_dataloader
from ...roles import ROLES
from ...sampling import SampleError, as_batch_dict, get_sample, indexable, spread_positions
from ..shared.diffusers_kind import is_denoiser, what_it_is
from ..shared.reuse import reusing

# ---- the user's objects ------------------------------------------------------------------------------

#: keys of the ``dlcheck_training_inputs`` dict, canonical name first, then the aliases diffusers'
#: own training scripts use (SD/SDXL: latents…, SD3/Flux: model_input…)
INPUT_KEYS: dict[str, tuple[str, ...]] = {
    "latents": ("latents", "model_input", "x0", "clean_latents"),
    "noise": ("noise",),
    "timesteps": ("timesteps", "timestep", "t"),
    "noisy_latents": ("noisy_latents", "noisy_model_input", "noisy_input", "noisy"),
    "target": ("target",),
    "encoder_hidden_states": ("encoder_hidden_states", "prompt_embeds", "condition", "class_labels"),
    "loss_weights": ("loss_weights", "weights", "mse_loss_weights"),
}

#: batch fields that hold images in pixel space, in order of preference
PIXEL_KEYS = ("pixel_values", "images", "image", "pixels", "input", "x")
#: batch fields that hold the caption-side conditioning
CAPTION_KEYS = ("input_ids", "prompt_ids", "captions", "caption", "text", "prompt", "prompts")


def is_diffusers(obj: Any) -> bool:
    return any(c.__module__.startswith("diffusers.") for c in type(obj).__mro__)


def is_pipeline(obj: Any) -> bool:
    return (
        is_diffusers(obj)
        and hasattr(obj, "components")
        and any(c.__name__ == "DiffusionPipeline" for c in type(obj).__mro__)
    )


def denoiser_of(pipeline: Any) -> Any:
    for name in ("unet", "transformer", "prior"):
        module = getattr(pipeline, name, None)
        if module is not None:
            return module
    return MISSING


def describe(obj: Any) -> str:
    return type(obj).__name__


# ---- which pipelines a check concerns ------------------------------------------------------------------

#: roles that mark a project as a diffusion training: without one, the diffusion checks are not applicable
#: (dlcheck_unet is not one by itself: any project's dlcheck_model fills it; a diffusers one counts)
DIFFUSION_ROLES = (
    "pipeline",
    "noise_scheduler",
    "inference_scheduler",
    "vae",
    "training_inputs",
    "condition",
    "uncond",
    "text_encoder",
    "ema",
    "sample_images",
)


def diffusion_roles(ctx: Any) -> list[str]:
    """The diffusion roles the project gives (a diffusers dlcheck_model / dlcheck_unet counts as one)."""
    found = [f"dlcheck_{r}" for r in DIFFUSION_ROLES if ctx.has(r)]
    unet = ctx.role("unet")
    # a diffusers model that denoises nothing (VQModel, AutoencoderKL trained as the model) is no denoiser
    if unet is not MISSING and is_denoiser(unet):
        found.append(f"dlcheck_unet ({describe(unet)})")
    return found


def require_diffusion(ctx: Any) -> None:
    """Not applicable unless the project is a diffusion training (one of the diffusion roles is given)."""
    if not diffusion_roles(ctx):
        ctx.not_applicable(
            f"{ctx.check.id} concerns diffusion training, and no diffusion role is given (dlcheck_pipeline, "
            "dlcheck_noise_scheduler, dlcheck_vae, dlcheck_training_inputs, … or a diffusers denoiser as "
            "dlcheck_model)" + _autoencoder_note(ctx)
        )


def _autoencoder_note(ctx: Any) -> str:
    unet = ctx.role("unet")
    if unet is not MISSING and is_diffusers(unet) and not is_denoiser(unet):
        return f": the model is a diffusers {describe(unet)}, {what_it_is(unet)}"
    return ""


def vector_space(ctx: Any) -> str | None:
    """Why the denoiser works on vectors (a prior over CLIP image embeddings: Kandinsky's or unCLIP's
    PriorTransformer), not on images or their latents: its config gives an embedding size and no image channels, or
    the training step's 'latents' are one vector per example; else None."""
    unet = ctx.role("unet")
    if unet is not MISSING and is_diffusers(unet):
        config = sched_config(unet)
        if config.get("embedding_dim") is not None and config.get("in_channels") is None:
            return (
                f"the denoiser {describe(unet)} denoises vectors of embedding_dim={config['embedding_dim']} (image "
                "embeddings), not images"
            )
    if ctx.has("training_inputs"):
        draws = training_draws(ctx)
        lat = draws[0].get("latents") if draws else None
        if lat is not None and getattr(lat, "dim", lambda: 0)() == 2:
            return f"the training step's 'latents' are one vector per example ({tuple(lat.shape)}): not images"
    return None


def pixel_space(ctx: Any) -> str | None:
    """Why the denoiser works on pixels, not VAE latents (a pipeline without a VAE, a denoiser whose
    in_channels are an image's, 'latents' of an image's channel count from the training step), else None. A denoiser
    of vectors (:func:`vector_space`) is not one."""
    if vector_space(ctx) is not None:
        return None
    pipe = ctx.role("pipeline")
    if pipe is not MISSING and is_pipeline(pipe) and getattr(pipe, "vae", None) is None:
        return f"dlcheck_pipeline is a {describe(pipe)}, which has no VAE: it denoises pixels"
    unet = ctx.role("unet")
    if unet is not MISSING and is_diffusers(unet):
        channels = sched_config(unet).get("in_channels")
        if channels in (1, 3):
            return f"the denoiser {describe(unet)} takes in_channels={channels}: it denoises pixels"
        if channels is not None:
            return None
    if ctx.has("training_inputs"):
        draws = training_draws(ctx)
        lat = draws[0].get("latents") if draws else None
        if lat is not None and getattr(lat, "dim", lambda: 0)() == 4 and lat.shape[1] in (1, 3):
            return (
                f"the training step's 'latents' have {lat.shape[1]} channels ({tuple(lat.shape)}): it denoises pixels"
            )
    return None


#: config keys of diffusers' schedulers over discrete token ids: AmusedScheduler's mask_token_id (masked-token
#: generation, MUSE/aMUSEd: a mask schedule over a VQ model's tokens) and VQDiffusionScheduler's num_vec_classes
DISCRETE_SCHEDULER_KEYS = ("mask_token_id", "num_vec_classes")
#: config keys of a denoiser that predicts codebook entries (UVit2DModel's codebook_size, VQ-Diffusion's
#: Transformer2DModel's num_vector_embeds)
DISCRETE_DENOISER_KEYS = ("codebook_size", "num_vector_embeds")


def discrete_tokens(ctx: Any) -> str | None:
    """Why the project generates the discrete token ids of a VQ model (aMUSEd: its AmusedScheduler masks token ids
    by a mask schedule and the transformer predicts their codebook entries) rather than denoising continuous latents
    or pixels with a noise scheduler (DDPM family, flow matching), else None. Read from the training scheduler when
    one is given (a continuous one: None), else from the pipeline's scheduler."""
    given = ctx.role("noise_scheduler")
    if given is not MISSING:
        who, sched = "dlcheck_noise_scheduler", given
    else:
        pipe = ctx.role("pipeline")
        sched = ctx.role("inference_scheduler")
        who = "dlcheck_pipeline's scheduler" if pipe is not MISSING else "dlcheck_inference_scheduler"
    if sched is MISSING or sched is None:
        return None
    config = sched_config(sched)
    key = next((k for k in DISCRETE_SCHEDULER_KEYS if config.get(k) is not None), None)
    if key is None:
        return None
    parts = [f"{who} ({describe(sched)}, {key}={config[key]}) works on the discrete token ids of a VQ model"]
    pipe = ctx.role("pipeline")
    vq = getattr(pipe, "vqvae", None) if pipe is not MISSING else None
    unet = ctx.role("unet")
    codebook = next((k for k in DISCRETE_DENOISER_KEYS if sched_config(unet).get(k) is not None), None)
    if vq is not None:
        parts.append(f"the pipeline's {describe(vq)} (vqvae) turns images into those tokens")
    if unet is not MISSING and codebook is not None:
        parts.append(
            f"the denoiser {describe(unet)} predicts their codebook entries ({codebook}={sched_config(unet)[codebook]})"
        )
    return (
        "; ".join(parts)
        + f": it generates discrete tokens ({'masked-token prediction' if key == 'mask_token_id' else 'discrete diffusion'}), "
        "with no noise scheduler, Gaussian noise or continuous latents"
    )


def unconditional(ctx: Any) -> str | None:
    """Why the denoiser takes no condition (a UNet2DModel without class embeddings; a training whose data hold
    nothing to condition on, :func:`nothing_to_condition_on`), else None."""
    unet = ctx.role("unet")
    if unet is MISSING or not is_diffusers(unet):
        return nothing_to_condition_on(ctx)
    config = sched_config(unet)
    if (
        describe(unet) == "UNet2DModel"
        and config.get("num_class_embeds") is None
        and not config.get("class_embed_type")
    ):
        return f"the denoiser {describe(unet)} is unconditional (no cross-attention, no class embedding)"
    return None


#: roles that bring a condition for the denoiser (a caption's text encoder, the sampler's null input)
CONDITION_ROLES = ("condition", "uncond", "text_encoder", "pipeline", "collator", "tokenizer")


def nothing_to_condition_on(ctx: Any) -> str | None:
    """Why nothing conditions the denoiser of a training fed by a loader of bare tensors: every sampled batch is one
    float tensor (the images and nothing else: no caption, class label or any other field to condition on), no role
    brings a condition (:data:`CONDITION_ROLES`), and dlcheck_training_inputs, when given, feeds the denoiser no
    conditioning. None otherwise: batches with fields (captions, labels) are read as they are."""
    if any(ctx.has(r) for r in CONDITION_ROLES) or not ctx.has("dataloader"):
        return None
    sample = get_sample(ctx, as_yielded=True)
    batches = sample.batches
    if not batches or not all(
        hasattr(b, "shape") and getattr(b, "is_floating_point", lambda: False)() for b in batches
    ):
        return None
    said = ""
    if ctx.has("training_inputs"):
        draws = training_draws(ctx)
        if not draws or any(d.get("encoder_hidden_states") is not None for d in draws):
            return None
        said = (
            "; dlcheck_training_inputs feeds the denoiser no conditioning (it returns "
            f"{', '.join(sorted(draws[0].values))})"
        )
    return (
        f"the batches of dlcheck_dataloader are bare image tensors ({len(batches)} sampled, "
        f"{tuple(batches[0].shape)}) with no caption, class label or other field to condition on{said}: "
        "the denoiser is trained unconditionally"
    )


#: pipeline components that take part in the denoiser's prediction beside the UNet (a ControlNet's residuals, a
#: T2I-Adapter's features): trained, they learn an unconditional prediction of their own
DENOISING_PARTS = ("controlnet", "adapter")


#: samplers of consistency-distilled models (LCM, LCM-LoRA, TCD, consistency models): they sample in a few steps with
#: the guidance distilled into the student from a guided teacher, not by classifier-free guidance of the student
CONSISTENCY_SAMPLERS = ("LCMScheduler", "TCDScheduler", "CMStochasticIterativeScheduler")


def consistency_sampler(ctx: Any) -> str | None:
    """Where the training's sampler is a consistency sampler (dlcheck_inference_scheduler, or the scheduler of
    dlcheck_pipeline), in words; else None."""
    for role, attr in (("inference_scheduler", None), ("pipeline", "scheduler")):
        obj = ctx.role(role)
        sched = obj if attr is None or obj is MISSING else getattr(obj, attr, None)
        if sched is not MISSING and sched is not None and type(sched).__name__ in CONSISTENCY_SAMPLERS:
            where = f"dlcheck_{role}" + (f".{attr}" if attr else "")
            return f"{where} is a {type(sched).__name__}"
    return None


def frozen_denoiser(ctx: Any) -> str | None:
    """Why the denoiser learns nothing (no parameter of dlcheck_unet requires grad, and no ControlNet or adapter of
    the pipeline does: textual inversion freezes the UNet and trains one token embedding), else None. A LoRA or any
    other trainable tensor inside the UNet makes it a trained denoiser."""
    unet = ctx.role("unet")
    if unet is MISSING or not callable(getattr(unet, "parameters", None)):
        return None
    params = list(unet.parameters())
    if not params or any(p.requires_grad for p in params):
        return None
    pipe = ctx.role("pipeline")
    for name in DENOISING_PARTS:
        part = getattr(pipe, name, None) if pipe is not MISSING else None
        if callable(getattr(part, "parameters", None)) and any(p.requires_grad for p in part.parameters()):
            return None
    return (
        f"the denoiser {describe(unet)} (dlcheck_unet) is frozen: none of its {len(params)} parameter tensors "
        "requires grad"
    )


def sched_config(sched: Any) -> Mapping[str, Any]:
    config = getattr(sched, "config", None)
    return config if isinstance(config, Mapping) else {}


def alphas_cumprod(sched: Any):
    """The scheduler's cumulative signal share ᾱ_t as a float64 CPU tensor, or None (flow matching)."""
    import torch

    a = getattr(sched, "alphas_cumprod", None)
    return a.detach().to("cpu", torch.float64) if isinstance(a, torch.Tensor) else None


def noising_coefficients(sched: Any, timesteps: Any) -> tuple[Any, Any] | None:
    """(a_t, b_t) with ``add_noise(x0, noise, t) = a_t·x0 + b_t·noise`` for the given integer timesteps,
    read from ``alphas_cumprod`` (DDPM family) without touching the user's scheduler; None when the
    scheduler has no such schedule."""
    ac = alphas_cumprod(sched)
    if ac is None:
        return None
    t = timesteps.to("cpu").long().clamp(0, len(ac) - 1)
    return ac[t].sqrt(), (1 - ac[t]).sqrt()


def fresh_scheduler(sched: Any) -> Any:
    """A new scheduler of the same class and config: set_timesteps on it leaves the user's alone."""
    return type(sched).from_config(sched.config)


def first_timesteps(sched: Any, steps: int) -> list[int]:
    s = fresh_scheduler(sched)
    s.set_timesteps(steps)
    return [int(round(float(t))) for t in s.timesteps[:2]]


def pixel_values(batch: Mapping[str, Any], channels: int | None = None) -> tuple[str, Any] | None:
    """(key, images) of the batch: a 4-D float tensor (B, C, H, W), preferring the usual names; a loader's bare
    image tensor is its own images (key ``"images"``)."""
    import torch

    if isinstance(batch, torch.Tensor):
        if batch.dim() == 4 and batch.is_floating_point() and (channels is None or batch.shape[1] == channels):
            return "images", batch
        return None
    keys = [k for k in PIXEL_KEYS if k in batch] + [k for k in batch if k not in PIXEL_KEYS]
    for key in keys:
        v = batch[key]
        if isinstance(v, torch.Tensor) and v.dim() == 4 and v.is_floating_point():
            if channels is None or v.shape[1] == channels:
                return key, v
    return None


def module_device_dtype(module: Any) -> tuple[Any, Any]:
    import torch

    for p in module.parameters():
        return p.device, p.dtype
    return torch.device("cpu"), torch.float32


def std(x: Any) -> float:
    return float(x.detach().double().std())


def fmt(x: float) -> str:
    return f"{x:.3g}" if abs(x) < 1e4 else f"{x:.2e}"


# ---- the training path -------------------------------------------------------------------------------


@dataclass
class Draw:
    """One call of ``dlcheck_training_inputs`` on one sampled batch, as CPU float tensors."""

    batch: int
    values: dict[str, Any] = field(default_factory=dict)

    def get(self, key: str) -> Any:
        return self.values.get(key)


def normalize_inputs(out: Any, role: str = "training_inputs") -> dict[str, Any]:
    """The user's dict under canonical keys; tensors detached to CPU (timesteps kept integral)."""
    import torch

    if not isinstance(out, Mapping):
        raise RoleError(
            role,
            f"returned a {type(out).__name__}, expected a dict like "
            "{'latents', 'noise', 'timesteps', 'noisy_latents', 'target', 'encoder_hidden_states'}",
        )
    values: dict[str, Any] = {}
    for canon, aliases in INPUT_KEYS.items():
        for alias in aliases:
            if alias in out and out[alias] is not None:
                v = out[alias]
                if isinstance(v, torch.Tensor):
                    v = v.detach().to("cpu")
                    if v.is_floating_point() and canon != "timesteps":
                        v = v.float()
                values[canon] = v
                break
    return values


def batch_size_of(values: dict[str, Any]) -> int:
    for key in ("latents", "noise", "noisy_latents"):
        v = values.get(key)
        if v is not None and hasattr(v, "shape") and len(v.shape) > 0:
            return int(v.shape[0])
    return 1


def timesteps_of(values: dict[str, Any]) -> Any:
    """The draw's timesteps as a 1-D tensor of one per example (a scalar is expanded)."""
    import torch

    t = values.get("timesteps")
    if t is None:
        return None
    t = torch.as_tensor(t).detach().to("cpu").flatten()
    b = batch_size_of(values)
    if t.numel() == 1 and b > 1:
        t = t.expand(b)
    return t


def training_draws(ctx: Any, min_rows: int = 64) -> list[Draw]:
    """Calls of the user's ``dlcheck_training_inputs`` on the shared sample batches, cycling over them
    until ``min_rows`` examples were drawn (at least 2 calls); computed once per session and shared by
    DF3, DF4, DF6, DF7 and DF8. Runs without gradients; the check item restores every RNG afterwards. The
    frozen VAE and text encoder run once per distinct batch (:func:`..shared.reuse.reusing`): the calls
    differ in the noise and timesteps they draw, not in the encodings."""
    fn = user_callable(ctx, "training_inputs", ctx.role("training_inputs"))
    sample = get_sample(ctx, as_yielded=True)  # the user's code takes the batches the pipeline gives it
    batches = sample.batches

    def make() -> list[Draw]:
        import torch

        draws: list[Draw] = []
        rows = 0
        i = 0
        while rows < min_rows or len(draws) < 2:
            b = i % len(batches)
            # the frozen VAE and text encoder see the same batch again: they run once per batch
            with torch.no_grad(), reusing(ctx, ctx.optional("vae"), ctx.optional("text_encoder")):
                out = ctx.call("training_inputs", lambda b=b: fn(batches[b]))
            values = normalize_inputs(out)
            draws.append(Draw(b, values))
            rows += batch_size_of(values)
            i += 1
            if i >= 4 * min_rows:  # batches of size 0: give up rather than loop
                break
        return draws

    return ctx.memo((fn, sample), f"dlcheck.diffusion.draws:{min_rows}", make)


def require_keys(ctx: Any, draws: list[Draw], *keys: str) -> None:
    got = sorted(draws[0].values) if draws else []
    missing = [k for k in keys if any(d.get(k) is None for d in draws)]
    if missing:
        names = ", ".join(f"'{k}'" for k in missing)
        ctx.skip(
            f"dlcheck_training_inputs returns no {names} (it returns: {', '.join(got) or 'nothing'}); "
            f"add {names} to its dict"
        )


def cat(draws: list[Draw], key: str) -> Any:
    import torch

    return torch.cat([d.get(key) for d in draws if d.get(key) is not None])


# ---- the trained objective -----------------------------------------------------------------------------

OBJECTIVES = ("epsilon", "v_prediction", "sample")
OBJECTIVE_WORDS = {
    "epsilon": "the noise (epsilon)",
    "v_prediction": "the velocity v (v_prediction)",
    "sample": "the clean latents x0 (sample)",
}


def measured_objective(draws: list[Draw], sched: Any, rtol: float) -> tuple[str | None, dict[str, int], int]:
    """What the training target really is, per example: the noise, the velocity
    ``sqrt(ᾱ)·noise − sqrt(1−ᾱ)·x0``, or x0. Returns (majority label or None, counts, examples judged)."""
    counts = {k: 0 for k in OBJECTIVES}
    judged = 0
    for d in draws:
        x0, noise, target, t = d.get("latents"), d.get("noise"), d.get("target"), timesteps_of(d.values)
        if x0 is None or noise is None or target is None or t is None or target.shape != noise.shape:
            continue
        coef = noising_coefficients(sched, t)
        cands = {"epsilon": noise, "sample": x0}
        if coef is not None:
            a, b = (c.float().view(-1, *([1] * (x0.dim() - 1))) for c in coef)
            cands["v_prediction"] = a * noise - b * x0
        for i in range(target.shape[0]):
            judged += 1
            tn = target[i].double().norm()
            for name, c in cands.items():
                if (target[i].double() - c[i].double()).norm() <= rtol * max(tn, c[i].double().norm(), 1e-12):
                    counts[name] += 1
                    break
    best = max(counts, key=counts.get) if judged else None
    if best is not None and counts[best] < 0.9 * judged:
        best = None
    return best, counts, judged


# ---- fresh redraws of the data path (DF5) ---------------------------------------------------------------


def redraw_batches(
    ctx: Any, calls: int, per_call: Callable[[], int] | None = None
) -> tuple[str, Iterator[tuple[list[Any], Mapping[str, Any]]], bool]:
    """``calls`` freshly collated batches: the dataset's examples are read again (so random caption
    dropout in a dataset transform or in the collator is drawn anew each time), spread over as many
    distinct examples as the dataset has. Yields (example keys, batch). Skips naming the roles if the
    data path is missing. ``per_call()``, asked before each batch, is how many examples the collator gets
    for it (the batch size when not given); the third value says whether the batch size can be chosen
    (dlcheck_collator + dlcheck_dataset) or is the dataloader's. A loader's bare tensor batch is yielded as it is
    (it has no fields to read; the user's conditioning code takes it)."""

    def as_dict(batch: Any, role: str) -> Mapping[str, Any]:
        try:
            return as_batch_dict(batch, role)
        except SampleError as exc:
            ctx.skip(str(exc))

    collator, dataset = ctx.role("collator"), ctx.role("dataset")
    bs = ctx.batch_size
    if (
        collator is not MISSING
        and dataset is not MISSING
        and indexable(dataset)  # an IterableDataset (with a length or not) is read through the loader
    ):
        n = len(dataset)
        if n == 0:
            ctx.skip("dlcheck_dataset is empty")
        positions = spread_positions(n, min(n, calls * bs))

        def gen():
            k = 0
            for _ in range(calls):
                size = max(1, per_call()) if per_call is not None else bs
                idx = [positions[(k + j) % len(positions)] for j in range(size)]
                k += size
                rows = [ctx.call("dataset", lambda p=p: dataset[p]) for p in idx]
                yield idx, as_dict(ctx.call("collator", lambda rows=rows: collator(rows)), "collator")

        return (
            f"batches freshly collated by dlcheck_collator from {len(positions)} examples of dlcheck_dataset",
            gen(),
            True,
        )
    loader = ctx.role("dataloader")
    if loader is not MISSING:

        def gen_loader():
            with preserved_dataloader(loader):
                it = iter(loader)
                made = 0
                restarts = 0
                while made < calls:
                    batch = ctx.call("dataloader", lambda it=it: next(it, None))
                    if batch is None:
                        restarts += 1
                        if restarts > calls:
                            return
                        it = iter(loader)
                        continue
                    made += 1
                    # a bare tensor (a pixel loader's images) goes to the user's conditioning code as it is yielded
                    bare = not isinstance(batch, Mapping) and hasattr(batch, "shape")
                    yield None, batch if bare else as_dict(batch, "dataloader")
                del it

        return "fresh batches of dlcheck_dataloader", gen_loader(), False
    ctx.skip(f"missing role: define fixture {ROLES['dataloader'].hint()} in conftest.py")


# ---- statistics ---------------------------------------------------------------------------------------


def _log_pmf(k: int, n: int, p: float) -> float:
    if p <= 0.0:
        return 0.0 if k == 0 else -math.inf
    if p >= 1.0:
        return 0.0 if k == n else -math.inf
    return math.lgamma(n + 1) - math.lgamma(k + 1) - math.lgamma(n - k + 1) + k * math.log(p) + (n - k) * math.log1p(-p)


def binom_cdf(k: int, n: int, p: float) -> float:
    """P(X ≤ k) for X ~ Binomial(n, p), exact (log-space sum)."""
    if k < 0:
        return 0.0
    if k >= n:
        return 1.0
    logs = [_log_pmf(i, n, p) for i in range(k + 1)]
    m = max(logs)
    return 0.0 if m == -math.inf else min(1.0, math.exp(m) * sum(math.exp(x - m) for x in logs))


def binom_sf(k: int, n: int, p: float) -> float:
    """P(X ≥ k) for X ~ Binomial(n, p), exact: summed over the upper tail itself, so that tiny tails
    keep their precision."""
    if k <= 0:
        return 1.0
    if k > n:
        return 0.0
    logs = [_log_pmf(i, n, p) for i in range(k, n + 1)]
    m = max(logs)
    return 0.0 if m == -math.inf else min(1.0, math.exp(m) * sum(math.exp(x - m) for x in logs))


def upper_bound(k: int, n: int, alpha: float) -> float:
    """One-sided Clopper–Pearson upper bound: the largest p with P(X ≤ k | p) ≥ alpha."""
    lo, hi = k / n if n else 0.0, 1.0
    for _ in range(60):
        mid = (lo + hi) / 2
        lo, hi = (mid, hi) if binom_cdf(k, n, mid) >= alpha else (lo, mid)
    return hi


def lower_bound(k: int, n: int, alpha: float) -> float:
    """One-sided Clopper–Pearson lower bound: the smallest p with P(X ≥ k | p) ≥ alpha."""
    lo, hi = 0.0, k / n if n else 0.0
    for _ in range(60):
        mid = (lo + hi) / 2
        lo, hi = (lo, mid) if binom_sf(k, n, mid) >= alpha else (mid, hi)
    return lo


def dkw_epsilon(n: int, alpha: float) -> float:
    """Dvoretzky–Kiefer–Wolfowitz (Massart): P(sup|F_n − F| > ε) ≤ 2·exp(−2nε²) = alpha, for any F."""
    return math.sqrt(math.log(2.0 / alpha) / (2.0 * n))


def uniform_cdf_gap(values: list[int], T: int) -> tuple[float, int]:
    """sup over integers x of |F_n(x) − F(x)| against the discrete uniform law on {0…T−1}; and the x
    where it is reached."""
    xs = sorted(values)
    n = len(xs)
    best, where = 0.0, 0
    i = 0
    for v in sorted(set(xs)):
        below = i  # count < v
        while i < n and xs[i] == v:
            i += 1
        for x, fn in ((v - 1, below / n), (v, i / n)):
            f = min(max((x + 1) / T, 0.0), 1.0)
            if abs(fn - f) > best:
                best, where = abs(fn - f), x
    return best, where


def user_callable(ctx: Any, name: str, obj: Any) -> Callable[..., Any]:
    if not callable(obj):
        raise RoleError(name, f"is a {type(obj).__name__}, expected a callable")
    return obj


def own_ema_tensors(ema: Any, model: Any) -> tuple[list[Any], Any, str]:
    """:func:`ema_tensors` of the EMA, less the tensors it shares with the trained denoiser ``model``: an
    EMA module that holds the online model as a submodule (``EMA(model)`` keeping ``online_model`` beside
    ``ema_model``) is judged on its averaged copy. An EMA all of whose tensors are the model's is kept whole
    (DF2 reports it as the model itself)."""
    from ...training.runs import ema_tensors
    from ..shared.ema_own import held_model_parts, own_tensors

    tensors, ema_module, desc = ema_tensors(ema)
    if ema_module is None or not tensors:
        return tensors, ema_module, desc
    own = own_tensors(tensors, model)
    if own and len(own) < len(tensors):
        parts = held_model_parts(ema_module, model)
        desc += (
            f"; its {', '.join(parts) or 'tensors'} shared with dlcheck_unet ({len(tensors) - len(own)} tensors) "
            "left out as the trained model itself"
        )
        ids = {id(t) for t in own}
        holders = [m for _, m in ema_module.named_modules() if {id(p) for p in m.parameters()} == ids]
        # the averaged copy: a module of the denoiser's class when one holds exactly those tensors
        copy = next((m for m in holders if type(m) is type(model)), holders[0] if holders else ema_module)
        return own, copy, desc
    return tensors, ema_module, desc


def align_params(model: Any, tensors: list[Any]) -> list[Any] | None:
    """The parameters of ``model`` that line up one to one with an EMA's ``tensors`` (all of them, or the
    trainable ones), or None."""
    params = list(model.parameters())
    for candidate in (params, [p for p in params if p.requires_grad]):
        if len(candidate) == len(tensors) and all(p.shape == t.shape for p, t in zip(candidate, tensors)):
            return candidate
    return None


def _nudge(t: Any) -> None:
    """Change one element of ``t`` in place by a relative 1e-3 (more if the dtype rounds that away)."""
    if t.numel() == 0:
        return
    idx = (0,) * t.dim()
    x = t[idx].clone()
    for rel in (1e-3, 1e-2, 1e-1, 1.0):
        t[idx] = x + rel * (x.abs() + 1e-3)
        if bool(t[idx] != x):
            return


def equal_all(params: list[Any], refs: list[Any]) -> bool:
    return all(p.shape == r.shape and bool((p.detach() == r.to(p.device, p.dtype)).all()) for p, r in zip(params, refs))


@dataclass
class EmaWatch:
    """Which weights the denoiser ran with while ``dlcheck_sample_images`` ran (DF2): the EMA's tensors were
    made distinguishable from the trained ones for the run (their first element nudged by a relative 1e-3,
    too little to change what DF3, DF4 and DF6 measure in the same run), and a forward pre-hook recorded,
    for every module of the denoiser's class that ran, whether it held the EMA's weights, the trained
    (raw) ones or others. ``drifted``: after the routine, the trained model no longer held its own weights."""

    tensors: list[Any]
    params: list[Any]
    ema_module: Any
    model: Any
    order: list[tuple[str, str]] = field(default_factory=list)
    drifted: bool = False
    drift_is_ema: bool = False

    @classmethod
    def prepare(cls, dlcheck: Any) -> EmaWatch | None:
        """None unless an EMA and the denoiser are given and line up, as separate tensors."""
        import torch

        ema, model = dlcheck.optional("ema"), dlcheck.optional("unet")
        if ema is None or not isinstance(model, torch.nn.Module):
            return None
        tensors, ema_module, _ = own_ema_tensors(ema, model)
        params = align_params(model, tensors) if tensors else None
        if params is None or any(t.data_ptr() == p.data_ptr() for t, p in zip(tensors, params)):
            return None
        return cls(tensors, params, ema_module, model)

    @contextlib.contextmanager
    def watching(self, ema: Any) -> Iterator[Callable[[], None]]:
        """Nudge the EMA and watch the denoiser's runs inside; yields the function to call right after the
        routine returns (it reads whether the trained weights drifted). Every weight, the EMA's tensors and
        its state (temp_stored_params, optimization_step, cur_decay_value) are put back at the end."""
        import torch

        model, tensors = self.model, self.tensors
        model_state = {k: v.detach().to("cpu", copy=True) for k, v in model.state_dict(keep_vars=True).items()}
        ema_state = [t.detach().to("cpu", copy=True) for t in tensors]
        ema_attrs = {
            k: getattr(ema, k)
            for k in ("temp_stored_params", "optimization_step", "cur_decay_value")
            if hasattr(ema, k)
        }
        names = {id(p): n for n, p in model.named_parameters()}
        raw = [
            model_state[names[id(p)]] if names.get(id(p)) in model_state else p.detach().to("cpu", copy=True)
            for p in self.params
        ]
        seen: set[int] = set()

        def pre_hook(module, args):
            if id(module) in seen or type(module) is not type(model):
                return
            mod_params = align_params(module, tensors)
            if mod_params is None:
                verdict = "other"
            elif equal_all(mod_params, tensors):
                verdict = "ema"
            elif equal_all(mod_params, raw):
                verdict = "raw"
            else:
                verdict = "other"
            seen.add(id(module))
            who = "dlcheck_unet" if module is model else ("the EMA module" if module is self.ema_module else "a copy")
            self.order.append((verdict, who))

        handle = None

        def after() -> None:
            if handle is not None:
                handle.remove()
            self.drifted = not equal_all(self.params, raw)
            self.drift_is_ema = self.drifted and equal_all(self.params, tensors)

        try:
            with torch.no_grad():
                for t in tensors:
                    _nudge(t)
            handle = torch.nn.modules.module.register_module_forward_pre_hook(pre_hook)
            yield after
        finally:
            if handle is not None:
                handle.remove()
            with torch.no_grad():
                for t, saved in zip(tensors, ema_state):
                    t.copy_(saved)
                current = model.state_dict(keep_vars=True)
                for k, v in model_state.items():
                    current[k].data.copy_(v)
            for k, v in ema_attrs.items():
                setattr(ema, k, v)


@dataclass
class SamplingRun:
    """What one call of ``dlcheck_sample_images`` showed: the scheduler instance whose ``step`` ran last, each
    latent tensor that reached ``decode`` of the VAE (or of another instance of its class: a pipeline loaded
    beside the training holds its own copy) with the last latents a scheduler step produced before it and the
    class name of the diffusers pipeline whose code made that call (None: the user's own code), and which
    weights the denoiser ran with (``ema``, for DF2; None without an EMA that lines up with it)."""

    scheduler: Any
    decoded: list[tuple[Any, Any, str | None]]
    ema: EmaWatch | None = None


def _calling_pipeline(depth: int = 12) -> str | None:
    """The class name of the innermost diffusers pipeline among the callers (a ``self`` that is a
    DiffusionPipeline in one of the ``depth`` frames above), or None."""
    import sys

    try:
        from diffusers import DiffusionPipeline
    except ImportError:  # pragma: no cover - diffusers is there whenever a VAE is
        return None
    frame = sys._getframe(2)
    for _ in range(depth):
        if frame is None:
            return None
        owner = frame.f_locals.get("self")
        if isinstance(owner, DiffusionPipeline):
            return type(owner).__name__
        frame = frame.f_back
    return None


def sampling_run(dlcheck) -> SamplingRun | None:
    """Runs ``dlcheck_sample_images`` once per session for DF2, DF3, DF4 and DF6 (memoised: the sampling loop
    runs the denoiser once per step, the VAE's decoder and the text encoder too, so it is run once, not per
    check; its passes are counted apart, as the user's routine: its cost is the user's num_inference_steps).
    Every scheduler class's ``step`` and this VAE's ``decode`` are wrapped for the call only, the RNG is
    forked, an EMA is watched (:class:`EmaWatch`), and a pipeline whose ``scheduler`` the routine replaced
    gets its own back. None when there is no sampling routine."""
    import torch
    from diffusers import SchedulerMixin

    sample = dlcheck.optional("sample_images")
    if sample is None or not callable(sample):
        return None
    pipe = dlcheck.optional("pipeline")
    vae = dlcheck.optional("vae")

    def make() -> SamplingRun:
        before = getattr(pipe, "scheduler", None)
        used: list[Any] = []
        last: list[Any] = []
        decoded: list[tuple[Any, Any]] = []
        patched: list[tuple[Any, Any]] = []

        def wrap(orig):
            def step(self, *args, **kwargs):
                used[:] = [self]
                out = orig(self, *args, **kwargs)
                prev = getattr(out, "prev_sample", None)
                if prev is None and isinstance(out, tuple) and out:
                    prev = out[0]
                if isinstance(prev, torch.Tensor):
                    last[:] = [prev.detach().float().cpu()]
                return out

            return step

        had_decode = vae is not None and "decode" in vae.__dict__
        orig_decode = getattr(vae, "decode", None)
        # the class's decode too: a pipeline built beside the training (from_pretrained) decodes with its own
        # instance of the VAE's class
        vae_cls = type(vae) if vae is not None and callable(getattr(type(vae), "decode", None)) else None
        cls_had_decode = vae_cls is not None and "decode" in vae_cls.__dict__
        cls_decode = vae_cls.__dict__["decode"] if cls_had_decode else getattr(vae_cls, "decode", None)
        inside: list[bool] = []

        def record(z):
            if isinstance(z, torch.Tensor) and not inside:
                decoded.append((z.detach().float().cpu(), last[0] if last else None, _calling_pipeline()))

        def decode(z, *args, **kwargs):
            record(z)
            inside.append(True)
            try:
                return orig_decode(z, *args, **kwargs)
            finally:
                inside.pop()

        def cls_wrapper(self, z, *args, **kwargs):
            record(z)
            inside.append(True)
            try:
                return cls_decode(self, z, *args, **kwargs)
            finally:
                inside.pop()

        watch = EmaWatch.prepare(dlcheck)
        todo = [SchedulerMixin]
        try:
            while todo:
                cls = todo.pop()
                todo.extend(cls.__subclasses__())
                if "step" in cls.__dict__:
                    patched.append((cls, cls.__dict__["step"]))
                    cls.step = wrap(cls.__dict__["step"])
            if callable(orig_decode) and (had_decode or vae_cls is None):
                object.__setattr__(vae, "decode", decode)
            if vae_cls is not None:
                vae_cls.decode = cls_wrapper
            with (
                torch.random.fork_rng(),
                torch.no_grad(),
                watch.watching(dlcheck.optional("ema")) if watch is not None else contextlib.nullcontext(None) as after,
                users_routine("dlcheck_sample_images"),
                reusing(dlcheck, dlcheck.optional("text_encoder")),
            ):
                run_sampler(dlcheck, sample, after=after)
        finally:
            for cls, orig in patched:
                cls.step = orig
            if callable(orig_decode) and had_decode:
                object.__setattr__(vae, "decode", orig_decode)
            elif callable(orig_decode) and vae_cls is None:
                vae.__dict__.pop("decode", None)
            if vae_cls is not None:
                if cls_had_decode:
                    vae_cls.decode = cls_decode
                else:
                    del vae_cls.decode
            if before is not None and getattr(pipe, "scheduler", None) is not before:
                pipe.register_modules(scheduler=before)
        return SamplingRun(used[0] if used else None, decoded, watch)

    return dlcheck.memo((sample, pipe, vae), "dlcheck.diffusion.sampling_run", make)


def sampling_scheduler(dlcheck) -> Any:
    """The scheduler instance whose ``step`` ran last while ``dlcheck_sample_images`` ran (the shared
    :func:`sampling_run`: a routine that swaps ``pipeline.scheduler`` at sampling time is read as it really
    samples); None when there is no sampling routine or no diffusers scheduler stepped."""
    run = sampling_run(dlcheck)
    return run.scheduler if run is not None else None


def swapped_scheduler(dlcheck, infer: Any) -> Any:
    """The scheduler ``dlcheck_sample_images`` really steps when it is not the pipeline's (or, without a
    pipeline, not dlcheck_inference_scheduler) and its config differs: a routine that swaps
    ``pipeline.scheduler`` at sampling time; None otherwise."""
    pipe = dlcheck.optional("pipeline")
    ref = getattr(pipe, "scheduler", None) or infer
    used = sampling_scheduler(dlcheck)
    if used is None or used is ref or used is infer or sched_config(used) == sched_config(ref):
        return None
    return used


def run_sampler(dlcheck: Any, sample: Any, after: Callable[[], None] | None = None) -> Any:
    """Call the user's ``dlcheck_sample_images`` once, leaving no trace: the weights of the UNet, the VAE and
    the text encoder, and an EMA's shadow parameters, are put back bit for bit afterwards (an EMA
    store/copy_to/restore round trip in the user's routine can move weights by float round-off)."""
    import torch

    modules = []
    for name in ("unet", "vae", "text_encoder"):
        mod = dlcheck.optional(name)
        if isinstance(mod, torch.nn.Module) and all(mod is not m for m in modules):
            modules.append(mod)
    saved = [{k: v.detach().clone() for k, v in m.state_dict(keep_vars=True).items()} for m in modules]
    ema = dlcheck.optional("ema")
    shadow = getattr(ema, "shadow_params", None) if ema is not None else None
    shadow_saved = [t.detach().clone() for t in shadow] if isinstance(shadow, list) else None
    try:
        out = dlcheck.call("sample_images", sample)
        if after is not None:  # before the weights are put back: what the routine left in them
            after()
        return out
    finally:
        with torch.no_grad():
            for mod, state in zip(modules, saved):
                current = mod.state_dict(keep_vars=True)
                for k, v in state.items():
                    if k in current and current[k].shape == v.shape:
                        current[k].data.copy_(v)
            if shadow_saved is not None:
                for t, v in zip(shadow, shadow_saved):
                    t.data.copy_(v)
