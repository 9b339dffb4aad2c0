"""Content digests of tensors, samples and batches: what two processes (ranks, DataLoader workers) compare
without shipping the data."""

from __future__ import annotations

import hashlib
from collections.abc import Mapping
from typing import Any


def tensor_digest(t: Any) -> str:
    import torch

    data = t.detach().cpu().contiguous()
    if data.dtype in (torch.bfloat16, torch.float16):
        data = data.float()
    raw = data.reshape(-1).view(torch.uint8).numpy().tobytes() if data.numel() else b""
    return hashlib.sha1(raw + str(tuple(data.shape)).encode()).hexdigest()[:16]


def nested_digest(obj: Any) -> str:
    """A digest of a batch or sample: every tensor / array / number in it, in order."""
    import torch

    h = hashlib.sha1()

    def walk(x: Any) -> None:
        if isinstance(x, torch.Tensor):
            h.update(tensor_digest(x).encode())
        elif isinstance(x, Mapping):
            for k in x:
                h.update(str(k).encode())
                walk(x[k])
        elif isinstance(x, (list, tuple)):
            for v in x:
                walk(v)
        elif hasattr(x, "__array__"):
            walk(torch.as_tensor(x.__array__()))
        elif hasattr(x, "tobytes"):
            h.update(x.tobytes())
        else:
            h.update(repr(x).encode())

    walk(obj)
    return h.hexdigest()[:16]
