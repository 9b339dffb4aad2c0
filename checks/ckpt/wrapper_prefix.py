from __future__ import annotations

from typing import Any

from ...registry import check
from ...training import get_setup, memo_or_skip, strip_wrapper_prefix, unwrapped_keys


@check(
    "C18",
    domain="ckpt",
    title="saved state dict keys carry a module. / _orig_mod. wrapper prefix",
    roles=(),
    optional_roles=("trainer", "lightning_module", "make_training", "save_checkpoint"),
)
def check_wrapper_prefix(dlcheck):
    """The weights a checkpoint holds load strictly into the unwrapped model.

    What it does
        Saves fresh objects through your own path (``dlcheck_save_checkpoint``, the Trainer's
        ``save_model``, Lightning's ``ModelCheckpoint``), reads every state dict the files hold, finds the
        model's (the one that best matches the model's keys), and fails when its keys carry a wrapper
        segment — ``_orig_mod.`` from ``torch.compile``, ``module.`` from ``DistributedDataParallel`` /
        ``DataParallel`` — that the unwrapped model's keys do not have, listing the keys that would be
        missing and unexpected in a strict ``load_state_dict``.
    Why it is bad
        ``model.state_dict()`` of a compiled or DDP-wrapped model prefixes every key. Resuming into the
        same wrapper works, so the bug hides until the weights are loaded for inference, evaluation or
        fine-tuning into a plain model: a strict load raises on every key, and a ``strict=False`` load
        silently loads nothing and evaluates a random model.
    Example
        model = torch.compile(model)          # or DistributedDataParallel(model)
        torch.save({"model": model.state_dict()}, path)
    Use instead
        save the unwrapped module: ``model._orig_mod.state_dict()`` for torch.compile,
        ``model.module.state_dict()`` for DDP (or ``accelerator.unwrap_model(model)``); when loading old
        checkpoints, strip the prefix with
        ``torch.nn.modules.utils.consume_prefix_in_state_dict_if_present(sd, "module.")``.
    Known problems
        Reads torch and safetensors files. Only wrapper segments are judged: a checkpoint that lacks some
        weights altogether is not this check's business.
    Not applicable
        None: any checkpoint's weights may be loaded into the unwrapped model.
    """
    setup = get_setup(dlcheck)
    model, found, how = memo_or_skip(dlcheck, setup.sources, "ckpt:saved-state", setup.saved_state, spare=True)
    if not found:
        dlcheck.skip(f"{how} wrote no file holding a state dict that could be read")
    clean = unwrapped_keys(model)
    scored = []
    for where, sd in found:
        keys = set(sd)
        direct = len(keys & clean)
        mapped = {k: strip_wrapper_prefix(k, clean) for k in keys - clean}
        prefixed = {k: v for k, v in mapped.items() if v is not None}
        scored.append((direct + len(prefixed), where, keys, prefixed))
    score, where, keys, prefixed = max(scored, key=lambda t: t[0])
    if score < max(1, len(clean) // 2):
        dlcheck.skip(
            f"none of the state dicts {how} wrote matches the model's keys ({', '.join(w for _, w, _, _ in scored)})"
        )
    if not prefixed:
        direct = len(keys & clean)
        dlcheck.measured(
            f"the state dict at {where} (written by {how}): {direct} of its {len(keys)} keys are the unwrapped "
            f"{_inner_name(model)}'s own keys, none carries a module. / _orig_mod. wrapper segment",
            keys=len(keys),
            model_keys=direct,
            prefixed=0,
        )
        return
    example = min(prefixed.items())
    missing = sorted(clean - keys)
    segments = sorted({_segment(k, v) for k, v in prefixed.items()})
    wrapper = "torch.compile" if any("_orig_mod" in s for s in segments) else "DistributedDataParallel/DataParallel"
    evidence = [
        f"{len(prefixed)} of {len(keys)} keys of the state dict at {where} (written by {how}) carry a wrapper "
        f"segment: {example[0]!r} is {example[1]!r} in the unwrapped model",
        f"a strict load_state_dict into the unwrapped {_inner_name(model)} "
        f"would miss {len(missing)} keys (e.g. {missing[0]!r}) and reject {len(prefixed)} unexpected ones"
        if missing
        else f"a strict load into the unwrapped model rejects {len(prefixed)} unexpected keys",
    ]
    cause = (
        f"the state dict was taken from the {wrapper} wrapper, not from the model inside it: every key gains the "
        f"wrapper's segment ({', '.join(repr(s) for s in segments[:2])})"
    )
    fix = (
        "save the unwrapped module's state dict: model._orig_mod.state_dict() after torch.compile, "
        "model.module.state_dict() under DDP (or accelerator.unwrap_model(model).state_dict()); to read old "
        "checkpoints, torch.nn.modules.utils.consume_prefix_in_state_dict_if_present(state_dict, prefix)"
    )
    dlcheck.fail(evidence, cause, fix)


def _inner_name(model: Any) -> str:
    """The class name of the model inside its torch.compile / DDP / DataParallel wrappers."""
    for _ in range(4):
        inner = getattr(model, "_orig_mod", None)
        if inner is None and type(model).__name__ in ("DistributedDataParallel", "DataParallel"):
            inner = getattr(model, "module", None)
        if inner is None:
            break
        model = inner
    return type(model).__name__


def _segment(saved: str, clean: str) -> str:
    """The wrapper segment a saved key has and the clean key lacks (``_orig_mod.`` of a compiled submodule sits
    in the middle of the key: ``model._orig_mod.decoder.bias``)."""
    for attr in ("_orig_mod", "module"):
        if f".{attr}." in f".{saved}" and f".{attr}." not in f".{clean}":
            return attr + "."
    return saved.split(".")[0] + "."
