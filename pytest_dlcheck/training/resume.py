"""Resume runs and what a checkpoint holds: the uninterrupted baseline and the resumed run every kind
of user produces, the state dicts found in saved files, and a save interrupted half way (C2)."""

from __future__ import annotations

import ast
import contextlib
import warnings
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from ..errors import RoleError
from .runs import SEED, Trajectory, ema_difference, first_difference, plain_state, rng_state, seed_all, set_rng_state

#: a restore piece of the diagnostic resumes (C3): the global RNGs set to another state than the uninterrupted
#: run's, where "rng" puts that state back, so that a run whose resumed steps draw no random numbers is told
#: apart from one whose load restores them
OTHER_RNG = "rng elsewhere"


def same_rng(a: dict[str, Any], b: dict[str, Any]) -> bool:
    """Whether two :func:`~.runs.rng_state` snapshots are the same states."""
    if a.keys() != b.keys() or a["python"] != b["python"] or not torch.equal(a["torch"], b["torch"]):
        return False
    if "numpy" in a:
        (kind_a, keys_a, *rest_a), (kind_b, keys_b, *rest_b) = a["numpy"], b["numpy"]
        if kind_a != kind_b or rest_a != rest_b or not (keys_a == keys_b).all():
            return False
    return all(torch.equal(x, y) for x, y in zip(a.get("cuda", []), b.get("cuda", [])))


#: a restore piece beside "rng": the global RNG states only, not the training's own generators
#: (:func:`own_generators`), so that C3 tells which of them a resume loses
GLOBAL_ONLY = "rng global only"
#: a restore piece beside "rng": the training's own generators only, not the global RNG states
OWN_ONLY = "rng own generators only"


def put_back_rng(
    truth: dict[str, Any], restore: frozenset[str], generators: Mapping[str, torch.Generator] | None = None
) -> None:
    """Where a resume's RNG states are put back (after the user's or the framework's own load): the
    uninterrupted run's states at the save ("rng": the global RNGs and the training's own generators found at
    the same places, ``generators``, unless :data:`GLOBAL_ONLY` / :data:`OWN_ONLY` leaves one of them out), or
    others (:data:`OTHER_RNG`)."""
    if "rng" in restore and "rng" in truth:
        if OWN_ONLY not in restore:
            set_rng_state(truth["rng"])
        if GLOBAL_ONLY not in restore:
            saved = truth.get("generators") or {}
            for where, gen in (generators or {}).items():
                if where in saved:
                    gen.set_state(saved[where])
    elif OTHER_RNG in restore:
        seed_all(SEED + 2)


def _global_generators() -> set[int]:
    """The ids of torch's global generators (the CPU default, CUDA's defaults once initialised): the global RNG
    states, not generators of the training's own."""
    ids = {id(torch.default_generator)}
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        ids |= {id(g) for g in torch.cuda.default_generators}
    return ids


def own_generators(state: Any, step: Any = None, limit: int = 4000) -> dict[str, torch.Generator]:
    """The ``torch.Generator`` objects of the training's own (not torch's global ones), by where they were found:
    in what the user's factory returned (``state['generator']``, ``state['dataloader'].sampler.generator``, a
    module's attribute), or in the user's step (its closure variables, default arguments, attributes, the object
    a bound method belongs to). Where a generator is found is the same in every state the factory builds, so the
    states of the uninterrupted run's generators can be put back on a resumed run's. The walk is bounded: a few
    levels deep, ``limit`` objects at most."""
    found: dict[str, torch.Generator] = {}
    skip = _global_generators()
    seen: set[int] = set()
    budget = [limit]
    plain = (str, bytes, int, float, bool, complex, type(None), torch.Tensor, type)

    def add(obj: torch.Generator, where: str) -> None:
        if id(obj) not in skip and all(g is not obj for g in found.values()):
            found[where] = obj

    def walk(obj: Any, where: str, depth: int) -> None:
        if isinstance(obj, torch.Generator):
            add(obj, where)
            return
        if depth > 5 or budget[0] <= 0 or isinstance(obj, plain) or id(obj) in seen:
            return
        import types

        if isinstance(obj, (types.ModuleType, types.FunctionType, types.BuiltinFunctionType)):
            return
        seen.add(id(obj))
        budget[0] -= 1
        if isinstance(obj, torch.nn.Module):  # its submodules' attributes (a dropout of its own with a generator)
            for name, mod in list(obj.named_modules())[:2000]:
                for attr, value in vars(mod).items():
                    if isinstance(value, torch.Generator):
                        add(value, f"{where}{'.' + name if name else ''}.{attr}")
            return
        if isinstance(obj, Mapping):
            items = [(f"{where}[{k!r}]", v) for k, v in list(obj.items())[:200]]
        elif isinstance(obj, (list, tuple)):
            items = [(f"{where}[{i}]", v) for i, v in enumerate(list(obj)[:200])]
        else:
            attrs = getattr(obj, "__dict__", None)
            if not isinstance(attrs, dict):
                return
            items = [(f"{where}.{k}", v) for k, v in list(attrs.items())[:200]]
        for at, value in items:
            walk(value, at, depth + 1)

    walk(state, "state", 0)
    if step is not None:
        _step_generators(step, walk)
    return found


def _step_generators(step: Any, walk: Callable[[Any, str, int], None]) -> None:
    """Walk what the user's step function holds: closure variables, defaults, attributes, its ``self``."""
    fn = getattr(step, "__func__", step)
    owner = getattr(step, "__self__", None)
    if owner is not None:
        walk(owner, "your step's self", 1)
    code = getattr(fn, "__code__", None)
    for name, cell in zip(getattr(code, "co_freevars", ()), getattr(fn, "__closure__", None) or (), strict=False):
        try:
            value = cell.cell_contents
        except ValueError:  # an empty cell
            continue
        walk(value, f"your step's closure variable {name!r}", 1)
    for i, value in enumerate(getattr(fn, "__defaults__", None) or ()):
        walk(value, f"your step's default argument {i}", 1)
    for name, value in (getattr(fn, "__kwdefaults__", None) or {}).items():
        walk(value, f"your step's default argument {name!r}", 1)
    attrs = getattr(step, "__dict__", None)
    if isinstance(attrs, dict):
        for name, value in list(attrs.items())[:200]:
            walk(value, f"your step.{name}", 1)


def generator_states(found: Mapping[str, torch.Generator]) -> dict[str, torch.Tensor]:
    """The state of each generator :func:`own_generators` found."""
    return {where: gen.get_state() for where, gen in found.items()}


def same_generators(a: Mapping[str, torch.Tensor], b: Mapping[str, torch.Tensor]) -> dict[str, bool]:
    """Per generator found in both snapshots, whether its states are the same."""
    return {where: bool(torch.equal(a[where], b[where])) for where in a if where in b}


class ResumeLoadFailed(RoleError):
    """The resume's own loading raised on the checkpoint the pipeline's own save wrote, in the pipeline's own
    conditions (fresh objects, the path the save was given): no checkpoint this pipeline writes can be resumed.
    That is C1's finding (C3 skips naming C1), not an error of the check. ``error`` is the exception the load
    raised, ``how`` the load in words, ``checkpoint`` what was loaded, ``saved_at`` the step it was saved
    after."""

    def __init__(self, role: str, message: str, error: BaseException, how: str, checkpoint: Path, saved_at: int):
        refused = refused_global(error)
        if refused is not None:  # torch's refusal without its long preamble (and its terminal colour codes)
            from ..session import where_raised

            where = where_raised(error)  # the user's frame; a library's (torch.load inside Lightning) is no help
            message = (
                f"raised {type(error).__name__}: Weights only load failed: Unsupported global: GLOBAL {refused} was "
                f"not an allowed global by default{'' if 'site-packages' in where else where}"
            )
        super().__init__(role, message)
        self.error = error
        self.how = how
        self.checkpoint = Path(checkpoint)
        self.saved_at = saved_at


#: the frames of a framework's resume that load a checkpoint: (a path ending, function names or None for any)
_LOADING_FRAMES = (
    ("torch/serialization.py", None),
    ("safetensors/torch.py", None),
    ("lightning/pytorch/trainer/connectors/checkpoint_connector.py", None),
    (
        "transformers/trainer.py",
        (
            "_load_from_checkpoint",
            "_load_optimizer_and_scheduler",
            "_load_rng_state",
            "_load_scaler",
            "_load_callback_state",
        ),
    ),
)


def raised_loading(exc: BaseException) -> bool:
    """Whether ``exc`` was raised while a framework's resume (Lightning's ``fit(ckpt_path=...)``, the Trainer's
    ``train(resume_from_checkpoint=...)``) loaded the checkpoint, not later in the resumed training."""
    import traceback

    from ..session import in_plugin

    frames = traceback.extract_tb(exc.__traceback__)
    if frames and in_plugin(frames[-1].filename):  # raised by dlcheck's own code: a bug of the plugin
        return False
    for frame in frames:
        name = frame.filename.replace("\\", "/")
        for ending, functions in _LOADING_FRAMES:
            if name.endswith(ending) and (functions is None or frame.name in functions):
                return True
    return False


def refused_global(exc: BaseException) -> str | None:
    """The global ``torch.load(weights_only=True)`` refused (``argparse.Namespace``), from its
    UnpicklingError (or one it was raised from), or None."""
    import re

    seen = 0
    while exc is not None and seen < 5:
        if type(exc).__name__ == "UnpicklingError":
            found = re.search(r"Unsupported global: GLOBAL ([\w.]+)", str(exc)) or re.search(
                r"GLOBAL ([\w.]+) was not an allowed global", str(exc)
            )
            if found:
                return found.group(1).rstrip(".")
        exc = exc.__cause__ or exc.__context__
        seen += 1
    return None


def holders_of(checkpoint: Path, qualname: str, limit: int = 4) -> list[str]:
    """Where the checkpoint file(s) at ``checkpoint`` hold an object of the class ``qualname`` (``module.Name``):
    ``checkpoint.pth['args']``. Loaded with weights_only=False: the file is the one the pipeline's own save
    wrote a moment ago, in dlcheck's temporary folder."""
    path = Path(checkpoint)
    files = [path] if path.is_file() else sorted(p for p in path.rglob("*") if p.suffix in CHECKPOINT_SUFFIXES)
    found: list[str] = []

    def walk(obj: Any, where: str, depth: int) -> None:
        if len(found) >= limit or depth > 5:
            return
        kind = type(obj)
        if f"{kind.__module__}.{kind.__qualname__}" == qualname:
            found.append(where)
            return
        if isinstance(obj, Mapping):
            for key, value in list(obj.items())[:200]:
                walk(value, f"{where}[{key!r}]", depth + 1)
        elif isinstance(obj, (list, tuple)):
            for i, value in enumerate(list(obj)[:200]):
                walk(value, f"{where}[{i}]", depth + 1)

    for f in files:
        if not f.is_file() or f.suffix == ".safetensors":
            continue
        try:
            obj = torch.load(f, map_location="cpu", weights_only=False)
        except Exception:  # noqa: BLE001 - unreadable even so: no place to show, the exception stands
            continue
        walk(obj, f.name, 0)
    return found


def scaler_ends(state: Any) -> dict[str, dict[str, Any]]:
    """Each enabled ``torch.amp.GradScaler`` of a training state (an entry, or an Accelerator's ``scaler``), by
    where it is, with its loss scale and growth tracker: C1 compares them at the ends of the uninterrupted and
    the resumed run (a scale that did not move leaves the losses and weights alike, while a resumed scaler that
    starts over counts its growth interval from zero and doubles its scale later than the uninterrupted run's)."""
    out: dict[str, dict[str, Any]] = {}
    if not isinstance(state, Mapping):
        return out
    seen: list[Any] = []
    for key, value in state.items():
        for obj, where in ((value, f"state[{key!r}]"), (getattr(value, "scaler", None), f"state[{key!r}].scaler")):
            if isinstance(obj, torch.amp.GradScaler) and all(o is not obj for o in seen):
                seen.append(obj)
                if obj.is_enabled():
                    saved = obj.state_dict()
                    out[where] = {"scale": float(saved.get("scale", 0.0)), "growth": saved.get("_growth_tracker")}
    return out


#: the pieces of a plain or Accelerate loop's training dict whose state right after the user's load is read against
#: the saved state (:func:`after_load`): what the load restored, not only what putting a piece back repairs
LOADED_PIECES = ("optimizer", "lr_scheduler")


@dataclass
class AfterLoad:
    """A piece of the training state right after the user's load, against its state at the save and before the
    load (a fresh object's)."""

    key: str
    kind: str  # the object's class name
    restored: bool  # the whole state equals the saved one
    untouched: bool  # the state equals the fresh object's before the load
    difference: str | None  # the first difference with the saved state
    #: an optimizer whose saved per-parameter state (moments, step counts) is not empty: whether it equals the
    #: saved one after the load (None: not an optimizer, or nothing per parameter was saved)
    moments: bool | None = None
    tensors: int = 0  # the tensors of that per-parameter state
    #: an optimizer: the param_groups' hyperparameters that differ, ``lr 0.000334 after the load vs 1e-06 at the save``
    groups: list[str] = field(default_factory=list)


def piece_states(state: Mapping[str, Any], keys: tuple[str, ...] = LOADED_PIECES) -> dict[str, Any]:
    """The plain states (:func:`~.runs.plain_state`) of the pieces ``keys`` of a training dict that have one."""
    out = {}
    for key in keys:
        obj = state.get(key) if isinstance(state, Mapping) else None
        if obj is None or not callable(getattr(obj, "state_dict", None)):
            continue
        try:
            out[key] = plain_state(obj.state_dict())
        except Exception:  # noqa: BLE001 - a state that cannot be read is not compared
            continue
    return out


def saved_pieces(truth: Mapping[str, Any], keys: tuple[str, ...] = LOADED_PIECES) -> dict[str, Any]:
    """The pieces ``keys`` of the state at the save (an uninterrupted run's truth, written to disk), each file read
    once, memory-mapped: the other pieces in it (the model's weights) are not read into memory."""
    files: dict[Any, Any] = {}
    out = {}
    for key in keys:
        handle = truth.get(key)
        if handle is None or not hasattr(handle, "file"):
            continue
        if handle.file not in files:
            try:
                files[handle.file] = torch.load(handle.file, mmap=True, weights_only=False)
            except Exception:  # noqa: BLE001 - not memory-mappable: read it whole
                files[handle.file] = torch.load(handle.file, weights_only=False)
        out[key] = plain_state(files[handle.file][handle.key])
    return out


def _value(v: Any) -> str:
    return f"{v:.6g}" if isinstance(v, float) else repr(v)[:40]


def after_load(
    before: Mapping[str, Any], now: Mapping[str, Any], saved: Mapping[str, Any], kinds: Mapping[str, str]
) -> dict[str, AfterLoad]:
    """Each piece with a saved state, right after the load (``now``), against the save (``saved``) and the fresh
    object before the load (``before``); an optimizer's per-parameter state and its param_groups' hyperparameters
    apart (a scheduler stepped after the load moves the learning rate in param_groups, not the moments)."""
    out = {}
    for key, at_save in saved.items():
        if key not in now:
            continue
        loaded = now[key]
        diff = first_difference(at_save, loaded)
        piece = AfterLoad(
            key,
            kinds.get(key, ""),
            restored=diff is None,
            untouched=key in before and first_difference(before[key], loaded) is None,
            difference=diff,
        )
        is_optimizer = isinstance(at_save, Mapping) and {"state", "param_groups"} <= set(at_save)
        if is_optimizer and isinstance(loaded, Mapping) and {"state", "param_groups"} <= set(loaded):
            per_param = at_save["state"]
            if per_param:
                piece.moments = first_difference(per_param, loaded["state"]) is None
                piece.tensors = sum(
                    1 for s in per_param.values() if isinstance(s, Mapping) for v in s.values() if torch.is_tensor(v)
                )
            groups_saved, groups_now = at_save["param_groups"], loaded["param_groups"]
            if len(groups_saved) == len(groups_now):
                many = len(groups_saved) > 1
                for i, (g0, g1) in enumerate(zip(groups_saved, groups_now, strict=True)):
                    for name, value in g0.items():
                        if name == "params" or first_difference(value, g1.get(name)) is None:
                            continue
                        where = f"param_groups[{i}]['{name}']" if many else f"'{name}'"
                        piece.groups.append(
                            f"{where} {_value(g1.get(name))} after the load vs {_value(value)} at the save"
                        )
        out[key] = piece
    return out


@dataclass
class Baseline:
    trajectory: Trajectory
    truth: dict[str, Any]
    checkpoint: Path
    #: piece -> where the checkpoint keeps it ("" when it does not)
    pieces: dict[str, str]


@dataclass
class ResumeRun:
    uninterrupted: Trajectory
    resumed: Trajectory
    saved_at: int
    checkpoint: Path
    pieces: dict[str, str]
    #: what the resume's own loading reported (:func:`load_reports`): key mismatches, PEFT's missing adapter keys
    loads: list[str] = field(default_factory=list)

    def mismatch(self) -> tuple[int, str] | None:
        """The first step after the save where the resumed run differs from the uninterrupted one."""
        base = {s.step: s for s in self.uninterrupted.steps}
        based = dict(self.uninterrupted.digests)
        for rec in self.resumed.steps:
            ref = base.get(rec.step)
            if ref is None or rec.step <= self.saved_at:
                continue
            if rec.loss is not None and ref.loss is not None and rec.loss != ref.loss:
                return rec.step, f"loss {rec.loss:.6g} resumed vs {ref.loss:.6g} uninterrupted"
            if rec.lr is not None and ref.lr is not None and rec.lr != ref.lr:
                return rec.step, f"learning rate {rec.lr:.6g} resumed vs {ref.lr:.6g} uninterrupted"
        for step, value in self.resumed.digests:
            if step > self.saved_at and step in based and value != based[step]:
                return step, f"weights differ after the step (digest {value:.9g} resumed vs {based[step]:.9g})"
        if not any(s.step > self.saved_at for s in self.resumed.steps) and not any(
            st > self.saved_at for st, _ in self.resumed.digests
        ):
            return self.saved_at + 1, "the resumed run trained no step"
        lost = self.ema_mismatch() or self.scaler_mismatch()
        if lost:
            last = max([s.step for s in self.resumed.steps] + [st for st, _ in self.resumed.digests])
            return last, lost[0]["text"]
        return None

    def scaler_mismatch(self) -> list[dict[str, Any]]:
        """Each GradScaler (:func:`scaler_ends`) whose loss scale or growth tracker differs between the ends of the
        two runs, with a line of text."""
        base = self.uninterrupted.notes.get("scalers") or {}
        out = []
        for where, end in (self.resumed.notes.get("scalers") or {}).items():
            ref = base.get(where)
            if ref is None or ref == end:
                continue
            text = (
                f"the GradScaler {where} differs from the uninterrupted run's at the end: scale {end['scale']:g}, "
                f"growth tracker {end['growth']} resumed vs scale {ref['scale']:g}, growth tracker {ref['growth']} "
                "uninterrupted"
            )
            out.append({"name": where, "text": text})
        return out

    def ema_mismatch(self) -> list[dict[str, Any]]:
        """Each EMA of the state (a plain loop's) whose tensors or counter differ between the ends of the
        two runs: its name, what it is, the first differing tensor and the counters, and a line of text."""
        base = self.uninterrupted.notes.get("ema") or {}
        out = []
        for name, end in (self.resumed.notes.get("ema") or {}).items():
            ref = base.get(name)
            if ref is None:
                continue
            diff = ema_difference(end["tensors"], ref["tensors"])
            counters = end["counter"], ref["counter"]
            if diff is None and counters[0] == counters[1]:
                continue
            text = f"the EMA {end['what']} differs from the uninterrupted run's at the end"
            if diff is not None:
                first, first_max, largest, n, total = diff
                text += (
                    f": {n} of {total} tensors, first {first!r} (max abs diff {first_max:.4g}; largest {largest:.4g})"
                )
            if counters[0] is not None and counters[1] is not None:
                text += f"; {counters[0][0]} {counters[0][1]} resumed vs {counters[1][1]} uninterrupted"
            out.append({"name": name, "what": end["what"], "diff": diff, "counters": counters, "text": text})
        return out

    def emas(self) -> list[str]:
        """What the EMAs compared at the end of both runs are (``state['ema'] (AveragedModel …)``)."""
        base = self.uninterrupted.notes.get("ema") or {}
        return [end["what"] for name, end in (self.resumed.notes.get("ema") or {}).items() if name in base]


# --------------------------------------------------------------------------------------------------
# the data position: which examples the resumed epoch trains


@dataclass
class ExampleCount:
    """The examples of a run that resumes after step ``saved_at`` against the uninterrupted run's, counted
    as multisets of content digests over the compared steps."""

    before: int  # examples trained up to the save (the same in both runs)
    expected: int  # examples the uninterrupted run trains after the save
    trained: int  # examples the resumed run trains after the save
    repeated: int  # examples the resumed run trains more often than the uninterrupted run (trained twice)
    never: int  # examples the uninterrupted run trains that the resumed run never trains
    other: int  # resumed examples the uninterrupted run does not train in these steps (not recognised)
    same: bool  # the resumed steps train the uninterrupted run's batches, step by step

    @property
    def conclusive(self) -> bool:
        """Examples trained twice are recognised by content whatever else differs; examples never seen count
        only when every resumed example is recognised (nothing drawn from outside the compared steps)."""
        return not self.same and (self.repeated > 0 or (self.never > 0 and self.other == 0))


def count_examples(before: list[list[str]], expected: list[list[str]], resumed: list[list[str]]) -> ExampleCount:
    """Count, per content digest, the examples trained up to the save (``before``, per step) and after it by
    the uninterrupted run (``expected``) and by the resumed run (``resumed``)."""
    from collections import Counter

    flat = lambda steps: [d for step in steps for d in step]  # noqa: E731
    pre, post, again = flat(before), flat(expected), flat(resumed)
    uninterrupted, resumed_all = Counter(pre + post), Counter(pre + again)
    return ExampleCount(
        before=len(pre),
        expected=len(post),
        trained=len(again),
        repeated=sum(max(0, n - uninterrupted[d]) for d, n in resumed_all.items() if d in uninterrupted),
        never=sum(max(0, n - resumed_all[d]) for d, n in uninterrupted.items()),
        other=sum(n for d, n in resumed_all.items() if d not in uninterrupted),
        same=len(expected) == len(resumed) and all(a == b for a, b in zip(expected, resumed, strict=True)),
    )


#: the seeds of the data-position runs: per draw position, and per example index
DRAW_SEED, EXAMPLE_SEED = SEED + 7919, SEED + 104729

#: the longest epoch (in batches) whose rest the data-position runs draw without training, past the steps they
#: train: every example of the epoch is then known by content, so that a resumed epoch drawn anew (a restart on
#: a reshuffled epoch) is counted however few of its examples the trained steps hold
EPOCH_DRAWS = 256


def epoch_reach(epoch: int | None, total: int) -> int:
    """How many batches of the epoch the data-position runs draw: the whole epoch when it is longer than the
    ``total`` steps trained and at most :data:`EPOCH_DRAWS` batches, else ``total``."""
    return epoch if epoch is not None and total < epoch <= EPOCH_DRAWS else total


@contextlib.contextmanager
def seeded_examples(loader: Any, keep_stream: bool = False) -> Iterator[None]:
    """While active, each example of the loader's map-style dataset is read with the global RNGs seeded by its
    index, so that a random augmentation gives an example the same content in every draw: in this process, or in
    the loader's worker processes when they are forked from it (they inherit the dataset as it is, its reading
    included: the crops of accelerate's cv_example, drawn in 4 workers); spawned workers (which import the dataset
    anew) are left as they are. The dataset's class is put back afterwards. ``keep_stream``: the global RNG states
    are put back after each read, so that what the rest of the loading draws (a sampler, a collator) draws from
    the stream it would draw from without the example reads."""
    from torch.utils.data import IterableDataset

    ds = getattr(loader, "dataset", None)
    cls = type(ds)
    if ds is None or isinstance(ds, IterableDataset) or (getattr(loader, "num_workers", 0) and not _forked(loader)):
        yield
        return

    def index_seed(index: Any) -> int:
        if isinstance(index, int):
            return index
        import zlib

        return zlib.crc32(repr(index).encode())

    def getitem(self: Any, index: Any) -> Any:
        if keep_stream:
            saved = rng_state()
            try:
                seed_all(EXAMPLE_SEED + index_seed(index))
                return cls.__getitem__(self, index)
            finally:
                set_rng_state(saved)
        seed_all(EXAMPLE_SEED + index_seed(index))
        return cls.__getitem__(self, index)

    attrs: dict[str, Any] = {"__getitem__": getitem, "__module__": cls.__module__}
    if hasattr(cls, "__getitems__"):
        attrs["__getitems__"] = lambda self, indices: [getitem(self, i) for i in indices]
    try:
        ds.__class__ = type(cls.__name__, (cls,), attrs)
    except TypeError:  # a class whose instances cannot change class (slots, an extension type)
        yield
        return
    try:
        yield
    finally:
        ds.__class__ = cls


def _forked(loader: Any) -> bool:
    """Whether the loader's workers are forked from this process (its multiprocessing context, else the default)."""
    import multiprocessing

    ctx = getattr(loader, "multiprocessing_context", None)
    if ctx is None:  # Accelerate's DataLoaderShard keeps the user's loader's settings on itself or its base loader
        ctx = getattr(getattr(loader, "base_dataloader", None), "multiprocessing_context", None)
    method = ctx.get_start_method() if ctx is not None and hasattr(ctx, "get_start_method") else ctx
    if method is None:
        method = multiprocessing.get_start_method(allow_none=True) or multiprocessing.get_all_start_methods()[0]
    return method == "fork"


@dataclass
class DataResume:
    """C1's and C10's data-position run of a plain loop or an Accelerate loop whose training dict holds its
    dataloader: the uninterrupted run trains ``steps`` micro-steps drawn from ``state[key]``, saved after
    ``saved_at``; fresh objects loaded by the user's load draw the rest from their own ``state[key]``. C1's for a
    Lightning user: the batches ``fit`` trains from the datamodule's ``train_dataloader()`` in an epoch saved
    mid-epoch after batch ``saved_at``, and those ``fit(ckpt_path=...)`` trains after it (``key`` names the hook)."""

    key: str
    loader: str  # the class of the loader the fresh objects hold
    resumed_loader: str  # the class of what ``state[key]`` is after the user's load
    steps: int
    saved_at: int
    epoch: int | None  # batches in an epoch of the loader, when it has a length
    before: list[list[str]]
    expected: list[list[str]]
    resumed: list[list[str]]
    #: why the examples could not be read (a batch without a batch dimension), or None
    unreadable: str | None = None
    #: the user's load raised on the checkpoint (C1's main resume reports it): its message
    load_error: str | None = None
    #: why the resumed data path is not judged (dlcheck's own default load, or a load that leaves the loader
    #: untouched with no ``dlcheck_resume_dataloader``): the resumed run was not drawn
    not_seen: str | None = None
    #: with ``dlcheck_resume_dataloader``: the class of what it returned, and the resumed_step it was given
    through_role: str | None = None
    resumed_step: int | None = None
    #: what a kind of user adds (Lightning: whether the loader is resumable, what the checkpoint holds of it)
    notes: dict[str, Any] = field(default_factory=dict)
    #: with ``dlcheck_checkpoint_every``: where the save was made, in words (the end of epoch 1, where your loop
    #: checkpoints); None for a save half way through the run
    cadence: str | None = None
    #: a save at an epoch's end: the resumed run's next epoch drawn whole (its compared steps, then the rest without
    #: training), when it is longer than the compared steps and at most :data:`EPOCH_DRAWS` batches; else empty
    new_epoch: list[list[str]] = field(default_factory=list)

    @property
    def drawn(self) -> int:
        """The batches whose examples both runs drew: the ``steps`` trained, and the rest of the epoch drawn
        without training (:func:`epoch_reach`) when the epoch is longer."""
        return max(self.steps, len(self.before) + len(self.expected))

    @property
    def whole(self) -> bool:
        """Whether the compared batches are the whole epoch."""
        return self.epoch is not None and self.epoch == self.drawn

    def span(self, which: str = "the epoch's") -> str:
        """`` (the whole first epoch)``, `` (4 of the epoch's 12 batches)``; where the epoch is longer than
        :data:`EPOCH_DRAWS`, that its rest is not drawn."""
        n = self.steps
        if self.whole and self.drawn == n:
            return " (the whole first epoch)"
        if self.epoch and self.epoch > n:
            longer = (
                f"; its rest is not drawn, the epoch being longer than {EPOCH_DRAWS} batches"
                if self.drawn == n and self.epoch > EPOCH_DRAWS
                else ""
            )
            return f" ({n} of {which} {self.epoch} batches{longer})"
        return ""

    def rest(self) -> str:
        """``, then steps 5-12 without training them (...)`` when the runs drew the rest of the epoch."""
        if self.drawn <= self.steps:
            return ""
        return (
            f", then steps {self.steps + 1}-{self.drawn} without training them (the rest of the epoch: every example "
            "of it known by content)"
        )

    def count(self) -> ExampleCount:
        return count_examples(self.before, self.expected, self.resumed)

    def parts(self) -> EpochParts:
        """The compared steps split at the end of the epoch the save interrupted (:class:`EpochParts`)."""
        k, e = self.saved_at, self.epoch
        if not e or e < 1:  # no epoch length: every compared step is of the epoch the save interrupted
            return EpochParts(0, k + len(self.expected), self.before, self.expected, self.resumed, [], [], [], [])
        start = (k // e) * e if k % e else k
        end = start + e if k % e else k
        n = end - k
        uninterrupted = self.before + self.expected
        reference = uninterrupted[end - e : end] if end >= e and len(uninterrupted) >= end else []
        return EpochParts(
            start,
            end,
            self.before[start:k],
            self.expected[:n],
            self.resumed[:n],
            self.expected[n:],
            self.resumed[n:],
            reference,
            self.new_epoch,
        )

    def replayed(self) -> list[tuple[int, int]]:
        """(resumed step, the step before the save whose batch it trains again), for identical batches."""
        first = {tuple(b): i + 1 for i, b in reversed(list(enumerate(self.before)))}
        return [(self.saved_at + 1 + i, first[tuple(b)]) for i, b in enumerate(self.resumed) if tuple(b) in first]


@dataclass
class EpochParts:
    """The steps of a data-position run split at the end of the epoch the save interrupted: an example trained
    twice or never is counted within that epoch only. The steps after its end (all the compared steps when the
    save is at an epoch's end) are a new epoch, which another shuffle may order otherwise than the uninterrupted
    run's: what it must be is a whole epoch (:func:`epoch_examples`), not the uninterrupted run's order. Steps are
    0-based indices into the run."""

    start: int  # the first step of the interrupted epoch (== the save's step when the save is at an epoch's end)
    end: int  # the step that epoch ends after (== the save's step when the save is at an epoch's end)
    before: list[list[str]]  # the interrupted epoch's steps before the save
    expected: list[list[str]]  # the uninterrupted run's steps of that epoch after the save (compared)
    resumed: list[list[str]]  # the resumed run's steps in their place
    expected_new: list[list[str]]  # the uninterrupted run's compared steps past that epoch's end
    resumed_new: list[list[str]]  # the resumed run's steps in their place
    reference: list[list[str]]  # the uninterrupted run's last whole epoch ending at ``end`` (an epoch's examples)
    whole_new: list[list[str]]  # the resumed run's new epoch drawn whole (a save at an epoch's end), or empty


@dataclass
class EpochExamples:
    """The examples of a resumed run's new epoch against an uninterrupted epoch's (``reference``), as multisets
    of content digests: an epoch holds each example once (an uninterrupted epoch's own repeats, a sampler's padding
    to even shards, allowed as many times)."""

    drawn: int  # examples of the new epoch drawn
    distinct: int  # distinct examples among them
    reference: int  # examples of the uninterrupted epoch
    repeated: int  # repeats within the new epoch beyond the uninterrupted epoch's own
    never: int  # examples of the uninterrupted epoch the new epoch never holds (counted when drawn whole)
    other: int  # distinct examples of the new epoch not among the uninterrupted epoch's (not recognised)
    whole: bool  # the new epoch was drawn to its end
    own_repeats: int = 0  # repeats within the uninterrupted epoch (a sampler's padding to even shards)

    @property
    def conclusive(self) -> bool:
        """Repeats within the epoch are seen whatever else differs; examples never reached count only when the
        epoch was drawn whole and every example of it is recognised."""
        return self.repeated > 0 or (self.whole and self.never > 0 and self.other == 0)


def epoch_examples(new: list[list[str]], reference: list[list[str]], whole: bool) -> EpochExamples:
    """Count the examples of a new epoch's steps ``new`` against the uninterrupted epoch's ``reference``."""
    drawn = [d for step in new for d in step]
    ref = [d for step in reference for d in step]
    seen, known = set(drawn), set(ref)
    own_repeats = len(ref) - len(known)
    return EpochExamples(
        drawn=len(drawn),
        distinct=len(seen),
        reference=len(ref),
        repeated=max(0, len(drawn) - len(seen) - own_repeats),
        never=len(known - seen) if whole else 0,
        other=len(seen - known),
        whole=whole,
        own_repeats=own_repeats,
    )


#: the fix for a data position the resume loses, per kind of user
DATA_FIX = {
    "loop": (
        "make the resumed loop continue the epoch where the save left it: save the loader's position and restore "
        "it in dlcheck_load_checkpoint — a torchdata StatefulDataLoader (state['dataloader'].state_dict() in the "
        "checkpoint, load_state_dict on load), or save the step and, on load, skip the epoch's batches already "
        "trained with the same shuffle (a DataLoader generator seeded per epoch, then "
        "itertools.islice(loader, step_in_epoch, None))"
    ),
    "accelerate": (
        "after accelerator.load_state, skip the epoch's batches already trained with the same shuffle: "
        "state['dataloader'] = accelerator.skip_first_batches(state['dataloader'], step_in_epoch), with "
        "Accelerator(dataloader_config=DataLoaderConfiguration(use_seedable_sampler=True)) (or a DataLoader "
        "generator seeded per epoch) so that the resumed epoch is shuffled as the uninterrupted one; or "
        "DataLoaderConfiguration(use_stateful_dataloader=True) (torchdata), whose position save_state / "
        "load_state carry"
    ),
    "trainer": (
        "set ignore_data_skip=False (the default) so that train(resume_from_checkpoint=...) skips the batches of "
        "the epoch already trained on"
    ),
}


def counted(c: Any, steps: int, saved_at: int, whole: bool) -> str:
    """``4 examples trained twice, 4 never seen in the resumed epoch (...)``."""
    where = "in the resumed epoch" if whole else f"in steps {saved_at + 1}-{steps}"
    return (
        f"{c.repeated} examples trained twice, {c.never} never seen {where} ({c.before} examples trained before "
        f"the save; after it the uninterrupted run trains {c.expected}, the resumed run {c.trained}"
        + (f", {c.other} of them not among the uninterrupted run's" if c.other else "")
        + ")"
    )


# --------------------------------------------------------------------------------------------------
# what a resume's own loading reports


def _adapter_key(key: str) -> bool:
    """A key of a PEFT adapter's tensors (LoRA, IA3, ...): a PEFT model's strict=False load misses every base
    weight by design, only missing adapter keys say the adapter did not load."""
    try:
        from peft.utils import PEFT_TYPE_TO_PREFIX_MAPPING

        prefixes = set(PEFT_TYPE_TO_PREFIX_MAPPING.values())
    except ImportError:  # an older peft
        prefixes = {"lora_"}
    return any(p in key for p in prefixes)


def _storage(t: torch.Tensor) -> Any:
    try:
        return t.untyped_storage().data_ptr() or id(t)
    except (RuntimeError, NotImplementedError):  # a tensor without storage (meta, a subclass)
        return id(t)


def keys_mismatch(loads: list[str]) -> bool:
    """Whether what a load reported says the saved weights did not land in the model: keys it did not know, or
    PEFT's missing adapter keys (missing keys alone may be frozen weights a checkpoint leaves out on purpose)."""
    return any(line.startswith("PEFT:") or "unexpected keys" in line for line in loads)


def _some(keys: list[str], n: int = 3) -> str:
    shown = ", ".join(repr(k) for k in keys[:n])
    return shown + (f", … ({len(keys)} in all)" if len(keys) > n else "")


def _load_report(module: Any, state_dict: Any, result: Any) -> str | None:
    """One line of what a ``load_state_dict`` left missing or unexpected, or None when it loaded every key."""
    missing = list(getattr(result, "missing_keys", []) or [])
    unexpected = list(getattr(result, "unexpected_keys", []) or [])
    if missing:  # a tied tensor (lm_head.weight = embed_tokens.weight) is loaded through its twin
        own = module.state_dict(keep_vars=True)
        loaded = {_storage(own[k]) for k in state_dict if k in own and isinstance(own[k], torch.Tensor)}
        missing = [k for k in missing if not (isinstance(own.get(k), torch.Tensor) and _storage(own[k]) in loaded)]
    peft = any(c.__module__.startswith("peft.") for c in type(module).__mro__)
    if peft:  # the base weights are not in an adapter checkpoint, by design
        missing = [k for k in missing if _adapter_key(k)]
    if not missing and not unexpected:
        return None
    parts = []
    if missing:
        parts.append(f"{len(missing)} of the model's {'adapter ' if peft else ''}keys missing ({_some(missing)})")
    if unexpected:
        parts.append(f"{len(unexpected)} unexpected keys in what was loaded ({_some(unexpected)})")
    return f"{type(module).__name__}.load_state_dict(strict=False): " + "; ".join(parts)


@contextlib.contextmanager
def load_reports() -> Iterator[list[str]]:
    """While active, every ``Module.load_state_dict`` that leaves keys missing or unexpected (a strict=False
    load) and PEFT's "missing adapter keys" warning are written down, one line each, in the yielded list: the
    evidence of a resume whose weights do not land in the model."""
    found: list[str] = []
    real = torch.nn.Module.load_state_dict

    def load_state_dict(self: Any, state_dict: Any, *args: Any, **kwargs: Any) -> Any:
        result = real(self, state_dict, *args, **kwargs)
        try:
            line = _load_report(self, state_dict, result)
        except Exception:  # noqa: BLE001 - reading the report is ours: it never fails the user's load
            line = None
        if line:
            found.append(line)
        return result

    torch.nn.Module.load_state_dict = load_state_dict  # type: ignore[method-assign]
    try:
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            yield found
    finally:
        torch.nn.Module.load_state_dict = real  # type: ignore[method-assign]
        for w in caught:
            text = str(w.message)
            if "missing adapter keys" in text:
                head, _, rest = text.partition(":")
                try:
                    keys = [str(k) for k in ast.literal_eval(rest.strip())]
                except (ValueError, SyntaxError):
                    keys = [" ".join(rest.split())[:200]]
                found.append(f"PEFT: {head.strip()}: {_some(keys)}")


# --------------------------------------------------------------------------------------------------
# what a checkpoint holds


CHECKPOINT_SUFFIXES = (".pt", ".pth", ".bin", ".ckpt", ".safetensors", ".tar")


def read_saved(path: Path) -> list[tuple[str, Any]]:
    """(where, mapping of str -> tensor) for every state dict found in the file(s) at ``path``: a file, or
    the checkpoint files of a directory; nested dicts are searched a few levels deep."""
    path = Path(path)
    if path.is_file():
        files = [path]
    elif path.is_dir():
        files = sorted(p for p in path.rglob("*") if p.is_file() and p.suffix in CHECKPOINT_SUFFIXES)
    else:  # the save function appended its own suffix
        files = sorted(p for p in path.parent.glob(path.name + "*") if p.is_file())
    found: list[tuple[str, Any]] = []
    for f in files:
        rel = f.name
        if f.suffix == ".safetensors":
            from safetensors import safe_open

            with safe_open(str(f), framework="pt") as handle:
                found.append((rel, dict.fromkeys(handle.keys())))
            continue
        try:
            obj = torch.load(f, map_location="cpu", weights_only=False)
        except Exception:  # noqa: BLE001 - not a torch file: nothing to read there
            continue
        _collect_state_dicts(obj, rel, found, depth=0)
    return found


def _collect_state_dicts(obj: Any, where: str, out: list[tuple[str, Any]], depth: int) -> None:
    if isinstance(obj, torch.nn.Module):
        out.append((where, obj.state_dict()))
        return
    if not isinstance(obj, Mapping) or depth > 4:
        return
    tensors = {k: v for k, v in obj.items() if isinstance(k, str) and isinstance(v, torch.Tensor)}
    if tensors and len(tensors) == len(obj) and len(tensors) > 1:
        out.append((where, tensors))
        return
    for key, value in obj.items():
        _collect_state_dicts(value, f"{where}['{key}']", out, depth + 1)


WRAPPERS = {
    "OptimizedModule": "_orig_mod",
    "DistributedDataParallel": "module",
    "DataParallel": "module",
    "FullyShardedDataParallel": "_fsdp_wrapped_module",
}


def unwrapped_keys(model: Any) -> set[str]:
    """The model's state-dict keys as the unwrapped model has them (no torch.compile / DDP segments): a
    wrapper at ``net`` turns ``net._orig_mod.0.weight`` back into ``net.0.weight``."""
    keys = set(model.state_dict().keys())
    segments = []  # (the wrapped path, what it is unwrapped)
    for name, mod in model.named_modules():
        attr = WRAPPERS.get(type(mod).__name__)
        if attr:
            segments.append((f"{name}.{attr}.", f"{name}.") if name else (f"{attr}.", ""))
    out = set()
    for key in keys:
        for seg, plain in segments:
            if key.startswith(seg):
                key = plain + key[len(seg) :]
            elif f".{seg}" in key:
                head, _, tail = key.partition(f".{seg}")
                key = f"{head}.{plain}{tail}"
        out.add(key)
    return out


def strip_wrapper_prefix(key: str, clean: set[str]) -> str | None:
    """The clean key a saved key maps to once a wrapper segment is dropped, or None."""
    for attr in set(WRAPPERS.values()):
        seg = attr + "."
        start = 0
        while True:
            at = key.find(seg, start)
            if at < 0:
                break
            if at == 0 or key[at - 1] == ".":
                candidate = key[:at] + key[at + len(seg) :]
                if candidate in clean:
                    return candidate
                deeper = strip_wrapper_prefix(candidate, clean)
                if deeper:
                    return deeper
            start = at + 1
    return None


# --------------------------------------------------------------------------------------------------
# interrupting a save (C2)


class SaveInterrupted(BaseException):
    """Raised by dlcheck in the middle of a save, as a kill would stop it (a BaseException, so a user's
    ``except Exception`` does not swallow it)."""


def _copy_bytes(src: Any, dst: Any, n: int, chunk: int) -> None:
    """Copy the first ``n`` bytes of ``src`` to ``dst``, ``chunk`` bytes at a time."""
    while n > 0:
        data = src.read(min(chunk, n))
        if not data:
            break
        dst.write(data)
        n -= len(data)


@contextlib.contextmanager
def interrupted_saves(armed: Callable[[], bool] = lambda: True, dry: bool = False) -> Iterator[list[str]]:
    """While active (and ``armed()``), ``torch.save`` and safetensors' ``save_file`` write the first half of
    what they would write to their target, then raise :class:`SaveInterrupted`. Yields the list of
    interrupted targets. ``dry``: write nothing, only name the target (where a save would go)."""
    import os
    import tempfile

    import torch.serialization

    hits: list[str] = []
    real_save = torch.save

    def half(target: Any, write: Callable[[str], None]) -> None:
        """``write`` the whole file aside (a temporary file: no copy of a checkpoint in memory), then its
        first half to ``target``, chunk by chunk."""
        with tempfile.TemporaryDirectory(prefix="dlcheck-save-") as tmp:
            whole = os.path.join(tmp, "whole")
            write(whole)
            with open(whole, "rb") as src:
                left = os.path.getsize(whole) // 2
                if isinstance(target, (str, os.PathLike)):
                    with open(target, "wb") as fh:
                        _copy_bytes(src, fh, left, 1 << 24)
                else:
                    _copy_bytes(src, target, left, 1 << 24)

    def save(obj: Any, f: Any, *args: Any, **kwargs: Any) -> None:
        if not armed():
            return real_save(obj, f, *args, **kwargs)
        if dry:
            pass
        elif isinstance(f, (str, os.PathLike)):
            half(f, lambda whole: real_save(obj, whole, *args, **kwargs))
        else:  # a file object: written as torch writes to one (a zip stream), not as to a path

            def to_stream(whole: str) -> None:
                with open(whole, "wb") as fh:
                    real_save(obj, fh, *args, **kwargs)

            half(f, to_stream)
        # a file object opened on a path (open(path, "wb")): its file is named, so that an overwrite is seen as one
        name = getattr(f, "name", None)
        hits.append(
            str(f) if isinstance(f, (str, os.PathLike)) else name if isinstance(name, str) else type(f).__name__
        )
        raise SaveInterrupted(hits[-1])

    patches = [(torch, "save", save), (torch.serialization, "save", save)]
    try:
        import safetensors.torch as st

        real_file = st.save_file

        def save_file(tensors: Any, filename: Any, metadata: Any = None) -> None:
            if not armed():
                return real_file(tensors, filename, metadata=metadata)
            if not dry:
                half(filename, lambda whole: real_file(tensors, whole, metadata=metadata))
            hits.append(str(filename))
            raise SaveInterrupted(str(filename))

        patches.append((st, "save_file", save_file))
    except ImportError:
        pass
    patches += _aliases(patches)
    saved = [(owner, name, getattr(owner, name)) for owner, name, _ in patches]
    for owner, name, value in patches:
        setattr(owner, name, value)
    try:
        yield hits
    finally:
        for owner, name, value in saved:
            setattr(owner, name, value)


def _aliases(patches: list[tuple[Any, str, Any]]) -> list[tuple[Any, str, Any]]:
    """The other names loaded modules hold the patched functions under (``from safetensors.torch import save_file as
    safe_save_file`` in peft's and transformers' save code; ``from torch import save``): each patched the same way,
    so that a save through an alias is interrupted too."""
    import sys

    originals = {id(getattr(owner, name)): replacement for owner, name, replacement in patches}
    done = {(id(owner), name) for owner, name, _ in patches}
    found = []
    for module in list(sys.modules.values()):
        try:
            items = list(vars(module).items())
        except TypeError:
            continue
        for name, value in items:
            replacement = originals.get(id(value))
            if replacement is not None and (id(module), name) not in done and callable(value):
                done.add((id(module), name))
                found.append((module, name, replacement))
    return found


@dataclass
class InterruptedSave:
    how: str
    #: what was interrupted (the file being written)
    target: str
    #: the checkpoint that must still load, and the error loading it raised (None when it loaded)
    previous: str
    error: str | None
    #: when it loaded: "previous", "new" or "mixed" weights
    loaded: str | None = None
    sizes: str = ""
    #: whether the interrupted file was already there (a save over the previous checkpoint) or new (a
    #: versioned checkpoint beside it); None when not known
    overwrote: bool | None = None
    #: the counters of the training state advanced for the second save, as the loop advances them between
    #: saves, when the save names its files after them ("epoch 0 -> 1"); "" when none was
    advanced: str = ""
    #: a new file was interrupted and the load raised on it: what the load gives with that half-written
    #: file put aside ("previous" when the previous checkpoint is intact and loads); None when not tried
    without_new: str | None = None
    #: a Trainer's: the directory its automatic resume takes after the interruption (``resume_from_checkpoint=True``,
    #: transformers' ``get_last_checkpoint``), and whether it is complete (holds trainer_state.json, written last)
    latest: str | None = None
    latest_complete: bool | None = None


def same_weights(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> bool:
    return a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)


#: the part a pass names when every save of the run falls at an epoch end
MID_EPOCH = "mid-epoch resume"


@dataclass
class SavePoint:
    """Where a resume run saves (the optimizer step ``at``), the lines saying why there, and, when the run can
    only save at an epoch end, why a mid-epoch resume is not judged (``unjudged``)."""

    at: int
    lines: list[str] = field(default_factory=list)
    unjudged: str | None = None


def epoch_save_point(k: int, total: int, epoch: int | None, at_ends: str | None = None) -> SavePoint:
    """The save point of a ``total``-step run planned after step ``k``, moved off the epoch's ends: a sampler
    whose order the resume draws anew (from the global RNG before the saved states are put back, or without
    set_epoch) resumes correctly at an epoch end, where the epoch's order is drawn from scratch, and loses the
    order only in the middle of an epoch, and mostly after the first (whose order a seeded start draws again).
    ``epoch``: optimizer steps per epoch (None: not known, ``k`` kept). The save is the step nearest ``k`` that is
    not a multiple of ``epoch`` in an epoch after the first, else in the first; ``at_ends`` (why the pipeline saves
    at epoch ends only) puts it at the epoch end nearest ``k`` instead, and the mid-epoch resume is said not
    judged, as it is for an epoch of one step."""
    if epoch is None or total < 2:
        return SavePoint(k)

    def nearest(candidates: list[int]) -> int | None:
        return min(candidates, key=lambda j: (abs(j - k), j)) if candidates else None

    if epoch == 1:
        return SavePoint(
            k,
            unjudged="an epoch of your training data is one optimizer step, so every save falls at an epoch end, where "
            "the epoch's order is drawn anew: a resume in the middle of an epoch (where a lost sampler order or "
            "position shows) cannot happen in this run",
        )
    if at_ends:
        end = nearest([j for j in range(epoch, total, epoch)])
        if end is None:
            return SavePoint(
                k,
                [
                    f"saved after step {k}, in the middle of the first epoch of {epoch} optimizer steps (the run's "
                    f"{total} steps reach no epoch end to save at, where {at_ends})"
                ],
            )
        return SavePoint(
            end,
            [f"saved after step {end}, the end of epoch {end // epoch} of {epoch} optimizer steps ({at_ends})"],
            unjudged=f"{at_ends}; a resume in the middle of an epoch is not made",
        )
    mid = nearest([j for j in range(epoch + 1, total) if j % epoch])
    where = "epoch {e} of {n} optimizer steps"
    if mid is not None:
        e = mid // epoch + 1
        moved = f" (not after step {k}, {'the end of an epoch' if k % epoch == 0 else 'in the first epoch'})"
        return SavePoint(
            mid,
            [
                f"saved after step {mid}, in the middle of {where.format(e=e, n=epoch)}"
                + (moved if mid != k else "")
                + ", where a resume that draws the epoch's order anew (a sampler without set_epoch, an order drawn "
                "from the global RNG before the saved states are put back) trains other examples"
            ],
        )
    first = nearest([j for j in range(1, total) if j % epoch]) or k
    return SavePoint(
        first,
        [
            f"saved after step {first}, in the middle of the first epoch of {epoch} optimizer steps: the run's "
            f"{total} steps reach no later epoch to save in, so a resume in a later epoch (whose order is drawn after "
            "the first's) is not made"
        ],
    )
