"""``--dlcheck-twin``: the checks that run or train the model use a tiny twin of it — the same architecture
built from the user's config with few, narrow layers — instead of the real weights.

What a twin keeps: the model class, the vocabulary (``vocab_size``), the special token ids, the positions
(``max_position_embeddings``, the rope settings), the attention heads' divisibility (query heads a multiple
of the key/value heads, an even head dimension), the tied embeddings, and for multimodal configs the same
shrinking of each sub-config. What it drops: depth (two layers), width (64 hidden), the pretrained weights.
The user's tokenizer, processor, data and collator are untouched.

A twin is built once per real model (from a fixed seed, so that every run starting from it starts from the
same weights) and copied for each training run. A model whose class cannot be rebuilt from its config
(a plain ``torch.nn.Module``) has no automatic twin: the user gives one with the ``dlcheck_twin_model``
fixture (a small model of the same architecture, or a callable returning one).

Each check says in its registration (``twin=``) whether its verdict carries over from a twin (wiring, masking,
invariances, resume, schedules: the default) or needs the real weights (the initial loss of a pretrained
model, an fp16 overflow, the scale of a pretrained tower's features); the latter are "not applicable with
--dlcheck-twin"."""

from __future__ import annotations

import copy
import weakref
from typing import Any

#: set for the session by the plugin (``--dlcheck-twin`` / ini ``dlcheck_twin``)
ACTIVE = False
#: the user's dlcheck_twin_model, when given (a module, or a callable returning one)
USER_TWIN: Any = None

#: checks that relate the model's parameters to the user's other objects (optimizer groups, stage set-ups,
#: a reference model, an EMA) by identity: they read the real model (no pass through it), never a twin
REAL_OBJECTS = frozenset({"X1", "X3", "R2", "DF2"})

LAYERS = 2
HIDDEN = 64
HEADS = 4

_TWINS: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()
_BY_ID: dict[int, Any] = {}

# config attributes by role, in the spellings transformers' architectures use
_LAYER_KEYS = ("num_hidden_layers", "n_layer", "num_layers", "n_layers")
_HIDDEN_KEYS = ("hidden_size", "n_embd", "d_model", "dim")
_HEAD_KEYS = ("num_attention_heads", "n_head", "num_heads", "n_heads")
_KV_KEYS = ("num_key_value_heads", "multi_query_group_num")
_FFN_KEYS = ("intermediate_size", "n_inner", "ffn_dim", "d_ff", "hidden_dim")
_SUB_CONFIGS = ("text_config", "vision_config", "audio_config")


def shrink_config(config: Any) -> Any:
    """A copy of a transformers config with two layers and 64 hidden units (heads, key/value heads and the
    feed-forward width scaled to fit), every sub-config shrunk the same way; vocabulary, special tokens and
    positions kept."""
    cfg = copy.deepcopy(config)
    _shrink_one(cfg)
    for name in _SUB_CONFIGS:
        sub = getattr(cfg, name, None)
        if sub is not None and hasattr(sub, "to_dict"):
            _shrink_one(sub)
    # a LLaVA-style projector reads the vision tower's feature layer: keep it inside the shrunk tower
    layer = getattr(cfg, "vision_feature_layer", None)
    vision = getattr(cfg, "vision_config", None)
    if isinstance(layer, int) and vision is not None:
        cfg.vision_feature_layer = max(-LAYERS, min(layer, LAYERS - 1))
    return cfg


def _first_key(cfg: Any, keys: tuple[str, ...]) -> str | None:
    return next((k for k in keys if isinstance(getattr(cfg, k, None), int)), None)


def _shrink_one(cfg: Any) -> None:
    layers = _first_key(cfg, _LAYER_KEYS)
    if layers is not None:
        setattr(cfg, layers, min(getattr(cfg, layers), LAYERS))
    for name in ("layer_types",):  # per-layer lists must match the new depth
        value = getattr(cfg, name, None)
        if isinstance(value, list) and layers is not None:
            setattr(cfg, name, value[: getattr(cfg, layers)])
    hidden_key, heads_key = _first_key(cfg, _HIDDEN_KEYS), _first_key(cfg, _HEAD_KEYS)
    if hidden_key is None:
        return
    hidden = getattr(cfg, hidden_key)
    if hidden <= HIDDEN:
        return
    heads = getattr(cfg, heads_key) if heads_key else 1
    kv_key = _first_key(cfg, _KV_KEYS)
    kv = getattr(cfg, kv_key) if kv_key else heads
    group = max(heads // max(kv, 1), 1)
    new_kv = max(1, min(kv, HEADS // group if group <= HEADS else 1))
    new_heads = new_kv * group if group <= HEADS else group
    head_dim = max(HIDDEN // new_heads, 8)
    head_dim += head_dim % 2  # rotary embeddings rotate pairs
    setattr(cfg, hidden_key, head_dim * new_heads)
    if heads_key:
        setattr(cfg, heads_key, new_heads)
    if kv_key:
        setattr(cfg, kv_key, new_kv)
    if isinstance(getattr(cfg, "head_dim", None), int):
        cfg.head_dim = head_dim
    ffn_key = _first_key(cfg, _FFN_KEYS)
    if ffn_key:
        setattr(cfg, ffn_key, 4 * head_dim * new_heads)
    for name in ("moe_intermediate_size", "shared_expert_intermediate_size"):
        if isinstance(getattr(cfg, name, None), int):
            setattr(cfg, name, 2 * head_dim * new_heads)
    for name in ("num_experts", "num_local_experts"):
        if isinstance(getattr(cfg, name, None), int) and getattr(cfg, name) > 4:
            setattr(cfg, name, 4)
    if isinstance(getattr(cfg, "num_experts_per_tok", None), int):
        cfg.num_experts_per_tok = min(cfg.num_experts_per_tok, 2)


def _diffusers_twin(model: Any) -> Any:
    """A diffusers UNet/VAE from its config with two narrow blocks of the same kinds: channels and the
    cross-attention width (the text encoder's) kept where the data depend on them."""
    config = dict(model.config)
    blocks = config.get("down_block_types")
    if blocks is None:
        return None
    n = min(len(blocks), 2)
    config["down_block_types"] = tuple(blocks[:n])
    if config.get("up_block_types"):
        config["up_block_types"] = tuple(config["up_block_types"][-n:])
    config["block_out_channels"] = tuple(32 * (i + 1) for i in range(n))
    config["layers_per_block"] = 1
    if "norm_num_groups" in config:
        config["norm_num_groups"] = 8
    for key in ("attention_head_dim", "num_attention_heads"):
        value = config.get(key)
        if isinstance(value, (list, tuple)):
            config[key] = tuple(value[:n])
        elif isinstance(value, int) and key == "attention_head_dim":
            config[key] = 8
    if isinstance(config.get("transformer_layers_per_block"), (list, tuple)):
        config["transformer_layers_per_block"] = 1
    config = {k: v for k, v in config.items() if not k.startswith("_")}
    return type(model).from_config(config)


def build(model: Any) -> Any:
    """A fresh tiny twin of ``model`` (weights from a fixed seed), or None when its class cannot be rebuilt
    from its config and the user gave no dlcheck_twin_model."""
    import torch

    from .guard import preserved_rng

    if USER_TWIN is not None:
        made = USER_TWIN() if callable(USER_TWIN) and not isinstance(USER_TWIN, torch.nn.Module) else USER_TWIN
        return copy.deepcopy(made)
    config = getattr(model, "config", None)
    if config is None:
        return None
    with preserved_rng():
        torch.manual_seed(0)
        if hasattr(config, "to_dict") and hasattr(type(model), "_from_config"):
            twin = type(model)._from_config(shrink_config(config))
        elif hasattr(type(model), "from_config"):
            twin = _diffusers_twin(model)
        else:
            return None
    if twin is None:
        return None
    dtype = next((p.dtype for p in model.parameters() if p.is_floating_point()), None)
    device = next((p.device for p in model.parameters()), None)
    if device is not None and device.type == "meta":
        device = torch.device("cpu")  # a model built with empty weights: its twin gets real ones
    if dtype is not None and device is not None:
        twin = twin.to(device=device, dtype=dtype)
    twin.train(model.training)
    twin._dlcheck_twin = True  # copies keep it: the cost counter names the twin's passes as such
    for p, real in zip(twin.parameters(), _matching(model, twin)):
        if real is not None:
            p.requires_grad_(real.requires_grad)
    generation = getattr(model, "generation_config", None)
    if generation is not None and hasattr(twin, "generation_config"):
        twin.generation_config = copy.deepcopy(generation)
    return twin


def _matching(model: Any, twin: Any) -> list[Any]:
    """For each twin parameter, the real one of the same name (the twin's layers are a prefix of the real
    ones), or None."""
    real = dict(model.named_parameters())
    return [real.get(name) for name, _ in twin.named_parameters()]


def twin_of(model: Any) -> Any:
    """The session's twin of ``model`` (built once), or ``model`` itself when twins are off or it has none."""
    if not ACTIVE or model is None:
        return model
    try:
        hit = _TWINS.get(model)
    except TypeError:
        hit = _BY_ID.get(id(model))
    if hit is None:
        if any(model is t for t in _TWINS.values()):
            return model  # already a twin
        hit = build(model)
        if hit is None:
            return model
        try:
            _TWINS[model] = hit
        except TypeError:
            _BY_ID[id(model)] = hit
    return hit


def is_twin(model: Any) -> bool:
    return any(model is t for t in _TWINS.values())


def reset() -> None:
    _TWINS.clear()
    _BY_ID.clear()
