"""L1: wrong padding side. Training: an example's loss inside a padded batch equals its loss alone.
Generation: greedy ``generate`` of a padded batch of prompts equals each prompt generated alone."""

from __future__ import annotations

import inspect
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import pytest
import torch

from ...errors import MISSING
from ...guard import eval_mode
from ...registry import Setting, check
from ...sampling import sample_rows
from ...session import NOT_APPLICABLE
from ..shared import lm
from .common import online_trainer, pipeline_kind, token_sample


@dataclass
class Half:
    """The verdict of one half of the check: decided (passed/failed) or not, with its lines."""

    name: str
    decided: bool = False
    failed: bool = False
    reason: str = ""
    #: False when the half does not concern the pipeline (nothing padded, no batched generation)
    applicable: bool = True
    evidence: list[str] = field(default_factory=list)
    #: what a passing half measured, and its numbers
    measured: list[str] = field(default_factory=list)
    numbers: dict[str, Any] = field(default_factory=dict)
    cause: str = ""
    fix: str = ""


def _accepts(model: Any, name: str) -> bool:
    try:
        params = inspect.signature(model.forward).parameters
    except (TypeError, ValueError):
        return False
    return name in params or any(p.kind is inspect.Parameter.VAR_KEYWORD for p in params.values())


def _half_precision(model: Any) -> bool:
    for p in model.parameters():
        return p.dtype in (torch.float16, torch.bfloat16)
    return False


def _rope_model(model: Any) -> bool:
    cfg = getattr(model, "config", None)
    if cfg is None:
        return False
    get_text = getattr(cfg, "get_text_config", None)
    cfg = get_text() if callable(get_text) else cfg
    return bool(
        getattr(cfg, "rope_parameters", None) or getattr(cfg, "rope_scaling", None) or getattr(cfg, "rope_theta", None)
    )


# ---- training half ---------------------------------------------------------------------------------


@dataclass
class RowLoss:
    row: lm.Row
    pads: int
    side: str
    in_batch: float
    alone: float
    control: float | None
    first_target_from_pad: bool
    #: positions the model put before the row's own (prompt learning's virtual tokens), whose logits were dropped
    prepended: int = 0
    #: the batch with position_ids from its mask gave bitwise this row's loss in the batch: the model's forward
    #: ignores position_ids (a prompt-learning PEFT model drops them), so that control says nothing about rounding
    positions_ignored: bool = False

    @property
    def delta(self) -> float:
        return abs(self.in_batch - self.alone)

    @property
    def control_delta(self) -> float | None:
        return None if self.control is None else abs(self.control - self.alone)


def _alone_nll(model: Any, alone: list[tuple[list[int], list[int]]]) -> list[torch.Tensor]:
    """Each row's per-token NLL with no padding at all: rows of the same length share one forward (a batch
    of equal-length rows needs no pad), so the rows alone cost one pass per distinct length."""
    out: list[torch.Tensor | None] = [None] * len(alone)
    by_length: dict[int, list[int]] = {}
    for i, (ids, _) in enumerate(alone):
        by_length.setdefault(len(ids), []).append(i)
    for group in by_length.values():
        ids = torch.tensor([alone[i][0] for i in group])
        labels = torch.tensor([alone[i][1] for i in group])
        for i, nll in zip(group, lm.token_nll(model, ids, labels)):
            out[i] = nll
    return out  # type: ignore[return-value]


def _measure_training(dlcheck: Any, model: Any, batches: list[dict]) -> list[RowLoss]:
    out: list[RowLoss] = []
    control_ok = _accepts(model, "position_ids")
    pending = []  # (row, content, side, supervised, loss in the batch, control loss)
    for b, batch in enumerate(batches):
        if batch.get("attention_mask") is None:
            continue  # without a mask nothing tells padding from content (L14's business)
        ids = torch.as_tensor(batch["input_ids"])
        if ids.dim() != 2:
            continue
        mask = torch.as_tensor(batch["attention_mask"])
        if mask.shape != ids.shape or bool(mask.all()):
            continue
        labels = lm.batch_labels(batch)
        pos = batch.get("position_ids")
        padded = []
        for r in lm.rows([{**batch, "labels": labels}]):
            r.batch = b
            content = r.content
            if not content or len(content) == len(r.input_ids) or lm.packed(r):
                continue  # unpadded, empty, or packed (L4's business)
            if content != list(range(content[0], content[-1] + 1)):
                continue  # holes in the mask: L14's business
            side = "left" if content[0] > 0 else "right"
            padded.append((r, content, side))
        if not padded:
            continue
        forward = lm.batch_forward(dlcheck, model, batch)  # shared with L6's log Z
        if forward is None:
            dlcheck.skip(f"{type(model).__name__} returns no (batch, positions, vocabulary) logits: no loss to compare")
        nll_batch = forward.nll
        nll_control = None
        if pos is None and control_ok and any(side == "left" for _, _, side in padded):
            control_pos = (mask.long().cumsum(-1) - 1).clamp(min=0)
            nll_control = lm.token_nll(model, ids, labels, mask, control_pos)
        for r, content, side in padded:
            sup = [j for j in range(len(content) - 1) if r.labels[content[j + 1]] != lm.IGNORE]
            if not sup:
                continue
            at = [content[j] for j in sup]
            in_batch = float(nll_batch[r.index, at].mean())
            control = float(nll_control[r.index, at].mean()) if nll_control is not None and side == "left" else None
            # other positions leave a left-padded row's losses bitwise the same only when they are not read
            ignored = control is not None and torch.equal(nll_control[r.index, at], nll_batch[r.index, at])
            pending.append((r, content, side, sup, in_batch, None if ignored else control, forward.prepended, ignored))
    alone_nll = _alone_nll(model, [([r.input_ids[c] for c in ct], [r.labels[c] for c in ct]) for r, ct, *_ in pending])
    for (r, content, side, sup, in_batch, control, prepended, ignored), nll_alone in zip(pending, alone_nll):
        alone = float(nll_alone[sup].mean())
        first_from_pad = side == "left" and r.labels[content[0]] != lm.IGNORE
        out.append(
            RowLoss(
                r, len(r.input_ids) - len(content), side, in_batch, alone, control, first_from_pad, prepended, ignored
            )
        )
    return out


#: the fields a sequence classifier's forward reads from its batch, beside input_ids and attention_mask
_ROW_FIELDS = ("input_ids", "token_type_ids", "attention_mask", "position_ids")


def _sequence_losses(logits: torch.Tensor, labels: torch.Tensor, problem_type: Any) -> torch.Tensor:
    """Each row's loss against its own sequence label, the way transformers' sequence classifiers compute it
    (problem_type, or: one logit -> regression, integer labels -> cross-entropy, float labels -> BCE)."""
    logits = logits.float()
    labels = labels.to(logits.device)
    if problem_type == "regression" or (problem_type is None and logits.shape[-1] == 1):
        return (
            ((logits.squeeze(-1) - labels.float().view(logits.shape[0], -1).squeeze(-1)) ** 2)
            .view(logits.shape[0], -1)
            .mean(-1)
        )
    if problem_type == "multi_label_classification" or (problem_type is None and labels.is_floating_point()):
        return torch.nn.functional.binary_cross_entropy_with_logits(
            logits, labels.float().view_as(logits), reduction="none"
        ).mean(-1)
    return torch.nn.functional.cross_entropy(logits, labels.long().view(-1), reduction="none")


def _sequence_logits(dlcheck: Any, model: Any, fields: dict[str, torch.Tensor], synthetic: str | bool) -> torch.Tensor:
    device = lm.model_device(model)
    kwargs = {k: v.to(device) for k, v in fields.items()}
    with eval_mode(model), torch.no_grad():
        out = dlcheck.call("model", lambda: model(**kwargs), synthetic=synthetic)
    logits = getattr(out, "logits", None)
    if logits is None and isinstance(out, Mapping):
        logits = out.get("logits")
    if logits is None and isinstance(out, (tuple, list)) and out:
        logits = out[0]
    if not isinstance(logits, torch.Tensor) or logits.dim() != 2:
        dlcheck.skip(f"{type(model).__name__} returns no (batch, classes) logits: no loss to compare")
    return logits.float().cpu()


def _measure_sequences(dlcheck: Any, model: Any, batches: list[dict]) -> list[RowLoss]:
    """L1's training half for a sequence classifier: each padded row's loss against its own sequence label
    inside its batch as collated, alone (its real tokens only), and for left-padded rows with position_ids
    from the attention mask."""
    out: list[RowLoss] = []
    control_ok = _accepts(model, "position_ids")
    problem_type = getattr(getattr(model, "config", None), "problem_type", None)
    atol, half = dlcheck.setting("atol"), _half_precision(model)
    for b, batch in enumerate(batches):
        if batch.get("attention_mask") is None or batch.get("labels") is None:
            continue
        fields = {k: torch.as_tensor(batch[k]) for k in _ROW_FIELDS if batch.get(k) is not None}
        ids, mask = fields["input_ids"], fields["attention_mask"]
        if ids.dim() != 2 or mask.shape != ids.shape or bool(mask.all()):
            continue
        labels = torch.as_tensor(batch["labels"])
        padded = []
        for r in lm.rows([batch]):
            r.batch = b
            content = r.content
            if not content or len(content) == len(r.input_ids) or content != list(range(content[0], content[-1] + 1)):
                continue  # unpadded, empty, or holes in the mask (L14's business)
            padded.append((r, content, "left" if content[0] > 0 else "right"))
        if not padded:
            continue
        in_batch = _sequence_losses(_sequence_logits(dlcheck, model, fields, False), labels, problem_type)
        control = None
        if "position_ids" not in fields and control_ok and any(side == "left" for *_, side in padded):
            pos = (mask.long().cumsum(-1) - 1).clamp(min=0)
            control = _sequence_losses(
                _sequence_logits(
                    dlcheck, model, {**fields, "position_ids": pos}, "the batch with position_ids from its mask"
                ),
                labels,
                problem_type,
            )
        for r, content, side in padded:
            alone_fields = {k: v[r.index, content[0] : content[-1] + 1].unsqueeze(0) for k, v in fields.items()}
            alone = _sequence_losses(
                _sequence_logits(dlcheck, model, alone_fields, "a padded example alone, without its padding"),
                labels[r.index : r.index + 1],
                problem_type,
            )
            fixed = control is not None and abs(float(control[r.index]) - float(alone[0])) <= atol
            # correct positions that leave the difference in float32 show no rounding: the model reads the pads
            # (pools the row's first position, a pad when left-padded); only in half precision is it noise
            keep = control is not None and side == "left" and (fixed or half)
            out.append(
                RowLoss(
                    r,
                    len(r.input_ids) - len(content),
                    side,
                    float(in_batch[r.index]),
                    float(alone[0]),
                    float(control[r.index]) if keep else None,
                    False,
                )
            )
    return out


def _training_half(dlcheck: Any, model: Any, tok: Any) -> Half:
    half = Half("training")
    trainer_kind = online_trainer(dlcheck.role("trainer"))
    if trainer_kind:
        # the padding of the batches it trains on concerns it (left-padded prompts, right-padded completions): the
        # batches are built where the check does not see them
        half.reason = f"{trainer_kind} builds its training batches inside the trainer (from generations)"
        return half
    try:
        sample = token_sample(dlcheck)
    except pytest.skip.Exception as exc:
        half.applicable = not exc.msg.startswith(NOT_APPLICABLE)
        half.reason = exc.msg.removeprefix(NOT_APPLICABLE).strip()
        return half
    unmeasured = pipeline_kind(dlcheck).unmeasured("the losses in the batch and alone")
    if unmeasured:
        half.reason = unmeasured
        return half
    lm.forward_ready(dlcheck, model, sample.batches)
    sequences = pipeline_kind(dlcheck).name == lm.SEQUENCE_CLASSIFIER
    what = "loss against the sequence's own label" if sequences else "mean NLL over the same supervised tokens"
    measured = (_measure_sequences if sequences else _measure_training)(dlcheck, model, sample.batches)
    if not measured:
        n = len(lm.rows(sample.batches))
        half.reason = f"no padded, unpacked row with an attention_mask among the {n} sampled rows of {sample.source}"
        # batches without a mask (nor position_ids, as padding-free ones have) may be padded all the same
        unmasked = [b for b in sample.batches if b.get("attention_mask") is None and b.get("position_ids") is None]
        if unmasked:
            half.reason += f" ({len(unmasked)} batches carry no attention_mask, so their padding cannot be told)"
        half.applicable = bool(unmasked)
        return half
    half.decided = True
    atol, ratio = dlcheck.setting("atol"), dlcheck.setting("noise_ratio")
    left = [m for m in measured if m.side == "left"]
    bad = [m for m in left if m.delta > atol and (m.control_delta is None or m.delta > ratio * m.control_delta)]
    virtual = max(m.prepended for m in measured)
    aligned = (
        f"the model's logits have {virtual} positions more than input_ids, in the batch and alone: the {virtual} "
        "virtual-token positions the model prepends (prompt learning) are dropped, each logit read at its own token"
        if virtual
        else ""
    )
    if not bad:
        worst = max(measured, key=lambda m: m.delta)
        sides = ", ".join(
            f"{n} {side}-padded" for side in ("right", "left") if (n := sum(m.side == side for m in measured))
        )
        half.measured.append(
            f"training: {len(measured)} padded examples ({sides}) lose as alone: max |Δ| {worst.delta:.1e} <= atol "
            f"{atol:g} nats ({what} in the batch and alone); source: {sample.source}"
        )
        half.measured.append(
            f"  example {worst.row.batch}.{worst.row.index} ({worst.pads} pad tokens on the {worst.side}): loss in "
            f"batch {worst.in_batch:.4f}, alone {worst.alone:.4f}"
        )
        if aligned:
            half.measured.append(f"  {aligned}")
        noisy = [m for m in left if m.delta > atol]
        if noisy:
            half.measured.append(
                f"  {len(noisy)} left-padded examples above tolerance are within {ratio:g}x the Δ left with "
                "position_ids from the attention mask (rounding of the model's dtype)"
            )
        half.numbers.update(padded_examples=len(measured), left_padded=len(left), max_delta=worst.delta, atol=atol)
        return half
    half.failed = True
    bad.sort(key=lambda m: -m.delta)
    has_pos = any("position_ids" in b for b in sample.batches)
    half.evidence.append(
        f"{len(bad)} of {len(left)} left-padded sampled examples have another loss in the batch than alone "
        f"({what}, tolerance {atol:g} nats); padding side: left, "
        f"position_ids {'given' if has_pos else 'not given'}; source: {sample.source}"
    )
    shown: set[tuple[int, ...]] = set()
    for m in bad:
        r = m.row
        key = tuple(r.input_ids[c] for c in r.content)
        if key in shown or len(shown) == 3:
            continue
        shown.add(key)
        half.evidence.append(
            f"example {r.batch}.{r.index} ({m.pads} pad tokens on the left): loss in batch {m.in_batch:.4f}, "
            f"alone {m.alone:.4f} (Δ {m.delta:.4f}): {lm.decode(tok, [r.input_ids[c] for c in r.content])}"
        )
    fixed = [m for m in bad if m.control_delta is not None and m.control_delta <= atol]
    if fixed:
        worst = max(m.control_delta for m in fixed)
        half.evidence.append(
            f"the same batches with position_ids = attention_mask.cumsum(-1) - 1: Δ at most {worst:.1e} "
            f"({len(fixed)} of {len(bad)} examples back within tolerance)"
        )
    ignored = [m for m in bad if m.positions_ignored]
    if ignored:
        half.evidence.append(
            f"the same batches with position_ids = attention_mask.cumsum(-1) - 1: bitwise the same losses for "
            f"{len(ignored)} of {len(bad)} examples: the model's forward ignores position_ids"
        )
    if aligned:
        half.evidence.append(aligned)
    if any(m.first_target_from_pad for m in bad):
        half.evidence.append(
            "also: the first real token of each left-padded row is a target predicted from a pad position"
        )
    model_type = getattr(getattr(model, "config", None), "model_type", type(model).__name__)
    if fixed:
        kind = "rotary" if _rope_model(model) else "learned absolute"
        half.cause = (
            f"left padding without position_ids: {model_type} numbers positions from the first pad token "
            f"({kind} position embeddings), so every real token of a left-padded example sits as many positions "
            f"later as there are pads, unlike alone or at inference"
        )
    elif sequences:
        half.cause = (
            "the classification of left-padded examples depends on their padding, and position_ids from the "
            "attention mask do not remove the difference: the model reads a fixed position of the row (BERT-style "
            "pooling of the first token, [CLS], which is a pad when the row is left-padded) or attends to the pads"
        )
    elif ignored:
        half.cause = (
            "the loss of left-padded examples depends on their padding, and the model's forward ignores position_ids "
            "(the same batches with position_ids from the attention mask lose bitwise the same): it attends to the "
            "pads or places tokens by row index, and no position_ids passed with the batch can correct it"
        )
    else:
        half.cause = (
            "the loss of left-padded examples depends on their padding, and position_ids from the attention mask "
            "do not remove the difference: the model attends to the pads or places tokens by row index"
        )
    half.fix = (
        "pad training batches on the right: tokenizer.padding_side = 'right' before the collator pads "
        "(DataCollatorForLanguageModeling / DataCollatorWithPadding pad on the tokenizer's side); keep 'left' for "
        "generation only"
        + (
            " — or pass position_ids = (attention_mask.cumsum(-1) - 1).clamp(min=0) with every left-padded batch"
            if fixed
            else ""
        )
    )
    return half


# ---- generation half -------------------------------------------------------------------------------


def _pad_left(seqs: list[list[int]], pad: int) -> dict[str, torch.Tensor]:
    width = max(len(s) for s in seqs)
    ids = torch.tensor([[pad] * (width - len(s)) + s for s in seqs])
    mask = torch.tensor([[0] * (width - len(s)) + [1] * len(s) for s in seqs])
    return {"input_ids": ids, "attention_mask": mask}


def _user_prompts(dlcheck: Any, prompts: Any, tok: Any) -> tuple[dict, str]:
    if isinstance(prompts, Mapping):
        if "input_ids" not in prompts:
            dlcheck.skip("dlcheck_generation_prompts is a mapping without input_ids")
        ids = torch.as_tensor(prompts["input_ids"])
        mask = prompts.get("attention_mask")
        mask = torch.ones_like(ids) if mask is None else torch.as_tensor(mask)
        return {"input_ids": ids, "attention_mask": mask}, "the batch dlcheck_generation_prompts feeds to generate"
    if isinstance(prompts, str):
        prompts = [prompts]
    prompts = list(prompts)
    if not all(isinstance(p, str) for p in prompts):
        dlcheck.skip("dlcheck_generation_prompts must be prompt strings or a batch with input_ids and attention_mask")
    prompts = prompts[: dlcheck.samples]
    tok = lm.text_tokenizer(tok)  # text prompts: a processor's own tokenizer pads them (and holds padding_side)
    if getattr(tok, "pad_token", None) is None:
        dlcheck.skip("generation: the tokenizer has no pad token, so the prompts cannot be padded (see L3)")
    enc = dlcheck.call("tokenizer", lambda: tok(prompts, padding=True, return_tensors="pt"))
    return (
        {"input_ids": enc["input_ids"], "attention_mask": enc["attention_mask"]},
        f"dlcheck_generation_prompts tokenized with tokenizer.padding_side={tok.padding_side!r}",
    )


def _trainer_prompts(dlcheck: Any, trainer: Any, kind: str, tok: Any) -> tuple[dict, str] | None:
    dataset = dlcheck.role("raw_dataset")
    if dataset is MISSING:
        return None
    rows, _ = sample_rows(dataset, dlcheck.samples, "raw_dataset")
    prompts = [r.get("prompt") for r in rows if isinstance(r, Mapping)]
    if not prompts or any(p is None for p in prompts):
        return None
    seqs = []
    for p in prompts:
        if isinstance(p, str):
            enc = dlcheck.call("tokenizer", lambda p=p: tok(text=p))
        else:  # conversational, as TRL renders it
            enc = dlcheck.call(
                "tokenizer",
                lambda p=p: tok.apply_chat_template(p, add_generation_prompt=True, tokenize=True, return_dict=True),
            )
        ids = enc["input_ids"]
        seqs.append([int(i) for i in (ids[0] if ids and isinstance(ids[0], list) else ids)])
    pad = lm.special_id(tok, "pad")
    pad = lm.special_id(tok, "eos") if pad is None else pad
    return _pad_left(seqs, pad), f"the prompts of the {kind}'s dataset, padded on the left as {kind} does itself"


def _side(mask: torch.Tensor) -> str:
    left = bool((mask[:, 0] == 0).any())
    right = bool((mask[:, -1] == 0).any())
    return "left" if left and not right else "right" if right and not left else "mixed" if left else "none"


def _eos_ids(model: Any, tok: Any) -> set[int]:
    out = set()
    gen = getattr(model, "generation_config", None)
    value = getattr(gen, "eos_token_id", None)
    for v in value if isinstance(value, (list, tuple)) else [value]:
        if isinstance(v, int):
            out.add(v)
    eos = lm.special_id(tok, "eos")
    if eos is not None:
        out.add(eos)
    return out


def _cut(tokens: list[int], eos: set[int]) -> list[int]:
    for i, t in enumerate(tokens):
        if t in eos:
            return tokens[: i + 1]
    return tokens


def _generation_half(dlcheck: Any, model: Any, tok: Any) -> Half:
    half = Half("generation")
    prompts, trainer = dlcheck.role("generation_prompts"), dlcheck.role("trainer")
    kind = online_trainer(trainer)
    if prompts is not MISSING:
        enc, how = _user_prompts(dlcheck, prompts, tok)
    elif kind:
        got = _trainer_prompts(dlcheck, trainer, kind, tok)
        if got is None:
            half.reason = f"the {kind}'s dataset has no 'prompt' column to sample"
            return half
        enc, how = got
    else:
        half.reason = (
            "the pipeline does not generate in batches (no TRL GRPO, RLOO or distillation trainer); if it does, define "
            "dlcheck_generation_prompts to check batched generation"
        )
        half.applicable = False
        return half
    if not hasattr(model, "generate"):
        half.reason = f"{type(model).__name__} has no generate()"
        return half
    ids, mask = enc["input_ids"], enc["attention_mask"]
    if ids.dim() != 2 or ids.size(0) < 2 or bool(mask.all()):
        half.reason = (
            f"the generation prompts make no padded batch ({tuple(ids.shape)} ids, {int((mask == 0).sum())} pads)"
        )
        return half
    lm.forward_ready(dlcheck, model, [{"input_ids": ids}])
    pad = lm.special_id(tok, "pad")
    pad = lm.special_id(tok, "eos") if pad is None else pad
    new = dlcheck.setting("max_new_tokens")
    device = lm.model_device(model)
    kwargs = {
        "do_sample": False,
        "num_beams": 1,
        "max_new_tokens": new,
        "min_new_tokens": 0,
        "pad_token_id": pad,
        "output_scores": True,
        "return_dict_in_generate": True,
    }

    def generate(i: torch.Tensor, m: torch.Tensor) -> Any:
        return dlcheck.call(
            "model", lambda: model.generate(input_ids=i.to(device), attention_mask=m.to(device), **kwargs)
        )

    with eval_mode(model):
        batch_out = generate(ids, mask)
        alone_out = []
        for r in range(ids.size(0)):
            keep = mask[r].bool()
            alone_out.append(generate(ids[r][keep][None], torch.ones(1, int(keep.sum()), dtype=mask.dtype)))
    half.decided = True
    eos = _eos_ids(model, tok)
    margin = dlcheck.setting("tie_margin_half" if _half_precision(model) else "tie_margin")
    width = ids.size(1)
    diverged, ties = [], 0
    for r, alone in enumerate(alone_out):
        prompt = ids[r][mask[r].bool()].tolist()
        a = _cut(alone.sequences[0, len(prompt) :].tolist(), eos)
        b = _cut(batch_out.sequences[r, width:].tolist(), eos)
        if a == b:
            continue
        k = next(i for i in range(min(len(a), len(b))) if a[i] != b[i])
        scores = alone.scores[k][0].float()
        gap = float(scores[a[k]] - scores[b[k]])
        if gap <= margin:
            ties += 1
            continue  # a near-tie flipped by rounding, not by padding
        first = (
            (torch.log_softmax(alone.scores[0][0].float(), -1) - torch.log_softmax(batch_out.scores[0][r].float(), -1))
            .abs()
            .max()
        )
        diverged.append((r, prompt, a, b, k, gap, float(first)))
    side = _side(mask)
    n = ids.size(0)
    if not diverged:
        half.measured.append(
            f"generation: greedy generate of {n} prompts padded together (padding side: {side}; {how}) gives every "
            f"prompt the continuation it gets alone ({new} new tokens, {int((mask == 0).sum())} pads in the batch)"
            + (f"; {ties} divergences at a near-tie (logit gap <= {margin:g}) ignored" if ties else "")
        )
        half.numbers.update(prompts=n, diverged=0, near_ties=ties, max_new_tokens=new)
        return half
    half.failed = True
    half.evidence.append(
        f"greedy generate of {n} prompts padded together (padding side: {side}; {how}) differs from each prompt "
        f"generated alone for {len(diverged)} of {n} prompts ({new} new tokens)"
    )
    for r, prompt, a, b, k, gap, first in diverged[:3]:
        pads = int((mask[r] == 0).sum())
        half.evidence.append(
            f"prompt {r} {lm.decode(tok, prompt, 60)} ({pads} pads): alone → {lm.decode(tok, a, 60)} | "
            f"in batch → {lm.decode(tok, b, 60)}"
        )
        half.evidence.append(
            f"  first new token: max |Δ log-prob| {first:.3f} between batch and alone; the continuations part at "
            f"new token {k} (logit gap {gap:.3f} > tie margin {margin:g})"
        )
    if side == "right":
        half.cause = (
            "padding_side='right' for generation: the shorter prompts end in pad tokens, so generate reads the "
            "next-token distribution at a pad position and appends the continuation after the pads"
        )
        half.fix = (
            "tokenizer.padding_side = 'left' before tokenizing prompts for generate (or "
            "tok(prompts, padding=True, padding_side='left')); keep right padding for training"
        )
    else:
        half.cause = (
            f"batched generation differs from single-prompt generation although the prompts are padded on the {side}: "
            "the model does not ignore the pads in generate (attention_mask or position_ids not honoured)"
        )
        half.fix = (
            "pass the attention_mask to generate and left-pad the prompts; if the model is custom, let "
            "prepare_inputs_for_generation derive position_ids from the attention mask"
        )
    return half


@check(
    "L1",
    domain="llm",
    title="wrong padding side",
    roles=("model", "tokenizer"),
    optional_roles=("dataloader", "generation_prompts", "trainer"),
    settings=(
        Setting(
            "atol",
            1e-3,
            "largest |Δ| (nats) allowed between an example's mean NLL in the padded batch and "
            "alone; float32 rounding gives < 1e-5, while a position shift moves a trained GPT-2's loss by "
            "tenths of a nat and even a random-init one by > 5e-3",
        ),
        Setting(
            "noise_ratio",
            10.0,
            "a left-padded example fails only when its Δ is this many times the Δ left "
            "with position_ids from the attention mask (the rounding noise of the model's dtype)",
        ),
        Setting("max_new_tokens", 8, "greedy tokens generated per prompt in the generation half"),
        Setting("tie_margin", 0.05, "logit gap under which a float32 greedy divergence counts as a rounding tie"),
        Setting("tie_margin_half", 0.5, "the same for bfloat16/float16 models, whose logits round ~100x coarser"),
    ),
)
def check_padding_side(dlcheck):
    """Padded batches behave like their examples alone, in training and in batched generation.

    What it does
        Training half: on the sampled training batches, every padded row (attention_mask has zeros,
        not packed) is forwarded inside its batch exactly as collated (input_ids, attention_mask,
        position_ids if given) and alone (its real tokens only); the mean NLL over the same
        supervised next-token predictions must agree within `atol`. For left-padded rows the batch is
        forwarded again with position_ids = attention_mask.cumsum(-1) - 1: a row fails only when its
        difference is also `noise_ratio` times larger than what remains with correct positions. When
        that control gives bitwise the same losses, the model's forward ignores position_ids (a
        prompt-learning PEFT model drops them): the control is void and the difference is judged alone.
        A model that prepends virtual tokens (PEFT prompt tuning / P-tuning: its logits are
        num_virtual_tokens longer than input_ids) is read at its input's own positions, the virtual
        tokens' logits dropped, in the batch and alone.
        Generation half: runs only when the pipeline really generates in batches — the user defines
        `dlcheck_generation_prompts` (prompt strings, tokenized with `dlcheck_tokenizer` as configured,
        or the padded batch fed to generate), or the trainer is a TRL GRPOTrainer/RLOOTrainer/DistillationTrainer (its
        dataset's prompts, left-padded as TRL does itself). Greedy `generate` of the padded batch must
        give each prompt the same continuation as generating it alone (a divergence at a near-tie,
        logit gap <= `tie_margin`, is rounding and is ignored).
    Why it is bad
        Models with learned absolute positions (GPT-2, OPT, BLOOM-style wpe) number positions from the
        row start when no position_ids are given: a left-padded example's tokens sit as many positions
        later as it has pads, so training sees shifted positions it will never see alone or at
        inference. Rotary models (Llama, Qwen, Mistral) are invariant to that shift: measured in
        transformers 5.23, a left-padded tiny Llama without position_ids matches its examples alone to
        1e-6, so it passes. For generation the opposite side is wrong: with right padding the
        shorter prompts end in pads, generate reads the next token off a pad position and continues
        after the pads, so batched outputs differ from single-prompt outputs.
    Example
        tok.padding_side = "left"
        collator = DataCollatorForLanguageModeling(tok, mlm=False)     # GPT-2 trained on left pads
        ...
        enc = tok(prompts, padding=True, return_tensors="pt")          # padding_side="right"
        model.generate(**enc)                                          # batched generation
    Use instead
        tok.padding_side = "right" for training collators (or pass position_ids =
        (attention_mask.cumsum(-1) - 1).clamp(min=0)); tok.padding_side = "left" (or
        tok(prompts, padding=True, padding_side="left")) for batched generation. TRL GRPOTrainer and
        RLOOTrainer left-pad prompts themselves, whatever the tokenizer says.
    Known problems
        The training half needs padded, unpacked rows with an attention_mask (packed rows are L4's,
        masks that disagree with padding L14's); without them it does not decide. Left-padded rows
        also make the first real token a target predicted from a pad position; that is reported as
        evidence but not failed on its own (it is one token of noise per row). The generation half
        never runs for plain SFT/DPO training: right-padded training batches are correct there. When
        your inference code pads differently from dlcheck_tokenizer, return the exact batch you feed
        to generate from dlcheck_generation_prompts. A half that concerns the pipeline but cannot
        decide (prompts that make no padded batch, a model without generate, a GRPO/RLOO/distillation
        trainer that builds its training batches inside its step) makes the check skip when the other
        half does not decide either; when the other half passes, the pass is partly judged and names it.
        An encoder-decoder (T5, BART) is not measured yet: the training half skips (its forward needs
        the decoder inputs built from the labels).
    Not applicable
        Pipelines that neither pad their training batches (packed or padding-free rows, equal-length
        rows) nor generate in batches (no dlcheck_generation_prompts, no GRPO/RLOO/distillation
        trainer); batches that are not token batches.
        A sequence classifier (labels one per sequence) is judged by each padded example's loss
        against its own label in the batch and alone (a left-padded BERT pools a pad as its [CLS]).
    """
    model, tok = dlcheck.require("model", "tokenizer")
    halves = [_training_half(dlcheck, model, tok), _generation_half(dlcheck, model, tok)]
    failed = [h for h in halves if h.failed]
    if failed:
        many = len(failed) > 1
        evidence, causes, fixes = [], [], []
        for h in failed:
            evidence += [f"[{h.name}] {line}" if many and i == 0 else line for i, line in enumerate(h.evidence)]
            causes.append(f"{h.name}: {h.cause}" if many else h.cause)
            fixes.append(f"{h.name}: {h.fix}" if many else h.fix)
        dlcheck.fail(evidence, "; ".join(causes), "; ".join(fixes))
    if not any(h.decided for h in halves):
        reasons = "; ".join(f"{h.name}: {h.reason}" for h in halves)
        if not any(h.applicable for h in halves):
            dlcheck.not_applicable(reasons)
        dlcheck.skip(reasons)
    numbers: dict[str, Any] = {}
    for h in halves:
        numbers.update(h.numbers)
    lines = [line for h in halves if h.decided for line in h.measured]
    lines += [f"{h.name}: not checked, {h.reason}" for h in halves if not h.decided]
    for h in halves:
        if not h.decided and h.applicable:  # a half that concerns the pipeline and was not judged: a partial pass
            dlcheck.not_judged(h.name, h.reason)
    dlcheck.measured(*lines, **numbers)
