"""Dropout off for a comparison of two gradient computations: ``nn.Dropout`` layers' ``p``, the float
``*dropout*`` attributes that attention modules pass to ``nn.functional.dropout`` at every call (T5's, BART's,
Llama's ``attention_dropout``), and stochastic depth (timm's DropPath ``drop_prob``, torchvision's StochasticDepth
``p``, transformers' ``layerdrop``). Returns what it changed, so a run on the user's live objects can put it back."""

from __future__ import annotations

from typing import Any


def quiet_dropout(model: Any) -> list[tuple[Any, str, float]]:
    """Set every dropout probability of ``model`` to 0; the (object, attribute, old value) changed."""
    import torch

    kinds = (torch.nn.modules.dropout._DropoutNd,)
    changed: list[tuple[Any, str, float]] = []
    for mod in model.modules():
        name = type(mod).__name__
        # nn.Dropout's p, and the p of a stochastic-depth module (torchvision's StochasticDepth, a DropPath / DropBlock)
        if (isinstance(mod, kinds) or "Drop" in name or "StochasticDepth" in name) and _positive(
            getattr(mod, "p", None)
        ):
            changed.append((mod, "p", mod.p))
            mod.p = 0.0
        for attr, value in list(vars(mod).items()):
            # dropout / attention_dropout, timm's DropPath drop_prob, transformers' layerdrop
            if attr != "p" and "drop" in attr.lower() and _positive(value):
                changed.append((mod, attr, value))
                setattr(mod, attr, 0.0)
    return changed


def _positive(value: Any) -> bool:
    return isinstance(value, float) and value > 0


def restore_dropout(changed: list[tuple[Any, str, float]]) -> None:
    for obj, attr, value in changed:
        setattr(obj, attr, value)
