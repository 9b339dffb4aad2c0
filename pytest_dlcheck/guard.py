"""Leave no trace: context managers that put the user's objects back exactly as they were."""

from __future__ import annotations

import contextlib
import copy
import random
import sys
from collections.abc import Iterator, Mapping
from typing import Any


@contextlib.contextmanager
def preserved_rng() -> Iterator[None]:
    """Restore the python, numpy, torch and CUDA RNG states afterwards. Only libraries already imported
    are touched, so this imports nothing."""
    py = random.getstate()
    np = sys.modules.get("numpy")
    np_state = np.random.get_state() if np is not None else None
    torch = sys.modules.get("torch")
    torch_state = torch.random.get_rng_state() if torch is not None else None
    cuda_state = None
    if torch is not None and torch.cuda.is_available() and torch.cuda.is_initialized():
        cuda_state = torch.cuda.get_rng_state_all()
    try:
        yield
    finally:
        random.setstate(py)
        if np_state is not None:
            np.random.set_state(np_state)
        if torch_state is not None:
            torch.random.set_rng_state(torch_state)
        if cuda_state is not None:
            torch.cuda.set_rng_state_all(cuda_state)


#: the states ``seed_everything`` sets, per seed and library: setting a state is ~100x cheaper than seeding
_SEEDED: dict[tuple[str, int], Any] = {}


def seed_everything(seed: int) -> None:
    """Seed python, numpy and torch — only libraries already imported. CUDA is seeded when it is initialised;
    before that it has no generator to seed (``torch.manual_seed`` would queue a lazy call carrying a
    formatted stack, milliseconds under pytest's deep stacks, on each of the ~2 calls per check)."""
    if ("random", seed) not in _SEEDED:
        random.seed(seed)
        _SEEDED["random", seed] = random.getstate()
    random.setstate(_SEEDED["random", seed])
    np = sys.modules.get("numpy")
    if np is not None:
        if ("numpy", seed) not in _SEEDED:
            np.random.seed(seed)
            _SEEDED["numpy", seed] = np.random.get_state()
        np.random.set_state(_SEEDED["numpy", seed])
    torch = sys.modules.get("torch")
    if torch is not None:
        if torch.cuda.is_initialized() or _other_accelerator(torch):
            torch.manual_seed(seed)
        else:
            torch.default_generator.manual_seed(seed)


def _other_accelerator(torch: Any) -> bool:
    """An initialised accelerator other than CUDA whose generators ``torch.manual_seed`` seeds (MPS, XPU)."""
    for name in ("mps", "xpu"):
        backend = getattr(torch, name, None)
        initialised = getattr(backend, "is_initialized", None)
        try:
            if callable(initialised) and initialised():
                return True
        except Exception:  # noqa: BLE001 - a backend that cannot say is not in use
            continue
    return False


@contextlib.contextmanager
def eval_mode(model: Any) -> Iterator[Any]:
    """Run ``model`` in eval mode (dropout off) without gradients; restore every submodule's own
    train/eval flag afterwards (a user may keep some submodules in eval on purpose)."""
    import torch

    modes = [(m, m.training) for m in model.modules()]
    model.eval()
    try:
        with torch.no_grad():
            yield model
    finally:
        for m, training in modes:
            m.training = training


TOKENIZER_SETTINGS = (
    "padding_side",
    "truncation_side",
    "model_max_length",
    "pad_token",
    "eos_token",
    "bos_token",
    "chat_template",
    "add_bos_token",
    "add_eos_token",
)


def tokenizer_settings(tok: Any) -> dict[str, Any]:
    out = {}
    for name in TOKENIZER_SETTINGS:
        try:
            out[name] = getattr(tok, name)
        except Exception:  # some processors raise on absent attributes
            continue
    return out


def _with_inner(tok: Any) -> list[Any]:
    """The tokenizer, and a processor's own ``.tokenizer`` (which holds the padding side, the special tokens)."""
    try:
        inner = getattr(tok, "tokenizer", None)
    except Exception:  # some processors raise on absent attributes
        inner = None
    return [tok] if inner is None or inner is tok else [tok, inner]


@contextlib.contextmanager
def preserved_tokenizer(tok: Any) -> Iterator[Any]:
    """For checks that must tokenize with other settings (say, left padding): put every setting back, on a
    processor's ``.tokenizer`` too."""
    before = [(t, tokenizer_settings(t)) for t in _with_inner(tok)]
    try:
        yield tok
    finally:
        for t, settings in before:
            for name, value in settings.items():
                if tokenizer_settings(t).get(name, value) != value:
                    setattr(t, name, value)


#: plain attributes ``set_epoch`` writes on a dataloader or sampler
EPOCH_COUNTERS = ("epoch", "iteration", "_epoch")
_ABSENT = object()


@contextlib.contextmanager
def preserved_dataloader(dl: Any) -> Iterator[Any]:
    """Iterating a DataLoader advances its (or its sampler's) explicit generator, and ``set_epoch`` moves
    its (or its samplers') epoch counters (DistributedSampler.epoch, accelerate's iteration); restore them."""
    gens, counters = [], []
    inner = getattr(getattr(dl, "batch_sampler", None), "sampler", None)
    for owner in (
        dl,
        getattr(dl, "sampler", None),
        getattr(dl, "batch_sampler", None),
        inner,
        getattr(inner, "sampler", None),
    ):
        gen = getattr(owner, "generator", None)
        if gen is not None and hasattr(gen, "get_state"):
            gens.append((gen, gen.get_state()))
        if owner is not None and hasattr(owner, "__dict__"):
            counters += [(owner, name, owner.__dict__.get(name, _ABSENT)) for name in EPOCH_COUNTERS]
    # an Accelerate-prepared loader registers itself in the process-wide GradientState while iterated and leaves
    # only at its end: a partial read would leave it "active" (its end_of_dataloader then decides every later
    # accumulate() of the user's Accelerator): put the registrations back as they were
    grad_state = getattr(dl, "gradient_state", None)
    references = list(getattr(grad_state, "dataloader_references", None) or []) if grad_state is not None else None
    loader_flags = {n: dl.__dict__[n] for n in ("end_of_dataloader", "remainder") if n in getattr(dl, "__dict__", {})}
    try:
        yield dl
    finally:
        if references is not None:
            grad_state.dataloader_references = references
        for name, value in loader_flags.items():
            dl.__dict__[name] = value
        for gen, state in gens:
            gen.set_state(state)
        for owner, name, value in counters:
            if value is _ABSENT:
                owner.__dict__.pop(name, None)  # set_epoch shadowed a class attribute: drop the shadow
            else:
                owner.__dict__[name] = value


def kept(batch: Any) -> Any:
    """A batch a loader can no longer change: its tensors and arrays copied, its containers rebuilt (a mapping of
    its own type where it copies). A loader may fill the same preallocated buffers in place and yield them every
    time (a common speed trick): a batch kept by reference past the next draw holds the last batch's values. Imports
    nothing; what is neither a tensor, an array nor a container is kept as it is."""
    if hasattr(batch, "clone") and hasattr(batch, "shape") and callable(batch.clone):
        return batch.detach().clone() if hasattr(batch, "detach") else batch.clone()
    if type(batch).__module__ == "numpy" and hasattr(batch, "copy") and hasattr(batch, "shape"):
        return batch.copy()
    if isinstance(batch, dict) and type(batch) is dict:
        return {k: kept(v) for k, v in batch.items()}
    if isinstance(batch, Mapping):
        try:
            again = copy.copy(batch)
            for k, v in batch.items():
                again[k] = kept(v)
            return again
        except Exception:  # noqa: BLE001 - a mapping that cannot be copied or set: its fields in a plain dict
            return {k: kept(v) for k, v in batch.items()}
    if isinstance(batch, tuple) and hasattr(batch, "_fields"):
        return type(batch)(*(kept(v) for v in batch))
    if type(batch) in (list, tuple):
        return type(batch)(kept(v) for v in batch)
    return batch
