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
#: the user's routines running now (:func:`users_routine`), innermost last
_routines: list[str] = []
#: the counters of the checks running now, with each one's stack of module calls (counted or not)
_active: list[tuple[Cost, Any]] = []


@contextlib.contextmanager
def users_routine(name: str) -> Iterator[None]:
    """Passes inside are counted, and also set apart under ``name``: a routine of the user's whose cost the
    user chose (a validation sampling loop's ``num_inference_steps``), run once for the checks that share it."""
    _routines.append(name)
    try:
        yield
    finally:
        _routines.pop()


def reused() -> None:
    """Called from inside a module's forward that returned a result computed before (a memoised frozen
    encoder, :mod:`pytest_dlcheck.checks.shared.reuse`): the call was counted as a forward pass and is not
    one. Only an outermost call was counted, so only that one is taken back."""
    for cost, local in _active:
        stack = getattr(local, "stack", None)
        if stack and stack[-1] is not None:
            name, routine = stack[-1]
            stack[-1] = None
            cost.forward -= 1
            cost.models[name] -= 1
            if not cost.models[name]:
                del cost.models[name]
            if routine is not None:
                cost.routines[routine] -= 1
                if not cost.routines[routine]:
                    del cost.routines[routine]


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
    #: of the forward passes, those inside a routine of the user's (:func:`users_routine`), per routine
    routines: Counter = field(default_factory=Counter)

    def to_json(self) -> dict[str, Any]:
        out = {
            "forward": self.forward,
            "backward": self.backward,
            "optimizer_steps": self.optimizer_steps,
            "models": dict(self.models.most_common()),
        }
        if self.routines:
            out["in_user_routines"] = dict(self.routines.most_common())
        return out


@contextlib.contextmanager
def counting() -> Iterator[Cost]:
    cost = Cost()
    torch = sys.modules.get("torch")
    if torch is None:
        # the check may import torch itself: count from the first module call it makes after that
        yield cost
        return
    local = threading.local()

    local.stack = []  # per module call now running: (model name, routine) when it was counted, else None

    def pre(module, args):
        depth = getattr(local, "depth", 0)
        counted = None
        if depth == 0 and not _paused[0] and next(module.parameters(), None) is not None:  # a model, not a loss
            cost.forward += 1
            twin = " (twin)" if getattr(module, "_dlcheck_twin", False) else ""  # pytest_dlcheck.twin
            name = type(module).__name__ + twin
            cost.models[name] += 1
            routine = _routines[-1] if _routines else None
            if routine is not None:
                cost.routines[routine] += 1
            counted = (name, routine)
        local.depth = depth + 1
        getattr(local, "stack", []).append(counted)

    def post(module, args, output):
        local.depth = max(getattr(local, "depth", 1) - 1, 0)
        stack = getattr(local, "stack", None)
        if stack:
            stack.pop()

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
    entry = (cost, local)
    _active.append(entry)
    try:
        yield cost
    finally:
        _active.remove(entry)
        for name, wrapper in wrappers.items():
            if getattr(torch.autograd, name) is wrapper:
                setattr(torch.autograd, name, originals[name])
        for handle in handles:
            handle.remove()
