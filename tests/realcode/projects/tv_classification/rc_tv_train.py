"""Re-creation of pytorch/vision references/classification (train.py, presets.py, utils.py; the version
that loads with ``torch.load(..., weights_only=True)``), shrunk to run on a 2-core CPU in seconds.

What the reference does and this module keeps:

- data: ``torchvision.datasets.ImageFolder(traindir, ClassificationPresetTrain(...))`` and the same for
  ``valdir`` with ``ClassificationPresetEval(...)`` (PIL backend, transforms v1): RandomResizedCrop +
  RandomHorizontalFlip(0.5) + PILToTensor + ConvertImageDtype(float) + Normalize(ImageNet mean/std) for
  training; Resize + CenterCrop + the same tail for evaluation. RandomSampler / SequentialSampler.
- model: ``torchvision.models.get_model("resnet18", weights=None, num_classes=...)``.
- ``nn.CrossEntropyLoss(label_smoothing=args.label_smoothing)``, SGD with momentum and weight decay on
  ``utils.set_weight_decay(model, wd, norm_weight_decay=None)`` groups (one group: every parameter).
- LR: ``LinearLR(start_factor=lr_warmup_decay, total_iters=lr_warmup_epochs)`` then
  ``CosineAnnealingLR(T_max=epochs - lr_warmup_epochs, eta_min=lr_min)`` in ``SequentialLR``; stepped
  once per *epoch* (after ``train_one_epoch``), as the reference does.
- ``utils.ExponentialMovingAverage`` (an ``AveragedModel`` with use_buffers=True), the decay adjusted as
  in main(); updated every ``model_ema_steps`` iterations, its counter reset during the warmup epochs.
- the checkpoint dict {'model', 'optimizer', 'lr_scheduler', 'epoch', 'args', 'model_ema'} written with
  ``torch.save`` (utils.save_on_master) and read back with ``torch.load(path, map_location="cpu",
  weights_only=True)`` exactly as ``--resume`` does.

Shrunk: ImageNet -> a generated 4-class ImageFolder of 40x40 PNGs (64 train / 16 val images);
crop 224 -> 32, val resize 256 -> 37; epochs 90 -> 10; warmup 5 -> 2 epochs; no DDP, no AMP,
no mixup/cutmix/auto-augment/random-erase (all off by default in the reference too). Recipe flags
(label smoothing 0.1, cosine schedule with linear warmup, --model-ema) follow the reference's documented
"new recipe" style; everything else keeps the argparse defaults of train.py.
"""

from __future__ import annotations

import argparse
import math
import os
import random
import time

import torch
import torch.utils.data
import torchvision
from torch import nn
from torchvision import transforms as T
from torchvision.transforms import InterpolationMode

IMAGENET_MEAN = (0.485, 0.456, 0.406)
IMAGENET_STD = (0.229, 0.224, 0.225)
CLASSES = ("blob_tl", "blob_tr", "blob_bl", "blob_br")


def default_args(**overrides) -> argparse.Namespace:
    """The argparse Namespace train.py builds: the reference defaults, shrunk, plus the recipe flags."""
    args = argparse.Namespace(
        data_path="",
        model="resnet18",
        device="cpu",
        batch_size=32,
        epochs=10,
        workers=0,
        opt="sgd",
        lr=0.1 * 32 / 256,  # the reference's 0.1 is for 8 GPUs x 32 images: scaled linearly to one process
        momentum=0.9,
        weight_decay=1e-4,
        norm_weight_decay=None,
        bias_weight_decay=None,
        transformer_embedding_decay=None,
        label_smoothing=0.1,
        mixup_alpha=0.0,
        cutmix_alpha=0.0,
        lr_scheduler="cosineannealinglr",
        lr_warmup_epochs=2,
        lr_warmup_method="linear",
        lr_warmup_decay=0.01,
        lr_step_size=30,
        lr_gamma=0.1,
        lr_min=0.0,
        print_freq=10,
        output_dir=".",
        resume="",
        start_epoch=0,
        cache_dataset=False,
        sync_bn=False,
        test_only=False,
        auto_augment=None,
        ra_magnitude=9,
        augmix_severity=3,
        random_erase=0.0,
        amp=False,
        world_size=1,
        dist_url="env://",
        model_ema=True,
        model_ema_steps=32,
        model_ema_decay=0.99998,
        use_deterministic_algorithms=False,
        interpolation="bilinear",
        val_resize_size=37,
        val_crop_size=32,
        train_crop_size=32,
        clip_grad_norm=None,
        ra_sampler=False,
        ra_reps=3,
        weights=None,
        backend="pil",
        use_v2=False,
        distributed=False,
    )
    for k, v in overrides.items():
        setattr(args, k, v)
    return args


# ---------------------------------------------------------------------------------------------------
# presets.py


class ClassificationPresetTrain:
    def __init__(
        self,
        *,
        crop_size,
        mean=IMAGENET_MEAN,
        std=IMAGENET_STD,
        interpolation=InterpolationMode.BILINEAR,
        hflip_prob=0.5,
        backend="pil",
    ):
        steps = []
        if backend == "tensor":
            steps.append(T.PILToTensor())
        steps.append(T.RandomResizedCrop(crop_size, interpolation=interpolation, antialias=True))
        if hflip_prob > 0:
            steps.append(T.RandomHorizontalFlip(hflip_prob))
        if backend == "pil":
            steps.append(T.PILToTensor())
        steps += [T.ConvertImageDtype(torch.float), T.Normalize(mean=mean, std=std)]
        self.transforms = T.Compose(steps)

    def __call__(self, img):
        return self.transforms(img)


class ClassificationPresetEval:
    def __init__(
        self,
        *,
        crop_size,
        resize_size=256,
        mean=IMAGENET_MEAN,
        std=IMAGENET_STD,
        interpolation=InterpolationMode.BILINEAR,
        backend="pil",
    ):
        steps = []
        if backend == "tensor":
            steps.append(T.PILToTensor())
        steps += [T.Resize(resize_size, interpolation=interpolation, antialias=True), T.CenterCrop(crop_size)]
        if backend == "pil":
            steps.append(T.PILToTensor())
        steps += [T.ConvertImageDtype(torch.float), T.Normalize(mean=mean, std=std)]
        self.transforms = T.Compose(steps)

    def __call__(self, img):
        return self.transforms(img)


# ---------------------------------------------------------------------------------------------------
# the data: an ImageFolder on disk, written once


def write_image_folder(root: str, per_class: int, seed: int) -> str:
    """root/<class>/<n>.png: a noisy grey 40x40 picture with a bright blob in the class's corner."""
    from PIL import Image

    g = torch.Generator().manual_seed(seed)
    for ci, name in enumerate(CLASSES):
        os.makedirs(os.path.join(root, name), exist_ok=True)
        for n in range(per_class):
            img = 0.35 + 0.15 * torch.rand(3, 40, 40, generator=g)
            cy, cx = (10 if ci < 2 else 28), (10 if ci % 2 == 0 else 28)
            cy += int(torch.randint(-3, 4, (1,), generator=g))
            cx += int(torch.randint(-3, 4, (1,), generator=g))
            colour = torch.rand(3, 1, 1, generator=g) * 0.5 + 0.5
            img[:, max(0, cy - 6) : cy + 6, max(0, cx - 6) : cx + 6] = colour
            arr = (img.clamp(0, 1) * 255).round().to(torch.uint8).permute(1, 2, 0).numpy()
            Image.fromarray(arr).save(os.path.join(root, name, f"{n:03d}.png"))
    return root


def load_data(traindir, valdir, args):
    interpolation = InterpolationMode(args.interpolation)
    dataset = torchvision.datasets.ImageFolder(
        traindir,
        ClassificationPresetTrain(crop_size=args.train_crop_size, interpolation=interpolation, backend=args.backend),
    )
    dataset_test = torchvision.datasets.ImageFolder(
        valdir,
        ClassificationPresetEval(
            crop_size=args.val_crop_size,
            resize_size=args.val_resize_size,
            interpolation=interpolation,
            backend=args.backend,
        ),
    )
    train_sampler = torch.utils.data.RandomSampler(dataset)
    test_sampler = torch.utils.data.SequentialSampler(dataset_test)
    return dataset, dataset_test, train_sampler, test_sampler


def data_loaders(args):
    dataset, dataset_test, train_sampler, test_sampler = load_data(
        os.path.join(args.data_path, "train"), os.path.join(args.data_path, "val"), args
    )
    data_loader = torch.utils.data.DataLoader(
        dataset,
        batch_size=args.batch_size,
        sampler=train_sampler,
        num_workers=args.workers,
        pin_memory=False,
        collate_fn=torch.utils.data.default_collate,
    )
    data_loader_test = torch.utils.data.DataLoader(
        dataset_test, batch_size=args.batch_size, sampler=test_sampler, num_workers=args.workers, pin_memory=False
    )
    return data_loader, data_loader_test


# ---------------------------------------------------------------------------------------------------
# utils.py


class ExponentialMovingAverage(torch.optim.swa_utils.AveragedModel):
    """utils.ExponentialMovingAverage: AveragedModel with an EMA avg_fn and buffers averaged too."""

    def __init__(self, model, decay, device="cpu"):
        def ema_avg(avg_model_param, model_param, num_averaged):
            return decay * avg_model_param + (1 - decay) * model_param

        super().__init__(model, device, ema_avg, use_buffers=True)


def set_weight_decay(model, weight_decay, norm_weight_decay=None):
    """utils.set_weight_decay with no special keys: normalisation params in their own group only when
    norm_weight_decay is given (None by default, so one group holds everything)."""
    norm_classes = (
        nn.modules.batchnorm._BatchNorm,
        nn.LayerNorm,
        nn.GroupNorm,
        nn.modules.instancenorm._InstanceNorm,
        nn.LocalResponseNorm,
    )
    params = {"other": [], "norm": []}

    def visit(module):
        for p in module.parameters(recurse=False):
            if not p.requires_grad:
                continue
            if norm_weight_decay is not None and isinstance(module, norm_classes):
                params["norm"].append(p)
            else:
                params["other"].append(p)
        for child in module.children():
            visit(child)

    visit(model)
    groups = []
    for key, wd in (("other", weight_decay), ("norm", norm_weight_decay)):
        if params[key]:
            groups.append({"params": params[key], "weight_decay": wd})
    return groups


def accuracy(output, target, topk=(1,)):
    with torch.inference_mode():
        maxk = max(topk)
        batch_size = target.size(0)
        _, pred = output.topk(maxk, 1, True, True)
        correct = pred.t().eq(target[None])
        return [correct[:k].flatten().sum(dtype=torch.float32) * (100.0 / batch_size) for k in topk]


# ---------------------------------------------------------------------------------------------------
# main(): the objects, built as the reference builds them


def build(args, num_classes=len(CLASSES)):
    """model, criterion, optimizer, lr_scheduler, model_ema: main() from get_model to the EMA."""
    model = torchvision.models.get_model(args.model, weights=args.weights, num_classes=num_classes)
    criterion = nn.CrossEntropyLoss(label_smoothing=args.label_smoothing)
    parameters = set_weight_decay(model, args.weight_decay, norm_weight_decay=args.norm_weight_decay)
    optimizer = torch.optim.SGD(
        parameters, lr=args.lr, momentum=args.momentum, weight_decay=args.weight_decay, nesterov="nesterov" in args.opt
    )
    main_lr_scheduler = torch.optim.lr_scheduler.CosineAnnealingLR(
        optimizer, T_max=args.epochs - args.lr_warmup_epochs, eta_min=args.lr_min
    )
    warmup_lr_scheduler = torch.optim.lr_scheduler.LinearLR(
        optimizer, start_factor=args.lr_warmup_decay, total_iters=args.lr_warmup_epochs
    )
    lr_scheduler = torch.optim.lr_scheduler.SequentialLR(
        optimizer, schedulers=[warmup_lr_scheduler, main_lr_scheduler], milestones=[args.lr_warmup_epochs]
    )
    model_ema = None
    if args.model_ema:
        adjust = args.world_size * args.batch_size * args.model_ema_steps / args.epochs
        alpha = min(1.0, (1.0 - args.model_ema_decay) * adjust)
        model_ema = ExponentialMovingAverage(model, device=args.device, decay=1.0 - alpha)
    return model, criterion, optimizer, lr_scheduler, model_ema


def train_iteration(model, criterion, optimizer, image, target, args, i, epoch, model_ema=None):
    """The body of train_one_epoch's loop for iteration ``i`` of ``epoch`` (no AMP)."""
    output = model(image)
    optimizer.zero_grad()
    loss = criterion(output, target)
    loss.backward()
    if args.clip_grad_norm is not None:
        nn.utils.clip_grad_norm_([p for g in optimizer.param_groups for p in g["params"]], args.clip_grad_norm)
    optimizer.step()
    if model_ema and i % args.model_ema_steps == 0:
        model_ema.update_parameters(model)
        if epoch < args.lr_warmup_epochs:
            # Reset ema buffer to keep copying weights during warmup period
            model_ema.n_averaged.fill_(0)
    return loss, output


def train_one_epoch(model, criterion, optimizer, data_loader, device, epoch, args, model_ema=None):
    model.train()
    for i, (image, target) in enumerate(data_loader):
        start = time.time()
        image, target = image.to(device), target.to(device)
        loss, output = train_iteration(model, criterion, optimizer, image, target, args, i, epoch, model_ema)
        accuracy(output, target, topk=(1, 2))
        _ = image.shape[0] / max(time.time() - start, 1e-9)


def evaluate(model, criterion, data_loader, device, print_freq=100, log_suffix=""):
    model.eval()
    total, correct, loss_sum = 0, 0.0, 0.0
    with torch.inference_mode():
        for image, target in data_loader:
            image = image.to(device, non_blocking=True)
            target = target.to(device, non_blocking=True)
            output = model(image)
            loss = criterion(output, target)
            (acc1,) = accuracy(output, target, topk=(1,))
            batch_size = image.shape[0]
            loss_sum += loss.item() * batch_size
            correct += acc1.item() * batch_size / 100.0
            total += batch_size
    return 100.0 * correct / max(total, 1)


def checkpoint_dict(model_without_ddp, optimizer, lr_scheduler, epoch, args, model_ema=None, scaler=None):
    checkpoint = {
        "model": model_without_ddp.state_dict(),
        "optimizer": optimizer.state_dict(),
        "lr_scheduler": lr_scheduler.state_dict(),
        "epoch": epoch,
        "args": args,
    }
    if model_ema:
        checkpoint["model_ema"] = model_ema.state_dict()
    if scaler:
        checkpoint["scaler"] = scaler.state_dict()
    return checkpoint


def save_on_master(obj, path):
    torch.save(obj, path)  # utils.save_on_master: torch.save on rank 0


def resume(path, model_without_ddp, optimizer, lr_scheduler, args, model_ema=None, weights_only=True):
    """The ``if args.resume:`` block of main()."""
    checkpoint = torch.load(path, map_location="cpu", weights_only=weights_only)
    model_without_ddp.load_state_dict(checkpoint["model"])
    if not args.test_only:
        optimizer.load_state_dict(checkpoint["optimizer"])
        lr_scheduler.load_state_dict(checkpoint["lr_scheduler"])
    args.start_epoch = checkpoint["epoch"] + 1
    if model_ema:
        model_ema.load_state_dict(checkpoint["model_ema"])
    return args.start_epoch


def main(args):
    """The whole reference loop (not used by the checks; kept so the module is the script)."""
    torch.manual_seed(0)
    random.seed(0)
    data_loader, data_loader_test = data_loaders(args)
    model, criterion, optimizer, lr_scheduler, model_ema = build(args)
    if args.resume:
        resume(args.resume, model, optimizer, lr_scheduler, args, model_ema)
    for epoch in range(args.start_epoch, args.epochs):
        train_one_epoch(model, criterion, optimizer, data_loader, args.device, epoch, args, model_ema)
        lr_scheduler.step()
        evaluate(model, criterion, data_loader_test, device=args.device)
        if model_ema:
            evaluate(model_ema, criterion, data_loader_test, device=args.device, log_suffix="EMA")
        if args.output_dir:
            ckpt = checkpoint_dict(model, optimizer, lr_scheduler, epoch, args, model_ema)
            save_on_master(ckpt, os.path.join(args.output_dir, f"model_{epoch}.pth"))
            save_on_master(ckpt, os.path.join(args.output_dir, "checkpoint.pth"))
    return model, model_ema


def steps_per_epoch(args, n_train: int) -> int:
    return math.ceil(n_train / args.batch_size)
