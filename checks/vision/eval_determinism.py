from __future__ import annotations

import math
from typing import Any

import torch

from ...errors import MISSING, RoleError
from ...guard import preserved_dataloader
from ...registry import Setting, check
from ...sampling import spread_positions
from . import measure as V

NORM_TYPES = (
    torch.nn.modules.batchnorm._BatchNorm,
    torch.nn.modules.dropout._DropoutNd,
    torch.nn.modules.instancenorm._InstanceNorm,
)


def _image_of(out: Any) -> Any:
    if isinstance(out, (tuple, list)) and out:
        out = out[0]
    elif isinstance(out, dict):
        out = next((out[k] for k in V.IMAGE_KEYS if k in out), None)
    img, _ = V.as_image(out)
    return img


def _transform_reads(dlcheck: Any, tol: float) -> tuple[list[str], str] | None:
    """Read the eval data twice at the same positions (or run the eval transform twice on one synthetic
    image): evidence lines of the differences, and what was compared (for a pass). None when there is no
    eval data or transform; not applicable when the eval examples hold no image."""
    ds = V.map_dataset(dlcheck, "eval")
    tf = dlcheck.role("eval_transform")
    role = "eval_dataset" if dlcheck.has("eval_dataset") else "eval_dataloader"
    reads: list[tuple[str, Any, Any]] = []
    if ds is not None and len(ds) > 0:
        for pos in spread_positions(len(ds), min(3, dlcheck.samples)):
            pair = []
            for seed in (1, 2):
                with V.seeded(seed):
                    pair.append(dlcheck.call(role, lambda p=pos: ds[p]))
            reads.append(
                (
                    f"dlcheck_{role}[{pos}]" if role == "eval_dataset" else f"dlcheck_eval_dataloader.dataset[{pos}]",
                    _image_of(pair[0]),
                    _image_of(pair[1]),
                )
            )
    elif tf is not MISSING:
        img = V.synthetic_pil()
        pair = []
        for seed in (1, 2):
            with V.seeded(seed):
                pair.append(dlcheck.call("eval_transform", lambda: V.apply_image_transform(tf, img)))
        reads.append(("dlcheck_eval_transform on one synthetic image", _image_of(pair[0]), _image_of(pair[1])))
    else:
        return None
    judged = [(w, a, b) for w, a, b in reads if a is not None and b is not None]
    if not judged:
        dlcheck.not_applicable(f"{reads[0][0]} holds no image: V2 judges an image pipeline's eval transform")
    lines = []
    worst = 0.0
    for where, a, b in judged:
        if a.shape != b.shape:
            lines.append(f"{where} read twice: shapes {tuple(a.shape)} and {tuple(b.shape)}")
            continue
        diff = (a.double() - b.double()).abs()
        worst = max(worst, float(diff.max()))
        if float(diff.max()) > tol:
            lines.append(
                f"{where} read twice: max |Δ| {float(diff.max()):.3g}, "
                f"{100 * float((diff > tol).double().mean()):.0f}% of pixel values differ"
            )
    what = judged[0][0] if len(judged) == 1 else f"{len(judged)} eval examples ({', '.join(w for w, _, _ in judged)})"
    compared = f"{what} read twice under different seeds: identical (max |Δ| {worst:.3g} ≤ {tol:g})"
    return lines, compared


def _zip_collate(batch: list) -> tuple:
    return tuple(zip(*batch))


def _inner_loader(loader: Any) -> tuple[str, Any] | None:
    """(attribute, DataLoader) when ``loader`` is not a torch DataLoader but wraps one (timm's ``PrefetchLoader``
    keeps it as ``.loader``; a custom class that moves or normalises batches in its ``__iter__``), else None."""
    from torch.utils.data import DataLoader

    if isinstance(loader, DataLoader) or not hasattr(loader, "__iter__") or not hasattr(loader, "__dict__"):
        return None
    for name, value in vars(loader).items():
        if isinstance(value, DataLoader):
            return name, value
    return None


def _rewrapped(wrapper: Any, name: str, bounded: Any) -> Any:
    """A shallow copy of the user's loader wrapper reading ``bounded`` in place of its own DataLoader (the wrapper
    itself is left as it was)."""
    import copy

    again = copy.copy(wrapper)
    setattr(again, name, bounded)
    return again


def _mode_problems(dlcheck: Any, model: Any, eval_fn: Any) -> tuple[list[str], str] | None:
    """Run the user's eval function (twice) with the model in train mode, as it is when called from a
    training loop; report modules that ran in training mode, BatchNorm statistics it moved, and
    outputs that differ between the two runs. Everything is restored afterwards."""
    from torch.utils.data import DataLoader, Subset

    split = "eval" if V.map_dataset(dlcheck, "eval") is not None or dlcheck.has("eval_dataloader") else "train"
    ds = V.map_dataset(dlcheck, split)
    user_loader = dlcheck.role("eval_dataloader" if split == "eval" else "dataloader")
    inner = _inner_loader(user_loader) if user_loader is not MISSING else None
    if ds is not None and len(ds) > 0:
        source = inner[1] if inner is not None else user_loader
        collate = getattr(source, "collate_fn", None) if source is not MISSING else None
        if collate is None:
            sample = V.get_vision_sample(dlcheck, split, required=False)
            if sample is not None and sample.task == "detection":
                collate = _zip_collate  # torchvision's detection convention: (images, targets) tuples
        loader = DataLoader(Subset(ds, spread_positions(len(ds), 2)), batch_size=2, shuffle=False, collate_fn=collate)
        if inner is not None:
            # the eval function gets the user's own loader: a wrapper (timm's PrefetchLoader) moves, converts and
            # normalises each batch in its __iter__; a copy of it reads the bounded loader in place of its own
            loader = _rewrapped(user_loader, inner[0], loader)
    elif user_loader is not MISSING:
        with preserved_dataloader(user_loader):
            batch = next(iter(user_loader), None)
        if batch is None:
            return None
        loader = [batch]
    else:
        return None

    modes = [(m, m.training) for m in model.modules()]
    state = {k: v.detach().clone() for k, v in model.state_dict().items()}
    bn = {
        n: m
        for n, m in model.named_modules()
        if isinstance(m, torch.nn.modules.batchnorm._BatchNorm) and m.track_running_stats and m.running_mean is not None
    }
    seen_training: dict[str, str] = {}
    outputs: list[list[Any]] = [[], []]
    run_index = [0]

    def pre_hook(name: str):
        def hook(mod: Any, args: Any) -> None:
            if mod.training:
                seen_training.setdefault(name, type(mod).__name__)

        return hook

    def out_hook(mod: Any, args: Any, out: Any) -> None:
        outputs[run_index[0]].extend(V.tensors_in(out))

    handles = [m.register_forward_pre_hook(pre_hook(n)) for n, m in model.named_modules() if isinstance(m, NORM_TYPES)]
    handles.append(model.register_forward_hook(out_hook))
    moved: list[tuple[str, float]] = []
    error = None
    raised_training = [False]
    try:
        for i, seed in enumerate((3, 4)):
            run_index[0] = i
            model.train()
            before = {n: m.running_mean.detach().clone() for n, m in bn.items()}
            with V.seeded(seed):
                try:
                    eval_fn(model, loader)
                except Exception as exc:  # noqa: BLE001 - reported below, as the user's error or as evidence
                    error = exc
                    raised_training[0] = model.training and "train" in str(exc).lower()
            if i == 0:
                for n, m in bn.items():
                    delta = (
                        float((m.running_mean.detach() - before[n]).abs().max()) if m.running_mean is not None else 0.0
                    )
                    if delta > 0:
                        moved.append((n, delta))
            if error is not None:
                break
    finally:
        for h in handles:
            h.remove()
        model.load_state_dict(state)
        for m, training in modes:
            m.training = training
    if error is not None and not seen_training and not raised_training[0]:
        raise RoleError("eval_fn", f"raised {type(error).__name__}: {error}") from error
    if not seen_training and not moved and error is None:
        hooked = sum(1 for m in model.modules() if isinstance(m, NORM_TYPES))
        d = V.max_abs_diff(outputs[0], outputs[1])
        same = (
            "two runs give identical outputs"
            if d == 0
            else "its outputs were not captured"
            if d is None
            else f"two runs' outputs differ by {'shape' if math.isinf(d) else f'{d:.3g}'}"
        )
        return [], (
            f"dlcheck_eval_fn called twice right after model.train(): 0 of {hooked} BatchNorm/Dropout/InstanceNorm "
            f"modules ran in training mode, no BatchNorm running mean moved ({len(bn)} tracked), {same}"
        )
    lines = []
    if seen_training:
        names = sorted(set(seen_training.values()))
        lines.append(
            f"dlcheck_eval_fn ran {len(seen_training)} {'/'.join(names)} modules in training mode "
            f"(e.g. {next(iter(seen_training))}), called after model.train() as in a training loop"
        )
    if moved:
        worst = max(moved, key=lambda x: x[1])
        lines.append(
            f"it moved the BatchNorm running_mean of {len(moved)} of {len(bn)} layers (max |Δ| {worst[1]:.3g} "
            f"in {worst[0]})"
        )
    if error is not None:
        lines.append(
            f"dlcheck_eval_fn raised {type(error).__name__}: {str(error)[:160]} — with the model still in "
            "training mode (called after model.train(), as in a training loop)"
        )
    else:
        d = V.max_abs_diff(outputs[0], outputs[1])
        if d is not None and d > 0:
            lines.append(
                "two runs on the same examples give different outputs (max |Δ| "
                f"{'shape differs' if math.isinf(d) else f'{d:.3g}'})"
            )
    return lines, ""


@check(
    "V2",
    domain="vision",
    title="random augmentation at eval, or eval without model.eval()",
    optional_roles=("eval_dataset", "eval_dataloader", "eval_transform", "model", "eval_fn"),
    settings=(
        Setting(
            "atol",
            1e-6,
            "largest pixel difference between two reads of one eval example that still counts "
            "as identical (deterministic transforms reproduce exactly)",
        ),
    ),
)
def check_eval_determinism(dlcheck):
    """Evaluation is deterministic: the eval transform has no randomness and the model runs in eval mode.

    What it does
        Reads up to 3 evaluation examples twice each under different seeds (dlcheck_eval_dataset, or the
        eval dataloader's dataset; else runs dlcheck_eval_transform twice on one synthetic image) and
        fails when the two reads differ, naming the random transforms found in the eval transform. With
        dlcheck_model and dlcheck_eval_fn, calls eval_fn(model, loader) twice on 2 eval examples right
        after model.train() (as a training loop would; ``loader`` is your eval loader over those 2 examples,
        with its collate_fn, inside your own loader wrapper when the eval loader is one, such as timm's
        PrefetchLoader that converts and normalises the batches), with hooks on every BatchNorm/Dropout module:
        fails when any ran in training mode or a BatchNorm running mean moved. The model's weights,
        buffers and modes are restored.
    Why it is bad
        A random crop or flip at eval makes the metric noisy and biased (objects cropped away), and a
        model evaluated in training mode uses batch statistics and active dropout — and updates its
        BatchNorm running statistics with eval data, corrupting the model it is measuring. A train/eval
        split made with random_split of one dataset shares the train transform silently.
    Example
        eval_tf = T.Compose([T.ToImage(), T.RandomResizedCrop(224), T.ToDtype(torch.float32, scale=True)])
        def evaluate(model, loader):          # no model.eval()
            with torch.no_grad(): return [model(x) for x, _ in loader]
    Use instead
        eval_tf = T.Compose([T.ToImage(), T.Resize(256), T.CenterCrop(224), T.ToDtype(torch.float32, scale=True), T.Normalize(...)])
        (timm: create_transform(**cfg, is_training=False)); give the eval split its own dataset object;
        call model.eval() (and torch.inference_mode()) at the start of evaluate, model.train() after.
    Known problems
        Test-time augmentation on purpose should ignore V2. Without dlcheck_eval_fn the eval-mode half is
        not checked: the model's mode during your eval loop cannot be seen otherwise.
    Not applicable
        Data without images (a language model's token batches, tabular rows), and a diffusion training
        without eval data: it evaluates by sampling, with no eval split or eval transform.
    """
    tol = dlcheck.setting("atol")
    model, eval_fn = dlcheck.role("model"), dlcheck.role("eval_fn")
    has_eval = any(dlcheck.has(r) for r in ("eval_dataset", "eval_dataloader", "eval_transform"))
    if not has_eval and not (model is not MISSING and eval_fn is not MISSING):
        marker = V.diffusion_marker(dlcheck)
        if marker is not None:
            dlcheck.not_applicable(
                f"a diffusion training ({marker}) without eval data: it evaluates by sampling, with no eval "
                "split or eval transform"
            )
        V.get_vision_sample(dlcheck, "train", required=False)  # not applicable when the data holds no image
    reads = _transform_reads(dlcheck, tol)
    mode = _mode_problems(dlcheck, model, eval_fn) if model is not MISSING and eval_fn is not MISSING else None
    if reads is None and mode is None:
        if has_eval:
            # the eval data is given: data without images is not V2's (said so), never a missing role
            V.get_vision_sample(dlcheck, "eval", required=False)
            V.get_vision_sample(dlcheck, "train", required=False)
            dlcheck.skip(
                "V2 could not read the eval examples twice (nor an eval transform to run on an image); "
                + (
                    "dlcheck_model + dlcheck_eval_fn would let it check model.eval()"
                    if model is MISSING or eval_fn is MISSING
                    else "your eval function's model mode was not measured"
                )
            )
        dlcheck.skip(
            "missing role: define fixture dlcheck_eval_dataloader or dlcheck_eval_dataset (or "
            "dlcheck_eval_transform); dlcheck_model + dlcheck_eval_fn to check model.eval()"
        )
    evidence: list[str] = []
    cause = fix = ""
    if reads is not None and reads[0]:
        evidence += reads[0]
        tf = dlcheck.role("eval_transform")
        randoms = V.random_transforms(tf) if tf is not MISSING else []
        if randoms:
            evidence.append("random transforms in the eval transform: " + "; ".join(V.short(r, 70) for r in randoms))
        train_ds, eval_ds = V.map_dataset(dlcheck, "train"), V.map_dataset(dlcheck, "eval")
        shared = (
            train_ds is not None
            and eval_ds is not None
            and train_ds is not eval_ds
            and V.base_dataset(train_ds) is V.base_dataset(eval_ds)
        )
        if shared:
            evidence.append("the eval and train splits are Subsets of one dataset object, so they share its transform")
            cause = (
                "the eval split is a Subset of the training dataset (random_split) and inherits its random augmentation"
            )
            fix = (
                "build the eval dataset separately with a deterministic transform (e.g. two dataset objects with "
                "transform=train_tf / eval_tf, then Subset each with the same indices)"
            )
        elif (
            tf is MISSING
            and eval_ds is not None
            and all(getattr(V.base_dataset(eval_ds), a, None) is None for a in ("transform", "transforms"))
        ):
            # no transform to blame: the dataset's own __getitem__ draws (a siamese pair, a sampled crop)
            evidence.append(
                f"the eval dataset ({type(V.base_dataset(eval_ds)).__name__}) has no transform: the draw is in the "
                "dataset itself"
            )
            cause = (
                "the eval dataset draws at random on every read of an index (its __getitem__ picks a pair, an offset "
                "or a sample from a random generator), so each evaluation scores other examples"
            )
            fix = (
                "draw the eval examples once, with a seeded generator, when the eval dataset is built (e.g. the pairs "
                "in __init__ from random.Random(seed)), so that index i is the same example on every pass"
            )
        else:
            what = ", ".join(sorted({type(r).__name__ for r in randoms})) or "a random transform"
            cause = f"the eval transform applies {what}, so the same image gives a different input on every pass"
            fix = (
                "use a deterministic eval transform: T.Resize(size) + T.CenterCrop(crop) instead of "
                "RandomResizedCrop, no flips/jitter (timm: create_transform(**data_cfg, is_training=False))"
            )
    if mode is not None and mode[0]:
        evidence += mode[0]
        m_cause = (
            "the eval function runs the model in training mode: BatchNorm uses batch statistics and updates "
            "its running stats with eval data, dropout stays active"
        )
        m_fix = (
            "call model.eval() at the start of the eval function (with torch.inference_mode()), and "
            "model.train() again before training resumes"
        )
        cause = f"{cause}; and {m_cause}" if cause else m_cause
        fix = f"{fix}; and {m_fix}" if fix else m_fix
    if evidence:
        dlcheck.fail(evidence, cause, fix)
    lines = [x for x in (reads[1] if reads else "", mode[1] if mode else "") if x]
    if reads is None:
        lines.append("the eval transform was not checked: define dlcheck_eval_dataset or dlcheck_eval_transform")
    if mode is None:
        lines.append(
            "model.eval() was not checked: "
            + (
                "no eval batch to call dlcheck_eval_fn on"
                if model is not MISSING and eval_fn is not MISSING
                else "define dlcheck_model and dlcheck_eval_fn"
            )
        )
    dlcheck.measured(
        *lines,
        eval_reads_identical=reads is not None,
        eval_fn_in_eval_mode=mode is not None,
    )
