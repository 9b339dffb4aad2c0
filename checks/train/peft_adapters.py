"""T13: what a PEFT model trains: which module types the adapter covers in which layers, and base weights left
trainable beside it."""

from __future__ import annotations

import re
from typing import Any

import torch

from ...registry import check
from ...training import find_setup, fresh_probe

LAYER = re.compile(r"\.(\d+)(?:\.|$)")


def _model(dlcheck) -> tuple[Any, str]:
    setup = find_setup(dlcheck)
    if setup is not None:
        fresh = fresh_probe(dlcheck, setup)
        return fresh.model, f"the model of {setup.describe()}"
    model = dlcheck.require("model")[0]
    return model, "dlcheck_model"


def _peft_model(model: Any) -> bool:
    """Whether ``model`` is a ``peft.PeftModel``, read from its classes: peft is not imported for it (an
    import of peft, transformers and the rest, a few hundred MiB, for a model that cannot be one)."""
    return any(c.__name__ == "PeftModel" and c.__module__.startswith("peft.") for c in type(model).__mro__)


def _tuner_layers(model: Any) -> list[Any]:
    """The PEFT tuner layers (``peft.tuners.lora.LoraLayer`` and its siblings) inside ``model``, read from their
    classes as :func:`_peft_model` reads the wrapper's: adapters injected into a plain module without a PeftModel
    wrapper (peft's ``inject_adapter_in_model``, diffusers' and transformers' ``model.add_adapter(LoraConfig(...))``)."""
    return [
        m
        for m in model.modules()
        if any(c.__name__ == "BaseTunerLayer" and c.__module__.startswith("peft.") for c in type(m).__mro__)
    ]


def _active(model: Any, layers: list[Any] | None = None) -> str:
    active = getattr(model, "active_adapters", None)
    if isinstance(active, (list, tuple)) and active:
        return str(active[0])
    for layer in layers or ():  # injected adapters: the tuner layers know which is active
        active = getattr(layer, "active_adapters", None)
        if isinstance(active, (list, tuple)) and active:
            return str(active[0])
    return str(getattr(model, "active_adapter", "default"))


def _base_model(model: Any) -> Any:
    """The model the adapter was injected into: a PeftModel's base model, or the plain module itself."""
    return model.get_base_model() if _peft_model(model) else model


def split_parameters(model: Any, adapter: str) -> dict[str, list[tuple[str, torch.nn.Parameter]]]:
    """The PeftModel's parameters by what they are: ``adapter`` (the tuner layers' own tensors: lora_A/B,
    trainable-token deltas, prompt encoders), ``saved`` (the copies ``modules_to_save`` trains) and ``base``."""
    from peft.tuners.tuners_utils import BaseTunerLayer

    adapter_names: set[str] = {"prompt_encoder"}
    for module in model.modules():
        if isinstance(module, BaseTunerLayer):
            adapter_names.update(getattr(module, "adapter_layer_names", ()))
    out: dict[str, list[tuple[str, torch.nn.Parameter]]] = {"adapter": [], "saved": [], "base": []}
    for name, p in model.named_parameters():
        parts = name.split(".")
        if "modules_to_save" in parts:
            out["saved"].append((name, p))
        elif adapter_names.intersection(parts):
            out["adapter"].append((name, p))
        else:
            out["base"].append((name, p))
    return out


def adapted_modules(model: Any, adapter: str) -> list[str]:
    """Names (in the base model) of the modules the adapter's target_modules turned into tuner layers (the
    trainable-token wrappers of ``trainable_token_indices`` are not among them)."""
    from peft.tuners.tuners_utils import BaseTunerLayer

    found = []
    for name, module in _base_model(model).named_modules():
        if not isinstance(module, BaseTunerLayer) or "TrainableTokens" in type(module).__name__:
            continue
        holders = [getattr(module, attr, None) for attr in getattr(module, "adapter_layer_names", ())]
        if any(hasattr(h, "keys") and adapter in h.keys() for h in holders):
            found.append(name)
    return found


def layer_of(name: str) -> int | None:
    m = LAYER.search(name)
    return int(m.group(1)) if m else None


def coverage(model: Any, adapted: list[str]) -> dict[str, tuple[set[int], set[int]]]:
    """Per module type (the last part of a module's name, e.g. q_proj): (layers that have it, layers where the
    adapter covers it), for the linear / conv / embedding leaf modules that sit in numbered layers."""
    from peft.tuners.tuners_utils import BaseTunerLayer

    adapted_set = set(adapted)
    types: dict[str, tuple[set[int], set[int]]] = {}
    for name, module in _base_model(model).named_modules():
        layer = layer_of(name)
        if layer is None or name.endswith(".base_layer") or ".base_layer." in name:
            continue
        is_leaf_kind = isinstance(module, BaseTunerLayer) or isinstance(
            module, (torch.nn.Linear, torch.nn.Embedding, torch.nn.Conv1d, torch.nn.Conv2d)
        )
        if not is_leaf_kind or "." not in name or ".lora_" in name or ".modules_to_save" in name:
            continue
        kind = name.rsplit(".", 1)[1]
        if kind.isdigit() or kind in ("original_module", "token_adapter"):
            continue
        have, covered = types.setdefault(kind, (set(), set()))
        have.add(layer)
        if name in adapted_set:
            covered.add(layer)
    return types


def _layers(indices: set[int]) -> str:
    s = sorted(indices)
    return ", ".join(map(str, s[:8])) + (" …" if len(s) > 8 else "")


def _unmatched_targets(model: Any, targets: Any) -> list[tuple[str, str | None]]:
    """The plain-name entries of ``target_modules`` that match no module of the model as PEFT matches a name (the
    module's path, or its end after a dot), each with the module name it is a near miss of (the same name once
    stripped of punctuation and spaces, or one character-level close match), or None. A regular expression (a str
    target_modules) is not read."""
    import difflib

    if isinstance(targets, str) or not targets:
        return []
    paths = [n for n, _ in model.named_modules() if n]
    leaves = sorted({n.rsplit(".", 1)[-1] for n in paths})
    out = []
    for t in sorted(targets, key=str):  # a set in the config: its order is the hash seed's
        if not isinstance(t, str) or any(n == t or n.endswith("." + t) for n in paths):
            continue
        stripped = re.sub(r"[^\w.]", "", t).strip(".")
        near = stripped if stripped != t and stripped in leaves else None
        if near is None:
            close = difflib.get_close_matches(t, leaves, n=1, cutoff=0.85)
            near = close[0] if close else None
        out.append((t, near))
    return out


@check(
    "T13",
    domain="train",
    title="LoRA adapts what you think / base left unfrozen",
    optional_roles=("trainer", "lightning_module", "make_training", "model"),
)
def check_peft_adapters(dlcheck):
    """A PEFT model trains its adapter (and modules_to_save), in every layer its target_modules name, and nothing else.

    What it does
        For a ``peft.PeftModel`` (a fresh one from your training set-up, or dlcheck_model) reads the active
        adapter's config and its tuner layers, and reports per module type how many layers the adapter covers
        (``q_proj: 2 of 2 layers, v_proj: 2 of 2``, and the linear types it leaves alone). It fails when a base
        weight — neither an adapter tensor, nor a ``modules_to_save`` copy, nor (with ``bias="all"`` /
        ``"lora_only"``) a bias — requires gradients, and when a module type the adapter covers is covered in
        only some of the layers that have it although ``target_modules`` were plain names and neither
        ``layers_to_transform`` nor ``exclude_modules`` is set, and when a ``target_modules`` name matches no
        module while it is a near miss of one (``'q_proj,'``, ``'q_porj'``): PEFT drops an entry that matches
        nothing as long as another entry matches.
    Why it is bad
        ``get_peft_model`` freezes the base; a later ``for p in model.parameters(): p.requires_grad = True`` (or
        ``model.requires_grad_(True)``) turns the "LoRA" run into a full fine-tune: optimizer state for every
        weight, and ``save_pretrained`` keeps only the adapter, so the base's updates are thrown away at the
        end. An adapter missing from some layers (a full module path copied into target_modules, a layer
        replaced after ``get_peft_model``) trains a fraction of what the config says, silently.
    Example
        model = get_peft_model(base, LoraConfig(target_modules=["q_proj", "v_proj"]))
        for p in model.parameters(): p.requires_grad = True
        LoraConfig(target_modules=["model.layers.0.self_attn.q_proj", "v_proj"])   # q_proj in layer 0 only
    Use instead
        leave requires_grad as get_peft_model sets it (``model.print_trainable_parameters()``); to train a base
        module, list it in ``LoraConfig(modules_to_save=[...])``. Name module types in ``target_modules``
        (``["q_proj", "v_proj"]``) and choose layers with ``layers_to_transform=[...]`` when you mean to.
    Known problems
        Layers are told apart by the first number in a module's path (``layers.3.``): a model that numbers
        something else first is grouped by that number. A regular-expression ``target_modules``, or
        ``layers_to_transform`` / ``exclude_modules``, may select some layers on purpose: coverage is then
        reported, not judged. Only the active adapter is read.
        Adapters injected into a plain module without the PeftModel wrapper (diffusers' or transformers'
        ``model.add_adapter(LoraConfig(...))``, peft's ``inject_adapter_in_model``; found blind on diffusers'
        train_text_to_image_lora.py) are read from their tuner layers (``LoraLayer``) and the module's
        ``peft_config``, and judged the same way.
    Not applicable
        A model that is neither a ``peft.PeftModel`` nor holds PEFT tuner layers (a full fine-tune).
    """
    model, where = _model(dlcheck)
    wrapped = _peft_model(model)
    layers = [] if wrapped else _tuner_layers(model)
    if not wrapped and not layers:
        dlcheck.not_applicable(
            f"{where} is a {type(model).__name__}, not a peft.PeftModel, and holds no PEFT adapter layers "
            "(none injected by add_adapter / inject_adapter_in_model): no adapter to read"
        )
    adapter = _active(model, layers)
    configs = getattr(model, "peft_config", None)
    config = configs.get(adapter) if isinstance(configs, dict) else None
    kind = str(getattr(getattr(config, "peft_type", None), "value", getattr(config, "peft_type", "PEFT")))
    if not wrapped:  # the adapter injected into the plain module: said where the evidence names the kind
        kind += f" injected into the {type(model).__name__} without a PeftModel wrapper"
    parts = split_parameters(model, adapter)
    bias_mode = str(getattr(config, "bias", "none"))
    base_trainable = [
        (n, p) for n, p in parts["base"] if p.requires_grad and not (bias_mode != "none" and n.endswith(".bias"))
    ]
    base_values = sum(p.numel() for _, p in parts["base"])
    adapter_trainable = [(n, p) for n, p in parts["adapter"] + parts["saved"] if p.requires_grad]
    adapter_values = sum(p.numel() for _, p in adapter_trainable)

    setter = "get_peft_model" if wrapped else "add_adapter / inject_adapter_in_model"
    made_by = "get_peft_model" if wrapped else "the adapter was added (add_adapter / inject_adapter_in_model)"
    if base_trainable:
        values = sum(p.numel() for _, p in base_trainable)
        shown = ", ".join(n for n, _ in base_trainable[:5]) + (" …" if len(base_trainable) > 5 else "")
        dlcheck.fail(
            [
                f"{len(base_trainable)} of {len(parts['base'])} base-model parameter tensors of {where} ({kind}, "
                f"adapter {adapter!r}) require gradients: {values:,} of {base_values:,} base values "
                f"({values / max(1, base_values):.1%}), beside {adapter_values:,} adapter values",
                f"trainable base tensors: {shown}",
                "they are neither adapter tensors nor modules_to_save copies: get_peft_model_state_dict / "
                "save_pretrained does not save them",
            ],
            cause=f"the base model was unfrozen after {made_by} (for p in model.parameters(): p.requires_grad = "
            "True, model.requires_grad_(True), or an optimizer/freeze helper that re-enables everything): the LoRA "
            "run is a full fine-tune whose base updates are lost when the adapter is saved",
            fix=f"leave requires_grad as {setter} sets it"
            + (" (check with model.print_trainable_parameters())" if wrapped else "")
            + "; to train a base module on purpose, list it in LoraConfig(modules_to_save=[...]) so it is trained "
            "and saved",
        )

    targets = getattr(config, "target_modules", None)
    if not targets and not getattr(config, "target_parameters", None):
        dlcheck.measured(
            f"{where} ({kind}, adapter {adapter!r}): {len(adapter_trainable)} adapter tensors ({adapter_values:,} "
            f"values) train, no base weight requires gradients ({len(parts['base'])} frozen tensors)",
            adapter_tensors=len(adapter_trainable),
            base_trainable=0,
        )
        return
    adapted = adapted_modules(model, adapter)
    types = coverage(model, adapted)
    covered_types = {k: v for k, v in types.items() if v[1]}
    partial = {k: v for k, v in covered_types.items() if v[1] != v[0]}
    on_purpose = (
        isinstance(targets, str)
        and targets != "all-linear"
        or getattr(config, "layers_to_transform", None) is not None
        or bool(getattr(config, "exclude_modules", None))
    )
    per_type = ", ".join(f"{k}: {len(c)} of {len(h)} layers" for k, (h, c) in sorted(covered_types.items()))
    untouched = sorted(k for k, v in types.items() if not v[1] and k != "embed_tokens")
    targets_text = repr(targets if isinstance(targets, str) else sorted(targets))
    if partial and not on_purpose:
        evidence = [
            f"{k}: adapted in {len(c)} of the {len(h)} layers that have it (layers {_layers(c)}; not in "
            f"{_layers(h - c)})"
            for k, (h, c) in sorted(partial.items())
        ]
        evidence.append(
            f"LoraConfig(target_modules={targets_text}) of adapter {adapter!r}, no layers_to_transform, no "
            "exclude_modules"
        )
        paths = [t for t in (targets if not isinstance(targets, str) else []) if LAYER.search("." + t)]
        if paths:
            evidence.append(f"target_modules entries that name one module by its full path: {', '.join(paths[:4])}")
            cause = (
                "a target_modules entry is a full module path (copied from print(model)): it matches that one layer, "
                "not the module type in every layer"
            )
        else:
            cause = (
                "target_modules names the module type, yet some layers carry no adapter: those layers were replaced "
                f"or re-created after {setter} (a layer swap, a re-loaded block) and lost their adapters"
            )
        first = sorted(partial)[0]
        dlcheck.fail(
            evidence,
            cause,
            fix=f"name the module type in target_modules (e.g. {first!r}), which matches it in every layer, and "
            f"change the model before {setter}, not after; to adapt some layers on purpose, say so with "
            "layers_to_transform=[...]",
        )
    unmatched = _unmatched_targets(model, targets)
    typos = [(t, near) for t, near in unmatched if near is not None]
    if typos:
        t, near = typos[0]
        dlcheck.fail(
            [
                f"target_modules entry {t!r} of adapter {adapter!r} matches no module of {where}: {near!r} does "
                f"(LoraConfig(target_modules={targets_text}))"
                + (f"; also matching nothing: {', '.join(repr(x) for x, _ in typos[1:4])}" if len(typos) > 1 else ""),
                f"adapted: {per_type or 'no module'}"
                + (f"; not adapted: {', '.join(untouched[:8])}" if untouched else ""),
            ],
            cause=f"{t!r} is {near!r} written with a typo or a separator left in it (a command-line list "
            "'\"q_proj\", \"v_proj\"' parsed into 'q_proj,' and 'v_proj'): PEFT raises only when no entry matches, so "
            f"an entry that matches nothing is dropped silently and {near} trains without an adapter",
            fix=f"target_modules=[{', '.join(repr(near if x == t else x) for x in sorted(targets))}] (write the list "
            "without separators inside the names; check with model.print_trainable_parameters())",
        )
    note = (
        f" (selected on purpose: {'layers_to_transform' if getattr(config, 'layers_to_transform', None) is not None else 'target_modules/exclude_modules'})"
        if partial
        else ""
    )
    if unmatched:
        note += f"; target_modules entries matching no module (another architecture's names?): {', '.join(repr(t) for t, _ in unmatched[:4])}"
    saved = sorted({n.split(".modules_to_save.")[0].rsplit(".", 1)[-1] for n, _ in parts["saved"]})
    dlcheck.measured(
        f"{where} ({kind}, adapter {adapter!r}, target_modules={targets_text}) adapts {per_type or 'no module'}{note}"
        + (f"; not adapted: {', '.join(untouched[:8])}" if untouched else ""),
        f"{len(adapter_trainable)} adapter/modules_to_save tensors train ({adapter_values:,} values"
        + (f"; modules_to_save: {', '.join(saved)}" if saved else "")
        + f"); none of the {len(parts['base'])} base tensors ({base_values:,} values) requires gradients",
        adapter_tensors=len(adapter_trainable),
        adapter_values=adapter_values,
        base_trainable=0,
        adapted_types=len(covered_types),
        partial_types=len(partial),
    )
