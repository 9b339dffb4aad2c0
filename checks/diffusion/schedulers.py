"""DF4 and DF6: the sampler must invert the noise process and objective the denoiser was trained on."""

from __future__ import annotations

from typing import Any

from ...registry import Setting, check
from . import measure as D

#: config fields that define the noise process (through ᾱ_t)
BETA_FIELDS = ("beta_schedule", "beta_start", "beta_end", "trained_betas", "rescale_betas_zero_snr")
#: defaults of fields a scheduler class may lack (diffusers' own defaults)
FIELD_DEFAULTS = {
    "rescale_betas_zero_snr": False,
    "trained_betas": None,
    "timestep_spacing": "leading",
    "steps_offset": 0,
    "clip_sample": False,
    "thresholding": False,
}


def _get(config: Any, name: str) -> Any:
    return config.get(name, FIELD_DEFAULTS.get(name))


def _show(value: Any) -> str:
    if isinstance(value, (list, tuple)) and len(value) > 4:
        return f"[{len(value)} values]"
    return repr(value)


def _which(train: Any, infer: Any) -> tuple[str, str]:
    return f"training {D.describe(train)}", f"inference {D.describe(infer)}"


def _objective(dlcheck, sched) -> tuple[str | None, str]:
    """The measured training objective and its evidence line, when dlcheck_training_inputs gives a target."""
    if not dlcheck.has("training_inputs"):
        return None, ""
    draws = D.training_draws(dlcheck)
    if any(d.get("target") is None for d in draws):
        return None, ""
    best, counts, judged = D.measured_objective(draws, sched, 0.01)
    if best is None:
        return None, ""
    return best, (
        f"the training target of dlcheck_training_inputs equals {D.OBJECTIVE_WORDS[best]} in "
        f"{counts[best]} of {judged} examples"
    )


def _saved_prediction(dlcheck) -> tuple[str | None, str]:
    """(prediction_type, file) from the scheduler config saved with the checkpoint the pipeline was loaded
    from (a local folder, or the local Hugging Face cache; never the network); (None, "") when unknown."""
    import json
    import os

    pipe = dlcheck.optional("pipeline")
    cfg = getattr(pipe, "config", None)
    path = getattr(pipe, "name_or_path", None) or (cfg.get("_name_or_path") if hasattr(cfg, "get") else None)
    if not isinstance(path, str) or not path:
        return None, ""
    file = os.path.join(path, "scheduler", "scheduler_config.json")
    if not os.path.isfile(file):
        try:
            from huggingface_hub import try_to_load_from_cache

            cached = try_to_load_from_cache(path, "scheduler/scheduler_config.json")
        except Exception:  # noqa: BLE001 - not a repo id, or no cache: unknown
            cached = None
        if not isinstance(cached, str):
            return None, ""
        file = cached
    try:
        with open(file, encoding="utf-8") as fh:
            saved = json.load(fh).get("prediction_type", "epsilon")
    except (OSError, ValueError):
        return None, ""
    return (saved, file) if isinstance(saved, str) else (None, "")


@check(
    "DF4",
    domain="diffusion",
    title="train and inference schedulers disagree",
    optional_roles=("noise_scheduler", "inference_scheduler", "training_inputs"),
    settings=(
        Setting(
            "alphas_atol",
            1e-5,
            "largest allowed gap between the two schedulers' ᾱ_t; float32 betas built in "
            "either class agree to 1e-7, a different beta schedule or range differs by 1e-2 or more",
        ),
    ),
)
def check_scheduler_agreement(dlcheck):
    """The sampler's noise process and output parameterisation are the training scheduler's.

    What it does
        Compares the training noise scheduler with the inference scheduler (the pipeline's) on every
        field that changes what the denoiser's output means: num_train_timesteps, the noise schedule
        (ᾱ_t compared value by value, naming whichever of beta_schedule, beta_start, beta_end,
        trained_betas, rescale_betas_zero_snr differ), and prediction_type. When dlcheck_training_inputs
        returns the 'target', the objective really trained (noise, velocity or x0) is named too, so the
        fix points at the side that is wrong.
    Why it is bad
        A DDPM-trained v-prediction model sampled by a DDIM scheduler left at prediction_type="epsilon"
        reads velocity as noise and produces grey noise; a sampler built with another beta schedule or
        number of train timesteps removes the wrong amount of noise at every step. The training loss
        never shows it.
    Example
        noise_scheduler = DDPMScheduler(prediction_type="v_prediction", beta_schedule="scaled_linear", ...)
        pipeline.scheduler = DDIMScheduler()                 # defaults: epsilon, linear betas
    Use instead
        pipeline.scheduler = DDIMScheduler.from_config(noise_scheduler.config) (any sampler class:
        X.from_config(noise_scheduler.config)), then change only sampler options (timestep_spacing,
        solver order), never num_train_timesteps, betas or prediction_type. When the pipeline was loaded
        from a checkpoint whose saved scheduler config says v_prediction while the training scheduler says
        epsilon, the training side is the one to change (DDPMScheduler.from_pretrained(model_path,
        subfolder="scheduler")); the check names that case.
    Known problems
        Compares configs and ᾱ_t, so a scheduler class with a different parameterisation (flow matching
        against DDPM) is reported as a different noise process. Between two flow-matching schedulers only
        num_train_timesteps and prediction_type are compared (not shift). The pipeline's scheduler is
        read as it is when the check runs.
    Not applicable
        Projects that are not a diffusion training (no diffusion role: an LLM, a vision classifier, RL).
        A generator of a VQ model's discrete tokens (aMUSEd: an AmusedScheduler's mask schedule over token ids,
        no noise scheduler).
    """
    D.require_diffusion(dlcheck)
    if (discrete := D.discrete_tokens(dlcheck)) is not None:
        dlcheck.not_applicable(
            f"{discrete}; there is no noise process for a training and a sampling scheduler to share"
        )
    train, infer = dlcheck.require("noise_scheduler", "inference_scheduler")
    used = D.swapped_scheduler(dlcheck, infer)
    swapped = used is not None
    if swapped:
        infer = used  # the routine samples with another scheduler than pipeline.scheduler: judge that one
    tc, ic = D.sched_config(train), D.sched_config(infer)
    tn, iname = _which(train, infer)
    if swapped:
        iname = f"sampling {D.describe(infer)} (the one dlcheck_sample_images steps, not pipeline.scheduler)"
    diffs: list[str] = []
    fields: list[str] = []

    if tc.get("num_train_timesteps") != ic.get("num_train_timesteps"):
        diffs.append(
            f"num_train_timesteps: {tn} {tc.get('num_train_timesteps')}, {iname} {ic.get('num_train_timesteps')}"
        )
        fields.append("num_train_timesteps")
    ta, ia = D.alphas_cumprod(train), D.alphas_cumprod(infer)
    named = [f for f in BETA_FIELDS if _get(tc, f) != _get(ic, f)]
    if (ta is None) != (ia is None):
        diffs.append(
            f"noise process: {tn} {'has' if ta is not None else 'has no'} ᾱ_t schedule, {iname} "
            f"{'has' if ia is not None else 'has no'} (flow matching vs DDPM-style)"
        )
        fields.append("scheduler class")
    elif ta is not None:
        # the noise process differs when ᾱ_t differ (a field written differently but giving the same ᾱ_t is
        # no difference); with different lengths num_train_timesteps already differs and the fields explain why
        gap_line = ""
        if len(ta) == len(ia):
            gap = (ta - ia).abs()
            t = int(gap.argmax())
            if float(gap[t]) > dlcheck.setting("alphas_atol"):
                gap_line = (
                    f"ᾱ_t differ by up to {float(gap[t]):.3g} (at t = {t}: {float(ta[t]):.4g} vs {float(ia[t]):.4g})"
                )
        if gap_line or (len(ta) != len(ia) and named):
            for f in named:
                diffs.append(f"{f}: {tn} {_show(_get(tc, f))}, {iname} {_show(_get(ic, f))}")
            fields += named or ["alphas_cumprod"]
            if gap_line:
                diffs.append(gap_line)
    tp, ip = tc.get("prediction_type", "epsilon"), ic.get("prediction_type", "epsilon")
    measured_line = ""
    measured = None
    agreed_noise = (
        f"ᾱ_t equal over {len(ta)} timesteps (max gap {float((ta - ia).abs().max()):.2g} ≤ "
        f"{dlcheck.setting('alphas_atol'):g})"
        if ta is not None and ia is not None and len(ta) == len(ia)
        else "no ᾱ_t on either side (flow matching): the noise schedules are not compared"
        if ta is None and ia is None
        else ""
    )
    if tp != ip:
        diffs.append(f"prediction_type: {tn} {tp!r}, {iname} {ip!r}")
        fields.append("prediction_type")
        measured, measured_line = _objective(dlcheck, train)
        if measured_line:
            diffs.append(measured_line)
    if not diffs:
        dlcheck.measured(
            f"{iname} agrees with {tn}: num_train_timesteps {tc.get('num_train_timesteps')}, "
            + (
                f"prediction_type {tp!r}"
                if "prediction_type" in tc or "prediction_type" in ic
                else "no prediction_type on either side (flow matching: the output is read as the flow's velocity)"
            )
            + f", {agreed_noise}",
            "beta fields: "
            + ", ".join(f"{f}={_show(_get(tc, f))}" for f in BETA_FIELDS if f in tc or f in ic)
            + (f" (written differently: {', '.join(named)}; same ᾱ_t)" if named else ""),
            num_train_timesteps=tc.get("num_train_timesteps"),
            prediction_type=tp,
            alphas_compared=len(ta) if ta is not None else 0,
        )
        return
    saved, saved_file = _saved_prediction(dlcheck) if "prediction_type" in fields else (None, "")
    if saved is not None and saved == ip and saved != tp:
        diffs.append(f"the checkpoint's saved scheduler config ({saved_file}) says prediction_type {saved!r}")
        dlcheck.fail(
            diffs,
            f"the checkpoint was pre-trained with {saved!r} and its pipeline samples it that way; the training "
            f"scheduler is what is wrong: it fine-tunes the model on {tp!r} targets, so training first has to unlearn "
            "the pre-trained parameterisation (a loss that starts high, samples that degrade), and the saved "
            "pipeline ends up with a model and a scheduler config that disagree",
            "load the training scheduler from the checkpoint: noise_scheduler = DDPMScheduler.from_pretrained("
            f"model_path, subfolder='scheduler') (prediction_type {saved!r}), and compute the target from it "
            "(v_prediction: noise_scheduler.get_velocity(latents, noise, timesteps)); keep the sampler as it is",
        )
    if measured is not None and measured == ip and measured != tp:
        fix = (
            f"the step trains {measured!r} while the training scheduler says {tp!r}: set prediction_type={measured!r} in "
            "noise_scheduler (the pipeline's saved scheduler config is where samplers read it), then build the "
            "sampler with X.from_config(noise_scheduler.config)"
        )
    else:
        fix = (
            f"build the sampler from the training scheduler's config: pipeline.scheduler = "
            f"{D.describe(infer)}.from_config(noise_scheduler.config) (fields to align: {', '.join(fields)}); "
            "override only sampler options such as timestep_spacing"
        )
    cause = (
        "the sampler inverts a different noise process or output parameterisation than the one the denoiser "
        "was trained on" + (f" — it reads a {tp!r} model's output as {ip!r}" if "prediction_type" in fields else "")
    )
    dlcheck.fail(diffs, cause, fix)


@check(
    "DF6",
    domain="diffusion",
    title="sampler settings do not match the trained objective",
    optional_roles=("noise_scheduler", "inference_scheduler", "training_inputs", "vae"),
    settings=(
        Setting(
            "target_rtol",
            0.01,
            "relative distance under which the training target is taken to equal the "
            "noise, the velocity or x0 (they are computed exactly, so real matches are at 1e-6)",
        ),
        Setting(
            "probe_steps",
            10,
            "number of sampling steps at which the sampler's first timestep is read for "
            "the zero-terminal-SNR test; few-step sampling is where the gap is largest",
        ),
    ),
)
def check_sampler_settings(dlcheck):
    """The sampler reads the objective the step really trains, and its options fit that model.

    What it does
        (1) When ``dlcheck_training_inputs`` returns the 'target', measures what is really trained (the
        target equals the noise, the velocity sqrt(ᾱ)·noise − sqrt(1−ᾱ)·x0, or x0) and compares it with
        the sampler's prediction_type, when both schedulers' configs agree (a config mismatch is DF4's).
        (2) Training with zero terminal SNR (rescale_betas_zero_snr, ᾱ_T = 0) needs a sampler whose first
        step is the last training timestep: timestep_spacing="trailing"; the first timestep at
        ``probe_steps`` steps is read from a fresh copy of the sampler. (3) In latent space (a VAE is
        known), clip_sample=True or thresholding=True clamp the predicted latents to
        ±clip_sample_range / sample_max_value; the share of training latents outside is measured.
        Other differences (timestep_spacing, steps_offset) are listed when the check fails.
    Why it is bad
        A step that trains on the noise while the configs say v_prediction (target hard-coded to noise)
        saves a scheduler config that makes every sampler misread the output. A zero-SNR model sampled
        with "leading" spacing never starts from its pure-noise timestep and its images lose contrast.
        Clipping latents of std 1 to [-1, 1] cuts a third of the values at every step.
    Example
        target = noise            # while noise_scheduler.config.prediction_type == "v_prediction"
        DDIMScheduler(rescale_betas_zero_snr=True)                  # timestep_spacing left "leading"
        DDIMScheduler(beta_schedule="scaled_linear")                # clip_sample=True by default, on latents
    Use instead
        target = noise if prediction_type == "epsilon" else noise_scheduler.get_velocity(latents, noise, timesteps);
        DDIMScheduler.from_config(noise_scheduler.config, timestep_spacing="trailing") for zero-SNR models;
        clip_sample=False and thresholding=False for latent diffusion.
    Known problems
        Without 'target' the objective is not measured (DF4 still compares the configs). Pixel-space
        models (no VAE role) may clip: (3) runs only when dlcheck_vae or dlcheck_pipeline is given.
    Not applicable
        Projects that are not a diffusion training (no diffusion role: an LLM, a vision classifier, RL).
        A generator of a VQ model's discrete tokens (aMUSEd: an AmusedScheduler's mask schedule over token ids,
        no noise scheduler).
    """
    D.require_diffusion(dlcheck)
    if (discrete := D.discrete_tokens(dlcheck)) is not None:
        dlcheck.not_applicable(
            f"{discrete}; there is no noise process for a training and a sampling scheduler to share"
        )
    train, infer = dlcheck.require("noise_scheduler", "inference_scheduler")
    used = D.swapped_scheduler(dlcheck, infer)
    swapped = used is not None
    if swapped:
        infer = used  # the routine samples with another scheduler than pipeline.scheduler: judge that one
    tc, ic = D.sched_config(train), D.sched_config(infer)
    tn, iname = _which(train, infer)
    if swapped:
        iname = f"sampling {D.describe(infer)} (the one dlcheck_sample_images steps, not pipeline.scheduler)"
    findings: list[tuple[list[str], str, str]] = []
    judged: list[str] = []  # what a pass measured

    # (1) the objective really trained
    tp, ip = tc.get("prediction_type", "epsilon"), ic.get("prediction_type", "epsilon")
    # a flow-matching scheduler (FlowMatchEulerDiscreteScheduler) has no prediction_type and no ᾱ_t: the sampler
    # reads the output as the flow's velocity, and a step may train on x0 with the output preconditioned into it
    # (SD3's precondition_outputs): a target compared with a prediction_type it does not have says nothing
    flow = "prediction_type" not in tc and "prediction_type" not in ic and D.alphas_cumprod(train) is None
    draws = None
    if flow:
        judged.append(
            f"(1) {tn} is a flow-matching scheduler with no prediction_type (the sampler reads the model's output as "
            "the flow's velocity, noise − x0): the training target is not compared with a prediction_type"
        )
    elif dlcheck.has("training_inputs"):
        draws = D.training_draws(dlcheck)
        if all(d.get("target") is not None for d in draws) and tp == ip:
            best, counts, n_judged = D.measured_objective(draws, train, dlcheck.setting("target_rtol"))
            if best is not None and best == ip:
                judged.append(
                    f"(1) the training target equals {D.OBJECTIVE_WORDS[best]} in {counts[best]} of {n_judged} "
                    f"examples, as prediction_type={ip!r} says"
                )
            elif best is None:
                judged.append(
                    f"(1) the training target matches no single objective in {n_judged} examples "
                    f"({', '.join(f'{k} {v}' for k, v in counts.items())}): not judged"
                )
            if best is not None and best != ip:
                findings.append(
                    (
                        [
                            f"the training target of dlcheck_training_inputs equals {D.OBJECTIVE_WORDS[best]} in "
                            f"{counts[best]} of {n_judged} examples",
                            f"both schedulers say prediction_type={ip!r} ({tn}, {iname})",
                        ],
                        f"the model learns to predict {best!r} but the sampler reads its output as {ip!r}",
                        f"compute the target from noise_scheduler.config.prediction_type (epsilon: noise; v_prediction: "
                        f"noise_scheduler.get_velocity(latents, noise, timesteps); sample: latents), or set "
                        f"prediction_type={best!r} in the training scheduler and build the sampler from its config",
                    )
                )

    if not any(x.startswith("(1)") for x in judged):
        judged.append(
            "(1) the trained objective was not measured: "
            + (
                "no 'target' from dlcheck_training_inputs"
                if draws is not None and tp == ip
                else "the schedulers' prediction_type differ (DF4's finding)"
                if tp != ip
                else "define dlcheck_training_inputs returning 'target'"
            )
        )

    # (2) zero terminal SNR needs trailing spacing
    ta = D.alphas_cumprod(train)
    spacing = _get(ic, "timestep_spacing")
    T = tc.get("num_train_timesteps")
    if ta is None:
        judged.append(f"(2) {tn} has no ᾱ_t schedule (flow matching): the zero-terminal-SNR spacing is not judged")
    elif float(ta[-1]) >= 1e-6:
        judged.append(
            f"(2) {tn} ᾱ at t = {len(ta) - 1} is {float(ta[-1]):.2g} > 0: not zero terminal SNR, any "
            f"timestep_spacing fits ({iname}: {spacing!r})"
        )
    elif spacing == "trailing":
        try:
            start = D.first_timesteps(infer, dlcheck.setting("probe_steps"))[0]
        except Exception:  # noqa: BLE001 - a sampler that cannot be rebuilt from its config: the spacing says enough
            start = None
        judged.append(
            "(2) zero terminal SNR sampled with timestep_spacing='trailing'"
            + (f": {dlcheck.setting('probe_steps')}-step sampling starts at t = {start}" if start is not None else "")
        )
    if ta is not None and float(ta[-1]) < 1e-6 and spacing != "trailing" and hasattr(infer, "set_timesteps") and T:
        steps = dlcheck.setting("probe_steps")
        try:
            first = D.first_timesteps(infer, steps)
        except Exception:  # noqa: BLE001 - a sampler that cannot be rebuilt from its config: say so below
            first = None
        if first is not None and first[0] >= T - 1:
            judged.append(f"(2) zero terminal SNR: {steps}-step sampling starts at t = {first[0]}")
        if first is not None and first[0] < T - 1:
            findings.append(
                (
                    [
                        f"{tn} has zero terminal SNR (ᾱ at t = {T - 1} is {float(ta[-1]):.2g}"
                        f"{', rescale_betas_zero_snr=True' if tc.get('rescale_betas_zero_snr') else ''})",
                        f"{iname} timestep_spacing={spacing!r} starts {steps}-step sampling at t = {first[0]}, never at "
                        f"t = {T - 1} where the model saw pure noise",
                    ],
                    "the sampler starts from pure noise but tells the model it is at a timestep that still holds signal",
                    f"timestep_spacing='trailing' in the inference scheduler "
                    f"({D.describe(infer)}.from_config(noise_scheduler.config, timestep_spacing='trailing'))",
                )
            )

    # (3) clipping in latent space
    latent_space = dlcheck.has("vae")
    clips = [f for f in ("clip_sample", "thresholding") if _get(ic, f)]
    vectors = None if latent_space else D.vector_space(dlcheck)
    pixels = None if latent_space or vectors else D.pixel_space(dlcheck)
    if vectors is not None:
        # a prior's x0 are image embeddings (normalised or not): a clamp fits them only if it leaves them whole
        limits = [
            (f, float(ic.get(k, 1.0)))
            for f, k in (("clip_sample", "clip_sample_range"), ("thresholding", "sample_max_value"))
            if _get(ic, f)
        ]
        vec = (
            D.cat(draws, "latents") if draws is not None and all(d.get("latents") is not None for d in draws) else None
        )
        if not limits:
            judged.append(f"(3) {vectors}: no clipping (clip_sample=False, thresholding=False)")
        elif vec is None:
            judged.append(
                f"(3) {vectors}: {', '.join(f'{f} clamps the predicted x0 to ±{lim:g}' for f, lim in limits)}; the "
                "training vectors' range is not known (no dlcheck_training_inputs): clipping not judged"
            )
        else:
            for flag, limit in limits:
                share = float((vec.abs() > limit).double().mean())
                seen = (
                    f"the training vectors (dlcheck_training_inputs) have std {D.std(vec):.3g}, max |x| "
                    f"{float(vec.abs().max()):.3g}; {share:.2%} of their values lie outside ±{limit:g}"
                )
                if share > 0.001:
                    findings.append(
                        (
                            [f"{iname} {flag}=True clamps every predicted x0 to ±{limit:g}", seen],
                            f"the clamp is narrower than the vectors the denoiser is trained to produce: every sampling "
                            f"step cuts the predicted x0 at ±{limit:g}",
                            f"a limit that covers the training vectors ({D.describe(infer)}.from_config(noise_scheduler"
                            f".config, {'clip_sample_range' if flag == 'clip_sample' else 'sample_max_value'}=...)), "
                            f"or {flag}=False",
                        )
                    )
                else:
                    judged.append(f"(3) {vectors}: {flag} clamps the predicted x0 to ±{limit:g}; {seen}")
    elif pixels is not None:
        judged.append(
            f"(3) {pixels}: "
            + (
                f"{', '.join(clips)} clamps the predicted x0 to ±1, which fits [-1, 1] images"
                if clips
                else "no clipping (clip_sample=False, thresholding=False)"
            )
        )
    elif not latent_space:
        judged.append("(3) no VAE known and the denoiser's input space is unknown: clipping not judged")
    elif not clips:
        judged.append(f"(3) latent space (dlcheck_vae): {iname} clip_sample=False, thresholding=False")
    if latent_space:
        lat = None
        if draws is not None and all(d.get("latents") is not None for d in draws):
            lat = D.cat(draws, "latents")
        for flag, limit_key in (("clip_sample", "clip_sample_range"), ("thresholding", "sample_max_value")):
            if _get(ic, flag):
                limit = float(ic.get(limit_key, 1.0))
                if lat is not None:
                    share = float((lat.abs() > limit).double().mean())
                    seen = (
                        f"the training latents (dlcheck_training_inputs) have std {D.std(lat):.3g}; "
                        f"{share:.0%} of their values lie outside ±{limit:g}"
                    )
                else:
                    seen = (
                        "the denoiser works in the VAE's latent space (dlcheck_vae), whose scaled latents have std ≈ 1"
                    )
                findings.append(
                    (
                        [f"{iname} {flag}=True clamps every predicted x0 to ±{limit:g}", seen],
                        f"{flag} is meant for pixel-space images in [-1, 1]; on latents it cuts the predicted x0 at "
                        "every step",
                        f"{flag}=False in the inference scheduler ({D.describe(infer)}.from_config(noise_scheduler.config, "
                        f"{flag}=False))",
                    )
                )
    if not findings:
        decided = [x for x in judged if "not judged" not in x and "not measured" not in x]
        if not decided:
            dlcheck.skip("DF6 cannot decide: " + "; ".join(judged))
        parts = {"(1)": "the trained objective", "(2)": "the zero-terminal-SNR spacing", "(3)": "clipping"}
        for x in judged:
            if ("not judged" in x or "not measured" in x) and "flow matching" not in x:  # flow matching: none
                dlcheck.not_judged(parts.get(x[:3], x.split(":", 1)[0]), x[4:] if x[:3] in parts else x)
        dlcheck.measured(
            f"{iname} fits what {tn} trains: " + "; ".join(x.split(") ", 1)[1] for x in decided[:2]),
            *judged,
            prediction_type=ip,
            timestep_spacing=spacing,
            latent_space=latent_space,
        )
        return
    notes = [
        f"{f}: {tn} {_show(_get(tc, f))}, {iname} {_show(_get(ic, f))}"
        for f in ("timestep_spacing", "steps_offset")
        if _get(tc, f) != _get(ic, f)
    ]
    evidence = [line for f in findings for line in f[0]]
    if notes:
        evidence.append("also differing, sampler-only options that training does not use: " + "; ".join(notes))
    dlcheck.fail(evidence, "; ".join(f[1] for f in findings), "; ".join(f[2] for f in findings))
