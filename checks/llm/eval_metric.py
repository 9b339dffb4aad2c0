"""L7: the eval perplexity / loss must average the NLL over supervised (label != -100) tokens only."""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import torch

from ...guard import eval_mode
from ...registry import Setting, check
from ...roles import is_hf_trainer
from ...session import user_call
from ...training import run_or_skip
from ...training.runs import is_grpo, is_reward_trainer, online_objective, preference_loss
from ..shared import lm
from .common import pipeline_kind, token_sample

#: the probability the contrast probe gives every supervised target (its NLL is -ln 0.99 = 0.01005)
CONTRAST_P = 0.99
#: keys of compute_metrics' result L7 reads, and how each maps to an NLL
PPL_WORDS = ("perplexity", "ppl")
NLL_WORDS = ("loss", "nll", "cross_entropy", "xent")


# --------------------------------------------------------------------------------------------------
# measurement


@dataclass
class Probe:
    """One set of logits fed to the user's metric, with the reference numbers computed independently."""

    name: str
    logits: list[torch.Tensor]  # per batch (B, T, V), float32, on the model's device
    labels: list[torch.Tensor]  # per batch (B, T), int64, same device
    #: valid reductions of the NLL over supervised next-token positions (name -> NLL)
    valid: dict[str, float] = field(default_factory=dict)
    supervised: int = 0
    positions: int = 0
    per_batch: list[float] = field(default_factory=list)
    results: dict[str, float] = field(default_factory=dict)  # metric key -> user's NLL-equivalent
    raw: dict[str, float] = field(default_factory=dict)  # metric key -> value as reported
    #: 1: labels[t] is predicted at t - 1 (a causal LM); 0: at t itself (a masked LM, a seq2seq decoder)
    shift: int = 1
    #: positions the model puts before the input's own (prompt learning's virtual tokens): its logits are that
    #: much longer than the batch's labels, and ``labels`` are the batch's padded on the left with -100 over
    #: them, as the model pads them for its own loss (the first label is then predicted by the last virtual token)
    prefix: int = 0
    #: with a prefix, the same reductions over the input's own next-token positions only (the first label not
    #: predicted): a metric that drops the virtual positions' logits computes these
    valid_inputs: dict[str, float] = field(default_factory=dict)

    def handed(self, labels: torch.Tensor) -> torch.Tensor:
        """The labels as the Trainer hands them to compute_metrics / compute_loss_func: the batch's own."""
        return labels[:, self.prefix :]


def supervised_nll(logits: torch.Tensor, labels: torch.Tensor, shift: int = 1) -> tuple[torch.Tensor, torch.Tensor]:
    """(nll, mask), both (B, T-shift): the NLL of each label at every position and where label != -100; with
    ``shift`` 1 the causal-LM next-token NLL (logits[t] against labels[t+1]), with 0 the masked-LM / seq2seq
    one (logits[t] against labels[t])."""
    target = labels[:, shift:]
    mask = target != lm.IGNORE
    logp = torch.log_softmax(logits[:, : logits.shape[1] - shift].float(), dim=-1)
    nll = -logp.gather(-1, target.clamp(min=0).unsqueeze(-1)).squeeze(-1)
    return nll.double() * mask, mask


def reference(probe: Probe) -> None:
    """Every reduction of the supervised-token NLL a correct metric may use: token-weighted (micro), mean of
    per-example means (macro), mean of per-batch means (Trainer's eval_loss), and for perplexities the mean of
    per-example perplexities. With a prefix (prompt learning) over the labels as the model pads them, and in
    ``valid_inputs`` over the input's own positions."""
    if probe.prefix:
        own = Probe(probe.name, [lg[:, probe.prefix :] for lg in probe.logits], [probe.handed(y) for y in probe.labels])
        own.shift = probe.shift
        reference(own)
        probe.valid_inputs = own.valid
    sums, counts, batch_means = [], [], []
    for logits, labels in zip(probe.logits, probe.labels):
        nll, mask = supervised_nll(logits, labels, probe.shift)
        s, c = nll.sum(1).cpu(), mask.sum(1).cpu()
        sums.append(s)
        counts.append(c)
        if c.sum() > 0:
            batch_means.append(float(s.sum() / c.sum()))
        probe.positions += probe.handed(labels).numel()  # the input's own positions (no virtual token's)
    s, c = torch.cat(sums), torch.cat(counts)
    probe.supervised = int(c.sum())
    probe.per_batch = batch_means
    if probe.supervised == 0:
        return
    example = s[c > 0] / c[c > 0]
    probe.valid = {
        "token-weighted mean": float(s.sum() / c.sum()),
        "mean of per-example means": float(example.mean()),
        "mean of per-batch means": float(sum(batch_means) / len(batch_means)),
        "mean of per-example perplexities": float(torch.log(torch.exp(example).mean())),
    }


def contrast(logits: torch.Tensor, labels: torch.Tensor, p: float = CONTRAST_P, shift: int = 1) -> torch.Tensor:
    """The model's logits with every supervised target (the next token's label with ``shift`` 1, the position's
    own with 0) raised to probability ``p`` exactly; the masked positions keep the model's own logits. Any
    metric that reads a masked position then moves far from -ln p, whatever the model's training state."""
    out = logits.clone()
    target = labels[:, shift:]
    b, t = (target != lm.IGNORE).nonzero(as_tuple=True)
    if len(b) == 0:
        return out
    y = target[b, t]
    rows = out[b, t].float()
    rows[torch.arange(len(y), device=rows.device), y] = float("-inf")
    out[b, t, y] = (torch.logsumexp(rows, -1) + math.log(p / (1 - p))).to(out.dtype)
    return out


def _concat(tensors: list[torch.Tensor], do_concat: bool = True) -> Any:
    """Batches gathered exactly as Trainer.evaluation_loop does (padded with -100 along dim 1, numpy)."""
    from transformers.trainer_pt_utils import EvalLoopContainer

    box = EvalLoopContainer(do_concat, padding_index=-100)
    for t in tensors:
        box.add(t)
    return box.get_arrays()


def metric_keys(result: Mapping) -> list[tuple[str, str, float]]:
    """(key, 'ppl'|'nll', value) for every scalar perplexity or loss in compute_metrics' result."""
    out = []
    for key, value in result.items():
        name = str(key).lower()
        kind = "ppl" if any(w in name for w in PPL_WORDS) else "nll" if any(w in name for w in NLL_WORDS) else None
        if kind is None:
            continue
        try:
            value = float(value.item() if hasattr(value, "item") else value)
        except (TypeError, ValueError):
            continue
        out.append((str(key), kind, value))
    return out


def as_nll(kind: str, value: float) -> float:
    if kind == "nll":
        return value
    return math.log(value) if value > 0 and math.isfinite(value) else float("nan")


def close(value: float, ref: float, atol: float, rtol: float) -> bool:
    return math.isfinite(value) and abs(value - ref) <= atol + rtol * abs(ref)


class NoLogits(Exception):
    """The model's output holds no (batch, seq, vocab) logits: L7 cannot compare the loss it reports."""


def forward_logits(model: Any, batch: dict) -> torch.Tensor:
    """The float logits of the user's model on a sampled batch; the model raising is the user's error (the
    batch is the pipeline's own), an output without logits :class:`NoLogits`."""
    device = lm.model_device(model)
    # a PEFT-wrapped model's forward takes **kwargs: the names are read through it (L7 had called it with none)
    accepted = lm.forward_names(model) or {"input_ids", "attention_mask"}
    accepted -= {"labels", "past_key_values", "use_cache", "logits_to_keep", "num_items_in_batch", "return_dict"}
    kwargs = {k: torch.as_tensor(v).to(device) for k, v in batch.items() if k in accepted and v is not None}
    if "use_cache" in lm.forward_names(model):
        kwargs["use_cache"] = False
    with eval_mode(model):
        out = user_call("model", lambda: model(**kwargs))
    logits = out.logits if hasattr(out, "logits") else out[0] if isinstance(out, (tuple, list)) else None
    if not isinstance(logits, torch.Tensor) or logits.dim() != 3:
        raise NoLogits(type(out).__name__)
    return logits.float()


def within_budget(batches: list[dict], vocab: int, max_mb: float) -> list[dict]:
    """The leading batches (rows trimmed from the last one) whose float32 logits fit in ``max_mb``."""
    budget = max_mb * 2**20 / 4 / vocab  # token positions
    kept, used = [], 0
    for batch in batches:
        ids = torch.as_tensor(batch["input_ids"])
        ids = ids.unsqueeze(0) if ids.dim() == 1 else ids
        rows, length = ids.shape
        fit = min(rows, int((budget - used) // max(length, 1)))
        if fit <= 0:
            break
        if fit < rows:
            batch = {k: (v[:fit] if hasattr(v, "__getitem__") and len(v) == rows else v) for k, v in batch.items()}
        kept.append(batch)
        used += fit * length
        if fit < rows:
            break
    return kept


def candidates(
    logits_np: Any, labels_np: Any, fill_ids: dict[str, int], shift: int = 1
) -> dict[str, tuple[float, int]]:
    """What common wrong metrics give on the same arrays: (NLL, positions averaged over); ``shift`` 0 for a model
    whose logits[t] score labels[t] (a masked LM), where shifting is the slip."""
    logits = torch.as_tensor(logits_np).float()
    labels = torch.as_tensor(labels_np).long()
    vocab = logits.shape[-1]
    out = {}

    def mean_nll(lg: torch.Tensor, tg: torch.Tensor, mask: torch.Tensor) -> tuple[float, int]:
        logp = torch.log_softmax(lg, -1)
        nll = -logp.gather(-1, tg.clamp(0, vocab - 1).unsqueeze(-1)).squeeze(-1).double()
        n = int(mask.sum())
        return (float((nll * mask).sum() / n) if n else float("nan")), n

    shifted, target = logits[:, :-1], labels[:, 1:]
    if shift == 0:
        out["supervised positions, labels shifted (logits[t] scored against labels[t+1])"] = mean_nll(
            shifted, target, target != lm.IGNORE
        )
        for what, token in fill_ids.items():
            filled = torch.where(labels == lm.IGNORE, torch.full_like(labels, token), labels)
            out[f"every position, label -100 read as {what}"] = mean_nll(logits, filled, torch.ones_like(labels))
        return out
    out["supervised positions, labels not shifted (logits[t] scored against labels[t])"] = mean_nll(
        logits, labels, labels != lm.IGNORE
    )
    for what, token in fill_ids.items():
        filled = torch.where(target == lm.IGNORE, torch.full_like(target, token), target)
        out[f"every position, label -100 read as {what}"] = mean_nll(shifted, filled, torch.ones_like(target))
        filled = torch.where(labels == lm.IGNORE, torch.full_like(labels, token), labels)
        out[f"every position, label -100 read as {what}, labels not shifted"] = mean_nll(
            logits, filled, torch.ones_like(labels)
        )
    return out


def describe_row(tok: Any, row: lm.Row, limit: int = 60) -> list[str]:
    """The row cut into runs of supervised / masked / padding positions, each decoded."""
    content = set(row.content)
    runs: list[tuple[str, list[int]]] = []
    for p, token in enumerate(row.input_ids):
        kind = "pad" if p not in content else "masked" if row.labels[p] == lm.IGNORE else "supervised"
        if runs and runs[-1][0] == kind:
            runs[-1][1].append(token)
        else:
            runs.append((kind, [token]))
    parts = []
    for kind, ids in runs:
        label = {"pad": "padding, label -100", "masked": "label -100", "supervised": "supervised"}[kind]
        if kind == "pad" and len(set(ids)) == 1:
            parts.append(f"[{label}] {lm.token_text(tok, ids[0])!r} x{len(ids)}")
        elif tok is not None:
            parts.append(f"[{label}] {lm.decode(tok, ids, limit)}")
        else:
            parts.append(f"[{label}] {len(ids)} tokens")
    return parts


def objective_trainer(trainer: Any) -> str | None:
    """The class name of a TRL trainer whose eval loss is its own objective (DPO's preference loss, GRPO's
    policy loss…), not a next-token NLL; None for transformers' Trainer and TRL's SFTTrainer."""
    if trainer is None:
        return None
    classes = [c for c in type(trainer).__mro__ if c.__module__.startswith("trl.") and c.__name__.endswith("Trainer")]
    if not classes or any(c.__name__ == "SFTTrainer" for c in classes):
        return None
    return type(trainer).__name__


def objective_said(trainer: Any) -> str:
    """What a TRL trainer's own objective is, as far as its objects tell (a trainer that generates in its step: a
    divergence from its teacher, a policy gradient on rewards, or its own objective on those completions)."""
    if is_grpo(trainer):
        return online_objective(trainer)
    kind = preference_loss(trainer)
    if kind is not None:
        return f"a preference loss ({kind.upper()}) of the policy against a reference model"
    if is_reward_trainer(trainer):
        return "a pairwise loss on chosen/rejected rewards"
    return "a loss of its own"


def own_compute_loss(trainer: Any) -> str | None:
    """The class that overrides Trainer.compute_loss outside transformers/TRL (its eval_loss is the user's
    own), else None."""
    for cls in type(trainer).__mro__:
        if "compute_loss" in vars(cls):
            return None if cls.__module__.startswith(("transformers.", "trl.")) else cls.__name__
    return None


def model_loss(model: Any) -> Any:
    """The model's own loss from logits and labels (transformers' ``loss_function``), or None."""
    try:
        fn = getattr(model, "loss_function", None)
    except Exception:  # noqa: BLE001 - a model whose loss_type cannot be resolved has none
        return None
    if not callable(fn):
        return None

    def loss(outputs: Any, labels: torch.Tensor, num_items_in_batch: Any = None) -> torch.Tensor:
        logits = outputs.logits
        return fn(logits, labels, vocab_size=logits.shape[-1], num_items_in_batch=num_items_in_batch)

    return loss


# --------------------------------------------------------------------------------------------------
# the check


@check(
    "L7",
    domain="llm",
    title="eval perplexity / loss averaged over pad or prompt tokens",
    roles=("model",),
    optional_roles=(
        "compute_metrics",
        "eval_dataset",
        "eval_dataloader",
        "collator",
        "tokenizer",
        "training_args",
        "trainer",
        "preprocess_logits_for_metrics",
    ),
    settings=(
        Setting(
            "atol",
            0.05,
            "absolute tolerance in nats between the metric's NLL and the supervised-token NLL; "
            "covers a metric computed in float16 (about 0.01 nats of rounding on logits of magnitude 20), while "
            "one masked position in 100 read at an NLL of ~5 nats already moves a metric by 0.05",
        ),
        Setting(
            "rtol",
            0.02,
            "relative tolerance on the NLL (2%, a perplexity off by about 2% at NLL 1): the "
            "reductions a correct metric may use are all accepted, so this only absorbs rounding",
        ),
        Setting(
            "max_logits_mb",
            128.0,
            "memory for the float32 logits of the probe (batches beyond it are not "
            "used): 8 rows of 512 tokens over a 32k vocabulary take 512 MB, so large vocabularies use fewer rows",
        ),
    ),
)
def check_eval_metric(dlcheck):
    """The eval perplexity (or loss) averages the next-token NLL over supervised positions only.

    What it does
        Runs the model on a few sampled eval batches (the dlcheck_collator on dlcheck_eval_dataset, or
        dlcheck_eval_dataloader, or the Trainer's eval split; without eval data, the training sample:
        the metric is a pure function of logits and labels), gathers logits and labels exactly as
        transformers' Trainer.evaluation_loop does (preprocess_logits_for_metrics per batch, batches
        padded with -100 and concatenated, numpy arrays, include_for_metrics and batch_eval_metrics
        honoured) and calls the user's compute_metrics with that EvalPrediction. Every key naming a
        perplexity ("perplexity", "ppl": compared as log) or a loss ("loss", "nll") must equal the NLL
        over positions whose shifted label is not -100, computed independently. Two probes: the model's
        own logits, and a contrast probe, the same logits with every supervised target raised to
        probability 0.99 (NLL 0.01005) while masked positions keep the model's logits, so reading a
        masked position shows whether the model is trained or not. A Trainer's compute_loss_func (the
        eval and training loss) is checked the same way, batch by batch. A model that prepends virtual
        tokens (PEFT prompt tuning / P-tuning) returns num_virtual_tokens more logit positions than the
        labels; the metric gets them as the Trainer hands them, and the reference scores the labels as the
        model pads them for its own loss (-100 over the virtual tokens, so the first label is predicted by
        the last virtual token) or over the input's own positions only: either is accepted.
    Why it is bad
        Labels are -100 at padding and, for completion-only training, at prompt tokens. A metric that
        averages over every position scores the model on predicting pad ids and prompts: eval
        perplexity is inflated or deflated by the padding share, changes with the batch size and the
        padding side, and model selection on it is noise. The classic slips: indexing log-probs with
        np.take_along_axis where -100 silently wraps to vocabulary id V-100; replacing -100 by the pad
        id so that cross_entropy accepts it; comparing logits[t] with labels[t] without the shift the
        model applies inside its own loss.
    Example
        def compute_metrics(p):
            logp = p.predictions[:, :-1] - logsumexp(p.predictions[:, :-1], -1, keepdims=True)
            nll = -np.take_along_axis(logp, p.label_ids[:, 1:, None], -1)   # -100 wraps around
            return {"perplexity": float(np.exp(nll.mean()))}                # every position
    Use instead
        def compute_metrics(p):
            logits, labels = torch.from_numpy(p.predictions[:, :-1]), torch.from_numpy(p.label_ids[:, 1:])
            nll = F.cross_entropy(logits.flatten(0, 1), labels.flatten(), ignore_index=-100)
            return {"perplexity": math.exp(nll)}
        or report exp(eval_loss), which the model computes over label != -100 only.
    Known problems
        Skips when compute_metrics reports no key naming a perplexity or loss, when the batches carry
        no labels (the Trainer then never calls compute_metrics), when prediction_loss_only is set, and
        when one row's logits exceed max_logits_mb. Labels are read as the model reads them (unshifted,
        shifted by one inside the loss). A Trainer reports eval_loss, the model's own loss, with or
        without compute_metrics: it is checked through model.loss_function on both probes (a Trainer
        subclass with its own compute_loss is not); wrong labels are L2's business. Without a Trainer
        the check needs dlcheck_compute_metrics. A metric using EvalPrediction.inputs sees the sampled
        input_ids.
        An encoder-decoder is not measured yet (a skip: its forward needs the decoder inputs, and a
        predict_with_generate metric reads generated ids, not logits).
    Not applicable
        TRL trainers whose eval loss is their own objective, not a next-token NLL: DPOTrainer,
        GRPOTrainer, RLOOTrainer, DistillationTrainer, KTOTrainer, RewardTrainer (each said with what its
        objects tell of its loss). Batches that are not token batches.
        Sequence and token classifiers (no perplexity over a vocabulary; decided from the objects,
        checks.llm.common.pipeline_kind). A masked LM is judged with each position's logits against
        its own label (ForMaskedLMLoss shifts nothing), a causal LM with the shift by one.
    """
    model = dlcheck.role("model")
    metrics_fn = dlcheck.optional("compute_metrics")
    trainer = dlcheck.optional("trainer")
    trainer = trainer if trainer is not None and is_hf_trainer(trainer) else None
    other = objective_trainer(trainer)
    if other:
        dlcheck.not_applicable(
            f"{other} evaluates its own objective ({objective_said(trainer)}), not a next-token NLL: its eval "
            "loss and metrics are no perplexity over supervised tokens"
        )
    pipeline = pipeline_kind(dlcheck)
    if not pipeline.vocabulary_logits:
        pipeline.not_for(dlcheck, "a language model's eval perplexity / loss over supervised tokens")
    unmeasured = pipeline.unmeasured("the eval loss / perplexity")
    if unmeasured:
        dlcheck.skip(unmeasured)
    shift = 1 if pipeline.causal else 0  # a masked LM (and a seq2seq decoder) scores logits[t] against labels[t]
    args = dlcheck.optional("training_args")
    loss_fn = getattr(trainer, "compute_loss_func", None) if trainer is not None else None
    # a Trainer reports eval_loss, the model's own loss, beside (or without) compute_metrics
    own = own_compute_loss(trainer) if trainer is not None else None
    eval_loss = model_loss(model) if trainer is not None and loss_fn is None and own is None else None
    if args is not None and getattr(args, "prediction_loss_only", False) and metrics_fn is not None:
        metrics_fn = None
        if loss_fn is None and eval_loss is None:
            dlcheck.skip("prediction_loss_only=True: the Trainer never calls compute_metrics")
    if metrics_fn is None and loss_fn is None and eval_loss is None:
        if trainer is None:
            dlcheck.skip(
                "missing role: define fixture dlcheck_compute_metrics (or dlcheck_trainer with compute_metrics) "
                "in conftest.py"
            )
        if own:
            dlcheck.skip(
                f"the Trainer has no compute_metrics, and its eval_loss comes from {own}.compute_loss, which L7 "
                "cannot feed the probe logits"
            )
        dlcheck.skip(
            f"the Trainer has no compute_metrics, and {type(model).__name__} has no loss_function to evaluate its "
            "eval_loss on the probe logits"
        )

    eval_given = (dlcheck.has("collator") and dlcheck.has("eval_dataset")) or dlcheck.has("eval_dataloader")
    split = "eval" if eval_given else "train"
    sample = token_sample(dlcheck, split)
    if not all("labels" in b for b in sample.batches):
        dlcheck.skip(
            f"batches from {sample.source} carry no labels: the Trainer calls compute_metrics only with labels"
        )
    lm.forward_ready(dlcheck, model, sample.batches)
    vocab = lm.embedding_rows(model) or 1
    batches = within_budget(sample.batches, vocab, dlcheck.setting("max_logits_mb"))
    if not batches:
        dlcheck.skip(
            f"one sampled row's logits exceed max_logits_mb={dlcheck.setting('max_logits_mb')} "
            "(raise it with --dlcheck-set L7.max_logits_mb=...)"
        )
    source = sample.source + ("" if eval_given else " (no eval data given: the training sample stands in)")

    device = lm.model_device(model)
    try:
        # root cause first: a VLM whose image tokens were cut is X4's finding, not a crash of L7
        logits = run_or_skip(dlcheck, lambda: [forward_logits(model, b) for b in batches])
    except NoLogits as exc:
        dlcheck.skip(f"the model's output carries no (batch, seq, vocab) logits ({exc})")
    labels = [torch.as_tensor(b["labels"]).long().to(device) for b in batches]
    labels = [y.unsqueeze(0) if y.dim() == 1 else y for y in labels]
    # a model that prepends virtual tokens (prompt learning) returns that many more positions; their labels are
    # -100, as the model pads them for its own loss (logits of any other length skip: lm.input_logits)
    for lg, y in zip(logits, labels):
        lm.input_logits(model, lg, y.shape[1])  # logits of a length no prepended virtual tokens explain: a skip
    prefix = max(lg.shape[1] - y.shape[1] for lg, y in zip(logits, labels))
    if prefix:
        labels = [torch.cat([torch.full_like(y[:, :prefix], lm.IGNORE), y], 1) for y in labels]
    probes = [
        Probe("the model's logits", logits, labels, shift=shift, prefix=prefix),
        Probe(
            "contrast probe (each supervised target at probability 0.99)",
            [contrast(lg, y, shift=shift) for lg, y in zip(logits, labels)],
            labels,
            shift=shift,
            prefix=prefix,
        ),
    ]
    for probe in probes:
        reference(probe)
    if probes[0].supervised == 0:
        dlcheck.skip(f"no supervised (label != -100) next-token position in {source}")

    atol, rtol = dlcheck.setting("atol"), dlcheck.setting("rtol")
    tok = dlcheck.optional("tokenizer")

    findings: list[list[str]] = []
    passed: list[str] = []  # what was judged and matched
    names: list[str] = []
    numbers: dict[str, Any] = {}
    if metrics_fn is not None:
        keys = None
        preprocess = dlcheck.optional("preprocess_logits_for_metrics")
        for probe in probes:
            result = _call_metrics(dlcheck, metrics_fn, preprocess, probe, args, batches)
            if not isinstance(result, Mapping):
                dlcheck.skip(f"compute_metrics returned a {type(result).__name__}, not a dict of metrics")
            found = metric_keys(result)
            if keys is None:
                keys = found
                reported = ", ".join(map(str, result)) or "none"
                if not found and loss_fn is None and eval_loss is None:
                    dlcheck.skip(
                        f"compute_metrics reports no perplexity or loss (keys: {reported}); L7 compares only "
                        "keys naming perplexity/ppl or loss/nll"
                    )
                if not found:
                    passed.append(f"compute_metrics reports no perplexity or loss (keys: {reported}): not judged")
            for key, kind, value in found:
                probe.results[key] = as_nll(kind, value)
                probe.raw[key] = value
        contrast_probe = probes[1]
        bad = [
            k
            for k, _, _ in keys or []
            if not any(
                close(contrast_probe.results.get(k, float("nan")), r, atol, rtol)
                for r in [*contrast_probe.valid.values(), *contrast_probe.valid_inputs.values()]
            )
        ]
        if bad:
            findings.append(_metric_evidence(bad, {k: kd for k, kd, _ in keys}, probes, tok, model))
        for key, kind, _ in keys or []:
            if key in bad:
                continue
            a, b = probes[0], probes[1]
            passed.append(
                f"compute_metrics()[{key!r}] = {_fmt(kind, a.raw[key])} on the model's logits, "
                f"{_fmt(kind, b.raw[key])} on the contrast probe; NLL over the supervised positions "
                f"{a.valid['token-weighted mean']:.4f} and {b.valid['token-weighted mean']:.4f}"
            )
            names.append(f"compute_metrics()[{key!r}]")
            numbers[key] = a.raw[key]
            numbers[f"{key} (contrast probe)"] = b.raw[key]
    if loss_fn is not None:
        bad_loss, line = _check_loss_func(
            dlcheck, loss_fn, probes, atol, rtol, "the Trainer's compute_loss_func", "trainer"
        )
        if bad_loss:
            findings.append(bad_loss)
        else:
            passed.append(line)
            names.append("compute_loss_func")
    if eval_loss is not None:
        bad_loss, line = _check_loss_func(
            dlcheck,
            eval_loss,
            probes,
            atol,
            rtol,
            "the model's own loss (model.loss_function: the Trainer's eval_loss)",
            "model",
        )
        if bad_loss:
            findings.append(bad_loss)
        else:
            passed.append(line)
            names.append("eval_loss")
    if prefix:
        passed.append(
            f"the model's logits have {prefix} positions more than the labels (the virtual tokens it prepends, prompt "
            f"learning), as the Trainer hands them: the reference scores the labels as the model pads them (-100 over "
            f"the virtual tokens, the first label predicted by the last one), or the input's own positions only"
        )
    if not findings:
        dlcheck.measured(
            f"{', '.join(names)} {'averages' if len(names) == 1 else 'each average'} the NLL over the "
            f"{probes[0].supervised} supervised (label != -100) of "
            f"{probes[0].positions} positions, on the model's logits and on the contrast probe (tolerance {atol:g} "
            f"nats + {rtol:.0%}); source: {source}",
            *passed,
            supervised=probes[0].supervised,
            positions=probes[0].positions,
            nll=probes[0].valid["token-weighted mean"],
            **numbers,
        )
        return

    rows = [r for r in lm.rows(batches) if r.labels is not None]
    example = next((r for r in rows if any(r.labels[p] == lm.IGNORE for p in r.content[1:])), None) or next(
        (r for r in rows if len(r.content) < len(r.input_ids)), rows[0]
    )  # a masked prompt, else padding
    masked_pad = masked_real = 0
    for r in rows:
        content = set(r.content)
        for p in range(1, len(r.labels)):
            if r.labels[p] == lm.IGNORE:
                if p in content:
                    masked_real += 1
                else:
                    masked_pad += 1
    evidence = [
        f"on {len(rows)} sampled examples from {source}: {probes[0].supervised} supervised "
        f"{'next-token ' if shift else ''}positions ({pipeline.why}); label -100 at {masked_pad} padding and {masked_real} real-token (prompt) positions"
    ]
    for lines in findings:
        evidence += lines
    if prefix:
        evidence.append(passed[-1])  # the virtual tokens' positions, and how the reference reads them
    evidence.append(f"example {example.batch}.{example.index}: " + " ".join(describe_row(tok, example)))
    culprit = findings[0][-1] if findings[0] and findings[0][-1].startswith("cause:") else ""
    evidence = [line for line in evidence if not line.startswith("cause:")]
    uses_metrics = metrics_fn is not None and len(findings) and findings[0][0].startswith("compute_metrics")
    uses_model = not uses_metrics and findings[0][0].startswith("the model's own loss")
    where = (
        "compute_metrics"
        if uses_metrics
        else "the model's own loss (what the Trainer reports as eval_loss)"
        if uses_model
        else "the Trainer's compute_loss_func"
    )
    if "labels shifted" in culprit:
        cause = (
            f"{where} scores logits[t] against labels[t+1] as for a causal LM; {pipeline.why}, whose logits at t "
            "predict the label at t itself, so each prediction is scored against its neighbour's label"
        )
    elif "not shifted" in culprit and "every position" not in culprit:
        cause = (
            f"{where} scores logits[t] against labels[t]; a causal LM's logits at t predict token t+1 "
            "(the model shifts labels by one inside its own loss), so each prediction is scored against "
            "the token it was conditioned on"
        )
    elif "every position" in culprit:
        read_as = culprit.split("read as ", 1)[1].split(",")[0] if "read as " in culprit else "a token"
        masked = " and ".join(w for w, n in (("padding", masked_pad), ("masked prompt tokens", masked_real)) if n)
        cause = (
            f"{where} averages the token NLL over every position: label -100 ({masked or 'masked positions'}) "
            f"is read as {read_as} instead of being left out"
            + (", and logits are not shifted against labels" if "not shifted" in culprit else "")
        )
    else:
        cause = (
            f"{where} does not average the NLL over label != -100 positions only: it includes masked "
            "(padding / prompt) positions or scores them otherwise than the model's loss does"
        )
    fix = (
        "mask and shift like the model: logits[:, :-1] against labels[:, 1:], keep labels != -100 only "
        "(F.cross_entropy(logits.flatten(0, 1), labels.flatten(), ignore_index=-100)); perplexity = exp(that mean)"
        ", or report exp(eval_loss)"
    )
    if shift == 0:
        fix = (
            "score each position against its own label, as the model's loss does: logits[t] against labels[t] (no "
            "shift for a masked LM), labels != -100 only (F.cross_entropy(logits.flatten(0, 1), labels.flatten(), "
            "ignore_index=-100)); perplexity = exp(that mean), or report exp(eval_loss)"
        )
    elif uses_model:
        fix = (
            "compute the model's loss like transformers' ForCausalLMLoss: logits[:, :-1] against labels[:, 1:] with "
            "ignore_index=-100 (do not override model.loss_function), or report a compute_metrics that does"
        )
    elif not uses_metrics:
        fix = (
            "in compute_loss_func: loss = F.cross_entropy(logits[:, :-1].flatten(0, 1), labels[:, 1:].flatten(), "
            "ignore_index=-100, reduction='sum') / num_items_in_batch (or drop compute_loss_func: the model's own "
            "loss masks -100)"
        )
    dlcheck.fail(evidence, cause, fix)


def _call_metrics(dlcheck: Any, fn: Any, preprocess: Any, probe: Probe, args: Any, batches: list[dict]) -> Any:
    """Call compute_metrics with the EvalPrediction Trainer.evaluation_loop would build from these batches."""
    from transformers import EvalPrediction

    include = list(getattr(args, "include_for_metrics", None) or [])
    batched = bool(getattr(args, "batch_eval_metrics", False))
    do_concat = bool(getattr(args, "eval_do_concat_batches", True))
    eval_bs = getattr(args, "eval_batch_size", None)
    preds, losses, inputs = [], [], []
    handed = [probe.handed(y) for y in probe.labels]  # a prompt-learning model's logits stay longer, as handed
    for logits, labels, batch, batch_mean in zip(probe.logits, handed, batches, _batch_losses(probe)):
        pred = logits
        if preprocess is not None:
            pred = dlcheck.call("preprocess_logits_for_metrics", lambda lg=logits, y=labels: preprocess(lg, y))
        preds.append(pred)
        losses.append(torch.tensor(batch_mean).repeat(eval_bs or len(labels)))
        inputs.append(torch.as_tensor(batch["input_ids"]))
    if batched:
        result = None
        for i, (pred, labels) in enumerate(zip(preds, handed)):
            kw = {
                "losses": losses[i] if "loss" in include else None,
                "inputs": inputs[i] if "inputs" in include else None,
            }
            ev = EvalPrediction(predictions=pred, label_ids=labels, **kw)
            last = i == len(preds) - 1
            result = dlcheck.call("compute_metrics", lambda ev=ev, last=last: fn(ev, compute_result=last))
        return result
    kw = {
        "losses": _concat(losses, do_concat) if "loss" in include else None,
        "inputs": _concat(inputs, do_concat) if "inputs" in include else None,
    }
    ev = EvalPrediction(predictions=_concat(preds, do_concat), label_ids=_concat(handed, do_concat), **kw)
    return dlcheck.call("compute_metrics", lambda: fn(ev))


def _batch_losses(probe: Probe) -> list[float]:
    """The model's own loss per batch (token mean over supervised positions), what eval_pred.losses holds."""
    out = []
    for logits, labels in zip(probe.logits, probe.labels):
        nll, mask = supervised_nll(logits, labels, probe.shift)
        out.append(float(nll.sum() / mask.sum().clamp(min=1)))
    return out


def _fmt(kind: str, value: float) -> str:
    return f"{value:.4g}" if kind == "nll" else f"{value:.4g} (NLL {as_nll(kind, value):.4f})"


def _metric_evidence(bad: list[str], kinds: dict[str, str], probes: list[Probe], tok: Any, model: Any) -> list[str]:
    lines = []
    key = bad[0]
    kind = kinds[key]
    for probe in probes:
        ref = probe.valid["token-weighted mean"]
        ref_text = f"{ref:.4f}" + (f" (perplexity {math.exp(ref):.4g})" if kind == "ppl" and ref < 700 else "")
        user = probe.results.get(key, float("nan"))
        same = probe is probes[0] and close(user, ref, 0.05, 0.02)
        lines.append(
            f"compute_metrics()[{key!r}] = {_fmt(kind, probe.raw.get(key, float('nan')))} on {probe.name}; "
            f"NLL over the {probe.supervised} supervised (label != -100) positions = {ref_text}"
            + (
                " (alike: this model's NLL is about the same at every position, so the contrast probe decides)"
                if same
                else ""
            )
        )
    if len(bad) > 1:
        lines.append(f"also off: {', '.join(repr(k) for k in bad[1:])}")
    # which wrong reduction the number matches, on both probes
    fill = {}
    pad = lm.special_id(tok, "pad") if tok is not None else None
    if pad is None:
        pad = getattr(getattr(model, "config", None), "pad_token_id", None)
    if isinstance(pad, int):
        fill[f"the pad id {pad}"] = pad
    eos = lm.special_id(tok, "eos") if tok is not None else None
    if isinstance(eos, int) and eos not in fill.values():
        fill[f"the eos id {eos}"] = eos
    vocab = probes[0].logits[0].shape[-1]
    fill[f"vocabulary id {vocab - 100} (numpy index -100 wraps around)"] = vocab - 100
    if 0 not in fill.values():
        fill["token id 0"] = 0
    # a prompt-learning model's logits at its own positions (the virtual tokens' dropped), as a metric reads them
    cand = [
        candidates(
            _concat([lg[:, p.prefix :] for lg in p.logits]), _concat([p.handed(y) for y in p.labels]), fill, p.shift
        )
        for p in probes
    ]
    total = cand[0]
    match, best = None, float("inf")
    for name in total:
        errors = [abs(p.results.get(key, float("nan")) - c[name][0]) for p, c in zip(probes, cand)]
        if (
            all(close(p.results.get(key, float("nan")), c[name][0], 0.01, 0.005) for p, c in zip(probes, cand))
            and max(errors) < best
        ):
            match, best = name, max(errors)
    if match:
        n = cand[1][match][1]
        lines.append(
            f"the reported number matches the NLL averaged over {n} positions "
            f"({match}): {cand[1][match][0]:.4f} on the contrast probe, {cand[0][match][0]:.4f} on the "
            f"model's logits, against {probes[1].supervised} supervised positions"
        )
        lines.append(f"cause: {match}")
    else:
        lines.append(
            f"the reported number matches no average over the {probes[1].supervised} supervised positions "
            f"({probes[1].positions} positions in the padded batches)"
        )
    return lines


def _check_loss_func(
    dlcheck: Any, loss_fn: Any, probes: list[Probe], atol: float, rtol: float, what: str, role: str
) -> tuple[list[str] | None, str]:
    """(the failure's lines, or None; what was compared) for a loss computed from logits and labels, batch
    by batch on both probes; ``role`` owns the loss (its exceptions are that role's). The labels are those the
    Trainer hands it: the batch's own to compute_loss_func; to the model's own loss those the model pads itself
    (a prompt-learning model's, -100 over its virtual tokens). With virtual tokens a loss may score the first
    label (predicted by the last virtual token) or not, and the Trainer's num_items_in_batch counts the
    batch's own shifted labels: each of these averages is accepted."""
    from transformers.modeling_outputs import CausalLMOutputWithPast

    compared, worst = 0, 0.0
    for probe in probes:
        for i, (logits, labels) in enumerate(zip(probe.logits, probe.labels)):
            nll, mask = supervised_nll(logits, labels, probe.shift)
            n = int(mask.sum())
            if n == 0:
                continue
            refs = [float(nll.sum() / n)]
            count = n
            if probe.prefix:
                own_nll, own_mask = supervised_nll(logits[:, probe.prefix :], probe.handed(labels), probe.shift)
                count = int(own_mask.sum())
                refs += [float(own_nll.sum() / max(count, 1)), float(nll.sum() / max(count, 1))]
            ref = refs[0]
            outputs = CausalLMOutputWithPast(logits=logits)
            target = (labels if role == "model" else probe.handed(labels)).clone()
            count_t = torch.tensor(count, device=labels.device)
            value = dlcheck.call(role, lambda o=outputs, y=target, c=count_t: loss_fn(o, y, num_items_in_batch=c))
            value = float(value.detach().float().mean()) if isinstance(value, torch.Tensor) else float(value)
            if not any(close(value, r, atol, rtol) for r in refs):
                cand = candidates(logits.cpu(), labels.cpu(), {"token id 0": 0}, probe.shift)
                match = next((k for k, (c, _) in cand.items() if close(value, c, 0.01, 0.005)), None)
                lines = [
                    f"{what} gives {value:.4f} on batch {i} ({probe.name}); "
                    f"NLL over its {n} supervised (label != -100) positions = {ref:.4f} "
                    f"({labels.numel()} positions in the batch)"
                ]
                if match:
                    lines.append(f"cause: {match}")
                return lines, ""
            compared += 1
            worst = max(worst, min(abs(value - r) for r in refs))
    return None, (
        f"{what} equals the supervised-token NLL batch by batch ({compared} batch-probe pairs, largest |Δ| "
        f"{worst:.1e} nats)"
    )
