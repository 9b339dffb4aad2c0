"""DF2: sampling from the raw weights instead of the EMA."""

from __future__ import annotations

from typing import Any

from ...registry import check
from . import measure as D


def _sample_with_ema_fix(ema: Any, ema_module: Any) -> str:
    """How to sample with this kind of EMA: EMAModel's store/copy_to/restore, or the EMA module itself."""
    if ema_module is None:
        return (
            "ema.store(unet.parameters()); ema.copy_to(unet.parameters()); sample; ema.restore(unet.parameters()) "
            "(and ema.copy_to(unet.parameters()) before pipeline.save_pretrained)"
        )
    inner = next((n for n, m in ema.named_modules() if m is ema_module), "") if ema_module is not ema else ""
    ref = f"ema_model.{inner}" if inner else "ema_model"
    return (
        f"sample with the EMA module itself: pipe = copy.copy(pipeline); pipe.register_modules(unet={ref}); "
        f"images = pipe(...).images (and save {ref}, e.g. {ref}.save_pretrained(...), as the final denoiser)"
    )


@check(
    "DF2",
    domain="diffusion",
    title="sampling from the raw weights instead of the EMA",
    optional_roles=("ema", "unet", "sample_images", "training_args"),
)
def check_ema_used(dlcheck):
    """The sampling routine runs the denoiser with the EMA weights, and leaves the trained weights alone.

    What it does
        Makes the EMA's tensors distinguishable from the trained ones (their first element is nudged by a
        relative 1e-3 for the run), runs ``dlcheck_sample_images()`` once — the one run DF3, DF4 and DF6
        read too — while a forward pre-hook records the weights of every module of the denoiser's class
        that runs, and compares them with the EMA's and with the trained (``dlcheck_unet``) weights, exactly.
        An EMA module that holds the trained denoiser itself beside its averaged copy (``EMA(model)`` keeping
        ``online_model`` and ``ema_model``) is read on the copy: its tensors that share storage with
        ``dlcheck_unet`` are the trained ones, left out. Fails when the denoiser ran with the
        raw trained weights, when the sampling routine left other weights in the trained model (copy_to
        without restore), or when the EMA shares its tensors with the model (an "EMA" that is the model).
        Every weight, the EMA's state (temp_stored_params, optimization_step) and the RNG are restored.
    Why it is bad
        The EMA is kept because its samples are better than the raw weights' (noisy from the last
        updates); validating and saving the raw weights throws that away, and a raw copy is silently
        what ends up in the saved pipeline. A sampler that copies the EMA in and never restores makes
        training continue from the EMA weights.
    Example
        ema = EMAModel(unet.parameters(), model_cls=UNet2DConditionModel, model_config=unet.config)
        ...; ema.step(unet.parameters())
        images = pipeline(prompts, num_inference_steps=25).images    # pipeline.unet holds the raw weights
    Use instead
        ema.store(unet.parameters()); ema.copy_to(unet.parameters())
        images = pipeline(prompts, num_inference_steps=25).images
        ema.restore(unet.parameters())          # and ema.copy_to(unet.parameters()) before save_pretrained
    Known problems
        Runs the user's sampling routine once: keep it cheap (one prompt, two steps). The denoiser is
        recognised by its class (dlcheck_unet's); a sampler that runs a compiled or differently-typed copy
        is not seen (the check skips). Whether the training loop calls ema.step is seen only for
        diffusers' EMAModel (optimization_step 0 while dlcheck_unet has moved away from the shadow params);
        a decay of 1 (an EMA that never moves) is reported. An EMA module (deepcopy, AveragedModel) carries
        no step count, so a never-updated module copy is not detected here (T12 compares an EMA in a training
        state before and after a short run).
    Not applicable
        Trainings that keep no EMA of the denoiser (no dlcheck_ema, and no use_ema in dlcheck_training_args),
        and projects that are not a diffusion training.
    """
    import torch

    if not dlcheck.has("ema"):
        D.require_diffusion(dlcheck)
        args = dlcheck.role("training_args")
        if getattr(args, "use_ema", None) is True:
            dlcheck.require("ema")  # declared: the fixture that hands it over is missing
        dlcheck.not_applicable(
            "no EMA configured (no dlcheck_ema): DF2 concerns trainings that sample from an EMA of the denoiser; "
            "define dlcheck_ema (and dlcheck_sample_images) if yours keeps one"
        )
    ema, model, sample = dlcheck.require("ema", "unet", "sample_images")
    sample = D.user_callable(dlcheck, "sample_images", sample)
    if not isinstance(model, torch.nn.Module):
        dlcheck.not_applicable(f"DF2 compares torch weights; dlcheck_unet is a {type(model).__name__}")
    tensors, ema_module, ema_desc = D.own_ema_tensors(ema, model)
    if not tensors:
        dlcheck.skip(f"dlcheck_ema is a {ema_desc}: DF2 reads diffusers EMAModel, torch AveragedModel or a module")
    params = D.align_params(model, tensors)
    if params is None:
        dlcheck.skip(
            f"dlcheck_ema ({ema_desc}) holds {len(tensors)} tensors that do not line up with the "
            f"{len(list(model.parameters()))} parameters of dlcheck_unet ({type(model).__name__})"
        )
    name = type(model).__name__
    shared = sum(t.data_ptr() == p.data_ptr() for t, p in zip(tensors, params))
    if shared:
        dlcheck.fail(
            [f"dlcheck_ema ({ema_desc}) shares {shared} of {len(params)} tensors with dlcheck_unet ({name})"],
            "the EMA is the model itself (ema_model = model), not a copy, so it never averages anything",
            "ema_model = copy.deepcopy(model).requires_grad_(False) (or EMAModel(model.parameters(), ...))",
        )
    decay = getattr(ema, "decay", None)
    if isinstance(decay, (int, float)) and decay >= 1.0:
        dlcheck.fail(
            [f"dlcheck_ema ({ema_desc}) has decay {decay}: every ema.step keeps the old average entirely"],
            "an EMA with decay ≥ 1 never moves from its initial weights",
            "EMAModel(unet.parameters(), decay=0.9999, use_ema_warmup=True) (0.999 for short runs)",
        )
    step = getattr(ema, "optimization_step", None)
    if isinstance(step, int) and step == 0 and isinstance(getattr(ema, "shadow_params", None), list):
        with torch.no_grad():
            moved = sum(
                not bool((t.detach().to(p.device, p.dtype) == p.detach()).all()) for t, p in zip(tensors, params)
            )
        if moved:
            dlcheck.fail(
                [
                    f"dlcheck_ema ({ema_desc}) has optimization_step 0: ema.step was never called",
                    f"yet {moved} of {len(params)} tensors of dlcheck_unet ({name}) differ from the EMA's shadow "
                    "params: the model was trained after the EMA was made, and the EMA still holds the weights it "
                    "started from",
                ],
                "the training loop never calls ema.step(unet.parameters()), so the EMA is the initial (pre-training) "
                "model and everything sampled or saved from it ignores the training",
                "after each optimizer step that syncs gradients: if accelerator.sync_gradients: "
                "ema.step(unet.parameters())",
            )

    run = D.sampling_run(dlcheck)
    watch = run.ema if run is not None else None
    if watch is None:
        dlcheck.skip("the sampling run could not watch dlcheck_ema beside dlcheck_unet")
    order, drifted, drift_is_ema = watch.order, watch.drifted, watch.drift_is_ema
    if not order:
        dlcheck.skip(
            f"dlcheck_sample_images ran no {name} module (the class of dlcheck_unet): DF2 cannot see which "
            "weights the sampler uses"
        )
    raw_runs = [who for verdict, who in order if verdict == "raw"]
    ema_runs = [who for verdict, who in order if verdict == "ema"]
    findings: list[tuple[list[str], str, str]] = []
    if raw_runs and not ema_runs:
        findings.append(
            (
                [
                    f"dlcheck_sample_images ran {name} ({raw_runs[0]}) with the raw trained weights: all {len(params)} tensors "
                    f"equal dlcheck_unet's, none the EMA's (dlcheck_ema: {ema_desc})"
                ],
                (
                    "the sampling routine never copies the EMA weights in (ema.copy_to) nor samples with the EMA module"
                    if ema_module is None
                    else "the sampling routine runs the trained model, never the EMA module (the pipeline's unet is "
                    "not the EMA copy)"
                )
                + ", so validation images, and a pipeline saved the same way, show the raw weights",
                _sample_with_ema_fix(ema, ema_module),
            )
        )
    if drifted:
        held = "the EMA weights" if drift_is_ema else "weights that are neither its own nor the EMA's"
        findings.append(
            (
                [f"after dlcheck_sample_images, dlcheck_unet ({name}) holds {held}"],
                "the sampling routine copies weights into the trained model and does not put them back, so training "
                "continues from them",
                "ema.store(unet.parameters()) before ema.copy_to(...), and ema.restore(unet.parameters()) after sampling",
            )
        )
    if findings:
        evidence = [line for f in findings for line in f[0]]
        dlcheck.fail(evidence, "; ".join(f[1] for f in findings), "; ".join(f[2] for f in findings))
    if not ema_runs:
        dlcheck.skip(
            f"dlcheck_sample_images ran {name} with weights that are neither the EMA's nor dlcheck_unet's "
            "(a loaded checkpoint?): DF2 cannot tell"
        )
    dlcheck.measured(
        f"dlcheck_sample_images ran {name} ({ema_runs[0]}) with the EMA weights: all {len(params)} tensors equal "
        f"dlcheck_ema's ({ema_desc}), none the raw trained ones",
        f"{len(order)} {name} module(s) ran while sampling: "
        + ", ".join(f"{who} with {'the EMA' if v == 'ema' else v} weights" for v, who in order),
        f"after sampling dlcheck_unet holds its own trained weights again (all {len(params)} tensors unchanged)",
        tensors=len(params),
        ema_runs=len(ema_runs),
        raw_runs=len(raw_runs),
    )
