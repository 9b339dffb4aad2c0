"""What a check costs in work, not seconds: the forward passes of models (a call of a module with parameters
that is not inside another module's forward), the backward passes and the optimizer steps that happen while the check
(its setup and call) runs, except inside the user's own fixtures built during the call (:func:`users_work`).
A shared run (:func:`shared_run`: the smoke run, the sampled batches, a memoised forward) is counted apart,
as the run's, not as the work of the check that happened to need it first, and is free for the others, which
is what sharing buys. A module run again inside a backward pass (gradient checkpointing's recomputation) is
part of that backward, not a forward pass; a backward started inside another (reentrant checkpointing) is
part of the outer one.

Counting uses torch's global hooks (``register_module_forward_pre_hook`` / ``…_forward_hook`` with
``always_call``, the optimizer step post hook) and wraps ``torch.autograd.backward``; all of them are
removed when the check ends. Nothing is counted when torch was never imported.

What a check costs in wall time (:func:`timing`, ``perf_counter`` only): the seconds in the user's work, by
category: ``forward`` (an outermost module call), ``backward``, ``step`` (an optimizer step), ``data`` (a
DataLoader's ``__next__``, a user's dataset or dataloader called by the checks), ``calls`` (the user's
own callables, :func:`pytest_dlcheck.session.user_call`) and ``fixtures`` (the user's fixtures built for the
check); a nested region counts once, in the innermost category (a forward inside a user's callable is
forward time), so the categories add up to the union. The rest of the check's duration is the plugin's own
work. A shared run (:func:`shared_run`: the smoke run, the sampled batches) is timed apart, charged to
the run, not to the check that happened to make it first."""

from __future__ import annotations

import contextlib
import sys
import threading
import time
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


#: the user-time categories open now, innermost last (their owner thread: :data:`_clock_thread`)
_open: list[str] = []
#: the clocks running now (a check's, then a shared run's being made inside it), innermost last
_clocks: list[Clock] = []
_mark = [0.0]
_clock_thread = [0]


@dataclass(eq=False)  # clocks are told apart by identity: two fresh clocks are equal by value
class Clock:
    """The seconds of the user's work per category, and the shared runs made inside (timed apart)."""

    user: Counter = field(default_factory=Counter)
    #: label -> the shared run made while this clock ran: {"seconds", "user": {category: s}, "made_by"}
    made: dict[str, dict[str, Any]] = field(default_factory=dict)
    #: the labels of the shared runs read (made here or before)
    used: list[str] = field(default_factory=list)

    def settled(self) -> Clock:
        """This clock with the time up to now charged (read it while it runs)."""
        _charge()
        return self


def _charge() -> None:
    now = time.perf_counter()
    if _clocks and _open:
        _clocks[-1].user[_open[-1]] += now - _mark[0]
    _mark[0] = now


def enter(category: str) -> None:
    """The user's work of ``category`` starts (time before it goes to the category open until now)."""
    if _clocks and threading.get_ident() == _clock_thread[0]:
        _charge()
        _open.append(category)


def leave(category: str) -> None:
    if _clocks and threading.get_ident() == _clock_thread[0]:
        _charge()
        for i in range(len(_open) - 1, -1, -1):
            if _open[i] == category:
                del _open[i]
                break


@contextlib.contextmanager
def user_time(category: str) -> Iterator[None]:
    """Time inside is the user's work of ``category`` (unless a nested region claims it)."""
    enter(category)
    try:
        yield
    finally:
        leave(category)


@contextlib.contextmanager
def timing(category: str | None = None) -> Iterator[Clock]:
    """A check's clock (its setup and call each run one; ``category``: all of it is the user's work of
    that kind unless a nested region claims it, the setup's fixtures)."""
    clock = Clock()
    outer = bool(_clocks)
    if not outer:
        _clock_thread[0] = threading.get_ident()
        _open.clear()
    _charge()
    _clocks.append(clock)
    if category:
        _open.append(category)
    try:
        yield clock
    finally:
        _charge()
        _clocks.remove(clock)
        if category and category in _open:
            _open.remove(category)
        if not _clocks:
            _open.clear()  # a step hook whose post hook never ran (the step raised) leaves nothing behind


@contextlib.contextmanager
def shared_run(label: str, made_by: str) -> Iterator[None]:
    """A shared run being made (``label``: "smoke run"): its time is the run's, recorded for the clock that
    made it, apart from that check's own user and plugin time."""
    if not _clocks or threading.get_ident() != _clock_thread[0]:
        yield
        return
    parent = _clocks[-1]
    _charge()
    clock = Clock()
    saved = list(_open)
    _open.clear()  # a category open outside is not this run's
    _clocks.append(clock)
    counters = [(cost, cost.copy()) for cost, _ in _active]
    started = time.perf_counter()
    try:
        yield
    finally:
        _charge()
        seconds = time.perf_counter() - started
        _clocks.remove(clock)
        _open[:] = saved
        nested = sum(r["seconds"] for r in clock.made.values())
        # the passes made inside are the run's too, taken off the check that happened to make it (a run made
        # inside this one was taken off already, and is recorded as its own)
        work = Cost()
        for i, (cost, before) in enumerate(counters):
            made = cost.minus(before)
            cost.subtract(made)
            if i == 0:
                work = made
        run = {"seconds": max(seconds - nested, 0.0), "user": dict(clock.user), "cost": work.to_json()}
        merge_run(parent.made, label, run, made_by)
        for inner, run in clock.made.items():  # made inside this one: each its own run
            merge_run(parent.made, inner, run, run["made_by"])
        _mark[0] = time.perf_counter()


def merge_run(made: dict[str, dict[str, Any]], label: str, run: dict[str, Any], made_by: str) -> None:
    """Add a shared run's seconds to ``made`` (a run of the same name made twice, a spare remade, adds up)."""
    have = made.setdefault(label, {"seconds": 0.0, "user": {}, "made_by": made_by})
    have["seconds"] += run["seconds"]
    for category, seconds in run["user"].items():
        have["user"][category] = have["user"].get(category, 0.0) + seconds
    if "cost" in run:
        have["cost"] = add_cost(have.get("cost") or {}, run["cost"])


def add_cost(total: dict[str, Any], more: dict[str, Any]) -> dict[str, Any]:
    """Two costs' JSON (:meth:`Cost.to_json`) added up: the counts summed, the per-model counts merged."""
    out = dict(total)
    for key, value in more.items():
        if isinstance(value, dict):
            merged = dict(out.get(key) or {})
            for name, n in value.items():
                merged[name] = merged.get(name, 0) + n
            out[key] = merged
        else:
            out[key] = out.get(key, 0) + value
    return out


def used_shared(label: str) -> None:
    """A check read the shared run ``label`` (made by it or by an earlier check)."""
    if _clocks and label not in _clocks[0].used:
        _clocks[0].used.append(label)


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
    enter("fixtures")
    try:
        yield
    finally:
        leave("fixtures")
        _paused[0] -= 1


@dataclass
class Cost:
    forward: int = 0
    backward: int = 0
    optimizer_steps: int = 0
    models: Counter = field(default_factory=Counter)
    #: of the forward passes, those inside a routine of the user's (:func:`users_routine`), per routine
    routines: Counter = field(default_factory=Counter)

    def copy(self) -> Cost:
        return Cost(self.forward, self.backward, self.optimizer_steps, Counter(self.models), Counter(self.routines))

    def minus(self, before: Cost) -> Cost:
        """The work counted since ``before`` (a copy taken then)."""
        return Cost(
            self.forward - before.forward,
            self.backward - before.backward,
            self.optimizer_steps - before.optimizer_steps,
            +(self.models - before.models),
            +(self.routines - before.routines),
        )

    def subtract(self, work: Cost) -> None:
        """Take ``work`` off this count (a shared run's passes: the run's, not the check's)."""
        self.forward -= work.forward
        self.backward -= work.backward
        self.optimizer_steps -= work.optimizer_steps
        self.models = +(self.models - work.models)
        self.routines = +(self.routines - work.routines)

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
        # a module run again inside a backward pass (gradient checkpointing recomputes each block's forward
        # there) is part of that backward, not a forward pass of the model: its time stays backward time
        recompute = depth == 0 and _in_backward(torch)
        if depth == 0:
            local.outer_forward = not recompute
            if not recompute:
                enter("forward")
        counted = None
        model = next(module.parameters(), None) is not None  # a model, not a loss
        if depth == 0 and not recompute and not _paused[0] and model:
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
        if local.depth == 0 and getattr(local, "outer_forward", True):
            leave("forward")
        stack = getattr(local, "stack", None)
        if stack:
            stack.pop()

    def stepping(optimizer, args, kwargs):
        enter("step")

    def stepped(optimizer, args, kwargs):
        leave("step")
        if not _paused[0]:
            cost.optimizer_steps += 1

    from torch.nn.modules import module as nn_module
    from torch.optim import optimizer as optim

    handles = [
        nn_module.register_module_forward_pre_hook(pre),
        nn_module.register_module_forward_hook(post, always_call=True),
        optim.register_optimizer_step_pre_hook(stepping),
        optim.register_optimizer_step_post_hook(stepped),
    ]
    loader_iter = _loader_iter_class()
    loader_next = loader_iter.__dict__.get("__next__") if loader_iter is not None else None
    if loader_next is not None:

        def timed_next(self):
            with user_time("data"):
                return loader_next(self)

        loader_iter.__next__ = timed_next
    originals = {name: getattr(torch.autograd, name) for name in ("backward", "grad")}

    def counted(fn):
        def run(*args, **kwargs):
            if not _paused[0] and not _in_backward(torch):  # reentrant checkpointing's inner backward: the same pass
                cost.backward += 1
            with user_time("backward"):
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
        if loader_next is not None and loader_iter.__dict__.get("__next__") is timed_next:
            loader_iter.__next__ = loader_next


def _in_backward(torch: Any) -> bool:
    """True inside the autograd engine's execution of a backward pass (a gradient checkpoint's recomputation)."""
    current = getattr(torch._C, "_current_autograd_node", None)
    try:
        return current is not None and current() is not None
    except Exception:  # noqa: BLE001 - an older torch: count as before
        return False


def _loader_iter_class() -> Any:
    """torch's DataLoader iterator class (its ``__next__`` is the data loading), when torch is imported."""
    module = sys.modules.get("torch.utils.data.dataloader")
    return getattr(module, "_BaseDataLoaderIter", None) if module is not None else None
