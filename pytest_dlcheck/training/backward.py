"""The plugin's own backward passes on a user's graph, run as the user's training framework runs its backward."""

from __future__ import annotations

import contextlib
import sys
from typing import Any


@contextlib.contextmanager
def own_backward() -> Any:
    """While open, the plugin's own backward (``loss.backward()``, ``torch.autograd.grad``) on a graph through
    Lightning Fabric's ``_FabricModule`` runs as ``fabric.backward(loss)`` runs it on one device: a precision plugin
    that overrides the backward (``bf16-mixed``, ``16-mixed``) hooks every output of the wrapped forward and raises
    "requires you to call `fabric.backward(loss)`" on any other backward; ``fabric.backward`` marks its own
    backward and hands the loss to ``tensor.backward()`` (times the scale of a ``16-mixed`` grad scaler: the plugin's
    gradients are the unscaled ones, which points the same way and is zero where the scaled one is). Fabric's mark is
    put back as it was. Nothing happens when Fabric was never imported."""
    marked = [m for m in (sys.modules.get(n) for n in ("lightning.fabric.wrappers", "lightning_fabric.wrappers"))]
    marked = [(m, m._in_fabric_backward) for m in marked if m is not None and hasattr(m, "_in_fabric_backward")]
    try:
        for m, _ in marked:
            m._in_fabric_backward = True
        yield
    finally:
        for m, was in marked:
            m._in_fabric_backward = was
