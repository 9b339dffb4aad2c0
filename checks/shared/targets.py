"""Target networks: a copy of a trained network kept beside it and updated from its weights (copied every few
steps, a DQN's, or averaged by tau, TD3's and SAC's), recognised from the objects — the same parameters by name and shape as a network the
optimizer trains, and in no optimizer itself."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any


def weight_copies(model: Any, held: set[int], trains: Callable[[str], bool] | None = None) -> dict[str, str]:
    """``{copy: original}`` over the model's top-level submodules (or a ``{name: module}`` mapping): ``copy`` has the very parameters (names and
    shapes) of ``original``; none of ``copy``'s is in an optimizer (``held``: the ids the optimizers hold), all of
    ``original``'s are (and ``trains(original)``, when given)."""
    # a module's top-level submodules, or a mapping of names to modules (a training dict's modules)
    children = dict(model.named_children()) if hasattr(model, "named_children") else dict(model)
    signature = {name: [(n, tuple(p.shape)) for n, p in m.named_parameters()] for name, m in children.items()}
    out: dict[str, str] = {}
    for copy, module in children.items():
        if not signature[copy] or any(id(p) in held for p in module.parameters()):
            continue
        # the original the copy is named after first (qf2_target: qf2, not qf1 of the same shapes)
        for original, other in sorted(children.items(), key=lambda kv: kv[0] not in copy):
            if (
                original != copy
                and signature[original] == signature[copy]
                and all(id(p) in held for p in other.parameters())
                and (trains is None or trains(original))
            ):
                out[copy] = original
                break
    return out


def optimizer_held(optimizers: list[Any]) -> set[int]:
    """The ids of the parameters the optimizers hold."""
    return {id(p) for opt in optimizers if opt is not None for group in opt.param_groups for p in group["params"]}


def state_weight_copies(state: Any) -> dict[str, str]:
    """``{copy key: original key}`` among the modules of a plain loop's training dict (SAC's ``qf1_target`` beside
    ``qf1``): ``copy`` is in no optimizer of the dict and has the very parameters of ``original``, all of which one
    holds. Empty when ``state`` is no dict or holds no optimizer."""
    from ...training.runs import unwrap_prepared

    if not isinstance(state, dict):
        return {}
    import torch

    modules, optimizers = {}, []
    for key, value in state.items():
        inner = unwrap_prepared(value)
        if isinstance(inner, torch.nn.Module):
            modules[str(key)] = inner
        elif isinstance(inner, torch.optim.Optimizer):
            optimizers.append(inner)
    held = optimizer_held(optimizers)
    return weight_copies(modules, held) if held and len(modules) > 1 else {}
