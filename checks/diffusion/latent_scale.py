"""DF3: the VAE latent scale the training path really produces."""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

from ...guard import eval_mode
from ...registry import Setting, check
from ...sampling import get_sample
from ..shared.reuse import reusing
from . import measure as D

SD1_FACTOR = 0.18215


def _raw_latents(dlcheck, vae, images):
    """The VAE's own latents (a posterior sample, as training scripts draw them) for the sampled images."""
    import torch

    device, dtype = D.module_device_dtype(vae)
    out = []
    # the same images the training draws encoded: the VAE's encoder ran on them already (reusing)
    with eval_mode(vae), torch.no_grad(), reusing(dlcheck, vae):
        for start in range(0, images.shape[0], dlcheck.batch_size):
            chunk = images[start : start + dlcheck.batch_size].to(device, dtype)
            enc = dlcheck.call("vae", lambda chunk=chunk: vae.encode(chunk))
            dist = getattr(enc, "latent_dist", None)
            z = dist.sample() if dist is not None else (enc.latents if hasattr(enc, "latents") else enc[0])
            out.append(z.detach().float().cpu())
    return torch.cat(out)


def sf_name_plain(sf: float) -> str:
    return f"vae.config.scaling_factor ({sf:g})"


def decode_observed(dlcheck, vae) -> tuple[float, str, str | None] | None:
    """(a, who) with ``decode input ≈ a · the last latents a scheduler step produced`` (least squares), from
    the one run of dlcheck_sample_images that DF3, DF4 and DF6 share (``D.sampling_run``, which wraps every
    scheduler class's ``step`` and the decode of this VAE's class for the call: a pipeline loaded beside the
    training decodes with its own copy); ``who`` names the caller of decode (the diffusers pipeline class
    whose code called it, or dlcheck_sample_images itself) and ``by`` that class name (None: the user's own
    code called decode). None when either was not seen."""
    run = D.sampling_run(dlcheck)
    if run is None or dlcheck.optional("vae") is not vae:
        return None
    pairs = [(z, x, by) for z, x, by in run.decoded if x is not None and z.shape == x.shape]
    if not pairs:
        return None
    z, x, by = pairs[-1]
    denom = float((x.double() * x.double()).sum())
    if denom == 0:
        return None
    name = type(vae).__name__
    who = (
        f"{by} (called by dlcheck_sample_images) passes {name}.decode"
        if by
        else "dlcheck_sample_images passes vae.decode"
    )
    return float((z.double() * x.double()).sum()) / denom, who, by


def _latent_picture(dlcheck, raw: Any, draws: Any) -> None:
    """The report's picture: the values of the raw VAE latents and of the latents the training trains on,
    against the unit std a diffusion model expects (±1 marked)."""
    series = {}
    if raw is not None:
        series["raw VAE latents"] = raw.detach().double().flatten()[:4000].cpu().tolist()
    if draws is not None:
        series["trained-on latents"] = D.cat(draws, "latents").detach().double().flatten()[:4000].cpu().tolist()
    if series:
        dlcheck.attach(
            "histogram",
            title="DF3: latent values (a unit-std model input lies mostly within ±1)",
            series=series,
            bins=40,
            marks=[{"x": -1.0, "label": "±1 (std 1)"}, {"x": 1.0}],
            caption="values of the latents the VAE gives and the training uses",
        )


def _vector_quantized(vae) -> bool:
    """A VQ autoencoder (a ``quantize`` codebook): the pipelines built on one differ on the decode side (one
    divides the denoiser's latents by config.scaling_factor, another decodes them as they are)."""
    return getattr(vae, "quantize", None) is not None


def _judge_decode_side(dlcheck, vae, sf, r, rtol, sf_name, raw_line, train_std, raw_std, implied):
    """What the sampling side does with the denoiser's latents, against what the training step applies:
    (lines for the pass, done). Fails when the two disagree, passes (done) when they agree on a scale other
    than config.scaling_factor's, and leaves the rest (the sampler divides by the config factor, or was not
    seen) to the config-based judgement. A VQ autoencoder whose sampler was not seen is not judged."""
    seen = decode_observed(dlcheck, vae) if abs(sf - 1) > rtol else None
    if seen is None:
        if _vector_quantized(vae) and abs(sf - 1) > rtol:
            stds = "; ".join(
                x
                for x in (
                    raw_line,
                    f"latents from dlcheck_training_inputs: std {D.fmt(train_std)}" if train_std is not None else "",
                )
                if x
            )
            dlcheck.skip(
                "missing role: define fixture dlcheck_sample_images (the routine that samples with your pipeline "
                f"and decodes) in conftest.py: {D.describe(vae)} is a vector-quantized autoencoder, and DF3 cannot "
                f"tell whether the sampler divides by vae.config.scaling_factor ({sf:g}) before decoding (one "
                "pipeline of such models divides, another decodes the denoiser's latents as they are), so the "
                f"training's scale is not judged against it ({stds})"
            )
        return [], False
    a, who, by = seen
    seen_line = f"{who} {a:.3g} × the final latents of the sampling loop (measured on the last scheduler step's output)"
    if abs(a * sf - 1) <= rtol:  # divides by the config's factor: judged against it below
        return [f"{who} {a:.3g} × the final latents = 1 / scaling_factor ({1 / sf:.3g}, rtol {rtol:g})"], False
    as_is = abs(a - 1) <= rtol
    own_sampler_undivided = (
        by is None and as_is and (implied is None or (abs(implied - sf) <= rtol * sf and abs(sf - 1) > rtol))
    )
    if own_sampler_undivided:  # the user's own routine forgets the division the training's factor needs
        dlcheck.fail(
            [
                f"dlcheck_sample_images passes vae.decode {a:.3g} × the final latents of the sampling loop "
                f"(measured on the last scheduler step's output), not 1 / scaling_factor = {1 / sf:.3g}",
                *(
                    [f"the training path scales the VAE latents by {implied:.3g} ({sf_name})"]
                    if implied is not None
                    else []
                ),
            ],
            f"the sampling routine decodes the denoiser's latents without dividing by {sf_name_plain(sf)}, "
            f"so the decoder sees latents {1 / sf:.3g}× too small and the samples come out washed out (grey, "
            "low contrast), whatever the training",
            "image = vae.decode(latents / vae.config.scaling_factor).sample (add vae.config.shift_factor after "
            "dividing when it is set), as the diffusers pipelines do",
        )
    if implied is None:
        if as_is:
            dlcheck.skip(
                "missing role: define fixture dlcheck_training_inputs (returning 'latents') in conftest.py: "
                f"{seen_line}, not divided by vae.config.scaling_factor ({sf:g}); DF3 needs the latents the "
                "training step produces to tell whether it trains on that scale"
            )
        return [], False
    train_line = (
        f"the training path scales the VAE latents by {implied:.3g} (std {D.fmt(train_std)} over {D.fmt(raw_std)} raw)"
    )
    if abs(implied * a - 1) > rtol:
        sampler = by or "the sampling routine"
        dlcheck.fail(
            [train_line, seen_line],
            f"the denoiser is trained on the VAE's latents × {implied:.3g}, but {sampler} hands the decoder "
            f"{a:.3g} × the latents it samples, so the decoder receives {implied * a:.3g}× "
            "the VAE's own latent scale, and the samples come out washed out or saturated",
            (
                f"drop the factor: train on the VAE's latents as they are (its encode output, no "
                f"vae.config.scaling_factor), the scale {by} decodes"
                if by and as_is
                else f"scale the training latents by {1 / a:.4g}, the inverse of what {by} multiplies them by "
                "before decoding"
                if by
                else "make the two agree: divide the sampled latents by the factor the training multiplies by "
                "before decoding"
            ),
        )
    agree = f"{train_line}: train and sample agree (the sampler undoes {implied:.3g})"
    if as_is:
        agree = f"the training path scales the VAE latents by {implied:.3g}: train and sample agree ({seen_line})"
    within = 1 / r <= train_std <= r
    if within or (by and as_is):  # as_is: the pipeline class decodes raw latents, the scale is the autoencoder's own
        dlcheck.measured(
            agree,
            f"latents from dlcheck_training_inputs: std {D.fmt(train_std)}"
            + (f", within [{1 / r:.3g}, {r:g}]" if within else ""),
            *([raw_line] if raw_line else []),
            f"vae.config.scaling_factor ({sf:g}) is used by neither side",
            train_std=round(train_std, 4),
            raw_std=round(raw_std, 4),
            factor=round(implied, 5),
            decode_factor=round(a, 5),
            scaling_factor=sf,
        )
        if not within:
            dlcheck.not_judged(
                "unit variance",
                f"{by} decodes the denoiser's latents as they are, with no scaling factor to calibrate: their scale "
                f"is the autoencoder's own, which a denoiser pretrained on it keeps, so their std "
                f"{D.fmt(train_std)} is not judged against unit variance (within [{1 / r:.3g}, {r:g}])",
            )
        return [], True
    dlcheck.fail(
        [agree, f"latents from dlcheck_training_inputs: std {D.fmt(train_std)}, outside [{1 / r:.3g}, {r:g}]"],
        "train and sample agree on a scale that does not bring the latents to unit variance, which the noise "
        "schedule assumes",
        f"calibrate one factor for this VAE, 1 / std of its latents = {1 / raw_std:.4g}: multiply the training "
        "latents by it and divide the sampled latents by it before decoding",
    )


@check(
    "DF3",
    domain="diffusion",
    title="VAE latent scale is wrong",
    optional_roles=("vae", "training_inputs"),
    settings=(
        Setting(
            "max_std_ratio",
            2.0,
            "the latents the denoiser trains on may have a std between 1/r and r. A "
            "calibrated factor gives std ≈ 1 on the images it was computed on (SD 1.x's 0.18215 gives 0.8–1.2 on "
            "natural images); a factor of 2 leaves room for unusual data, and still catches the real bugs, which "
            "are off by ×5 (factor omitted on SD's VAE: std ≈ 5.5; SD's 0.18215 on a VAE with unit latents: 0.18)",
        ),
        Setting(
            "factor_rtol",
            0.25,
            "relative gap allowed between the factor the training path applies (measured "
            "as std(training latents) / std(VAE latents) on the same images) and vae.config.scaling_factor, which "
            "the pipeline divides by when decoding; sampling noise of the two stds is a few percent, SDXL's 0.13025 "
            "against SD's 0.18215 is 40%",
        ),
    ),
)
def check_latent_scale(dlcheck):
    """The latents the denoiser is trained on have std near 1, scaled by the factor the decoder undoes.

    What it does
        Encodes the sampled training images (the batch's pixel_values) with the VAE and measures the std
        of its latents, raw and multiplied by ``vae.config.scaling_factor`` (shift_factor subtracted).
        When ``dlcheck_training_inputs`` is given it measures the std of the 'latents' the training step
        really produces on the same batches, and the factor it applied (their std over the raw std).
        Fails when the trained-on latents have a std outside [1/r, r] (r = max_std_ratio), naming the
        cause (factor omitted, a factor calibrated for another VAE, or another factor), or when the
        training factor differs from the one the sampling side undoes. The sampling side is read from
        dlcheck_sample_images when given: what reaches the decode of the VAE's class (the pipeline's own
        copy included) is compared with the last scheduler step's output, so a pipeline that decodes the
        latents as they are (a VQModel decoded with no division) is held to a training on raw latents,
        and one that divides by scaling_factor to a training that multiplies by it.
    Why it is bad
        The noise schedule assumes data of unit variance: latents of std 5.5 (SD's VAE without its
        0.18215) keep a visible signal at t = 999, so sampling from pure noise starts off-distribution;
        latents of std 0.2 (SD's factor on a VAE whose latents already have unit std) are drowned after a
        few hundred steps and the model learns mostly noise. Either way the loss looks fine and the
        samples are washed out or saturated. A training factor that differs from the config's makes the
        pipeline decode latents at the wrong scale.
    Example
        latents = vae.encode(pixel_values).latent_dist.sample()            # scaling_factor never applied
        vae = AutoencoderKL(...)                                             # own VAE, default factor 0.18215 kept
        latents = vae.encode(px).latent_dist.sample() * 0.18215             # hard-coded, config says otherwise
    Use instead
        latents = (vae.encode(px).latent_dist.sample() - (vae.config.shift_factor or 0)) * vae.config.scaling_factor,
        and for a VAE of your own compute the factor once as 1 / latents.std() over a few hundred training
        images and store it: AutoencoderKL(..., scaling_factor=f) or vae.register_to_config(scaling_factor=f).
    Known problems
        Measured on the sampled batches only (dlcheck_samples images). A denoiser pretrained on a VAE
        must keep the factor it was trained with even when your data's latent std differs; the band is
        wide for that reason. Needs pixel images in the batches (skips with precomputed latents unless
        dlcheck_training_inputs is given). The decode side is read from vae.config (what diffusers
        pipelines use) when dlcheck_sample_images is not given; when it is, it is run once and what reaches
        decode is compared with the last scheduler step's output: a sampler that decodes without dividing
        fails when the training multiplies by the factor, and a diffusers pipeline that decodes the raw
        latents by design (its code calls decode unscaled) with a training on raw latents passes, the std
        of those latents then not judged against unit variance (their scale is the autoencoder's own). A
        vector-quantized autoencoder (VQModel) without dlcheck_sample_images is not judged (missing role):
        its pipelines differ (one divides by scaling_factor, another decodes as is). The VAE's
        latents are drawn as training scripts draw them (latent_dist.sample()); a training path using
        .mode() on a VAE with a wide posterior (a freshly initialised one) is measured at another scale.
    Not applicable
        Pixel-space diffusion (DDPMPipeline, a UNet2DModel with in_channels=3, a training step whose
        'latents' are 3-channel images — dlcheck_training_inputs is handed the loader's batches as it yields
        them, a bare image tensor included): there is no VAE and no latent scale. Projects that are not a
        diffusion training. A generator of a VQ model's discrete tokens (aMUSEd: an AmusedScheduler's mask
        schedule over token ids): its codes have no latent scale.
    """
    import torch

    D.require_diffusion(dlcheck)
    if (discrete := D.discrete_tokens(dlcheck)) is not None:
        dlcheck.not_applicable(f"{discrete}; its autoencoder's codes are token ids, not latents with a scale to check")
    if not dlcheck.has("vae"):
        vectors = D.vector_space(dlcheck)
        if vectors is not None:
            dlcheck.not_applicable(f"{vectors}; there is no VAE, so no latent scale to check")
        pixels = D.pixel_space(dlcheck)
        if pixels is not None:
            dlcheck.not_applicable(f"{pixels}; there is no VAE, so no latent scale to check")
    (vae,) = dlcheck.require("vae")
    config = D.sched_config(vae)
    sf = config.get("scaling_factor")
    shift = config.get("shift_factor") or 0.0
    r = dlcheck.setting("max_std_ratio")
    rtol = dlcheck.setting("factor_rtol")
    has_train = dlcheck.has("training_inputs")

    sample = get_sample(dlcheck, as_yielded=True)  # a loader's bare image tensors are the images
    channels = config.get("in_channels")
    found = [D.pixel_values(b, channels) for b in sample.batches]
    images = torch.cat([f[1] for f in found]) if found and all(found) else None
    raw_std = None
    if images is not None:
        raw = _raw_latents(dlcheck, vae, images)
        raw_std = D.std(raw - shift)
    train_std = None
    if has_train:
        draws = D.training_draws(dlcheck)
        if all(d.get("latents") is not None for d in draws):
            train_std = D.std(D.cat(draws, "latents"))
    _latent_picture(dlcheck, raw - shift if raw_std is not None else None, draws if train_std is not None else None)
    if raw_std is None and train_std is None:
        first = sample.batches[0] if sample.batches else None
        keys = ", ".join(map(str, first)) if isinstance(first, Mapping) else "none" if first is None else "no fields"
        if not has_train:
            dlcheck.skip(
                "missing role: define fixture dlcheck_training_inputs (returning 'latents') in conftest.py: the "
                f"batches of {sample.source} carry no pixel images (keys: {keys}) for DF3 to encode"
            )
        dlcheck.skip(
            f"no pixel images in the batches of {sample.source} (keys: {keys}) and no 'latents' from "
            "dlcheck_training_inputs: add 'latents' to its dict so DF3 sees the latents the training step produces"
        )
    if sf is None:
        dlcheck.skip(f"{D.describe(vae)} has no config.scaling_factor")

    def in_band(s: float) -> bool:
        return 1 / r <= s <= r

    sf_name = f"vae.config.scaling_factor = {sf:g}" + (
        " (Stable Diffusion 1.x's value, calibrated for its VAE)" if math.isclose(sf, SD1_FACTOR, rel_tol=1e-4) else ""
    )
    n_img = images.shape[0] if images is not None else 0
    raw_line = (
        (
            f"{D.describe(vae)} latents of {n_img} sampled images ({sample.source}): std {D.fmt(raw_std)} raw, "
            f"{D.fmt(raw_std * sf)} × scaling_factor {sf:g}"
        )
        if raw_std is not None
        else None
    )
    calibrated = f"{1 / raw_std:.4g}" if raw_std else "1 / latents.std()"
    fix_factor = (
        f"calibrate the factor for this VAE: scaling_factor = 1 / std of its latents = {calibrated} "
        f"(AutoencoderKL(..., scaling_factor={calibrated}) or vae.register_to_config(scaling_factor={calibrated})); "
        "keep the original factor only for a denoiser pretrained with it on this VAE"
    )

    implied = train_std / raw_std if train_std is not None and raw_std else None
    decode_lines, done = _judge_decode_side(dlcheck, vae, sf, r, rtol, sf_name, raw_line, train_std, raw_std, implied)
    if done:
        return

    if train_std is not None:
        train_line = f"latents from dlcheck_training_inputs: std {D.fmt(train_std)} (wanted about 1, within [{1 / r:.3g}, {r:g}])"
        if not in_band(train_std):
            evidence = [train_line] + ([raw_line] if raw_line else [])
            if implied is not None and abs(implied - 1) <= rtol and abs(sf - 1) > rtol:
                evidence.append(
                    f"the training path scales the VAE latents by {implied:.3g}: {sf_name} is never applied"
                )
                dlcheck.fail(
                    evidence,
                    "the training step feeds the VAE's raw latents to the denoiser; the scaling factor "
                    "that brings them to unit variance (and that the pipeline divides by when decoding) is "
                    "never applied",
                    "latents = vae.encode(pixel_values).latent_dist.sample() * vae.config.scaling_factor "
                    "(subtract vae.config.shift_factor first when it is set)",
                )
            if implied is not None and abs(implied - sf) <= rtol * sf:
                evidence.append(
                    f"the training path applies {sf_name}, which does not fit this VAE: "
                    f"its latents have std {D.fmt(raw_std)}, not {1 / sf:.3g}"
                )
                dlcheck.fail(
                    evidence,
                    f"the scaling factor {sf:g} was calibrated for another VAE; on this one it gives "
                    f"latents of std {D.fmt(train_std)}, far from the unit variance the noise schedule assumes",
                    fix_factor,
                )
            if implied is not None:
                evidence.append(f"the training path scales the VAE latents by {implied:.3g}, neither 1 nor {sf_name}")
            dlcheck.fail(
                evidence,
                "the training step scales the latents by a factor that does not bring them to unit variance",
                "latents = vae.encode(pixel_values).latent_dist.sample() * vae.config.scaling_factor, "
                "with a scaling_factor calibrated for this VAE (1 / std of its latents)",
            )
        if implied is None or abs(implied - sf) <= rtol * sf:
            dlcheck.measured(
                f"latents from dlcheck_training_inputs: std {D.fmt(train_std)}, within [{1 / r:.3g}, {r:g}]"
                + (
                    f"; the training path scales the VAE latents by {implied:.3g}, vae.config.scaling_factor = "
                    f"{sf:g} (rtol {rtol:g})"
                    if implied is not None
                    else "; no pixel images in the batches to measure the factor applied"
                ),
                *([raw_line] if raw_line else []),
                *decode_lines,
                train_std=round(train_std, 4),
                raw_std=round(raw_std, 4) if raw_std is not None else None,
                factor=round(implied, 5) if implied is not None else None,
                scaling_factor=sf,
            )
            return
        dlcheck.fail(
            [
                train_line,
                raw_line,
                f"the training path scales the VAE latents by {implied:.3g}, but {sf_name}: the pipeline "
                f"decodes latents / {sf:g}, so decoded samples are off by ×{implied / sf:.3g}",
            ],
            "the training step applies a factor of its own (hard-coded) instead of vae.config.scaling_factor, "
            "so encode and decode disagree",
            f"use vae.config.scaling_factor in the training step (latents * vae.config.scaling_factor), "
            f"or, if {implied:.4g} is the factor you mean, store it where the pipeline reads it: "
            f"vae.register_to_config(scaling_factor={implied:.4g})",
        )
    if not in_band(raw_std * sf):
        dlcheck.fail(
            [
                raw_line,
                f"{sf_name} gives latents of std {D.fmt(raw_std * sf)}, outside [{1 / r:.3g}, {r:g}]",
                "(the training path was not observed: define dlcheck_training_inputs to measure it)",
            ],
            f"the scaling factor {sf:g} does not fit this VAE's latents, so the denoiser would be trained on "
            f"latents of std {D.fmt(raw_std * sf)} instead of about 1",
            fix_factor,
        )
    dlcheck.measured(
        f"{sf_name} gives latents of std {D.fmt(raw_std * sf)}, within [{1 / r:.3g}, {r:g}]",
        raw_line,
        "the training path was not observed (define dlcheck_training_inputs to measure the factor it applies)",
        *decode_lines,
        raw_std=round(raw_std, 4),
        scaled_std=round(raw_std * sf, 4),
        scaling_factor=sf,
    )
