"""Shared vision measurement: a bounded sample of (image, target) examples from the user's dataset or
dataloader, understood whatever its shape (tuples, dicts, torchvision ``tv_tensors``, COCO annotation
lists, HF ``pixel_values`` batches, video clips (C, T, H, W) in (B, C, T, H, W) batches), plus what the vision checks share: per-channel image statistics,
transform introspection, box formats, the normalisation a model declares, the number of classes.

Everything here is imported only when a vision check runs; torch/torchvision are imported lazily so
that importing this module costs nothing."""

from __future__ import annotations

import contextlib
import inspect
import itertools
import math
import random
import sys
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any

from ...errors import MISSING, RoleError
from ...guard import eval_mode, preserved_dataloader, preserved_rng
from ...sampling import indexable, sample_rows, spread_positions
from ...session import user_call
from ..shared.diffusers_kind import trained_autoencoder

#: where an example keeps its image; pixel_values first: a transformers pipeline keeps the raw "image"/"img" column
#: beside the transformed pixel_values the model receives (run_mae's eval crops were read off the raw column)
IMAGE_KEYS = ("pixel_values", "image", "img", "images", "imgs", "input", "inputs", "x")
TARGET_KEYS = (
    "target",
    "targets",
    "label",
    "labels",
    "mask",
    "masks",
    "segmentation",
    "semantic_mask",
    "label_mask",
    "y",
    "class",
    "category",
)
BOX_FORMATS = ("xyxy", "xywh", "cxcywh")
#: an image-shaped target with at most this many distinct values is a class mask, not a photo
MAX_MASK_VALUES = 64


class VisionSampleError(Exception):
    """The data cannot be read as (image, target) examples; the checks skip with this reason, or say they
    are not applicable when the data holds no image at all (``not_images``: token batches, tabular rows)."""

    def __init__(self, message: str, not_images: bool = False, elsewhere: bool = False):
        super().__init__(message)
        self.not_images = not_images
        #: images there are, under a key of the pipeline's own that no vision check reads as the model's input
        self.elsewhere = elsewhere


# --------------------------------------------------------------------------------------------------
# one example


@dataclass
class Item:
    """One sampled example, as the model receives it (after the dataset's transform)."""

    image: Any  # torch.Tensor (C, H, W) or None
    target: Any  # the target exactly as the data gives it
    where: str  # "dlcheck_dataset[5]" / "batch 0 item 3 of dlcheck_dataloader"
    position: int | None = None
    pil: bool = False  # the image came as a PIL image (not yet a tensor)
    label: int | None = None  # classification
    soft: bool = False  # classification with a soft / one-hot target
    boxes: Any = None  # (N, 4) float tensor, values as given
    box_format: str | None = None  # "xyxy"/"xywh"/"cxcywh" when the data says (BoundingBoxes, COCO lists)
    format_source: str = ""  # what says so
    canvas: tuple[int, int] | None = None  # (H, W) the boxes live on
    labels: Any = None  # detection labels (N,)
    mask: Any = None  # (H, W) int64 segmentation mask
    mask_as_image: Any = None  # a mask that went through the transform as an image (few distinct float values)
    video: bool = False  # the image is a video clip (C, T, H, W), its frames along dim 1
    unread: str | None = None  # pixels in a layout the checks do not read (frames first), in words
    #: every view of a multi-view example (several augmented crops of one image, as SimCLR / BYOL / DINO / SwAV
    #: datasets return them), ``image`` being the first; None for an example of one image
    views: list[Any] | None = None

    @property
    def kind(self) -> str:
        if self.boxes is not None:
            return "detection"
        if self.mask is not None or self.mask_as_image is not None:
            return "segmentation"
        if self.label is not None or self.soft:
            return "classification"
        return "unknown"

    @property
    def size(self) -> tuple[int, int] | None:
        if self.canvas is not None:
            return self.canvas
        if self.image is not None and getattr(self.image, "ndim", 0) >= 2:
            return int(self.image.shape[-2]), int(self.image.shape[-1])
        if self.mask is not None:
            return int(self.mask.shape[-2]), int(self.mask.shape[-1])
        return None


@dataclass
class VisionSample:
    items: list[Item]
    source: str  # "8 examples of dlcheck_dataset"
    role: str  # the role read: dataset / dataloader / eval_dataset / eval_dataloader
    dataset: Any = None  # the map-style dataset behind the sample, when there is one
    batch_size: int | None = None
    task: str = "unknown"
    notes: list[str] = field(default_factory=list)

    def of_kind(self, kind: str) -> list[Item]:
        return [i for i in self.items if i.kind == kind]

    @property
    def images(self) -> list[Any]:
        return [i.image for i in self.items if i.image is not None]

    @property
    def video(self) -> bool:
        """The sampled inputs are video clips (C, T, H, W), not images."""
        return any(i.video for i in self.items if i.image is not None)

    @property
    def multi_view(self) -> bool:
        """The examples are several augmented views of one image (a self-supervised multi-crop pipeline)."""
        return any(i.views for i in self.items)

    @property
    def all_images(self) -> list[Any]:
        """Every tensor image the model receives: each view of a multi-view example."""
        return [v for i in self.items if i.image is not None and not i.pil for v in (i.views or [i.image])]


def _torch():
    import torch

    return torch


def as_image(x: Any) -> tuple[Any, bool]:
    """An image as a (C, H, W) tensor, and whether it was a PIL image; (None, False) if it is not one."""
    torch = _torch()
    if _is_pil(x):
        from torchvision.transforms.functional import pil_to_tensor

        return pil_to_tensor(x.convert("RGB") if x.mode not in ("RGB", "L") else x), True
    if type(x).__module__ == "numpy":
        x = torch.from_numpy(x)
        if x.ndim == 3 and x.shape[-1] in (1, 3, 4) and x.shape[0] not in (1, 3, 4):
            x = x.permute(2, 0, 1)
    if isinstance(x, torch.Tensor):
        x = x.as_subclass(torch.Tensor)
        if x.ndim == 2:
            x = x[None]
        if x.ndim == 3:
            return x, False
    return None, False


def as_clip(x: Any) -> Any:
    """A video clip as a (C, T, H, W) tensor, or None: a 4-D tensor with its 3 (RGB) or 1 (grey) channels first,
    the layout torchvision's video models take and its video reference's transforms give
    (``ConvertBCHWtoCBTHW``), or a numpy (T, H, W, C) array with the channels last (as :func:`as_image` reads a numpy
    (H, W, C) image). Frames first, (T, C, H, W), is not read: its channel axis cannot be told from a clip of 3
    frames."""
    torch = _torch()
    if type(x).__module__ == "numpy" and getattr(x, "ndim", 0) == 4:
        if x.shape[-1] in (1, 3) and x.shape[0] not in (1, 3):
            return torch.from_numpy(x).permute(3, 0, 1, 2)
        return None
    if isinstance(x, torch.Tensor) and x.ndim == 4 and not _is_mask_stack(x):
        x = x.as_subclass(torch.Tensor)
        if x.shape[0] == 3 or (x.shape[0] == 1 and x.shape[1] not in (1, 3)):
            return x
    return None


def _is_mask_stack(x: Any) -> bool:
    """An integer (N, H, W)-like stack is masks, not frames: clips hold floats or uint8 pixels."""
    torch = _torch()
    return not x.is_floating_point() and x.dtype != torch.uint8


def as_pixels(x: Any) -> tuple[Any, bool, bool]:
    """An image (C, H, W) or a video clip (C, T, H, W): (tensor, from PIL, is a clip); (None, False, False) when
    ``x`` is neither."""
    img, pil = as_image(x)
    if img is not None:
        return img, pil, False
    clip = as_clip(x)
    return (clip, False, True) if clip is not None else (None, False, False)


def unread_pixels(x: Any) -> str | None:
    """'a (T, C, H, W)-like 4-D tensor of shape (…)' when ``x`` looks like stacked frames the vision checks do not read
    (:func:`as_clip` reads channels first only), else None."""
    shape = getattr(x, "shape", None)
    if shape is None or len(shape) != 4 or as_clip(x) is not None:
        return None
    kind = str(getattr(x, "dtype", "")).removeprefix("torch.")
    if not (kind.startswith("float") or kind in ("uint8", "bfloat16", "half")):
        return None  # integer stacks are masks or ids, not pixels
    return f"4-D {type_name(x)}s of shape {tuple(int(v) for v in shape)}"


def _is_pil(x: Any) -> bool:
    return type(x).__module__.startswith("PIL.") and hasattr(x, "getbands")


def _plain(t: Any) -> Any:
    torch = _torch()
    return t.as_subclass(torch.Tensor) if isinstance(t, torch.Tensor) else t


def parse_target(item: Item, target: Any) -> None:
    """Fill the item's task fields from its target, whatever its shape."""
    torch = _torch()
    from torchvision import tv_tensors

    if isinstance(target, tv_tensors.BoundingBoxes):
        item.boxes = _plain(target).float().reshape(-1, 4)
        item.box_format = _fmt_name(target.format)
        item.format_source = f"tv_tensors.BoundingBoxes(format={item.box_format.upper()})"
        item.canvas = tuple(int(v) for v in target.canvas_size)
        return
    if isinstance(target, tv_tensors.Mask):
        item.mask = _mask(target)
        return
    if isinstance(target, tv_tensors.Image) or (
        isinstance(target, torch.Tensor)
        and target.ndim == 3
        and target.is_floating_point()
        and item.image is not None
        and tuple(target.shape[-2:]) == tuple(item.image.shape[-2:])
    ):
        # an image-shaped target: a mask that the transform treated as an image has few distinct values
        if torch.unique(_plain(target)).numel() <= MAX_MASK_VALUES:
            item.mask_as_image = _plain(target)
        return
    if isinstance(target, Mapping):
        boxes = next((target[k] for k in ("boxes", "bboxes", "bbox") if k in target), None)
        if boxes is not None:
            if isinstance(boxes, tv_tensors.BoundingBoxes):
                item.box_format = _fmt_name(boxes.format)
                item.format_source = f"tv_tensors.BoundingBoxes(format={item.box_format.upper()})"
                item.canvas = tuple(int(v) for v in boxes.canvas_size)
            item.boxes = torch.as_tensor(_plain(boxes), dtype=torch.float32).reshape(-1, 4)
            labels = next((target[k] for k in ("labels", "label", "class_labels", "category_id") if k in target), None)
            if labels is not None:
                item.labels = torch.as_tensor(_plain(labels)).reshape(-1).long()
            return
        for key in ("mask", "masks", "semantic_mask", "segmentation", "label_mask", "labels", "label", "target"):
            if key in target:
                parse_target(item, target[key])
                return
        return
    if isinstance(target, (list, tuple)) and target and all(isinstance(a, Mapping) and "bbox" in a for a in target):
        # raw COCO annotations: bbox is [x, y, w, h] by the COCO spec
        item.boxes = torch.tensor([list(a["bbox"]) for a in target], dtype=torch.float32).reshape(-1, 4)
        item.box_format = "xywh"
        item.format_source = "the COCO annotation spec (bbox = [x, y, w, h])"
        item.labels = torch.tensor([int(a.get("category_id", 0)) for a in target]).long()
        return
    if isinstance(target, (list, tuple)) and not target:
        return
    if _is_pil(target):
        import numpy as np

        item.mask = torch.from_numpy(np.array(target)).long()
        if item.mask.ndim == 3:
            item.mask = None
        return
    if isinstance(target, bool):
        return
    if isinstance(target, int) or type(target).__module__ == "numpy" and getattr(target, "ndim", 1) == 0:
        item.label = int(target)
        return
    if isinstance(target, torch.Tensor):
        t = _plain(target)
        if t.numel() == 1 and t.ndim <= 1 and not t.is_floating_point():
            item.label = int(t.reshape(()).item())
        elif t.ndim == 1 and t.is_floating_point():
            item.soft = True
        elif t.ndim >= 2 and not t.is_floating_point():
            item.mask = _mask(t)
        elif t.ndim >= 2 and t.is_floating_point() and item.image is not None and t.shape[-2:] == item.image.shape[-2:]:
            item.mask = _mask(t)  # a float mask: V5 will show its values
        return


def _mask(t: Any) -> Any:
    t = _plain(t)
    if t.ndim == 3 and t.shape[0] == 1:
        t = t[0]
    return t if t.ndim == 2 else None


def type_name(obj: Any) -> str:
    """``tv_tensors.Image``, ``Tensor``, ``PIL Image``… for evidence lines."""
    mod = type(obj).__module__
    if mod.startswith("torchvision.tv_tensors"):
        return f"tv_tensors.{type(obj).__name__}"
    if mod.startswith("PIL."):
        return "PIL image"
    return type(obj).__name__


def _fmt_name(fmt: Any) -> str:
    return str(getattr(fmt, "name", fmt)).lower()


def make_item(example: Any, where: str, position: int | None = None) -> Item:
    if isinstance(example, Mapping):
        ikey = next((k for k in IMAGE_KEYS if k in example), None)
        image = example.get(ikey) if ikey else None
        rest = {k: v for k, v in example.items() if k != ikey}
        if any(k in rest for k in ("boxes", "bboxes", "bbox")):
            target = rest
        else:
            tkey = next((k for k in TARGET_KEYS if k in rest), None)
            target = rest[tkey] if tkey else None
    elif isinstance(example, (list, tuple)) and len(example) >= 2:
        image, target = example[0], example[1]
    else:
        raise VisionSampleError(
            f"{where} is a {type(example).__name__}, not an (image, target) pair or a dict with an image",
            not_images=not _image_like(example),
        )
    views = _views(image)
    tensor, pil, video = as_pixels(views[0] if views else image)
    item = Item(tensor, target, where, position, pil=pil, video=video)
    if views:
        item.views = [v for v in (as_image(x)[0] for x in views) if v is not None]
    if tensor is None and (unread := unread_pixels(image)) is not None:
        item.unread = unread
    parse_target(item, target)
    return item


def _views(image: Any) -> list[Any] | None:
    """The views of a multi-view example (a list or tuple of two or more images: the crops a multi-crop transform
    returns for one image), else None."""
    if (
        isinstance(image, (list, tuple))
        and len(image) >= 2
        and all(_image_like(x) and as_image(x)[0] is not None for x in image)
    ):
        return list(image)
    return None


def _view_batches(images: Any) -> int | None:
    """The batch size of a multi-view batch's images, or None: a list or tuple of two or more stacked (B, C, H, W)
    image batches of one B (the default collate of examples that each hold a list of crops; the crops may differ in
    size from view to view)."""
    torch = _torch()
    if not isinstance(images, (list, tuple)) or len(images) < 2:
        return None
    if not all(isinstance(v, torch.Tensor) and v.ndim == 4 and _image_like(v[0]) for v in images if len(v)):
        return None
    sizes = {len(v) for v in images}
    return sizes.pop() if len(sizes) == 1 else None


def _rows_of(value: Any, n: int) -> list[Any] | None:
    torch = _torch()
    if isinstance(value, torch.Tensor) and value.ndim >= 1 and len(value) == n:
        return list(value)
    if isinstance(value, (list, tuple)) and len(value) == n:
        return list(value)
    return None


def unbatch(batch: Any, where: str) -> list[tuple[Any, Any]]:
    """The examples of one collated batch, as (image, target) pairs."""
    torch = _torch()
    if isinstance(batch, Mapping):
        ikey = next((k for k in IMAGE_KEYS if k in batch), None)
        if ikey is None:
            other = [
                k
                for k, v in batch.items()
                if isinstance(v, torch.Tensor) and v.ndim == 4 and v.is_floating_point() and v.shape[1] in (1, 3)
            ]
            if other:
                raise VisionSampleError(
                    f"{where} has no image field the vision checks read as the model's input ({', '.join(IMAGE_KEYS)}): "
                    f"{', '.join(map(str, other))} holds images ({tuple(batch[other[0]].shape)}) under a name of the "
                    f"pipeline's own (keys: {', '.join(map(str, batch))}): which model takes them is not read (an "
                    "image encoder beside the trained model, as a diffusion prior's CLIP encoder)",
                    not_images=True,
                    elsewhere=True,
                )
            raise VisionSampleError(f"{where} has no image field (keys: {', '.join(map(str, batch))})", not_images=True)
        images = batch[ikey]
        n = len(images)
        per_key = {k: _rows_of(v, n) for k, v in batch.items() if k != ikey}
        per_key = {k: v for k, v in per_key.items() if v is not None}
        out = []
        for i in range(n):
            out.append((images[i], {k: v[i] for k, v in per_key.items()}))
        return out
    if isinstance(batch, (list, tuple)) and len(batch) >= 2:
        images, targets = batch[0], batch[1]
        column = isinstance(images, (list, tuple)) and all(_image_like(x) for x in images)
        stacked = isinstance(images, torch.Tensor) and (
            images.ndim == 4 or images.ndim == 5 and len(images) and as_clip(images[0]) is not None
        )
        views_n = _view_batches(images) if not (column and _rows_of(targets, len(images)) is not None) else None
        if views_n is not None:  # a multi-view batch: each example's views, one from each stacked batch
            images = [[v[i] for v in images] for i in range(views_n)]
        if stacked or column or views_n is not None:
            n = len(images)
            if isinstance(targets, Mapping):
                cols = {k: _rows_of(v, n) for k, v in targets.items()}
                rows = [{k: v[i] for k, v in cols.items() if v is not None} for i in range(n)]
            else:
                rows = _rows_of(targets, n)
            if rows is None:
                raise VisionSampleError(f"{where}: {n} images but targets of type {type(targets).__name__}")
            return list(zip(list(images), rows))
    if isinstance(batch, (list, tuple)) and batch and all(isinstance(b, (list, tuple)) and len(b) >= 2 for b in batch):
        return [(b[0], b[1]) for b in batch]  # a list of examples (collate_fn=list)
    first = batch[0] if isinstance(batch, (list, tuple)) and batch else batch
    if getattr(first, "ndim", 0) == 5:
        raise VisionSampleError(
            f"{where} holds 5-D {type_name(first)}s of shape {tuple(first.shape)}: video clips whose layout the vision "
            "checks do not read (they read clips channels first, (batch, C, T, H, W) with C = 3 or 1)"
        )
    raise VisionSampleError(
        f"{where} is a {type(batch).__name__}: expected (images, targets) or a dict with pixel_values",
        not_images=not (_image_like(first) or getattr(first, "ndim", 0) == 4),
    )


def _image_like(x: Any) -> bool:
    """An image (PIL, a (C, H, W) tensor) or a video clip (:func:`as_clip`)."""
    torch = _torch()
    return _is_pil(x) or isinstance(x, torch.Tensor) and (x.ndim == 3 or as_clip(x) is not None)


def base_dataset(ds: Any) -> Any:
    """Through Subset / torchvision's tv_tensors wrapper to the dataset that owns the transforms."""
    seen = 0
    while seen < 10:
        seen += 1
        if type(ds).__name__ == "Subset" and hasattr(ds, "dataset") and hasattr(ds, "indices"):
            ds = ds.dataset
            continue
        inner = getattr(ds, "_dataset", None) if type(ds).__name__ == "VisionDatasetTVTensorWrapper" else None
        if inner is not None:
            return ds  # the wrapper holds the transforms it took from the inner dataset
        break
    return ds


def user_defined(ctx: Any, name: str) -> bool:
    """Whether the user's conftest defines ``dlcheck_<name>`` (not derived)."""
    import pytest

    try:
        ctx.request.getfixturevalue(f"dlcheck_{name}")
    except pytest.FixtureLookupError:
        return False
    return True


def split_roles(split: str) -> tuple[str, str]:
    return ("dataset", "dataloader") if split == "train" else ("eval_dataset", "eval_dataloader")


def data_source(ctx: Any, split: str = "train") -> tuple[str, Any]:
    """(role, object) of the data a split can be read from: the dataset, else the dataloader."""
    ds_role, dl_role = split_roles(split)
    ds = ctx.role(ds_role)
    if ds is not MISSING:
        return ds_role, ds
    dl = ctx.role(dl_role)
    if dl is not MISSING:
        return dl_role, dl
    return "", MISSING


def map_dataset(ctx: Any, split: str = "train") -> Any:
    """A map-style dataset for the split: the dataset role, or the dataloader's own dataset."""
    ds_role, dl_role = split_roles(split)
    ds = ctx.role(ds_role)
    if ds is MISSING:
        dl = ctx.role(dl_role)
        ds = getattr(dl, "dataset", None) if dl is not MISSING else None
    if ds is None or ds is MISSING:
        return None
    return ds if indexable(ds) else None


def stream_dataset(ctx: Any, split: str = "train") -> Any:
    """The split's dataset (the dataset role, or the dataloader's own dataset) when it is read by iterating it (an
    IterableDataset, with or without a length) and starts over at every iteration; None otherwise: a map-style
    dataset (:func:`map_dataset`), or a one-shot iterator, which reading would consume."""
    ds_role, dl_role = split_roles(split)
    ds = ctx.role(ds_role)
    if ds is MISSING:
        dl = ctx.role(dl_role)
        ds = getattr(dl, "dataset", None) if dl is not MISSING else None
    if ds is None or ds is MISSING or indexable(ds) or not hasattr(ds, "__iter__"):
        return None
    return None if hasattr(ds, "__next__") else ds


def missing_data_reason(split: str = "train") -> str:
    ds_role, dl_role = split_roles(split)
    return f"missing role: define fixture dlcheck_{dl_role} or dlcheck_{ds_role} in conftest.py"


def _read_dataset(dataset: Any, n: int, role: str) -> tuple[list[Item], list[int] | None]:
    rows, positions = sample_rows(dataset, n, role)
    items = []
    for k, row in enumerate(rows):
        pos = positions[k] if positions is not None else k
        items.append(make_item(row, f"dlcheck_{role}[{pos}]", pos))
    return items, positions


def _read_loader(loader: Any, n: int, role: str) -> list[Item]:
    items: list[Item] = []
    with preserved_dataloader(loader), first_read(loader):
        it = user_call(role, lambda: iter(loader))
        b = 0
        while len(items) < n and b < n:
            batch = user_call(role, lambda: next(it, None))
            if batch is None:
                break
            for i, (image, target) in enumerate(unbatch(batch, f"batch {b} of dlcheck_{role}")):
                items.append(make_item((image, target), f"dlcheck_{role} batch {b} item {i}"))
            b += 1
        it = None  # stop worker processes now
    return items[:n]


@contextlib.contextmanager
def first_read(loader: Any) -> Iterator[None]:
    """Read a DataLoader as its first epoch reads it. With ``persistent_workers`` the workers, and the RNG
    states their random transforms draw from, live on between epochs, so what a read sees would depend on
    how often the loader was read before (by the user, by another check): the read goes through fresh
    workers (seeded from the global RNG, as a first epoch's are), which are shut down afterwards, and the
    loader's own iterator is put back as it was."""
    persistent = getattr(loader, "persistent_workers", False) and getattr(loader, "num_workers", 0) > 0
    if not persistent or not hasattr(loader, "_iterator"):
        yield
        return
    kept = loader._iterator
    loader._iterator = None
    try:
        yield
    finally:
        fresh, loader._iterator = loader._iterator, kept
        if fresh is not None and fresh is not kept and hasattr(fresh, "_shutdown_workers"):
            fresh._shutdown_workers()


def loader_batch_size(loader: Any) -> int | None:
    bs = getattr(loader, "batch_size", None)
    if bs is None:
        bs = getattr(getattr(loader, "batch_sampler", None), "batch_size", None)
    return int(bs) if isinstance(bs, int) else None


def _task(items: list[Item]) -> str:
    kinds = [i.kind for i in items if i.kind != "unknown"]
    if not kinds:
        return "unknown"
    return max(set(kinds), key=kinds.count)


def get_vision_sample(ctx: Any, split: str = "train", required: bool = True) -> VisionSample | None:
    """The shared, memoised sample of (image, target) examples of a split. Reads the dataset (at
    ``ctx.samples`` spread positions) when it yields tensors, else the dataloader's first batches.
    Skips (``required``) or returns None when there is no data or it cannot be read."""
    ds_role, dl_role = split_roles(split)
    ds, dl = ctx.role(ds_role), ctx.role(dl_role)
    if ds is MISSING and dl is MISSING:
        marker = rl_marker(ctx)
        if marker is not None:
            ctx.not_applicable(
                f"an RL training ({marker}): it learns from an environment, with no image dataset or dataloader "
                "for the vision checks to read"
            )
        if required:
            ctx.skip(missing_data_reason(split))
        return None
    n = ctx.samples
    sources = tuple(o for o in (ds, dl) if o is not MISSING)

    def make() -> VisionSample:
        # the same sample whoever makes it and whatever ran before: the RNGs start from one seed (a check
        # that drew before asking, or none, would otherwise see other random crops and erasings), and a
        # loader's persistent workers are not reused (their RNGs advance with every earlier read)
        with seeded(0):
            if ds is not MISSING:
                items, _ = _read_dataset(ds, n, ds_role)
                if not items:
                    raise VisionSampleError(f"dlcheck_{ds_role} is empty")
                untensored = all(i.image is None or i.pil for i in items)
                if dl is MISSING and all(i.image is None for i in items):
                    raise _no_image(items, f"dlcheck_{ds_role}")
                if not (untensored and dl is not MISSING):
                    sample = VisionSample(items, f"{len(items)} examples of dlcheck_{ds_role}", ds_role, ds)
                    if untensored:
                        sample.notes.append(f"dlcheck_{ds_role} yields PIL images, not tensors")
                    dropped = _targets_dropped(dl, dl_role, items)
                    if dropped:
                        for item in items:
                            item.target = item.label = item.boxes = item.labels = item.mask = None
                            item.mask_as_image, item.soft = None, False
                        sample.notes.append(dropped)
                    return sample
            items = _read_loader(dl, n, dl_role)
            if not items:
                raise VisionSampleError(f"dlcheck_{dl_role} yielded no batch")
            if all(i.image is None for i in items):
                raise _no_image(items, f"dlcheck_{dl_role}")
            return VisionSample(
                items, f"{len(items)} examples from batches of dlcheck_{dl_role}", dl_role, getattr(dl, "dataset", None)
            )

    result = ctx.memo(sources, f"vision:sample:{split}:{n}", lambda: _capture(make))
    if isinstance(result, BaseException):
        if isinstance(result, VisionSampleError):
            if result.not_images:
                ctx.not_applicable(
                    f"{result}: no vision check reads them"
                    if getattr(result, "elsewhere", False)
                    else f"{result}: the data holds no images, so no vision check concerns it"
                )
            if required:
                ctx.skip(str(result))
            return None
        raise result
    if dl is not MISSING:
        result.batch_size = loader_batch_size(dl)
    result.task = _task(result.items)
    if result.multi_view and result.task == "classification":
        result.task = "views"  # the labels beside self-supervised views are no class targets of the model's outputs
    return result


def _targets_dropped(loader: Any, role: str, items: list[Item]) -> str | None:
    """Why the examples' targets are not what the model trains on, or None: the dataset's examples carry a target
    (a 'label' column) that the loader's collated batches leave out (run_mim's collate_fn keeps pixel_values and
    bool_masked_pos only): the model is trained on no such target. One batch of the loader is read."""
    if loader is MISSING or not any(i.target is not None for i in items):
        return None
    with preserved_dataloader(loader), first_read(loader):
        it = user_call(role, lambda: iter(loader))
        batch = user_call(role, lambda: next(it, None))
        it = None  # stop worker processes now
    if not isinstance(batch, Mapping) or any(k in batch for k in TARGET_KEYS):
        return None
    keys = ", ".join(map(str, list(batch)[:6]))
    return (
        f"the batches of dlcheck_{role} carry no target (keys: {keys}): the collator leaves the examples' targets "
        "out, so the model trains on none"
    )


def _no_image(items: list[Item], where: str) -> VisionSampleError:
    """The examples hold no image the checks read: stacked frames in a layout they do not read (a video clip frames
    first) say so, as a reason to skip; else the data holds no image at all (not applicable)."""
    unread = next((i.unread for i in items if i.unread), None)
    if unread is not None:
        return VisionSampleError(
            f"the examples of {where} hold {unread}: video clips whose layout the vision checks do not read (they "
            "read clips channels first, (C, T, H, W) with C = 3 or 1)"
        )
    return VisionSampleError(f"the examples of {where} carry no image", not_images=True)


def _capture(make: Callable[[], Any]) -> Any:
    try:
        return make()
    except (VisionSampleError, RoleError) as exc:
        return exc


# --------------------------------------------------------------------------------------------------
# image statistics


@dataclass
class Stats:
    mean: list[float]
    std: list[float]
    min: float
    max: float
    dtype: str
    n: int
    cmin: list[float] = field(default_factory=list)  # per channel
    cmax: list[float] = field(default_factory=list)
    #: each image's per-channel mean (their spread is the sampling noise of ``mean``)
    image_means: list[list[float]] = field(default_factory=list)

    @property
    def absmax(self) -> float:
        return max(abs(self.min), abs(self.max))

    def describe(self) -> str:
        return (
            f"dtype {self.dtype}, per-channel mean ({fmt_seq(self.mean)}) std ({fmt_seq(self.std)}), "
            f"range {self.min:.3g} to {self.max:.3g}"
        )


def fmt_num(v: float) -> str:
    if v == 0:
        return "0"
    if abs(v) >= 100:
        return f"{v:.1f}"
    return f"{v:.3g}"


def fmt_seq(values: Any) -> str:
    return ", ".join(fmt_num(float(v)) for v in values)


def channel_stats(images: list[Any]) -> Stats | None:
    """Per-channel mean/std and the overall range of some (C, H, W) images or (C, T, H, W) video clips, every frame
    of a clip counted (all of one channel count)."""
    torch = _torch()
    imgs = [i for i in images if isinstance(i, torch.Tensor) and i.ndim in (3, 4)]
    if not imgs:
        return None
    c = imgs[0].shape[0]
    imgs = [i for i in imgs if i.shape[0] == c]
    dtype = str(imgs[0].dtype).removeprefix("torch.")
    flat = torch.cat([i.detach().to("cpu", torch.float64).reshape(c, -1) for i in imgs], dim=1)
    return Stats(
        flat.mean(1).tolist(),
        flat.std(1).tolist(),
        float(flat.min()),
        float(flat.max()),
        dtype,
        len(imgs),
        flat.min(1).values.tolist(),
        flat.max(1).values.tolist(),
        [i.detach().to("cpu", torch.float64).reshape(c, -1).mean(1).tolist() for i in imgs],
    )


# --------------------------------------------------------------------------------------------------
# transforms


def tname(t: Any) -> str:
    """A transform's class name; a torch.jit.script'ed one (run_clip's scripted Transform) by the class it was
    scripted from (its ``original_name``), not RecursiveScriptModule."""
    original = getattr(t, "original_name", None) if type(t).__name__ == "RecursiveScriptModule" else None
    return original if isinstance(original, str) else type(t).__name__


def transform_children(t: Any) -> list[Any]:
    kids: list[Any] = []
    name = tname(t)
    if name == "StandardTransform":
        return [x for x in (t.transform, t.target_transform) if x is not None]
    inner = getattr(t, "transforms", None)
    if isinstance(inner, (list, tuple)) or tname(inner) in ("ModuleList", "Sequential"):
        kids.extend(list(inner))
    elif callable(inner) and inner is not t:
        kids.append(inner)
    if not kids and name == "Sequential":
        kids.extend(list(t.children()))
    for attr in ("transform", "base_transform"):
        sub = getattr(t, attr, None)
        if sub is not None and callable(sub) and sub is not t and not kids and not inspect.ismethod(sub):
            kids.append(sub)
    return kids


def walk_transforms(t: Any, depth: int = 0) -> Iterator[Any]:
    if t is None or t is MISSING or depth > 12:
        return
    kids = transform_children(t)
    if not kids:
        yield t
        return
    yield t
    for k in kids:
        yield from walk_transforms(k, depth + 1)


def image_transform(t: Any) -> Any:
    """The part of a (joint) transform that touches the image."""
    if tname(t) == "StandardTransform":
        return t.transform
    return t


def find_normalize(t: Any) -> tuple[list[float], list[float], Any] | None:
    for leaf in walk_transforms(image_transform(t)):
        if tname(leaf) in ("Normalize", "NormalizeImage") and hasattr(leaf, "mean") and hasattr(leaf, "std"):
            return [float(v) for v in _seq(leaf.mean)], [float(v) for v in _seq(leaf.std)], leaf
    return None


def _seq(v: Any) -> list[Any]:
    if hasattr(v, "tolist"):
        v = v.tolist()
    if isinstance(v, (int, float)):
        return [v]
    return list(v)


RANDOM_NAMES = {
    "ColorJitter",
    "RandAugment",
    "TrivialAugmentWide",
    "AutoAugment",
    "AugMix",
    "GaussianBlur",
    "GaussianNoise",
    "ElasticTransform",
    "MixUp",
    "CutMix",
    "ScaleJitter",
    "JPEG",
}


def random_transforms(t: Any) -> list[Any]:
    out = []
    for leaf in walk_transforms(image_transform(t)):
        name = tname(leaf)
        if name.startswith("Random") or name in RANDOM_NAMES:
            p = getattr(leaf, "p", None)
            if isinstance(p, (int, float)) and p == 0:
                continue
            out.append(leaf)
    return out


def short(t: Any, width: int = 90) -> str:
    text = " ".join(repr(t).split())
    return text if len(text) <= width else text[: width - 1] + "…"


def pipeline(t: Any) -> str:
    """A one-line description of a transform pipeline: leaf class names in order."""
    leaves = [leaf for leaf in walk_transforms(t) if not transform_children(leaf)]
    names = []
    for leaf in leaves:
        name = tname(leaf)
        if name == "ToDtype":
            dt = getattr(leaf, "dtype", None)
            dt = str(dt).removeprefix("torch.") if not isinstance(dt, Mapping) else "…"
            name = f"ToDtype({dt}, scale={getattr(leaf, 'scale', False)})"
        elif name == "Normalize":
            name = f"Normalize(mean=({fmt_seq(_seq(leaf.mean))}), std=({fmt_seq(_seq(leaf.std))}))"
        names.append(name)
    return " → ".join(names) if names else tname(t)


def synthetic_pil(width: int = 96, height: int = 96, seed: int = 0) -> Any:
    """A deterministic noise RGB image, like a decoded photo (uint8)."""
    import numpy as np
    from PIL import Image

    rng = np.random.default_rng(seed)
    return Image.fromarray(rng.integers(0, 256, size=(height, width, 3), dtype=np.uint8), "RGB")


def apply_image_transform(t: Any, image: Any) -> Any:
    """Run a (possibly joint) transform on an image alone; returns the transformed image."""
    if type(t).__name__ == "StandardTransform":
        return t.transform(image) if t.transform is not None else image
    out = t(image)
    if isinstance(out, tuple) and len(out) == 2 and not _looks_like_image(out):
        out = out[0]
    return out


def _looks_like_image(x: Any) -> bool:
    return as_image(x)[0] is not None


@contextlib.contextmanager
def seeded(seed: int) -> Iterator[None]:
    """Seed python/numpy/torch for one reproducible draw, restoring the states afterwards."""
    torch = _torch()
    with preserved_rng():
        random.seed(seed)
        torch.manual_seed(seed)
        try:
            import numpy as np

            np.random.seed(seed)
        except ImportError:
            pass
        yield


# --------------------------------------------------------------------------------------------------
# boxes


def parse_box_format(text: Any) -> tuple[str, bool] | None:
    """'xyxy', 'XYWH', 'cxcywh-normalized', BoundingBoxFormat.XYXY… -> (format, normalized)."""
    if text is None or text is MISSING:
        return None
    s = _fmt_name(text).lower().replace("_", "").replace("-", "").replace(" ", "")
    normalized = "norm" in s or "relative" in s or "rel" == s[:3]
    for f in ("cxcywh", "xyxy", "xywh"):
        if f in s:
            return f, normalized
    return None


def to_xyxy(boxes: Any, fmt: str, size: tuple[int, int] | None = None, normalized: bool = False) -> Any:
    from torchvision.ops import box_convert

    b = _plain(boxes).float().reshape(-1, 4)
    if normalized and size is not None:
        h, w = size
        b = b * b.new_tensor([w, h, w, h])
    return box_convert(b, fmt, "xyxy") if fmt != "xyxy" else b.clone()


def box_problems(xyxy: Any, size: tuple[int, int] | None, tol: float) -> list[str]:
    """Why each xyxy box is invalid ('' when valid): positive width/height, inside the image."""
    out = []
    for x1, y1, x2, y2 in xyxy.tolist():
        why = []
        if not (x2 > x1):
            why.append("x2 <= x1")
        if not (y2 > y1):
            why.append("y2 <= y1")
        if size is not None:
            h, w = size
            tx, ty = tol * w + 1.0, tol * h + 1.0
            if min(x1, x2) < -tx or min(y1, y2) < -ty:
                why.append("starts left/above the image")
            if max(x1, x2) > w + tx or max(y1, y2) > h + ty:
                why.append(f"ends outside the {w}×{h} image")
        out.append(", ".join(why))
    return out


def fmt_box(b: Any) -> str:
    return "[" + ", ".join(f"{float(v):.1f}" for v in _seq(b)) + "]"


def is_tv_detection(model: Any) -> bool:
    mod = type(model).__module__
    return mod.startswith("torchvision.models.detection") and hasattr(model, "transform") and hasattr(model, "backbone")


def is_rcnn(model: Any) -> bool:
    return is_tv_detection(model) and hasattr(model, "roi_heads") and hasattr(model, "rpn")


def model_name(model: Any) -> str:
    cfg = getattr(model, "pretrained_cfg", None)
    arch = cfg.get("architecture") if isinstance(cfg, Mapping) else None
    return f"{type(model).__name__}" + (f" ({arch})" if arch and arch.lower() != type(model).__name__.lower() else "")


# --------------------------------------------------------------------------------------------------
# what the model expects


@dataclass
class Declared:
    mean: list[float] | None
    std: list[float] | None
    source: str
    internal: bool = False  # the model normalises its inputs itself (torchvision detection)


def declared_normalization(ctx: Any) -> Declared | None:
    """The input normalisation the model declares, read offline from what the library ships."""
    model = ctx.role("model")
    if model is not MISSING and is_tv_detection(model):
        t = model.transform
        return Declared(
            list(map(float, t.image_mean)),
            list(map(float, t.image_std)),
            f"{type(model).__name__}.transform (GeneralizedRCNNTransform) normalises inputs itself",
            True,
        )
    weights = ctx.role("weights")
    if weights is not MISSING:
        try:
            tf = weights.transforms()
        except Exception:  # noqa: BLE001 - a weights object without transforms
            tf = None
        mean, std = getattr(tf, "mean", None), getattr(tf, "std", None)
        if mean is not None and std is not None:
            return Declared(list(map(float, mean)), list(map(float, std)), f"dlcheck_weights {weights}.transforms()")
    proc = ctx.role("image_processor")
    if proc is not MISSING and getattr(proc, "image_mean", None) is not None:
        if getattr(proc, "do_normalize", True):
            return Declared(
                list(map(float, _seq(proc.image_mean))),
                list(map(float, _seq(proc.image_std))),
                f"{type(proc).__name__}.image_mean/image_std",
            )
    if model is not MISSING:
        saved = ctx.memo(model, "vision:saved-image-processor", lambda: saved_image_processor(model))
        if saved is not None:
            proc, where = saved
            return Declared(
                list(map(float, _seq(proc.image_mean))),
                list(map(float, _seq(proc.image_std))),
                f"{type(proc).__name__}.image_mean/image_std saved with the model ({where})",
            )
        cfg = getattr(model, "pretrained_cfg", None)
        if isinstance(cfg, Mapping) and cfg.get("mean") is not None and cfg.get("std") is not None:
            tag = cfg.get("architecture", "") + ("." + cfg["tag"] if cfg.get("tag") else "")
            return Declared(
                list(map(float, cfg["mean"])),
                list(map(float, cfg["std"])),
                f"timm pretrained_cfg of {tag or type(model).__name__}",
            )
    return None


def saved_image_processor(model: Any) -> tuple[Any, str] | None:
    """The image processor saved beside a transformers model (``preprocessor_config.json`` in the directory
    or cached hub snapshot it was loaded from), read offline: (processor, where), or None. Only a processor
    that normalises counts."""
    import os

    cfg = getattr(model, "config", None)
    path = getattr(cfg, "_name_or_path", None) or getattr(model, "name_or_path", None)
    if not isinstance(path, str) or not path or not type(model).__module__.startswith("transformers."):
        return None
    name = "preprocessor_config.json"
    if os.path.isfile(os.path.join(path, name)):
        folder, where = path, os.path.join(path, name)
    else:
        try:
            from huggingface_hub import try_to_load_from_cache

            found = try_to_load_from_cache(path, name)  # a look in the local cache, never the network
        except Exception:  # noqa: BLE001 - not a hub id
            return None
        if not isinstance(found, str):
            return None
        folder, where = os.path.dirname(found), f"{name} of {path} in the hub cache"
    try:
        from transformers import AutoImageProcessor

        proc = AutoImageProcessor.from_pretrained(folder, local_files_only=True)
    except Exception:  # noqa: BLE001 - a config transformers cannot read as an image processor
        return None
    if getattr(proc, "image_mean", None) is None or getattr(proc, "image_std", None) is None:
        return None
    if not getattr(proc, "do_normalize", True):
        return None
    return proc, where


#: transformers' task mappings whose heads predict config.num_labels classes
_CLASS_HEAD_MAPPINGS = (
    "MODEL_FOR_IMAGE_CLASSIFICATION_MAPPING_NAMES",
    "MODEL_FOR_VIDEO_CLASSIFICATION_MAPPING_NAMES",
    "MODEL_FOR_SEMANTIC_SEGMENTATION_MAPPING_NAMES",
    "MODEL_FOR_UNIVERSAL_SEGMENTATION_MAPPING_NAMES",
    "MODEL_FOR_INSTANCE_SEGMENTATION_MAPPING_NAMES",
    "MODEL_FOR_IMAGE_SEGMENTATION_MAPPING_NAMES",
    "MODEL_FOR_OBJECT_DETECTION_MAPPING_NAMES",
    "MODEL_FOR_SEQUENCE_CLASSIFICATION_MAPPING_NAMES",
    "MODEL_FOR_TOKEN_CLASSIFICATION_MAPPING_NAMES",
    "MODEL_FOR_AUDIO_CLASSIFICATION_MAPPING_NAMES",
)


def has_class_head(model: Any) -> bool:
    """Whether a transformers model's class has a head over ``config.num_labels`` classes: it (or a base class) is
    in one of transformers' classification / segmentation / detection task mappings. A model of another task (a
    masked-image model, a dual encoder) carries the config's default num_labels (2) without predicting classes.
    A model that is not a transformers class is not judged here (True)."""
    if not any(c.__module__.startswith("transformers.") for c in type(model).__mro__):
        return True
    try:
        from transformers.models.auto import modeling_auto
    except ImportError:
        return True
    heads = {
        name
        for mapping in _CLASS_HEAD_MAPPINGS
        for value in getattr(modeling_auto, mapping, {}).values()
        for name in (value if isinstance(value, (list, tuple)) else (value,))
    }
    return any(c.__name__ in heads and c.__module__.startswith("transformers.") for c in type(model).__mro__)


def head_classes(model: Any) -> tuple[int | None, str]:
    """The number of classes a model's head predicts, from its structure (no forward pass)."""
    if model is MISSING or model is None:
        return None, ""
    torch = _torch()
    nn = torch.nn
    if is_rcnn(model):
        pred = getattr(model.roi_heads, "box_predictor", None)
        cls = getattr(pred, "cls_score", None)
        if isinstance(cls, nn.Linear):
            return cls.out_features, "roi_heads.box_predictor.cls_score.out_features (background included)"
    if is_tv_detection(model):
        head = getattr(getattr(model, "head", None), "classification_head", None)
        n = getattr(head, "num_classes", None)
        if isinstance(n, int):
            return n, "head.classification_head.num_classes (background included)"
    if type(model).__module__.startswith("timm.") and isinstance(getattr(model, "num_classes", None), int):
        return model.num_classes, "timm model.num_classes"
    cfg = getattr(model, "config", None)
    if (
        cfg is not None
        and isinstance(getattr(cfg, "num_labels", None), int)
        and hasattr(cfg, "id2label")
        and has_class_head(model)
    ):
        return cfg.num_labels, "model.config.num_labels"
    if type(model).__module__.startswith("torchvision.models") and "segmentation" not in type(model).__module__:
        for attr in ("fc", "classifier", "heads", "head"):
            sub = getattr(model, attr, None)
            lin = sub if isinstance(sub, nn.Linear) else None
            if lin is None and isinstance(sub, nn.Module):
                lins = [m for m in sub.modules() if isinstance(m, nn.Linear)]
                lin = lins[-1] if lins else None
            if lin is not None:
                return lin.out_features, f"{attr} out_features" if attr == "fc" else f"{attr} Linear out_features"
    return None, ""


def model_device(model: Any) -> Any:
    torch = _torch()
    for p in model.parameters():
        return p.device
    return torch.device("cpu")


def model_input(img: Any, model: Any) -> Any:
    torch = _torch()
    x = img.detach()
    if not x.is_floating_point():
        x = x.float() / 255.0
    dtype = next((p.dtype for p in model.parameters() if p.is_floating_point()), torch.float32)
    return x.to(model_device(model), dtype)


def output_tensor(out: Any) -> Any:
    torch = _torch()
    if isinstance(out, torch.Tensor):
        return out
    if isinstance(out, Mapping):
        for k in ("out", "logits"):
            if k in out:
                return out[k]
    logits = getattr(out, "logits", None)
    if isinstance(logits, torch.Tensor):
        return logits
    if isinstance(out, (list, tuple)) and out and isinstance(out[0], torch.Tensor):
        return out[0]
    return None


def labels_not_trained(ctx: Any) -> str | None:
    """Why the labels of the batches are not trained on (the user's training loss ignores them: an
    autoencoder), or None; read through the training's own loss when the user gave a training."""
    from ..shared.pipeline import labels_unused

    return labels_unused(ctx)


def model_elsewhere(ctx: Any) -> str | None:
    """Why the model is not called on the batch's images, in words, or None: a plain loop's own loss or step calls
    it on something it makes (a GAN's generator on the noise it draws), learnt from one call of the step
    (:func:`pipeline_call`). Its output is then no prediction about an image, and a check must not hand it one."""
    import pytest

    from ...training import find_setup, pipeline_call
    from ...training.runs import unwrap_prepared

    model = ctx.role("model")
    if model is MISSING:
        return None
    try:
        call = pipeline_call(ctx, find_setup(ctx))
    except pytest.skip.Exception:  # the pipeline cannot be run the way the capture needs: nothing is told
        return None
    if call is None or not isinstance(unwrap_prepared(model), call.model_type):
        return None
    return call.elsewhere()


def num_classes(ctx: Any, sample: VisionSample | None = None) -> tuple[int | None, str]:
    """(number of classes, where it was read): dlcheck_num_classes, the model head, or one forward
    pass of the model on one sampled image (its output channels). One output is a binary head (one logit,
    BCEWithLogitsLoss): classes 0 and 1."""
    n, where = _num_classes(ctx, sample)
    if n == 1 and where != "dlcheck_num_classes":
        return 2, f"{where}: one logit, a binary head (classes 0 and 1)"
    return n, where


def _num_classes(ctx: Any, sample: VisionSample | None = None) -> tuple[int | None, str]:
    given = ctx.role("num_classes")
    if given is not MISSING and given is not None:
        return int(given), "dlcheck_num_classes"
    model = ctx.role("model")
    if model is MISSING:
        return None, ""
    n, where = head_classes(model)
    if n is not None:
        return n, f"model head {where}"
    if sample is None or not sample.images or is_tv_detection(model):
        return None, ""
    if model_elsewhere(ctx) is not None:
        return None, ""  # the pipeline never hands the model an image: its output says nothing of classes
    from ...training import is_lightning_module

    if is_lightning_module(model):
        # its training_step decides what its forward takes (an autoencoder flattens the images first): the
        # output is read where the pipeline calls the forward, never on an image the check hands it
        from ..shared.pipeline import step_probe

        probe = step_probe(ctx)
        out = None if probe is None else probe.forward_out
        return (out[1], "the model's output in its training_step") if out and len(out) >= 2 else (None, "")
    image = sample.images[0]
    nn = _torch().nn
    if isinstance(model, nn.Module) and type(model).forward is nn.Module.forward:
        return None, ""  # a container of networks (a GAN's ModuleDict): no forward to read classes from

    # per-pixel outputs hold classes in their channels only for masks; against one label per image they are an
    # image (a style-transfer or super-resolution net's RGB), not a classifier's scores
    per_pixel_classes = any(i.kind == "segmentation" for i in sample.items)

    def forward() -> Any:
        with preserved_rng(), eval_mode(model):
            out = output_tensor(ctx.call("model", lambda: model(model_input(image, model)[None])))
        if out is None or out.ndim < 2 or (out.ndim > 2 and not per_pixel_classes):
            return None
        return int(out.shape[1])

    c = ctx.memo(model, f"vision:out-channels:{tuple(image.shape)}:{per_pixel_classes}", forward)
    return (c, "the model's output channels on a sampled image") if c else (None, "")


# --------------------------------------------------------------------------------------------------
# comparing outputs


def tensors_in(obj: Any, depth: int = 0) -> list[Any]:
    torch = _torch()
    if depth > 6:
        return []
    if isinstance(obj, torch.Tensor):
        return [obj.detach().to("cpu").as_subclass(torch.Tensor)]
    if isinstance(obj, Mapping):
        return [t for v in obj.values() for t in tensors_in(v, depth + 1)]
    if isinstance(obj, (list, tuple)):
        return [t for v in obj for t in tensors_in(v, depth + 1)]
    if hasattr(obj, "to_tuple"):
        return tensors_in(obj.to_tuple(), depth + 1)
    if isinstance(obj, (int, float)) and not isinstance(obj, bool):
        return [torch.tensor(float(obj))]
    return []


def max_abs_diff(a: list[Any], b: list[Any]) -> float | None:
    """Largest |a-b| over paired tensors; inf when shapes differ; None when nothing to compare."""
    if not a or not b:
        return None
    if len(a) != len(b):
        return math.inf
    worst = 0.0
    for x, y in zip(a, b):
        if x.shape != y.shape:
            return math.inf
        if x.numel():
            worst = max(worst, float((x.double() - y.double()).abs().max()))
    return worst


def first(iterable: Any, n: int) -> list[Any]:
    return list(itertools.islice(iterable, n))


# --------------------------------------------------------------------------------------------------
# class labels beyond the shared sample (V3, V6)

LABEL_ATTRS = ("targets", "labels", "_labels", "y")
#: labels read (spread) when a dataset exposes none cheaply; V6.label_samples defaults to the same
LABEL_SAMPLES = 256


def _cheap_labels(ds: Any) -> tuple[list[int], str] | None:
    """Labels a dataset exposes without loading images: ImageFolder/CIFAR/MNIST ``targets`` (through
    Subsets), a datasets.Dataset label column. Not when a target_transform rewrites them."""
    torch = _torch()
    indices = None
    base = ds
    while type(base).__name__ == "Subset" and hasattr(base, "indices"):
        idx = list(base.indices)
        indices = idx if indices is None else [idx[i] for i in indices]
        base = base.dataset
    if getattr(base, "target_transform", None) is not None:
        return None
    datasets = sys.modules.get("datasets")  # a datasets.Dataset means the library is imported already
    if datasets is not None and hasattr(datasets, "Dataset"):
        if isinstance(base, datasets.Dataset):
            col = next((c for c in ("label", "labels") if c in base.column_names), None)
            if col is None:
                return None
            values = base.data.column(col).to_pylist()
            mapping = getattr(base, "_indices", None)  # select / filter / shuffle / train_test_split: rows of the table
            if mapping is not None:
                values = [values[i] for i in mapping.column(0).to_pylist()]
            if not values or not isinstance(values[0], int):
                return None
            return ([values[i] for i in indices] if indices is not None else values), f"the '{col}' column"
    for attr in LABEL_ATTRS:
        values = getattr(base, attr, None)
        if isinstance(values, torch.Tensor) and values.ndim == 1 and not values.is_floating_point():
            values = values.tolist()
        if isinstance(values, (list, tuple)) and values and all(isinstance(v, int) for v in values[:100]):
            try:
                if len(values) != len(base):
                    continue
            except TypeError:
                continue
            sel = [values[i] for i in indices] if indices is not None else list(values)
            return sel, f"{type(base).__name__}.{attr}" + (" through the Subset" if indices is not None else "")
    return None


def label_population(ctx: Any, sample: VisionSample, n: int) -> tuple[list[int], str, bool]:
    """Classification labels of the training data: every label when the dataset exposes them (checked
    against the sampled examples), else up to ``n`` labels read at spread positions (or from the
    dataloader's batches, also when the loader's dataset gives its examples in a shape its collate_fn
    rearranges). Returns (labels, where from, complete)."""
    ds = map_dataset(ctx, "train")
    loader = ctx.role("dataloader")
    role = "dataset" if ctx.has("dataset") else "dataloader"

    def make() -> tuple[list[int], str, bool]:
        if ds is not None:
            cheap = _cheap_labels(ds)
            if cheap is not None and sample.role == role:
                values, where = cheap
                agree = all(
                    i.position is None
                    or i.label is None
                    or (0 <= i.position < len(values) and values[i.position] == i.label)
                    for i in sample.items
                )
                if agree:
                    return list(values), where, True
            labels = []
            with seeded(0):  # the same labels whoever reads them first
                for p in spread_positions(len(ds), n):
                    item = make_item(ctx.call(role, lambda p=p: ds[p]), f"dlcheck_{role}[{p}]", p)
                    if item.label is None:
                        break
                    labels.append(item.label)
            where = f"dlcheck_{role}" if role == "dataset" else "dlcheck_dataloader.dataset"
            if labels or role == "dataset" or loader is MISSING:
                return labels, f"{len(labels)} examples read from {where}", len(labels) == len(ds)
            # the loader's dataset gives its examples in another shape than the loader's batches (torchvision's video
            # reference: (video, audio, label, video_idx), its collate_fn drops the audio): read the batches
        labels = []
        with seeded(0), preserved_dataloader(loader), first_read(loader):
            for b, batch in enumerate(loader):
                for image, target in unbatch(batch, f"batch {b} of dlcheck_dataloader"):
                    item = make_item((image, target), f"batch {b}")
                    if item.label is None:
                        return labels, "", False
                    labels.append(item.label)
                if len(labels) >= n:
                    break
        return labels, f"{len(labels)} examples from batches of dlcheck_dataloader", False

    return ctx.memo(ds if ds is not None else loader, f"vision:labels:{n}", make)


def attach_images(
    ctx: Any, sample: VisionSample, norm: tuple[list[float], list[float], Any] | None, limit: int = 4, side: int = 64
) -> None:
    """The report's picture of a vision sample: each input de-normalised (by the Normalize found in the
    transform, else by its own range), its boxes (xyxy pixels) and mask drawn, its channel statistics."""
    torch = _torch()
    shown = []
    for item in [i for i in sample.items if i.image is not None and not i.pil][:limit]:
        img = item.image.detach().float().cpu()
        if item.video and img.ndim == 4:
            img = img[:, 0]  # a clip is shown by its first frame
        if img.ndim != 3:
            continue
        stats = channel_stats([img])
        if norm is not None and len(norm[0]) == img.shape[0]:
            mean, std = torch.tensor(norm[0])[:, None, None], torch.tensor(norm[1])[:, None, None]
            img = img * std + mean
        elif float(img.max()) > 1.5:
            img = img / 255.0
        h, w = img.shape[-2:]
        step = max(1, max(h, w) // side)
        pixels = img[:, ::step, ::step].clamp(0, 1).permute(1, 2, 0)
        boxes = []
        if item.boxes is not None and item.box_format is not None:
            xyxy = to_xyxy(item.boxes, item.box_format, item.size)
            boxes = (torch.as_tensor(xyxy, dtype=torch.float32) / step).tolist()
        mask = item.mask[::step, ::step].tolist() if item.mask is not None else None
        shown.append(
            {
                "pixels": pixels.tolist(),
                "boxes": boxes,
                "mask": mask,
                "title": f"mean ({fmt_seq(stats.mean)})\nstd ({fmt_seq(stats.std)})" if stats else item.where,
            }
        )
    if shown:
        ctx.attach(
            "images",
            images=shown,
            caption=f"{sample.source}, de-normalised" + (" with the transform's Normalize" if norm else ""),
        )


# --------------------------------------------------------------------------------------------------
# which pipelines a vision check concerns

#: roles whose object, when it is a diffusers one, marks the project as a diffusion training
DIFFUSION_MARKERS = ("pipeline", "vae", "noise_scheduler", "model", "unet")
TASK_WORDS = {
    "classification": "class labels (classification)",
    "detection": "boxes (detection)",
    "segmentation": "segmentation masks",
    "views": (
        "self-supervised multi-view examples (several augmented views of each image) with no box or mask targets: "
        "the labels beside them are no class targets of the model's outputs, which a multi-view pipeline trains "
        "against each other"
    ),
}


def _is_diffusers(obj: Any) -> bool:
    return any(c.__module__.startswith("diffusers.") for c in type(obj).__mro__)


def diffusion_marker(ctx: Any) -> str | None:
    """'dlcheck_pipeline is a diffusers StableDiffusionPipeline' when the project trains a diffusers model
    (its images go to a VAE or a denoiser, in [-1, 1], without class labels, boxes or masks), else None."""
    for name in DIFFUSION_MARKERS:
        try:
            obj = ctx.role(name)
        except RoleError:  # a role that raises is its own domain's report, not a reason here
            continue
        if obj is not MISSING and obj is not None and _is_diffusers(obj):
            if name in ("model", "unet") and trained_autoencoder(obj):
                continue  # an autoencoder the script trains itself: its input range is the script's own choice
            return f"dlcheck_{name} is a diffusers {type(obj).__name__}"
    return None


@dataclass(frozen=True)
class DiffusionRange:
    """The pixel range a diffusion training's images belong in, and what says so."""

    unit: bool  # True: [0, 1]; False: [-1, 1]
    where: str  # 'dlcheck_pipeline is a diffusers AmusedPipeline (its image_processor ... do_normalize=False)'
    read: bool  # read from the objects' own image processor (else diffusers' convention)

    @property
    def name(self) -> str:
        return "[0, 1]" if self.unit else "[-1, 1]"


def diffusion_range(ctx: Any, marker: str) -> DiffusionRange:
    """The range the images of a diffusion training belong in, read from the pipeline's own image processor: a
    diffusers ``VaeImageProcessor`` with ``do_normalize=True`` maps [0, 1] images to [-1, 1] before its autoencoder
    encodes them and maps samples back; one with ``do_normalize=False`` (aMUSEd's pipelines, whose VQ-GAN encodes
    [0, 1] images) hands the autoencoder [0, 1] images and decodes to [0, 1]. Without one, diffusers' convention:
    [-1, 1] (AutoencoderKL; pixel pipelines decode with image / 2 + 0.5)."""
    try:
        pipe = ctx.role("pipeline")
    except RoleError:
        pipe = MISSING
    proc = getattr(pipe, "image_processor", None) if pipe is not MISSING and pipe is not None else None
    config = getattr(proc, "config", None) if proc is not None and _is_diffusers(proc) else None
    normalize = config.get("do_normalize") if isinstance(config, Mapping) else None
    if isinstance(normalize, bool):
        return DiffusionRange(
            not normalize,
            f"dlcheck_pipeline is a diffusers {type(pipe).__name__} (its image_processor, a {type(proc).__name__}, "
            f"has do_normalize={normalize})",
            True,
        )
    return DiffusionRange(False, marker, False)


#: roles of the rl domain that mark a project as an RL training (it learns from an environment)
RL_MARKERS = ("algorithm", "env")


def rl_marker(ctx: Any) -> str | None:
    """'dlcheck_algorithm is a PPO' when the project is an RL training, else None."""
    for name in RL_MARKERS:
        try:
            obj = ctx.role(name)
        except RoleError:
            continue
        if obj is not MISSING and obj is not None:
            return f"dlcheck_{name} is a {type(obj).__name__}"
    return None


def require_task(ctx: Any, sample: VisionSample, tasks: tuple[str, ...], what: str) -> None:
    """Return when the sampled targets are of one of ``tasks``; else say the check is not applicable (the
    targets are of another task, absent — a generative pipeline —, or token sequences — a vision-language
    batch), or skip when the targets cannot be read at all."""
    if sample.task in tasks:
        return
    cid = ctx.check.id
    head = f"{cid} judges {what}"
    if sample.task in TASK_WORDS:
        ctx.not_applicable(f"{head}; the sampled targets ({sample.source}) are {TASK_WORDS[sample.task]}")
    targets = [i.target for i in sample.items]
    marker = diffusion_marker(ctx)
    if all(t is None for t in targets):
        why = f"a diffusion training: {marker}" if marker else "a generative or self-supervised pipeline"
        ctx.not_applicable(f"{head}; the sampled examples ({sample.source}) carry no targets ({why})")
    if all(isinstance(t, Mapping) and "input_ids" in t for t in targets):
        keys = ", ".join(sorted(map(str, targets[0])))
        ctx.not_applicable(
            f"{head}; the sampled targets ({sample.source}) are token sequences ({keys}): a vision-language batch"
        )
    if marker:
        ctx.not_applicable(f"{head}; this is a diffusion training ({marker})")
    ctx.skip(
        f"{cid} cannot read the sampled targets ({sample.source}: target {type_name(targets[0])}) as {what}, "
        "nor as another task's"
    )
