"""L15: tokens added to the tokenizer (chat markers, tool tags) whose embedding rows stay at the value
``resize_token_embeddings`` gave them, because the embeddings are frozen (LoRA trains only its adapters)."""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

import torch

from ...errors import MISSING
from ...registry import Setting, check
from ..shared import lm
from .common import token_sample

#: config attributes naming a placeholder token whose embedding row is overwritten by another modality's features
PLACEHOLDER = re.compile(r"^(image|video|audio|vision|boi|eoi|speech)_token_(id|index)$")


def added_tokens(tok: Any) -> dict[int, str]:
    """The tokenizer's added tokens beyond its base vocabulary (``tokenizer.vocab_size``, the model vocabulary it
    was trained with): id -> text. Special tokens the base vocabulary already holds are not among them."""
    tok = lm.text_tokenizer(tok)
    try:
        base = int(tok.vocab_size)
        added = tok.get_added_vocab()
    except Exception:  # noqa: BLE001 - a tokenizer without the transformers API
        return {}
    return {int(i): str(t) for t, i in added.items() if int(i) >= base}


def placeholder_ids(model: Any) -> set[int]:
    """Image / video / audio placeholder ids the model config names: their rows are replaced by features."""
    out: set[int] = set()
    configs = [getattr(model, "config", None)]
    for sub in ("text_config", "vision_config", "audio_config"):
        configs.append(getattr(configs[0], sub, None))
    for config in configs:
        if config is None:
            continue
        for name, value in vars(config).items():
            if PLACEHOLDER.match(name) and isinstance(value, int):
                out.add(value)
    return out


def _table(module: Any) -> torch.Tensor | None:
    """The (vocabulary x dim) table of an embedding or output layer, PEFT wrappers included (the 2-D parameter
    with the most rows: the base layer's, not a trainable-token delta or a LoRA factor)."""
    tables = [p for p in module.parameters() if p.dim() == 2] if isinstance(module, torch.nn.Module) else []
    return max(tables, key=lambda p: p.shape[0]).detach() if tables else None


def row_gradient(module: Any, make_input: Any, ids: list[int], params: list[torch.Tensor], output_side: bool) -> dict:
    """For each id: whether some trainable parameter gets a non-zero gradient from that row of ``module`` — the
    input embedding called on the id, or the output layer's logit of the id for a fixed hidden state."""
    result = {}
    with torch.enable_grad():
        out = module(make_input())
    for k, i in enumerate(ids):
        value = out[0, i] if output_side else out[0, k]
        if not params or not value.requires_grad:
            result[i] = False
            continue
        grads = torch.autograd.grad(value.float().sum(), params, retain_graph=True, allow_unused=True)
        result[i] = any(g is not None and bool(g.any()) for g in grads)
    return result


@dataclass
class Initialised:
    """How far each new row is from the rows a resize leaves: the mean of the base rows, zero, another new row."""

    ratio: dict[int, float]  # distance to the nearest of those, over a base row's typical distance to the mean
    how: dict[int, str]
    typical: float


def freshness(weight: torch.Tensor, new: list[int], table_ids: set[int]) -> Initialised:
    rows = weight.shape[0]
    base = [i for i in range(rows) if i not in table_ids]
    step = max(1, len(base) // 4096)
    picked = torch.tensor(base[::step], device=weight.device)
    total = torch.zeros(weight.shape[1], dtype=torch.float64, device=weight.device)
    for start in range(0, len(base), 8192):  # the mean of every base row, in chunks (a 150k x 4096 table)
        chunk = torch.tensor(base[start : start + 8192], device=weight.device)
        total += weight[chunk].double().sum(0)
    mean = (total / max(1, len(base))).float()
    sample = weight[picked].float()
    typical = float((sample - mean).norm(dim=1).median())
    typical_norm = float(sample.norm(dim=1).median())
    vecs = weight[torch.tensor(new, device=weight.device)].float()
    ratio, how = {}, {}
    for k, i in enumerate(new):
        candidates = [
            (float((vecs[k] - mean).norm()) / max(typical, 1e-12), "the mean of the base rows"),
            (float(vecs[k].norm()) / max(typical_norm, 1e-12), "zero"),
        ]
        for j, other in enumerate(new):
            if j != k:
                candidates.append((float((vecs[k] - vecs[j]).norm()) / max(typical, 1e-12), f"the row of id {other}"))
        ratio[i], how[i] = min(candidates)
    return Initialised(ratio, how, typical)


def _names(model: Any, module: Any) -> str | None:
    for name, m in model.named_modules():
        if m is module:
            return name
    return None


def _tied(model: Any) -> bool:
    config = getattr(model, "config", None)
    if config is not None and hasattr(config, "get_text_config"):
        try:
            config = config.get_text_config()
        except Exception:  # noqa: BLE001 - a config that cannot split: read the top one
            pass
    return bool(getattr(config, "tie_word_embeddings", False))


def _show(tok: Any, ids: list[int], limit: int = 6) -> str:
    return ", ".join(f"{lm.token_text(tok, i)!r}(id {i})" for i in ids[:limit]) + (" …" if len(ids) > limit else "")


@check(
    "L15",
    domain="llm",
    title="new tokens added but their embeddings are neither trained nor saved",
    roles=("tokenizer",),
    optional_roles=("model", "dataloader"),
    settings=(
        Setting(
            "fresh_distance",
            0.05,
            "a new row closer than this fraction of a base row's typical distance to the mean (to the mean of the "
            "base rows, to zero, or to another new row) counts as never trained: resize_token_embeddings' mean "
            "initialisation lies ~1e-4 of it away, a trained row about 1",
        ),
    ),
)
def check_new_tokens(dlcheck):
    """Tokens added to the tokenizer and used in the data have embedding rows that train (and that the adapter saves).

    What it does
        Takes the tokenizer's added tokens beyond its base vocabulary (``get_added_vocab()`` entries with an id
        at or above ``tokenizer.vocab_size``; image/video/audio placeholders the model config names are left
        out), counts them in the sampled batches (attended input positions and supervised labels), and for those
        used asks autograd whether any trainable parameter gets a gradient from their row of
        ``model.get_input_embeddings()`` (and, for an untied ``lm_head``, from their logit). A frozen row is
        only a bug when it was never trained: it fails when the row still is what ``resize_token_embeddings``
        made it — the mean of the base rows (transformers' default), zero, or the same vector as another new
        token — measured as its distance over a base row's typical distance to the mean (``fresh_distance``).
        For a PeftModel the failure also lists what ``get_peft_model_state_dict`` would save.
    Why it is bad
        After ``tokenizer.add_special_tokens(...)`` and ``model.resize_token_embeddings(len(tokenizer))`` the
        new rows hold the mean embedding. ``get_peft_model`` freezes the embeddings and LoRA adapts only
        attention/MLP projections, so every new token (``<|im_start|>``, ``<|tool|>``, a pad used as content)
        reads the same untrained vector for the whole run; the model cannot tell them apart, an untied
        ``lm_head`` can barely emit them (the chat model never stops), and the saved adapter holds no row of
        them.
    Example
        tok.add_special_tokens({"additional_special_tokens": ["<|tool|>", "<|/tool|>"]})
        base.resize_token_embeddings(len(tok))
        model = get_peft_model(base, LoraConfig(target_modules=["q_proj", "v_proj"]))
    Use instead
        LoraConfig(..., trainable_token_indices={"embed_tokens": new_ids}) — PEFT's TrainableTokens trains and
        saves just those rows (the tied ``lm_head`` with them) — or ``modules_to_save=["embed_tokens",
        "lm_head"]`` (the whole matrices, trained and saved).
    Known problems
        Whether a frozen row was ever trained is read from its value: a new row initialised at random
        (``resize_token_embeddings(..., mean_resizing=False)``) looks like a trained row and is not failed, and a
        model built from a config with the tokens already in its vocabulary has no fresh rows. Tokens that
        occur only at padded positions (a new pad token) are harmless and pass. The base vocabulary is
        ``tokenizer.vocab_size``: a tokenizer that counts its added tokens in it shows none. A tokenizer without
        ``get_added_vocab()`` and ``vocab_size`` (a pipeline's own class around tiktoken or a BPE) is not judged:
        which of its tokens were added is not read, and the check skips saying so.
    Not applicable
        A tokenizer with no added token beyond its base vocabulary (every special token was in the vocabulary
        the tokenizer was trained with).
    """
    tok = dlcheck.role("tokenizer")
    text_tok = lm.text_tokenizer(tok)
    lacks = [
        name
        for name, present in (
            ("get_added_vocab()", callable(getattr(text_tok, "get_added_vocab", None))),
            ("vocab_size", getattr(text_tok, "vocab_size", None) is not None),
        )
        if not present
    ]
    if lacks:
        # a tokenizer of the pipeline's own (tiktoken, sentencepiece or BPE wrapped in a class): which of its tokens
        # were added beyond the vocabulary it was trained with is not told by any interface L15 can read
        dlcheck.skip(
            f"not judged: the tokenizer is a {type(text_tok).__name__} without {' and '.join(lacks)}, so which tokens "
            "were added beyond the vocabulary it was trained with cannot be read (L15 reads a transformers tokenizer's "
            "added vocabulary)"
        )
    added = added_tokens(tok)
    if not added:
        size = f" (len(tokenizer) = {len(text_tok)})" if hasattr(type(text_tok), "__len__") else ""
        dlcheck.not_applicable(
            f"the tokenizer has no added token beyond its base vocabulary of {text_tok.vocab_size}{size}"
        )
    model = dlcheck.role("model")
    if model is MISSING:
        dlcheck.skip(
            "missing role: define fixture dlcheck_model (or dlcheck_trainer / dlcheck_make_training) to read the "
            "embedding rows of the added tokens"
        )
    emb = lm.input_embeddings(model) if isinstance(model, torch.nn.Module) else None
    if emb is None:
        dlcheck.not_applicable(f"{type(model).__name__} exposes no input embeddings to read")
    in_weight = _table(emb)
    if in_weight is None:
        dlcheck.not_applicable(f"the input embeddings of {type(model).__name__} hold no embedding table")
    n_rows = in_weight.shape[0]
    placeholders = placeholder_ids(model)
    new = sorted(i for i in added if i < n_rows and i not in placeholders)
    if not new:
        dlcheck.not_applicable(
            f"the {len(added)} added token(s) are placeholders the model overwrites or have no embedding row "
            "(L3 reports those)"
        )

    sample = token_sample(dlcheck, predicts_tokens=False)
    rows = lm.rows(sample.batches)
    used: dict[int, int] = dict.fromkeys(new, 0)
    labelled: dict[int, int] = dict.fromkeys(new, 0)
    wanted = set(new)
    for row in rows:
        for p in row.content:
            if row.input_ids[p] in wanted:
                used[row.input_ids[p]] += 1
        for p in row.supervised:
            if row.labels[p] in wanted:
                labelled[row.labels[p]] += 1
    in_use = [i for i in new if used[i] or labelled[i]]
    listed = _show(tok, new)
    if not in_use:
        dlcheck.measured(
            f"{len(new)} added token(s) beyond the base vocabulary ({listed}) occur at no attended position and as "
            f"no label in {len(rows)} sampled rows: their embedding rows do not matter to this training",
            added=len(new),
            used=0,
        )
        return

    params = [p for p in model.parameters() if p.requires_grad]
    device = lm.model_device(model)
    ids_tensor = torch.tensor([in_use], device=device)
    trained_in = row_gradient(emb, lambda: ids_tensor, in_use, params, output_side=False)
    out_emb = model.get_output_embeddings() if hasattr(model, "get_output_embeddings") else None
    untied = out_emb is not None and not _tied(model)
    trained_out: dict[int, bool] = {}
    out_weight = _table(out_emb) if untied else None
    if out_weight is not None and out_weight.shape[0] != n_rows:
        out_weight = None
    if untied and out_weight is not None:
        gen = torch.Generator(device="cpu").manual_seed(0)
        hidden = torch.randn(1, out_weight.shape[1], generator=gen).to(device=device, dtype=out_weight.dtype)
        trained_out = row_gradient(out_emb, lambda: hidden, in_use, params, output_side=True)

    threshold = float(dlcheck.setting("fresh_distance"))
    frozen_in = [i for i in in_use if not trained_in[i]]
    fresh_in = freshness(in_weight, frozen_in, set(new)) if frozen_in and in_weight is not None else None
    bad_in = [i for i in frozen_in if fresh_in is not None and fresh_in.ratio[i] < threshold]
    frozen_out = [i for i in in_use if untied and not trained_out.get(i, True) and labelled[i]]
    fresh_out = freshness(out_weight, frozen_out, set(new)) if frozen_out and out_weight is not None else None
    bad_out = [i for i in frozen_out if fresh_out is not None and fresh_out.ratio[i] < threshold]
    counts = ", ".join(f"{lm.token_text(tok, i)!r} {used[i]}x in, {labelled[i]}x as label" for i in in_use[:6])
    is_peft = hasattr(model, "peft_config") and hasattr(model, "get_base_model")

    if bad_in or bad_out:
        bad = sorted(set(bad_in) | set(bad_out))
        emb_name = _names(model, emb) or "the input embeddings"
        out_name = _names(model, out_emb) if out_emb is not None else None
        evidence = [
            f"{len(new)} token(s) added beyond the tokenizer's base vocabulary of "
            f"{lm.text_tokenizer(tok).vocab_size}: {listed}",
            f"in {len(rows)} sampled rows: {counts}",
        ]
        if bad_in:
            f = fresh_in
            worst = max(f.ratio[i] for i in bad_in)
            evidence.append(
                f"input embedding rows of {_show(tok, bad_in)} get no gradient: no trainable parameter of "
                f"{type(model).__name__} depends on them ({type(emb).__name__} {emb_name}, frozen)"
            )
            evidence.append(
                f"and they were never trained: each lies at most {worst:.2g} x a base row's typical distance "
                f"({f.typical:.3g}) from {f.how[bad_in[0]]}, the value resize_token_embeddings gave it"
            )
        if bad_out:
            f = fresh_out
            evidence.append(
                f"the untied output layer {out_name}: the logit rows of {_show(tok, bad_out)} (supervised "
                f"{sum(labelled[i] for i in bad_out)}x) get no gradient and lie at most "
                f"{max(f.ratio[i] for i in bad_out):.2g} x the typical distance from {f.how[bad_out[0]]}: the "
                "model can hardly learn to emit them"
            )
        if is_peft:
            from peft import get_peft_model_state_dict

            state = get_peft_model_state_dict(model, save_embedding_layers=False)
            prefixes = [n + "." for n in (emb_name, out_name) if n]
            holding = [k for k in state if any(k.startswith(p) for p in prefixes)]
            evidence.append(
                f"the adapter's state (get_peft_model_state_dict) holds {len(state)} tensors, "
                + (f"{len(holding)} of the embeddings" if holding else "none of the embeddings")
                + ": a saved adapter carries no trained row of them"
            )
        short_in = (emb_name or "embed_tokens").rsplit(".", 1)[-1]
        short_out = (out_name or "lm_head").rsplit(".", 1)[-1]
        unmatched = _unmatched_modules_to_save(model) if is_peft else []
        for name, close in unmatched:
            evidence.append(
                f"modules_to_save names {name!r}, which matches no module of the model"
                + (f" (did you mean {close!r}?)" if close else "")
                + ": PEFT trains and saves nothing for it"
            )
        if is_peft:
            targets = {short_in: bad}
            if bad_out and untied:
                targets[short_out] = bad
            fix = (
                f"LoraConfig(..., trainable_token_indices={targets!r}) — PEFT's TrainableTokens trains and saves "
                f"just those rows — or LoraConfig(..., modules_to_save=[{short_in!r}, {short_out!r}]) to train and "
                "save the whole matrices"
            )
        else:
            fix = (
                "unfreeze the embedding rows of the added tokens (model.get_input_embeddings().weight.requires_grad_"
                "(True), and the untied output layer's), or build the model with a vocabulary that was trained"
            )
        typo = [(n, c) for n, c in unmatched if c in (short_in, short_out)]
        if typo:
            fix = f"name the module as the model does: modules_to_save=[..., {typo[0][1]!r}] (or {fix})"
        dlcheck.fail(
            evidence,
            cause=(
                f"modules_to_save lists {typo[0][0]!r}, a name no module has (the embedding is {typo[0][1]!r}), so "
                if typo
                else ""
            )
            + "the tokens were added and the embeddings resized (the new rows set to the mean of the old ones), "
            "but the embedding is frozen — LoRA trains only its adapters — so every new token reads the same "
            "untrained vector for the whole run, and no trained row of them is saved",
            fix=fix,
        )

    trained = [i for i in in_use if trained_in[i]]
    lines = [
        f"{len(in_use)} of {len(new)} added token(s) occur in {len(rows)} sampled rows ({counts})",
    ]
    if trained:
        lines.append(f"the embedding rows of {_show(tok, trained)} get a gradient from a trainable parameter")
    if frozen_in:
        ratios = ", ".join(f"{fresh_in.ratio[i]:.2g}" for i in frozen_in[:6]) if fresh_in else "?"
        lines.append(
            f"the rows of {_show(tok, frozen_in)} are frozen but not a fresh initialisation (distance {ratios} of "
            f"the typical, above {threshold}): taken as pretrained rows"
        )
    dlcheck.measured(*lines, added=len(new), used=len(in_use), trainable_rows=len(trained), frozen_rows=len(frozen_in))


def _unmatched_modules_to_save(model: Any) -> list[tuple[str, str | None]]:
    """The entries of the PEFT config's ``modules_to_save`` that name no module of the model (PEFT matches a
    module whose name ends with the entry), each with the closest module name, if one is close: a typo such as
    ``"embed_token"`` for ``embed_tokens`` trains nothing and says nothing."""
    import difflib

    configs = getattr(model, "peft_config", None) or {}
    wanted = [m for c in configs.values() for m in (getattr(c, "modules_to_save", None) or [])]
    if not wanted:
        return []
    names = [n for n, _ in model.get_base_model().named_modules() if n]
    shorts = sorted({n.rsplit(".", 1)[-1] for n in names if "modules_to_save" not in n and "original_module" not in n})
    out = []
    for entry in dict.fromkeys(wanted):
        if any(n == entry or n.endswith("." + entry) for n in names):
            continue
        close = difflib.get_close_matches(entry, shorts, n=1, cutoff=0.8)
        out.append((entry, close[0] if close else None))
    return out
