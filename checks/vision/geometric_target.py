from __future__ import annotations

import copy
from collections.abc import Mapping
from typing import Any

import torch

from ...errors import MISSING
from ...guard import preserved_rng
from ...registry import Setting, check
from . import measure as V

W, H = 128, 96
OBJECT = (12, 12, 44, 40)  # xyxy, away from the centre so flips and rotations move it
BG, FG = 40, 220


def _synthetic_image() -> Any:
    from PIL import Image, ImageDraw

    img = Image.new("RGB", (W, H), (BG, BG, BG))
    x1, y1, x2, y2 = OBJECT
    ImageDraw.Draw(img).rectangle((x1, y1, x2 - 1, y2 - 1), fill=(FG, FG, FG))
    return img


def _object_mask() -> Any:
    m = torch.zeros(H, W, dtype=torch.uint8)
    x1, y1, x2, y2 = OBJECT
    m[y1:y2, x1:x2] = 1
    return m


def _like_boxes(template: Any, fmt: str | None, declared: tuple[str, bool] | None) -> Any:
    from torchvision import tv_tensors
    from torchvision.ops import box_convert

    box = torch.tensor([OBJECT], dtype=torch.float32)
    if isinstance(template, tv_tensors.BoundingBoxes):
        f = V._fmt_name(template.format)
        data = box_convert(box, "xyxy", f) if f in V.BOX_FORMATS else box
        return tv_tensors.BoundingBoxes(data.to(template.dtype), format=template.format, canvas_size=(H, W))
    f, normalized = declared or (fmt or "xyxy", False)
    data = box_convert(box, "xyxy", f) if f != "xyxy" else box
    if normalized:
        data = data / torch.tensor([W, H, W, H])
    return data.to(template.dtype) if isinstance(template, torch.Tensor) else data


def _like_mask(template: Any) -> Any:
    from torchvision import tv_tensors

    m = _object_mask()
    if isinstance(template, tv_tensors.Mask):
        return tv_tensors.Mask(m.to(template.dtype) if template.ndim == 2 else m[None].to(template.dtype))
    if V._is_pil(template):
        from PIL import Image

        return Image.fromarray(m.numpy(), "L")
    if isinstance(template, torch.Tensor):
        return m.to(template.dtype) if template.ndim == 2 else m[None].to(template.dtype)
    return tv_tensors.Mask(m)


def _synthetic_target(item: V.Item, declared: tuple[str, bool] | None) -> Any:
    """A target for the synthetic image with the same structure and types as a sampled one."""
    t = item.target
    if item.kind == "detection":
        if isinstance(t, Mapping):
            out = dict(t)
            key = next(k for k in ("boxes", "bboxes", "bbox") if k in t)
            out[key] = _like_boxes(t[key], item.box_format, declared)
            for lk in ("labels", "label", "class_labels"):
                if lk in t:
                    lab = torch.as_tensor(V._plain(t[lk]))
                    out[lk] = lab.reshape(-1)[:1].clone() if lab.numel() else torch.ones(1, dtype=torch.int64)
            for mk in ("masks",):
                if mk in t and isinstance(t[mk], torch.Tensor) and t[mk].ndim == 3:
                    out[mk] = (
                        type(t[mk])(_object_mask()[None].to(t[mk].dtype))
                        if type(t[mk]) is not torch.Tensor
                        else _object_mask()[None].to(t[mk].dtype)
                    )
            if "area" in t:
                out["area"] = torch.tensor([float((OBJECT[2] - OBJECT[0]) * (OBJECT[3] - OBJECT[1]))])
            if "iscrowd" in t:
                out["iscrowd"] = torch.zeros(1, dtype=torch.int64)
            return out
        return _like_boxes(t, item.box_format, declared)
    if item.kind == "segmentation":
        if isinstance(t, Mapping):
            out = dict(t)
            key = next(
                k
                for k in ("mask", "masks", "semantic_mask", "segmentation", "label_mask", "labels", "label", "target")
                if k in t
            )
            out[key] = _like_mask(t[key])
            return out
        return _like_mask(t)
    return None


def _object_extent(img: Any) -> Any:
    """The bright synthetic object in a transformed image: a boolean (H, W) map, or None when the image is
    uniform (the object was cropped away, or fills it)."""
    x = img.double()
    score = x.sum(0) if x.ndim == 3 else x
    lo, hi = float(score.min()), float(score.max())
    if hi - lo < 1e-3 * max(1.0, abs(hi)):
        return None
    found = score > (lo + hi) / 2
    if float(found.double().mean()) > 0.6:
        return None  # "brighter than the middle" covers most of the image: it is not the object (e.g. erased)
    return found


def _box_of(pixels: Any) -> list[float]:
    ys, xs = torch.nonzero(pixels, as_tuple=True)
    return [float(xs.min()), float(ys.min()), float(xs.max()) + 1, float(ys.max()) + 1]


def _target_region(out_target: Any, declared: tuple[str, bool] | None, size: tuple[int, int]) -> tuple[str, Any] | None:
    """('box', xyxy) or ('mask', bool map) of the transformed synthetic target."""
    probe = V.Item(None, out_target, "synthetic")
    probe.canvas = None
    V.parse_target(probe, out_target)
    if probe.boxes is not None:
        if not len(probe.boxes):
            return "box", None
        fmt = probe.box_format or (declared[0] if declared else "xyxy")
        normalized = bool(declared and declared[1]) and probe.box_format is None
        return "box", V.to_xyxy(probe.boxes[:1], fmt, probe.canvas or size, normalized)[0]
    if probe.mask is not None:
        return "mask", probe.mask > 0
    return None


def _iou_boxes(a: list[float], b: Any) -> float:
    from torchvision.ops import box_iou

    return float(box_iou(torch.tensor([a]), b.reshape(1, 4).float())[0, 0])


class _Rejected(Exception):
    pass


def _wrapped_boxes_follow(dlcheck: Any, tf: Any, template: V.Item) -> bool:
    """The train transform moves boxes with the image when they come as tv_tensors.BoundingBoxes."""
    import dataclasses

    from torchvision import tv_tensors

    t = template.target
    key = next((k for k in ("boxes", "bboxes", "bbox") if isinstance(t, Mapping) and k in t), None)
    if key is None or not isinstance(t[key], torch.Tensor):
        return False
    wrapped = dict(t)
    wrapped[key] = tv_tensors.BoundingBoxes(t[key].reshape(-1, 4), format="XYXY", canvas_size=(H, W))
    try:
        bad, judged, _ = _synthetic_trials(
            dlcheck, tf, dataclasses.replace(template, target=wrapped), dlcheck.setting("trials"), []
        )
    except _Rejected:
        return False
    return judged > 0 and not bad


def _wrapped_masks_follow(dlcheck: Any, tf: Any, template: V.Item) -> bool:
    """The train transform moves a mask with the image when it comes as tv_tensors.Mask (a pipeline that wraps its
    masks before the transform and hands on plain tensors after it: transformers' segmentation examples)."""
    import dataclasses

    from torchvision import tv_tensors

    t = template.target
    if isinstance(t, Mapping):
        key = next((k for k in MASK_KEYS if k in t and isinstance(t[k], torch.Tensor)), None)
        if key is None:
            return False
        wrapped: Any = dict(t)
        wrapped[key] = tv_tensors.Mask(t[key])
    elif isinstance(t, torch.Tensor):
        wrapped = tv_tensors.Mask(t)
    else:
        return False
    try:
        bad, judged, _ = _synthetic_trials(
            dlcheck, tf, dataclasses.replace(template, target=wrapped), dlcheck.setting("trials"), []
        )
    except _Rejected:
        return False
    return judged > 0 and not bad


MASK_KEYS = ("mask", "masks", "semantic_mask", "segmentation", "label_mask", "labels", "label", "target")


def _synthetic_trials(
    dlcheck: Any, tf: Any, template: V.Item, trials: int, ious: list[float]
) -> tuple[list[str], int, str]:
    """Pass the synthetic (image, target) through ``tf`` ``trials`` times; (evidence of the trials whose
    target left the object, trials judged, 'box' or 'mask'); every trial's IoU is appended to ``ious``."""
    declared = V.parse_box_format(dlcheck.role("box_format"))
    bad: list[str] = []
    judged = 0
    kind = ""
    for trial in range(trials):
        image, target = _synthetic_image(), _synthetic_target(template, declared)
        with V.seeded(trial):
            try:
                out = tf(image, copy.deepcopy(target))
            except Exception as exc:  # noqa: BLE001 - a transform that wants other input types: cannot judge
                raise _Rejected(f"{type(exc).__name__}: {str(exc)[:120]}") from exc
        if not (isinstance(out, (tuple, list)) and len(out) == 2):
            return [], 0, ""
        out_img, _ = V.as_image(out[0])
        if out_img is None:
            return [], 0, ""
        size = (int(out_img.shape[-2]), int(out_img.shape[-1]))
        region = _target_region(out[1], declared, size)
        if region is None:
            return [], 0, ""
        kind = region[0]
        obj = _object_extent(out_img)
        if obj is None:
            continue  # uniform image: the object fills it or was cropped away; undecidable
        judged += 1
        if kind == "box":
            box = region[1]
            if box is None or float((box[2] - box[0]) * (box[3] - box[1])) <= 0:
                iou = 0.0
                where = "no box"
            else:
                iou = _iou_boxes(_box_of(obj), box)
                where = f"box {V.fmt_box(box)}"
            ious.append(iou)
            if iou < dlcheck.setting("min_iou"):
                bad.append(
                    f"trial {trial}: the object is at {V.fmt_box(_box_of(obj))} in the {size[1]}×{size[0]} "
                    f"output but the target has {where} (IoU {iou:.2f})"
                )
        else:
            mask = region[1]
            if mask.shape != obj.shape:
                bad.append(
                    f"trial {trial}: the output image is {size[1]}×{size[0]} but the mask is "
                    f"{mask.shape[-1]}×{mask.shape[-2]}"
                )
                continue
            inter = float((mask & obj).sum())
            union = float((mask | obj).sum())
            iou = inter / union if union else 1.0
            ious.append(iou)
            if iou < dlcheck.setting("min_iou"):
                mbox = _box_of(mask) if mask.any() else None
                bad.append(
                    f"trial {trial}: the object covers {V.fmt_box(_box_of(obj))} in the output but the mask "
                    f"covers {V.fmt_box(mbox) if mbox else 'nothing'} (IoU {iou:.2f})"
                )
    return bad, judged, kind


def _image_relation(a: Any, b: Any) -> tuple[str | None, float, float]:
    """How read ``b`` of an image relates to read ``a``: 'same', mirrored 'horizontally' / 'vertically', or None
    (another geometry, other sizes, or undecidable); with the correlations before and after flipping back."""
    if a.shape != b.shape:
        return None, 0.0, 0.0
    x = a.double().flatten()

    def corr(y: Any) -> float:
        c = float(torch.corrcoef(torch.stack([x, y.double().flatten()]))[0, 1])
        return c if c == c else 0.0  # a constant image gives nan

    c_same = corr(b)
    if c_same > 0.95:
        return "same", c_same, c_same
    for dim, name in ((-1, "horizontally"), (-2, "vertically")):
        c_flip = corr(b.flip(dim))
        if c_flip > 0.95 and c_same < 0.8:
            return name, c_same, c_flip
    return None, c_same, 0.0


def _mask_relation(a: Any, b: Any) -> str | None:
    """How read ``b`` of a mask relates to read ``a``: 'same', mirrored 'horizontally' / 'vertically', 'other',
    or None when that cannot be told (other sizes, a mask symmetric under the flip)."""
    if a.shape != b.shape:
        return None

    def agree(y: Any) -> float:
        return float((a == y).double().mean())

    same = agree(b)
    for dim, name in ((-1, "horizontally"), (-2, "vertically")):
        if agree(a.flip(dim)) >= 0.98:
            continue  # symmetric under this flip: the flip cannot be seen
        if agree(b.flip(dim)) >= 0.98 and same < 0.98:
            return name
    if same >= 0.98:
        return "same" if agree(a.flip(-1)) < 0.98 or agree(a.flip(-2)) < 0.98 else None
    return "other"


def _content_box(a: Any, b: Any) -> tuple[int, int, int, int] | None:
    """(top, bottom, left, right) of two reads of an image without the border rows and columns that are one
    constant value, the same in both reads (the band a pad-to-crop-size fills: torchvision's references pad the
    image with 0 and the mask with 255 after the flip, so the band stays where it is while the content is
    mirrored). Both reads' content lies inside; a pure flip of the whole image keeps the box symmetric, so it
    is still a flip inside it. None when nothing but such bands is left."""
    if a.shape != b.shape or a.ndim < 2:
        return None

    def flat(x: Any, line: int, rows: bool) -> Any:
        return (x[..., line, :] if rows else x[..., :, line]).reshape(*x.shape[:-2], -1)

    def band(line: int, rows: bool) -> bool:
        la, lb = flat(a, line, rows), flat(b, line, rows)
        first = la[..., :1]
        return bool((la == first).all() and (lb == first).all())

    top, bottom, left, right = 0, a.shape[-2], 0, a.shape[-1]
    while top < bottom and band(top, True):
        top += 1
    while bottom > top and band(bottom - 1, True):
        bottom -= 1
    while left < right and band(left, False):
        left += 1
    while right > left and band(right - 1, False):
        right -= 1
    if bottom - top < 2 or right - left < 2:
        return None
    return top, bottom, left, right


def _flip_rereads(dlcheck: Any, ds: Any, items: list[V.Item], reads: int) -> tuple[list[str], list[str], bool]:
    """Read the same example several times. An image that comes back mirrored while its target stays put is a
    flip applied to the image only; a mask whose geometry relative to the first read differs from its image's
    (the image mirrored and the mask not, or the reverse) gets its own random draw. Returns (evidence, the
    examples compared, whether the evidence is of independent draws: the masks move too, on their own)."""
    role = "dataset" if dlcheck.has("dataset") else "dataloader"
    compared: list[str] = []
    judged = mismatched = 0
    moves = False  # some re-read's mask is not the first read's: the mask has a random draw of its own
    shown: list[str] = []
    for it in items[:2]:
        if it.position is None:
            continue
        got = []
        for seed in range(reads):
            with V.seeded(100 + seed):
                got.append(V.make_item(dlcheck.call(role, lambda p=it.position: ds[p]), f"read {seed}", it.position))
        base = got[0]
        if base.image is None or base.pil:
            continue
        name = f"dlcheck_{role}[{it.position}]" if role == "dataset" else f"dlcheck_dataloader.dataset[{it.position}]"
        pairs = 0
        for k, other in enumerate(got[1:], start=1):
            if other.image is None or other.image.shape != base.image.shape:
                continue
            pairs += 1
            box = _content_box(base.image, other.image)
            if box is None:
                continue
            top, bottom, left, right = box
            img_a, img_b = base.image[..., top:bottom, left:right], other.image[..., top:bottom, left:right]
            rel, c_same, c_flip = _image_relation(img_a, img_b)
            if rel in ("horizontally", "vertically") and (base.mask is None or other.mask is None):
                same_target = _same_target(base, other)
                if same_target:
                    return (
                        [
                            f"dlcheck_{role}[{it.position}] read {reads} times: one read is the other mirrored "
                            f"{rel} (correlation {c_flip:.2f} after flipping back, {c_same:.2f} before) but its target is "
                            f"identical: {same_target}"
                        ],
                        compared,
                        False,
                    )
            if rel is None or base.mask is None or other.mask is None:
                continue
            mask_a, mask_b = base.mask, other.mask
            if mask_a.shape[-2:] == base.image.shape[-2:] == mask_b.shape[-2:]:
                # the image's content box, on the mask too: the mask's pad band (255) stays out of the comparison
                mask_a, mask_b = mask_a[..., top:bottom, left:right], mask_b[..., top:bottom, left:right]
            mrel = _mask_relation(mask_a, mask_b)
            if mrel is None:
                continue
            judged += 1
            moves = moves or mrel != "same"
            if mrel != rel:
                mismatched += 1
                img_says = "identical to" if rel == "same" else f"mirrored {rel} relative to"
                mask_says = (
                    "identical to"
                    if mrel == "same"
                    else f"mirrored {mrel} relative to"
                    if mrel != "other"
                    else "moved differently from"
                )
                shown.append(f"  {name} read {k}: the image is {img_says} read 0, the mask is {mask_says} read 0's")
        if pairs:
            compared.append(name)
    if mismatched:
        return (
            [
                f"{len(compared)} examples read {reads} times each: in {mismatched} of {judged} re-reads "
                f"({100 * mismatched / judged:.0f}%) the mask no longer matches the image (the image's geometry "
                "relative to the first read differs from the mask's)",
                *shown[:3],
            ],
            compared,
            moves,
        )
    if judged:
        compared = [
            c + f" ({judged} re-reads: every mask moved exactly as its image)" for c in compared[:1]
        ] + compared[1:]
    return [], compared, False


def _plain_mask(target: Any) -> bool:
    if isinstance(target, Mapping):
        target = next(
            (
                target[k]
                for k in ("mask", "masks", "semantic_mask", "segmentation", "label_mask", "labels", "label", "target")
                if k in target
            ),
            None,
        )
    return type(target) is torch.Tensor


def _same_target(a: V.Item, b: V.Item) -> str:
    if a.boxes is not None and b.boxes is not None and a.boxes.shape == b.boxes.shape and len(a.boxes):
        if torch.allclose(a.boxes, b.boxes):
            return f"boxes {V.fmt_box(a.boxes[0])}{' …' if len(a.boxes) > 1 else ''} in both"
        return ""
    if a.mask is not None and b.mask is not None and a.mask.shape == b.mask.shape:
        if torch.equal(a.mask, b.mask) and not torch.equal(a.mask, a.mask.flip(-1)):
            return "the same mask in both"
    return ""


@check(
    "V8",
    domain="vision",
    title="geometric augmentation moves the image but not its target",
    optional_roles=("dataset", "dataloader", "train_transform", "box_format"),
    settings=(
        Setting(
            "trials",
            8,
            "seeded passes of the synthetic image through the train transform; a p=0.5 flip is "
            "missed by all 8 with probability 1/256",
        ),
        Setting(
            "min_iou",
            0.5,
            "IoU between the object found in the transformed image and its transformed box/mask "
            "below which they no longer match (crops and resizes keep it near 1)",
        ),
        Setting("rereads", 6, "reads of one dataset example used to spot an image mirrored while its target stays"),
    ),
)
def check_geometric_target(dlcheck):
    """Flips, crops, resizes and rotations move the boxes/masks together with the image.

    What it does
        Builds a synthetic 128×96 image with one bright rectangle at a known place and a target of the
        same structure and types as a sampled one (a dict with tv_tensors.BoundingBoxes or plain boxes,
        a Mask…), passes both 8 times (seeded) through the joint train transform (dlcheck_train_transform,
        or the dataset's torchvision ``transforms``, a StandardTransform when transform/target_transform
        were given separately), finds the object in each output image and fails when its transformed
        box or mask no longer covers it (IoU < 0.5). Also re-reads two sampled examples 6 times each and
        fails when the image comes back mirrored while the target stays identical (a custom dataset flipping
        only the image), or when a mask's geometry relative to the first read differs from its image's
        (the same random transform called once on the image and once on the mask: two draws), giving the
        share of re-reads whose mask no longer matches the image. Two reads are compared on their content:
        border rows and columns holding one constant value in both reads (the band a pad to the crop size
        adds after the flip, image 0 and mask 255 in torchvision's references) are left out of the image and
        the mask alike, so a mirrored content beside a band that stays put counts as mirrored in both.
    Why it is bad
        A flip applied to the image only teaches the detector that objects sit where they are not: half
        the training boxes are wrong, silently. The same happens to plain-tensor boxes with transforms v2
        (they pass through untouched) and to masks not wrapped as tv_tensors.Mask.
    Example
        VOCDetection(root, transform=T.RandomHorizontalFlip())     # image only; boxes stay
        img, mask = flip(img), flip(mask)    # v1 RandomHorizontalFlip called twice: two random draws
        target = {"boxes": torch.tensor(boxes), ...}; T.RandomHorizontalFlip()(img, target)   # plain boxes untouched
    Use instead
        a joint transform: dataset(transforms=T.Compose([T.RandomHorizontalFlip(), ...])) with boxes wrapped as
        tv_tensors.BoundingBoxes(boxes, format="XYXY", canvas_size=(H, W)) and masks as tv_tensors.Mask
        (or torchvision.datasets.wrap_dataset_for_transforms_v2(dataset)).
    Known problems
        A custom dataset whose transform attribute is applied to the image only cannot be told from a joint
        one by calling it; only the re-read test sees its flips (not its crops: a random crop drawn
        separately for image and mask is not seen). A transform that rejects a PIL image with the synthetic
        target skips, and so does video data (clips (C, T, H, W) with boxes or masks): V8 follows an object
        through the transform on one image, not through a clip's frames.
    Not applicable
        Classification (a class label does not move with the image), data without targets (a diffusion or
        self-supervised training), self-supervised multi-view examples (a list of augmented crops of each image, collated into one (B, C, H, W) batch per view: SimCLR, BYOL, DINO, SwAV), whose labels, when the dataset yields any, train no class output, vision-language batches, and data without images.
    """
    sample = V.get_vision_sample(dlcheck, "train")
    V.require_task(dlcheck, sample, ("detection", "segmentation"), "boxes and masks moving with the image")
    if sample.video:
        dlcheck.skip(
            f"V8 cannot judge video clips ({sample.source}: (C, T, H, W) clips with boxes or masks): it draws an "
            "object on one synthetic image and follows it through the transform, frame by frame it does not"
        )
    spatial = [i for i in sample.items if i.kind in ("detection", "segmentation")]
    spatial = [i for i in spatial if i.mask_as_image is None]
    if not spatial:
        dlcheck.skip("the sampled masks come out of the transform as images: V5 owns that; fix it first")
    template = next((i for i in spatial if (i.boxes is not None and len(i.boxes)) or i.mask is not None), spatial[0])
    ds = V.map_dataset(dlcheck, "train")
    if sample.role == "dataloader" and ds is not None and len(ds):
        # collation turns tv_tensors into plain tensors: take the target types from the dataset itself
        role = "dataset" if dlcheck.has("dataset") else "dataloader"
        with preserved_rng():
            raw = V.make_item(dlcheck.call(role, lambda: ds[0]), "dlcheck_dataloader.dataset[0]", 0)
        if raw.kind == template.kind and raw.mask_as_image is None:
            template = raw
    evidence: list[str] = []
    cause = fix = ""
    judged_any = False
    passed: list[str] = []
    ious: list[float] = []
    compared: list[str] = []

    tf = dlcheck.role("train_transform")
    base = V.base_dataset(ds) if ds is not None else None
    ambiguous = (
        base is not None
        and tf is getattr(base, "transform", None)
        and getattr(base, "transforms", None) is None
        and not V.user_defined(dlcheck, "train_transform")
    )
    rejected = ""
    if tf is not MISSING and not ambiguous:
        try:
            bad, judged, kind = _synthetic_trials(dlcheck, tf, template, dlcheck.setting("trials"), ious)
        except _Rejected as exc:
            bad, judged, kind = [], 0, ""
            rejected = f"; the train transform rejects a synthetic (PIL image, target) pair ({exc})"
        if judged:
            judged_any = True
            if not bad:
                passed.append(
                    f"{judged} of {dlcheck.setting('trials')} seeded passes of a synthetic {W}×{H} image with a "
                    f"matching {kind} (shaped like {template.where}) through the train transform: the {kind} "
                    f"follows the object (IoU ≥ {min(ious):.2f}, limit {dlcheck.setting('min_iou'):g}); "
                    f"train transform: {V.pipeline(tf)}"
                )
        if bad:
            evidence.append(
                f"synthetic {W}×{H} image, object at {V.fmt_box(OBJECT)} with a matching "
                f"{'box' if kind == 'box' else 'mask'} ({type(_synthetic_target(template, None)).__name__} "
                f"target shaped like {template.where}), through the train transform {judged} times:"
            )
            evidence += [f"  {b}" for b in bad[:3]]
            evidence.append(f"{len(bad)} of {judged} trials leave the target behind; train transform: {V.pipeline(tf)}")
            if type(tf).__name__ == "StandardTransform":
                cause = (
                    "the dataset was given transform= (image only) with target_transform="
                    f"{V.short(tf.target_transform, 40) if tf.target_transform is not None else 'None'}: "
                    "geometric transforms move the image and leave the target where it was"
                )
                fix = (
                    "pass a joint transforms=T.Compose([...]) to the dataset instead of transform=, with boxes as "
                    "tv_tensors.BoundingBoxes / masks as tv_tensors.Mask (or torchvision.datasets."
                    "wrap_dataset_for_transforms_v2(dataset))"
                )
            elif kind == "box" and template.box_format is None and _wrapped_boxes_follow(dlcheck, tf, template):
                # the sample's boxes are plain because the pipeline ends in ToPureTensor (the detection tutorial
                # wraps BoundingBoxes inside __getitem__, before the transform): the same transform moves wrapped
                # boxes with the image, so what the dataset hands it decides — judged on the dataset below
                evidence, bad = [], []
                judged_any = False
            elif kind == "box" and template.box_format is None:
                cause = (
                    "the boxes are plain tensors, which transforms v2 pass through untouched while the image "
                    "is flipped/cropped/resized"
                )
                fix = (
                    "wrap them: target['boxes'] = tv_tensors.BoundingBoxes(boxes, format='XYXY', "
                    "canvas_size=(H, W)) before the transform"
                )
            elif kind == "mask" and _plain_mask(template.target) and _wrapped_masks_follow(dlcheck, tf, template):
                # the sampled masks are plain after the pipeline, but the same transform moves a tv_tensors.Mask with
                # the image: whether the pipeline wraps them before it is judged on the dataset below
                evidence, bad = [], []
                judged_any = False
            elif kind == "mask" and _plain_mask(template.target):
                cause = "the masks are plain tensors, which transforms v2 pass through untouched while the image moves"
                fix = "wrap them: tv_tensors.Mask(mask) before the transform"
            else:
                cause = "the train transform moves the image but does not apply the same geometry to the target"
                fix = (
                    "use one joint torchvision v2 transform on (image, target) with tv_tensors.BoundingBoxes / "
                    "tv_tensors.Mask targets, so every geometric op is applied to both with the same parameters"
                )
    if not evidence and ds is not None and len(ds):
        positioned = [i for i in spatial if i.position is not None]
        if not positioned:  # sampled from the dataloader: take the first examples of its dataset
            positioned = [V.Item(None, None, "", p) for p in range(min(2, len(ds)))]
        reread, compared, independent = dlcheck.memo(
            ds, "vision:V8:reread", lambda: _flip_rereads(dlcheck, ds, positioned, dlcheck.setting("rereads"))
        )
        if compared or reread:
            judged_any = True
        if compared and not reread:
            passed.append(
                f"{', '.join(compared)} read {dlcheck.setting('rereads')} times each: no read is another mirrored "
                "with its target left identical"
            )
        if reread and independent:
            evidence += reread
            cause = (
                "the image and its mask get separate random draws: the same random transform is called once on the "
                "image and once on the mask (torchvision.transforms v1 draws anew on every call), so they flip and "
                "crop independently"
            )
            fix = (
                "call one torchvision v2 transform on both, so one draw moves them together: "
                "img, mask = transforms(img, tv_tensors.Mask(mask)) with transforms = T.Compose([...]) from "
                "torchvision.transforms.v2 (v1: draw once yourself, e.g. if random.random() < 0.5: "
                "img, mask = TF.hflip(img), TF.hflip(mask))"
            )
        elif reread:
            evidence += reread
            cause = "the dataset flips the image but not its boxes/masks"
            fix = (
                "apply the flip to image and target together: a joint torchvision v2 transform on (image, target) "
                "with tv_tensors.BoundingBoxes / tv_tensors.Mask targets"
            )
    if evidence:
        dlcheck.fail(evidence, cause, fix)
    if not judged_any:
        if rejected or tf is not MISSING or (ds is not None and len(ds)):
            dlcheck.skip(
                "V8 cannot decide: "
                + (
                    rejected.removeprefix("; ")
                    if rejected
                    else "the synthetic object was never found in the transformed images, and re-reading the "
                    "dataset gave no comparable tensor images"
                )
            )
        dlcheck.skip(
            "missing role: define fixture dlcheck_train_transform (a joint transform(image, target)) in "
            "conftest.py, or hand over a map-style dlcheck_dataset"
        )
    dlcheck.measured(
        *passed,
        trials=len(ious),
        min_iou=round(min(ious), 4) if ious else None,
        reread_examples=len(compared),
    )
