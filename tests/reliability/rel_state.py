"""Fingerprints of everything a check must leave as it found it, for the no-trace proofs.

``fingerprint(obj)`` walks a user's object graph (a model, tokenizer, dataloader, trainer, diffusers
pipeline, EMA, optimizer, closure, dict/list/namespace…) and returns a flat ``{path: value}`` dict:
parameters and buffers (bit for bit), gradients, requires_grad, every submodule's train/eval flag, its
hooks and instance attributes, configs, tokenizer settings and vocabulary, dataloader and sampler
generator states, optimizer/scheduler state, EMA shadows. ``global_state()`` does the same for the
process: python/numpy/torch/CUDA RNG states, grad mode, default dtype, deterministic algorithms, threads,
the environment, cwd, the library loggers' levels. ``diff(before, after)`` names what changed.

``FileWrites`` is a ``sys.addaudithook`` recorder of files opened for writing, created, renamed or
removed while a check runs; what is left afterwards outside pytest's tmp paths is a trace."""

from __future__ import annotations

import logging
import os
import random
import sys
import threading
import traceback
import types
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np
import torch

from pytest_dlcheck.session import in_plugin

#: library state that every call rewrites from its arguments, not a setting a check could leave behind:
#: torchvision's MultiScaleRoIAlign recomputes scales/map_levels from the feature maps on each forward
PER_CALL = {"MultiScaleRoIAlign": ("scales", "map_levels")}
#: transformers 5 installs its output-capturing hooks once, on the first forward that asks for hidden
#: states or attentions (a check's or the user's): they record nothing unless a later call asks
LAZY_HOOKS = "_output_capturing_hooks_installed"

#: the most list elements / nodes walked (the tiny projects stay far below)
MAX_ITEMS = 64
MAX_NODES = 20000
SCALARS = (str, int, float, bool, bytes, type(None))
TRUNCATED = "<walk truncated>"


def _tensor(t: torch.Tensor) -> Any:
    if t.is_meta:
        return ("meta", tuple(t.shape), str(t.dtype))
    return t.detach().clone()


def _same(a: Any, b: Any) -> bool:
    if isinstance(a, torch.Tensor) or isinstance(b, torch.Tensor):
        if not (isinstance(a, torch.Tensor) and isinstance(b, torch.Tensor)):
            return False
        return a.dtype == b.dtype and a.shape == b.shape and torch.equal(a, b)
    if isinstance(a, np.ndarray) or isinstance(b, np.ndarray):
        return isinstance(a, np.ndarray) and isinstance(b, np.ndarray) and a.shape == b.shape and np.array_equal(a, b)
    if isinstance(a, float) and isinstance(b, float) and a != a and b != b:
        return True  # nan == nan for the purpose of "unchanged"
    try:
        return bool(a == b)
    except Exception:  # noqa: BLE001 - values whose == is not a bool: compare their reprs
        return repr(a) == repr(b)


def _short(value: Any) -> str:
    if isinstance(value, torch.Tensor):
        return f"tensor{tuple(value.shape)} {value.dtype}"
    text = repr(value)
    return text if len(text) <= 120 else text[:117] + "..."


def diff(before: dict[str, Any], after: dict[str, Any], limit: int = 8) -> list[str]:
    out = []
    # a walk that ran out of its node budget saw a different part of a huge graph each time: compare
    # what both saw
    partial = before.get(TRUNCATED) or after.get(TRUNCATED)
    keys = (before.keys() & after.keys()) if partial else (before.keys() | after.keys())
    for key in sorted(keys - {TRUNCATED}):
        if key not in after:
            out.append(f"{key}: gone (was {_short(before[key])})")
        elif key not in before:
            out.append(f"{key}: new ({_short(after[key])})")
        elif not _same(before[key], after[key]):
            a, b = before[key], after[key]
            if (
                isinstance(a, torch.Tensor)
                and isinstance(b, torch.Tensor)
                and a.shape == b.shape
                and a.dtype == b.dtype
            ):
                if a.is_floating_point() and a.numel():
                    gap = (a.double() - b.double()).abs().max().item()
                    out.append(f"{key}: changed (largest change {gap:.3g})")
                else:
                    out.append(f"{key}: changed ({int((a != b).sum())} of {a.numel()} values)")
            else:
                out.append(f"{key}: {_short(before[key])} -> {_short(after[key])}")
        if len(out) >= limit:
            out.append("…")
            break
    return out


# ---------------------------------------------------------------------------------------------------
# objects


def _is_tokenizer(obj: Any) -> bool:
    return any(
        c.__name__ in ("PreTrainedTokenizerBase", "TokenizersBackend", "PythonBackend") for c in type(obj).__mro__
    )


def _is_diffusers(obj: Any, base: str) -> bool:
    return any(c.__name__ == base and c.__module__.startswith("diffusers.") for c in type(obj).__mro__)


def _is_trainer(obj: Any) -> bool:
    return any(
        c.__module__.startswith(("transformers.", "trl.")) and c.__name__.endswith("Trainer") for c in type(obj).__mro__
    )


class _Walk:
    def __init__(self) -> None:
        self.out: dict[str, Any] = {}
        self.seen: set[int] = set()
        self.keep: list[Any] = []
        self.nodes = 0

    def put(self, path: str, value: Any) -> None:
        self.out[path] = value

    def visit(self, obj: Any, path: str, depth: int) -> None:
        if isinstance(obj, SCALARS):
            self.put(path, obj)
            return
        if self.nodes > MAX_NODES or depth < 0:
            return
        if id(obj) in self.seen:
            return
        self.seen.add(id(obj))
        self.keep.append(obj)  # a temporary (a list of defaults) must not free its id for another object
        self.nodes += 1
        if isinstance(obj, torch.Tensor):
            self.put(path, _tensor(obj))
        elif isinstance(obj, np.ndarray):
            self.put(path, obj.copy())
        elif isinstance(obj, torch.Generator):
            self.put(path + ".state", obj.get_state())
        elif isinstance(obj, torch.nn.Module):
            self.module(obj, path)
        elif _is_tokenizer(obj):
            self.tokenizer(obj, path)
        elif _is_trainer(obj):
            self.trainer(obj, path, depth)
        elif isinstance(obj, torch.utils.data.DataLoader):
            self.dataloader(obj, path, depth)
        elif isinstance(obj, torch.optim.Optimizer):
            self.put(path + ".state_dict", _plain(obj.state_dict()))
        elif hasattr(obj, "state_dict") and hasattr(obj, "step") and hasattr(obj, "optimizer"):  # an LR scheduler
            self.put(path + ".state_dict", _plain(obj.state_dict()))
        elif type(obj).__name__ == "EMAModel":
            self.visit(list(obj.shadow_params), path + ".shadow_params", depth)
            for name in ("optimization_step", "cur_decay_value", "decay", "temp_stored_params"):
                value = getattr(obj, name, None)
                self.put(
                    f"{path}.{name}",
                    None
                    if value is None
                    else value
                    if isinstance(value, SCALARS)
                    else [_tensor(t) for t in value]
                    if isinstance(value, list)
                    else repr(value),
                )
        elif type(obj).__module__.startswith("datasets.") and hasattr(obj, "_fingerprint"):
            self.put(path + "._fingerprint", obj._fingerprint)
            self.put(path + ".format", repr(obj.format))
            self.put(path + ".len", len(obj))
        elif isinstance(obj, Mapping):
            for i, (k, v) in enumerate(obj.items()):
                if i >= MAX_ITEMS:
                    break
                self.visit(v, f"{path}[{k!r}]", depth - 1)
            self.put(path + ".keys", repr(list(obj.keys())[:MAX_ITEMS]))
        elif isinstance(obj, (list, tuple)):
            self.put(path + ".len", len(obj))
            for i, v in enumerate(obj[:MAX_ITEMS]):
                self.visit(v, f"{path}[{i}]", depth - 1)
        elif isinstance(obj, (types.FunctionType, types.MethodType)):
            func = getattr(obj, "__func__", obj)
            if isinstance(obj, types.MethodType):
                self.visit(obj.__self__, path + ".__self__", depth - 1)
            for name, cell in zip(func.__code__.co_freevars, func.__closure__ or ()):
                try:
                    value = cell.cell_contents
                except ValueError:
                    continue
                self.visit(value, f"{path}.<{name}>", depth - 1)
            if func.__defaults__:
                self.visit(list(func.__defaults__), path + ".__defaults__", depth - 1)
        elif _is_diffusers(obj, "SchedulerMixin"):
            # a scheduler's settings are its config; timesteps, sigmas, step index and num_inference_steps
            # are rewritten by set_timesteps at the start of every sampling call
            self.put(path + ".config", repr(sorted(dict(obj.config).items())))
        elif _is_diffusers(obj, "DiffusionPipeline"):
            # the components and settings; _guidance_scale, _num_timesteps… are the last call's arguments,
            # which every __call__ sets afresh
            self.put(path + ".config", repr(sorted(dict(obj.config).items())))
            self.put(path + ".progress_bar_config", repr(getattr(obj, "_progress_bar_config", None)))
            for name, component in obj.components.items():
                self.visit(component, f"{path}.{name}", depth - 1)
        elif hasattr(obj, "__dict__") and not isinstance(obj, type) and not isinstance(obj, types.ModuleType):
            self.generic(obj, path, depth)

    def module(self, m: torch.nn.Module, path: str) -> None:
        for name, t in m.state_dict(keep_vars=True).items():
            self.put(f"{path}.{name}", _tensor(t))
        for name, p in m.named_parameters():
            self.put(f"{path}.{name}.requires_grad", p.requires_grad)
            self.put(f"{path}.{name}.grad", None if p.grad is None else _tensor(p.grad))
            self.put(f"{path}.{name}.is_parameter", type(p).__name__)
        for name, sub in m.named_modules():
            at = f"{path}.{name}" if name else path
            self.put(at + ".training", sub.training)
            self.put(
                at + ".hooks",
                tuple(
                    sum(1 for f in getattr(sub, h, {}).values() if not _library_hook(f))
                    for h in (
                        "_forward_hooks",
                        "_forward_pre_hooks",
                        "_backward_hooks",
                        "_backward_pre_hooks",
                        "_state_dict_hooks",
                        "_load_state_dict_pre_hooks",
                    )
                ),
            )
            per_call = PER_CALL.get(type(sub).__name__, ()) + (LAZY_HOOKS,)
            self.put(at + ".attributes", tuple(sorted(k for k in vars(sub) if k not in per_call)))
            for key, value in vars(sub).items():
                if isinstance(value, SCALARS) and not key.startswith("__") and key not in per_call:
                    self.put(f"{at}.{key}", value)
        for owner in ("config", "generation_config"):
            cfg = getattr(m, owner, None)
            if cfg is not None and hasattr(cfg, "to_dict"):
                try:
                    self.put(f"{path}.{owner}", repr(sorted(cfg.to_dict().items())))
                except Exception:  # noqa: BLE001
                    pass
            elif isinstance(cfg, Mapping):
                self.put(f"{path}.{owner}", repr(sorted(dict(cfg).items())))

    def tokenizer(self, tok: Any, path: str) -> None:
        from pytest_dlcheck.guard import tokenizer_settings

        self.put(path + ".settings", repr(sorted(tokenizer_settings(tok).items())))
        self.put(path + ".len", len(tok))
        self.put(path + ".vocab", repr(sorted(tok.get_vocab().items())))
        self.put(path + ".special_tokens_map", repr(tok.special_tokens_map))
        self.put(path + ".added_tokens", repr(sorted((i, str(t)) for i, t in tok.added_tokens_decoder.items())))
        self.put(path + ".init_kwargs", repr(sorted((k, repr(v)) for k, v in tok.init_kwargs.items())))
        # the backend's truncation/padding are per call state: every tokenizer call sets or clears them
        self.put(path + ".attributes", tuple(sorted(vars(tok))))

    def dataloader(self, dl: Any, path: str, depth: int) -> None:
        for owner, at in (
            (dl, ""),
            (dl.sampler, ".sampler"),
            (dl.batch_sampler, ".batch_sampler"),
            (getattr(dl.batch_sampler, "sampler", None), ".batch_sampler.sampler"),
        ):
            gen = getattr(owner, "generator", None)
            if isinstance(gen, torch.Generator):
                self.put(f"{path}{at}.generator", gen.get_state())
            for name in ("epoch", "seed", "shuffle", "drop_last"):
                value = getattr(owner, name, None)
                if isinstance(value, SCALARS) and value is not None:
                    self.put(f"{path}{at}.{name}", value)
        self.put(path + ".iterator", getattr(dl, "_iterator", None) is not None)
        self.put(path + ".batch_size", dl.batch_size)
        self.put(path + ".collate_fn", repr(dl.collate_fn)[:80])
        self.visit(dl.dataset, path + ".dataset", depth - 1)
        self.visit(dl.collate_fn, path + ".collate_fn", depth - 1)

    def trainer(self, tr: Any, path: str, depth: int) -> None:
        self.visit(tr.model, path + ".model", depth)
        for name in (
            "ref_model",
            "processing_class",
            "optimizer",
            "lr_scheduler",
            "train_dataset",
            "eval_dataset",
            "data_collator",
        ):
            value = getattr(tr, name, None)
            if value is not None:
                self.visit(value, f"{path}.{name}", depth - 1)
        self.put(path + ".state", repr(tr.state))
        self.put(path + ".args", repr(sorted(tr.args.to_dict().items())))
        acc = getattr(tr, "accelerator", None)
        if acc is not None:
            self.put(
                path + ".accelerator.prepared",
                tuple(len(getattr(acc, n, ())) for n in ("_dataloaders", "_models", "_optimizers", "_schedulers")),
            )
        self.put(path + ".callbacks", repr([type(c).__name__ for c in tr.callback_handler.callbacks]))
        self.put(path + ".attributes", tuple(sorted(vars(tr))))

    def generic(self, obj: Any, path: str, depth: int) -> None:
        attrs = vars(obj)
        self.put(path + ".attributes", tuple(sorted(attrs)))
        config = getattr(obj, "config", None)  # diffusers schedulers and pipelines
        if isinstance(config, Mapping):
            self.put(path + ".config", repr(sorted(dict(config).items())))
        for key, value in list(attrs.items())[:200]:
            if key.startswith("__"):
                continue
            self.visit(value, f"{path}.{key}", depth - 1)


def _library_hook(fn: Any) -> bool:
    """transformers' output-capturing hooks (see LAZY_HOOKS)."""
    fn = getattr(fn, "func", fn)
    return (getattr(fn, "__module__", "") or "").startswith("transformers.utils.output_capturing")


def _plain(value: Any) -> Any:
    """A state dict with every tensor cloned, for comparison."""
    if isinstance(value, torch.Tensor):
        return _tensor(value)
    if isinstance(value, Mapping):
        return {k: _plain(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return type(value)(_plain(v) for v in value) if isinstance(value, list) else tuple(_plain(v) for v in value)
    return value


def fingerprint(obj: Any, path: str = "", depth: int = 4) -> dict[str, Any]:
    walk = _Walk()
    walk.visit(obj, path, depth)
    out = _flatten(walk.out)
    out[TRUNCATED] = walk.nodes > MAX_NODES
    return out


def _flatten(out: dict[str, Any]) -> dict[str, Any]:
    flat: dict[str, Any] = {}
    for key, value in out.items():
        if isinstance(value, Mapping):
            for k, v in _items(value, key):
                flat[k] = v
        else:
            flat[key] = value
    return flat


def _items(value: Any, prefix: str):
    if isinstance(value, Mapping):
        for k, v in value.items():
            yield from _items(v, f"{prefix}[{k!r}]")
    elif isinstance(value, (list, tuple)) and any(isinstance(v, (Mapping, torch.Tensor)) for v in value):
        for i, v in enumerate(value):
            yield from _items(v, f"{prefix}[{i}]")
    else:
        yield prefix, value


# ---------------------------------------------------------------------------------------------------
# the process


LOGGERS = ("", "transformers", "diffusers", "datasets", "torch", "accelerate", "trl", "timm", "PIL", "matplotlib")


def global_state() -> dict[str, Any]:
    out: dict[str, Any] = {
        "random": random.getstate(),
        "numpy.random": np.random.get_state()[1].copy(),
        "numpy.random.pos": int(np.random.get_state()[2]),
        "torch.random": torch.random.get_rng_state(),
        "torch.grad_enabled": torch.is_grad_enabled(),
        "torch.inference_mode": torch.is_inference_mode_enabled(),
        "torch.default_dtype": torch.get_default_dtype(),
        "torch.deterministic": torch.are_deterministic_algorithms_enabled(),
        "torch.num_threads": torch.get_num_threads(),
        "torch.anomaly": torch.is_anomaly_enabled(),
        "torch.global_forward_hooks": len(torch.nn.modules.module._global_forward_hooks),
        "torch.global_forward_pre_hooks": len(torch.nn.modules.module._global_forward_pre_hooks),
        "cwd": os.getcwd(),
        "sys.path": repr(sys.path),
        "threads": len([t for t in threading.enumerate() if not t.daemon]),
        "loggers": repr([(n, logging.getLogger(n).level, logging.getLogger(n).disabled) for n in LOGGERS]),
        "logging.disable": logging.root.manager.disable,
    }
    for key, value in os.environ.items():
        if key != "PYTEST_CURRENT_TEST":  # pytest's own, set per phase
            out[f"environ[{key}]"] = value
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        for i, state in enumerate(torch.cuda.get_rng_state_all()):
            out[f"torch.cuda.random[{i}]"] = state
    return out


# ---------------------------------------------------------------------------------------------------
# files


_WRITE_FLAGS = os.O_WRONLY | os.O_RDWR | os.O_CREAT | os.O_APPEND | os.O_TRUNC
_PATH_EVENTS = {
    "os.mkdir": 0,
    "os.rename": 1,
    "os.replace": 1,
    "os.symlink": 1,
    "os.link": 1,
    "os.truncate": 0,
    "shutil.copyfile": 1,
    "shutil.copytree": 1,
    "shutil.move": 1,
    "os.chmod": 0,
    "os.utime": 0,
}


class FileWrites:
    """Records paths written while ``active`` (one audit hook per process, installed once)."""

    _installed: list[FileWrites] = []

    def __init__(self) -> None:
        self.active = False
        self.paths: list[tuple[str, str]] = []  # (path, where)
        if not FileWrites._installed:
            sys.addaudithook(FileWrites._hook)
        FileWrites._installed.append(self)

    def close(self) -> None:
        self.active = False
        if self in FileWrites._installed:
            FileWrites._installed.remove(self)

    @staticmethod
    def _hook(event: str, args: tuple) -> None:
        if event != "open" and event not in _PATH_EVENTS:
            return
        for rec in FileWrites._installed:
            if rec.active:
                rec._record(event, args)

    def _record(self, event: str, args: tuple) -> None:
        if event == "open":
            path, mode, flags = (tuple(args) + (None, None, None))[:3]
            if isinstance(mode, str):
                writing = any(c in mode for c in "wax+")
            else:
                writing = isinstance(flags, int) and bool(flags & _WRITE_FLAGS)
            if not writing:
                return
        else:
            path = args[_PATH_EVENTS[event]] if len(args) > _PATH_EVENTS[event] else None
        if isinstance(path, bytes):
            path = os.fsdecode(path)
        if not isinstance(path, (str, os.PathLike)):
            return
        path = os.path.abspath(os.fspath(path))
        if "__pycache__" in path or path.endswith((".pyc", ".pyo")) or path.startswith(("/dev/", "/proc/")):
            return
        self.active = False  # the stack walk below raises audit events of its own
        try:
            frames = traceback.extract_stack()[:-3]
            where = next(
                (f"{f.filename}:{f.lineno} in {f.name}" for f in reversed(frames) if in_plugin(f.filename)),
                frames[-1].filename if frames else "?",
            )
        finally:
            self.active = True
        self.paths.append((path, where))

    def take(self) -> list[tuple[str, str]]:
        out, self.paths = self.paths, []
        return out


def inside(path: str, roots: list[Path]) -> bool:
    real = os.path.realpath(path)
    return any(real == str(r) or real.startswith(str(r) + os.sep) for r in roots)
