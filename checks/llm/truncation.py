"""L13: truncation leaves every example some supervision, and most of them their completion's end."""

from __future__ import annotations

from typing import Any

import pytest

from ...guard import preserved_rng, seed_everything
from ...registry import Setting, check
from ...sampling import get_sample, spread_positions
from ...session import user_call
from ..shared import lm
from .common import labelled_rows, pipeline_kind, token_sample
from .labels_masked import Example, analyse, encode, example_name, short

#: table rows read to find an example of what TRL dropped (bounded, whatever the dataset size)
DROPPED_PROBES = 64


def _max_length(args: Any) -> tuple[int | None, str]:
    value = getattr(args, "max_length", None) if args is not None else None
    if isinstance(value, int) and not isinstance(value, bool) and value > 0:
        return value, f"{type(args).__name__}.max_length"
    return None, ""


def _trl_sft_trainer(trainer: Any) -> bool:
    return any(c.__module__.startswith("trl.") and c.__name__ == "SFTTrainer" for c in type(trainer).__mro__)


def trl_dropped(ctx: Any, tok: Any) -> tuple[int, int, list[tuple[int, dict]]] | None:
    """(dropped, total, examples) when TRL's SFT preparation filtered out examples left without any
    supervised label by its truncation to max_length.

    TRL 1.16 ``SFTTrainer._prepare_dataset`` truncates input_ids and labels with
    ``slice(None, max_length)`` (truncation_mode "keep_start") and then
    ``dataset.filter(any(label != -100))``: the filter keeps the full Arrow table under an indices
    mapping, so ``len(dataset.data) - len(dataset)`` is how many it dropped (every earlier ``map``
    flattened any indices of the user's own). Only read on the train_dataset of an SFTTrainer, which
    is the prepared one. A few table rows, spread over it, show one."""
    trainer = ctx.role("trainer")
    if not ctx.has("trainer") or not _trl_sft_trainer(trainer):
        return None
    args = trainer.args
    max_length, _ = _max_length(args)
    if max_length is None or getattr(args, "packing", False):
        return None
    kwargs = getattr(args, "dataset_kwargs", None)
    if isinstance(kwargs, dict) and kwargs.get("skip_prepare_dataset"):
        return None
    raw = trainer.train_dataset
    data = getattr(raw, "data", None)
    try:
        total, kept = int(data.num_rows), len(raw)
        table = getattr(data, "table", data)
        names = list(table.column_names)
    except Exception:
        return None
    if total <= kept or "labels" not in names:
        return None
    found = []
    for p in spread_positions(total, DROPPED_PROBES):
        try:
            row = table.slice(p, 1).to_pylist()[0]
        except Exception:
            break
        labels = row.get("labels") or []
        if labels and all(lab == lm.IGNORE for lab in labels):
            found.append((p, row))
            if len(found) >= 3:
                break
    return total - kept, total, found


def _packed(row: lm.Row) -> bool:
    pos = row.position_ids
    return pos is not None and bool(pos) and isinstance(pos[0], int) and sum(1 for p in pos if p == 0) > 1


def _pct(x: float) -> str:
    return f"{x:.0%}"


def _completion_cut(ex: Example) -> bool | None:
    """True when truncation removed the end of the completion (its EOS with it), False when the
    completion is whole, None when unknown."""
    if ex.cut == "end":
        return True
    if ex.cut == "none":
        return False
    if ex.cut == "start":  # left truncation: only the prompt side is lost, unless it reached the completion
        if ex.full is not None and ex.n_prompt is not None:
            return len(ex.positions) < len(ex.full) - ex.n_prompt
        return False
    return None


def _infer_limit(examples: list[Example], eos: int | None) -> int | None:
    """Without raw text or a configured max_length: a length at which at least two sampled examples
    stop without EOS, the longest in the sample, while shorter ones end with EOS, is a truncation
    limit (the tokenizer call's max_length)."""
    if eos is None or not examples:
        return None
    longest = max(len(ex.positions) for ex in examples)
    at_limit = [ex for ex in examples if len(ex.positions) == longest and ex.ids[-1] != eos]
    shorter_with_eos = [ex for ex in examples if len(ex.positions) < longest and ex.ids[-1] == eos]
    return longest if len(at_limit) >= 2 and shorter_with_eos else None


#: how many times the rows of examples left without a target are collated again (other seeds): a collator that draws
#: its targets at random (a masked or permutation LM's) gives most of them targets on one of these draws
REDRAWS = 8


def _redrawn(sample: Any, collator: Any, unsupervised: list[Example]) -> list[Example]:
    """The examples among ``unsupervised`` that get a target when the same rows are collated again under other seeds:
    their collator draws its targets at random (a masked LM's 15%, a permutation LM's spans, which it never puts on a
    special token), so one draw that leaves a row no target is that draw's, not supervision the data lost. A collator
    that draws nothing collates the same rows to the same labels: none. Needs the rows the sample was collated from."""
    if sample.rows is None or sample.batch_rows is None or collator is None:
        return []
    where = {i: (b, j) for b, group in enumerate(sample.batch_rows) for j, i in enumerate(group)}
    wanted: dict[int, list[Example]] = {}
    for ex in unsupervised:
        if ex.index in where and not _packed(ex.row):
            wanted.setdefault(where[ex.index][0], []).append(ex)
    found: list[Example] = []
    for b, exs in wanted.items():
        group = sample.batch_rows[b]
        labels = sample.batches[b].get("labels")
        if labels is None:
            continue
        left = list(exs)
        for seed in range(1, REDRAWS + 1):
            with preserved_rng():
                seed_everything(seed)
                again = user_call("collator", lambda: collator([sample.rows[i] for i in group]))
            redrawn = again.get("labels") if hasattr(again, "get") else None
            if redrawn is None or tuple(redrawn.shape) != tuple(labels.shape):
                break
            for ex in left:
                j = where[ex.index][1]
                if bool((redrawn[j] != -100).any()) and not bool((redrawn[j] == labels[j]).all()):
                    found.append(ex)
                    left = [e for e in left if e is not ex]
            if not left:
                break
    return found


def _labelled(ex: Example) -> list[int]:
    """Positions of ``ex`` whose label is not -100 (whether or not the loss can use them)."""
    own = set(ex.positions)
    return [i for i in ex.row.supervised if i in own]


def _unsupervised_line(tok: Any, unsupervised: list[Example], first_only: list[Example], total: int) -> str:
    """The evidence for examples without a usable target, stating what their labels actually hold."""
    n = len(unsupervised)
    all_masked = n - len(first_only)
    if not first_only:
        return f"{n} of {total} sampled examples have no supervised token: every label is -100"
    ex = first_only[0]
    shown = lm.show_labels(tok, ex.row, _labelled(ex)[:3])
    what = (
        f"{len(first_only)} supervise only their first token ({example_name(ex)}: {shown}), which a causal LM "
        "never predicts (labels aligned with input_ids are shifted inside the loss)"
    )
    if all_masked:
        what = f"{all_masked} have every label -100 and {what}"
    return f"{n} of {total} sampled examples have no supervised token the loss can use: {what}"


@check(
    "L13",
    domain="llm",
    property_mode=True,
    title="truncation removes all supervision or the EOS",
    roles=("tokenizer", "dataloader"),
    optional_roles=("raw_dataset", "training_args", "trainer"),
    settings=(
        Setting(
            "max_unsupervised_share",
            0.0,
            "share of sampled (or, for TRL, prepared) examples allowed to have no "
            "supervised token at all; 0 because such an example only costs compute and a batch of them "
            "makes the loss NaN",
        ),
        Setting(
            "max_cut_share",
            0.25,
            "share of sampled examples allowed to lose the end of their completion "
            "(and its EOS) to truncation; a long tail of over-long examples, normal in SFT data, rarely "
            "exceeds it (with 5% of examples over max_length, 3 or more of 8 samples are cut 0.6% of the "
            "time), while a max_length below the typical example length cuts most of them",
        ),
        Setting(
            "max_examples",
            256,
            "examples read when the training dataset stores its token ids (a datasets.Dataset with input_ids and no "
            "transform: reading and collating them runs no model), spread evenly over it; the few over-long "
            "examples that lose every label are rare in a sample of 8. Elsewhere the session's samples",
        ),
    ),
)
def check_truncation(dlcheck):
    """Truncation leaves every example supervised tokens, and most completions their end and EOS.

    What it does
        On the sampled training batches (up to ``max_examples`` examples spread over a training dataset that stores
        its token ids, collated by dlcheck_collator: cheap, no model runs; else the session's samples): no example
        may have every label -100 (fails with the
        example decoded and its length against max_length and its prompt length). An example left without a target
        that truncation did not cut is collated again with the same rows under other seeds (up to 8 draws): one that
        gets targets then was left without by a collator that draws its targets at random (a masked or permutation
        LM's spans may all fall on special tokens or past the row), not by truncation, and is said so in the pass. For every example
        whose raw row gives its full text (prompt+completion, text, messages) the collated tokens
        are compared with its complete tokenization: a proper prefix means the end, with the EOS,
        was cut. Without raw text, an example exactly max_length long (SFTConfig.max_length, or a
        length where several sampled examples stop without EOS while shorter ones end with it)
        and not ending with EOS counts as cut. Fails when the share of cut completions exceeds
        max_cut_share. With a TRL SFTTrainer it also reads how many examples TRL's preparation
        dropped because truncation left them without any supervised token.
    Why it is bad
        TRL and tokenizers truncate "keep_start": the start of prompt+completion is kept, so a
        max_length shorter than the prompts removes the whole completion. TRL 1.16's SFTTrainer
        (SFTConfig.max_length, default 1024, truncation_mode "keep_start"; "keep_end" is
        deprecated) builds the labels, slices input_ids and labels to [:max_length], then silently
        filters out the examples left with every label -100; packing skips that step and its "bfd"
        strategy truncates over-long documents instead. A hand collator feeds such examples: they
        cost compute for no signal, and a batch of them gives a NaN loss. Completions cut at the
        end lose their EOS: the model trains on unfinished answers and never learns to stop on them.
    Example
        SFTConfig(max_length=6) with completion-only loss while most prompts are longer than 6
        tokens; tokenizer(prompt + completion, truncation=True, max_length=16) with the prompt masked
    Use instead
        a max_length that fits the data (SFTConfig(max_length=...) / the tokenizer call's
        max_length) — the evidence gives the longest sampled sequence; drop or shorten over-long
        examples; truncate the prompt from the left (tokenizer.truncation_side = "left" on the
        prompt alone) so the completion is kept.
    Known problems
        Needs labels in the batch. The cut share needs the raw rows (dlcheck_raw_dataset, or a
        Trainer) or a max_length to compare with; packed rows without raw text are judged by
        max_length only. Deliberate truncation of long pretraining documents counts as cut: raise
        max_cut_share or ignore L13 there.
    Not applicable
        Batches that are not token batches; a sequence classifier (a truncated text keeps its one
        label); an extractive question-answering model (start/end positions, no per-token labels). (Every pipeline with per-token labels is judged for examples left without
        supervision; a masked LM or token classifier has no completion to find cut.)
    """
    tok = dlcheck.role("tokenizer")
    args = dlcheck.role("training_args") if dlcheck.has("training_args") else None
    max_length, source = _max_length(args)
    eos = lm.special_id(tok, "eos")
    evidence: list[str] = []
    causes: list[str] = []
    fixes: list[str] = []

    dropped = trl_dropped(dlcheck, tok)
    if dropped and dropped[0] / dropped[1] > dlcheck.setting("max_unsupervised_share"):
        n, total, found = dropped
        trl_max, trl_source = _max_length(dlcheck.role("trainer").args)
        evidence.append(
            f"TRL SFTTrainer dropped {n} of {total} training examples ({_pct(n / total)}) while preparing "
            f"the dataset: after truncation to {trl_source}={trl_max} every label was -100"
        )
        longest_prompt = 0
        for p, row in found[:2]:
            prompt = row.get("prompt")
            if isinstance(prompt, str):
                n_prompt = len(encode(tok, prompt) or [])
                longest_prompt = max(longest_prompt, n_prompt)
                evidence.append(
                    f"dropped: row {p} of the data given to SFTTrainer, prompt {short(prompt, 80)} is "
                    f"{n_prompt} tokens, max_length {trl_max}"
                )
            else:
                evidence.append(
                    f"dropped: row {p} of the data given to SFTTrainer, {lm.decode(tok, row.get('input_ids') or [])} "
                    f"({len(row.get('input_ids') or [])} tokens kept, all labels -100)"
                )
        causes.append(
            f"{trl_source}={trl_max} is shorter than the prompts: TRL truncates keep_start (input_ids[:max_length]), so "
            "nothing of these completions survives and TRL silently filters the examples out: they never train"
        )
        fixes.append(
            "raise SFTConfig(max_length=...) above the longest prompt+completion"
            + (f" (a dropped prompt alone is {longest_prompt} tokens)" if longest_prompt else "")
            + ", or shorten/filter the over-long prompts"
        )

    try:
        sample = token_sample(dlcheck)
        kind = pipeline_kind(dlcheck)
        if not kind.token_labels:  # a truncated text keeps its one label: no supervised token to lose
            kind.not_for(dlcheck, "per-token supervision that truncation can cut off")
        labelled_rows(dlcheck, sample)
        # reading stored token ids runs no model: more examples than the shared sample, for the few over-long ones
        sample = get_sample(dlcheck, wide=dlcheck.setting("max_examples"))
    except pytest.skip.Exception:
        if evidence:  # TRL dropped every example: there is nothing left to sample
            dlcheck.fail(evidence, causes[0], fixes[0])
        raise
    analysis = analyse(dlcheck, sample, tok)
    # a packed row's leading fragment whose positions do not start at 0 continues a document of the
    # previous row (wrapped packing): cut by design, judged with its first part
    examples = [
        ex
        for ex in analysis.examples
        if ex.row.labels is not None
        and ex.positions
        and not (_packed(ex.row) and ex.row.position_ids[ex.positions[0]] != 0)
    ]

    # cut status of every example: from its raw text, else from the length limit
    status = {id(ex): _completion_cut(ex) for ex in examples}
    limit, limit_source = max_length, source
    if limit is None:
        limit = _infer_limit([ex for ex in examples if status[id(ex)] is None], eos)
        if limit is not None:
            limit_source = f"inferred: several sampled examples stop at exactly {limit} tokens without EOS"
    if limit is not None:
        for ex in examples:
            if status[id(ex)] is None and ex.ids:
                if len(ex.positions) < limit or ex.ids[-1] == eos:
                    status[id(ex)] = False
                elif len(ex.positions) == limit:
                    status[id(ex)] = True
    judged = [ex for ex in examples if status[id(ex)] is not None]
    cut = [ex for ex in judged if status[id(ex)]]
    if limit is None and cut:
        lengths = {len(ex.positions) for ex in cut}
        if len(lengths) == 1:
            limit = lengths.pop()
            limit_source = f"every cut example holds exactly {limit} tokens"
    fulls = [len(ex.full) for ex in examples if ex.full is not None]
    longest = max(fulls) if fulls else None

    def length_note(ex: Example) -> str:
        note = f"{len(ex.positions)}"
        if ex.full is not None and status[id(ex)]:
            note += f" of its {len(ex.full)}"
        note += " tokens kept"
        if ex.n_prompt is not None:
            note += f", the prompt alone is {ex.n_prompt}"
        return note

    limit_line = f"max_length {limit} ({limit_source})" if limit is not None else ""

    unsupervised = [ex for ex in examples if not ex.targets]
    # a row the collator's random draw left without a target (and that truncation did not cut) gets targets when the
    # same rows are collated again: not lost supervision
    drawn = (
        _redrawn(sample, dlcheck.role("collator") if dlcheck.has("collator") else None, unsupervised)
        if unsupervised
        else []
    )
    drawn = [ex for ex in drawn if not status[id(ex)]]
    unsupervised = [ex for ex in unsupervised if all(ex is not d for d in drawn)]
    if unsupervised and len(unsupervised) / len(examples) > dlcheck.setting("max_unsupervised_share"):
        ex = unsupervised[0]
        # what the labels do hold: with labels aligned to input_ids the first token's label is never a
        # target (a causal LM does not predict its first token), so "no target" is not "every label -100"
        first_only = [e for e in unsupervised if _labelled(e)]
        evidence += (
            [_unsupervised_line(tok, unsupervised, first_only, len(examples))]
            + ([limit_line] if limit_line else [])
            + [
                f"{example_name(ex)}: {lm.decode(tok, ex.ids)} ({length_note(ex)})",
            ]
        )
        if ex.full is not None and status[id(ex)]:
            evidence.append(f"  cut off: {lm.decode(tok, ex.full[len(ex.positions) :])}")
        truncated = [e for e in unsupervised if status[id(e)]]
        if truncated:
            where = f"to {limit} tokens " if limit is not None else ""
            prompt = f" the prompt alone is {ex.n_prompt} tokens, so" if ex.n_prompt is not None else ""
            causes.append(
                f"truncation {where}keeps the start of prompt+completion (truncation_side='right' / "
                f"keep_start):{prompt} nothing of the completion survives and every label is -100 — these "
                "examples cost compute, carry no signal, and a batch of them gives a NaN loss"
            )
            fixes.append(
                "raise max_length above the longest prompt+completion"
                + (f" (the longest sampled is {longest} tokens)" if longest else "")
                + " (SFTConfig(max_length=...) / tokenizer(..., max_length=...)), drop examples whose prompt "
                "alone exceeds it, or truncate the prompt from the left (tokenizer.truncation_side='left' on "
                "the prompt alone) so the completion is kept"
            )
        elif first_only and len(first_only) == len(unsupervised):
            causes.append(
                "these examples supervise only their first token, which the loss never uses (the labels are "
                "shifted inside the model: position 0 predicts nothing): an example of one token, or one whose "
                "prompt masking left only the first label, carries no signal and costs compute"
            )
            fixes.append(
                "drop examples shorter than two tokens and make sure each completion keeps labels past the first "
                "position (an empty prompt and completion collate to a lone EOS)"
            )
        elif all(status[id(e)] is False for e in unsupervised):
            causes.append(
                "every label is -100 although these examples are complete (not truncated): the prompt "
                "masking removes the completion too (a response template that never matches, or a "
                "completion mask built from the wrong column)"
            )
            fixes.append(
                "fix the label masking so that the completion tokens keep their labels; print "
                "tokenizer.decode of the supervised tokens of one example to see it"
            )
        else:
            causes.append("every label of these examples is -100: the completion was truncated away or masked")
            fixes.append("make max_length cover prompt+completion and make sure the completion keeps its labels")

    if judged and len(cut) / len(judged) > dlcheck.setting("max_cut_share"):
        ex = next((e for e in cut if e.targets), cut[0])
        evidence += (
            [
                f"{len(cut)} of {len(judged)} sampled examples ({_pct(len(cut) / len(judged))}) lost the end of their "
                f"completion, EOS included, to truncation (threshold {_pct(dlcheck.setting('max_cut_share'))})",
            ]
            + ([limit_line] if limit_line and limit_line not in evidence else [])
            + [
                f"{example_name(ex)}: {lm.decode(tok, ex.ids)} ({length_note(ex)})",
            ]
        )
        if ex.full is not None and ex.cut == "end":
            evidence.append(f"  cut off: {lm.decode(tok, ex.full[len(ex.positions) :])}")
        where = f"max_length {limit} ({limit_source})" if limit is not None else "the truncation length"
        causes.append(
            f"{where} is shorter than these sequences: truncation keeps the start and drops the end of "
            "the completion with its EOS, so the model trains on unfinished answers and does not learn "
            "to stop"
        )
        fixes.append(
            "raise max_length to cover the data"
            + (f" (the longest sampled sequence is {longest} tokens)" if longest else "")
            + ": SFTConfig(max_length=...) or the tokenizer call's max_length; or filter/shorten the "
            "over-long examples; --dlcheck-set L13.max_cut_share=... to accept more truncation"
        )

    if evidence:
        dlcheck.fail(evidence, "; and ".join(dict.fromkeys(causes)), "; and ".join(dict.fromkeys(fixes)))
    if not examples:
        dlcheck.skip(f"no labelled example to judge in the batches of {sample.source}")
    lines = [
        f"{len(examples) - len(unsupervised)} of {len(examples)} sampled examples keep supervised tokens after "
        f"truncation; source: {sample.source}"
    ]
    if drawn:
        lines.append(
            f"{len(drawn)} of them had no target on the sample's draw of the collator's random masking but get targets "
            "when the same rows are collated again (not truncated: a random draw's, not supervision lost)"
        )
    if judged:
        lines.append(
            f"{len(cut)} of {len(judged)} judged examples lost the end of their completion (threshold "
            f"{_pct(dlcheck.setting('max_cut_share'))})"
            + (f"; {limit_line}" if limit_line else "")
            + (f"; longest complete sequence {longest} tokens" if longest else "")
        )
    elif not kind.generates:
        lines.append(f"cut completions: none to judge, {kind.why} (no completion)")
    else:
        lines.append(
            "cut completions not judged: no raw text to compare with and no max_length (give dlcheck_raw_dataset, "
            "or a Trainer whose arguments set max_length)"
        )
        dlcheck.not_judged(
            "cut completions",
            "no raw text to compare with and no max_length (give dlcheck_raw_dataset, or a Trainer whose "
            "arguments set max_length)",
        )
    if dropped:
        lines.append(f"TRL SFTTrainer dropped {dropped[0]} of {dropped[1]} examples while preparing the dataset")
    dlcheck.measured(
        *lines,
        examples=len(examples),
        unsupervised=len(unsupervised),
        judged=len(judged),
        cut=len(cut),
        max_length=limit,
        trl_dropped=dropped[0] if dropped else 0,
    )
