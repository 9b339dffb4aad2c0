"""What the llm checks share: the sampled training batches as token rows, with the tokenizer."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from ...errors import MISSING
from ...sampling import Sample, get_sample, sample_rows
from ..shared import lm


def token_sample(ctx: Any, split: str = "train", predicts_tokens: bool = True) -> Sample:
    """The shared sample; not applicable unless its batches carry input_ids (image batches, a GRPO prompt
    loader do not), nor, for a check about what a model learns from the tokens (``predicts_tokens``), when the
    model predicts no tokens (a CLIP-style dual encoder: its token batches are still read by the checks of the
    tokens themselves, a mask that disagrees with the padding)."""
    kind = pipeline_kind(ctx) if predicts_tokens else None
    if kind is not None and kind.name == lm.NOT_LM:
        ctx.not_applicable(f"{kind.why}; the llm checks concern models that predict tokens or classify text")
    sample = get_sample(ctx, split)
    if not lm.has_token_batches(sample.batches):
        keys = sorted(sample.batches[0]) if sample.batches else []
        ctx.not_applicable(
            f"batches from {sample.source} carry no input_ids (keys: {', '.join(map(str, keys)) or 'none'}): "
            "they are not token batches"
        )
    attach_tokens(ctx, sample)
    return sample


def attach_tokens(ctx: Any, sample: Sample, max_rows: int = 8, max_tokens: int = 128) -> None:
    """The report's picture of the batch: each token with its label and attention state."""
    tok = ctx.role("tokenizer")
    view = []
    for row in lm.rows(sample.batches)[:max_rows]:
        n = min(len(row.input_ids), max_tokens)
        view.append(
            {
                "name": f"{row.batch}.{row.index}",
                "input_ids": row.input_ids[:n],
                "tokens": [lm.token_piece(tok if tok else None, i) for i in row.input_ids[:n]],
                "labels": row.labels[:n] if row.labels is not None else None,
                "attention_mask": row.attention_mask[:n] if row.attention_mask is not None else None,
                "doc_starts": [s for s, _ in row.documents() if s < n],
            }
        )
    ctx.attach("tokens", rows=view, caption=sample.source)


def labelled_rows(ctx: Any, sample: Sample) -> list[lm.Row]:
    rows = lm.rows(sample.batches)
    if all(r.labels is None for r in rows):
        if any(lm.seq2seq_targets(b) for b in sample.batches):
            ctx.skip(
                f"batches from {sample.source} carry an encoder-decoder's targets (labels of another length than "
                "input_ids): they are no labels of the inputs' positions, and the decoder's side is not judged yet"
            )
        ctx.skip(f"batches from {sample.source} carry no labels (the model or the trainer derives its targets itself)")
    return rows


def locate(sample: Sample, rows: list[lm.Row]) -> dict[int, tuple[lm.Row, int, int]]:
    """Example index -> (row, start, end) of its tokens in the collated batches: a row per example, or
    one document of a packed row when the batch packs exactly its examples."""
    if sample.batch_rows is None:
        return {}
    by_batch: dict[int, list[lm.Row]] = {}
    for r in rows:
        by_batch.setdefault(r.batch, []).append(r)
    out = {}
    for b, group in enumerate(sample.batch_rows):
        brows = by_batch.get(b, [])
        if len(brows) == len(group):
            for j, i in enumerate(group):
                out[i] = (brows[j], 0, len(brows[j].input_ids))
        elif len(brows) == 1 and len(brows[0].documents()) == len(group):
            for j, (s, e) in enumerate(brows[0].documents()):
                out[group[j]] = (brows[0], s, e)
    return out


@dataclass(frozen=True)
class PipelineKind:
    """What the pipeline trains, decided once per session from its objects (:func:`pipeline_kind`): which llm
    checks concern it and how its labels line up with its tokens."""

    #: one of lm.CAUSAL, lm.MASKED, lm.SEQ2SEQ, lm.SEQUENCE_CLASSIFIER, lm.TOKEN_CLASSIFIER, lm.QUESTION_ANSWERING,
    #: lm.NOT_LM
    name: str
    #: what decided it, for the reasons a check gives ("BertForSequenceClassification is a sequence classifier")
    why: str

    @property
    def generates(self) -> bool:
        """The model generates text (stops on EOS, reads chat templates, has prompts and completions)."""
        return self.name in (lm.CAUSAL, lm.SEQ2SEQ)

    @property
    def causal(self) -> bool:
        """labels[t] is predicted at position t - 1 (the model shifts the labels inside its loss)."""
        return self.name == lm.CAUSAL

    @property
    def token_labels(self) -> bool:
        """The labels are one per token (-100 where not supervised), not one per sequence (a classifier) nor an
        answer span's start/end positions (extractive question answering)."""
        return self.name not in (lm.SEQUENCE_CLASSIFIER, lm.QUESTION_ANSWERING)

    @property
    def vocabulary_logits(self) -> bool:
        """The model's logits range over the token vocabulary (a language model), not over classes."""
        return self.name in (lm.CAUSAL, lm.MASKED, lm.SEQ2SEQ)

    def unmeasured(self, what: str) -> str | None:
        """Why ``what`` is not measured on this kind (an encoder-decoder: the check's forward would need the
        decoder inputs the model builds from the labels), or None. The check concerns it: a skip, not n/a."""
        if self.name != lm.SEQ2SEQ:
            return None
        return (
            f"{what} not measured for an encoder-decoder yet ({self.why}): its forward needs the decoder inputs "
            "the model builds from the labels, which this check does not feed"
        )

    def require(self, ctx: Any, *kinds: str, concerns: str) -> None:
        """Not applicable unless the pipeline is one of ``kinds``."""
        if self.name not in kinds:
            self.not_for(ctx, concerns)

    def not_for(self, ctx: Any, concerns: str) -> None:
        """Not applicable: ``concerns`` says what the check is about ("causal LMs that generate")."""
        ctx.not_applicable(f"{self.why}; this check concerns {concerns}")


def pipeline_kind(ctx: Any) -> PipelineKind:
    """What the pipeline trains, from its objects, once per session: the model's head class in transformers'
    task mappings; without a model the collator transformers gives for the task (masked-LM, token-classification,
    seq2seq); else the sampled labels, one per sequence (a classifier) or one per token. A pipeline none of them
    marks otherwise is a causal LM, what the llm checks were written for."""
    model, collator = ctx.role("model"), ctx.role("collator")

    def make() -> PipelineKind:
        kind = _collator_kind(collator)
        name = type(getattr(collator, "data_collator", None) or collator).__name__
        if kind == PERMUTATION:
            # the objective is the collator's: it masks spans and sets which positions are targets (special tokens
            # never are), whatever task mapping the model's head also sits in (XLNetLMHeadModel: causal LM too)
            return PipelineKind(
                lm.MASKED, f"the collator ({name}) prepares batches for a permutation LM (masked spans as targets)"
            )
        if model is not MISSING:
            task = lm.model_task(model)
            if task is not None:
                return PipelineKind(task[0], f"the model ({task[1]}) is a {task[0]}")
        if kind is not None:
            return PipelineKind(kind, f"the collator ({name}) prepares batches for a {kind}")
        if ctx.role("dataloader") is not MISSING or collator is not MISSING:
            not_lm = lm.predicts_no_tokens(model) if model is not MISSING else None
            batches = get_sample(ctx).batches
            seq = [b for b in batches if "input_ids" in b and lm.sequence_labels(b)]
            if seq and len(seq) == len(batches):
                shape = torch_shape(seq[0]["labels"])
                return PipelineKind(
                    lm.SEQUENCE_CLASSIFIER,
                    f"the batches' labels are one per sequence (shape {shape} beside input_ids "
                    f"{tuple(torch_shape(seq[0]['input_ids']))}): a sequence classifier",
                )
            if not_lm is not None:
                return PipelineKind(lm.NOT_LM, not_lm)
        elif model is not MISSING and (not_lm := lm.predicts_no_tokens(model)) is not None:
            return PipelineKind(lm.NOT_LM, not_lm)
        return PipelineKind(lm.CAUSAL, "a causal LM (no model head, collator or labels say otherwise)")

    return ctx.memo((model, collator, ctx.role("dataloader")), "llm:pipeline_kind", make)


def torch_shape(value: Any) -> tuple[int, ...]:
    import torch

    return tuple(torch.as_tensor(value).shape)


#: what :func:`_collator_kind` says of a permutation-LM collator: a masked objective, which decides over the model's head
PERMUTATION = "permutation LM"


def _collator_kind(collator: Any) -> str | None:
    """The kind a transformers collator is made for (DataCollatorForLanguageModeling with mlm=True: masked LM;
    DataCollatorForPermutationLanguageModeling: :data:`PERMUTATION`; DataCollatorForTokenClassification;
    DataCollatorForSeq2Seq), else None."""
    if collator is MISSING or collator is None:
        return None
    inner = getattr(collator, "data_collator", None)  # the Trainer's RemoveColumnsCollator wraps the user's
    if inner is not None and callable(inner):
        collator = inner
    if not type(collator).__module__.startswith("transformers."):
        return None  # not a transformers collator (and transformers need not be imported to say so)
    try:
        import transformers
    except ImportError:
        return None
    if isinstance(collator, transformers.DataCollatorForLanguageModeling):
        return lm.MASKED if getattr(collator, "mlm", False) else None
    if isinstance(collator, getattr(transformers, "DataCollatorForPermutationLanguageModeling", ())):
        return PERMUTATION
    if isinstance(collator, transformers.DataCollatorForTokenClassification):
        return lm.TOKEN_CLASSIFIER
    if isinstance(collator, transformers.DataCollatorForSeq2Seq):
        return lm.SEQ2SEQ
    return None


#: TRL trainers that generate from batches of prompts during training (they left-pad the prompts themselves, and
#: train on each prompt concatenated with its completion, one per padded row: nothing packed)
ONLINE_TRAINERS = ("GRPOTrainer", "RLOOTrainer", "DistillationTrainer")


def online_trainer(trainer: Any) -> str | None:
    """The class name of a TRL online (generating) trainer, else None."""
    if trainer is MISSING or trainer is None:
        return None
    for cls in type(trainer).__mro__:
        if cls.__module__.startswith("trl.") and cls.__name__ in ONLINE_TRAINERS:
            return type(trainer).__name__
    return None


#: fields of a raw example that hold its text before tokenization; a row with none of them is pre-tokenized
TEXT_FIELDS = ("text", "prompt", "completion", "messages", "conversations", "chosen", "rejected")


@dataclass
class RawView:
    """The raw examples behind the sample, and whether they line up with its batches."""

    rows: list[Any]
    #: True: ``rows[i]`` is the example of ``sample.rows[i]`` (collator + dataset); False: a few rows of
    #: dlcheck_raw_dataset that tell what the data holds, but cannot be matched to dataloader batches
    aligned: bool

    def pre_tokenized(self) -> bool:
        """No row carries text (only token ids): what the data was before tokenization is unknown. Rows whose
        text sits in columns of other names (``instruction``/``output``, ``question``/``context``) are not
        pre-tokenized: :meth:`other_text` names those columns."""
        return not any(isinstance(r, Mapping) and any(f in r for f in TEXT_FIELDS) for r in self.rows) and not (
            self.other_text()
        )

    def other_text(self) -> list[str]:
        """The columns holding strings when no row carries a field of TEXT_FIELDS (text under names of the
        user's own), sorted; empty otherwise."""
        if any(isinstance(r, Mapping) and any(f in r for f in TEXT_FIELDS) for r in self.rows):
            return []
        return sorted({k for r in self.rows if isinstance(r, Mapping) for k, v in r.items() if isinstance(v, str)})


def raw_view(ctx: Any, sample: Sample) -> RawView | None:
    """The sample's raw rows (every field, even those a Trainer removed before collation) when the sample
    knows its examples; else a few rows of dlcheck_raw_dataset (given, or derived from a Trainer); None
    when there is neither (a bare dataloader)."""
    if sample.raw_rows is not None:
        return RawView(list(sample.raw_rows), True)
    rows = raw_rows(ctx)
    return None if rows is None else RawView(rows, False)


def raw_rows(ctx: Any) -> list[Any] | None:
    """A few rows of dlcheck_raw_dataset (given, or derived from dlcheck_dataset or a Trainer), or None."""
    raw = ctx.role("raw_dataset")
    if raw is MISSING:
        return None
    return list(ctx.memo(raw, f"llm:raw_rows:{ctx.samples}", lambda: sample_rows(raw, ctx.samples, "raw_dataset")[0]))


def raw_given(ctx: Any) -> bool:
    """dlcheck_raw_dataset is the user's own fixture (not the dataset or a Trainer's train split standing in)."""
    return ctx.given("raw_dataset")


def packed_examples(sample: Sample) -> bool:
    """The dataset's own rows pack several examples each (TRL's SFTConfig(packing=True) keeps their lengths
    in seq_lengths): no raw example lines up with them."""
    return any(isinstance(r, Mapping) and len(r.get("seq_lengths") or []) > 1 for r in sample.rows or [])


def unmatched(sample: Sample) -> str:
    """Why dataloader batches cannot be judged against their raw examples, naming the fixtures that would let
    the check match them."""
    return (
        f"the rows of {sample.source} cannot be matched to their raw examples: define "
        "dlcheck_collator and dlcheck_dataset (the examples as the collator takes them; dlcheck_raw_dataset in the "
        "same order when the dataset lost its text columns), or dlcheck_trainer"
    )
