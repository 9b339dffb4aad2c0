from __future__ import annotations

from typing import Any

import torch

from ...errors import MISSING
from ...registry import Setting, check
from . import measure as V


def _batch_size(dlcheck: Any) -> tuple[int | None, str]:
    loader = dlcheck.role("dataloader")
    if loader is not MISSING:
        bs = V.loader_batch_size(loader)
        if bs is not None:
            return bs, f"dlcheck_dataloader batch_size={bs}"
    args = dlcheck.role("training_args")
    bs = getattr(args, "per_device_train_batch_size", None) if args is not MISSING else None
    if isinstance(bs, int):
        return bs, f"per_device_train_batch_size={bs}"
    return None, ""


@check(
    "V7",
    domain="vision",
    title="BatchNorm trained with tiny per-device batches",
    optional_roles=("model", "dataloader", "training_args"),
    settings=(
        Setting(
            "min_batch_size",
            8,
            "smallest per-device batch for BatchNorm in training mode: below 8 images the "
            "batch statistics are noisy and accuracy drops (Wu & He 2018: +1 pt at 8, +4 at 4, +11 at 2)",
        ),
    ),
)
def check_batchnorm_batch(dlcheck):
    """BatchNorm layers that train see enough examples per device, or are frozen / synchronised.

    What it does
        Counts the model's BatchNorm layers that are in training mode and neither frozen
        (FrozenBatchNorm2d, or eval mode) nor SyncBatchNorm, and fails when the per-device batch
        (dlcheck_dataloader.batch_size, or TrainingArguments.per_device_train_batch_size) is below 8.
    Why it is bad
        In training mode BatchNorm normalises with the statistics of the current batch: with 2 images
        they are noise, the running statistics used at eval drift away from the true ones, and accuracy
        drops sharply (a batch-size-2 fine-tune of a pretrained ResNet destroys its BatchNorm statistics).
    Example
        resnet18(); DataLoader(ds, batch_size=2); model.train()
    Use instead
        Freeze BatchNorm when the batch is small: torchvision.ops.misc.FrozenBatchNorm2d /
        timm.layers.freeze_batch_norm_2d(model) (torchvision detection builders do it when given
        weights_backbone), or nn.SyncBatchNorm.convert_sync_batchnorm(model) under DDP with a large global
        batch, or GroupNorm (timm create_model(..., norm_layer=...)); or raise the batch size.
    Known problems
        The model is judged in the mode it is handed over: a training loop that calls model.train() and
        then freezes BatchNorm itself is not seen (hand over the model as it trains). Gradient
        accumulation does not help BatchNorm and is not taken into account.
    Not applicable
        Models without BatchNorm: transformers (ViT, language models, CLIP towers: LayerNorm), diffusion
        UNets (GroupNorm), models normalised with GroupNorm/LayerNorm only; models that are not a
        torch.nn.Module; data without images (a language model's token batches).
    """
    model = dlcheck.role("model")
    if model is MISSING and V.diffusion_marker(dlcheck) is not None:
        model = dlcheck.role("unet")  # a diffusion training hands its denoiser over as dlcheck_unet / _pipeline
    if model is MISSING:
        V.get_vision_sample(dlcheck, "train", required=False)  # not applicable when the data holds no image
        dlcheck.require("model")
    if not isinstance(model, torch.nn.Module):
        dlcheck.not_applicable(f"V7 judges torch BatchNorm layers; dlcheck_model is a {type(model).__name__}")
    all_bn = [(n, m) for n, m in model.named_modules() if isinstance(m, torch.nn.modules.batchnorm._BatchNorm)]
    frozen = [n for n, m in model.named_modules() if type(m).__name__.startswith("FrozenBatchNorm")]
    if not all_bn and frozen:
        dlcheck.measured(
            f"all {len(frozen)} BatchNorm layers of {type(model).__name__} are frozen "
            f"({type(model.get_submodule(frozen[0])).__name__}: fixed statistics, whatever the batch size)",
            batchnorm_layers=len(frozen),
            training=0,
        )
        return
    if not all_bn:
        norms = sorted(
            {type(m).__name__ for m in model.modules() if "norm" in type(m).__name__.lower() and not list(m.children())}
        )
        dlcheck.not_applicable(
            f"{type(model).__name__} has no BatchNorm layer"
            + (f" (it normalises with {', '.join(norms[:4])})" if norms else "")
            + ": the per-device batch size does not affect its normalisation"
        )
    sync = [n for n, m in all_bn if isinstance(m, torch.nn.SyncBatchNorm)]
    bns = [(n, m) for n, m in all_bn if not isinstance(m, torch.nn.SyncBatchNorm)]
    training = [(n, m) for n, m in bns if m.training]
    if not training:
        dlcheck.measured(
            f"none of the {len(all_bn)} BatchNorm layers of {type(model).__name__} normalises with per-device batch "
            "statistics: "
            + "; ".join(
                x
                for x in (
                    f"{len(bns)} in eval mode (frozen)" if bns else "",
                    f"{len(sync)} SyncBatchNorm (statistics over the global batch)" if sync else "",
                )
                if x
            ),
            batchnorm_layers=len(all_bn),
            training=0,
            sync=len(sync),
        )
        return
    bs, where = _batch_size(dlcheck)
    if bs is None:
        dlcheck.skip(
            "missing role: define fixture dlcheck_dataloader (or dlcheck_training_args) in conftest.py: "
            f"{len(training)} BatchNorm layers train and the per-device batch size is unknown"
        )
    limit = dlcheck.setting("min_batch_size")
    kinds = sorted({type(m).__name__ for _, m in training})
    sample = V.get_vision_sample(dlcheck, "train", required=False)  # the shared sample: are the examples clips
    images = "clips" if sample is not None and sample.video else "images"
    image = images[:-1]
    if bs >= limit:
        dlcheck.measured(
            f"{where}: each BatchNorm step normalises over {bs} {images}, at least {limit}; "
            f"{len(training)} of {len(all_bn)} {'/'.join(kinds)} layers are in training mode",
            batch_size=bs,
            limit=limit,
            batchnorm_layers=len(all_bn),
            training=len(training),
        )
        return
    trainable = sum(1 for _, m in training if any(p.requires_grad for p in m.parameters(recurse=False)))
    names = ", ".join(n for n, _ in training[:3])
    evidence = [
        f"{where}: each BatchNorm step normalises over {bs} {image}{'s' if bs != 1 else ''} (limit {limit})",
        f"{len(training)} of {len(bns)} {'/'.join(kinds)} layers are in training mode ({trainable} with "
        f"trainable affine parameters), e.g. {names}",
    ]
    if V.is_tv_detection(model):
        fix = (
            "build the detector with norm_layer frozen: pass weights_backbone (torchvision then uses "
            "FrozenBatchNorm2d), or torchvision.ops.misc.FrozenBatchNorm2d / GroupNorm in the backbone; or "
            f"train with at least {limit} {images} per device"
        )
    else:
        fix = (
            "freeze BatchNorm (timm.layers.freeze_batch_norm_2d(model), or keep the BN layers in eval mode with "
            "requires_grad_(False)), convert to nn.SyncBatchNorm.convert_sync_batchnorm(model) under DDP, or use "
            f"GroupNorm; or a per-device batch of at least {limit}"
        )
    dlcheck.fail(
        evidence,
        f"BatchNorm in training mode normalises with the statistics of {bs} {image}{'s' if bs != 1 else ''}: too "
        "noisy, and its running statistics drift from what eval needs",
        fix,
    )
