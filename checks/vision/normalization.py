from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from ...errors import MISSING
from ...registry import Setting, check
from . import measure as V


@dataclass
class Split:
    name: str  # "train" / "eval"
    source: str
    stats: Any  # V.Stats
    transform: Any  # the transform (or MISSING)
    norm: tuple | None  # (mean, std, leaf) of its Normalize
    real: bool  # measured on the user's data (not on synthetic images through the transform)
    video: bool = False  # the sampled inputs are video clips (C, T, H, W): statistics over all their frames
    #: a multi-view sample's statistics by view size ("views 32×32: …"), one line each
    per_size: list[str] | None = None


def _views_source(sample: Any) -> tuple[str, Any]:
    """(source, per-size lines) of a multi-view sample: every view counted, and each view size's statistics."""
    counts = sorted({len(i.views) for i in sample.items if i.views})
    by_size: dict[tuple[int, int], list[Any]] = {}
    for img in sample.all_images:
        by_size.setdefault(tuple(int(v) for v in img.shape[-2:]), []).append(img)
    lines = [
        f"{len(imgs)} views of {h}×{w}: {V.channel_stats(imgs).describe()}"
        for (h, w), imgs in sorted(by_size.items(), reverse=True)
    ]
    source = (
        f"{sample.source}, {'/'.join(map(str, counts))} augmented views each (a multi-view batch: "
        f"{len(sample.all_images)} views of {len(by_size)} size{'s' if len(by_size) > 1 else ''})"
    )
    return source, lines


def _close(a: list[float], b: list[float], tol: float) -> bool:
    if len(a) != len(b):
        if len(a) == 1 or len(b) == 1:
            a, b = a * len(b) if len(a) == 1 else a, b * len(a) if len(b) == 1 else b
        else:
            return False
    return all(abs(x - y) <= tol for x, y in zip(a, b))


def _split(dlcheck: Any, name: str) -> Split | None:
    tf = dlcheck.role("train_transform" if name == "train" else "eval_transform")
    sample = V.get_vision_sample(dlcheck, name, required=False)
    norm = V.find_normalize(tf) if tf is not MISSING else None
    if sample is not None and sample.images and not all(i.pil for i in sample.items):
        stats = V.channel_stats(sample.all_images)
        V.attach_images(dlcheck, sample, norm)
        if sample.multi_view:
            source, per_size = _views_source(sample)
            return Split(name, source, stats, tf, norm, True, sample.video, per_size)
        return Split(name, sample.source, stats, tf, norm, True, sample.video)
    if tf is not MISSING:

        def run() -> Any:
            imgs = []
            for seed in range(3):
                with V.seeded(seed):
                    out = dlcheck.call(
                        f"{name}_transform", lambda s=seed: V.apply_image_transform(tf, V.synthetic_pil(seed=s))
                    )
                img, pil = V.as_image(out)
                if img is None or pil:
                    return None
                imgs.append(img)
            return V.channel_stats(imgs)

        try:
            stats = dlcheck.memo(tf, "vision:synthetic-stats", run)
        except Exception:  # noqa: BLE001 - a transform that needs another input type: nothing to measure
            stats = None
        if stats is not None:
            return Split(name, f"3 synthetic noise images through dlcheck_{name}_transform", stats, tf, norm, False)
    return None


def _step_normalises(dlcheck: Any) -> Any:
    """What the model receives inside the user's own step, when a plain or Accelerate loop gives one and it
    normalises the loader's images itself (accelerate's cv_example: ``(batch["image"] - mean) / std`` in the loop):
    one call of ``dlcheck_train_step`` on fresh objects, the images (or video clips: a 5-D batch) taken at the model's
    forward: their Stats. None when there is no such step, or what the model receives is not normalised either
    (min >= -0.01)."""
    from ...training import find_setup

    setup = find_setup(dlcheck)
    if setup is None or setup.kind not in ("loop", "accelerate") or getattr(setup, "train_step", MISSING) is MISSING:
        return None

    def run() -> Any:
        import torch

        from ...guard import preserved_rng
        from ...training.runs import unwrap_prepared

        state = setup.state()
        model = unwrap_prepared(state.get("model"))
        seen: list[Any] = []

        def pre(mod, args, kwargs):
            for a in [*args, *kwargs.values()]:
                if not isinstance(a, torch.Tensor) or not a.is_floating_point() or seen:
                    continue
                if a.ndim == 4 or a.ndim == 5 and a.shape[1] in (1, 3):  # images, or (batch, C, T, H, W) clips
                    seen.append(a.detach().float().cpu())

        if not isinstance(model, torch.nn.Module):
            return None
        handle = model.register_forward_pre_hook(pre, with_kwargs=True)
        try:
            with preserved_rng():
                setup.train_mode(state)
                setup.step(state, setup.batches(1)[0], 0)
        finally:
            handle.remove()
        return V.channel_stats(list(seen[0])) if seen else None

    try:
        stats = dlcheck.memo(setup.sources, "vision:step-inputs", run)
    except Exception:  # noqa: BLE001 - the step as the check calls it is only a second look at the inputs
        return None
    if stats is None or stats.min >= -0.01:
        return None
    return stats


def _maps_images(dlcheck: Any, name: str) -> str | None:
    """When the model maps an image to an image of its channels (a style-transfer, super-resolution or denoising
    net) and the sampled targets are neither masks nor boxes: what it gave, for the reason; else None. One forward of
    the model (``dlcheck_model``, or the model of fresh ``dlcheck_make_training`` objects) on one sampled image as the
    data gives it, in eval mode, on the fail path of the scale only."""
    sample = V.get_vision_sample(dlcheck, name, required=False)
    items = [i for i in (sample.items if sample is not None else []) if i.image is not None and not i.pil]
    if not items or any(i.kind in ("segmentation", "detection") for i in items):
        return None
    import torch

    from ...guard import eval_mode, preserved_rng

    def run() -> str | None:
        model = dlcheck.role("model")
        if model is MISSING:
            from ...training import find_setup
            from ...training.runs import unwrap_prepared

            setup = find_setup(dlcheck)
            model = unwrap_prepared(setup.state().get("model")) if setup is not None else None
        if not isinstance(model, torch.nn.Module):
            return None
        image = items[0].image
        device = V.model_device(model)
        dtype = next((p.dtype for p in model.parameters() if p.is_floating_point()), torch.float32)
        x = image.detach().to(device, dtype).unsqueeze(0)  # the pixels as the data gives them, not rescaled
        with preserved_rng(), eval_mode(model):
            out = V.output_tensor(model(x))
        if out is None or out.dim() != 4 or out.shape[1] != x.shape[1] or min(out.shape[-2:]) < 2:
            return None
        return (
            f"{type(model).__name__} maps a {tuple(x.shape[1:])} image to a {tuple(out.shape[1:])} image: an "
            "image-to-image network, whose input scale is the scale of the images it is trained to give, set by your "
            "loss and its targets, which V1 does not read"
        )

    try:
        return run()
    except Exception:  # noqa: BLE001 - one made-up forward: a model that needs other inputs is not this kind
        return None


#: how many standard errors of the per-image means a train/eval mean shift must exceed to be a scaling difference
SHIFT_Z = 4.0


def _content_noise(tr: Any, ev: Any) -> str | None:
    """When the per-channel difference of the train and eval means is within :data:`SHIFT_Z` standard errors of the
    sampled images' own per-image means (a difference of content a few images make), the words saying so; None
    when some channel's shift is beyond it (conclusive) or the per-image means are not known."""
    import math

    a, b = getattr(tr, "image_means", None), getattr(ev, "image_means", None)
    if not a or not b or len(a) < 2 or len(b) < 2:
        return None
    worst = 0.0
    for c in range(min(len(a[0]), len(b[0]))):
        xa, xb = [m[c] for m in a], [m[c] for m in b]
        ma, mb = sum(xa) / len(xa), sum(xb) / len(xb)
        va = sum((x - ma) ** 2 for x in xa) / (len(xa) - 1)
        vb = sum((x - mb) ** 2 for x in xb) / (len(xb) - 1)
        se = math.sqrt(va / len(xa) + vb / len(xb))
        if se <= 0:
            return None
        worst = max(worst, abs(ma - mb) / se)
    if worst >= SHIFT_Z:
        return None
    return f"{worst:.2f} standard errors of the sampled images' per-image means (a scaling difference is beyond {SHIFT_Z:g})"


def _in_unit(s: Split) -> bool:
    return s.stats.min >= -1e-6 and s.stats.max <= 1.0 + 1e-6


def _eval_unnormalised(fix: str) -> tuple[str, str]:
    return (
        "your eval images are not normalised: the train inputs are, the eval inputs stay in [0, 1], so the model is "
        "evaluated on inputs shifted from everything it trained on",
        f"add the train pipeline's normalisation to the eval transform: {fix} after ToDtype(torch.float32, "
        "scale=True) (define the stats once and use them in both)",
    )


def _judge_unit_range(
    s: Split,
    expected: V.DiffusionRange,
    band: float,
    judged: list[str],
    evidence: list[str],
    problems: list[tuple[str, str]],
    stats_line: Any,
) -> None:
    """A diffusion pipeline whose own image processor keeps images in [0, 1] (do_normalize=False: aMUSEd's VQ-GAN
    encodes [0, 1] images and its samples decode to [0, 1]): [0, 1] pixels pass, [-1, 1] or other statistics fail."""
    lo, hi = s.stats.min, s.stats.max
    if lo >= -band and hi <= 1 + band:
        judged.append(
            f"{s.name}: pixels range {lo:.3g} to {hi:.3g}, within [0, 1] (± {band:g}), the range its autoencoder "
            f"encodes: {expected.where}, so the pipeline hands it [0, 1] images"
        )
        return
    evidence.append(stats_line(s))
    if s.transform is not MISSING:
        evidence.append(f"{s.name} transform: {V.pipeline(V.image_transform(s.transform))}")
    what = (
        f"Normalize(mean=({V.fmt_seq(s.norm[0])}), std=({V.fmt_seq(s.norm[1])}))"
        if s.norm is not None
        else ("to [-1, 1]" if lo >= -1 - band and hi <= 1 + band else "a normalisation")
    )
    evidence.append(
        f"the pixels range {lo:.3g} to {hi:.3g}, outside [0, 1] (± {band:g}); {expected.where}: its autoencoder "
        "works on images in [0, 1]"
    )
    problems.append(
        (
            f"the images are normalised ({what}) but this pipeline's autoencoder encodes [0, 1] images: its image "
            "processor does not normalise (do_normalize=False) and its samples decode to [0, 1], so the model trains "
            "on codes of images outside the range the autoencoder was trained on and the pipeline never produces",
            "remove the Normalize: feed ToDtype(torch.float32, scale=True) (ToTensor()) images in [0, 1], as the "
            "pipeline's image processor does",
        )
    )


def _unscaled_cause(tf: Any) -> tuple[str, str]:
    leaves = [type(t).__name__ for t in V.walk_transforms(tf)] if tf is not MISSING else []
    dtypes = [t for t in V.walk_transforms(tf) if type(t).__name__ == "ToDtype"] if tf is not MISSING else []
    unscaled = [t for t in dtypes if not getattr(t, "scale", False)]
    fix = (
        "put ToDtype(torch.float32, scale=True) right after ToImage() (v1 transforms: ToTensor(), or "
        "ConvertImageDtype(torch.float) after PILToTensor()), before Normalize"
    )
    if unscaled:
        return ("ToDtype(torch.float32) without scale=True changes the dtype but keeps the 0–255 pixel values", fix)
    if ("ToImage" in leaves or "PILToTensor" in leaves) and not dtypes and "ConvertImageDtype" not in leaves:
        return ("ToImage()/PILToTensor() give uint8 tensors in 0–255 and nothing scales them to [0, 1]", fix)
    return ("the images reach the model as raw 0–255 pixel values: no step scales them to [0, 1]", fix)


def _undo(stats: Any, mean: list[float], std: list[float]) -> tuple[list[float], list[float]] | None:
    """Per-channel pixel range the inputs come from if they were normalised with (mean, std)."""
    c = len(stats.cmin)
    if not c:
        return None
    if len(mean) == 1 or len(std) == 1:
        mean, std = mean * c if len(mean) == 1 else mean, std * c if len(std) == 1 else std
    if len(mean) != c or len(std) != c:
        return None
    lo = [x * sd + m for x, m, sd in zip(stats.cmin, mean, std)]
    hi = [x * sd + m for x, m, sd in zip(stats.cmax, mean, std)]
    return lo, hi


def _implied(stats: Any) -> tuple[list[float], list[float]] | None:
    """The Normalize(mean, std) that maps [0, 1] pixels spanning the whole range onto the measured per-channel
    range: what the inputs look normalised with."""
    if not stats.cmin or any(hi - lo <= 1e-6 for lo, hi in zip(stats.cmin, stats.cmax)):
        return None
    std = [1.0 / (hi - lo) for lo, hi in zip(stats.cmin, stats.cmax)]
    return [-lo * sd for lo, sd in zip(stats.cmin, std)], std


def _channels(lo: list[float], hi: list[float]) -> str:
    names = "RGB" if len(lo) == 3 else [f"c{i}" for i in range(len(lo))]
    return ", ".join(f"{n} {a:.2f} to {b:.2f}" for n, a, b in zip(names, lo, hi))


def _legacy_timm_cfg(model: Any) -> str | None:
    """``timm default_cfg of X (mean=(..) std=(..)), with no pretrained_cfg`` when the model carries timm's legacy
    ``default_cfg`` with statistics and no ``pretrained_cfg`` that has them (a model built by hand and given the cfg
    after construction, as timm 0.3-era code does: ``model.default_cfg = _cfg()``); else None."""
    from collections.abc import Mapping

    if model is MISSING or model is None:
        return None
    cfg = getattr(model, "default_cfg", None)
    pretrained = getattr(model, "pretrained_cfg", None)
    if not isinstance(cfg, Mapping) or cfg.get("mean") is None or cfg.get("std") is None:
        return None
    if isinstance(pretrained, Mapping) and pretrained.get("mean") is not None:
        return None
    try:
        mean, std = [float(v) for v in cfg["mean"]], [float(v) for v in cfg["std"]]
    except (TypeError, ValueError):
        return None
    return (
        f"timm default_cfg of {type(model).__name__} (mean=({V.fmt_seq(mean)}) std=({V.fmt_seq(std)})), with no "
        "pretrained_cfg"
    )


def _judge_hidden(s: Split, declared: Any, band: float, min_span: float) -> tuple[list[str], str] | None:
    """Inputs normalised without a reachable Normalize (a ``with_transform`` function, a closure): undo the
    declared normalisation on the measured per-channel range; ([evidence], what is wrong) when [0, 1] pixels
    cannot give these inputs, None when they can (or there is nothing to measure)."""
    undone = _undo(s.stats, declared.mean, declared.std)
    if undone is None:
        return None
    lo, hi = undone
    span = max(b - a for a, b in zip(lo, hi))
    outside = min(lo) < -band or max(hi) > 1 + band
    if not outside and span >= min_span:
        return None
    evidence = [
        f"{s.name}: no Normalize object in the {s.name} pipeline (normalised in a function?); measured per-channel "
        f"mean ({V.fmt_seq(s.stats.mean)}) std ({V.fmt_seq(s.stats.std)}), range {_channels(s.stats.cmin, s.stats.cmax)}",
        f"the model declares mean=({V.fmt_seq(declared.mean)}) std=({V.fmt_seq(declared.std)}) ({declared.source}): "
        f"undone with these, the inputs come from pixels {_channels(lo, hi)}",
    ]
    if outside:
        what = f"outside [0, 1] (beyond ± {band:g}): [0, 1] images normalised with these statistics cannot give them"
    else:
        what = (
            f"a span of at most {span:.2f} in any channel (V1.min_pixel_span {min_span:g}): the inputs are squeezed, "
            "normalised with a larger std than declared"
        )
    evidence[-1] += f" — {what}"
    implied = _implied(s.stats)
    if implied is not None:
        evidence.append(
            f"the inputs fit Normalize(mean≈({', '.join(f'{v:.2f}' for v in implied[0])}), "
            f"std≈({', '.join(f'{v:.2f}' for v in implied[1])})) of pixels "
            "spanning [0, 1]"
        )
    return evidence, what


@check(
    "V1",
    domain="vision",
    title="input normalization mismatch or unscaled [0,255] pixels",
    optional_roles=(
        "dataset",
        "dataloader",
        "eval_dataset",
        "eval_dataloader",
        "train_transform",
        "eval_transform",
        "model",
        "weights",
        "image_processor",
    ),
    settings=(
        Setting(
            "max_abs_value",
            20.0,
            "an input value beyond this magnitude means 0–255 pixels: a [0, 1] image "
            "normalised with any std >= 0.05 stays below 20, while raw pixels reach ~255",
        ),
        Setting(
            "tolerance",
            0.02,
            "largest difference between Normalize mean/std values that still counts as "
            "equal: rounded ImageNet stats differ by < 0.005, CLIP's std differs from ImageNet's by 0.04",
        ),
        Setting(
            "max_split_shift",
            1.0,
            "without two Normalize transforms to compare, eval inputs whose per-channel "
            "mean moved by more than this many train stds count as differently normalised",
        ),
        Setting("max_split_std_ratio", 2.0, "… or whose per-channel std differs from train's by more than this factor"),
        Setting(
            "compare_declared",
            True,
            "compare with the normalisation the model declares (timm pretrained_cfg, "
            "image processor, torchvision weights); turn off for a from-scratch model",
        ),
        Setting(
            "pixel_range_tolerance",
            0.1,
            "without a Normalize object, inputs undone with the declared mean/std may leave [0, 1] by this much "
            "(resampling overshoot) before they count as normalised with other statistics; ImageNet-normalised "
            "inputs undone with 0.5/0.5 reach -0.56 and 1.82",
        ),
        Setting(
            "min_pixel_span",
            0.5,
            "without a Normalize object, the per-channel range of the inputs undone with the declared "
            "mean/std must span this much of [0, 1] in some channel: a few photos span nearly all of it, "
            "0.5/0.5-normalised inputs undone with ImageNet statistics span 0.46",
        ),
        Setting(
            "diffusion_range_tolerance",
            0.05,
            "a diffusion training's pixels may exceed [-1, 1] by this much (resampling overshoot) "
            "before they count as outside the range diffusers' VAEs and pipelines assume; ImageNet-normalised "
            "pixels reach -2.1 and 2.6",
        ),
    ),
)
def check_normalization(dlcheck):
    """Images reach the model scaled and normalised as the backbone expects, the same in train and eval.

    What it does
        Measures the per-channel mean/std and range of the sampled training and evaluation images (or video
        clips (C, T, H, W), every frame counted) as the model receives them (after the dataset's transform;
        without data, of synthetic images through
        dlcheck_train_transform / dlcheck_eval_transform). Fails when values reach the 0–255 range,
        when the Normalize mean/std differ from what the model declares (timm ``pretrained_cfg``, a
        transformers image processor, ``dlcheck_weights.transforms()``), when a torchvision detector —
        which normalises internally — gets already-normalised inputs, when a model that declares stats
        gets un-normalised [0, 1] inputs, and when train and eval normalise differently (an eval transform
        without the train transform's Normalize: "your eval images are not normalised"). When no Normalize
        object is reachable (a ``dataset.with_transform(fn)`` function, a closure) the measured per-channel
        range is undone with the declared mean/std: inputs that [0, 1] pixels cannot give (outside [0, 1],
        or squeezed into half of it) were normalised with other statistics. The declared statistics also
        come from the image processor saved beside a transformers model (its ``preprocessor_config.json``).
        Multi-view examples (a self-supervised pipeline's multi-crop transform returning a list of crops per image,
        collated into a list of (B, C, H, W) batches, one per view: SimCLR, BYOL, DINO, SwAV) count every view, and
        the evidence gives each view size's statistics (global and local crops).
    Why it is bad
        ``ToImage()`` gives uint8 and ``ToDtype(torch.float32)`` without ``scale=True`` keeps 0–255, so
        Normalize produces values in the hundreds: a pretrained backbone sees saturated garbage, and a
        fresh one trains on a badly conditioned input. A pretrained backbone fed other stats than it was
        trained with loses accuracy silently, and eval stats that differ from train shift every feature.
    Example
        T.Compose([T.ToImage(), T.ToDtype(torch.float32), T.Normalize(IMAGENET_MEAN, IMAGENET_STD)])
        eval_tf = T.Compose([..., T.Normalize([0.5] * 3, [0.5] * 3)])   # train used ImageNet stats
    Use instead
        T.Compose([T.ToImage(), T.ToDtype(torch.float32, scale=True), T.Normalize(mean, std)]) with the
        mean/std of ``timm.data.resolve_data_config({}, model=model)`` (or the weights' transforms), the
        same Normalize in the train and eval transforms; no Normalize before a torchvision detector.
        In a diffusion training (a diffusers pipeline, VAE, noise scheduler or denoiser among the roles)
        the pixels are judged against the range the pipeline's own image processor gives its autoencoder
        (``pipeline.image_processor.config.do_normalize``: True maps images to [-1, 1], False keeps [0, 1], as
        aMUSEd's VQ-GAN expects), else diffusers' convention, [-1, 1]; images outside that range fail.
    Known problems
        Channel order (BGR from OpenCV) is not detected. A timm model built with pretrained=False still
        declares its pretrained tag's stats: set V1.compare_declared=false when training from scratch
        with other stats. Needs tensor images from the data or a transform that accepts a PIL image.
        Without a declared normalisation (a model from scratch, no image processor or weights) only the
        scale and the train/eval agreement are judged. A timm model built by hand that carries timm's legacy
        ``default_cfg`` (given after construction, ``model.default_cfg = _cfg()``) and no ``pretrained_cfg``: the cfg
        describes the checkpoint timm's factory would load, and whether it was loaded cannot be told, so its
        statistics are named and not compared (a partly judged pass). Without a Normalize object the statistics are
        inferred from the measured range, assuming the pixels span most of [0, 1]: data of very low
        contrast can trip V1.min_pixel_span, and statistics close to the declared ones pass. 0–255 inputs to an
        image-to-image model (its output an image of the input's channels, the targets neither masks nor boxes: a
        style-transfer or super-resolution net) are not judged: the scale it should get is the scale of the images
        its loss trains it to give, which V1 does not read (one forward of the model, on that path only).
        Video clips are read with their channels first ((C, T, H, W), torchvision's video models' layout; a
        numpy (T, H, W, C) array too); clips with their frames first ((T, C, H, W), transformers' VideoMAE
        pixel_values) skip, saying so.
    Not applicable
        Data without images (token batches of a language model, tabular rows, RL observations), and a
        diffusion training whose batches hold precomputed latents rather than pixels (DF3 judges those).
    """
    splits = [s for s in (_split(dlcheck, "train"), _split(dlcheck, "eval")) if s is not None and s.stats is not None]
    if not splits:
        if dlcheck.has("dataset") or dlcheck.has("dataloader"):
            V.get_vision_sample(dlcheck, "train")  # data it cannot read says why (a video clip's layout), as a skip
        if any(dlcheck.has(r) for r in ("dataset", "dataloader", "train_transform")):
            dlcheck.skip(
                "V1 cannot decide: the training data yields no tensor image (PIL images without a tensor transform?) "
                "and no train transform turns a PIL image into one"
            )
        dlcheck.skip(V.missing_data_reason("train") + " (or dlcheck_train_transform)")
    declared = V.declared_normalization(dlcheck)
    tol, limit = dlcheck.setting("tolerance"), dlcheck.setting("max_abs_value")
    diffusion = V.diffusion_marker(dlcheck)
    evidence: list[str] = []
    problems: list[tuple[str, str]] = []  # (cause, fix)
    judged: list[str] = []  # what a pass measured, beyond the per-split statistics

    def stats_line(s: Split) -> str:
        line = f"{s.name}: {s.source}: {s.stats.describe()}"
        return line + "".join(f"; {x}" for x in s.per_size or [])

    if diffusion is not None:
        channels = {len(s.stats.mean) for s in splits}
        if not channels & {1, 3}:
            dlcheck.not_applicable(
                f"a diffusion training ({diffusion}) whose sampled tensors have {'/'.join(map(str, sorted(channels)))} "
                "channels: precomputed latents, not pixels (DF3 judges the latent scale)"
            )

    by = {s.name: s for s in splits}
    tr0 = by.get("train")
    train_normalised = ""  # the train inputs are normalised: the evidence line, when they are
    if tr0 is not None and tr0.stats.absmax <= limit:
        if tr0.norm is not None:
            train_normalised = f"the train transform applies Normalize(mean=({V.fmt_seq(tr0.norm[0])}), std=({V.fmt_seq(tr0.norm[1])}))"
        elif tr0.stats.min < -0.01:
            train_normalised = f"the train inputs are normalised (range {tr0.stats.min:.3g} to {tr0.stats.max:.3g})"

    unjudged: list[str] = []  # splits whose 0-255 scale an image-to-image model makes a choice, not judged
    for s in splits:
        if s.stats.absmax > limit and diffusion is None and (maps := _maps_images(dlcheck, s.name)) is not None:
            unjudged.append(f"{s.name}: {s.source}: |values| up to {s.stats.absmax:.3g}; {maps}")
            continue
        if s.stats.absmax > limit:
            evidence.append(stats_line(s))
            if s.transform is not MISSING:
                evidence.append(f"{s.name} transform: {V.pipeline(V.image_transform(s.transform))}")
            if s.norm is not None:
                mean, std, _ = s.norm
                lo = [s.stats.min * sd + m for m, sd in zip(mean, std)]
                hi = [s.stats.max * sd + m for m, sd in zip(mean, std)]
                evidence.append(
                    f"undoing its Normalize gives pixel values {min(lo):.1f} to {max(hi):.1f}: "
                    f"the images were never scaled to [0, 1]"
                )
            problems.append(_unscaled_cause(s.transform))
            continue
        if diffusion is not None:
            band = dlcheck.setting("diffusion_range_tolerance")
            lo, hi = s.stats.min, s.stats.max
            expected = V.diffusion_range(dlcheck, diffusion)
            if expected.unit:
                _judge_unit_range(s, expected, band, judged, evidence, problems, stats_line)
                continue
            where = expected.where
            if -1 - band <= lo < -band and hi <= 1 + band:
                judged.append(
                    f"{s.name}: pixels range {lo:.3g} to {hi:.3g}, within [-1, 1] (± {band:g}), the range "
                    + (
                        f"{where} maps images to"
                        if expected.read
                        else f"diffusers' VAEs and pipelines assume ({where})"
                    )
                )
                continue
            evidence.append(stats_line(s))
            if s.transform is not MISSING:
                evidence.append(f"{s.name} transform: {V.pipeline(V.image_transform(s.transform))}")
            if lo >= -band and hi <= 1 + band:
                evidence.append(
                    f"the pixels lie in [0, 1] ({lo:.3g} to {hi:.3g}); {where}, which works on images in [-1, 1]"
                )
                problems.append(
                    (
                        "the images are scaled to [0, 1] but diffusion models work on [-1, 1]: AutoencoderKL encodes "
                        "[-1, 1] images, and diffusers pipelines turn samples back into pictures with image / 2 + 0.5, "
                        "so a model trained on [0, 1] gives washed-out, shifted samples",
                        "append T.Normalize([0.5], [0.5]) after ToDtype(torch.float32, scale=True) (ToTensor()), as "
                        "diffusers' training scripts do, or feed image * 2 - 1",
                    )
                )
            else:
                evidence.append(
                    f"the pixels range {lo:.3g} to {hi:.3g}, outside [-1, 1] (± {band:g}); {where}, which works "
                    "on images in [-1, 1]"
                )
                what = (
                    f"Normalize(mean=({V.fmt_seq(s.norm[0])}), std=({V.fmt_seq(s.norm[1])}))"
                    if s.norm is not None
                    else "a normalisation"
                )
                problems.append(
                    (
                        f"the images are normalised with {what} (classification statistics) instead of to [-1, 1], "
                        "the range diffusion VAEs, schedulers (clip_sample) and pipelines assume",
                        "use T.Normalize([0.5], [0.5]) after ToDtype(torch.float32, scale=True) (ToTensor()), as "
                        "diffusers' training scripts do",
                    )
                )
            continue
        if declared is not None and declared.internal:
            if s.norm is not None or s.stats.min < -0.01:
                evidence.append(stats_line(s))
                what = (
                    f"its transform applies Normalize(mean=({V.fmt_seq(s.norm[0])}), std=({V.fmt_seq(s.norm[1])}))"
                    if s.norm is not None
                    else f"the inputs go down to {s.stats.min:.3g}, so they are already normalised"
                )
                evidence.append(
                    f"{s.name}: {what}; {declared.source} with mean=({V.fmt_seq(declared.mean)}) "
                    f"std=({V.fmt_seq(declared.std)})"
                )
                problems.append(
                    (
                        "the images are normalised twice: by the data transform and again inside the "
                        "torchvision detection model (GeneralizedRCNNTransform)",
                        "remove Normalize from the data transform and give the detector float images in "
                        "[0, 1] (T.ToDtype(torch.float32, scale=True)); set image_mean/image_std on the "
                        "model if you need other stats",
                    )
                )
            else:
                judged.append(
                    f"{s.name}: no Normalize in the transform and no negative input (min {s.stats.min:.3g}): "
                    f"{declared.source}"
                )
            continue
        if declared is not None and dlcheck.setting("compare_declared"):
            if s.norm is not None:
                mean, std, _ = s.norm
                if not (_close(mean, declared.mean, tol) and _close(std, declared.std, tol)):
                    evidence.append(f"{s.name} transform Normalize(mean=({V.fmt_seq(mean)}), std=({V.fmt_seq(std)}))")
                    evidence.append(
                        f"the model expects mean=({V.fmt_seq(declared.mean)}) std=({V.fmt_seq(declared.std)}) "
                        f"({declared.source})"
                    )
                    problems.append(
                        (
                            "the data is normalised with other statistics than the backbone was pretrained "
                            "with, so every input feature is shifted and scaled",
                            f"T.Normalize(mean={[round(v, 4) for v in declared.mean]}, "
                            f"std={[round(v, 4) for v in declared.std]}) in the train and eval transforms "
                            "(timm: timm.data.resolve_data_config({}, model=model))",
                        )
                    )
                else:
                    judged.append(
                        f"{s.name} transform Normalize(mean=({V.fmt_seq(mean)}), std=({V.fmt_seq(std)})) matches "
                        f"the model's ({declared.source}) within {tol:g}"
                    )
                continue
            identity = _close(declared.mean, [0.0], 1e-6) and _close(declared.std, [1.0], 1e-6)
            norm_fix = (
                f"T.Normalize(mean={[round(v, 4) for v in declared.mean]}, std={[round(v, 4) for v in declared.std]})"
            )
            hidden = (
                None
                if identity or _in_unit(s)
                else _judge_hidden(
                    s, declared, dlcheck.setting("pixel_range_tolerance"), dlcheck.setting("min_pixel_span")
                )
            )
            inside = _step_normalises(dlcheck) if not identity and _in_unit(s) and s.real else None
            if inside is not None:
                if s.name == "train":
                    # what the model receives, judged against the declared statistics as a hidden Normalize is
                    step = Split(
                        "train", "the model's inputs inside your dlcheck_train_step", inside, s.transform, None, True
                    )
                    wrong = _judge_hidden(
                        step, declared, dlcheck.setting("pixel_range_tolerance"), dlcheck.setting("min_pixel_span")
                    )
                    if wrong is not None:
                        evidence.append(stats_line(s) + "; your dlcheck_train_step normalises them before the model")
                        evidence += wrong[0]
                        problems.append(
                            (
                                "your train step normalises the images with other statistics than the model declares, "
                                "so every input feature is shifted and scaled from what the backbone was pretrained on",
                                f"normalise with the declared statistics in the step: (images - mean) / std with "
                                f"{norm_fix}'s mean and std",
                            )
                        )
                    else:
                        judged.append(
                            f"train: {s.source}: in [0, 1]; your dlcheck_train_step normalises them before the model, "
                            f"as the model declares ({declared.source}): the model receives {inside.describe()}"
                        )
                else:
                    dlcheck.not_judged(
                        s.name,
                        f"{s.source} yields images in [0, 1] and your train step normalises them inside the loop; "
                        "whether your evaluation does the same is not visible",
                    )
                continue
            if not identity and _in_unit(s) and s.real:
                evidence.append(stats_line(s))
                evidence.append(
                    f"the inputs are in [0, 1], not normalised; the model expects mean=({V.fmt_seq(declared.mean)}) "
                    f"std=({V.fmt_seq(declared.std)}) ({declared.source})"
                )
                if s.name == "eval" and train_normalised:
                    evidence.append(train_normalised)
                    problems.append(_eval_unnormalised(norm_fix))
                else:
                    problems.append(
                        (
                            "the images are scaled to [0, 1] but never normalised with the backbone's statistics",
                            f"append {norm_fix} to the train and eval transforms (a with_transform function: "
                            "normalise with image_processor.image_mean / image_std there)",
                        )
                    )
            elif hidden is not None:
                evidence += hidden[0]
                problems.append(
                    (
                        f"the {s.name} inputs are normalised with other statistics than the model declares, so "
                        "every input feature is shifted and scaled from what the backbone was pretrained on",
                        f"normalise with the declared statistics: {norm_fix} (with an image processor: "
                        "Normalize(mean=image_processor.image_mean, std=image_processor.image_std) in the "
                        "with_transform function, or image_processor(images, return_tensors='pt'))",
                    )
                )
            else:
                undone = _undo(s.stats, declared.mean, declared.std)
                judged.append(
                    f"{s.name}: no Normalize transform to compare with the model's mean=({V.fmt_seq(declared.mean)}) "
                    f"std=({V.fmt_seq(declared.std)}) ({declared.source}); the inputs are not raw [0, 1] "
                    f"(range {s.stats.min:.3g} to {s.stats.max:.3g})"
                    + (
                        f"; undone with the declared statistics they come from pixels {_channels(*undone)}, within "
                        f"[0, 1] (± {dlcheck.setting('pixel_range_tolerance'):g})"
                        if undone is not None and not identity
                        else ""
                    )
                )
        elif declared is not None:
            judged.append(f"{s.name}: the comparison with {declared.source} is off (V1.compare_declared=false)")

    tr, ev = by.get("train"), by.get("eval")
    if tr is not None and ev is not None and not problems:
        if train_normalised and ev.norm is None and _in_unit(ev):
            evidence.append(train_normalised)
            evidence.append(stats_line(tr))
            evidence.append(stats_line(ev))
            if ev.transform is not MISSING:
                evidence.append(f"eval transform: {V.pipeline(V.image_transform(ev.transform))} (no Normalize)")
            fix = (
                f"T.Normalize(mean={[round(v, 4) for v in tr.norm[0]]}, std={[round(v, 4) for v in tr.norm[1]]})"
                if tr.norm is not None
                else "the train pipeline's Normalize(mean, std)"
            )
            problems.append(_eval_unnormalised(fix))
        elif tr.norm is not None and ev.norm is not None:
            if not (_close(tr.norm[0], ev.norm[0], tol) and _close(tr.norm[1], ev.norm[1], tol)):
                evidence.append(
                    f"train transform Normalize(mean=({V.fmt_seq(tr.norm[0])}), std=({V.fmt_seq(tr.norm[1])}))"
                )
                evidence.append(
                    f"eval transform  Normalize(mean=({V.fmt_seq(ev.norm[0])}), std=({V.fmt_seq(ev.norm[1])}))"
                )
                evidence.append(stats_line(tr))
                evidence.append(stats_line(ev))
                problems.append(
                    (
                        "the eval transform normalises with other statistics than the train transform, so "
                        "the model is evaluated on inputs shifted from what it trained on",
                        f"use the same T.Normalize(mean={[round(v, 4) for v in tr.norm[0]]}, "
                        f"std={[round(v, 4) for v in tr.norm[1]]}) in the eval transform (define the stats once)",
                    )
                )
            else:
                judged.append(f"train and eval transforms apply the same Normalize (within {tol:g})")
        elif tr.real and ev.real and len(tr.stats.mean) == len(ev.stats.mean):
            shift = max(abs(a - b) / max(sd, 1e-6) for a, b, sd in zip(tr.stats.mean, ev.stats.mean, tr.stats.std))
            ratio = max(
                max(a, 1e-6) / max(b, 1e-6)
                for a, b in list(zip(tr.stats.std, ev.stats.std)) + list(zip(ev.stats.std, tr.stats.std))
            )
            noise = _content_noise(tr.stats, ev.stats)
            if shift > dlcheck.setting("max_split_shift") and ratio <= dlcheck.setting("max_split_std_ratio") and noise:
                # the means differ by no more than the sampled images' own spread allows: their content, not a scale
                dlcheck.not_judged(
                    "train vs eval scale",
                    f"the eval images' mean moved by {shift:.2f} train stds, within {noise}: the {tr.stats.n} and "
                    f"{ev.stats.n} sampled images differ by content as much, so a scaling difference is not conclusive",
                )
            elif shift > dlcheck.setting("max_split_shift") or ratio > dlcheck.setting("max_split_std_ratio"):
                evidence.append(stats_line(tr))
                evidence.append(stats_line(ev))
                evidence.append(f"eval mean moved by {shift:.2f} train stds; std ratio {ratio:.2f}")
                problems.append(
                    (
                        "train and eval inputs are scaled or normalised differently",
                        "apply the same ToDtype(scale=True) and Normalize(mean, std) in the eval transform "
                        "as in the train transform",
                    )
                )
            else:
                judged.append(
                    f"eval inputs' mean within {shift:.2f} train stds (limit {dlcheck.setting('max_split_shift'):g}), "
                    f"std ratio {ratio:.2f} (limit {dlcheck.setting('max_split_std_ratio'):g})"
                )
    if not problems and unjudged:
        dlcheck.skip(
            "V1 does not judge the scale of an image-to-image model's input: "
            + "; ".join(unjudged)
            + (f". Judged: {'; '.join(judged)}" if judged else "")
        )
    if not problems:
        absmax = max(s.stats.absmax for s in splits)
        if declared is None and diffusion is None:
            legacy = _legacy_timm_cfg(dlcheck.role("model"))
            if legacy is not None:
                judged.append(f"{legacy}: not compared with the Normalize")
                dlcheck.not_judged(
                    "the normalisation the model declares",
                    f"the model carries a {legacy}: set by hand on a model built without timm's factory, it describes "
                    "the checkpoint that factory would load, and whether those weights were loaded (then the Normalize "
                    "should match it) or the model trains from scratch (any statistics do) cannot be told",
                )
            else:
                judged.append(
                    "the model declares no normalisation (no timm pretrained_cfg or default_cfg, image processor or "
                    "dlcheck_weights): there are no declared statistics to compare with; the scale"
                    + (" and the train/eval agreement were" if len(splits) > 1 else " was")
                    + " judged"
                )
        head = splits[0]
        what = "video clips (every frame counted)" if any(s.video for s in splits) else "images"
        if any(s.per_size for s in splits):
            what += " (every view of the multi-view examples)"
        dlcheck.measured(
            f"{' + '.join(f'{s.stats.n} {s.name}' for s in splits)} {what}: |values| ≤ {absmax:.3g} (0–255 pixels "
            f"exceed {limit:g}); {head.name} per-channel mean ({V.fmt_seq(head.stats.mean)}) std "
            f"({V.fmt_seq(head.stats.std)})",
            *[stats_line(s) for s in splits],
            *judged,
            max_abs=round(absmax, 4),
            limit=limit,
            splits=[s.name for s in splits],
            mean={s.name: [round(v, 4) for v in s.stats.mean] for s in splits},
            std={s.name: [round(v, 4) for v in s.stats.std] for s in splits},
        )
        return
    cause, fix = problems[0]
    dlcheck.fail(evidence, cause, fix)
