"""Shared measurement for causal-LM checks: reading rows out of a collated batch, decoding evidence,
and per-example losses computed once and reused. Imports torch; used only by the llm checks."""

from __future__ import annotations

import functools
import inspect
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import torch

from ...guard import eval_mode

IGNORE = -100


@dataclass
class Row:
    """One example of a collated batch, as python lists."""

    batch: int
    index: int
    input_ids: list[int]
    attention_mask: list[int] | None
    labels: list[int] | None
    position_ids: list[int] | None

    @property
    def content(self) -> list[int]:
        """Positions the attention mask marks as real (every position when there is no mask)."""
        if self.attention_mask is None:
            return list(range(len(self.input_ids)))
        return [i for i, m in enumerate(self.attention_mask) if m]

    @property
    def supervised(self) -> list[int]:
        return [] if self.labels is None else [i for i, lab in enumerate(self.labels) if lab != IGNORE]

    def documents(self) -> list[tuple[int, int]]:
        """(start, end) spans of the documents packed in this row: position_ids restart at 0."""
        if self.position_ids is None:
            return [(0, len(self.input_ids))]
        starts = [i for i, p in enumerate(self.position_ids) if p == 0] or [0]
        if starts[0] != 0:
            starts.insert(0, 0)
        return [(s, e) for s, e in zip(starts, starts[1:] + [len(self.input_ids)])]


def _tolist(value: Any, n: int) -> list[list[int]] | None:
    if value is None:
        return None
    if isinstance(value, torch.Tensor):
        if value.dim() == 1:
            value = value.unsqueeze(0)
        return value.tolist()
    if isinstance(value, (list, tuple)) and value and not isinstance(value[0], (list, tuple)):
        return [list(value)]
    return [list(v) for v in value]


def has_token_batches(batches: Sequence[dict]) -> bool:
    return bool(batches) and all("input_ids" in b for b in batches)


def sequence_labels(batch: Mapping[str, Any]) -> bool:
    """The batch's labels are one label (or one vector of labels) per sequence, not one per token: shape
    (batch,) beside (batch, positions) input_ids (a sequence classifier's class ids), or floats of another
    shape (multi-label targets, regression values)."""
    labels, ids = batch.get("labels"), batch.get("input_ids")
    if labels is None or ids is None:
        return False
    ids_t, labels_t = torch.as_tensor(ids), torch.as_tensor(labels)
    if ids_t.dim() != 2:
        return False
    if labels_t.dim() < ids_t.dim():
        return True
    return labels_t.is_floating_point() and labels_t.shape != ids_t.shape


def seq2seq_targets(batch: Mapping[str, Any]) -> bool:
    """The batch's labels are an encoder-decoder's targets: the batch carries the decoder's own inputs
    (``decoder_input_ids``), or (batch, length) labels of another length than its (batch, length) input_ids
    (DataCollatorForSeq2Seq pads them to the batch's longest target)."""
    labels, ids = batch.get("labels"), batch.get("input_ids")
    if labels is None or ids is None:
        return False
    if any(batch.get(k) is not None for k in DECODER_FIELDS):
        return True  # the decoder's own inputs beside them: the labels are its targets, whatever their length
    labels_t, ids_t = torch.as_tensor(labels), torch.as_tensor(ids)
    return labels_t.dim() == 2 and ids_t.dim() == 2 and labels_t.shape[1] != ids_t.shape[1]


#: fields of a batch that feed an encoder-decoder's decoder (DataCollatorForSeq2Seq(model=...) adds
#: decoder_input_ids): beside them, labels are the decoder's targets even when their length equals the encoder's
DECODER_FIELDS = ("decoder_input_ids", "decoder_attention_mask")


def rows(batches: Sequence[dict[str, Any]]) -> list[Row]:
    """Every example of the sampled batches as a :class:`Row` (``labels`` None when the batch's labels are
    one per sequence, not one per token: :func:`sequence_labels`)."""
    out = []
    for b, batch in enumerate(batches):
        ids = _tolist(batch["input_ids"], 0)
        masks = _tolist(batch.get("attention_mask"), len(ids))
        labels = None if sequence_labels(batch) else _tolist(batch.get("labels"), len(ids))
        if labels and (
            any(len(lab) != len(row) for lab, row in zip(labels, ids))
            or any(batch.get(k) is not None for k in DECODER_FIELDS)
        ):
            # an encoder-decoder's targets (DataCollatorForSeq2Seq pads them to the batch's longest target): not
            # positions of input_ids, so no label is read against the encoder's tokens or attention mask
            labels = None
        pos = _tolist(batch.get("position_ids"), len(ids))
        for i, row_ids in enumerate(ids):
            out.append(
                Row(b, i, row_ids, masks[i] if masks else None, labels[i] if labels else None, pos[i] if pos else None)
            )
    return out


def text_tokenizer(tok: Any) -> Any:
    """The text tokenizer of a tokenizer or a processor (a processor keeps it as ``.tokenizer``)."""
    if not hasattr(tok, "convert_ids_to_tokens") and hasattr(tok, "tokenizer"):
        return tok.tokenizer
    return tok


def token_text(tok: Any, token_id: int) -> str:
    """The token's own text; ``<id N>`` for an id the tokenizer does not know (ids beyond the vocabulary
    are exactly what some checks report; convert_ids_to_tokens gives None or raises for them)."""
    if tok is None:
        return str(token_id)
    try:
        text = text_tokenizer(tok).convert_ids_to_tokens(int(token_id))
    except Exception:
        text = None
    return text if isinstance(text, str) else f"<id {token_id}>"


def token_piece(tok: Any, token_id: int) -> str:
    """One token as text a person reads (spaces shown as ·), for token-by-token pictures."""
    if tok is None:
        return str(token_id)
    try:
        text = tok.decode([int(token_id)], skip_special_tokens=False)
    except Exception:
        return token_text(tok, token_id)
    return text.replace(" ", "·").replace("\n", "⏎") or token_text(tok, token_id)


def decode(tok: Any, ids: Sequence[int], limit: int = 120) -> str:
    """The text of ``ids`` with special tokens kept, shortened in the middle to ``limit`` characters."""
    try:
        text = tok.decode([int(i) for i in ids], skip_special_tokens=False)
    except Exception:
        text = " ".join(token_text(tok, i) for i in ids)
    if len(text) > limit:
        text = text[: limit // 2 - 2] + " … " + text[-(limit // 2 - 2) :]
    return repr(text)


def show_labels(tok: Any, row: Row, positions: Sequence[int]) -> str:
    """``'tok'(id)→label`` for the given positions, the way evidence shows a label decision."""
    parts = []
    for p in positions:
        label = row.labels[p] if row.labels is not None else None
        parts.append(f"{token_text(tok, row.input_ids[p])!r}({row.input_ids[p]})→{label}")
    return ", ".join(parts)


def token_attr(tok: Any, name: str, default: Any = None) -> Any:
    """A tokenizer attribute (``eos_token``, ``pad_token_id``, ``padding_side``, ``model_max_length`` …) of the
    tokenizer role: a processor (a VLM's ProcessorMixin) holds none of them itself, its ``.tokenizer`` does."""
    return getattr(text_tokenizer(tok), name, default)


def chat_template(tok: Any) -> Any:
    """The chat template a tokenizer or processor renders conversations with: a processor's own (a VLM's
    template lives on the processor; its tokenizer often has none), else its tokenizer's."""
    return getattr(tok, "chat_template", None) or getattr(text_tokenizer(tok), "chat_template", None)


def special_id(tok: Any, name: str) -> int | None:
    """``tokenizer.<name>_token_id`` (eos, pad, bos …), read through a processor's ``.tokenizer``."""
    value = token_attr(tok, f"{name}_token_id")
    return int(value) if isinstance(value, int) else None


def packed(row: Row) -> bool:
    """Several documents in one row: the position_ids of its real tokens restart (go down)."""
    if row.position_ids is None:
        return False
    pos = [row.position_ids[c] for c in row.content]
    return any(b <= a for a, b in zip(pos, pos[1:]))


def special_ids(tok: Any) -> set[int]:
    try:
        return {int(i) for i in text_tokenizer(tok).all_special_ids}
    except Exception:
        return set()


def generation_stop_ids(model: Any) -> set[int]:
    """The ids generation stops on, from the model's generation config and config (either may be a list)."""
    out: set[int] = set()
    for cfg in (getattr(model, "generation_config", None), getattr(model, "config", None)):
        value = getattr(cfg, "eos_token_id", None)
        for v in value if isinstance(value, (list, tuple)) else [value]:
            if isinstance(v, int):
                out.add(v)
    return out


def input_embeddings(model: Any) -> Any:
    """The model's input embedding module, or None: a model without ``get_input_embeddings`` (nanoGPT), or one
    whose transformers base class raises NotImplementedError for it (a VisionTextDualEncoderModel, whose
    token embeddings live in its text tower)."""
    get = getattr(model, "get_input_embeddings", None)
    if not callable(get):
        return None
    try:
        emb = get()
    except (NotImplementedError, AttributeError):
        return None
    return emb if isinstance(emb, torch.nn.Module) else None


def embedding_rows(model: Any) -> int | None:
    emb = input_embeddings(model)
    rows = getattr(emb, "num_embeddings", None)
    return int(rows) if isinstance(rows, int) else None


def model_device(model: Any) -> torch.device:
    for p in model.parameters():
        return p.device
    return torch.device("cpu")


def out_of_range_ids(model: Any, batches: Sequence[dict]) -> tuple[int, int] | None:
    """(largest id, embedding rows) when some token id has no embedding row, else None."""
    rows_ = embedding_rows(model)
    if rows_ is None:
        return None
    top = max(int(torch.as_tensor(b["input_ids"]).max()) for b in batches)
    return (top, rows_) if top >= rows_ else None


def forward_ready(ctx: Any, model: Any, batches: Sequence[dict]) -> None:
    """Root cause first: a forward pass with ids past the embedding table is L3's failure, so the checks
    that need a forward skip and name it instead of crashing inside the model."""
    bad = out_of_range_ids(model, batches)
    if bad:
        ctx.skip(f"cannot run the model: token id {bad[0]} >= {bad[1]} embedding rows (see L3)")


def _to(value: Any, device: torch.device) -> Any:
    return torch.as_tensor(value).to(device)


def prepended_positions(model: Any) -> int:
    """How many positions the model's forward puts before the input's own tokens: a prompt-learning adapter
    whose active configuration prepends ``num_virtual_tokens`` learned embeddings to the input embeddings
    (prompt tuning, P-tuning: its logits then have that many positions more than input_ids, the first ones
    the virtual tokens'), read through the usual wrappers (DDP/compile's module, TRL's value head). 0 when
    no such configuration is declared (prefix tuning declares virtual tokens too but feeds them as past keys
    and values: its logits keep the input's length, which :func:`input_logits` sees)."""
    for current in _levels(model, lambda m: _child_module(m, ("module", "_orig_mod", "pretrained_model"))):
        try:
            cfg = getattr(current, "active_peft_config", None)
        except Exception:  # noqa: BLE001 - a wrapper whose adapter cannot be read declares nothing
            cfg = None
        if cfg is not None and getattr(cfg, "is_prompt_learning", False):
            n = getattr(cfg, "num_virtual_tokens", None)
            return int(n) if isinstance(n, int) and n > 0 else 0
    return 0


def _child_module(obj: Any, attrs: tuple[str, ...]) -> Any:
    """The first of ``obj``'s attributes ``attrs`` that is a module, or None."""
    return next((getattr(obj, a) for a in attrs if isinstance(getattr(obj, a, None), torch.nn.Module)), None)


def _levels(model: Any, inner: Any, depth: int = 4) -> Any:
    """``model``, then each object ``inner`` gives for the one before (the model a wrapper holds), each once, at
    most ``depth`` levels."""
    seen: set[int] = set()
    current = model
    for _ in range(depth):
        if current is None or id(current) in seen:
            return
        seen.add(id(current))
        yield current
        current = inner(current)


def input_logits(model: Any, logits: torch.Tensor, length: int) -> torch.Tensor:
    """The (B, ``length``, V) logits of the input's own positions: the model's logits as they are when they
    have the input's length; without the first k positions when the model prepends k virtual tokens
    (:func:`prepended_positions`) and its logits are exactly k longer. Logits of another length, which no
    declared prefix accounts for, are not lined up with the tokens by guess: the check skips saying so."""
    extra = logits.shape[1] - length
    if extra == 0:
        return logits
    k = prepended_positions(model)
    if k and extra == k:
        return logits[:, k:]
    import pytest

    pytest.skip(
        f"{type(model).__name__} returns logits at {logits.shape[1]} positions for {length} input tokens"
        + (f" (it declares {k} prepended virtual tokens)" if k else ", and declares no prepended virtual tokens")
        + ": which logits belong to which token is not known, so no per-token loss is compared"
    )


def _inner_forward(model: Any) -> Any:
    """The forward a call of ``model`` runs: read through a wrapper whose forward takes only ``*args, **kwargs``
    (Lightning Fabric's _FabricModule, DistributedDataParallel, torch.compile's module) to the module it wraps."""
    variadic = (inspect.Parameter.VAR_POSITIONAL, inspect.Parameter.VAR_KEYWORD)
    for _ in range(4):
        try:
            params = list(inspect.signature(model.forward).parameters.values())
        except (TypeError, ValueError, AttributeError):
            return None
        inner = next(
            (
                getattr(model, a)
                for a in ("_forward_module", "module", "_orig_mod")
                if isinstance(getattr(model, a, None), torch.nn.Module) and getattr(model, a) is not model
            ),
            None,
        )
        if params and all(p.kind in variadic for p in params) and inner is not None:
            model = inner
            continue
        return model.forward
    return None


def ids_positionally(model: Any) -> bool:
    """Whether the model takes the token ids as its first positional input and names no ``input_ids`` (a
    hand-written GPT's ``forward(idx, input_pos=None)``, called ``model(idx)`` by its loss): a call by keyword
    ``input_ids=`` is one its pipeline never makes."""
    forward = _inner_forward(model)
    if forward is None:
        return False
    try:
        params = list(inspect.signature(forward).parameters.values())
    except (TypeError, ValueError):
        return False
    if any(p.name == "input_ids" for p in params):
        return False
    kinds = (inspect.Parameter.POSITIONAL_ONLY, inspect.Parameter.POSITIONAL_OR_KEYWORD)
    positional = [p for p in params if p.kind in kinds]
    # the ids fill the first input; any further input the forward requires is one the token batch does not hold
    return bool(positional) and all(p.default is not inspect.Parameter.empty for p in positional[1:])


def lm_call(model: Any, fields: Mapping[str, Any]) -> Any:
    """The model's output on a token batch's fields (input_ids, attention_mask, position_ids, forward keywords),
    called as a pipeline calls it: by keyword (transformers' ``model(input_ids=..., attention_mask=...)``), or,
    for a forward that takes the ids positionally and names no ``input_ids`` (:func:`ids_positionally`),
    ``model(ids)`` with the other fields only where the forward names them."""
    if not ids_positionally(model):
        return model(**fields)
    forward = _inner_forward(model)
    params = inspect.signature(forward).parameters
    first = next(iter(params))
    rest = {k: v for k, v in fields.items() if k != "input_ids" and k in params and k != first}
    return model(fields["input_ids"], **rest)


def token_nll(
    model: Any, input_ids: Any, labels: Any, attention_mask: Any = None, position_ids: Any = None, **extra: Any
) -> torch.Tensor:
    """Per-token NLL (B, T-1) of next-token prediction, 0 where the shifted label is -100; in eval mode,
    without gradients, on the model's device, leaving the model as it was. ``extra`` forward keywords
    (``use_cache=False``…) are passed through."""
    device = model_device(model)
    kwargs = {"input_ids": _to(input_ids, device), **extra}
    if attention_mask is not None:
        kwargs["attention_mask"] = _to(attention_mask, device)
    if position_ids is not None:
        kwargs["position_ids"] = _to(position_ids, device)
    with eval_mode(model):
        out = lm_call(model, kwargs)
    found = logits_of(out)
    logits = (found if found is not None else out.logits).float()
    logits = input_logits(model, logits, kwargs["input_ids"].shape[-1])
    labels = _to(labels, device)
    shift_logits, shift_labels = logits[:, :-1], labels[:, 1:]
    nll = torch.nn.functional.cross_entropy(
        shift_logits.reshape(-1, shift_logits.size(-1)), shift_labels.reshape(-1), ignore_index=IGNORE, reduction="none"
    )
    return nll.view(shift_labels.shape).cpu()


def mean_nll(nll: torch.Tensor, labels: Any) -> torch.Tensor:
    """Per-example mean NLL over supervised (label != -100) next-token positions."""
    mask = (torch.as_tensor(labels)[:, 1:] != IGNORE).float()
    return (nll * mask).sum(1) / mask.sum(1).clamp(min=1)


def batch_labels(batch: Mapping[str, Any]) -> torch.Tensor:
    """The batch's own labels when they have input_ids' shape, else the input ids with the positions the
    attention mask marks as padding ignored (what a causal-LM collator derives)."""
    ids = torch.as_tensor(batch["input_ids"])
    labels = batch.get("labels")
    if labels is not None:
        labels = torch.as_tensor(labels)
        if labels.shape == ids.shape:
            return labels
    labels = ids.clone()
    mask = batch.get("attention_mask")
    if mask is not None:
        labels[torch.as_tensor(mask) == 0] = IGNORE
    return labels


@dataclass
class BatchForward:
    """What the llm checks read from one eval-mode forward of a sampled batch as collated."""

    #: (B, T-1) next-token NLL against :func:`batch_labels`, 0 where the shifted label is -100
    nll: torch.Tensor
    #: (B, T) log Z = logsumexp of the logits over the vocabulary, at every position
    logz: torch.Tensor
    #: positions the model put before the input's own and whose logits were dropped (:func:`input_logits`)
    prepended: int = 0


def logits_of(out: Any) -> torch.Tensor | None:
    """The (B, T, V) logits of a causal LM's output (ModelOutput, mapping, tuple or tensor), else None."""
    logits = getattr(out, "logits", None)
    if logits is None and isinstance(out, Mapping):
        logits = out.get("logits")
    if logits is None and isinstance(out, (tuple, list)) and out and isinstance(out[0], torch.Tensor):
        logits = out[0]
    if logits is None and isinstance(out, torch.Tensor):
        logits = out
    return logits if isinstance(logits, torch.Tensor) and logits.dim() == 3 and logits.shape[-1] > 1 else None


def batch_forward(ctx: Any, model: Any, batch: Mapping[str, Any]) -> BatchForward | None:
    """One forward of ``model`` over a sampled ``batch`` (its input_ids, attention_mask and position_ids, as
    the collator made them), in eval mode without gradients: its per-token NLL and log Z, memoised per
    (model, batch) for the session, so the checks that read the same batch (L1's losses in the batch, L6's
    log Z) share one pass. None when the model returns no (batch, positions, vocabulary) logits. Logits and
    tokens are lined up position by position: a model that prepends virtual tokens (prompt tuning) has the
    logits of those positions dropped (:func:`input_logits`)."""

    def make() -> BatchForward | None:
        device = model_device(model)
        kwargs = {
            k: _to(batch[k], device)
            for k in ("input_ids", "attention_mask", "position_ids")
            if batch.get(k) is not None
        }
        with eval_mode(model):
            logits = logits_of(ctx.call("model", lambda: lm_call(model, kwargs)))
        if logits is None:
            return None
        length = kwargs["input_ids"].shape[-1]
        prepended = logits.shape[1] - length
        logits = input_logits(model, logits.float(), length)
        labels = _to(batch_labels(batch), device)
        if labels.dim() == 1:
            labels = labels.unsqueeze(0)
        shift_logits, shift_labels = logits[:, :-1], labels[:, 1:]
        nll = torch.nn.functional.cross_entropy(
            shift_logits.reshape(-1, shift_logits.size(-1)),
            shift_labels.reshape(-1),
            ignore_index=IGNORE,
            reduction="none",
        )
        logz = torch.logsumexp(logits, dim=-1)
        return BatchForward(nll.view(shift_labels.shape).cpu(), logz.cpu(), prepended)

    return ctx.memo((model, batch), "lm:batch_forward", make)


#: what a text model is trained to do, by the kind of its head
CAUSAL, MASKED, SEQ2SEQ, SEQUENCE_CLASSIFIER, TOKEN_CLASSIFIER, QUESTION_ANSWERING, MULTIPLE_CHOICE = (
    "causal LM",
    "masked LM",
    "sequence-to-sequence LM",
    "sequence classifier",
    "token classifier",
    "question-answering model (it predicts the start and end positions of an answer span)",
    "multiple-choice model (it scores each of an example's choices: token ids (batch, choices, positions), one "
    "label per example)",
)
#: a transformers model that no text task mapping lists and that has no language-model head (a CLIP-style dual
#: encoder, a masked-image model): its tokens, if any, feed an encoder whose output is no token prediction
NOT_LM = "model that predicts no tokens"


def predicts_no_tokens(model: Any) -> str | None:
    """Why a transformers model is no language model, or None: its class is in none of transformers' text task
    mappings (:func:`model_task` is None) and it has no output embeddings (``get_output_embeddings()`` is None:
    no head over the vocabulary). Decided from the model object, for a model whose kind the mappings do not
    give; a custom torch module is not judged here (None)."""
    inner = base_model(model)
    if not isinstance(inner, torch.nn.Module) or model_task(inner) is not None:
        return None  # a tokenizer handed over as the model is another matter (its role is misused)
    if not any(cls.__module__.startswith("transformers.") for cls in type(inner).__mro__):
        return None
    get = getattr(inner, "get_output_embeddings", None)
    try:
        head = get() if callable(get) else None
    except (NotImplementedError, AttributeError):
        head = None
    if head is not None:
        return None
    return (
        f"the model ({type(inner).__name__}) is in none of transformers' text task mappings and has no "
        "language-model head (get_output_embeddings() is None): it predicts no tokens and classifies no text"
    )


#: transformers' task mappings (model type -> head class names) per kind, most specific first
_TASK_MAPPINGS = (
    (SEQ2SEQ, "MODEL_FOR_SEQ_TO_SEQ_CAUSAL_LM_MAPPING_NAMES"),
    (CAUSAL, "MODEL_FOR_CAUSAL_LM_MAPPING_NAMES"),
    (CAUSAL, "MODEL_FOR_IMAGE_TEXT_TO_TEXT_MAPPING_NAMES"),
    (MASKED, "MODEL_FOR_MASKED_LM_MAPPING_NAMES"),
    (TOKEN_CLASSIFIER, "MODEL_FOR_TOKEN_CLASSIFICATION_MAPPING_NAMES"),
    (SEQUENCE_CLASSIFIER, "MODEL_FOR_SEQUENCE_CLASSIFICATION_MAPPING_NAMES"),
    (QUESTION_ANSWERING, "MODEL_FOR_QUESTION_ANSWERING_MAPPING_NAMES"),
    (MULTIPLE_CHOICE, "MODEL_FOR_MULTIPLE_CHOICE_MAPPING_NAMES"),
)


@functools.cache
def _head_classes() -> dict[str, str]:
    """Head class name -> kind, from transformers' own task mappings (the first kind listed wins)."""
    try:
        from transformers.models.auto import modeling_auto
    except ImportError:
        return {}
    out: dict[str, str] = {}
    for kind, name in _TASK_MAPPINGS:
        for value in getattr(modeling_auto, name, {}).values():
            for cls in value if isinstance(value, (list, tuple)) else [value]:
                out.setdefault(str(cls), kind)
    return out


def base_model(model: Any) -> Any:
    """The model inside the usual wrappers: a PEFT model's base model, TRL's value-head wrapper's
    pretrained_model, DDP/compile's module."""
    for _ in range(4):
        inner = None
        get_base = getattr(type(model), "get_base_model", None)
        if callable(get_base):
            try:
                inner = model.get_base_model()
            except Exception:  # noqa: BLE001 - a wrapper that cannot unwrap is judged as it is
                inner = None
        for attr in ("pretrained_model", "_orig_mod", "module"):
            if inner is None and isinstance(getattr(model, attr, None), torch.nn.Module):
                inner = getattr(model, attr)
        if inner is None or inner is model:
            return model
        model = inner
    return model


def forward_names(model: Any) -> set[str]:
    """The named parameters of the model's forward; through a wrapper whose forward takes ``**kwargs`` (a PEFT
    model's ``forward(*args, **kwargs)``, TRL's value-head wrapper) those of the model inside too, which the
    wrapper hands its keywords to. Empty when no forward can be read (then every input is passed)."""
    import inspect

    names: set[str] = set()

    def inner(current: Any) -> Any:
        # one level down: PEFT's get_base_model(), a wrapper's .model / .module
        below = base_model(current)
        return _child_module(current, ("base_model", "model", "module")) if below is current else below

    for current in _levels(model, inner):
        try:
            params = inspect.signature(current.forward).parameters
        except (TypeError, ValueError, AttributeError):
            break
        names |= {n for n, p in params.items() if p.kind not in (p.VAR_KEYWORD, p.VAR_POSITIONAL)}
        if not any(p.kind == p.VAR_KEYWORD for p in params.values()):
            break
    return names


def model_task(model: Any) -> tuple[str, str] | None:
    """(kind, the head class that says so) of a transformers model, from its class (or a base class of it) in
    transformers' task mappings; None for a model no mapping lists (a custom torch module)."""
    model = base_model(model)
    if not any(cls.__module__.startswith("transformers.") for cls in type(model).__mro__):
        return None  # no transformers class (and transformers need not be imported to say so)
    heads = _head_classes()
    for cls in type(model).__mro__:
        kind = heads.get(cls.__name__)
        if kind is not None and cls.__module__.startswith("transformers."):
            return kind, cls.__name__
    return None
