"""The shared run machinery every kind of user builds on: recognising the user's objects, fresh copies of
modules (dropping instance-level method patches: TRL binds a patched ``forward`` to the original module,
so a deep copy would keep calling the original; copies are verified to share no storage with the
original), snapshots, RNG states, batches and model calls, and what a run records."""

from __future__ import annotations

import copy
import dataclasses
import inspect
import math
import random
import sys
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from .. import twin
from ..guard import kept, preserved_dataloader, preserved_rng

#: the seed every fresh run of a plain loop or a Lightning module starts from (a Trainer uses args.seed)
SEED = 0

#: the kinds of user whose step is a function dlcheck calls micro-batch by micro-batch on its own batches
LOOP_KINDS = ("loop", "accelerate")


class SetupError(Exception):
    """The user's training cannot be run the way a check needs: the check skips with this reason."""


# --------------------------------------------------------------------------------------------------
# recognising the user's objects


def is_hf_trainer(obj: Any) -> bool:
    return any(
        c.__module__.startswith(("transformers.", "trl.")) and c.__name__.endswith("Trainer") for c in type(obj).__mro__
    )


def is_lightning_module(obj: Any) -> bool:
    return any(
        c.__name__ == "LightningModule" and c.__module__.startswith(("lightning.", "pytorch_lightning."))
        for c in type(obj).__mro__
    )


def own_dataloader(module: Any, method: str = "train_dataloader") -> bool:
    """Whether a LightningModule defines its own ``train_dataloader()`` (or ``method``): Lightning's classic style,
    ``trainer.fit(module)`` with no datamodule, the module's loaders being the data. Decided from the class, as
    Lightning's ``is_overridden`` does: the first class of its MRO defining ``method`` is not Lightning's own."""
    for c in type(module).__mro__:
        if method in vars(c):
            return not c.__module__.startswith(("lightning.", "pytorch_lightning."))
    return False


def is_lightning_trainer(obj: Any) -> bool:
    return any(
        c.__name__ == "Trainer" and c.__module__.startswith(("lightning.pytorch", "pytorch_lightning"))
        for c in type(obj).__mro__
    )


def is_grpo(trainer: Any) -> bool:
    """A trainer that generates the completions it trains on inside its step (TRL's GRPOTrainer, RLOOTrainer): a
    GRPOTrainer, or a Trainer that keeps generated completions in a generation buffer (``_buffered_inputs``)."""
    return any(c.__name__ == "GRPOTrainer" for c in type(trainer).__mro__) or hasattr(trainer, "_buffered_inputs")


def online_objective(trainer: Any) -> str:
    """What the loss of a trainer that generates its completions inside its step is, as far as its objects tell:
    a divergence from a teacher model it holds (on-policy distillation), a policy-gradient objective on the
    rewards of its reward functions or reward model (GRPO, RLOO), else its own objective, said neutrally."""
    teacher = getattr(trainer, "teacher_model", None)
    if isinstance(teacher, torch.nn.Module):
        inner = getattr(teacher, "module", teacher)  # a DDP/accelerate wrapper: the model's own class
        return (
            f"a divergence between its model's and its teacher model's ({type(inner).__name__}) token "
            "distributions on completions generated in its step"
        )
    if getattr(trainer, "reward_funcs", None) or getattr(trainer, "reward_model", None) is not None:
        return "a policy-gradient objective on generated completions"
    return "its own objective on completions generated in its step"


def generation_cycle(trainer: Any) -> tuple[int, int] | None:
    """(optimizer steps, micro-steps) of a trainer's generation cycle, or None: a trainer that keeps the completions
    it generated in a buffer (``_buffered_inputs``) and regenerates every ``args.steps_per_generation`` ×
    ``num_iterations`` calls of its training step (TRL's GRPOTrainer, RLOOTrainer) is at a cycle boundary after
    ``g`` optimizer steps when ``g`` × gradient accumulation is a multiple of that; None when every optimizer step
    is one (or the trainer keeps no such buffer)."""
    spg = getattr(getattr(trainer, "args", None), "steps_per_generation", None)
    if not hasattr(trainer, "_buffered_inputs") or not isinstance(spg, int) or spg < 1:
        return None
    micro = spg * max(1, int(getattr(trainer, "num_iterations", 1) or 1))
    accum = max(1, int(getattr(trainer.args, "gradient_accumulation_steps", 1) or 1))
    steps = micro // math.gcd(micro, accum)
    return (steps, micro) if steps > 1 else None


#: TRL's preference-optimisation trainers (a policy trained against a frozen reference model), by class name, and
#: the loss each optimises: DPO's -log σ(β Δ) on chosen/rejected pairs (ln 2 at the start), KTO's 1 - σ(β(r - z))
#: on unpaired desirable/undesirable completions (0.5 at the start)
PREFERENCE_TRAINERS = {"DPOTrainer": "dpo", "KTOTrainer": "kto"}


def preference_loss(trainer: Any) -> str | None:
    """``"dpo"`` or ``"kto"`` for TRL's preference trainers (and their subclasses), else None."""
    for c in type(trainer).__mro__:
        if c.__name__ in PREFERENCE_TRAINERS:
            return PREFERENCE_TRAINERS[c.__name__]
    return None


def is_preference(trainer: Any) -> bool:
    """A TRL preference trainer (DPOTrainer, KTOTrainer): its loss compares the policy with a reference model,
    it is no cross-entropy over classes."""
    return preference_loss(trainer) is not None


def is_reward_trainer(trainer: Any) -> bool:
    """TRL's RewardTrainer (a sequence classifier trained on the pairwise loss -log σ(r_chosen - r_rejected))."""
    return any(c.__name__ == "RewardTrainer" for c in type(trainer).__mro__)


# --------------------------------------------------------------------------------------------------
# fresh copies, snapshots, RNG


def _strip_instance_patches(copied: torch.nn.Module) -> list[str]:
    """Drop callables set on module instances that shadow a class method (a patched ``forward``): in a deep
    copy they are the original's closures, still bound to the original module."""
    dropped = []
    for name, mod in copied.named_modules():
        if _compiled(mod):
            continue  # a torch.compile'd module's forward is its own, rebuilt on the copy by its __setstate__
        for attr, value in list(vars(mod).items()):
            if (
                callable(value)
                and not isinstance(value, (torch.nn.Module, torch.Tensor, type))
                and callable(getattr(type(mod), attr, None))
            ):
                delattr(mod, attr)
                dropped.append(f"{name or type(copied).__name__}.{attr}")
    return dropped


def _compiled(mod: torch.nn.Module) -> bool:
    kind = type(mod)
    return kind.__name__ == "OptimizedModule" and kind.__module__.startswith("torch._dynamo")


def fresh_modules(modules: list[Any], extra_memo: dict[int, Any] | None = None) -> list[Any]:
    """Independent copies of ``modules`` (copied together, so parameters they share stay shared between
    the copies), without instance-level method patches, verified to share no storage with the originals."""
    memo = dict(extra_memo or {})
    modules = [twin.twin_of(m) for m in modules]  # --dlcheck-twin: copies of the model's tiny twin
    copies = copy.deepcopy(list(modules), memo)
    originals = {p.data_ptr() for m in modules if m is not None for p in m.parameters()}
    for cp in copies:
        if cp is None:
            continue
        _strip_instance_patches(cp)
        shared = [n for n, p in cp.named_parameters() if p.data_ptr() in originals]
        if shared:
            raise SetupError(
                f"a copy of the model still shares storage with the original ({shared[0]}): "
                "dlcheck trains only copies, never your objects"
            )
    return copies


@dataclass
class ModuleSnapshot:
    """Everything a step may change on a module: tensors, grads, requires_grad, train/eval flags."""

    tensors: dict[str, torch.Tensor]
    grads: dict[str, torch.Tensor | None]
    requires_grad: dict[str, bool]
    training: dict[str, bool]

    @classmethod
    def take(cls, module: torch.nn.Module) -> ModuleSnapshot:
        return cls(
            {k: v.detach().clone() for k, v in module.state_dict(keep_vars=True).items()},
            {n: None if p.grad is None else p.grad.detach().clone() for n, p in module.named_parameters()},
            {n: p.requires_grad for n, p in module.named_parameters()},
            {n: m.training for n, m in module.named_modules()},
        )

    def restore(self, module: torch.nn.Module) -> None:
        with torch.no_grad():
            for k, v in module.state_dict(keep_vars=True).items():
                if k in self.tensors:
                    v.copy_(self.tensors[k])
        for n, p in module.named_parameters():
            if n in self.grads:
                p.grad = self.grads[n]
            if n in self.requires_grad:
                p.requires_grad_(self.requires_grad[n])
        for n, m in module.named_modules():
            if n in self.training:
                m.training = self.training[n]


def rng_state() -> dict[str, Any]:
    np = sys.modules.get("numpy")
    state = {"python": random.getstate(), "torch": torch.random.get_rng_state()}
    if np is not None:
        state["numpy"] = np.random.get_state()
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state


def set_rng_state(state: dict[str, Any]) -> None:
    random.setstate(state["python"])
    torch.random.set_rng_state(state["torch"])
    if "numpy" in state and sys.modules.get("numpy") is not None:
        sys.modules["numpy"].random.set_state(state["numpy"])
    if "cuda" in state:
        torch.cuda.set_rng_state_all(state["cuda"])


def seed_all(seed: int) -> None:
    random.seed(seed)
    torch.manual_seed(seed)
    np = sys.modules.get("numpy")
    if np is not None:
        np.random.seed(seed % 2**32)


# --------------------------------------------------------------------------------------------------
# batches and model calls


def to_device(batch: Any, device: Any) -> Any:
    """The batch on ``device``, of its own type, as the user's step, loss or model expects it: a batch class
    with its own ``.to()`` (a transformers ``BatchEncoding``, a custom batch) is moved by it, on a shallow copy
    (``BatchEncoding.to`` moves in place: the shared sample stays where it was); a mapping, a named tuple, a
    list, a tuple or a dataclass is rebuilt as the same type around its moved values. A batch with nothing
    to move is handed as it is (the same object)."""
    dev = torch.device(device)
    if not _off_device(batch, dev, 4):
        return batch
    return _moved(batch, dev, 4)


def own_batch(batch: Any, depth: int = 4) -> Any:
    """A batch of its own for one call of the user's code (its step, loss, model, ``training_step``): its tensors
    and arrays copied, inside containers of the batch's own types (a dict, a ``BatchEncoding`` or another mapping, a
    named tuple, a list, a tuple, a dataclass). A pipeline hands each call a batch it made for it; the checks reuse
    the sampled batches across calls, so user code that changes its batch in place (``batch.div_(255)`` in a
    normalisation) must not find the change again at its next call. A tensor's copy stays on its autograd graph
    (``clone()``, not detached): a check's leaf input still receives its gradient. Costs one copy of the batch
    per call (what moving it to the model's device costs)."""
    if isinstance(batch, torch.Tensor):
        return batch.clone()
    if type(batch).__module__ == "numpy" and hasattr(batch, "copy") and hasattr(batch, "shape"):
        return batch.copy()
    if depth < 0 or isinstance(batch, (str, bytes)):
        return batch
    try:
        if isinstance(batch, Mapping):
            items = {k: own_batch(v, depth - 1) for k, v in batch.items()}
            if type(batch) is dict:
                return items
            again = copy.copy(batch)
            for k, v in items.items():
                again[k] = v
            return again
        if isinstance(batch, tuple) and hasattr(batch, "_fields"):  # a named tuple
            return type(batch)(*(own_batch(v, depth - 1) for v in batch))
        if type(batch) in (list, tuple):
            return type(batch)(own_batch(v, depth - 1) for v in batch)
        if dataclasses.is_dataclass(batch) and not isinstance(batch, type):
            again = copy.copy(batch)
            for f in dataclasses.fields(batch):
                if hasattr(batch, f.name):
                    object.__setattr__(again, f.name, own_batch(getattr(batch, f.name), depth - 1))
            return again
    except Exception:  # noqa: BLE001 - a container that cannot be copied or set (immutable): handed as it is
        return batch
    return batch


def with_field(batch: Mapping, key: Any, value: Any) -> Any:
    """A copy of the mapping ``batch`` with ``key`` set to ``value``, of the batch's own type (a
    ``BatchEncoding`` stays one); the batch itself is left as it was."""
    if type(batch) is dict:
        return {**batch, key: value}
    try:
        again = copy.copy(batch)
        again[key] = value
        return again
    except TypeError:  # an immutable mapping: a plain dict of its items
        return {**batch, key: value}


def _is_batch_class(batch: Any) -> bool:
    """An object that moves itself (``batch.to(device)``): not a tensor, a module or a class."""
    return (
        callable(getattr(batch, "to", None))
        and not isinstance(batch, (torch.Tensor, torch.nn.Module, type))
        and not isinstance(batch, (str, bytes))
    )


def _fields(batch: Any) -> list[Any] | None:
    """The values inside a container batch (None when it is not one)."""
    if isinstance(batch, Mapping):
        return list(batch.values())
    if isinstance(batch, (list, tuple)):
        return list(batch)
    if dataclasses.is_dataclass(batch) and not isinstance(batch, type):
        return [getattr(batch, f.name, None) for f in dataclasses.fields(batch)]
    if _is_batch_class(batch) and isinstance(getattr(batch, "__dict__", None), dict):
        return list(vars(batch).values())
    return None


def _off_device(batch: Any, device: torch.device, depth: int) -> bool:
    """Whether a tensor in ``batch`` lies on another device (a batch class whose insides cannot be seen
    counts as off: its own ``.to()`` decides)."""
    if isinstance(batch, torch.Tensor):
        return batch.device.type != device.type or (device.index is not None and batch.device.index != device.index)
    if depth < 0:
        return False
    inner = _fields(batch)
    if inner is None:
        return _is_batch_class(batch)
    return any(_off_device(v, device, depth - 1) for v in inner)


def _moved(batch: Any, device: torch.device, depth: int) -> Any:
    if isinstance(batch, torch.Tensor):
        return batch.to(device)
    if depth < 0:
        return batch
    if _is_batch_class(batch):  # its own .to() (a BatchEncoding, a PackedSequence, a custom batch) knows how
        mine = copy.copy(batch)
        out = mine.to(device)
        return mine if out is None else out
    if isinstance(batch, Mapping):
        moved = {k: _moved(v, device, depth - 1) for k, v in batch.items()}
        if type(batch) is dict:
            return moved
        try:
            again = copy.copy(batch)
            for k, v in moved.items():
                again[k] = v
            return again
        except TypeError:  # an immutable mapping: built anew from the moved items
            return type(batch)(moved)
    if isinstance(batch, (list, tuple)):
        if batch and isinstance(batch[0], Mapping):  # uncollated examples: handed as they are
            return batch
        moved_items = [_moved(v, device, depth - 1) for v in batch]
        if hasattr(batch, "_fields"):  # a named tuple
            return type(batch)(*moved_items)
        return type(batch)(moved_items)
    if dataclasses.is_dataclass(batch):
        again = copy.copy(batch)
        for f in dataclasses.fields(batch):
            if hasattr(batch, f.name):
                object.__setattr__(again, f.name, _moved(getattr(batch, f.name), device, depth - 1))
        return again
    return batch


def batch_len(batch: Any) -> int | None:
    first = None
    if isinstance(batch, torch.Tensor):
        first = batch
    elif isinstance(batch, Mapping):
        first = next((v for v in batch.values() if isinstance(v, torch.Tensor) and v.dim() > 0), None)
    elif isinstance(batch, (list, tuple)) and batch:
        if isinstance(batch[0], torch.Tensor):
            first = batch[0]
        else:
            return len(batch)
    return int(first.shape[0]) if first is not None else None


def draw_batches(loader: Any, n: int) -> list[Any]:
    """The first ``n`` batches of a dataloader, whatever their shape, re-iterating it (a new epoch,
    ``set_epoch`` applied when the sampler has it) when it runs out. The loader's generators and the
    global RNGs are left as they were. The draw starts from the global RNGs at :data:`SEED`, so a loader that
    shuffles or augments from them gives the same batches whichever check draws first (and the first ``n`` of a
    longer draw are these): a verdict does not depend on which checks ran before."""
    out: list[Any] = []
    with preserved_rng(), preserved_dataloader(loader):
        seed_all(SEED)
        epoch = 0
        while len(out) < n:
            sampler = getattr(loader, "sampler", None)
            if hasattr(sampler, "set_epoch"):
                sampler.set_epoch(epoch)
            got = 0
            for batch in loader:
                out.append(kept(batch))  # a loader may refill and yield the same buffers
                got += 1
                if len(out) >= n:
                    break
            if got == 0:
                break
            epoch += 1
    return out


def device_of(model: Any) -> Any:
    for p in model.parameters():
        return p.device
    return torch.device("cpu")


def loss_tensor(out: Any) -> torch.Tensor:
    """The loss a step returned: a tensor, a mapping with 'loss', or an HF ModelOutput."""
    if isinstance(out, torch.Tensor):
        return out
    if isinstance(out, Mapping) and "loss" in out:
        return loss_tensor(out["loss"])
    loss = getattr(out, "loss", None)
    if isinstance(loss, torch.Tensor):
        return loss
    if isinstance(out, (list, tuple)) and out and isinstance(out[0], torch.Tensor) and out[0].dim() == 0:
        return out[0]
    raise SetupError(f"the loss is a {type(out).__name__}, not a scalar tensor")


def as_float(value: Any) -> float | None:
    if value is None:
        return None
    if isinstance(value, torch.Tensor):
        return float(value.detach().float().mean()) if value.numel() else None
    try:
        return float(value)
    except (TypeError, ValueError):
        return None


def output_tensor(out: Any) -> torch.Tensor | None:
    """The prediction tensor of a model output (HF ``logits``, a tensor, the first tensor of a tuple)."""
    if isinstance(out, torch.Tensor):
        return out
    for key in ("logits", "last_hidden_state", "out"):
        value = out.get(key) if isinstance(out, Mapping) else getattr(out, key, None)
        if isinstance(value, torch.Tensor):
            return value
    if isinstance(out, Mapping):
        return next((v for v in out.values() if isinstance(v, torch.Tensor) and v.dim() > 0), None)
    if isinstance(out, (list, tuple)):
        return next((v for v in out if isinstance(v, torch.Tensor) and v.dim() > 0), None)
    return None


def _forward_params(model: Any) -> tuple[set[str], list[str]] | None:
    """(the parameters the forward names, those it requires), or None when it cannot be read."""
    try:
        params = inspect.signature(model.forward).parameters
    except (TypeError, ValueError):
        return None
    kinds = (inspect.Parameter.POSITIONAL_OR_KEYWORD, inspect.Parameter.KEYWORD_ONLY)
    named = {n for n, p in params.items() if p.kind in kinds}
    required = [n for n, p in params.items() if p.kind in kinds and p.default is inspect.Parameter.empty]
    if any(p.kind is inspect.Parameter.VAR_KEYWORD for p in params.values()):
        return None  # **kwargs: the forward takes any field
    return (named, required) if named else None


class NoStepToSaveAfter(SetupError):
    """A run had no optimizer step in its second half to save after: the micro-steps of one accumulation outlast
    it (a longer run judges it)."""


#: the longest run made to reach past one gradient accumulation (micro-steps): C1's uninterrupted and
#: data-position runs and C10's round trip are doubled up to it (:func:`past_accumulation`)
ACCUMULATION_LIMIT = 64


def past_accumulation(run: Callable[[int], Any], total: int, limit: int = ACCUMULATION_LIMIT) -> tuple[int, Any]:
    """``(length, run(length))`` for the first run long enough to save after an optimizer step: ``run(total)``,
    its length doubled while a gradient accumulation outlasts it (``run`` raises :class:`NoStepToSaveAfter`), as a
    loop saves only after an optimizer step. A length past ``limit`` is not tried: the last NoStepToSaveAfter is
    raised (it says how far the run went). Each try is a fresh run of ``run``'s own making."""
    while True:
        try:
            return total, run(total)
        except NoStepToSaveAfter:
            if total * 2 > limit:
                raise
            total *= 2


def plain_state(value: Any) -> Any:
    """A state as comparable plain data: tensors cloned to the CPU, containers rebuilt, other values copied."""
    if isinstance(value, torch.Tensor):
        return value.detach().to("cpu", copy=True)
    if isinstance(value, Mapping):
        return {k: plain_state(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [plain_state(v) for v in value]
    try:
        return copy.deepcopy(value)
    except Exception:  # noqa: BLE001 - an unpicklable attribute (a lambda in a LambdaLR): compared by type
        return type(value).__name__


def first_difference(a: Any, b: Any, where: str = "") -> str | None:
    """Where two plain states first differ (a path and the two values), or None when they are equal."""
    if isinstance(a, torch.Tensor) or isinstance(b, torch.Tensor):
        if not (isinstance(a, torch.Tensor) and isinstance(b, torch.Tensor)):
            return f"{where or 'value'}: {type(a).__name__} vs {type(b).__name__}"
        if a.shape != b.shape:
            return f"{where or 'tensor'}: shape {tuple(a.shape)} vs {tuple(b.shape)}"
        if torch.equal(a, b):
            return None
        if a.is_floating_point():
            return f"{where or 'tensor'}: max |difference| {float((a.double() - b.double()).abs().max()):.3g}"
        return f"{where or 'tensor'}: {a.flatten()[:4].tolist()} vs {b.flatten()[:4].tolist()}"
    if isinstance(a, Mapping) and isinstance(b, Mapping):
        for k in a:
            if k not in b:
                return f"{where}{'.' if where else ''}{k}: missing after load"
            found = first_difference(a[k], b[k], f"{where}{'.' if where else ''}{k}")
            if found:
                return found
        return None
    if isinstance(a, list) and isinstance(b, list):
        if len(a) != len(b):
            return f"{where or 'list'}: {len(a)} vs {len(b)} entries"
        for i, (x, y) in enumerate(zip(a, b, strict=True)):
            found = first_difference(x, y, f"{where}[{i}]")
            if found:
                return found
        return None
    try:
        same = bool(a == b)
    except Exception:  # noqa: BLE001 - values without a plain equality
        same = type(a) is type(b)
    return None if same else f"{where or 'value'}: {a!r} saved, {b!r} after load"[:200]


class NotTheBatch(SetupError):
    """The model's forward does not take the batch as it comes (a UNet called on a text-to-image batch
    needs noisy latents, timesteps and text states the user's loss computes): the checks that call the
    model on a batch do not concern this pipeline."""


def model_call(model: Any, batch: Any) -> Callable[[], Any]:
    """How a model is called on a batch: a mapping by keyword (keys the forward does not name are left
    out), ``(inputs, targets, …)`` with its first element, a tensor as it is. A mapping without a field
    the forward requires raises :class:`NotTheBatch` (the check says "not applicable"), and so does a module with
    no forward of its own (an ``nn.ModuleDict`` / ``nn.ModuleList`` holding a GAN's generator and discriminator:
    the loss calls its members)."""
    if isinstance(model, torch.nn.Module) and type(model).forward is torch.nn.Module.forward:
        raise NotTheBatch(
            f"not applicable: {type(model).__name__} has no forward of its own (a container of networks): it is not "
            "called on the batch, your loss (dlcheck_compute_loss / dlcheck_train_step) calls its members"
        )
    if isinstance(batch, Mapping):
        found = _forward_params(model)
        names, required = found if found is not None else (None, [])
        lacking = [n for n in required if n not in batch]
        if lacking:
            raise NotTheBatch(
                f"not applicable: {type(model).__name__}.forward requires {', '.join(lacking)}, which the batches "
                f"(fields: {', '.join(map(str, batch)) or 'none'}) do not hold: the model is called by your loss "
                "(dlcheck_compute_loss / dlcheck_train_step), not on the batch"
            )
        kwargs = {k: v for k, v in batch.items() if names is None or k in names}
        return lambda: model(**kwargs)
    if isinstance(batch, (list, tuple)) and batch:
        n = positional_inputs(model)
        if n > len(batch):
            raise NotTheBatch(
                f"not applicable: {type(model).__name__}.forward takes {n} inputs and the batches hold {len(batch)} "
                "elements: the model is called by your loss (dlcheck_compute_loss / dlcheck_train_step), not on the batch"
            )
        # (inputs, targets) or, for a forward of n inputs (a siamese network's input1, input2), (in_1 .. in_n, targets)
        return lambda: model(*batch[:n])
    return lambda: model(batch)


def inputs_guessed(model: Any, batch: Any) -> bool:
    """Whether :func:`model_call` guesses the model's inputs: a forward of n >= 2 positional inputs on a batch of
    n elements leaves none for the targets, so ``(x, y)`` is handed over as the forward's ``(input, hidden)`` (an
    RNN language model whose loss passes the hidden state) as readily as a siamese pair. A call on guessed inputs
    that raises says nothing of the user's pipeline."""
    if not isinstance(batch, (list, tuple)) or len(batch) < 2 or isinstance(batch, Mapping):
        return False
    return positional_inputs(model) >= len(batch)


def positional_inputs(model: Any) -> int:
    """How many inputs the model's forward requires positionally (at least 1; a forward taking *args: 1). A wrapper
    whose forward takes only ``*args, **kwargs`` (Lightning Fabric's _FabricModule, DistributedDataParallel,
    torch.compile's module) hands them to the module it wraps: that module's forward is read."""
    variadic = (inspect.Parameter.VAR_POSITIONAL, inspect.Parameter.VAR_KEYWORD)
    kinds = (inspect.Parameter.POSITIONAL_ONLY, inspect.Parameter.POSITIONAL_OR_KEYWORD)
    for _ in range(4):
        try:
            params = list(inspect.signature(model.forward).parameters.values())
        except (TypeError, ValueError, AttributeError):
            return 1
        if params and all(p.kind in variadic for p in params):
            inner = next(
                (
                    getattr(model, a)
                    for a in ("_forward_module", "module", "_orig_mod")
                    if isinstance(getattr(model, a, None), torch.nn.Module) and getattr(model, a) is not model
                ),
                None,
            )
            if inner is not None:
                model = inner
                continue
        return max(1, sum(1 for p in params if p.kind in kinds and p.default is inspect.Parameter.empty))
    return 1


def targets_of(batch: Any, model: Any = None) -> Any:
    """The targets of a batch: a mapping's labels; a sequence's element after the model's inputs (element 1 of
    ``(inputs, targets)``; element 2 of ``(input1, input2, targets)`` for a forward of two inputs)."""
    if isinstance(batch, Mapping):
        return batch.get("labels", batch.get("label"))
    if isinstance(batch, (list, tuple)):
        n = positional_inputs(model) if model is not None else 1
        return batch[n] if len(batch) > n else None
    return None


# --------------------------------------------------------------------------------------------------
# what a run records


@dataclass
class StepRecord:
    step: int
    loss: float | None = None
    grad_norm: float | None = None
    lr: float | None = None
    nonfinite_grads: list[str] = field(default_factory=list)
    nonfinite_params: list[str] = field(default_factory=list)
    metrics: dict[str, float] = field(default_factory=dict)
    #: a digest of the batch trained at this step (batch_digest): which examples, in which order
    batch: float | None = None
    #: the gradient norm at ``optimizer.step()`` when the user's step changed the gradients after the backward
    #: (clipped them): ``grad_norm`` is then the norm before, as ``clip_grad_norm_`` returns it
    clipped_norm: float | None = None
    #: the gradient norm at ``optimizer.step()`` of a step whose norm before clipping is not known (``grad_norm``
    #: None): the step may have clipped it, so it is never compared with norms before clipping
    step_norm: float | None = None
    #: a content digest of each example trained at this step (:func:`example_digests`), every micro-batch's
    examples: list[str] | None = None
    #: a step that updates the weights itself (no optimizer object: :class:`UpdateWatch`) changed them at this call
    update: bool = False
    #: the part of ``grad_norm`` (before clipping, a loop's optimizer) from the tensors whose gradient was exactly 0 at
    #: the run's first reading (a factor initialised to 0 keeps its partner's gradient at 0: LoRA's A while B = 0);
    #: None when no tensor's was, or where it is not read (a Trainer's logged norm, Lightning, an update watch)
    late_norm: float | None = None

    @property
    def stepped(self) -> bool:
        """Whether the weights were updated at this record: an optimizer step (its LR read) or the step's own update."""
        return self.lr is not None or self.update


def batch_digest(batch: Any) -> float | None:
    """An order-sensitive digest of a batch's tensors (None when it holds none): two runs that train on
    the same examples in the same order at a step have the same digest."""
    tensors = []

    def walk(value: Any) -> None:
        if torch.is_tensor(value):
            tensors.append(value)
        elif isinstance(value, Mapping):
            for k in sorted(value, key=str):
                walk(value[k])
        elif isinstance(value, (list, tuple)):
            for v in value:
                walk(v)

    walk(batch)
    if not tensors:
        return None
    with torch.no_grad():
        total = 0.0
        for t in tensors:
            flat = t.detach().flatten().double().cpu()
            total += float((flat * torch.arange(1, flat.numel() + 1, dtype=torch.float64)).sum())
        return total


def example_digests(batch: Any, restores: bool | None = None) -> list[str] | None:
    """A content digest of each example (row) of a collated batch: every tensor whose first dimension is
    the batch size, row by row; where the batch has an ``attention_mask`` (batch, length), the positions it
    masks are left out of every tensor of that shape (the padding a collator adds, left or right, as long as
    the batch needs), and integer (batch, length) tensors of another length (a seq2seq batch's padded labels) are left
    out. A token batch whose labels hold the original tokens where its collator replaced them (a masked LM's, drawn
    anew at every collation) is keyed by those tokens, not by what the draw replaced (:func:`_restored_tokens`):
    ``restores`` True where the pipeline's collator says so (:func:`labels_restore`), else told from the batch. The
    same example drawn into two batches has the same digest (two identical rows too:
    they are counted as a multiset). None when the batch holds no tensor with a batch dimension."""
    import hashlib

    tensors: list[tuple[str, torch.Tensor]] = []

    def walk(value: Any, where: str, depth: int) -> None:
        if depth > 4:
            return
        if torch.is_tensor(value):
            tensors.append((where, value))
        elif isinstance(value, Mapping):
            for k in sorted(value, key=str):
                walk(value[k], f"{where}.{k}", depth + 1)
        elif isinstance(value, (list, tuple)):
            for i, v in enumerate(value):
                walk(v, f"{where}[{i}]", depth + 1)
        elif dataclasses.is_dataclass(value) and not isinstance(value, type):
            for f in dataclasses.fields(value):
                walk(getattr(value, f.name, None), f"{where}.{f.name}", depth + 1)

    walk(batch, "", 0)
    sized = [(w, t) for w, t in tensors if t.ndim >= 1]
    if not sized:
        return None
    n = int(sized[0][1].shape[0])
    rows = [(w, t.detach().cpu()) for w, t in sized if int(t.shape[0]) == n]
    mask = batch.get("attention_mask") if isinstance(batch, Mapping) else None
    if not (torch.is_tensor(mask) and mask.ndim == 2 and int(mask.shape[0]) == n):
        mask = None
    else:
        mask = mask.detach().cpu().bool()
    if mask is not None:
        # token tensors of another length than the mask (a seq2seq batch's labels and decoder_input_ids, padded to
        # the batch's longest target) carry the batch's padding, which the mask does not cover: the example is told by
        # what the mask covers and the rest of its tensors
        rows = [
            (w, t) for w, t in rows if not (t.ndim == 2 and not t.is_floating_point() and t.shape[1] != mask.shape[1])
        ]
    restored = _restored_tokens(batch, n, restores)
    out = []
    for i in range(n):
        h = hashlib.sha1()
        for where, t in rows:
            if restored is not None and restored[1][i] and _drawn_positions(t, restored[0]):
                continue  # masks over pairs of token positions drawn with the targets (a permutation LM's)
            if restored is not None and restored[1][i] and where in (".input_ids", ".labels"):
                if where == ".labels":  # which tokens the collator chose to replace: left out
                    continue
                t = restored[0]  # the original tokens
            row = t[i]
            if mask is not None and t.ndim >= 2 and t.shape[:2] == mask.shape:
                row = row[mask[i]]
            row = row.contiguous()
            h.update(f"{where}:{row.dtype}:{tuple(row.shape)}".encode())
            h.update(row.reshape(-1).view(torch.uint8).numpy().tobytes() if row.numel() else b"")
        out.append(h.hexdigest()[:16])
    return out


def labels_restore(collator: Any) -> bool | None:
    """True when a collator says that its labels hold the original tokens where it replaces them at random: a masked
    LM's (``mlm`` true, a tokenizer with a mask token: transformers' ``DataCollatorForLanguageModeling``,
    ``DataCollatorForWholeWordMask``), a permutation LM's (a ``plm_probability`` of spans to mask, a tokenizer with a
    mask token: ``DataCollatorForPermutationLanguageModeling``, whose perm_mask and target_mapping are drawn with
    the spans); None when it does not say (each batch is then told by itself)."""
    collator = getattr(collator, "data_collator", None) or collator  # the Trainer's RemoveColumnsCollator
    if not getattr(getattr(collator, "tokenizer", None), "mask_token", None):
        return None
    if getattr(collator, "mlm", None) is True or getattr(collator, "plm_probability", None):
        return True
    return None


def _drawn_positions(t: torch.Tensor, tokens: torch.Tensor) -> bool:
    """A floating (batch, length, length) tensor beside a token batch of that length: a mask over pairs of token
    positions (which position may see which, which position each target is), drawn with the targets by a collator
    that masks at random (a permutation LM's perm_mask and target_mapping): not what the example is."""
    return (
        t.is_floating_point()
        and t.ndim == 3
        and tokens.ndim == 2
        and int(t.shape[0]) == int(tokens.shape[0])
        and int(t.shape[2]) == int(tokens.shape[1])
    )


def _restored_tokens(batch: Any, n: int, restores: bool | None = None) -> tuple[torch.Tensor, list[bool]] | None:
    """The original tokens of a token batch whose labels hold them where its collator replaced them (a masked LM's:
    ``DataCollatorForLanguageModeling`` draws other positions, [MASK] or random ids, at every collation), and per
    row whether that row is keyed by them instead of its ``input_ids`` and ``labels``; None for a batch without
    integer ``input_ids`` and ``labels`` of one shape. The tokens are ``where(labels != -100, labels, input_ids)``.
    A row is keyed by them when its labels agree with its inputs wherever they supervise (nothing replaced: a causal
    LM's labels, a masked LM's row the draw left whole), or when the batch's replaced positions are a collator's:
    more than half of the positions whose input differs from its label hold one id that appears at no unsupervised
    position and in no label (the mask token). A row whose labels differ from its inputs otherwise (a token
    classifier's tags, labels shifted by one) keeps both tensors, as every row of a batch without a mask token.
    ``restores`` True (the collator says its labels restore the tokens, :func:`labels_restore`): every row is keyed by
    them, however few positions a small batch's draw replaced; False: none is."""
    if not isinstance(batch, Mapping) or restores is False:
        return None
    ids, labels = batch.get("input_ids"), batch.get("labels")
    if not (torch.is_tensor(ids) and torch.is_tensor(labels)) or ids.shape != labels.shape or ids.ndim != 2:
        return None
    if ids.is_floating_point() or labels.is_floating_point() or int(ids.shape[0]) != n:
        return None
    ids, labels = ids.detach().cpu().long(), labels.detach().cpu().long()
    supervised = labels != -100
    replaced = supervised & (ids != labels)
    per_row = replaced.any(dim=1)
    whole = [restores is True or not bool(r) for r in per_row]
    if restores is None and bool(per_row.any()):
        values, counts = torch.unique(ids[replaced], return_counts=True)
        mask_id = values[int(counts.argmax())]
        collator = (
            2 * int(counts.max()) > int(replaced.sum())
            and not bool((ids[~supervised] == mask_id).any())
            and not bool((labels[supervised] == mask_id).any())
        )
        if collator:
            whole = [True] * n
    return torch.where(supervised, labels, ids), whole


@dataclass
class Trajectory:
    steps: list[StepRecord] = field(default_factory=list)
    #: per step, a digest of the model's parameters after it (for bitwise comparisons)
    digests: list[tuple[int, float]] = field(default_factory=list)
    #: optimizer.step() and lr_scheduler.step() calls, in order ("opt" / "sched")
    calls: list[str] = field(default_factory=list)
    notes: dict[str, Any] = field(default_factory=dict)

    def losses(self) -> list[tuple[int, float]]:
        return [(s.step, s.loss) for s in self.steps if s.loss is not None]

    def record(self, step: int) -> StepRecord:
        if not self.steps or self.steps[-1].step != step:
            self.steps.append(StepRecord(step))
        return self.steps[-1]


#: elements a fingerprint or a norm reads at a time: a float64 copy of this many, not of a whole tensor, is
#: alive at once (a tensor this small is read in one piece, as before)
CHUNK = 1 << 20


def _chunks(t: torch.Tensor) -> tuple[torch.Tensor, ...]:
    flat = t.detach().reshape(-1)
    return tuple(flat.split(CHUNK)) if flat.numel() > CHUNK else (flat,)


def _finite(t: torch.Tensor) -> bool:
    return all(bool(torch.isfinite(c).all()) for c in _chunks(t))


def digest(model: Any) -> float:
    """A fingerprint of the trained weights (the parameters that require grad; all when none do): a frozen
    tensor a load added (a PEFT adapter loaded under another name) does not make two equal runs differ."""
    params = [p for p in model.parameters() if p.requires_grad] or list(model.parameters())
    with torch.no_grad():
        parts = []
        for p in params:
            for c in _chunks(p):
                d = c.double()
                parts.append(d.sum() + d.abs().sum() * 1e-3)
        return float(sum(parts))


def grad_report(params: list[tuple[str, torch.Tensor]]) -> tuple[float, list[str]]:
    """Total gradient 2-norm and the names of parameters whose gradient holds NaN/Inf."""
    total, bad = 0.0, []
    for name, p in params:
        if p.grad is None:
            continue
        g = p.grad.detach()
        if not _finite(g):
            bad.append(name)
            continue
        total += float(sum(c.double().pow(2).sum() for c in _chunks(g)))
    return (math.inf if bad else math.sqrt(total)), bad


def nonfinite_params(params: list[tuple[str, torch.Tensor]]) -> list[str]:
    return [n for n, p in params if not _finite(p)]


def param_names(model: Any) -> dict[int, str]:
    return {id(p): n for n, p in model.named_parameters()}


def optimizer_params(optimizer: Any, names: dict[int, str]) -> list[tuple[str, torch.Tensor]]:
    return [(names.get(id(p), f"param{i}"), p) for g in optimizer.param_groups for i, p in enumerate(g["params"])]


def unwrap_prepared(obj: Any) -> Any:
    """The torch optimizer or LR scheduler inside what ``accelerator.prepare`` returned
    (``AcceleratedOptimizer.optimizer``, ``AcceleratedScheduler.scheduler``) or Lightning Fabric's ``setup``
    (``_FabricOptimizer``), else ``obj``. The wrappers
    step the inner object only when gradients are synchronised (the end of an accumulation), so the inner
    one's counters and hooks see the real steps."""
    kind = type(obj)
    if kind.__module__.startswith("accelerate.") and kind.__name__ in ("AcceleratedOptimizer", "AcceleratedScheduler"):
        return getattr(obj, "optimizer", None) or getattr(obj, "scheduler", None) or obj
    if kind.__module__.endswith("fabric.wrappers") and "_optimizer" in vars(obj):
        return vars(obj)["_optimizer"]  # Lightning Fabric's _FabricOptimizer (fabric.setup's optimizer)
    return obj


def scheduler_count(scheduler: Any) -> int | None:
    """How many times a torch LR scheduler has stepped (its own counter; nothing is patched on it, so its
    state_dict stays picklable)."""
    if scheduler is None:
        return None
    scheduler = unwrap_prepared(scheduler)
    count = getattr(scheduler, "_step_count", None)
    if count is None:
        count = getattr(scheduler, "last_epoch", None)
    return int(count) if isinstance(count, int) else None


def _real_lr(value: Any) -> bool:
    """Whether an LR is a real number (a complex one, or anything else, is not)."""
    if isinstance(value, torch.Tensor):
        return value.numel() == 1 and not value.is_complex()
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def scheduler_copy(sched: Any) -> Any | None:
    """A copy of an (unwrapped) LR scheduler to probe its plan on: the copy shares the parameters and the
    optimizer-state tensors (nothing trains, only the copy's optimizer LRs move); None when it cannot be made."""
    opt = sched.optimizer
    memo: dict[int, Any] = {}
    for g in getattr(opt, "param_groups", None) or []:
        for p in g.get("params", []):
            memo[id(p)] = p
    for st in getattr(opt, "state", {}).values():
        for t in st.values() if isinstance(st, Mapping) else ():
            if isinstance(t, torch.Tensor):
                memo[id(t)] = t
    try:
        return copy.deepcopy(sched, memo)
    except Exception:  # noqa: BLE001 - a scheduler that cannot be copied is not probed
        return None


def schedule_plan(scheduler: Any, limit: int) -> tuple[int, str] | None:
    """Where the user's LR schedule ends, probed on a copy of it: ``(n, why)`` when stepping it ``n + 1``
    more times from where it stands leaves its domain (its step raises, as OneCycleLR's does past
    ``total_steps``, or its LR is no real number, as ``(1 - x / total) ** 0.9`` past ``total``), so that the
    user's own run, planned for that schedule, makes at most ``n`` more scheduler steps; None when it stays
    defined for ``limit`` steps or cannot be probed (no torch LR scheduler, ReduceLROnPlateau, a copy that
    cannot be made). The copy shares the parameters and optimizer state (nothing is trained): only its LRs
    move. A non-finite LR is not an end of the plan: that is a defect the smoke checks report."""
    sched = unwrap_prepared(scheduler)
    opt = getattr(sched, "optimizer", None)
    if sched is None or opt is None or not hasattr(sched, "last_epoch") or type(sched).__name__ == "ReduceLROnPlateau":
        return None
    groups = getattr(opt, "param_groups", None)
    if not groups or not all(_real_lr(g.get("lr")) for g in groups):
        return None  # not a plan that is defined where it stands
    probe = scheduler_copy(sched)
    if probe is None:  # a scheduler that cannot be copied is not probed (the run is as before)
        return None
    import warnings

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        for k in range(1, limit + 1):
            try:
                probe.step()
            except Exception as exc:  # noqa: BLE001 - the user's schedule raising past its end is the probe's answer
                text = " ".join(str(exc).split())[:160]
                return k - 1, f"its step {k} raises {type(exc).__name__}: {text}"
            bad = [g.get("lr") for g in probe.optimizer.param_groups if not _real_lr(g.get("lr"))]
            if bad:
                shown = f"{complex(bad[0]):.3g}" if isinstance(bad[0], complex) else repr(bad[0])
                return k - 1, f"stepped {k} times, its LR is {shown}, not a real number"
    return None


class PreClipNorms:
    """The gradient norm as the backward leaves it, before the user's step clips it: each parameter's
    squared norm is taken when its gradient is accumulated (``register_post_accumulate_grad_hook``, kept as
    a tensor: no synchronisation), so it does not matter how the step clips (``clip_grad_norm_``,
    ``accelerator.clip_grad_norm_``, ``clip_grad_value_``, a hand-written rule) or whether it does. Under
    gradient accumulation the last backward's value is the accumulated gradient's. A loss scaled by a
    GradScaler is unscaled with ``loss_scale()`` (the scale the backward used)."""

    def __init__(self, params: list[tuple[str, torch.Tensor]], loss_scale: Callable[[], float | None] | None = None):
        self.params = params
        self.loss_scale = loss_scale
        self.squares: dict[int, torch.Tensor] = {}
        #: the tensors whose gradient was exactly 0 at the first reading (by id), their part of the last norm, and
        #: how many tensors had a gradient at that reading
        self.late: set[int] | None = None
        self.late_norm: float | None = None
        self.counted = 0
        self.handles = [
            p.register_post_accumulate_grad_hook(self._accumulated)
            for _, p in params
            if p.requires_grad and hasattr(p, "register_post_accumulate_grad_hook")
        ]

    def _accumulated(self, p: torch.Tensor) -> None:
        if p.grad is not None:
            with torch.no_grad():
                self.squares[id(p)] = sum(c.double().pow(2).sum() for c in _chunks(p.grad))

    def take(self) -> float | None:
        """The total norm of the gradients the optimizer is about to apply, as the backward left them (None
        when a gradient of theirs did not come from a backward this watch saw); forgotten once read."""
        squares, self.squares = self.squares, {}
        with_grad = [p for _, p in self.params if p.grad is not None]
        if not with_grad or any(id(p) not in squares for p in with_grad):
            return None
        total = math.sqrt(float(sum(squares[id(p)] for p in with_grad)))
        scale = self.loss_scale() if self.loss_scale is not None else None
        if self.late is None and math.isfinite(total) and total > 0:
            self.late = {id(p) for p in with_grad if float(squares[id(p)]) == 0}  # once: a sync per tensor
            self.counted = len(with_grad)
        self.late_norm = None
        if self.late:
            late = [squares[id(p)] for p in with_grad if id(p) in self.late]
            self.late_norm = math.sqrt(float(sum(late))) if late else 0.0
            self.late_norm = self.late_norm / scale if scale else self.late_norm
        return total / scale if scale else total

    def remove(self) -> None:
        for h in self.handles:
            h.remove()


def loss_scale_of(state: Mapping[str, Any] | None) -> Callable[[], float | None] | None:
    """How to read the loss scale of a GradScaler in a training state (an entry, or an Accelerator's
    ``scaler``), or None when it holds none."""
    scalers = []
    for value in (state or {}).values():
        for obj in (value, getattr(value, "scaler", None)):
            if isinstance(obj, torch.amp.GradScaler) and obj not in scalers:
                scalers.append(obj)
    if not scalers:
        return None
    scaler = scalers[0]
    return lambda: float(scaler.get_scale()) if scaler.is_enabled() else None


def watch_optimizer(
    optimizer: Any,
    names: dict[int, str],
    traj: Trajectory,
    step_of: Callable[[], int],
    loss_scale: Callable[[], float | None] | None = None,
) -> Callable[[], None]:
    """Record, at every optimizer step, the gradient norm (before the step's clipping: :class:`PreClipNorms`;
    the norm at the step too, in ``clipped_norm``, when they differ; only the norm at the step, in ``step_norm``,
    when the one before clipping is not known), non-finite gradients and parameters,
    the LR, and the optimizer steps in ``traj.calls``. Returns the function that removes the watch."""
    optimizer = unwrap_prepared(optimizer)
    params = optimizer_params(optimizer, names)
    before_clip = PreClipNorms(params, loss_scale)
    #: the step now running was given a closure: its gradients are read once the step has run it
    closure_step = {"on": False}

    def read(rec: Any) -> None:
        """The gradients the step applies, as they are now; a step at which no parameter has a gradient records no
        norm (a norm of 0 is one that was measured)."""
        at_step, rec.nonfinite_grads = grad_report(params)
        backward = before_clip.take()
        if not any(p.grad is not None for _, p in params):
            traj.notes["no_grad_steps"] = traj.notes.get("no_grad_steps", 0) + 1
            return
        if backward is None:
            # a gradient that came from no backward this watch saw: whether the step clipped before this is not known
            rec.step_norm = at_step
            traj.notes.setdefault(
                "step_norm_why", "a gradient at optimizer.step() came from no backward the smoke run watched"
            )
        else:
            rec.grad_norm = at_step
            if before_clip.late:
                rec.late_norm = before_clip.late_norm
                traj.notes["late_tensors"] = (len(before_clip.late), before_clip.counted)
            if math.isfinite(at_step) and math.isfinite(backward):
                if abs(backward - at_step) > 1e-3 * max(backward, at_step):
                    rec.grad_norm, rec.clipped_norm = backward, at_step

    def pre(opt, args, kwargs):
        rec = traj.record(step_of())
        rec.lr = float(opt.param_groups[0]["lr"])
        # optimizer.step(closure): the closure computes the loss and its gradients inside the step (Lightning Fabric's
        # and LBFGS's way), so the gradients there now are an earlier step's, or none after its zero_grad()
        given = args[1:] if args and args[0] is opt else args  # torch hands the hooks step's args with self first
        closure_step["on"] = callable(kwargs.get("closure", given[0] if given else None))
        if not closure_step["on"]:
            read(rec)

    def post(opt, args, kwargs):
        traj.calls.append("opt")
        if closure_step["on"]:
            # read before the user's zero_grad(), which may follow the step: the step does not change .grad
            closure_step["on"] = False
            read(traj.record(step_of()))
        bad = nonfinite_params(params)
        if bad:
            traj.record(step_of()).nonfinite_params = bad

    handles = [optimizer.register_step_pre_hook(pre), optimizer.register_step_post_hook(post)]

    def undo() -> None:
        for h in handles:
            h.remove()
        before_clip.remove()

    return undo


def _marks(params: list[tuple[str, torch.Tensor]]) -> list[float]:
    """A fingerprint of each parameter (its sum and a share of its absolute sum, in float64, read in one transfer):
    a call that changes a parameter changes its mark."""
    with torch.no_grad():
        parts = []
        for _, p in params:
            d = [c.double() for c in _chunks(p)]
            parts.append(sum(c.sum() + c.abs().sum() * 1e-3 for c in d).to("cpu"))
        return torch.stack(parts).tolist() if parts else []


class UpdateWatch:
    """The updates of a step that changes the weights itself, with no optimizer object in the training state (a
    hand-written SGD ``p.data.add_(p.grad, alpha=-lr)``, a meta-learning inner loop, teaching code): an update is a
    call of the step after which a parameter of the model changed (a fingerprint of each parameter, taken between
    calls). The gradients it applies are read as the backward leaves them (each parameter's when it is accumulated:
    ``register_post_accumulate_grad_hook``), before any clipping of the step's and before the update, whatever the
    step zeroes afterwards; under an accumulation over several calls, the last backward's is the accumulated one. The
    norm left in ``.grad`` once the step returns, when lower (a clip) and not zeroed, is ``clipped_norm``."""

    def __init__(self, model: Any, traj: Trajectory):
        self.traj = traj
        self.params = [(n, p) for n, p in model.named_parameters() if p.requires_grad] or list(model.named_parameters())
        #: per parameter (by id): its squared gradient norm at the last backward that reached it, and its name when
        #: that gradient held NaN/Inf
        self.squares: dict[int, torch.Tensor] = {}
        self.bad: dict[int, str] = {}
        self.names = {id(p): n for n, p in self.params}
        self.handles = [
            p.register_post_accumulate_grad_hook(self._accumulated)
            for _, p in self.params
            if p.requires_grad and hasattr(p, "register_post_accumulate_grad_hook")
        ]
        self.marks = _marks(self.params)
        traj.notes["own_updates"] = True

    def _accumulated(self, p: torch.Tensor) -> None:
        if p.grad is None:
            return
        with torch.no_grad():
            self.squares[id(p)] = sum(c.double().pow(2).sum() for c in _chunks(p.grad))
        if not _finite(p.grad):
            self.bad[id(p)] = self.names.get(id(p), "a parameter")
        else:
            self.bad.pop(id(p), None)

    def after(self, step: int) -> bool:
        """After a call of the step (record ``step``): whether it updated the weights; an update is recorded as the
        optimizer steps are (``traj.calls`` "opt", the gradient norm and non-finite names on its record)."""
        marks = _marks(self.params)
        updated = marks != self.marks
        self.marks = marks
        if not updated:
            return False
        traj = self.traj
        traj.calls.append("opt")
        rec = traj.record(step)
        rec.update = True
        squares, self.squares = self.squares, {}
        bad, self.bad = self.bad, {}
        at_end, rec.nonfinite_grads = grad_report(self.params)
        if squares:
            rec.nonfinite_grads = list(bad.values())
            total = math.sqrt(float(sum(squares.values())))
            rec.grad_norm = math.inf if bad or not math.isfinite(total) else total
            if math.isfinite(rec.grad_norm) and math.isfinite(at_end) and 0 < at_end < rec.grad_norm * (1 - 1e-3):
                rec.clipped_norm = at_end  # .grad left lower than the backward made it (clipped), not zeroed
        elif any(p.grad is not None for _, p in self.params):
            # gradients the run saw no backward make (torch.autograd.grad written into .grad): as the step left them
            rec.step_norm = at_end
            traj.notes.setdefault(
                "step_norm_why",
                "the step's gradients came from no backward the smoke run watched (read after the step)",
            )
        else:
            traj.notes["no_grad_steps"] = traj.notes.get("no_grad_steps", 0) + 1
        bad_params = nonfinite_params(self.params)
        if bad_params:
            rec.nonfinite_params = bad_params
        return True

    def remove(self) -> None:
        for h in self.handles:
            h.remove()


# --------------------------------------------------------------------------------------------------
# the fresh objects a check trains


@dataclass
class Fresh:
    """Fresh objects at the initial state: the model, how the user's training computes its loss on a
    batch, and a factory of a fresh optimizer (and scheduler) for this model."""

    model: Any
    loss: Callable[[Any], torch.Tensor]
    make_optimizer: Callable[[], tuple[Any, Any]]
    #: what produced them (a cloned trainer, a module copy, a loop state), kept alive with them
    owner: Any = None
    #: why the loss on a batch is constant in the weights by construction, or None (a trainer that generates its
    #: completions: every group's rewards equal, so every advantage is 0)
    why_constant: Callable[[Any], str | None] | None = None

    def forward(self, batch: Any) -> Any:
        return model_call(self.model, to_device(batch, device_of(self.model)))()


def base_lr(optimizer: Any) -> None:
    """Put every param group at its base LR (a scheduler built on it may have moved it, e.g. a warmup
    that starts at 0)."""
    for g in optimizer.param_groups:
        if "initial_lr" in g:
            g["lr"] = g["initial_lr"]


# --------------------------------------------------------------------------------------------------
# EMAs of the model (T12, C1, DF2): torch's AveragedModel, diffusers' EMAModel, timm's ModelEma*, or a
# module kept under a name like "ema"


def ema_kind(obj: Any, name: str = "") -> str | None:
    """What kind of EMA ``obj`` is ("AveragedModel", "EMAModel", "ModelEmaV2", "module"), or None. A plain
    module counts only under a name like ``ema`` / ``model_ema`` / ``ema_model``."""
    kind = type(obj)
    if kind.__name__ == "AveragedModel" and kind.__module__.startswith("torch.optim"):
        return "AveragedModel"
    if isinstance(getattr(obj, "shadow_params", None), list) and hasattr(obj, "optimization_step"):
        return "EMAModel"
    if kind.__name__.startswith("ModelEma") and kind.__module__.startswith("timm."):
        return kind.__name__
    words = [w for w in name.lower().replace(".", "_").split("_") if w]
    if isinstance(obj, torch.nn.Module) and "ema" in words:
        return "module"
    return None


def find_emas(holder: Any) -> list[tuple[str, Any]]:
    """(name, EMA) for every EMA held by a training state: the entries of a plain loop's state dict, or the
    attributes of a LightningModule (the first element of a tuple ``owner``)."""
    if isinstance(holder, tuple) and holder:
        holder = holder[0]
    if isinstance(holder, Mapping):
        items = [(str(k), v) for k, v in holder.items()]
    elif isinstance(holder, torch.nn.Module):
        items = list(vars(holder).items()) + list(holder._modules.items())
    else:
        return []
    seen: set[int] = set()
    found = []
    for name, value in items:
        if value is None or id(value) in seen or name.startswith("__"):
            continue
        if ema_kind(value, name) is not None:
            seen.add(id(value))
            found.append((name, value))
    return found


def averaged_module(ema: Any) -> Any:
    """The module an EMA that is no module itself keeps its averaged weights in (timm's ``ModelEma``, a plain
    object holding ``self.ema = deepcopy(model)``): its one attribute that is a ``torch.nn.Module``; else ``ema``."""
    if isinstance(ema, torch.nn.Module) or isinstance(getattr(ema, "shadow_params", None), list):
        return ema
    modules = [v for v in vars(ema).values() if isinstance(v, torch.nn.Module)] if hasattr(ema, "__dict__") else []
    return modules[0] if len(modules) == 1 else ema


def ema_tensors(ema: Any) -> tuple[list[Any], Any, str]:
    """(the EMA's tensors, the EMA module if it is one, a description) for diffusers EMAModel, torch
    AveragedModel, or a module kept as an EMA copy."""
    if isinstance(getattr(ema, "shadow_params", None), list):
        step = getattr(ema, "optimization_step", "?")
        return list(ema.shadow_params), None, f"EMAModel (decay {getattr(ema, 'decay', '?')}, optimization_step {step})"
    held = averaged_module(ema)
    if held is not ema:
        return list(held.parameters()), held, f"{type(ema).__name__} of {type(held).__name__}"
    if isinstance(ema, torch.nn.Module):
        inner = getattr(ema, "module", None)
        if type(ema).__name__ == "AveragedModel" and isinstance(inner, torch.nn.Module):
            return list(inner.parameters()), inner, f"AveragedModel of {type(inner).__name__}"
        return list(ema.parameters()), ema, f"{type(ema).__name__} module"
    return [], None, type(ema).__name__


def ema_counter(ema: Any) -> tuple[str, int] | None:
    """(name, value) of the EMA's update counter: AveragedModel's ``n_averaged``, EMAModel's
    ``optimization_step``, timm's ``updates``; None when it keeps none."""
    for attr in ("n_averaged", "optimization_step", "updates", "num_updates"):
        value = getattr(ema, attr, None)
        if isinstance(value, torch.Tensor) and value.numel() == 1:
            return attr, int(value)
        if isinstance(value, int) and not isinstance(value, bool):
            return attr, value
    return None


def ema_decay(ema: Any) -> float | None:
    """The EMA's decay: an attribute (EMAModel, timm), or the ``decay`` an AveragedModel's averaging
    function closes over (``get_ema_multi_avg_fn(decay)``)."""
    value = getattr(ema, "decay", None)
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        return float(value)
    for fn in (getattr(ema, "multi_avg_fn", None), getattr(ema, "avg_fn", None)):
        if fn is None:
            continue
        try:
            value = inspect.getclosurevars(inspect.unwrap(fn)).nonlocals.get("decay")  # under @torch.no_grad()
        except (TypeError, ValueError):
            continue
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            return float(value)
    return None


def ema_describe(name: str, ema: Any) -> str:
    """``state['ema'] (AveragedModel of MLP, decay 0.999)`` for evidence lines (``name`` as given)."""
    _, _, what = ema_tensors(ema)
    kind = ema_kind(ema, name)
    if kind == "EMAModel":
        what = "diffusers EMAModel"
    decay = ema_decay(ema)
    return f"{name} ({what}" + (f", decay {decay:g}" if decay is not None and kind != "module" else "") + ")"


def ema_state(ema: Any) -> dict[str, torch.Tensor]:
    """The EMA's averaged tensors by name, copied: an EMA module's state dict (an AveragedModel's holds
    ``n_averaged``), an EMAModel's ``shadow_params[i]``."""
    with torch.no_grad():
        if isinstance(getattr(ema, "shadow_params", None), list):
            return {f"shadow_params[{i}]": t.detach().clone() for i, t in enumerate(ema.shadow_params)}
        ema = averaged_module(ema)
        if isinstance(ema, torch.nn.Module):
            return {k: v.detach().clone() for k, v in ema.state_dict().items()}
    return {}


COUNTERS = ("n_averaged", "optimization_step")


def ema_difference(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> tuple[str, float, float, int, int] | None:
    """(the first averaged tensor that differs, its max abs difference, the largest over the averaged
    tensors, how many tensors differ, how many compared) between two :func:`ema_state` copies, or None when
    they are equal bit for bit. Counters (an AveragedModel's ``n_averaged``) come last and are left out of
    the largest difference (the evidence shows them apart)."""
    order = {k: i for i, k in enumerate([*a, *(k for k in b if k not in a)])}
    names = sorted(order, key=lambda k: (k in COUNTERS, order[k]))
    differ = []
    for k in names:
        x, y = a.get(k), b.get(k)
        if x is None or y is None or x.shape != y.shape:
            differ.append((k, math.inf))
        elif not torch.equal(x, y):
            differ.append((k, float((x.double() - y.double()).abs().max()) if x.numel() else 0.0))
    if not differ:
        return None
    averaged = [d for k, d in differ if k not in COUNTERS] or [d for _, d in differ]
    return differ[0][0], differ[0][1], max(averaged), len(differ), len(names)


class OnDisk:
    """A piece of the saved training state written to ``file`` (loaded when a diagnosis puts it back)."""

    def __init__(self, file: Path, key: str):
        self.file, self.key = file, key

    def load(self) -> Any:
        return torch.load(self.file, weights_only=False)[self.key]


def state_tensors(state: Mapping[str, Any]) -> list[torch.Tensor]:
    """The tensors of a training state's modules (parameters and buffers) and of its EMAModels (shadow
    parameters), each once: what :func:`offload_tensors` writes to disk and empties."""
    found: dict[int, torch.Tensor] = {}
    for obj in state.values():
        if isinstance(obj, torch.nn.Module):
            named: list[Any] = [*obj.parameters(), *obj.buffers()]
        elif isinstance(getattr(obj, "shadow_params", None), list):  # diffusers' EMAModel
            named = list(obj.shadow_params)
        else:
            continue
        for t in named:
            if torch.is_tensor(t):
                found.setdefault(id(t), t)
    return list(found.values())


def release_training_memory(state: dict[str, Any], keep: frozenset[int] = frozenset()) -> None:
    """After the shared smoke run its checks read the trajectory, the trained weights and the optimizer's
    settings only: drop the gradients and the optimizer's moments (two copies of the weights under Adam),
    which would otherwise stay alive for the whole session. The tensors whose ids are in ``keep`` are the
    user's own (a frozen module the factory hands to every state it builds): their gradients stay."""
    for obj in state.values():
        if isinstance(obj, torch.nn.Module):
            for p in obj.parameters():
                if id(p) not in keep:
                    p.grad = None
        inner = unwrap_prepared(obj)
        if isinstance(inner, torch.optim.Optimizer):
            inner.state.clear()


def _holds_weights(obj: Any) -> bool:
    """A piece of a training state whose tensors :func:`offload_tensors` moves to disk, or that refers to
    them (an optimizer, an LR scheduler): copied when the state is read back, the others are shared."""
    inner = unwrap_prepared(obj)
    return (
        isinstance(obj, torch.nn.Module)
        or isinstance(getattr(obj, "shadow_params", None), list)
        or (isinstance(inner, torch.optim.Optimizer) or isinstance(inner, torch.optim.lr_scheduler.LRScheduler))
    )


def offload_tensors(
    state: dict[str, Any], file: Path, keep: frozenset[int] = frozenset()
) -> Callable[[], dict[str, Any]] | None:
    """Write the tensors of ``state``'s modules (parameters and buffers, each once; an EMAModel's shadow
    parameters) to ``file`` and empty them in place: the objects stay, with their classes, settings and
    counters, the optimizer's parameter groups (the parameters' dtypes), only the numbers leave memory.
    Returns how to read the state back into new objects (a copy of the emptied modules, optimizer and
    scheduler, their tensors loaded from ``file``; the state's other entries shared), or None, with
    ``state`` left as it was, when that cannot be done. The tensors whose ids are in ``keep`` are the user's
    own, not the run's (a frozen module the factory hands to every state it builds): they are neither written
    nor emptied, and the states read back share them (a module all of whose tensors are kept, itself)."""
    tensors: dict[str, torch.Tensor] = {}
    seen: set[int] = set(keep)
    for key, obj in state.items():
        if isinstance(obj, torch.nn.Module):
            named = [*obj.named_parameters(), *obj.named_buffers()]
        elif isinstance(getattr(obj, "shadow_params", None), list):  # diffusers' EMAModel
            named = list(enumerate(obj.shadow_params))
        else:
            continue
        for name, t in named:
            if torch.is_tensor(t) and id(t) not in seen:
                seen.add(id(t))
                tensors[f"{key}.{name}"] = t

    kept_tensors = {id(t): t for t in state_tensors(state) if id(t) in keep}
    kept_modules = {
        id(m): m
        for obj in state.values()
        if isinstance(obj, torch.nn.Module)
        for m in obj.modules()
        if all(id(t) in kept_tensors for t in (*m.parameters(), *m.buffers()))
        and any(True for _ in (*m.parameters(), *m.buffers()))
    }

    def shared() -> dict[int, Any]:
        return {
            **kept_tensors,
            **kept_modules,
            **{id(v): v for v in state.values() if not _holds_weights(v) or id(v) in kept_modules},
        }

    def read_back() -> dict[str, Any]:
        memo = shared()
        copied = copy.deepcopy(state, memo)
        saved = torch.load(file, weights_only=True)
        for name, t in tensors.items():
            memo[id(t)].data = saved[name]
        return copied

    if not tensors:
        return None
    try:
        torch.save({name: t.detach() for name, t in tensors.items()}, file)
    except Exception:  # noqa: BLE001 - a tensor torch.save cannot write: the state stays in memory
        return None
    emptied = []
    try:
        for t in tensors.values():
            kept = t.data
            t.data = torch.empty(0, dtype=t.dtype, device=t.device)
            emptied.append((t, kept))
        memo = shared()
        copy.deepcopy(state, memo)  # the pieces can be copied (no lock, no open handle), every tensor with them
        if any(id(t) not in memo for t in tensors.values()):
            raise LookupError("a tensor outside the copied pieces")
    except Exception:  # noqa: BLE001 - keep the trained state in memory, as it was
        for t, kept in emptied:
            t.data = kept
        return None
    return read_back
