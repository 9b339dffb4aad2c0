"""D4: the random generators of the user's own that a rank's data pipeline holds, and whether each was built in the
rank or before it (inherited).

The ranks of the dist launch are forked from the pytest process (or unpickled from it under ``spawn``): an object
the user built there — a Trainer's train dataset, a module-level dataset or generator — reaches every rank in one
and the same state, whereas each process of a real ``torchrun`` launch builds its own. A generator seeded from the
OS when it is built (``np.random.default_rng()``, albumentations' ``A.Compose`` without ``seed``) then draws the same
stream on every forked rank, and a different one on every real rank; one seeded with a constant draws the same on
both. The launch cannot tell those two apart for an inherited generator; for a generator built in the rank (after
the fork) it can: an identical stream there is the script's own seeding.

- :func:`alive` is called first thing in a rank, before any of the user's code runs: what is alive then was built
  before the rank (tracked objects and what they refer to; a ``torch.Generator`` is not tracked by the garbage
  collector, but the dict or cell that holds it is).
- :func:`reachable` walks the pipeline's objects (dataset, collate function, ``worker_init_fn``) — attributes,
  containers, ``functools.partial``, closures, the module globals their functions name, the functions of their
  classes (the user's own code: not installed libraries' module globals) — to the generators of the user's own (``torch.Generator``, NumPy ``Generator`` / ``RandomState``,
  ``random.Random``; not the global ones, which D4 follows apart, nor a ``random.SystemRandom``, which has no
  state).
- :func:`reseeded` puts a rank-specific seed into some of them for one probe and puts their states back."""

from __future__ import annotations

import contextlib
import functools
import gc
import os
import random
import sys
import types
from typing import Any

#: at most this many objects are visited from the pipeline's roots, and this deep
LIMIT, DEPTH = 20_000, 10
#: the first generators of a group (breadth first: the nearest the dataset) are also probed one at a time, to name
#: which of them the draws come from
ONE_BY_ONE = 3
#: modules whose objects are not walked into (the libraries' own internals; the user's objects built from their
#: classes are walked all the same)
LIBRARIES = ("torch", "numpy", "builtins", "typing", "collections", "abc", "functools", "re", "enum", "pathlib")


class Alive:
    """The objects alive when the rank began (kept referenced, so that no later object reuses an address)."""

    def __init__(self) -> None:
        # the plugin froze the pytest process's objects (gc.freeze: out of gc.get_objects' sight); in the rank,
        # before any of the user's code, every object is the pytest process's: frozen again afterwards
        frozen = gc.get_freeze_count()
        if frozen:
            gc.unfreeze()
        objs = gc.get_objects()
        if frozen:
            gc.freeze()
        self._refs = (objs, gc.get_referents(*objs))
        self._ids: set[int] | None = None

    def __contains__(self, obj: Any) -> bool:
        if self._ids is None:
            self._ids = {id(o) for part in self._refs for o in part}
        return id(obj) in self._ids


def alive() -> Alive:
    return Alive()


def _kinds() -> tuple[type, ...]:
    import numpy as np
    import torch

    return (torch.Generator, np.random.Generator, np.random.RandomState, random.Random)


def _globals() -> set[int]:
    """The global generators (followed apart by D4): Python's, NumPy's, torch's."""
    import numpy as np
    import torch

    found = {id(random._inst), id(torch.default_generator)}  # type: ignore[attr-defined]
    with contextlib.suppress(AttributeError):
        found.add(id(np.random.mtrand._rand))
    return found


def _library(obj: Any) -> bool:
    mod = getattr(type(obj), "__module__", "") or ""
    return mod.split(".")[0] in LIBRARIES


@functools.cache
def _installed(module: str) -> bool:
    """Whether ``module`` is installed code (the standard library, site-packages) rather than the user's own: the
    module globals of installed code (``datasets.fingerprint``'s generator) are not the user's generators, the
    attributes of the objects it builds (an ``A.Compose``'s) are."""
    import sysconfig

    mod = sys.modules.get(module)
    path = getattr(mod, "__file__", None)
    if module.split(".")[0] in LIBRARIES or not path:
        return True
    roots = {sysconfig.get_paths()[k] for k in ("purelib", "platlib", "stdlib", "platstdlib")}
    return any(os.path.realpath(path).startswith(os.path.realpath(r) + os.sep) for r in roots)


def reachable(roots: list[tuple[str, Any]]) -> list[tuple[str, Any]]:
    """(path, generator) of every generator of the user's own reachable from ``roots``, breadth first."""
    kinds = _kinds()
    skip = _globals()
    seen: set[int] = set()
    found: list[tuple[str, Any]] = []
    queue: list[tuple[str, Any, int]] = [(name, obj, 0) for name, obj in roots if obj is not None]
    while queue and len(seen) < LIMIT:
        path, obj, depth = queue.pop(0)
        if id(obj) in seen:
            continue
        seen.add(id(obj))
        if isinstance(obj, kinds):
            # SystemRandom draws from the OS on every call: no state that ranks could share
            if id(obj) not in skip and not isinstance(obj, random.SystemRandom):
                found.append((path, obj))
            continue
        if depth >= DEPTH or isinstance(obj, (str, bytes, int, float, bool, complex, type(None), types.ModuleType)):
            continue
        try:
            children = _children(path, obj)
        except Exception:  # noqa: BLE001 - an object that cannot be walked into (a proxy): its generators are not found
            continue
        queue.extend((p, o, depth + 1) for p, o in children)
    return found


def _children(path: str, obj: Any) -> list[tuple[str, Any]]:
    if isinstance(obj, dict):
        return [(f"{path}[{k!r}]", v) for k, v in list(obj.items())[:200]]
    if isinstance(obj, (list, tuple, set, frozenset)):
        return [(f"{path}[{i}]", v) for i, v in enumerate(list(obj)[:200])]
    if isinstance(obj, functools.partial):
        return [(f"{path}.func", obj.func), *((f"{path}.args[{i}]", a) for i, a in enumerate(obj.args))] + [
            (f"{path}.keywords[{k!r}]", v) for k, v in obj.keywords.items()
        ]
    if isinstance(obj, types.MethodType):
        return [(path, obj.__self__), (path, obj.__func__)]
    if isinstance(obj, types.FunctionType):
        if _installed(obj.__module__ or ""):
            return []
        out = [
            (f"{path} (closure {name})", cell.cell_contents)
            for name, cell in zip(obj.__code__.co_freevars, obj.__closure__ or ())
            if _filled(cell)
        ]
        names = set(obj.__code__.co_names)
        for const in obj.__code__.co_consts:  # the names its inner functions and comprehensions read
            if isinstance(const, types.CodeType):
                names |= set(const.co_names)
        out += [
            (f"{obj.__module__}.{name}", obj.__globals__[name])
            for name in sorted(names)
            if name in obj.__globals__ and not isinstance(obj.__globals__[name], types.ModuleType)
        ]
        return out
    if isinstance(obj, type):
        if _installed(obj.__module__ or ""):
            return []
        return [
            (f"{obj.__qualname__}.{name}", value)
            for name, value in vars(obj).items()
            if isinstance(value, (types.FunctionType, staticmethod, classmethod, property))
        ]
    if isinstance(obj, (staticmethod, classmethod)):
        return [(path, obj.__func__)]
    if isinstance(obj, property):
        return [(path, f) for f in (obj.fget, obj.fset) if f is not None]
    if _library(obj) and not hasattr(obj, "__dict__"):
        return []
    out = [(f"{path}.{k}", v) for k, v in list(getattr(obj, "__dict__", {}).items())[:200]]
    for name in getattr(type(obj), "__slots__", ()) or ():
        if isinstance(name, str) and hasattr(obj, name):
            out.append((f"{path}.{name}", getattr(obj, name)))
    if not _installed(type(obj).__module__ or ""):
        out.append((path, type(obj)))  # the module globals its methods draw from
    return out


def _filled(cell: Any) -> bool:
    try:
        cell.cell_contents  # noqa: B018
    except ValueError:
        return False
    return True


def kind(gen: Any) -> str:
    return f"{type(gen).__module__.split('.')[0]}.{type(gen).__qualname__}".replace("numpy.", "numpy.random.", 1)


def seed_note(gen: Any) -> str:
    """What the generator's state tells of its seed, where it keeps it (torch's initial seed, NumPy's
    SeedSequence entropy); empty when it does not (RandomState, random.Random)."""
    import torch

    if isinstance(gen, torch.Generator):
        seed = gen.initial_seed()
        if seed == 67280421310721:
            return "never seeded (torch's default seed)"
        return f"initial seed {seed}"
    entropy = getattr(getattr(getattr(gen, "bit_generator", None), "seed_seq", None), "entropy", None)
    if isinstance(entropy, int):
        if entropy.bit_length() > 64:
            return f"SeedSequence entropy of {entropy.bit_length()} bits, as default_rng() draws from the OS"
        return f"seeded with {entropy}"
    return ""


def describe(path: str, gen: Any, inherited: bool) -> dict[str, Any]:
    return {"path": path, "type": kind(gen), "inherited": inherited, "seed": seed_note(gen)}


def _state(gen: Any) -> Any:
    import numpy as np
    import torch

    if isinstance(gen, torch.Generator):
        return gen.get_state()
    if isinstance(gen, np.random.Generator):
        return gen.bit_generator.state
    if isinstance(gen, np.random.RandomState):
        return gen.get_state()
    return gen.getstate()


def _put(gen: Any, state: Any) -> None:
    import numpy as np
    import torch

    if isinstance(gen, torch.Generator):
        gen.set_state(state)
    elif isinstance(gen, np.random.Generator):
        gen.bit_generator.state = state
    elif isinstance(gen, np.random.RandomState):
        gen.set_state(state)
    else:
        gen.setstate(state)


def _seed(gen: Any, seed: int) -> None:
    import numpy as np
    import torch

    if isinstance(gen, torch.Generator):
        gen.manual_seed(seed)
    elif isinstance(gen, np.random.Generator):
        gen.bit_generator.state = type(gen.bit_generator)(seed).state
    elif isinstance(gen, np.random.RandomState):
        gen.seed(seed)
    else:
        gen.seed(seed)


@contextlib.contextmanager
def reseeded(gens: list[Any], rank: int):
    """``gens`` seeded with seeds of this rank's own for the block, their states put back afterwards."""
    states = [(g, _state(g)) for g in gens]
    try:
        for i, g in enumerate(gens):
            _seed(g, 104_729 * (rank + 1) + i)
        yield
    finally:
        for g, s in states:
            _put(g, s)
