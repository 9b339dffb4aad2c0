"""Tiny real vision pipelines for the vision tests: torchvision ``VisionDataset`` subclasses that draw
synthetic shapes (deterministic per index, like torchvision's FakeData), and fast real models
(torchvision Faster R-CNN / LR-ASPP / ResNet, timm). Imported by the throwaway user conftests that the
tests write, which run in the same process."""

from __future__ import annotations

# pytester's in-process runs drop every module first imported inside a run. Import here, once, what the
# runs use: torchvision/timm/hypothesis (re-importing them per run costs seconds) and the plugin's role machinery
# (a roles module re-imported inside a run would come with a new MISSING and without the vision derivers).
import hypothesis.internal.observability  # noqa: E402,F401  (hypothesis' pytest plugin imports it in every run)
import numpy as np
import timm  # noqa: E402,F401
import torch
import torchvision.models.detection  # noqa: E402,F401
import torchvision.models.segmentation  # noqa: E402,F401
from PIL import Image, ImageDraw
from torchvision import tv_tensors  # noqa: E402
from torchvision.datasets import VisionDataset  # noqa: E402
from torchvision.transforms import v2 as T  # noqa: E402

import pytest_dlcheck.checks.vision  # noqa: E402,F401
import pytest_dlcheck.checks.vision.measure  # noqa: E402,F401
import pytest_dlcheck.context  # noqa: E402,F401
import pytest_dlcheck.fixtures  # noqa: E402,F401
import pytest_dlcheck.roles  # noqa: E402,F401

torch.set_num_threads(1)

IMAGENET_MEAN = (0.485, 0.456, 0.406)
IMAGENET_STD = (0.229, 0.224, 0.225)


def _noise(index: int, h: int, w: int) -> np.ndarray:
    rng = np.random.default_rng(1000 + index)
    return rng.integers(0, 256, size=(h, w, 3), dtype=np.uint8)


class Shapes(VisionDataset):
    """Classification: noise images with labels given as a list (``targets``, like ImageFolder/CIFAR)."""

    def __init__(self, labels, size=32, transform=None, target_transform=None):
        super().__init__(None, transform=transform, target_transform=target_transform)
        self.targets = list(labels)
        self.size = size

    def __len__(self):
        return len(self.targets)

    def __getitem__(self, index):
        img = Image.fromarray(_noise(index, self.size, self.size), "RGB")
        target = self.targets[index]
        if self.transform is not None:
            img = self.transform(img)
        if self.target_transform is not None:
            target = self.target_transform(target)
        return img, target


def layout(index: int, h: int = 64, w: int = 80, classes: int = 2) -> tuple[list[list[float]], list[int]]:
    """1-3 objects of 18-34 px per image, deterministic per index; boxes as absolute xyxy."""
    rng = np.random.default_rng(index)
    boxes, labels = [], []
    for _ in range(1 + index % 3):
        bw, bh = int(rng.integers(18, 35)), int(rng.integers(18, 35))
        x, y = int(rng.integers(0, w - bw)), int(rng.integers(0, h - bh))
        boxes.append([float(x), float(y), float(x + bw), float(y + bh)])
        labels.append(1 + int(rng.integers(0, classes)))
    return boxes, labels


def draw(index: int, boxes, h: int = 64, w: int = 80) -> Image.Image:
    img = Image.fromarray((_noise(index, h, w) // 4), "RGB")
    d = ImageDraw.Draw(img)
    for k, (x1, y1, x2, y2) in enumerate(boxes):
        d.rectangle((x1, y1, x2 - 1, y2 - 1), fill=(200, 60 + 40 * k, 90))
    return img


class ShapesDetection(VisionDataset):
    """Detection: ``(PIL image, {"boxes", "labels"})`` with COCO-style stored annotations.

    boxes: "tv" -> tv_tensors.BoundingBoxes in XYXY (correct), "plain" -> plain xyxy tensor,
    "coco_as_xyxy" -> the COCO [x, y, w, h] values wrapped as BoundingBoxes(format="XYXY") (the bug),
    "coco_plain" -> the COCO values as a plain tensor (the bug, fed to a detector reading xyxy),
    "coco_xywh" -> BoundingBoxes(format="XYWH") (correct, convert in the transform).
    label_offset: added to the 1-based labels (-1 gives 0-based labels)."""

    def __init__(
        self, n=16, boxes="tv", label_offset=0, h=64, w=80, transforms=None, transform=None, target_transform=None
    ):
        super().__init__(None, transforms=transforms, transform=transform, target_transform=target_transform)
        self.n, self.box_style, self.label_offset, self.h, self.w = n, boxes, label_offset, h, w

    def __len__(self):
        return self.n

    def __getitem__(self, index):
        xyxy, labels = layout(index, self.h, self.w)
        img = draw(index, xyxy, self.h, self.w)
        anns = [{"bbox": [x1, y1, x2 - x1, y2 - y1], "category_id": c} for (x1, y1, x2, y2), c in zip(xyxy, labels)]
        canvas = (self.h, self.w)
        if self.box_style == "tv":
            boxes = tv_tensors.BoundingBoxes(xyxy, format="XYXY", canvas_size=canvas)
        elif self.box_style == "plain":
            boxes = torch.tensor(xyxy)
        elif self.box_style == "coco_as_xyxy":
            boxes = tv_tensors.BoundingBoxes([a["bbox"] for a in anns], format="XYXY", canvas_size=canvas)
        elif self.box_style == "coco_plain":
            boxes = torch.tensor([a["bbox"] for a in anns])
        elif self.box_style == "coco_xywh":
            boxes = tv_tensors.BoundingBoxes([a["bbox"] for a in anns], format="XYWH", canvas_size=canvas)
        else:
            raise ValueError(self.box_style)
        target = {"boxes": boxes, "labels": torch.tensor([a["category_id"] + self.label_offset for a in anns])}
        if self.transforms is not None:
            img, target = self.transforms(img, target)
        return img, target


class ShapesSegmentation(VisionDataset):
    """Segmentation, VOC style: classes 0..classes-1 with a 2-px void border (255) around each object.
    Masks come as tv_tensors.Mask (``mask="tv"``), plain uint8 tensors (``"plain"``) or PIL "L" images
    (``"pil"``, as VOCSegmentation gives them)."""

    def __init__(self, n=16, classes=3, size=48, mask="tv", transforms=None, transform=None, target_transform=None):
        super().__init__(None, transforms=transforms, transform=transform, target_transform=target_transform)
        self.n, self.classes, self.size, self.mask_kind = n, classes, size, mask

    def __len__(self):
        return self.n

    def __getitem__(self, index):
        rng = np.random.default_rng(index)
        s = self.size
        mask = np.zeros((s, s), dtype=np.uint8)
        img = _noise(index, s, s) // 4
        for k in range(1, self.classes):
            x, y = int(rng.integers(2, s - 20)), int(rng.integers(2, s - 20))
            mask[max(0, y - 2) : y + 18, max(0, x - 2) : x + 18] = 255
            mask[y : y + 16, x : x + 16] = k
            img[y : y + 16, x : x + 16] = (60 * k, 200, 120)
        image = Image.fromarray(img, "RGB")
        if self.mask_kind == "tv":
            target = tv_tensors.Mask(torch.from_numpy(mask))
        elif self.mask_kind == "plain":
            target = torch.from_numpy(mask)
        else:
            target = Image.fromarray(mask, "L")
        if self.transforms is not None:
            image, target = self.transforms(image, target)
        return image, target


def detection_collate(batch):
    return tuple(zip(*batch))


def fasterrcnn(num_classes=3, **kw):
    """torchvision's fasterrcnn_mobilenet_v3_large_320_fpn, untrained, sized for a 2-core CPU."""
    from torchvision.models.detection import fasterrcnn_mobilenet_v3_large_320_fpn

    args = dict(
        weights=None,
        weights_backbone=None,
        num_classes=num_classes,
        min_size=64,
        max_size=96,
        rpn_pre_nms_top_n_train=50,
        rpn_post_nms_top_n_train=20,
        rpn_pre_nms_top_n_test=50,
        rpn_post_nms_top_n_test=20,
        rpn_batch_size_per_image=16,
        box_batch_size_per_image=16,
    )
    args.update(kw)
    torch.manual_seed(0)
    return fasterrcnn_mobilenet_v3_large_320_fpn(**args)


def lraspp(num_classes=3):
    from torchvision.models.segmentation import lraspp_mobilenet_v3_large

    torch.manual_seed(0)
    return lraspp_mobilenet_v3_large(weights=None, weights_backbone=None, num_classes=num_classes)


def resnet18(num_classes=4):
    from torchvision.models import resnet18 as build

    torch.manual_seed(0)
    return build(weights=None, num_classes=num_classes)


def timm_resnet(num_classes=4, name="resnet18"):
    torch.manual_seed(0)
    return timm.create_model(name, pretrained=False, num_classes=num_classes)


def classification_tf(train=True, mean=IMAGENET_MEAN, std=IMAGENET_STD, scale=True, size=32):
    head = (
        [T.RandomResizedCrop(size, antialias=True), T.RandomHorizontalFlip()]
        if train
        else [T.Resize(size + 4), T.CenterCrop(size)]
    )
    return T.Compose([T.ToImage(), *head, T.ToDtype(torch.float32, scale=scale), T.Normalize(list(mean), list(std))])


def detection_tf(train=True):
    aug = [T.RandomHorizontalFlip(p=0.5)] if train else []
    return T.Compose([T.ToImage(), *aug, T.ToDtype(torch.float32, scale=True), T.SanitizeBoundingBoxes()])


def segmentation_tf(train=True, mean=IMAGENET_MEAN, std=IMAGENET_STD):
    aug = [T.RandomHorizontalFlip(p=0.5)] if train else []
    return T.Compose([T.ToImage(), *aug, T.ToDtype(torch.float32, scale=True), T.Normalize(list(mean), list(std))])


def state_snapshot(model):
    """Everything a check must leave untouched: weights/buffers, requires_grad, train/eval modes."""
    return (
        {k: v.detach().clone() for k, v in model.state_dict().items()},
        [p.requires_grad for p in model.parameters()],
        [m.training for m in model.modules()],
    )


def same_state(model, snap) -> str:
    sd, grads, modes = snap
    now = model.state_dict()
    for k, v in sd.items():
        if not torch.equal(now[k], v):
            return f"tensor {k} changed"
    if grads != [p.requires_grad for p in model.parameters()]:
        return "requires_grad changed"
    if modes != [m.training for m in model.modules()]:
        return "train/eval modes changed"
    return ""


def section(run, cid: str) -> str:
    """A check's failure text with the line wrapping undone (whitespace runs become one space)."""
    return " ".join(run.section(cid).split())


# transformers image classification, as the HF image-classification guide builds it (tiny ViT from a config)
import datasets  # noqa: E402
from transformers import Trainer, TrainingArguments, ViTConfig, ViTForImageClassification, ViTImageProcessor  # noqa: E402,F401


def tiny_vit(num_labels=2, size=16):
    torch.manual_seed(0)
    config = ViTConfig(
        hidden_size=32,
        num_hidden_layers=1,
        num_attention_heads=2,
        intermediate_size=37,
        image_size=size,
        patch_size=8,
        num_labels=num_labels,
    )
    return ViTForImageClassification(config)


def hf_images(labels, size=16):
    """A datasets.Dataset of noise RGB images with an int label column, like a loaded image folder."""
    images = [Image.fromarray(_noise(i, size, size), "RGB") for i in range(len(labels))]
    return datasets.Dataset.from_dict({"image": images, "label": list(labels)})


def with_pixel_values(ds, tf):
    """The guide's recipe: ``ds.with_transform(transforms)`` turning each image into ``pixel_values``
    (the Normalize sits in a closure: no transform object reaches the checks)."""

    def transforms(examples):
        examples["pixel_values"] = [tf(img.convert("RGB")) for img in examples["image"]]
        del examples["image"]
        return examples

    return ds.with_transform(transforms)


def hf_collate(examples):
    return {
        "pixel_values": torch.stack([e["pixel_values"] for e in examples]),
        "labels": torch.tensor([e["label"] for e in examples]),
    }


def image_trainer(model, train, tmp, trainer_cls=None, **kw):
    args = TrainingArguments(
        output_dir=str(tmp), report_to="none", use_cpu=True, remove_unused_columns=False, per_device_train_batch_size=8
    )
    return (trainer_cls or Trainer)(model=model, args=args, train_dataset=train, data_collator=hf_collate, **kw)
