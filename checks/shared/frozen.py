"""What of a model trains: the trainable share of its parameters, the modules that train, and its output
layer (the last module with parameters whose output has the prediction's last dimension), frozen or not,
at PyTorch's default initialisation or not. T1 and T2 name a head frozen at its random initialisation."""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch

#: at most this share of the parameters trains for "only a tiny share" (a frozen backbone: a ResNet-18's
#: classifier is 0.02% of it, its BatchNorm layers 0.1%)
TINY_SHARE = 0.10


@dataclass
class Trainable:
    total: int
    trainable: int
    #: module type -> names of the modules with a parameter that trains, in registration order
    training: dict[str, list[str]] = field(default_factory=dict)
    #: names of the parameter tensors that train
    tensors: list[str] = field(default_factory=list)
    head_name: str | None = None
    head: Any = None
    head_frozen: bool = False
    #: "its values are uniform within ±1/sqrt(512) = ±0.0442 (std …)" at PyTorch's default init; "" when not
    head_default_init: str = ""

    @property
    def share(self) -> float:
        return self.trainable / self.total if self.total else 0.0

    def frozen_random_head(self) -> bool:
        """Only a tiny share trains and the output layer is frozen at PyTorch's default initialisation."""
        return self.head is not None and self.head_frozen and bool(self.head_default_init) and self.share <= TINY_SHARE

    def head_text(self) -> str:
        return f"{self.head_name} ({_describe(self.head)})"

    def percent(self) -> str:
        return f"{100 * self.share:.2g}%"

    def evidence(self) -> list[str]:
        if 0 < len(self.tensors) <= 4:
            training = f"the tensors that train are {', '.join(self.tensors)}"
        elif self.training:
            training = "the modules that train are " + "; ".join(
                f"{len(names)} {kind} ({', '.join(names[:3])}{', …' if len(names) > 3 else ''})"
                for kind, names in self.training.items()
            )
        else:
            training = "nothing trains"
        return [
            f"{self.trainable:,} of the model's {self.total:,} parameters require grad ({self.percent()}): {training}",
            f"the output layer {self.head_text()} has its weight frozen (requires_grad=False) at its random "
            f"initialisation: {self.head_default_init}",
        ]

    #: how such a head comes about
    HOW = "a freeze such as `for p in model.parameters(): p.requires_grad = False` run after the new head was put in place"

    def consequence(self) -> str:
        return "the logits are a fixed random projection of the features, and " + (
            "nothing else trains"
            if not self.trainable
            else f"the {self.percent()} of the parameters that train cannot fit the targets through it"
        )

    def cause(self) -> str:
        return (
            f"the freshly initialised output layer {self.head_name} is frozen with the rest of the model ({self.HOW}): "
            + self.consequence()
        )

    def fix(self) -> str:
        return (
            f"freeze the backbone first and put the new head in place after (for p in model.parameters(): "
            f"p.requires_grad = False, then model.{self.head_name} = nn.Linear(...)), or unfreeze it: "
            f"model.{self.head_name}.requires_grad_(True); give the optimizer the trainable parameters"
        )


def _describe(module: Any) -> str:
    if isinstance(module, torch.nn.Linear):
        return f"Linear {module.in_features}->{module.out_features}"
    return type(module).__name__


def _default_init(module: Any) -> str:
    """The words for a weight drawn as PyTorch initialises Linear/Conv layers (kaiming_uniform with a=sqrt(5):
    uniform within ±1/sqrt(fan_in)); "" when the weight does not look like it."""
    weight = getattr(module, "weight", None)
    if not isinstance(weight, torch.Tensor) or weight.dim() < 2 or weight.numel() < 64:
        return ""
    w = weight.detach().float()
    fan_in = w[0].numel()
    bound = 1 / math.sqrt(fan_in)
    top, std, mean = float(w.abs().max()), float(w.std()), float(w.mean())
    expected = bound / math.sqrt(3)
    if top > bound * (1 + 1e-5) or not 0.85 * expected <= std <= 1.15 * expected or abs(mean) > 0.2 * expected:
        return ""
    return (
        f"its values are uniform within ±1/sqrt({fan_in}) = ±{bound:.3g} (std {std:.3g}; PyTorch's default "
        f"initialisation gives {expected:.3g})"
    )


def trainable(model: Any, forward: Callable[[], Any] | None = None, classes: int | None = None) -> Trainable:
    """The trainable share of ``model`` and, when ``forward`` runs it (no gradients needed) and ``classes``
    is the prediction's last dimension, its output layer."""
    params = list(model.named_parameters())
    info = Trainable(
        total=sum(p.numel() for _, p in params),
        trainable=sum(p.numel() for _, p in params if p.requires_grad),
        tensors=[n for n, p in params if p.requires_grad],
    )
    for name, module in model.named_modules():
        if any(p.requires_grad for p in module.parameters(recurse=False)):
            info.training.setdefault(type(module).__name__, []).append(name or "(the model itself)")
    if forward is None or not classes:
        return info
    names = {id(m): n for n, m in model.named_modules()}
    called: list[Any] = []

    def hook(module: Any, args: Any, out: Any) -> None:
        if isinstance(out, torch.Tensor) and out.dim() >= 1 and out.shape[-1] == classes:
            called.append(module)

    handles = [
        m.register_forward_hook(hook)
        for m in model.modules()
        if any(True for _ in m.parameters(recurse=False)) and id(m) in names
    ]
    try:
        with torch.no_grad():
            forward()
    except Exception:  # noqa: BLE001 - the model takes the batch only through the user's loss: no head found
        return info
    finally:
        for h in handles:
            h.remove()
    if called:
        head = called[-1]
        info.head, info.head_name = head, names[id(head)]
        info.head_frozen = not any(p.requires_grad for p in head.parameters(recurse=False) if p.dim() >= 2)
        info.head_default_init = _default_init(head)
    return info
