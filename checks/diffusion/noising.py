"""DF8: timesteps or noise drawn wrongly in the training step."""

from __future__ import annotations

from ...registry import Setting, check
from . import measure as D


def _fit(noisy, x0, noise):
    """Least-squares (a, b) with noisy ≈ a·x0 + b·noise, per example."""
    import torch

    n = noisy.shape[0]
    X = torch.stack([x0.reshape(n, -1), noise.reshape(n, -1)], dim=2).double()  # (n, D, 2)
    y = noisy.reshape(n, -1, 1).double()
    sol = torch.linalg.lstsq(X, y).solution.squeeze(-1)  # (n, 2)
    return sol[:, 0], sol[:, 1]


def _add_noise_coefficients(sched, ts):
    """(a_t, b_t) that the scheduler's own ``add_noise`` computes at these timesteps, measured on a fresh
    copy with unit inputs (so Euler's variance-exploding x + σ·noise is reported as it is); the ᾱ_t
    formula when the copy cannot be built or called."""
    import torch

    try:
        fresh = D.fresh_scheduler(sched)
        t = ts.to("cpu").long()
        one, zero = torch.ones(len(t), 1, dtype=torch.float64), torch.zeros(len(t), 1, dtype=torch.float64)
        a = fresh.add_noise(one, zero, t).flatten().double()
        b = fresh.add_noise(zero, one, t).flatten().double()
        if a.shape == b.shape == t.shape and bool(torch.isfinite(a).all() and torch.isfinite(b).all()):
            return a, b
    except Exception:  # noqa: BLE001 - an exotic add_noise: fall back to the ᾱ_t formula
        pass
    coef = D.noising_coefficients(sched, ts)
    return None if coef is None else (coef[0].double(), coef[1].double())


def _variance_exploding(sched, ts, a, b, atol):
    """(example, σ_t) of the most telling example when every fit is noisy = 1·x0 + σ_t·noise with
    σ_t = sqrt((1 − ᾱ_t)/ᾱ_t) (the Euler/k-diffusion form) and at least one example is far from the
    variance-preserving form; None otherwise."""
    import torch

    ac = D.alphas_cumprod(sched)
    if ac is None:
        return None
    t = ts.to("cpu").long().clamp(0, len(ac) - 1)
    abar = ac[t].double()
    sigma = ((1 - abar) / abar).sqrt()
    if not bool(torch.all((a - 1).abs() <= atol)) or not bool(
        torch.all((b - sigma).abs() <= atol * sigma.clamp(min=1))
    ):
        return None
    vp_gap = torch.maximum((a - abar.sqrt()).abs(), (b - (1 - abar).sqrt()).abs())
    if float(vp_gap.max()) <= atol:
        return None
    i = int(vp_gap.argmax())
    return i, float(sigma[i])


@check(
    "DF8",
    domain="diffusion",
    title="timesteps or noise drawn wrongly",
    optional_roles=("training_inputs", "noise_scheduler"),
    settings=(
        Setting(
            "timestep_draws",
            64,
            "training timesteps drawn (dlcheck_training_inputs is called until it has "
            "produced this many); 64 draws put the DKW bound at 0.34, enough to see a fixed timestep, a range cut "
            "to a tenth or a half, or continuous times in [0, 1) fed to a 1000-step scheduler",
        ),
        Setting(
            "require_uniform",
            True,
            "test the timesteps against the uniform law on [0, T); set false when you "
            "bias the timestep draw on purpose (timestep_bias_strategy, importance sampling): only a fixed or "
            "out-of-range timestep is then reported",
        ),
        Setting(
            "false_alarm",
            1e-6,
            "probability that uniform timesteps fail the DKW test (the bound holds for "
            "any law, discrete ones included)",
        ),
        Setting(
            "noise_std_tol",
            0.1,
            "allowed |std(noise) − 1|: randn noise over a few thousand values is within "
            "0.03; offset noise 0.1 gives 1.005; a scaled noise (× 0.1, × 2) is far out",
        ),
        Setting(
            "coef_atol",
            0.05,
            "allowed gap between the per-example fit noisy ≈ a·x0 + b·noise and the noise "
            "scheduler's (sqrt(ᾱ_t), sqrt(1 − ᾱ_t)); input perturbation 0.1 moves b by < 0.01, another beta "
            "schedule moves a or b by 0.1–0.3",
        ),
    ),
)
def check_noising(dlcheck):
    """The training step draws t uniformly over [0, T), unit Gaussian noise, and noises with add_noise.

    What it does
        Calls ``dlcheck_training_inputs`` on the sampled batches until it has drawn ``timestep_draws``
        timesteps, then checks: every timestep lies in [0, num_train_timesteps); they are not all equal;
        their empirical CDF is within the DKW bound of the uniform law (false alarm ≤ 1e-6; when a call
        shares one timestep across its batch, calls are counted, not examples); the noise has mean 0 and
        std 1; and each example's noisy latents equal a·latents + b·noise with the noise scheduler's own
        coefficients (sqrt(ᾱ_t), sqrt(1 − ᾱ_t)), fitted by least squares, i.e. they come from the same
        scheduler's ``add_noise``. The expected coefficients are measured by calling ``add_noise`` of a
        fresh copy of the scheduler; when that ``add_noise`` is variance-exploding (EulerDiscreteScheduler:
        x0 + σ_t·noise, σ_t = sqrt((1 − ᾱ_t)/ᾱ_t)), training is held to the variance-preserving form of
        the same ᾱ_t, and noisy latents that fit 1·x0 + σ_t·noise are named variance-exploding.
    Why it is bad
        A fixed or narrow timestep range trains the denoiser on a few noise levels only: the loss falls,
        and sampling, which walks through all of them, produces mush. Scaled noise, or noisy latents from
        another schedule (another scheduler object, a hand-written formula, continuous times in [0, 1))
        train the model on a noise process the sampler does not invert. Euler's ``add_noise`` is meant
        for k-diffusion sampling, where ``scale_model_input`` divides by sqrt(σ² + 1): used for training
        without that division, the denoiser sees noise of std up to ~15 it never meets when sampling.
    Example
        timesteps = torch.full((bsz,), 500)                                 # fixed timestep
        timesteps = torch.randint(0, 50, (bsz,))                            # num_inference_steps, not T
        noise = torch.randn_like(latents) * 0.1                            # scaled noise
        noisy = other_scheduler.add_noise(latents, noise, timesteps)        # another beta schedule
        noisy = EulerDiscreteScheduler.from_config(cfg).add_noise(latents, noise, timesteps)  # x0 + σ·noise
    Use instead
        noise = torch.randn_like(latents)
        timesteps = torch.randint(0, noise_scheduler.config.num_train_timesteps, (bsz,), device=latents.device)
        noisy_latents = noise_scheduler.add_noise(latents, noise, timesteps)
    Known problems
        Needs 'latents', 'noise', 'timesteps' and 'noisy_latents' in the dict of dlcheck_training_inputs.
        Schedulers without ᾱ_t (flow matching, which draws sigmas, often logit-normal on purpose) are
        covered only in part: the timesteps must lie in [0, T] and not all be equal; the uniform test and
        the noising fit are skipped. Deliberately biased timestep
        sampling that still draws over more than half of [0, T) (a cubic or SNR-weighted schedule) is reported,
        not failed; one confined to a narrower range fails the uniform test: set DF8.require_uniform=false when
        that is intended. A k-diffusion-style training that
        returns the Euler-noised latents before dividing them by sqrt(σ² + 1) fails the variance-exploding
        test: return the divided model input as 'noisy_latents'.
    Not applicable
        Projects that are not a diffusion training (no diffusion role: an LLM, a vision classifier, RL).
        A generator of a VQ model's discrete tokens (aMUSEd: an AmusedScheduler's mask schedule over token ids,
        no noise scheduler).
    """
    import torch

    D.require_diffusion(dlcheck)
    if (discrete := D.discrete_tokens(dlcheck)) is not None:
        dlcheck.not_applicable(f"{discrete}; there are no timesteps or noise of a noise scheduler to check")
    _, sched = dlcheck.require("training_inputs", "noise_scheduler")
    config = D.sched_config(sched)
    T = config.get("num_train_timesteps")
    if T is None:
        dlcheck.skip(f"{D.describe(sched)} has no config.num_train_timesteps")
    n_want = dlcheck.setting("timestep_draws")
    draws = D.training_draws(dlcheck, n_want)
    D.require_keys(dlcheck, draws, "timesteps", "noise")

    findings: list[tuple[list[str], str, str]] = []

    # ---- timesteps --------------------------------------------------------------------------------
    per_call = [D.timesteps_of(d.values) for d in draws]
    ts = torch.cat(per_call)
    as_float = ts.double()
    integral = bool(torch.all(as_float == as_float.round()))
    lo, hi = float(as_float.min()), float(as_float.max())
    shown = ", ".join(str(int(v)) if integral else f"{float(v):.3g}" for v in ts[:8])
    where = f"{len(ts)} timesteps from {len(draws)} calls of dlcheck_training_inputs"
    randint = f"torch.randint(0, noise_scheduler.config.num_train_timesteps, (bsz,))  (T = {T})"
    top = T - 1 if D.alphas_cumprod(sched) is not None else T  # flow matching draws t = 1000·σ, σ ∈ [0, 1]
    if lo < 0 or hi > top:
        findings.append(
            (
                [f"{where} range over [{lo:g}, {hi:g}], outside the scheduler's [0, {top}] (first: {shown})"],
                f"timesteps outside [0, {T}) index past the noise schedule of {D.describe(sched)}",
                f"timesteps = {randint}",
            )
        )
    elif len(torch.unique(ts)) == 1:
        findings.append(
            (
                [f"{where}: all equal {shown.split(',')[0]}"],
                "the timestep is fixed, so the denoiser only ever learns one noise level",
                f"timesteps = {randint}",
            )
        )
    ok: list[str] = []  # what a pass measured
    uniform_line = (
        "not tested against the uniform law (DF8.require_uniform=false)"
        if not dlcheck.setting("require_uniform")
        else "not tested against the uniform law: the scheduler has no ᾱ_t (flow matching)"
    )
    if dlcheck.setting("require_uniform") and D.alphas_cumprod(sched) is not None and not findings:
        shared = all(len(torch.unique(t)) == 1 for t in per_call) and max(len(t) for t in per_call) > 1
        values = [int(round(float(t[0]))) for t in per_call] if shared else [int(round(float(v))) for v in ts]
        alpha = dlcheck.setting("false_alarm")
        gap, at = D.uniform_cdf_gap(values, T)
        eps = D.dkw_epsilon(len(values), alpha)
        uniform_line = (
            f"empirical CDF within {gap:.2f} of uniform on [0, {T}) (DKW bound {eps:.2f} for {len(values)} "
            f"{'calls' if shared else 'draws'}, false alarm ≤ {alpha:g})"
        )
        # a density over the whole range draws from both of its ends; a narrowed range (randint(0, 50), [0, T/2))
        # spans half of it or less
        spans = integral and max(values) - min(values) >= 0.55 * T
        if integral and gap > eps and spans:
            # every noise level is drawn, with a density of the training's choice (the T2I-Adapter's cubic schedule,
            # an SNR-weighted draw): not the narrowed range or the wrong unit this test is for (blind set 11)
            uniform_line = (
                f"not uniform on [0, {T}) (empirical CDF {gap:.2f} from uniform at t = {at}, above the DKW bound "
                f"{eps:.2f}), but spanning [{min(values)}, {max(values)}]: a weighting that draws every noise level "
                "(a cubic or SNR-weighted schedule) is not failed; a narrowed range is"
            )
        if not integral or (gap > eps and not spans):
            unit = f"{len(values)} calls (one timestep per batch)" if shared else f"{len(values)} draws"
            findings.append(
                (
                    [
                        f"{where} lie in [{lo:.4g}, {hi:.4g}] ({len(torch.unique(ts))} distinct; first: {shown}), "
                        f"{'not integers, ' if not integral else ''}for a scheduler of T = {T} steps",
                        f"empirical CDF vs uniform on [0, {T}): largest gap {gap:.2f} at t = {at}, above the DKW bound "
                        f"{eps:.2f} for {unit} (false alarm ≤ {alpha:g})",
                    ],
                    "the training timesteps do not cover [0, T) uniformly (a narrowed range, num_inference_steps used as T, "
                    "or continuous times in [0, 1) fed to a discrete scheduler), so most noise levels the sampler visits are "
                    "never trained",
                    f"timesteps = {randint}; if the bias is intended, set DF8.require_uniform=false",
                )
            )

    if not findings:
        ok.append(f"{where} lie in [{lo:g}, {hi:g}] ⊂ [0, {top}], {len(torch.unique(ts))} distinct; {uniform_line}")

    # ---- noise --------------------------------------------------------------------------------------
    noise = D.cat(draws, "noise")
    n_std, n_mean = D.std(noise), float(noise.double().mean())
    dlcheck.attach(
        "histogram",
        title=f"DF8: training timesteps ({len(ts)} draws; uniform over [0, {top}] expected)",
        values=ts.double().cpu().tolist(),
        bins=min(50, max(10, len(ts) // 20)),
        caption=where,
    )
    dlcheck.attach(
        "histogram",
        title=f"DF8: training noise values (std {n_std:.3g}, mean {n_mean:.3g}; N(0, 1) expected)",
        values=noise.detach().double().flatten()[:4000].cpu().tolist(),
        bins=40,
        marks=[{"x": -1.0, "label": "±1"}, {"x": 1.0}],
        caption="the noise dlcheck_training_inputs draws",
    )
    tol = dlcheck.setting("noise_std_tol")
    ok.append(
        f"noise: std {n_std:.3g}, mean {n_mean:.3g} over {noise.numel()} values (std 1 ± {tol:g}, mean 0 ± {tol:g})"
    )
    if abs(n_std - 1) > tol or abs(n_mean) > tol:
        findings.append(
            (
                [
                    f"noise from dlcheck_training_inputs: std {n_std:.3g}, mean {n_mean:.3g} over "
                    f"{noise.numel()} values (wanted std 1 ± {tol:g}, mean 0)"
                ],
                "the noise is not a standard Gaussian (scaled, shifted, or uniform), but the scheduler's "
                "add_noise and the sampler's starting noise are",
                "noise = torch.randn_like(latents) (offset noise adds at most ~0.1·randn(B, C, 1, 1))",
            )
        )

    # ---- add_noise --------------------------------------------------------------------------------
    if all(d.get(k) is not None for d in draws for k in ("latents", "noisy_latents")):
        x0, noisy = D.cat(draws, "latents"), D.cat(draws, "noisy_latents")
        if x0.shape == noisy.shape == noise.shape and integral and 0 <= lo and hi <= T - 1:
            coef = _add_noise_coefficients(sched, ts)
            if coef is not None:
                a, b = _fit(noisy, x0, noise)
                ea, eb = coef
                atol = dlcheck.setting("coef_atol")
                label = f"{D.describe(sched)}.add_noise"
                coefs = f"{label}'s coefficients"
                vp = D.noising_coefficients(sched, ts)
                if vp is not None and bool(torch.all((ea - 1).abs() <= atol)):
                    vpa, vpb = vp[0].double(), vp[1].double()
                    if float(torch.maximum((ea - vpa).abs(), (eb - vpb).abs()).max()) > atol:
                        # the scheduler's own add_noise is variance-exploding (Euler): training is held to the
                        # variance-preserving form of its ᾱ_t, which is what DDPM-family training computes
                        ea, eb = vpa, vpb
                        label = (
                            f"the variance-preserving form of {D.describe(sched)}'s ᾱ_t (its own add_noise is "
                            "variance-exploding)"
                        )
                        coefs = f"the coefficients of {label}"
                err = torch.maximum((a - ea).abs(), (b - eb).abs())
                bad = (err > atol).nonzero().flatten().tolist()
                ve = _variance_exploding(sched, ts, a, b, atol)
                if not bad:
                    ok.append(
                        f"noisy_latents = a·latents + b·noise with {coefs} in "
                        f"{len(err)} of {len(err)} examples (largest gap {float(err.max()):.3g} ≤ {atol:g})"
                    )
                elif ve is not None:
                    i, sig = ve
                    ac = D.alphas_cumprod(sched)
                    vp_a, vp_b = float(ac[int(ts[i])].sqrt()), float((1 - ac[int(ts[i])]).sqrt())
                    findings.append(
                        (
                            [
                                f"{len(err)} of {len(err)} examples fit noisy_latents = 1·latents + σ_t·noise with "
                                f"σ_t = sqrt((1 − ᾱ_t)/ᾱ_t) of {D.describe(sched)}'s ᾱ_t (variance-exploding)",
                                f"example {i} at t = {int(ts[i])}: noisy = {float(a[i]):.3f}·latents + "
                                f"{float(b[i]):.3f}·noise (σ_t = {sig:.3f}); the variance-preserving DDPM form at this t "
                                f"is {vp_a:.3f}·latents + {vp_b:.3f}·noise",
                            ],
                            "the training noise is variance-exploding (x + σ·noise, as EulerDiscreteScheduler.add_noise "
                            "computes for k-diffusion samplers that divide the model input by sqrt(σ² + 1) with "
                            "scale_model_input), not sqrt(ᾱ_t)·x + sqrt(1 − ᾱ_t)·noise: the denoiser sees inputs "
                            f"whose noise std reaches {float(b.max()):.3g}, unlike the unit-variance inputs every sampler feeds it (a "
                            "DDPM-family one, or Euler after scale_model_input)",
                            "noisy_latents = DDPMScheduler.from_config(noise_scheduler.config).add_noise(latents, noise, "
                            "timesteps) for training (keep Euler for sampling only); or, if the variance-exploding form is "
                            "intended, feed the model noisy_latents / sqrt(σ_t² + 1) (what Euler's scale_model_input does when "
                            "sampling)",
                        )
                    )
                else:
                    ok.append(
                        f"noisy_latents = a·latents + b·noise with {D.describe(sched)}.add_noise's coefficients in "
                        f"{len(err) - len(bad)} of {len(err)} examples (largest gap {float(err.max()):.3g} ≤ {atol:g})"
                    )
                    i = max(bad, key=lambda j: float(err[j]))
                    findings.append(
                        (
                            [
                                f"{len(bad)} of {len(err)} examples: noisy_latents ≠ noise_scheduler.add_noise(latents, noise, timesteps)",
                                f"example {i} at t = {int(ts[i])}: noisy = {float(a[i]):.3f}·latents + {float(b[i]):.3f}·noise; "
                                f"{label} gives {float(ea[i]):.3f}·latents + {float(eb[i]):.3f}·noise",
                            ],
                            f"the noisy latents come from another noise schedule or formula than dlcheck_noise_scheduler's "
                            f"({config.get('beta_schedule')}, β {config.get('beta_start')}→{config.get('beta_end')}), so the "
                            "model learns a process the sampler (built from that scheduler's config) does not invert",
                            "noisy_latents = noise_scheduler.add_noise(latents, noise, timesteps) with the scheduler whose "
                            "config the pipeline is built from",
                        )
                    )
    if findings:
        evidence = [line for f in findings for line in f[0]]
        dlcheck.fail(evidence, "; ".join(f[1] for f in findings), "; ".join(f[2] for f in findings))
    if not any(line.startswith("noisy_latents") for line in ok):
        ok.append("add_noise not fitted: dlcheck_training_inputs returns no 'latents' and 'noisy_latents' (or no ᾱ_t)")
    dlcheck.measured(
        *ok,
        timesteps=len(ts),
        distinct=len(torch.unique(ts)),
        noise_std=round(n_std, 4),
        noise_mean=round(n_mean, 4),
    )
