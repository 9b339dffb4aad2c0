from __future__ import annotations

from typing import Any

import torch

from ...errors import MISSING
from ...guard import eval_mode, preserved_rng
from ...registry import Setting, check, load_checks
from . import measure as V
from .boxes_labels import box_verdict


def _v3_setting(dlcheck: Any, name: str) -> Any:
    """V3's setting (its --dlcheck-set override included): V4 judges the boxes exactly as V3 does."""
    return dlcheck.state.setting(load_checks()["V3"], name)


def _gt_xyxy(dlcheck: Any, it: V.Item) -> Any:
    fmt = it.box_format or (V.parse_box_format(dlcheck.role("box_format")) or ("xyxy", False))[0]
    return V.to_xyxy(it.boxes, fmt, it.size)


def _postprocess(dlcheck: Any, model: Any, images: list[Any]) -> dict[str, Any]:
    """Eval forward on the sample images; for R-CNN models also the raw class scores of every proposal
    (a hook on roi_heads.box_predictor), so the stage that removes the detections can be named."""
    raw: list[Any] = []
    handle = None
    if V.is_rcnn(model):

        def hook(mod: Any, args: Any, out: Any) -> None:
            raw.append(out[0].detach().float().softmax(-1)[:, 1:].to("cpu"))

        handle = model.roi_heads.box_predictor.register_forward_hook(hook)
    try:
        with preserved_rng(), eval_mode(model):
            outs = dlcheck.call("model", lambda: model([V.model_input(i, model) for i in images]))
    finally:
        if handle is not None:
            handle.remove()
    counts = [int(len(o["boxes"])) for o in outs]
    scores = raw[0] if raw else None
    return {"counts": counts, "scores": scores}


def _anchor_ious(dlcheck: Any, model: Any, items: list[V.Item]) -> list[tuple[V.Item, Any, Any, Any]]:
    """Best IoU between each ground-truth box and the model's anchors, in the model's own resized frame."""
    from torchvision.ops import box_iou

    gen = getattr(getattr(model, "rpn", None), "anchor_generator", None) or getattr(model, "anchor_generator", None)
    if gen is None:
        return []
    out = []
    with preserved_rng(), eval_mode(model):
        for it in items:
            boxes = _gt_xyxy(dlcheck, it).to(V.model_device(model))
            image = V.model_input(it.image, model)
            image_list, targets = model.transform(
                [image], [{"boxes": boxes, "labels": torch.ones(len(boxes), dtype=torch.int64, device=boxes.device)}]
            )
            feats = model.backbone(image_list.tensors)
            feats = list(feats.values()) if isinstance(feats, dict) else [feats]
            anchors = gen(image_list, feats)[0]
            ious = box_iou(targets[0]["boxes"], anchors).max(dim=1)
            out.append((it, targets[0]["boxes"].to("cpu"), ious.values.to("cpu"), anchors[ious.indices].to("cpu")))
    return out


def _anchor_sizes(model: Any) -> str:
    gen = getattr(getattr(model, "rpn", None), "anchor_generator", None) or getattr(model, "anchor_generator", None)
    sizes = getattr(gen, "sizes", None)
    ratios = getattr(gen, "aspect_ratios", None)
    if sizes is None:
        return type(gen).__name__
    flat = sorted({s for level in sizes for s in level})
    return f"AnchorGenerator sizes {flat}, aspect ratios {sorted({r for level in ratios for r in level})}"


@check(
    "V4",
    domain="vision",
    title="detections vanish after thresholds, or anchors cannot reach the objects",
    optional_roles=("model", "dataset", "dataloader", "box_format"),
    settings=(
        Setting(
            "max_score_thresh",
            0.5,
            "a score threshold above this that leaves no detection on the sample "
            "images fails; at or below it, an empty output is blamed on an untrained model (skip)",
        ),
        Setting(
            "min_anchor_iou",
            0.2,
            "a ground-truth box whose best anchor IoU is below this has no anchor that "
            "can learn it: even its best anchor is mostly background (the RPN labels anchors under 0.3 "
            "background and keeps such a box only as a low-quality match); a coarse anchor grid on small "
            "images already gives 0.25-0.35, mismatched sizes give < 0.05",
        ),
        Setting(
            "max_unreachable_share",
            0.5,
            "share of sampled ground-truth boxes allowed below min_anchor_iou; "
            "datasets with some tiny objects are normal, most objects unreachable is not",
        ),
        Setting("max_images", 4, "sample images run through the detector"),
    ),
)
def check_detections(dlcheck):
    """A torchvision detector keeps some detections after post-processing, and its anchors fit the objects.

    What it does
        Runs the detector in eval mode on up to 4 sampled images. For R-CNN models a hook on
        roi_heads.box_predictor records the class scores of every proposal, so the stage that empties
        the output is named (score threshold, detections_per_img). Fails when no image keeps a
        detection and the score threshold is above V4.max_score_thresh. Then, for anchor-based models
        (Faster/Mask R-CNN, RetinaNet, SSD), resizes the ground-truth boxes with the model's own
        transform and measures each box's best IoU with the generated anchors; fails when more than
        half are below 0.2.
    Why it is bad
        box_score_thresh=0.99 (or detections_per_img=0) makes every evaluation report mAP 0 whatever
        the model learned. Anchors far from the object sizes leave objects without a matching anchor:
        the RPN only gets low-quality matches and recall stays low however long it trains.
    Example
        fasterrcnn_mobilenet_v3_large_320_fpn(num_classes=3, box_score_thresh=0.99)
        FasterRCNN(backbone, rpn_anchor_generator=AnchorGenerator(((256, 512),) * 3, ((0.5, 1.0, 2.0),) * 3))  # 20-px objects
    Use instead
        box_score_thresh=0.05 for evaluation (filter by score only when displaying); anchor sizes
        matching the objects after the model's resize (min_size/max_size), e.g. ((16, 32, 64),) per level,
        or resize the images so the objects match the default anchors.
    Known problems
        An untrained model with a moderate threshold may output nothing: that skips rather than fails.
        When V3 finds the sampled boxes invalid for the model (degenerate, normalised, another format) V4
        skips naming V3's cause: anchors fitted to such boxes would be meaningless.
        FCOS is anchor-free (anchor part skipped). Only torchvision detection models are inspected.
    Not applicable
        Models that are not torchvision detectors (classifiers, segmenters, language or diffusion models,
        detectors of other libraries), and data whose targets are not boxes.
    """
    model = dlcheck.role("model")
    if model is MISSING:
        found = V.get_vision_sample(dlcheck, "train", required=False)  # not applicable: RL, data without images
        if found is not None:
            V.require_task(dlcheck, found, ("detection",), "a detector's outputs")
        dlcheck.require("model")
    if not V.is_tv_detection(model):
        dlcheck.not_applicable(f"V4 inspects torchvision detection models; dlcheck_model is a {type(model).__name__}")
    sample = V.get_vision_sample(dlcheck, "train")
    V.require_task(dlcheck, sample, ("detection",), "a detector's outputs")
    items = [i for i in sample.of_kind("detection") if i.image is not None and not i.pil and len(i.boxes)]
    if not items:
        dlcheck.skip(f"no sampled image with boxes in {sample.source}")
    # V3 judges the same sampled boxes: when it names the root cause (boxes invalid, normalised, of a format the
    # detector misreads), anchors fitted to those boxes would be advice on garbage ("anchors of size 0")
    det = [i for i in sample.of_kind("detection") if i.boxes is not None and len(i.boxes)]
    verdict = box_verdict(
        det,
        model,
        dlcheck.role("box_format"),
        _v3_setting(dlcheck, "edge_tolerance"),
        _v3_setting(dlcheck, "max_invalid_share"),
    )
    if verdict.failure is not None:
        _, cause, _ = verdict.failure
        dlcheck.skip(
            f"V3 names the root cause on the same boxes: {cause}; fix it first (see V3), then V4 can judge the "
            "detections and anchors"
        )
    items = items[: dlcheck.setting("max_images")]
    for it in items:
        xyxy = _gt_xyxy(dlcheck, it)
        if any(V.box_problems(xyxy, it.size, 0.02)):
            dlcheck.skip(f"{it.where} has boxes invalid as xyxy: V3 owns the box format; fix it first")

    # 1. post-processing
    post = dlcheck.memo(
        model, f"vision:V4:post:{id(sample)}", lambda: _postprocess(dlcheck, model, [i.image for i in items])
    )
    counts = post["counts"]
    heads = getattr(model, "roi_heads", model)
    thresh = float(getattr(heads, "score_thresh", 0.0))
    per_img = int(getattr(heads, "detections_per_img", 1))
    if not any(counts):
        scores = post["scores"]
        ev = [f"0 of {len(counts)} sampled images keep a detection after post-processing"]
        if scores is not None and scores.numel():
            n_img = len(counts)
            ev.append(
                f"{scores.shape[0]} proposals × {scores.shape[1]} foreground classes = {scores.numel()} raw "
                f"candidates over {n_img} images; best score {float(scores.max()):.3f}, "
                f"{int((scores > thresh).sum())} above box_score_thresh={thresh:g}"
            )
        if per_img == 0:
            dlcheck.fail(
                ev + [f"detections_per_img={per_img}"],
                "detections_per_img=0 keeps no detection",
                "box_detections_per_img=100 (the torchvision default)",
            )
        best = float(scores.max()) if scores is not None and scores.numel() else None
        if thresh > dlcheck.setting("max_score_thresh"):
            what = "box_score_thresh" if hasattr(model, "roi_heads") else "score_thresh"
            dlcheck.fail(
                ev,
                f"{what}={thresh:g} removes every candidate before NMS"
                + (f" (the best score is {best:.3f})" if best is not None else ""),
                f"{what}=0.05 (torchvision's default) for evaluation; filter by a high score only when "
                "displaying detections",
            )
        dlcheck.skip(
            f"no detection survives score_thresh={thresh:g} on the sample images"
            + (f" (best score {best:.3f})" if best is not None else "")
            + ": the model looks untrained, so the threshold cannot be judged"
        )

    kept = sum(1 for c in counts if c)
    post_line = (
        f"{kept} of {len(counts)} sampled images keep detections after post-processing ({sum(counts)} in all; "
        f"score_thresh={thresh:g}, detections_per_img={per_img})"
    )
    post_data = dict(images=len(counts), images_with_detections=kept, score_thresh=thresh, detections_per_img=per_img)

    # 2. anchors (FCOS is anchor-free: its generator only places points)
    if type(model).__name__ == "FCOS" or (
        getattr(model, "anchor_generator", None) is None
        and getattr(getattr(model, "rpn", None), "anchor_generator", None) is None
    ):
        dlcheck.measured(post_line, f"{type(model).__name__} is anchor-free: no anchors to judge", **post_data)
        return
    ious = dlcheck.memo(model, f"vision:V4:anchors:{id(sample)}", lambda: _anchor_ious(dlcheck, model, items))
    all_ious = torch.cat([r[2] for r in ious]) if ious else torch.zeros(0)
    if not all_ious.numel():
        dlcheck.measured(post_line, "no ground-truth box reached the anchor comparison", **post_data)
        return
    low = float((all_ious < dlcheck.setting("min_anchor_iou")).double().mean())
    if low <= dlcheck.setting("max_unreachable_share"):
        dlcheck.measured(
            post_line,
            f"{100 * (1 - low):.0f}% of {all_ious.numel()} ground-truth boxes have a best anchor IoU ≥ "
            f"{dlcheck.setting('min_anchor_iou'):g} (median {float(all_ious.median()):.2f}; at most "
            f"{100 * dlcheck.setting('max_unreachable_share'):.0f}% may fall below); {_anchor_sizes(model)}",
            **post_data,
            boxes=int(all_ious.numel()),
            median_anchor_iou=round(float(all_ious.median()), 4),
            unreachable_share=round(low, 4),
        )
        return
    it, boxes, best, anchors = min(ious, key=lambda r: float(r[2].min()))
    k = int(best.argmin())
    wh = boxes[:, 2:] - boxes[:, :2]
    sizes = [f"{float(w):.0f}×{float(h):.0f}" for w, h in wh[:4]]
    ev = [
        f"{100 * low:.0f}% of {all_ious.numel()} sampled ground-truth boxes have best anchor IoU < "
        f"{dlcheck.setting('min_anchor_iou')} (median best IoU {float(all_ious.median()):.2f})",
        f"{it.where}: box {V.fmt_box(boxes[k])} after the model's resize (objects {', '.join(sizes)} px), "
        f"best anchor {V.fmt_box(anchors[k])} IoU {float(best[k]):.2f}",
        f"model anchors: {_anchor_sizes(model)}; images resized to min_size={getattr(model.transform, 'min_size', '?')}, "
        f"max_size={getattr(model.transform, 'max_size', '?')}",
    ]
    obj = float(torch.sqrt((wh[:, 0] * wh[:, 1]).clamp(min=1)).median())
    dlcheck.fail(
        ev,
        "the anchor sizes are far from the object sizes at the model's input resolution, so no anchor "
        "overlaps the objects enough to be trained as a positive",
        f"give the AnchorGenerator sizes around the objects' size (~{obj:.0f} px after resize), e.g. "
        f"rpn_anchor_generator=AnchorGenerator((({int(obj // 2)}, {int(obj)}, {int(obj * 2)}),) * levels, "
        "((0.5, 1.0, 2.0),) * levels), or change min_size/max_size so the objects match the default anchors",
    )
