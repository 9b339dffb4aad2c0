"""Dropout off for a comparison of two gradient computations: ``nn.Dropout`` layers' ``p`` and the float
``*dropout*`` attributes that attention modules pass to ``nn.functional.dropout`` at every call (T5's, BART's,
Llama's ``attention_dropout``). Returns what it changed, so a run on the user's live objects can put it back."""

from __future__ import annotations

from typing import Any


def quiet_dropout(model: Any) -> list[tuple[Any, str, float]]:
    """Set every dropout probability of ``model`` to 0; the (object, attribute, old value) changed."""
    import torch

    kinds = (torch.nn.modules.dropout._DropoutNd,)
    changed: list[tuple[Any, str, float]] = []
    for mod in model.modules():
        if isinstance(mod, kinds) and mod.p > 0:
            changed.append((mod, "p", mod.p))
            mod.p = 0.0
        for attr, value in list(vars(mod).items()):
            if attr != "p" and "dropout" in attr.lower() and isinstance(value, float) and value > 0:
                changed.append((mod, attr, value))
                setattr(mod, attr, 0.0)
    return changed


def restore_dropout(changed: list[tuple[Any, str, float]]) -> None:
    for obj, attr, value in changed:
        setattr(obj, attr, value)
