"""What a check costs in work, not seconds: the forward passes of models (a call of a module with parameters
that is not inside another module's forward), the backward passes and the optimizer steps that happen while the check
(its setup and call) runs, except inside the user's own fixtures built during the call (:func:`users_work`).
A shared run (the smoke run, a memoised forward) is counted by the check that
first needed it and is free for the others, which is what sharing buys.

Counting uses torch's global hooks (``register_module_forward_pre_hook`` / ``…_forward_hook`` with
``always_call``, the optimizer step post hook) and wraps ``torch.autograd.backward``; all of them are
removed when the check ends. Nothing is counted when torch was never imported."""

from __future__ import annotations

import contextlib
import sys
import threading
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

#: > 0 while the user's own fixtures are being built (:func:`users_work`): their passes are not the check's
_paused = [0]


@contextlib.contextmanager
def users_work() -> Iterator[None]:
    """Count nothing inside: a role fixture a check requests during its call (``request.getfixturevalue``)
    builds the user's objects, which is the user's work, as it is when pytest builds it in the setup — a
    project fixture that trains a few steps, or a PPO agent trained before it is handed over, costs the
    same with or without the checks."""
    _paused[0] += 1
    try:
        yield
    finally:
        _paused[0] -= 1


@dataclass
class Cost:
    forward: int = 0
    backward: int = 0
    optimizer_steps: int = 0
    models: Counter = field(default_factory=Counter)

    def to_json(self) -> dict[str, Any]:
        return {
            "forward": self.forward,
            "backward": self.backward,
            "optimizer_steps": self.optimizer_steps,
            "models": dict(self.models.most_common()),
        }


@contextlib.contextmanager
def counting() -> Iterator[Cost]:
    cost = Cost()
    torch = sys.modules.get("torch")
    if torch is None:
        # the check may import torch itself: count from the first module call it makes after that
        yield cost
        return
    local = threading.local()

    def pre(module, args):
        depth = getattr(local, "depth", 0)
        if depth == 0 and not _paused[0] and next(module.parameters(), None) is not None:  # a model, not a loss
            cost.forward += 1
            twin = " (twin)" if getattr(module, "_dlcheck_twin", False) else ""  # pytest_dlcheck.twin
            cost.models[type(module).__name__ + twin] += 1
        local.depth = depth + 1

    def post(module, args, output):
        local.depth = max(getattr(local, "depth", 1) - 1, 0)

    def stepped(optimizer, args, kwargs):
        if not _paused[0]:
            cost.optimizer_steps += 1

    from torch.nn.modules import module as nn_module
    from torch.optim import optimizer as optim

    handles = [
        nn_module.register_module_forward_pre_hook(pre),
        nn_module.register_module_forward_hook(post, always_call=True),
        optim.register_optimizer_step_post_hook(stepped),
    ]
    originals = {name: getattr(torch.autograd, name) for name in ("backward", "grad")}

    def counted(fn):
        def run(*args, **kwargs):
            if not _paused[0]:
                cost.backward += 1
            return fn(*args, **kwargs)

        return run

    wrappers = {name: counted(fn) for name, fn in originals.items()}
    for name, wrapper in wrappers.items():
        setattr(torch.autograd, name, wrapper)
    try:
        yield cost
    finally:
        for name, wrapper in wrappers.items():
            if getattr(torch.autograd, name) is wrapper:
                setattr(torch.autograd, name, originals[name])
        for handle in handles:
            handle.remove()
