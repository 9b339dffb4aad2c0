"""L5: training context beyond the positions the model was built for (max_position_embeddings x rope
scaling), and rope settings that differ between the training model and the inference config."""

from __future__ import annotations

import json
import math
import os
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import pytest

from ...errors import MISSING
from ...guard import preserved_dataloader, preserved_rng
from ...registry import Setting, check
from ...sampling import get_sample
from ...session import user_call
from ..shared import lm
from ..shared.training_users import rl_agent_only
from .common import token_sample
from .padding_side import online_trainer

#: rope types that extend the context at inference time without fine-tuning (dynamic NTK, YaRN)
TRAINING_FREE = ("dynamic", "yarn")

#: tokenizers without a declared length carry this sentinel (int(1e30)) or other huge values
NO_LENGTH = 10**6


def _as_dict(cfg: Any) -> dict | None:
    """A config as a plain dict: a PretrainedConfig, a mapping, or a path to config.json / its folder."""
    if cfg is None or cfg is MISSING:
        return None
    if isinstance(cfg, (str, os.PathLike)):
        path = os.fspath(cfg)
        if os.path.isdir(path):
            path = os.path.join(path, "config.json")
        with open(path, encoding="utf-8") as fh:
            cfg = json.load(fh)
    if isinstance(cfg, Mapping):
        out = dict(cfg)
        text = out.get("text_config")
        return (
            dict(text)
            if isinstance(text, Mapping) and ("max_position_embeddings" in text or "rope_parameters" in text)
            else out
        )
    get_text = getattr(cfg, "get_text_config", None)
    if callable(get_text):
        try:
            cfg = get_text(decoder=True)
        except TypeError:
            cfg = get_text()
    out = {}
    for name in (
        "model_type",
        "max_position_embeddings",
        "n_positions",
        "n_ctx",
        "rope_parameters",
        "rope_scaling",
        "rope_theta",
        "position_embedding_type",
    ):
        value = getattr(cfg, name, None)
        if value is not None:
            out[name] = value
    return out


def rope_settings(cfg: dict) -> dict[str, Any]:
    """The rope settings of a config, flat and comparable: transformers 5 keeps them in ``rope_parameters``
    (``rope_theta`` inside it; ``rope_scaling`` is an alias), transformers 4 in ``rope_scaling`` +
    ``rope_theta``. Per-layer-type parameters (``{"full_attention": {...}}``) are prefixed by layer type."""
    params: dict[str, Any] = {}
    for key in ("rope_scaling", "rope_parameters"):  # v5 rope_parameters wins over a v4 rope_scaling
        value = cfg.get(key)
        if isinstance(value, Mapping):
            params.update(value)
    if "rope_theta" in cfg and cfg["rope_theta"] is not None:
        params.setdefault("rope_theta", cfg["rope_theta"])
    if params and all(isinstance(v, Mapping) for v in params.values()):
        flat = {}
        for layer_type, sub in params.items():
            for k, v in _normalized(dict(sub)).items():
                flat[f"{layer_type}.{k}"] = v
        return flat
    return _normalized(params)


def _normalized(params: dict) -> dict:
    if "type" in params:
        params.setdefault("rope_type", params.pop("type"))
    if params and "rope_type" not in params:
        params["rope_type"] = "default"
    return {
        k: (
            float(v)
            if isinstance(v, int) and not isinstance(v, bool) and k != "original_max_position_embeddings"
            else v
        )
        for k, v in params.items()
        if v is not None
    }


def max_positions(cfg: dict) -> int | None:
    for key in ("max_position_embeddings", "n_positions", "n_ctx"):
        value = cfg.get(key)
        if isinstance(value, int):
            return value
    return None


@dataclass
class Limit:
    positions: int
    how: str
    rope: bool


def position_limit(cfg: dict) -> Limit | None:
    """How many positions the model is configured for: max_position_embeddings, times the rope scaling
    factor when a scaling rope type is set (from original_max_position_embeddings when declared)."""
    mpe = max_positions(cfg)
    if mpe is None:
        return None
    rope = rope_settings(cfg)
    if not rope:
        kind = (
            "learned absolute position embeddings"
            if cfg.get("n_positions")
            or cfg.get("model_type") in ("gpt2", "opt", "gpt_neo", "gpt_bigcode", "bert", "roberta")
            else "no rope settings"
        )
        return Limit(mpe, f"max_position_embeddings {mpe} ({kind})", False)
    groups: dict[str, dict] = {}  # per layer type ("" when the parameters are global)
    for key, value in rope.items():
        prefix, _, name = key.rpartition(".")
        groups.setdefault(prefix, {})[name] = value
    return max((_rope_limit(mpe, params) for params in groups.values()), key=lambda lim: lim.positions)


def confirmed_by_modules(model: Any, limit: Limit) -> tuple[Limit | None, str | None]:
    """A config without rope settings declares a limit (``n_positions``, ``max_position_embeddings``) that
    only binds when the model really numbers positions: a learned table with that many rows (GPT-2's
    ``wpe``, BERT's ``position_embeddings``, OPT's table of N + 2 rows) or a rotary embedding whose
    settings the config leaves implicit. A model with neither (T5's relative-attention buckets, which
    t5-small's legacy ``n_positions`` 512 does not describe) has no position past which anything breaks:
    (None, why) then. Decided from the modules, not from the model's name."""
    import torch

    n = limit.positions
    words = lm.input_embeddings(model)
    for name, module in model.named_modules():
        if isinstance(module, torch.nn.Embedding) and module is not words and n <= module.num_embeddings <= n + 2:
            return Limit(
                n,
                f"{limit.how.split(' (')[0]} (learned absolute position embeddings: {name} has "
                f"{module.num_embeddings} rows)",
                False,
            ), None
    for name, module in model.named_modules():
        if "rotary" in type(module).__name__.lower():
            return Limit(n, f"{limit.how.split(' (')[0]} (rotary embeddings, {name})", True), None
    return None, (
        f"the config declares {n} positions, but {type(model).__name__} has no position table of that size and "
        "no rotary embedding (relative positions)"
    )


def _rope_limit(mpe: int, params: dict) -> Limit:
    rope_type = params.get("rope_type", "default")
    factor = params.get("factor")
    if rope_type != "default" and isinstance(factor, (int, float)) and factor > 0:
        orig = params.get("original_max_position_embeddings")
        scaled = int((orig or mpe) * factor)
        if scaled > mpe:
            base = f"original_max_position_embeddings {orig}" if orig else f"max_position_embeddings {mpe}"
            return Limit(scaled, f"{base} x rope factor {factor:g} ({rope_type})", True)
        return Limit(mpe, f"max_position_embeddings {mpe} (rope {rope_type}, factor {factor:g})", True)
    return Limit(mpe, f"max_position_embeddings {mpe} (rope_type {rope_type!r}, no scaling)", True)


#: the last name segment of a buffer that holds a rotary embedding's table or frequencies
ROTARY_BUFFERS = frozenset(
    {"cos", "sin", "cos_cached", "sin_cached", "inv_freq", "freqs_cis", "freqs_cos", "freqs_sin"}
)


def rotary_signs(model: Any) -> str | None:
    """Where a model without a declared position limit rotates its positions: a module whose class names a rotary
    embedding, or the buffers of a rotary table (``cos`` / ``sin``, ``inv_freq``, ``freqs_cis``); None when it
    holds neither (ALiBi, relative-attention buckets, no positions at all)."""
    import torch

    if not isinstance(model, torch.nn.Module):
        return None
    for name, module in model.named_modules():
        kind = type(module).__name__
        if "rotary" in kind.lower() or "rope" in kind.lower():
            return f"the rotary embedding {name or 'of the model'} ({kind})"
    found = [
        f"{name} {tuple(buf.shape)}"
        for name, buf in model.named_buffers()
        if buf is not None and name.rsplit(".", 1)[-1] in ROTARY_BUFFERS
    ]
    if found:
        return "rotary tables in its buffers: " + ", ".join(found[:4]) + (" …" if len(found) > 4 else "")
    return None


def _declared_lengths(dlcheck: Any) -> list[tuple[str, int]]:
    """Truncation/padding lengths the user set explicitly: the collator's max_length, a TRL config's
    max_length when it differs from the class default."""
    out = []
    args = dlcheck.role("training_args")
    value = getattr(args, "max_length", None) if args is not MISSING else None
    collator = dlcheck.role("collator")
    mine = getattr(collator, "max_length", None) if collator is not MISSING else None
    if isinstance(mine, int) and mine < NO_LENGTH and mine != value:  # TRL hands its config's max_length down
        out.append(("dlcheck_collator.max_length", mine))
    if isinstance(value, int) and value < NO_LENGTH:
        import dataclasses

        default = (
            next((f.default for f in dataclasses.fields(args) if f.name == "max_length"), None)
            if dataclasses.is_dataclass(args)
            else None
        )
        if value != default:
            out.append((f"{type(args).__name__}.max_length", value))
    return out


def _no_language_model(dlcheck: Any, model: Any) -> str | None:
    """Why a model without a config is no language model, from the objects: no tokenizer, no transformers/TRL
    Trainer (a Lightning Trainer may train anything), and an RL agent's training or batches whose inputs are no
    token ids (images, features, observations: floats); None when it may be one (a hand-written LM without a
    config: its batches hold integer token ids)."""
    from ...roles import is_hf_trainer

    trainer = dlcheck.role("trainer")
    # a transformers / TRL Trainer trains language models; a Lightning Trainer (a ResNet's LightningModule beside
    # it) tells nothing: the batches do
    if dlcheck.role("tokenizer") is not MISSING or (trainer is not MISSING and is_hf_trainer(trainer)):
        return None
    name = type(model).__name__
    agent = rl_agent_only(dlcheck, "llm")
    if agent:
        return f"{name} has no config, and {agent}"
    loader = dlcheck.role("dataloader")
    if loader is MISSING:
        return None
    try:
        batch = get_sample(dlcheck).batches[0]
    except (pytest.skip.Exception, IndexError):
        # the llm sample takes token mappings only: the loader's own first batch tells what its inputs are

        def first() -> Any:
            with preserved_rng(), preserved_dataloader(loader):
                it = user_call("dataloader", lambda: iter(loader))
                return user_call("dataloader", lambda it=it: next(it, None))

        try:
            batch = dlcheck.memo(loader, "llm:L5:first-batch", first)
        except Exception:  # noqa: BLE001 - a loader that cannot be drawn here: not known to be no LM
            return None
    if isinstance(batch, Mapping):
        if "input_ids" in batch:
            return None
        inputs = next((v for v in batch.values() if hasattr(v, "is_floating_point")), None)
    elif isinstance(batch, (list, tuple)) and batch:
        inputs = batch[0]
    else:
        inputs = batch
    if not hasattr(inputs, "is_floating_point") or not inputs.is_floating_point():
        return None
    return (
        f"{name} has no config and its training batches' inputs are floats ({inputs.dtype} "
        f"{tuple(inputs.shape)}), not token ids: it is no language model (L5 concerns a language model's positions)"
    )


def _measure(dlcheck: Any) -> tuple[int, lm.Row, str, str] | str:
    """(longest position used + 1, its row, how it was counted, sample source), or why not measured."""
    trainer_kind = online_trainer(dlcheck.role("trainer"))
    if trainer_kind:
        return f"{trainer_kind} builds its training batches inside the trainer"
    try:
        sample = token_sample(dlcheck)
    except pytest.skip.Exception as exc:
        return exc.msg
    best = None
    for row in lm.rows(sample.batches):
        content = row.content
        if not content:
            continue
        if row.position_ids is not None:
            n = max(row.position_ids[c] for c in content) + 1
            how = "largest position_id + 1"
        else:
            n = content[-1] + 1  # what the model numbers the last real token without position_ids
            how = "position of the last real token + 1" if content[0] > 0 else "tokens"
        if best is None or n > best[0]:
            best = (n, row, how)
    if best is None:
        return f"the batches of {sample.source} hold no real token"
    return best + (sample.source,)


def compare_rope(train: dict, infer: dict) -> tuple[list[str], str | None]:
    """(differences, why they are acceptable or None): rope settings and max positions, training vs
    inference."""
    a, b = rope_settings(train), rope_settings(infer)
    diffs = []
    for key in sorted(set(a) | set(b)):
        if a.get(key) != b.get(key):
            diffs.append(f"{key}: training {a.get(key, '(unset)')!r}, inference {b.get(key, '(unset)')!r}")
    ma, mb = max_positions(train), max_positions(infer)
    if ma != mb:
        diffs.append(f"max_position_embeddings: training {ma}, inference {mb}")
    if not diffs:
        return [], None
    type_a = {k: v for k, v in a.items() if k.endswith("rope_type")}
    type_b = {k: v for k, v in b.items() if k.endswith("rope_type")}
    theta_same = all(a.get(k) == b.get(k) for k in set(a) | set(b) if k.endswith("rope_theta"))
    if (
        type_a
        and all(v == "default" for v in type_a.values())
        and type_b
        and all(v in TRAINING_FREE for v in type_b.values())
        and theta_same
    ):
        return diffs, "the inference config adds a training-free context extension (dynamic NTK / YaRN)"
    if ma is not None and mb is not None and mb < ma and len(diffs) == 1 and a == b:
        return diffs, "the inference config only allows fewer positions"
    return diffs, None


@check(
    "L5",
    domain="llm",
    title="context past the trained positions, or rope mismatch",
    roles=("model",),
    optional_roles=("dataloader", "inference_config", "training_args", "tokenizer"),
    settings=(
        Setting(
            "check_declared_lengths",
            True,
            "also fail when a max_length the user set explicitly (the collator's, "
            "a TRL config's) exceeds the limit, before any long example is sampled",
        ),
    ),
)
def check_positions(dlcheck):
    """Training sequences fit the model's positions, and inference uses the training rope settings.

    What it does
        Reads the model's position limit: max_position_embeddings (n_positions for GPT-2), times the
        rope scaling factor when a scaling rope type (linear, dynamic, yarn, llama3, ...) is set, from
        original_max_position_embeddings when declared — transformers 5 keeps these in
        config.rope_parameters (rope_theta included; rope_scaling is an alias of it), transformers 4 in
        rope_scaling + rope_theta; both are read. Then (1) the longest sampled training sequence (the
        largest position_id + 1, or the position of the last real token + 1 when the model numbers
        positions itself) and every max_length the user set explicitly on the collator or the TRL
        config must not exceed that limit; (2) when `dlcheck_inference_config` is given (a
        PretrainedConfig, a config dict, or a path to config.json), its rope settings and
        max_position_embeddings must equal the training model's.
    Why it is bad
        Positions past max_position_embeddings were never seen in pretraining: rotary models degrade
        silently beyond them, and models with learned absolute positions (GPT-2) index past their
        table and crash. A model fine-tuned with rope scaling (linear factor 2, YaRN, ...) but served
        with another rope_type, factor or rope_theta sees every position rotated differently from
        training, which wrecks long and short contexts alike.
    Example
        config = LlamaConfig(max_position_embeddings=64, ...)
        tok(text, truncation=True, max_length=128)                # 128-token training rows
        ...
        train: rope_parameters={"rope_type": "linear", "factor": 2.0}; inference config.json: no scaling
    Use instead
        Truncate to the limit (tokenizer max_length / SFTConfig(max_length=...)), or extend the context
        on purpose: load the model with rope_parameters={"rope_type": "yarn", "factor": F,
        "original_max_position_embeddings": M, "rope_theta": ...} and fine-tune at that length; save
        and serve with the same config (model.config.save_pretrained).
    Known problems
        Needs a model config that declares its positions (ALiBi models without one are skipped); a rotary
        model whose config is its own class (no max_position_embeddings, no rope settings: a hand-written GPT
        with precomputed cos / sin tables) skips as not judged, its limit unread. Only
        the sampled rows and explicitly set lengths are measured: a rarer long example can still
        exceed the limit; tokenizer.model_max_length is shown but not judged (many tokenizers carry a
        wrong one). Adding dynamic NTK or YaRN only at inference is a training-free extension and
        passes. Without data and without an inference config the check skips.
    Not applicable
        Models whose config declares no position limit and that hold no rotary embedding (ALiBi, relative
        positions) when no dlcheck_inference_config is given: there is no limit to exceed and no rope to compare. A config
        without rope settings binds only when the model holds a learned position table of that size or a
        rotary embedding: T5's legacy n_positions (relative-attention buckets, no table) binds nothing.
        A model without a config that is no language model: no tokenizer, no transformers/TRL Trainer (a
        Lightning Trainer beside a ResNet's LightningModule tells nothing), and an RL agent's training or batches
        whose inputs are floats (images, features); a model without a config whose batches hold integer token
        ids skips instead.
    """
    model = dlcheck.require("model")[0]
    compiled = getattr(model, "_orig_mod", None)
    if getattr(model, "config", None) is None and compiled is not None:
        model = compiled  # torch.compile's wrapper: its module holds the config and the position table
    tok = dlcheck.role("tokenizer")
    train_cfg = _as_dict(getattr(model, "config", None))
    if train_cfg is None:
        other = _no_language_model(dlcheck, model)
        if other:
            dlcheck.not_applicable(other)
        dlcheck.skip(f"{type(model).__name__} has no config to read positions from")
    limit = position_limit(train_cfg)
    no_table = None
    if limit is not None and not limit.rope:
        limit, no_table = confirmed_by_modules(model, limit)
    evidence, causes, fixes, decided, reasons = [], [], [], False, []
    lines, numbers = [], {}  # what a pass measured

    # ---- (1) training lengths against the limit ---------------------------------------------------
    measured = _measure(dlcheck)
    if no_table is not None:
        reasons.append(no_table)
    elif limit is None:
        reasons.append(
            f"{train_cfg.get('model_type', type(model).__name__)} config declares no max_position_embeddings"
        )
    elif isinstance(measured, str):
        reasons.append(f"training data: {measured}")
    else:
        decided = True
        longest, row, how, source = measured
        declared = _declared_lengths(dlcheck) if dlcheck.setting("check_declared_lengths") else []
        over = [(name, n) for name, n in declared if n > limit.positions]
        lines.append(
            f"longest sampled training sequence: {longest} positions ({how}) <= {limit.positions} = {limit.how}; "
            f"source: {source}" + "".join(f"; {name} = {n} <= {limit.positions}" for name, n in declared)
        )
        numbers.update(longest=longest, position_limit=limit.positions, **{name: n for name, n in declared})
        if longest > limit.positions or over:
            if longest > limit.positions:
                evidence.append(
                    f"longest sampled training sequence: {longest} positions ({how}) > {limit.positions} "
                    f"= {limit.how}; source: {source}"
                )
                evidence.append(
                    f"example {row.batch}.{row.index}: "
                    f"{lm.decode(tok if tok is not MISSING else None, [row.input_ids[c] for c in row.content], 100)}"
                )
            for name, n in over:
                evidence.append(f"{name} = {n} > {limit.positions} = {limit.how} (longest sampled: {longest})")
            tml = lm.token_attr(tok, "model_max_length") if tok is not MISSING else None
            if isinstance(tml, int) and tml < NO_LENGTH:
                evidence.append(f"tokenizer.model_max_length = {tml}")
            what = (
                "training rows reach" if longest > limit.positions else "the configured training length lets rows reach"
            )
            if limit.rope:
                causes.append(
                    f"{what} past the {limit.positions} positions the model is configured for "
                    f"({limit.how}): rotary positions beyond them were never trained, and inference engines "
                    f"cap the context at the configured limit"
                )
                fixes.append(
                    f"truncate training rows to {limit.positions} tokens (tokenizer(..., truncation=True, "
                    f"max_length={limit.positions}) / SFTConfig(max_length={limit.positions})), or extend the "
                    f"context on purpose: load the model with rope_parameters={{'rope_type': 'yarn', 'factor': "
                    f"{math.ceil(max([longest] + [n for _, n in over]) / limit.positions)}, "
                    f"'original_max_position_embeddings': {limit.positions}}} (or 'linear') and train at that length"
                )
            else:
                causes.append(
                    f"{what} past the model's {limit.positions} learned position embeddings "
                    f"({limit.how}): positions beyond the table do not exist (the forward indexes past it)"
                )
                fixes.append(
                    f"truncate training rows to {limit.positions} tokens (tokenizer(..., truncation=True, "
                    f"max_length={limit.positions}) / SFTConfig(max_length={limit.positions}))"
                )

    # ---- (2) training vs inference rope settings --------------------------------------------------
    infer = dlcheck.role("inference_config")
    if infer is not MISSING:
        infer_cfg = dlcheck.call("inference_config", lambda: _as_dict(infer))
        decided = True
        diffs, ok = compare_rope(train_cfg, infer_cfg)
        if not diffs:
            settings = ", ".join(f"{k}={v!r}" for k, v in sorted(rope_settings(train_cfg).items()))
            lines.append(
                "rope settings and max_position_embeddings of dlcheck_inference_config equal the training model's"
                + (f" ({settings}, max_position_embeddings {max_positions(train_cfg)})" if settings else "")
            )
        elif ok is not None:
            lines.append(f"rope settings of dlcheck_inference_config differ acceptably, {ok}: {'; '.join(diffs)}")
        numbers.update(rope_differences=len(diffs))
        if diffs and ok is None:
            evidence.append(
                f"rope settings differ between the training model's config and dlcheck_inference_config "
                f"({len(diffs)} field{'s' if len(diffs) > 1 else ''}):"
            )
            evidence += [f"  {d}" for d in diffs]
            causes.append(
                "the model is served with other rope settings than it was trained with, so every position "
                "is rotated (or capped) differently at inference than in training"
            )
            fixes.append(
                "serve with the training config: model.config.save_pretrained(path) next to the weights and "
                "load the inference model from it (same rope_parameters incl. rope_type, factor, rope_theta, "
                "original_max_position_embeddings, and the same max_position_embeddings)"
            )
    else:
        reasons.append("no dlcheck_inference_config to compare rope settings with")

    if causes:
        dlcheck.fail(evidence, "; ".join(causes), "; ".join(fixes))
    if not decided:
        rotary = rotary_signs(model) if limit is None and no_table is None else None
        if rotary is not None and infer is MISSING:
            # rotary positions with no limit declared where L5 reads one (a model of the pipeline's own, its config
            # a class of its own): the check concerns it, but has nothing to compare with
            dlcheck.skip(
                f"not judged: {type(model).__name__} rotates positions ({rotary}), but its config "
                f"({type(getattr(model, 'config', None)).__name__}) declares no max_position_embeddings / n_positions "
                "and no rope settings: the position limit it was trained for cannot be read (a precomputed rotary "
                "table's length bounds the forward, not the length trained at), and there is no "
                "dlcheck_inference_config to compare rope settings with"
            )
        if limit is None and infer is MISSING:
            dlcheck.not_applicable(
                f"{reasons[0]}{'' if no_table else ' (ALiBi or relative positions)'}: no position limit to exceed "
                "and no rope settings to compare"
            )
        dlcheck.skip("; ".join(reasons))
    dlcheck.measured(*lines, *[f"not checked: {r}" for r in reasons], **numbers)
