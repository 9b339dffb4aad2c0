"""DF1 and DF7: information items. They never pass: they skip with a note (what to look at, what the
training weighting is), because neither has a verdict worth shipping."""

from __future__ import annotations

from ...registry import Setting, check
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


def min_snr_form(weights, snr) -> tuple[str, float | None] | None:
    """Which Min-SNR-γ form the per-example weights follow: 'epsilon' (min(snr, γ) / snr) or
    'v_prediction' (min(snr, γ) / (snr + 1)), as diffusers' train_text_to_image.py computes them, with the
    γ read off the capped examples; None when neither fits, or both do."""
    import torch

    w, snr = weights.double().flatten(), snr.double().flatten()
    fits = {}
    for form, denom in (("epsilon", snr), ("v_prediction", snr + 1)):
        m = w * denom  # = min(snr, γ) under this form
        capped = m < snr * (1 - 1e-4)
        gamma = float(m[capped].median()) if bool(capped.any()) else None
        pred = torch.clamp(snr, max=gamma) if gamma is not None else snr
        if bool(((pred / denom - w).abs() <= 1e-3 * w.abs() + 1e-7).all()):
            fits[form] = gamma
    return next(iter(fits.items())) if len(fits) == 1 else None


@check(
    "DF7",
    domain="diffusion",
    title="training schedule never reaches pure noise (else info: the loss weighting)",
    optional_roles=("noise_scheduler", "training_inputs"),
    settings=(
        Setting(
            "max_terminal_alpha_bar",
            0.05,
            "largest ᾱ at t = T − 1 accepted: samplers start from pure noise, which the model must have seen "
            "at its last training step. SD's scaled_linear 1000-step schedule ends at 0.0047 (signal std 0.07, the "
            "known not-zero-terminal-SNR case that ships fine) and DDPM's linear 1000 at 4e-5; 0.05 (signal std "
            "0.22, 10× SD's) is where the gap stops being small, and a linear schedule of 100 steps ends at 0.36",
        ),
    ),
)
def check_timestep_weighting(dlcheck):
    """Information: the SNR range of the training schedule and the loss weighting in use.

    What it does
        Reports, as a skip note, the signal-to-noise ratio ᾱ_t / (1 − ᾱ_t) of the training scheduler at
        t = 0 and t = T − 1, and the loss weights the training step uses when dlcheck_training_inputs
        returns 'loss_weights' (else: uniform, as a plain MSE). It fails when the schedule's last ᾱ is far
        from 0 (above max_terminal_alpha_bar = 0.05), as the model then never sees the pure noise sampling
        starts from.
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
        Fails only on a schedule whose last ᾱ exceeds max_terminal_alpha_bar (0.05: a short linear schedule,
        e.g. 100 steps, ends at 0.36), or on 'loss_weights' that fit exactly the Min-SNR-γ form of the other
        prediction type (epsilon form on a v_prediction scheduler, or the reverse); otherwise it skips with
        the report by design. The weights are seen only when returned as
        'loss_weights' by dlcheck_training_inputs.
    Not applicable
        Projects that are not a diffusion training (no diffusion role: an LLM, a vision classifier, RL).
        A generator of a VQ model's discrete tokens (aMUSEd: an AmusedScheduler's mask schedule over token ids,
        no noise scheduler).
    """
    D.require_diffusion(dlcheck)
    if (discrete := D.discrete_tokens(dlcheck)) is not None:
        dlcheck.not_applicable(f"{discrete}; there is no noise schedule whose SNR or loss weighting to report")
    (sched,) = dlcheck.require("noise_scheduler")
    ac = D.alphas_cumprod(sched)
    if ac is None:
        dlcheck.skip(f"info: {D.describe(sched)} has no ᾱ_t schedule (flow matching): no SNR report")
    snr = ac / (1 - ac).clamp_min(1e-20)
    limit = dlcheck.setting("max_terminal_alpha_bar")
    cfg = D.sched_config(sched)
    if float(ac[-1]) > limit:
        dlcheck.fail(
            [
                f"{D.describe(sched)} ({cfg.get('beta_schedule')}, β {cfg.get('beta_start')}→{cfg.get('beta_end')}, "
                f"num_train_timesteps {len(ac)}) ends at ᾱ = {float(ac[-1]):.3g} at t = {len(ac) - 1}: the most "
                f"noised training input still holds {float(ac[-1]) ** 0.5:.2f} × the signal (limit ᾱ ≤ {limit:g}; SD's "
                "scaled_linear 1000-step schedule ends at 0.0047)",
            ],
            "the schedule never reaches pure noise, so the model never sees the input the sampler starts from "
            "(randn latents at t = T − 1): the first sampling steps are out of distribution and samples come out "
            "washed out or with a fixed mean brightness",
            "a schedule that ends near pure noise: num_train_timesteps=1000 with the usual betas "
            "(linear 0.0001→0.02, or scaled_linear 0.00085→0.012), or rescale_betas_zero_snr=True (then "
            "prediction_type='v_prediction' and timestep_spacing='trailing' at sampling)",
        )
    parts = [f"info: training SNR runs from {float(snr[0]):.3g} (t = 0) to {float(snr[-1]):.3g} (t = {len(ac) - 1})"]
    weights = None
    if dlcheck.has("training_inputs"):
        draws = D.training_draws(dlcheck)
        got = [d.get("loss_weights") for d in draws if d.get("loss_weights") is not None]
        if got:
            import torch

            weights = torch.cat([w.flatten().float() for w in got])
            pt = cfg.get("prediction_type", "epsilon")
            if len(got) == len(draws) and all(d.get("timesteps") is not None for d in draws):
                ts = torch.cat([D.timesteps_of(d.values) for d in draws]).long().clamp(0, len(ac) - 1)
                if len(ts) == len(weights) and pt in ("epsilon", "v_prediction"):
                    form = min_snr_form(weights, snr[ts])
                    if form is not None and form[0] != pt:
                        g = f"{form[1]:.3g}" if form[1] is not None else "γ"
                        want = "/ (snr + 1)" if pt == "v_prediction" else "/ snr"
                        dlcheck.fail(
                            [
                                f"loss_weights of dlcheck_training_inputs equal min(snr, {g}) "
                                f"{'/ snr' if form[0] == 'epsilon' else '/ (snr + 1)'} (the {form[0]!r} form of "
                                f"Min-SNR-γ) in {len(weights)} of {len(weights)} examples",
                                f"{D.describe(sched)} trains prediction_type {pt!r}",
                            ],
                            f"the Min-SNR-γ weights are in the {form[0]!r} form on a {pt!r} model: the loss on each "
                            f"timestep is weighted {'(snr + 1) / snr' if pt == 'v_prediction' else 'snr / (snr + 1)'} "
                            "times what Min-SNR intends, over-weighting the "
                            + (
                                "high-noise timesteps (small snr)"
                                if pt == "v_prediction"
                                else "low-noise timesteps (large snr)"
                            ),
                            f"mse_loss_weights = torch.stack([snr, snr_gamma * torch.ones_like(timesteps)], dim=1)"
                            f".min(dim=1)[0] {want} for prediction_type {pt!r} (diffusers' train_text_to_image.py "
                            "branches on noise_scheduler.config.prediction_type)",
                        )
                    if form is not None:
                        parts.append(f"loss_weights follow the {form[0]!r} form of Min-SNR-γ, as {pt!r} needs")
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
