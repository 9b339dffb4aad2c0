from __future__ import annotations

from typing import Any

import torch

from ...errors import MISSING
from ...registry import Setting, check
from . import measure as V


def _ignore_of(obj: Any) -> int | None:
    """The ignore index a loss declares (``ignore_index``; CrossEntropyLoss ignores -100 by default)."""
    if obj is MISSING or obj is None:
        return None
    v = getattr(obj, "ignore_index", None)
    if isinstance(v, torch.Tensor):
        v = int(v)
    return v if isinstance(v, int) else None


def _same(a: Any, b: Any) -> bool:
    """Whether two results of a metric's compute() are equal (tensors, numbers, and containers of them)."""
    if isinstance(a, torch.Tensor) or isinstance(b, torch.Tensor):
        if not (isinstance(a, torch.Tensor) and isinstance(b, torch.Tensor)) or a.shape != b.shape:
            return False
        a, b = a.detach().cpu(), b.detach().cpu()
        if a.is_floating_point() or b.is_floating_point():
            return bool(torch.allclose(a.double(), b.double(), rtol=1e-6, atol=1e-9, equal_nan=True))
        return bool(torch.equal(a, b))
    if isinstance(a, dict) and isinstance(b, dict):
        return a.keys() == b.keys() and all(_same(a[k], b[k]) for k in a)
    if isinstance(a, (list, tuple)) and isinstance(b, (list, tuple)):
        return len(a) == len(b) and all(_same(x, y) for x, y in zip(a, b))
    if isinstance(a, float) and isinstance(b, float) and a != a and b != b:
        return True  # both NaN
    return bool(a == b)


def _brief(value: Any) -> str:
    if isinstance(value, torch.Tensor):
        flat = value.detach().cpu().double().flatten()
        shown = ", ".join(f"{float(v):.4g}" for v in flat[:4]) + (", …" if flat.numel() > 4 else "")
        return f"[{shown}]" if flat.numel() != 1 or value.dim() else shown
    if isinstance(value, (list, tuple)):
        return "(" + ", ".join(_brief(v) for v in value[:3]) + (", …" if len(value) > 3 else "") + ")"
    if isinstance(value, dict):
        return "{" + ", ".join(f"{k}: {_brief(v)}" for k, v in list(value.items())[:3]) + "}"
    return f"{value:.4g}" if isinstance(value, float) else repr(value)[:60]


def _metric_on_void(metric: Any, mask: torch.Tensor, void: int, n: int) -> tuple[str, str]:
    """What the user's metric does with void pixels, measured on copies of it (the user's metric is not touched):
    one copy is updated with a sampled mask's pixels that are classes (0..n-1), the other with the same pixels
    and the mask's ``void`` pixels, against the same made-up prediction (the target's class, one pixel in three
    off by one, class 0 on void pixels); their compute() results are compared. Returns (verdict, evidence):
    ``ignores`` (equal results), ``counts`` (the result changes, or only the update with void pixels raises),
    ``unknown`` (the metric cannot be fed so, or the argument orders disagree). A torchmetrics Metric is called
    as documented, update(preds, target); another object (torchvision's references' ConfusionMatrix takes
    update(target, prediction)) both ways: only an order its clean update accepts is read."""
    import copy

    if not (callable(getattr(metric, "update", None)) and callable(getattr(metric, "compute", None))):
        return "unknown", f"{type(metric).__name__} has no update()/compute() to feed pixels to"
    device = getattr(metric, "device", None)
    device = device if isinstance(device, torch.device) else torch.device("cpu")
    target = mask.detach().flatten().long().cpu()
    is_void = target == void
    keep = (target >= 0) & (target < n)
    target = target[keep | is_void]
    appended = not bool(is_void.any())
    if appended:  # no void pixel in the sampled masks: a quarter as many are appended
        target = torch.cat([target, torch.full((max(1, target.numel() // 4),), void, dtype=torch.long)])
    is_void = target == void
    pred = torch.where(is_void, torch.zeros_like(target), target)
    off = (torch.arange(target.numel()) % 3 == 0) & ~is_void
    pred = torch.where(off, (pred + 1) % n, pred)
    fed = f"{target.numel()} pixels of a sampled mask, {int(is_void.sum())} of them {void}" + (
        " (appended)" if appended else ""
    )
    torchmetrics = type(metric).__module__.split(".")[0] == "torchmetrics"
    orders = [("update(preds, target)", False)] + ([] if torchmetrics else [("update(target, preds)", True)])
    found: dict[str, list[str]] = {"ignores": [], "counts": [], "raises": []}
    for name, swapped in orders:

        def feed(p: torch.Tensor, t: torch.Tensor) -> Any:
            m = copy.deepcopy(metric)
            p, t = p.to(device), t.to(device)
            m.update(*((t, p) if swapped else (p, t)))
            return m.compute()

        try:
            clean = feed(pred[~is_void], target[~is_void])
        except Exception:  # noqa: BLE001 - the user's metric refusing this order: the order is not read
            continue
        try:
            with_void = feed(pred, target)
        except Exception as exc:  # noqa: BLE001 - the user's metric raising on void pixels is the measurement
            found["raises"].append(f"{name} raises {type(exc).__name__}: {' '.join(str(exc).split())[:160]}")
            continue
        if _same(clean, with_void):
            found["ignores"].append(f"{name}: compute() gives {_brief(clean)} with or without the {void} pixels")
        else:
            found["counts"].append(
                f"{name}: compute() gives {_brief(clean)} without the {void} pixels, {_brief(with_void)} with them"
            )
    if found["ignores"] and not found["counts"]:
        return "ignores", f"{fed}: {found['ignores'][0]}"
    if found["counts"] and not found["ignores"]:
        return "counts", f"{fed}: {found['counts'][0]}"
    if torchmetrics and found["raises"]:
        return "counts", f"{fed}: {found['raises'][0]} (the update without them does not)"
    if not any(found.values()):
        return "unknown", f"{type(metric).__name__} takes neither update(preds, target) nor update(target, preds)"
    return "unknown", f"{fed}: " + "; ".join(found["ignores"] + found["counts"] + found["raises"])


def _ranges(values: list[int]) -> str:
    out, start, prev = [], None, None
    for v in values:
        if start is None:
            start = prev = v
        elif v == prev + 1:
            prev = v
        else:
            out.append(f"{start}" if start == prev else f"{start}–{prev}")
            start = prev = v
    if start is not None:
        out.append(f"{start}" if start == prev else f"{start}–{prev}")
    return ", ".join(out)


@check(
    "V5",
    domain="vision",
    title="segmentation mask values vs num_classes and ignore_index",
    optional_roles=("dataset", "dataloader", "model", "num_classes", "loss_fn", "ignore_index", "metric"),
    settings=(Setting("max_values_shown", 12, "distinct mask values listed in the evidence"),),
)
def check_segmentation_ignore(dlcheck):
    """Mask values are classes 0..C-1 or the ignore index, and the loss, metric and data agree on it.

    What it does
        Collects the distinct values of the sampled segmentation masks (tv_tensors.Mask, integer
        tensors, PIL masks) with their pixel shares (and fails at once when the targets come out as
        float images: masks that transforms v2 treated as a second image), and compares them with num_classes (dlcheck_num_classes,
        else the model's output channels) and with the ignore index of dlcheck_loss_fn (CrossEntropyLoss
        ignores -100 by default) and of dlcheck_ignore_index (the data's declared void value). What
        dlcheck_metric does with void pixels is measured, not read off an attribute: two copies of it are
        updated with a sampled mask's class pixels against a made-up prediction, one with the mask's void
        pixels too, and their compute() results compared (torchmetrics as update(preds, target); another
        object both ways, torchvision's references' ConfusionMatrix takes update(target, prediction)).
        Fails on a value that is neither a class nor ignored by the loss, on an ignore index that differs
        between loss and data, and on a metric whose result changes (or whose update raises, for
        torchmetrics) when the void pixels are added.
    Why it is bad
        VOC/Cityscapes-style masks mark void pixels 255. CrossEntropyLoss() ignores -100, so the void
        pixels are targets of class 255: an error ("Target 255 is out of bounds") or a CUDA device-side
        assert, or — with 256+ classes — void trained as a class. A metric that does not ignore void
        scores the model on unlabelled pixels. Masks resized bilinearly get in-between values that are
        no class at all.
    Example
        loss_fn = nn.CrossEntropyLoss()          # masks: 0..20 and 255 for void
    Use instead
        nn.CrossEntropyLoss(ignore_index=255), and the same ignore_index in the metric
        (MulticlassJaccardIndex(num_classes=21, ignore_index=255)); wrap masks as tv_tensors.Mask so v2
        transforms resize them with NEAREST.
    Known problems
        Without dlcheck_loss_fn or dlcheck_ignore_index a value outside 0..C-1 cannot be judged (skip).
        Only semantic masks (one class id per pixel) are read; instance masks of detection targets are not.
        A metric that takes no update(preds, target) / update(target, preds) of flat class maps, or whose
        two argument orders disagree, is not judged (the pass says "partly judged: metric").
    Not applicable
        Classification and detection data (no semantic masks), data without targets (a diffusion or
        self-supervised training), self-supervised multi-view examples (a list of augmented crops of each image, collated into one (B, C, H, W) batch per view: SimCLR, BYOL, DINO, SwAV), whose labels, when the dataset yields any, train no class output, vision-language batches, and data without images.
    """
    sample = V.get_vision_sample(dlcheck, "train")
    V.require_task(dlcheck, sample, ("segmentation",), "segmentation masks")
    as_image = [i for i in sample.of_kind("segmentation") if i.mask_as_image is not None]
    if as_image:
        it = as_image[0]
        t = it.mask_as_image
        vals = torch.unique(t)
        shown = ", ".join(f"{float(v):.3g}" for v in vals[:8]) + (" …" if vals.numel() > 8 else "")
        dlcheck.fail(
            [
                f"{len(as_image)} of {len(sample.items)} sampled targets are images, not masks: {it.where} target "
                f"is a {V.type_name(it.target)} {str(t.dtype).removeprefix('torch.')} {'×'.join(map(str, t.shape))} "
                f"with {vals.numel()} distinct values ({shown})"
            ],
            "the masks reach the transforms v2 as PIL images (or plain tensors), so they are treated as a second "
            "image: ToImage/ToDtype(scale=True)/Normalize rescale the class ids and resizing interpolates them",
            "wrap each mask as tv_tensors.Mask(torch.as_tensor(np.array(mask), dtype=torch.long)) before the "
            "transform (or torchvision.datasets.wrap_dataset_for_transforms_v2(dataset) for VOCSegmentation)",
        )
    masks = [i for i in sample.of_kind("segmentation") if i.mask is not None]
    if not masks:
        dlcheck.skip(f"no segmentation masks in {sample.source} (task: {sample.task})")
    n, where = V.num_classes(dlcheck, sample)
    if n is None:
        dlcheck.skip(
            "missing role: the number of classes is unknown: define fixture dlcheck_num_classes (or "
            "dlcheck_model) in conftest.py"
        )
    loss_fn, metric = dlcheck.role("loss_fn"), dlcheck.role("metric")
    loss_ignore = _ignore_of(loss_fn)
    declared = dlcheck.role("ignore_index")
    declared = None if declared is MISSING or declared is None else int(declared)

    float_masks = [i for i in masks if i.mask.is_floating_point()]
    counts: dict[float, int] = {}
    holder: dict[float, int] = {}
    total = 0
    for i in masks:
        vals, cnt = torch.unique(i.mask, return_counts=True)
        total += int(cnt.sum())
        for v, c in zip(vals.tolist(), cnt.tolist()):
            counts[v] = counts.get(v, 0) + c
            holder[v] = holder.get(v, 0) + 1
    values = sorted(counts)
    allowed = set(range(n))
    ignored = {v for v in (loss_ignore, declared) if v is not None}
    outside = [v for v in values if v not in allowed and v not in ignored]
    shown = values[: dlcheck.setting("max_values_shown")]
    found = ", ".join(f"{v:g}" if isinstance(v, float) else str(v) for v in shown) + (
        " …" if len(values) > len(shown) else ""
    )
    evidence = [f"mask values found in {len(masks)} sampled masks ({sample.source}): {found}"]

    def share(v: Any) -> str:
        return f"{v:g}: {100 * counts[v] / total:.1f}% of pixels, in {holder[v]} of {len(masks)} masks"

    loss_name = type(loss_fn).__name__ if loss_fn is not MISSING else None
    allowed_line = f"allowed: classes 0–{n - 1} (num_classes {n} from {where})"
    if loss_name:
        allowed_line += (
            f" and {loss_name}(ignore_index={loss_ignore})"
            if loss_ignore is not None
            else f" ({loss_name} ignores nothing)"
        )
    if declared is not None:
        allowed_line += f"; dlcheck_ignore_index={declared}"

    if float_masks:
        dlcheck.fail(
            evidence
            + [
                f"{float_masks[0].where}: the mask is {str(float_masks[0].mask.dtype).removeprefix('torch.')}, "
                "not an integer class map"
            ],
            "the mask went through an image conversion (ToDtype(scale=True)/ToTensor) that made it float",
            "wrap the mask as tv_tensors.Mask before the v2 transforms (they leave masks' dtype alone), or "
            "convert with torch.as_tensor(np.array(mask), dtype=torch.long)",
        )
    if outside:
        if loss_fn is MISSING and declared is None:
            dlcheck.skip(
                "missing role: define fixture dlcheck_loss_fn (or dlcheck_ignore_index) in conftest.py: the masks "
                f"contain {', '.join(map(str, outside[:5]))}, outside classes 0–{n - 1}, and V5 cannot tell whether "
                "the loss ignores it"
            )
        evidence.append(allowed_line)
        evidence += [f"  {share(v)}" for v in outside[:4]]
        non_int = [v for v in outside if float(v) != int(v)]
        big = [v for v in outside if v >= n]
        between = [v for v in outside if 0 < v < max(values)]
        if len(outside) == 1 and outside[0] in (255, -1) and loss_fn is not MISSING:
            v = outside[0]
            cause = (
                f"void pixels are {v} but {loss_name} ignores "
                f"{loss_ignore if loss_ignore is not None else 'nothing'}"
                f"{' (its default)' if loss_ignore == -100 else ''}: they become targets of class {v}, an "
                "out-of-bounds error (CUDA: device-side assert) or a class of its own"
            )
            fix = f"{loss_name}(ignore_index={v})" + (
                " and the same ignore_index in the metric" if metric is not MISSING else ""
            )
        elif non_int or (len(outside) > 2 and between and len(values) > n + 2):
            cause = (
                "the masks hold values between class ids: they were resized or rotated with bilinear "
                "interpolation, as if they were images"
            )
            fix = (
                "wrap masks as tv_tensors.Mask before the v2 transforms (NEAREST for masks), or pass "
                "interpolation=InterpolationMode.NEAREST when resizing them"
            )
        elif min(values) >= 1 and n in values and 0 not in values:
            cause = "the mask classes are 1-based (1..C) but the model predicts 0..C-1"
            fix = "subtract 1 from the mask classes (and map the void value to the loss's ignore_index)"
        else:
            cause = (
                f"mask values {', '.join(map(str, big[:5] or outside[:5]))} are neither a class of the "
                f"{n}-class head nor ignored by the loss"
            )
            fix = (
                f"set num_classes to cover them, remap them to 0..{n - 1}, or give the loss "
                f"ignore_index={outside[0]} if they mark void"
            )
        dlcheck.fail(evidence, cause, fix)

    # the ignore index must agree between data, loss and metric
    if declared is not None and loss_ignore is not None and declared != loss_ignore:
        dlcheck.fail(
            evidence + [allowed_line],
            f"the data marks void pixels {declared} but {loss_name} ignores {loss_ignore}",
            f"{loss_name}(ignore_index={declared})",
        )
    reference = loss_ignore if loss_ignore is not None and loss_ignore in counts else declared
    agree = []
    if metric is not MISSING and reference is not None:
        # what the metric does with void pixels, measured (an ignore_index attribute is not what decides it:
        # torchvision's ConfusionMatrix has none and keeps only 0 <= target < num_classes)
        mask = max(masks, key=lambda i: int((i.mask == reference).sum())).mask
        verdict, seen = _metric_on_void(metric, mask, reference, n)
        name = type(metric).__name__
        void_of = "ignored by the loss" if reference == loss_ignore else "dlcheck_ignore_index"
        if verdict == "counts":
            torchmetrics = type(metric).__module__.split(".")[0] == "torchmetrics"
            dlcheck.fail(
                evidence + [f"dlcheck_metric {name} fed {seen}", f"void value {reference} ({void_of})"],
                "the metric scores the void pixels that the loss ignores, so the reported mIoU/accuracy "
                "counts unlabelled regions (or the evaluation breaks on them)",
                f"{name}(..., ignore_index={reference})"
                if torchmetrics or hasattr(metric, "ignore_index")
                else f"leave out the target pixels equal to {reference} in {name}.update (keep only 0 <= target < "
                f"{n}, as torchvision's references' ConfusionMatrix does)",
            )
        if verdict == "ignores":
            agree.append(f"dlcheck_metric {name} ignores {reference} too: fed {seen}")
        else:
            dlcheck.not_judged("metric", f"dlcheck_metric {name}'s handling of void {reference} not measured: {seen}")
    elif metric is MISSING:
        agree.append("no dlcheck_metric: the metric's ignore_index was not compared")
    if declared is not None and loss_ignore is not None:
        agree.insert(0, f"the data's void value {declared} is the loss's ignore_index")
    void = [v for v in values if v in ignored]
    dlcheck.measured(
        f"{len(values)} mask values over {len(masks)} sampled masks: {len(values) - len(void)} classes within 0–{n - 1}"
        + (f", {', '.join(f'{v:g}' for v in void)} ignored" if void else ", nothing outside")
        + f" (num_classes {n} from {where})",
        evidence[0],
        allowed_line,
        *[f"  {share(v)}" for v in void],
        *agree,
        values=[float(v) for v in values],
        num_classes=n,
        masks=len(masks),
        ignore_index=loss_ignore if loss_ignore is not None else declared,
    )
