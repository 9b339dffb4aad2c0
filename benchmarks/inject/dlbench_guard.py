"""The device guard of the benchmark's GPU run (``-p dlbench_guard``, loaded into the generated projects by
``benchmarks/run.py --device cuda``, never by a user). While each test item runs it watches every
``Tensor.cpu()`` and ``Tensor.to(<cpu>)`` of a tensor on the guarded device (``cuda``; the tests set
``$DLBENCH_GUARD_DEVICE``) and attributes the call to the first frame outside torch: a call made by
pytest-dlcheck's own code (``pytest_dlcheck/`` or ``checks/``) is recorded, the user's pipeline moving its
own tensors is not. After each item it asserts that every parameter and buffer of every model the project
registered with :func:`watch` is still on the device it was registered on.

What counts as a violation (the benchmark prints them and exits non-zero):

- a registered model with a parameter or buffer off its device after an item ("left on …");
- plugin code copying a registered model's parameter, buffer or gradient to the CPU (its storage is one of
  the model's): the model's weights or gradients read on the host;
- plugin code calling ``Module.cpu()``/``Module.to(<cpu>)`` on any module whose parameters are on the device
  (a model, or a copy of one, moved to the CPU).

Every other CUDA→CPU copy by plugin code (a per-token loss, a timestep vector: values the check computed and
reads, as ``.item()`` reads a scalar) is listed with its call site, count and bytes, not judged: reading a
result to the host is how a check decides. ``.item()`` is never intercepted.

Writes JSON to ``$DLBENCH_GUARD_OUT`` at the end of the session. Importing this module imports no torch."""

from __future__ import annotations

import json
import os
import sys
import weakref
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest

_REPO = Path(__file__).resolve().parents[2]
#: where plugin code lives: a frame whose file is under one of these is the plugin's
PLUGIN_ROOTS: tuple[str, ...] = (str(_REPO / "pytest_dlcheck") + os.sep, str(_REPO / "checks") + os.sep)

#: (weak reference to a registered model, its device type at registration)
_MODELS: list[tuple[Any, str]] = []


def watch(model: Any) -> Any:
    """Register ``model``: after every item its parameters and buffers must still be on the device they are
    on now. Kept by weak reference (a factory's fresh models are not kept alive). Returns the model."""
    first = next(iter(model.parameters()), None)
    device = first.device.type if first is not None else "cpu"
    _MODELS.append((weakref.ref(model), device))
    return model


def _models() -> list[tuple[Any, str]]:
    alive = [(ref(), dev) for ref, dev in _MODELS]
    _MODELS[:] = [(ref, dev) for (ref, dev), (m, _) in zip(list(_MODELS), alive) if m is not None]
    return [(m, dev) for m, dev in alive if m is not None]


def off_device(models: list[tuple[Any, str]] | None = None) -> list[str]:
    """The registered models' tensors not on their device: ``"<Class>.<name> on <device>"``."""
    out = []
    for model, device in _models() if models is None else models:
        named = list(model.named_parameters()) + list(model.named_buffers())
        out += [f"{type(model).__name__}.{n} on {t.device}" for n, t in named if t.device.type != device]
    return out


def _model_storages() -> set[int]:
    ptrs = set()
    for model, _ in _models():
        for t in list(model.parameters()) + list(model.buffers()):
            for x in (t, t.grad):
                if x is not None and x.device.type != "meta":
                    ptrs.add(x.untyped_storage().data_ptr())
    return ptrs


def _plugin_frame(frame: Any, roots: tuple[str, ...]) -> str | None:
    """``file:line function`` of the first frame outside torch, when it is under ``roots``; else None."""
    torch_dir = os.sep + "torch" + os.sep
    while frame is not None and torch_dir in frame.f_code.co_filename:
        frame = frame.f_back
    if frame is None or not frame.f_code.co_filename.startswith(roots):
        return None
    name = frame.f_code.co_filename
    for root in roots:
        if name.startswith(root):
            name = str(Path(root).name) + "/" + name[len(root) :]
            break
    return f"{name}:{frame.f_lineno} {frame.f_code.co_name}"


def _cpu_target(args: tuple, kwargs: dict) -> bool:
    """Whether ``Tensor.to(*args, **kwargs)`` targets the CPU (a device, a string, or another tensor's)."""
    target = kwargs.get("device", args[0] if args else None)
    if target is None and "other" in kwargs:
        target = kwargs["other"]
    torch = sys.modules.get("torch")
    if torch is not None and torch.is_tensor(target):
        target = target.device  # .to(other_tensor)
    return target is not None and str(target).split(":")[0] == "cpu"


class Guard:
    """While active (``with guard.active(item_name):``), records ``Tensor.cpu()``/``.to(<cpu>)`` of tensors on
    ``device`` made by code under ``roots``. ``records``: one dict per call site and item (count, bytes,
    the largest shape, whether it copied a registered model's tensor); ``left``: items after which a
    registered model had a tensor off its device."""

    def __init__(self, device: str = "cuda", roots: tuple[str, ...] = PLUGIN_ROOTS):
        self.device, self.roots = device, roots
        self.records: dict[tuple[str, str], dict] = {}
        self.left: dict[str, list[str]] = {}

    @contextmanager
    def active(self, item: str) -> Iterator[None]:
        torch = sys.modules.get("torch")
        if torch is None:  # nothing can be on a device without torch
            yield
            self.after(item)
            return
        originals = {name: getattr(torch.Tensor, name) for name in ("cpu", "to")}
        module_originals = {name: getattr(torch.nn.Module, name) for name in ("cpu", "to")}
        storages: list[set[int] | None] = [None]  # computed once per item, on the first copy
        guard = self

        def record(t: Any, how: str, module: bool = False) -> None:
            if t.device.type != guard.device:
                return
            site = _plugin_frame(sys._getframe(2), guard.roots)
            if site is None:
                return
            if storages[0] is None:
                storages[0] = _model_storages()
            weights = module or (t.untyped_storage().data_ptr() in storages[0] if t.device.type != "meta" else False)
            rec = guard.records.setdefault(
                (item, site), {"item": item, "site": site, "calls": 0, "bytes": 0, "shape": [], "model": False}
            )
            rec["calls"] += 1
            size = t.numel() * t.element_size()
            rec["bytes"] += size
            if size >= rec.get("_largest", -1):
                rec["_largest"], rec["shape"] = size, list(t.shape)
            rec["how"] = how
            rec["model"] = rec["model"] or weights

        def cpu(self, *args, **kwargs):
            record(self, "cpu()")
            return originals["cpu"](self, *args, **kwargs)

        def to(self, *args, **kwargs):
            if _cpu_target(args, kwargs):
                record(self, "to(cpu)")
            return originals["to"](self, *args, **kwargs)

        def module_cpu(self, *args, **kwargs):
            first = next(iter(self.parameters()), None)
            if first is not None:
                record(first, f"{type(self).__name__}.cpu()", module=True)
            return module_originals["cpu"](self, *args, **kwargs)

        def module_to(self, *args, **kwargs):
            first = next(iter(self.parameters()), None)
            if first is not None and _cpu_target(args, kwargs):
                record(first, f"{type(self).__name__}.to(cpu)", module=True)
            return module_originals["to"](self, *args, **kwargs)

        torch.Tensor.cpu, torch.Tensor.to = cpu, to
        torch.nn.Module.cpu, torch.nn.Module.to = module_cpu, module_to
        try:
            yield
        finally:
            torch.Tensor.cpu, torch.Tensor.to = originals["cpu"], originals["to"]
            torch.nn.Module.cpu, torch.nn.Module.to = module_originals["cpu"], module_originals["to"]
        self.after(item)

    def after(self, item: str) -> None:
        left = off_device()
        if left:
            self.left[item] = left

    def violations(self) -> list[str]:
        """One line per violation: a model left off its device, or its tensors copied to the CPU by plugin code."""
        out = [f"{item}: left {', '.join(t[:5])}{' …' if len(t) > 5 else ''}" for item, t in self.left.items()]
        out += [
            f"{r['item']}: {r['site']} moved or copied a model's tensors to the CPU ({r['how']}, {r['calls']} calls, "
            f"{r['bytes'] / 2**20:.1f} MiB)"
            for r in self.records.values()
            if r["model"]
        ]
        return out

    def transfers(self) -> list[dict]:
        """Every recorded call site, without the bookkeeping."""
        return [{k: v for k, v in r.items() if not k.startswith("_")} for r in self.records.values()]


_GUARD = Guard(os.environ.get("DLBENCH_GUARD_DEVICE", "cuda"))


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_call(item):  # noqa: ANN001 - pytest hook
    with _GUARD.active(item.nodeid):
        yield


def pytest_sessionfinish(session, exitstatus):  # noqa: ANN001 - pytest hook
    path = os.environ.get("DLBENCH_GUARD_OUT")
    if not path:
        return
    with open(path, "w") as fh:
        json.dump({"device": _GUARD.device, "violations": _GUARD.violations(), "transfers": _GUARD.transfers()}, fh)
