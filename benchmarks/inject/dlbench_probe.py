"""Loaded into every benchmarked pytest run (``-p dlbench_probe``): when each phase ended, how long each
item took, which heavy libraries were imported, whether pytest-dlcheck was registered, and, on a GPU,
where the registered models' tensors live and whether anything moved one to the CPU. Writes JSON to
``$DLBENCH_PROBE_OUT`` at the end of the session. Costs the same on both sides of every ratio."""

from __future__ import annotations

import json
import os
import sys
import time

IMPORTED_AT = time.time()
HEAVY = (
    "torch",
    "numpy",
    "transformers",
    "trl",
    "datasets",
    "accelerate",
    "torchvision",
    "timm",
    "diffusers",
    "gymnasium",
    "matplotlib",
    "hypothesis",
)

#: models a benchmark project registers with :func:`watch` (device checks)
MODELS: list = []
#: (module class, target) for every tracked module moved to the CPU while on another device
MOVED: list = []
_marks: dict = {}
_items: dict = {}


def watch(model, device: str | None = None) -> None:
    """Track ``model``: at the end, report its tensors' devices; while running, record any call that moves
    it (or a submodule) to the CPU when it lives elsewhere."""
    import torch

    MODELS.append(model)
    if getattr(torch.nn.Module, "_dlbench_patched", False):
        return
    tracked = lambda m: any(m is t or any(m is s for s in t.modules()) for t in MODELS)

    def on_cpu_target(args, kwargs) -> bool:
        target = kwargs.get("device", args[0] if args else None)
        return target is not None and str(target).startswith("cpu")

    def wrap(name, is_cpu):
        original = getattr(torch.nn.Module, name)

        def method(self, *args, **kwargs):
            if tracked(self) and is_cpu(args, kwargs):
                first = next(iter(self.parameters()), None)
                if first is not None and first.device.type != "cpu":
                    MOVED.append(f"{type(self).__name__}.{name}({', '.join(map(repr, args))})")
            return original(self, *args, **kwargs)

        setattr(torch.nn.Module, name, method)

    wrap("to", on_cpu_target)
    wrap("cpu", lambda args, kwargs: True)
    torch.nn.Module._dlbench_patched = True


def pytest_configure(config):
    _marks["configured"] = time.time()
    _marks["config"] = config


def pytest_collection_finish(session):
    _marks["collected"] = time.time()
    _marks["n_items"] = len(session.items)


def memory_mb() -> dict:
    """This process's resident memory now (VmRSS) and its peak so far (VmHWM), MiB; empty where /proc has none."""
    out = {}
    try:
        with open("/proc/self/status") as fh:
            for line in fh:
                if line.startswith(("VmRSS:", "VmHWM:")):
                    out[line[:5].lower()] = int(line.split()[1]) / 1024
    except OSError:
        pass
    return out


def pytest_runtest_logreport(report):
    if report.when == "setup" and "after_first_setup" not in _marks and os.environ.get("DLBENCH_RSS"):
        _marks["after_first_setup"] = memory_mb()
    item = _items.setdefault(report.nodeid, {"setup": 0.0, "call": 0.0, "teardown": 0.0, "outcome": "passed"})
    item[report.when] += report.duration
    if report.when == "teardown" and os.environ.get("DLBENCH_RSS"):
        item["memory"] = memory_mb()  # after the item: what it left alive (VmRSS) and the peak so far (VmHWM)
    info = next((v for k, v in report.user_properties if k == "dlcheck"), None)
    if isinstance(info, dict) and info.get("cost"):
        item["cost"] = info["cost"]  # pytest_dlcheck.cost: passes through the models, cumulative per item
    if isinstance(info, dict) and info.get("time"):
        item["time"] = info["time"]  # pytest_dlcheck.cost.timing: the user's seconds, the shared runs it made
    if isinstance(info, dict) and info.get("id"):
        item.update(check=info["id"], domain=info.get("domain"))
    if report.outcome != "passed" and item["outcome"] == "passed":
        item["outcome"] = report.outcome if report.when == "call" or report.outcome == "skipped" else "error"


def _devices() -> dict:
    out = {}
    for i, model in enumerate(MODELS):
        kinds: dict = {}
        for t in list(model.parameters()) + list(model.buffers()):
            kinds[t.device.type] = kinds.get(t.device.type, 0) + 1
        out[f"{i}:{type(model).__name__}"] = kinds
    return out


def _cuda_peak_mb():
    torch = sys.modules.get("torch")
    if torch is None or not torch.cuda.is_available() or not torch.cuda.is_initialized():
        return None
    return torch.cuda.max_memory_allocated() / 2**20


def pytest_sessionfinish(session, exitstatus):
    path = os.environ.get("DLBENCH_PROBE_OUT")
    if not path:
        return
    config = _marks.get("config")
    record = {
        "imported_at": IMPORTED_AT,
        "configured_at": _marks.get("configured"),
        "collected_at": _marks.get("collected"),
        "finished_at": time.time(),
        "n_items": _marks.get("n_items"),
        "exitstatus": int(exitstatus),
        "items": _items,
        "heavy_modules": [m for m in HEAVY if m in sys.modules],
        "dlcheck_registered": bool(config and config.pluginmanager.has_plugin("dlcheck")),
        "devices": _devices(),
        "moved_to_cpu": MOVED,
        "cuda_peak_mb": _cuda_peak_mb(),
        "memory_after_first_setup": _marks.get("after_first_setup"),
        "memory_at_end": memory_mb(),
    }
    with open(path, "w") as fh:
        json.dump(record, fh)
