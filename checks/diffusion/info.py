"""DF1 and DF7: information items. They never pass: they skip with a note (what to look at, what the
training weighting is), because neither has a verdict worth shipping."""

from __future__ import annotations

from ...registry import check
from . import measure as D


@check("DF1", domain="diffusion", title="low loss, bad samples (info: points to DF2–DF8)")
def check_low_loss_bad_samples(dlcheck):
    """Information: where to look when the loss is low and the samples are bad.

    What it does
        Nothing is measured; the item always skips with a note listing the checks that cover the usual
        causes, so that ``pytest --dlcheck=diffusion -rs`` shows it.
    Why it is bad
        A diffusion loss is a per-timestep denoising error: it can be low while sampling fails, because
        the sampler uses other weights (DF2), another latent scale (DF3), another noise process or
        objective (DF4, DF6), guidance without an unconditional model (DF5), or the model was trained
        on a few noise levels only (DF8).
    Example
        loss 0.05 after 10k steps, samples grey or saturated.
    Use instead
        Run pytest --dlcheck=diffusion with dlcheck_pipeline, dlcheck_noise_scheduler,
        dlcheck_training_inputs, dlcheck_ema and dlcheck_sample_images defined.
    Known problems
        Not a test: it skips by design.
    Not applicable
        An information item for diffusion training, not a verdict: it says so under any selection that
        includes it; pipelines that are not diffusion trainings (no diffusion role given).
    """
    D.require_diffusion(dlcheck)
    dlcheck.skip(
        "info: DF1 is not a test; low loss with bad samples is usually EMA unused (DF2), latent scale (DF3), "
        "train/inference schedulers (DF4, DF6), no conditioning dropout (DF5) or noising (DF8)"
    )


@check(
    "DF7",
    domain="diffusion",
    title="uniform timestep weighting (info: reports the loss weighting)",
    optional_roles=("noise_scheduler", "training_inputs"),
)
def check_timestep_weighting(dlcheck):
    """Information: the SNR range of the training schedule and the loss weighting in use.

    What it does
        Reports, as a skip note, the signal-to-noise ratio ᾱ_t / (1 − ᾱ_t) of the training scheduler at
        t = 0 and t = T − 1, and the loss weights the training step uses when dlcheck_training_inputs
        returns 'loss_weights' (else: uniform, as a plain MSE). It never fails.
    Why it is bad
        With uniform weighting, low-noise timesteps (huge SNR) dominate the gradient while contributing
        little to sample quality; Min-SNR-γ weighting (Hang et al. 2023; snr_gamma=5.0 in diffusers'
        training scripts) converges markedly faster. It is a speed question, not a bug.
    Example
        loss = F.mse_loss(model_pred, target)                   # every timestep weighted alike
    Use instead
        snr = compute_snr(noise_scheduler, timesteps)            # diffusers.training_utils
        w = torch.stack([snr, 5.0 * torch.ones_like(snr)], 1).min(1)[0] / snr   # epsilon; / (snr + 1) for v
        loss = (F.mse_loss(model_pred, target, reduction="none").mean([1, 2, 3]) * w).mean()
    Known problems
        Not a test: it skips with the report by design. The weights are seen only when returned as
        'loss_weights' by dlcheck_training_inputs.
    Not applicable
        Projects that are not a diffusion training (no diffusion role: an LLM, a vision classifier, RL).
    """
    D.require_diffusion(dlcheck)
    (sched,) = dlcheck.require("noise_scheduler")
    ac = D.alphas_cumprod(sched)
    if ac is None:
        dlcheck.skip(f"info: {D.describe(sched)} has no ᾱ_t schedule (flow matching): no SNR report")
    snr = ac / (1 - ac).clamp_min(1e-20)
    parts = [f"info: training SNR runs from {float(snr[0]):.3g} (t = 0) to {float(snr[-1]):.3g} (t = {len(ac) - 1})"]
    weights = None
    if dlcheck.has("training_inputs"):
        draws = D.training_draws(dlcheck)
        got = [d.get("loss_weights") for d in draws if d.get("loss_weights") is not None]
        if got:
            import torch

            weights = torch.cat([w.flatten().float() for w in got])
    if weights is not None:
        parts.append(
            f"loss_weights from dlcheck_training_inputs range over [{float(weights.min()):.3g}, "
            f"{float(weights.max()):.3g}]"
        )
    else:
        parts.append(
            "loss weighting: uniform over timesteps (no 'loss_weights' in dlcheck_training_inputs); "
            "Min-SNR-γ (snr_gamma=5) trains faster"
        )
    dlcheck.skip("; ".join(parts))
