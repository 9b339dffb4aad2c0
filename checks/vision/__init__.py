"""Checks of vision pipelines: classification, detection, segmentation (torchvision, timm, transformers), on
images and on video clips (C, T, H, W) where a check's measurement holds per frame.

The vision roles a user may define, besides the core ones (dlcheck_model, dlcheck_dataset,
dlcheck_dataloader, dlcheck_eval_dataset, dlcheck_eval_dataloader, dlcheck_optimizer, …). Targets that
are torchvision ``tv_tensors`` (BoundingBoxes, Mask) are understood without any of them."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from ...errors import MISSING
from ...roles import deriver, role

role(
    "train_transform",
    "the training transform (torchvision transforms v2/v1, timm create_transform); a joint "
    "transform is called as transform(image, target) like a torchvision dataset's transforms=",
    "read from dlcheck_dataset / dlcheck_dataloader.dataset (.transforms or .transform)",
)
role(
    "eval_transform",
    "the evaluation transform (as train_transform)",
    "read from dlcheck_eval_dataset / dlcheck_eval_dataloader.dataset",
)
role(
    "loss_fn",
    "the training loss, called as loss_fn(outputs, targets), e.g. nn.CrossEntropyLoss(weight=..., "
    "ignore_index=255): the vision checks read its class weights and ignore_index",
)
role(
    "num_classes",
    "number of classes the model predicts (torchvision detection: background included)",
    "read from dlcheck_model's head or output",
)
role(
    "box_format",
    "format of plain-tensor boxes in the targets: 'xyxy', 'xywh' or 'cxcywh', '-normalized' "
    "for [0, 1] coordinates; tv_tensors.BoundingBoxes carry their own, torchvision detectors expect 'xyxy'",
)
role("ignore_index", "the mask value that marks void pixels in segmentation targets (e.g. 255 for VOC)")
role(
    "metric",
    "the evaluation metric object (e.g. torchmetrics MulticlassJaccardIndex): V5 feeds copies of it void pixels",
)
role(
    "eval_fn",
    "the evaluation function, called as eval_fn(model, dataloader) on a DataLoader of 2 eval "
    "examples (its .dataset reads as your eval dataset, its other attributes yours); it should run the model in "
    "eval mode",
)
role(
    "image_processor",
    "a transformers image processor whose image_mean/image_std the model was trained with",
    "dlcheck_tokenizer when it is a processor, or dlcheck_trainer",
)
role(
    "weights",
    "the torchvision weights enum the model was initialised from, e.g. ResNet50_Weights.IMAGENET1K_V2 "
    "(read offline for its normalisation; nothing is downloaded)",
)

Get = Callable[[str], Any]
Cache = Callable[[Any, str, Callable[[], Any]], Any]


def dataset_transform(dataset: Any) -> Any:
    """The transform a dataset applies: torchvision's joint ``transforms`` (a StandardTransform when only
    transform/target_transform were given), else its ``transform``; through Subset wrappers."""
    from .measure import base_dataset

    ds = base_dataset(dataset)
    for attr in ("transforms", "transform"):
        t = getattr(ds, attr, None)
        if t is not None and callable(t):
            return t
    return MISSING


@deriver
def from_vision_data(name: str, get: Get, cache: Cache) -> Any:
    if name in ("train_transform", "eval_transform"):
        ds_role, dl_role = (
            ("dataset", "dataloader") if name == "train_transform" else ("eval_dataset", "eval_dataloader")
        )
        ds = get(ds_role)
        if ds is MISSING:
            dl = get(dl_role)
            ds = getattr(dl, "dataset", None) if dl is not MISSING else None
        return dataset_transform(ds) if ds is not None and ds is not MISSING else MISSING
    if name == "image_processor":
        proc = get("tokenizer")
        if proc is MISSING:
            return MISSING
        if getattr(proc, "image_mean", None) is not None:
            return proc
        inner = getattr(proc, "image_processor", None)
        return inner if getattr(inner, "image_mean", None) is not None else MISSING
    return MISSING
