"""Re-creation of pytorch/vision references/segmentation (train.py @ e8dd7c6c5c1e21b9acdec623b63d5d5559d9e0d7,
the LambdaLR-poly version; presets.py @ 15866918a3befa2e4b04a2ea914527afc7478bbc and transforms.py
@ 14bdad711fcbe023bb20817f7b415621f2ce142e, the PILToTensor/ConvertImageDtype presets of the same era;
utils.py's ConfusionMatrix / cat_list / collate_fn), shrunk to run on a 2-core CPU in seconds.

What the reference does and this module keeps:

- data: a VOC-style dataset called as ``ds(image, target)`` through ``transforms=`` with
  ``SegmentationPresetTrain(base_size=520, crop_size=480)`` (RandomResize(0.5x..2x base) -> RandomHorizontalFlip
  (0.5) -> RandomCrop padding the mask with 255 -> PILToTensor -> ConvertImageDtype(float) -> Normalize(ImageNet))
  applied jointly to the PIL image and the PIL mask (nearest resize for the mask), and
  ``SegmentationPresetEval(base_size=520)`` (RandomResize(base, base), i.e. a fixed resize, and the same tail);
  RandomSampler + drop_last=True for training, SequentialSampler and batch 1 for evaluation; utils.collate_fn
  (cat_list, targets padded with 255).
- masks as VOC's: class ids 0..num_classes-1 (0 background, about 70% of the pixels) and 255 on the 2-pixel
  borders around objects (VOC's "void" outline).
- model: torchvision's ``FCN`` (torchvision.models.segmentation.fcn) with ``FCNHead`` classifier and aux
  classifier on an ``IntermediateLayerGetter`` backbone returning layer4 as "out" and layer3 as "aux", exactly
  how ``fcn_resnet50(weights=None, weights_backbone=None, num_classes=..., aux_loss=True)`` is assembled; the
  backbone is a torchvision ``ResNet(BasicBlock, [1, 1, 1, 1])`` (no pretrained weights, no dilation) instead
  of ResNet-50 with replace_stride_with_dilation=[False, True, True].
- ``criterion``: cross_entropy(ignore_index=255) on every output, ``out + 0.5 * aux``.
- SGD(momentum 0.9, wd 1e-4) on three groups: backbone, classifier, aux_classifier at lr*10 (--aux-loss).
- LambdaLR ``(1 - x / (len(data_loader) * epochs)) ** 0.9`` stepped every iteration.
- evaluate(): model.eval(), no_grad, ConfusionMatrix(num_classes) updated with target/argmax (its
  ``(a >= 0) & (a < n)`` drops the 255 pixels).
- checkpoint dict {'model', 'optimizer', 'lr_scheduler', 'epoch', 'args'} written by utils.save_on_master to
  ``model_{epoch}.pth`` after every epoch; --resume: ``torch.load(args.resume, map_location='cpu')`` (no
  weights_only argument: torch's default, True since torch 2.6), load model/optimizer/lr_scheduler, start_epoch =
  epoch + 1.

Shrunk: VOC/COCO -> 32 train / 8 val generated 48x48 images with 4 classes (bg + 3 shapes, 1-3 per image); base_size 520 ->
40, crop_size 480 -> 32; batch 8 and epochs 30 (the argparse defaults: the poly schedule spans 4 x 30 = 120
iterations); lr 0.01 (default); no DDP/SyncBN, no
AMP, workers 0, CPU.
"""

from __future__ import annotations

import argparse
import os
import random

import torch
import torch.utils.data
from torch import nn
from torchvision.models import resnet
from torchvision.models._utils import IntermediateLayerGetter
from torchvision.models.segmentation.fcn import FCN, FCNHead
from torchvision.transforms import InterpolationMode
from torchvision.transforms import RandomCrop as TVRandomCrop
from torchvision.transforms import functional as F

IMAGENET_MEAN = (0.485, 0.456, 0.406)
IMAGENET_STD = (0.229, 0.224, 0.225)
NUM_CLASSES = 4
IGNORE = 255


def default_args(**overrides) -> argparse.Namespace:
    args = argparse.Namespace(
        data_path="",
        dataset="voc",
        model="fcn_resnet50",
        aux_loss=True,
        device="cpu",
        batch_size=8,
        epochs=30,
        workers=0,
        lr=0.01,
        momentum=0.9,
        weight_decay=1e-4,
        print_freq=10,
        output_dir=".",
        resume="",
        start_epoch=0,
        test_only=False,
        pretrained=False,
        world_size=1,
        dist_url="env://",
        distributed=False,
        base_size=40,
        crop_size=32,
    )
    for k, v in overrides.items():
        setattr(args, k, v)
    return args


# ---------------------------------------------------------------------------------------------------
# transforms.py: joint (image, target) transforms


def pad_if_smaller(img, size, fill=0):
    w, h = img.size
    if min(w, h) < size:
        img = F.pad(img, (0, 0, max(size - w, 0), max(size - h, 0)), fill=fill)
    return img


class Compose:
    def __init__(self, transforms):
        self.transforms = transforms

    def __call__(self, image, target):
        for t in self.transforms:
            image, target = t(image, target)
        return image, target


class RandomResize:
    def __init__(self, min_size, max_size=None):
        self.min_size, self.max_size = min_size, max_size if max_size is not None else min_size

    def __call__(self, image, target):
        size = random.randint(self.min_size, self.max_size)
        image = F.resize(image, size, antialias=True)
        target = F.resize(target, size, interpolation=InterpolationMode.NEAREST)
        return image, target


class RandomHorizontalFlip:
    def __init__(self, flip_prob):
        self.flip_prob = flip_prob

    def __call__(self, image, target):
        if random.random() < self.flip_prob:
            image, target = F.hflip(image), F.hflip(target)
        return image, target


class RandomCrop:
    def __init__(self, size):
        self.size = size

    def __call__(self, image, target):
        image = pad_if_smaller(image, self.size)
        target = pad_if_smaller(target, self.size, fill=IGNORE)
        params = TVRandomCrop.get_params(image, (self.size, self.size))
        return F.crop(image, *params), F.crop(target, *params)


class PILToTensor:
    def __call__(self, image, target):
        return F.pil_to_tensor(image), torch.as_tensor(list(target.getdata()), dtype=torch.int64).reshape(
            target.size[1], target.size[0]
        )


class ConvertImageDtype:
    def __init__(self, dtype):
        self.dtype = dtype

    def __call__(self, image, target):
        return F.convert_image_dtype(image, self.dtype), torch.as_tensor(target, dtype=torch.int64)


class Normalize:
    def __init__(self, mean, std):
        self.mean, self.std = mean, std

    def __call__(self, image, target):
        return F.normalize(image, mean=self.mean, std=self.std), target


# ---------------------------------------------------------------------------------------------------
# presets.py


class SegmentationPresetTrain:
    def __init__(self, *, base_size, crop_size, hflip_prob=0.5, mean=IMAGENET_MEAN, std=IMAGENET_STD):
        steps = [RandomResize(int(0.5 * base_size), int(2.0 * base_size))]
        if hflip_prob > 0:
            steps.append(RandomHorizontalFlip(hflip_prob))
        steps += [RandomCrop(crop_size), PILToTensor(), ConvertImageDtype(torch.float), Normalize(mean, std)]
        self.transforms = Compose(steps)

    def __call__(self, img, target):
        return self.transforms(img, target)


class SegmentationPresetEval:
    def __init__(self, *, base_size, mean=IMAGENET_MEAN, std=IMAGENET_STD):
        self.transforms = Compose(
            [RandomResize(base_size, base_size), PILToTensor(), ConvertImageDtype(torch.float), Normalize(mean, std)]
        )

    def __call__(self, img, target):
        return self.transforms(img, target)


def get_transform(train, args):
    if train:
        return SegmentationPresetTrain(base_size=args.base_size, crop_size=args.crop_size)
    return SegmentationPresetEval(base_size=args.base_size)


# ---------------------------------------------------------------------------------------------------
# the data: a VOCSegmentation-like dataset of generated PIL images and masks


class SyntheticVOC(torch.utils.data.Dataset):
    """(PIL RGB image, PIL 'P'-mode mask): a noisy background with 1-2 filled shapes (rectangle = class 1,
    disc = class 2, cross = class 3), each outlined by a 2-pixel 255 border as in VOC's SegmentationClass."""

    def __init__(self, n, seed, transforms=None, size=48):
        from PIL import Image

        self.transforms = transforms
        self.items = []
        g = torch.Generator().manual_seed(seed)
        yy, xx = torch.meshgrid(torch.arange(size), torch.arange(size), indexing="ij")
        for _ in range(n):
            img = 0.3 + 0.2 * torch.rand(3, size, size, generator=g)
            mask = torch.zeros(size, size, dtype=torch.uint8)
            for _ in range(int(torch.randint(1, 4, (1,), generator=g))):
                cls = int(torch.randint(1, NUM_CLASSES, (1,), generator=g))
                cy, cx = (int(v) for v in torch.randint(10, size - 10, (2,), generator=g))
                r = int(torch.randint(7, 12, (1,), generator=g))
                if cls == 1:
                    inside = ((yy - cy).abs() <= r) & ((xx - cx).abs() <= r)
                elif cls == 2:
                    inside = (yy - cy) ** 2 + (xx - cx) ** 2 <= r * r
                else:
                    inside = (((yy - cy).abs() <= 2) & ((xx - cx).abs() <= r)) | (
                        ((xx - cx).abs() <= 2) & ((yy - cy).abs() <= r)
                    )
                border = _dilate(inside, 2) & ~inside
                colour = torch.rand(3, 1, 1, generator=g) * 0.4 + 0.1 + 0.2 * cls
                img = torch.where(inside, colour.clamp(0, 1), img)
                mask[border & (mask == 0)] = IGNORE
                mask[inside] = cls
            arr = (img.clamp(0, 1) * 255).round().to(torch.uint8).permute(1, 2, 0).numpy()
            self.items.append((Image.fromarray(arr, "RGB"), Image.fromarray(mask.numpy(), "L")))

    def __len__(self):
        return len(self.items)

    def __getitem__(self, i):
        img, target = self.items[i]
        if self.transforms is not None:
            img, target = self.transforms(img, target)
        return img, target


def _dilate(m, k):
    out = m.clone()
    for dy in range(-k, k + 1):
        for dx in range(-k, k + 1):
            out |= torch.roll(m, (dy, dx), (0, 1))
    return out


# ---------------------------------------------------------------------------------------------------
# utils.py


def cat_list(images, fill_value=0):
    max_size = tuple(max(s) for s in zip(*[img.shape for img in images]))
    batched = images[0].new_full((len(images),) + max_size, fill_value)
    for img, pad in zip(images, batched):
        pad[..., : img.shape[-2], : img.shape[-1]].copy_(img)
    return batched


def collate_fn(batch):
    images, targets = list(zip(*batch))
    return cat_list(images, fill_value=0), cat_list(targets, fill_value=IGNORE)


class ConfusionMatrix:
    def __init__(self, num_classes):
        self.num_classes = num_classes
        self.mat = None

    def update(self, a, b):
        n = self.num_classes
        if self.mat is None:
            self.mat = torch.zeros((n, n), dtype=torch.int64, device=a.device)
        with torch.no_grad():
            k = (a >= 0) & (a < n)
            inds = n * a[k].to(torch.int64) + b[k]
            self.mat += torch.bincount(inds, minlength=n**2).reshape(n, n)

    def compute(self):
        h = self.mat.float()
        acc_global = torch.diag(h).sum() / h.sum()
        acc = torch.diag(h) / h.sum(1)
        iu = torch.diag(h) / (h.sum(1) + h.sum(0) - torch.diag(h))
        return acc_global, acc, iu


def save_on_master(obj, path):
    torch.save(obj, path)


# ---------------------------------------------------------------------------------------------------
# train.py


def get_dataset(args, image_set, transform):
    n, seed = (32, 0) if image_set == "train" else (8, 1)
    return SyntheticVOC(n, seed, transforms=transform), NUM_CLASSES


def data_loaders(args):
    dataset, _ = get_dataset(args, "train", get_transform(True, args))
    dataset_test, _ = get_dataset(args, "val", get_transform(False, args))
    data_loader = torch.utils.data.DataLoader(
        dataset,
        batch_size=args.batch_size,
        sampler=torch.utils.data.RandomSampler(dataset),
        num_workers=args.workers,
        collate_fn=collate_fn,
        drop_last=True,
    )
    data_loader_test = torch.utils.data.DataLoader(
        dataset_test,
        batch_size=1,
        sampler=torch.utils.data.SequentialSampler(dataset_test),
        num_workers=args.workers,
        collate_fn=collate_fn,
    )
    return data_loader, data_loader_test


def make_model(num_classes, aux_loss):
    """fcn_resnet50's assembly (torchvision.models.segmentation.fcn._fcn_resnet) on a tiny ResNet."""
    backbone = resnet.ResNet(resnet.BasicBlock, [1, 1, 1, 1])
    return_layers = {"layer4": "out"}
    if aux_loss:
        return_layers["layer3"] = "aux"
    backbone = IntermediateLayerGetter(backbone, return_layers=return_layers)
    aux_classifier = FCNHead(256, num_classes) if aux_loss else None
    classifier = FCNHead(512, num_classes)
    return FCN(backbone, classifier, aux_classifier)


def criterion(inputs, target):
    losses = {}
    for name, x in inputs.items():
        losses[name] = nn.functional.cross_entropy(x, target, ignore_index=IGNORE)
    if len(losses) == 1:
        return losses["out"]
    return losses["out"] + 0.5 * losses["aux"]


def build(args, iters_per_epoch, num_classes=NUM_CLASSES):
    """model, optimizer, lr_scheduler: main() from the model to the LambdaLR."""
    model = make_model(num_classes, args.aux_loss)
    params_to_optimize = [
        {"params": [p for p in model.backbone.parameters() if p.requires_grad]},
        {"params": [p for p in model.classifier.parameters() if p.requires_grad]},
    ]
    if args.aux_loss:
        params = [p for p in model.aux_classifier.parameters() if p.requires_grad]
        params_to_optimize.append({"params": params, "lr": args.lr * 10})
    optimizer = torch.optim.SGD(params_to_optimize, lr=args.lr, momentum=args.momentum, weight_decay=args.weight_decay)
    total = iters_per_epoch * args.epochs
    lr_scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda x: (1 - x / total) ** 0.9)
    return model, optimizer, lr_scheduler


def train_iteration(model, criterion, optimizer, lr_scheduler, image, target):
    """The body of train_one_epoch's loop."""
    output = model(image)
    loss = criterion(output, target)
    optimizer.zero_grad()
    loss.backward()
    optimizer.step()
    lr_scheduler.step()
    return loss


def train_one_epoch(model, criterion, optimizer, data_loader, lr_scheduler, device, epoch, print_freq):
    model.train()
    for image, target in data_loader:
        image, target = image.to(device), target.to(device)
        train_iteration(model, criterion, optimizer, lr_scheduler, image, target)


def evaluate(model, data_loader, device, num_classes):
    model.eval()
    confmat = ConfusionMatrix(num_classes)
    with torch.no_grad():
        for image, target in data_loader:
            image, target = image.to(device), target.to(device)
            output = model(image)["out"]
            confmat.update(target.flatten(), output.argmax(1).flatten())
    return confmat


def checkpoint_dict(model_without_ddp, optimizer, lr_scheduler, epoch, args):
    return {
        "model": model_without_ddp.state_dict(),
        "optimizer": optimizer.state_dict(),
        "lr_scheduler": lr_scheduler.state_dict(),
        "epoch": epoch,
        "args": args,
    }


def resume(path, model_without_ddp, optimizer, lr_scheduler, args, load=torch.load):
    """The ``if args.resume:`` block of main(): torch.load without a weights_only argument."""
    checkpoint = load(path, map_location="cpu")
    model_without_ddp.load_state_dict(checkpoint["model"])
    optimizer.load_state_dict(checkpoint["optimizer"])
    lr_scheduler.load_state_dict(checkpoint["lr_scheduler"])
    args.start_epoch = checkpoint["epoch"] + 1
    return args.start_epoch


def main(args):
    """The whole reference loop (not used by the checks; kept so the module is the script)."""
    data_loader, data_loader_test = data_loaders(args)
    model, optimizer, lr_scheduler = build(args, len(data_loader))
    if args.resume:
        resume(args.resume, model, optimizer, lr_scheduler, args)
    for epoch in range(args.start_epoch, args.epochs):
        train_one_epoch(model, criterion, optimizer, data_loader, lr_scheduler, args.device, epoch, args.print_freq)
        evaluate(model, data_loader_test, device=args.device, num_classes=NUM_CLASSES)
        save_on_master(
            checkpoint_dict(model, optimizer, lr_scheduler, epoch, args),
            os.path.join(args.output_dir, f"model_{epoch}.pth"),
        )
    return model
