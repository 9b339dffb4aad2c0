"""L6: information on the logits' normaliser log Z, the quantity z-loss keeps near 0 in long runs."""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import torch

from ...isolation import CheckTimeout
from ...registry import Setting, check
from ...training import find_setup, modes, probe, run_or_skip, smoke_run
from ...training.runs import NotTheBatch, model_call
from ...training.setup import SMOKE_READERS, smoke_steps
from ..shared import lm
from .common import pipeline_kind, token_sample


@dataclass
class LogZ:
    mean: float
    low: float
    high: float
    positions: int

    def text(self) -> str:
        return f"{self.mean:.3g} (range {self.low:.3g} to {self.high:.3g}, {self.positions} positions)"


def _summary(values: list[torch.Tensor]) -> LogZ | None:
    """Mean and range of the finite log Z values measured, or None when there is none."""
    if not values:
        return None
    z = torch.cat(values)
    z = z[torch.isfinite(z)]
    if z.numel() == 0:
        return None
    return LogZ(float(z.mean()), float(z.min()), float(z.max()), int(z.numel()))


def _positions(row: Mapping[str, Any], length: int) -> torch.Tensor:
    """The positions whose logits a training step scores: those predicting a supervised label, else every
    attended position, else all."""
    labels = row.get("labels")
    if isinstance(labels, torch.Tensor) and labels.dim() == 2 and labels.shape[1] == length:
        keep = torch.zeros(length, dtype=torch.bool)
        keep[:-1] = labels[0, 1:].cpu() != -100
        if keep.any():
            return keep
    mask = row.get("attention_mask")
    if isinstance(mask, torch.Tensor) and mask.dim() == 2 and mask.shape[1] == length:
        return mask[0].cpu().bool()
    return torch.ones(length, dtype=torch.bool)


def measure(forward: Any, model: Any, batches: list[Any], rows: int, budget_mb: float) -> LogZ | None:
    """log Z = logsumexp of the logits over the vocabulary, at the scored positions of the first ``rows``
    rows; eval mode, no gradients. One pass per batch for the rows it holds when their float32 logits fit in
    ``budget_mb`` (the 4 rows of a sampled batch: one forward of the fresh model, one of the trained one),
    else one row at a time (a row's logits cut to ``budget_mb``)."""
    whole = _fits(batches, rows, lm.embedding_rows(model), budget_mb)
    values = []
    seen = 0
    with modes(model, train=False), torch.no_grad():
        for batch in batches:
            if seen >= rows:
                break
            if not isinstance(batch, Mapping) or not isinstance(batch.get("input_ids"), torch.Tensor):
                return None
            size = batch["input_ids"].shape[0]
            take = min(size, rows - seen)
            for a, b in [(0, take)] if whole else [(i, i + 1) for i in range(take)]:
                part = _rows(batch, size, a, b)
                out = lm.logits_of(forward(part))
                if out is None:
                    return None
                # the input's own positions: a prompt-tuned model's prepended virtual tokens dropped
                out = lm.input_logits(model, out, part["input_ids"].shape[-1])
                length = out.shape[1]
                for j in range(b - a):
                    keep = _positions(_rows(part, b - a, j, j + 1), length)
                    if not whole:
                        cap = max(1, int(budget_mb * 2**20 / (4 * out.shape[-1])))
                        keep[cap:] = False
                    z = torch.logsumexp(out[j, :length][keep.to(out.device)].float(), dim=-1)
                    values.append(z.cpu())
                seen += b - a
    return _summary(values)


def _rows(batch: Mapping[str, Any], size: int, a: int, b: int) -> dict[str, Any]:
    """Rows ``a:b`` of a collated batch of ``size`` rows (its other values as they are)."""
    return {
        k: v[a:b] if isinstance(v, torch.Tensor) and v.dim() > 0 and v.shape[0] == size else v for k, v in batch.items()
    }


def _fits(batches: list[Any], rows: int, vocab: int | None, budget_mb: float) -> bool:
    """Whether the float32 logits of each batch holding the first ``rows`` rows fit in ``budget_mb``."""
    if not vocab:
        return False
    seen = 0
    for batch in batches:
        if seen >= rows:
            break
        ids = batch.get("input_ids") if isinstance(batch, Mapping) else None
        if not isinstance(ids, torch.Tensor) or ids.dim() != 2:
            return False
        if ids.numel() * vocab * 4 > budget_mb * 2**20:
            return False
        seen += ids.shape[0]
    return True


def measure_shared(dlcheck: Any, model: Any, batches: list[Any], rows: int) -> LogZ | None:
    """:func:`measure` on the current weights, read from the forward of each sampled batch as collated that the
    llm checks share (``lm.batch_forward``, which L1 makes too): no pass of its own. A row's log Z is the one
    training sees, inside its batch."""
    values = []
    seen = 0
    for batch in batches:
        if seen >= rows:
            break
        if not isinstance(batch, Mapping) or not isinstance(batch.get("input_ids"), torch.Tensor):
            return None
        ids = batch["input_ids"]
        if ids.dim() != 2:
            return None
        forward = lm.batch_forward(dlcheck, model, batch)
        if forward is None:
            return None
        size, length = ids.shape[0], forward.logz.shape[1]
        for i in range(min(size, rows - seen)):
            row = {
                k: v[i : i + 1] if isinstance(v, torch.Tensor) and v.dim() > 0 and v.shape[0] == size else v
                for k, v in batch.items()
            }
            keep = _positions(row, length)
            values.append(forward.logz[i][keep])
            seen += 1
    return _summary(values)


def _vocabulary_logits(dlcheck: Any) -> None:
    kind = pipeline_kind(dlcheck)
    if not kind.vocabulary_logits:
        kind.not_for(dlcheck, "a language model's log Z over its vocabulary (its logits range over classes here)")
    unmeasured = kind.unmeasured("log Z")
    if unmeasured:
        dlcheck.skip(f"info: {unmeasured}")


@check(
    "L6",
    domain="llm",
    title="logit drift in long runs (info: reports log Z, what z-loss keeps near 0)",
    roles=(),
    optional_roles=("trainer", "make_training", "lightning_module", "model", "collator", "dataset", "dataloader"),
    settings=(
        Setting("rows", 4, "sampled rows whose logits are measured"),
        Setting(
            "max_logits_mb",
            256.0,
            "float32 logits of one batch at most, else one row at a time (longer rows are measured on their "
            "first positions)",
        ),
    ),
)
def check_logit_drift(dlcheck):
    """Information: the mean log Z of the logits, and how a short run of your training moves it.

    What it does
        Computes log Z = logsumexp(logits) over the vocabulary at the positions your training scores
        (those predicting a supervised label) of a few sampled rows, in eval mode; on the current weights
        it reads them from the one forward of each sampled batch that the llm checks share with L1 (one
        row at a time when a batch's logits exceed ``max_logits_mb``). A model that prepends virtual
        tokens (PEFT prompt tuning) is read at its input's own positions, the virtual tokens' dropped. When a training set-up is given
        (``dlcheck_trainer``, ``dlcheck_make_training``, a Lightning module) and the shared smoke run
        (``S1.steps`` optimizer steps) is made anyway — a check before L6 made it, or S1-S3, which always
        read it, are selected (``--dlcheck=llm,smoke``) — it measures the fresh model and again after that
        run, and reports the drift. Otherwise it reports the current weights' value (``dlcheck_model``,
        derived from a Trainer) and says the drift was not measured: it never starts a training run of
        its own. It never fails: the item skips with the numbers; a smoke run that outlasts the item's
        time limit is reported as not measured, not as a timeout (S1 makes it again).
    Why it is bad
        The softmax ignores a constant added to every logit, so nothing in the cross-entropy stops log Z
        from wandering; in long runs (bf16 especially) the logits grow, the softmax saturates and the loss
        spikes or diverges. PaLM's z-loss, 1e-4 · log²Z added to the loss, keeps log Z near 0 at no cost
        to quality (OLMo 2, Chameleon and many pretraining recipes use it). A steady drift over a
        20-step smoke run is the early sign.
    Example
        loss = F.cross_entropy(logits.view(-1, V), labels.view(-1))               # log Z left free
    Use instead
        z = torch.logsumexp(logits.float(), dim=-1); loss = ce + 1e-4 * (z[labels != -100] ** 2).mean()
        (torchtune / OLMo expose it as a z-loss multiplier; in a Trainer, override compute_loss)
    Known problems
        Information only: the right log Z depends on the model (a fresh model sits near ln(vocab) when
        its logits are small), and 20 steps show a trend, not a long run.
        An encoder-decoder is not measured yet (an info skip: its forward needs the decoder inputs).
        A model whose forward takes the token ids positionally and names no ``input_ids`` (a hand-written
        GPT's ``forward(idx, input_pos=None)``, read through Fabric's and DDP's wrappers) is called
        ``model(ids)``, as its loss calls it, with the attention mask and positions only where its forward
        names them.
    Not applicable
        Models that are not torch.nn.Module or return no (batch, positions, vocabulary) logits, and
        batches that are not token batches: there is no log Z to report. Sequence and token
        classifiers (their logits range over classes, not a vocabulary; what the pipeline trains is
        decided once from its objects, checks.llm.common.pipeline_kind).
    """
    rows, budget = dlcheck.setting("rows"), dlcheck.setting("max_logits_mb")
    if dlcheck.has("model") and lm.model_task(dlcheck.role("model")) is not None:  # the head decides: no sample
        _vocabulary_logits(dlcheck)
    # information never pays for a training run of its own: L6 reads the shared smoke run when a check before it
    # made it, or when a selected check that always reads it (S1-S3) makes it anyway (the run is counted once,
    # for whoever asks first); otherwise it reports the current weights and says the drift was not measured
    setup = find_setup(dlcheck)
    made = setup is not None and dlcheck.state.made(setup.sources, f"smoke:{smoke_steps(dlcheck)}")
    anyway = setup is not None and bool({c.id for c in dlcheck.state.selected} & set(SMOKE_READERS))
    if made or anyway:
        _drift(dlcheck, setup, rows, budget)
    after_run = (
        "after a short run: not measured: select the smoke checks (--dlcheck=llm,smoke) to measure how the shared "
        "smoke run moves log Z (L6 trains nothing by itself)"
        if setup is not None
        else "after a short run: not measured: give a training (dlcheck_trainer, dlcheck_make_training or a "
        "Lightning module) and select the smoke checks to measure how the shared smoke run moves log Z"
    )

    model = dlcheck.require("model")[0]
    if not isinstance(model, torch.nn.Module):
        dlcheck.not_applicable(f"dlcheck_model is a {type(model).__name__}, not a torch.nn.Module: no logits to read")
    sample = token_sample(dlcheck)
    _vocabulary_logits(dlcheck)
    try:  # the model-call rule: a model whose forward does not take the token batch (a UNet) is not concerned
        fields = {
            k: v for k, v in dict(sample.batches[0]).items() if k in ("input_ids", "attention_mask", "position_ids")
        }
        if not lm.ids_positionally(model):  # a forward(idx): the ids are its first input (lm.lm_call)
            model_call(model, fields)
    except NotTheBatch as exc:
        dlcheck.not_applicable(str(exc).removeprefix("not applicable: "))
    lm.forward_ready(dlcheck, model, sample.batches)

    if _fits(sample.batches, rows, lm.embedding_rows(model), budget):
        now = measure_shared(dlcheck, model, sample.batches, rows)
    else:  # a batch's logits would exceed the budget: one row at a time, a pass each

        def forward(row: Mapping[str, Any]) -> Any:
            device = lm.model_device(model)
            kwargs = {
                k: row[k].to(device)
                for k in ("input_ids", "attention_mask", "position_ids")
                if isinstance(row.get(k), torch.Tensor)
            }
            return dlcheck.call("model", lambda: lm.lm_call(model, kwargs))

        now = measure(forward, model, sample.batches, rows, budget)
    if now is None:
        dlcheck.skip("info: dlcheck_model returns no (batch, positions, vocabulary) logits: no log Z to report")
    vocab = lm.embedding_rows(model)
    dlcheck.skip(
        f"info: mean log Z {now.text()} on {sample.source} with the current weights"
        + (f"; ln(vocabulary {vocab}) = {math.log(vocab):.3g}" if vocab else "")
        + f"; {after_run} (z-loss, 1e-4 · log²Z added to the loss, keeps it near 0 in long runs)"
    )


def _forward(made: Any) -> Any:
    """The forward of a fresh or trained model on a token batch: the training's own call (by keyword), or, for a
    forward that takes the ids positionally and names no ``input_ids``, ``model(ids)`` (:func:`lm.lm_call`)."""
    model = made.model
    if not lm.ids_positionally(model):
        return made.forward

    def forward(part: Mapping[str, Any]) -> Any:
        device = lm.model_device(model)
        return lm.lm_call(model, {k: v.to(device) if isinstance(v, torch.Tensor) else v for k, v in part.items()})

    return forward


def _drift(dlcheck: Any, setup: Any, rows: int, budget: float) -> None:
    """log Z on the fresh model and after the shared smoke run, reported as an info skip. The run is made here
    only when a selected smoke check makes it anyway; should it outlast this item's time limit, the drift is
    reported as not measured (an information item never times out) and the smoke check makes it again."""
    fresh, batches, _ = probe(dlcheck)
    # the rows of the first batch (at most ``rows``): one forward of the fresh model and one of the trained one,
    # within the llm checks' 10 forward passes together (a batch of 2 rows: 2 passes, not 4)
    batches = batches[:1]
    if all(isinstance(b, Mapping) for b in batches) and lm.has_token_batches(batches):
        lm.forward_ready(dlcheck, fresh.model, batches)  # ids past the embedding table: L3's failure
    before = run_or_skip(dlcheck, lambda: measure(_forward(fresh), fresh.model, batches, rows, budget))
    if before is None:
        dlcheck.skip(
            "info: the training batches are not token batches with input_ids, or the model returns no "
            "(batch, positions, vocabulary) logits: no log Z to report"
        )
    try:
        run = smoke_run(dlcheck)
    except CheckTimeout as exc:
        dlcheck.skip(
            f"info: mean log Z {before.text()} at initialisation; after the smoke run: not measured (the shared "
            f"smoke run did not finish within the {exc.seconds:g} s time limit of this item; S1 makes it again)"
        )
    trained = run.trained
    after = run_or_skip(dlcheck, lambda: measure(_forward(trained), trained.model, batches, rows, budget))
    if after is None:
        dlcheck.skip(f"info: mean log Z {before.text()} at initialisation; not measurable after the smoke run")
    drift = after.mean - before.mean
    vocab = lm.embedding_rows(fresh.model)
    parts = [
        f"info: mean log Z {before.text()} at initialisation, {after.text()} after {run.steps} smoke steps "
        f"of {setup.describe()}: {drift:+.3g} ({drift / max(run.steps, 1):+.2g} per step)"
    ]
    if vocab:
        parts.append(f"ln(vocabulary {vocab}) = {math.log(vocab):.3g}")
    parts.append("z-loss (1e-4 · log²Z added to the loss) keeps it near 0 in long runs")
    dlcheck.skip("; ".join(parts))
