"""L8: the dataset's columns fit the trainer, and conversations reach the model through the chat template."""

from __future__ import annotations

import re
import unicodedata
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import pytest

from ...errors import MISSING
from ...registry import Setting, check, not_concerned
from ...roles import is_hf_trainer
from ...sampling import get_sample, sample_rows
from ..shared import lm
from .common import pipeline_kind, unmatched

#: columns whose text is meant to reach the model (a column of any name holding a conversation too)
PAYLOAD = (
    "text",
    "prompt",
    "completion",
    "chosen",
    "rejected",
    "messages",
    "conversations",
    "conversation",
    "dialogue",
    "dialog",
    "chat",
    "response",
    "answer",
    "output",
    "target",
    "instruction",
    "question",
    "input",
    "query",
    "solution",
    "context",
    "system",
)
PREFERENCE = ("DPOTrainer", "RewardTrainer", "ORPOTrainer", "CPOTrainer")
PROMPT_ONLY = ("GRPOTrainer", "RLOOTrainer", "OnlineDPOTrainer", "AsyncGRPOTrainer")
CONFIGS = {
    "SFTConfig": "sft",
    "DPOConfig": "preference",
    "RewardConfig": "preference",
    "ORPOConfig": "preference",
    "CPOConfig": "preference",
    "GRPOConfig": "prompt-only",
    "RLOOConfig": "prompt-only",
    "KTOConfig": "kto",
}
NEEDS = {
    "sft": "'text' (or SFTConfig.dataset_text_field), 'messages', or 'prompt' + 'completion'",
    "preference": "'chosen' + 'rejected' (with an optional 'prompt' they do not repeat)",
    "prompt-only": "'prompt' (a string, or a list of messages; other columns go to the reward functions)",
    "kto": "'prompt' + 'completion' + 'label'",
}
COLUMNS = {
    "sft": "'text', 'messages' or 'prompt' + 'completion'",
    "preference": "'prompt', 'chosen', 'rejected'",
    "prompt-only": "'prompt'",
    "kto": "'prompt', 'completion', 'label'",
}
_WORD = re.compile(r"[^\W_]{3,}")


# --------------------------------------------------------------------------------------------------
# helpers


def _fold(text: str) -> str:
    """NFKC, case-folded, accents dropped (uncased tokenizers strip them)."""
    text = unicodedata.normalize("NFKD", unicodedata.normalize("NFKC", text).casefold())
    return "".join(ch for ch in text if not unicodedata.combining(ch))


def norm(text: str) -> str:
    """Folded and whitespace removed: what survives any tokenizer's decode round trip."""
    return "".join(_fold(text).split())


def words(text: str) -> set[str]:
    return set(_WORD.findall(_fold(text)))


def is_conversation(value: Any) -> bool:
    return (
        isinstance(value, list)
        and bool(value)
        and isinstance(value[0], Mapping)
        and ("role" in value[0] or ("from" in value[0] and "value" in value[0]))
    )


def as_messages(value: Any) -> list[dict]:
    """role/content messages (ShareGPT from/value converted the way TRL's maybe_convert_to_chatml does)."""
    out = []
    for m in value:
        if "role" in m:
            out.append(dict(m))
        else:
            out.append({"role": m.get("from"), "content": m.get("value")})
    return out


def contents(messages: list[dict]) -> list[str]:
    return [m["content"] for m in messages if isinstance(m.get("content"), str) and m["content"].strip()]


def payload_text(value: Any) -> str | None:
    if isinstance(value, str):
        return value if value.strip() else None
    if is_conversation(value):
        return "\n".join(contents(as_messages(value))) or None
    return None


def trainer_kind(trainer: Any, args: Any) -> tuple[str | None, str]:
    """(kind, the class that told it): sft, preference, prompt-only, kto, lm (a plain transformers Trainer)."""
    if trainer is not None:
        names = [c.__name__ for c in type(trainer).__mro__]
        for name in names:
            if name == "SFTTrainer":
                return "sft", type(trainer).__name__
            if name in PREFERENCE:
                return "preference", type(trainer).__name__
            if name in PROMPT_ONLY:
                return "prompt-only", type(trainer).__name__
            if name == "KTOTrainer":
                return "kto", type(trainer).__name__
        if type(trainer).__module__.startswith("trl."):
            return None, type(trainer).__name__  # a TRL trainer with its own schema
        return "lm", type(trainer).__name__
    if args is not None:
        for c in type(args).__mro__:
            if c.__name__ in CONFIGS:
                return CONFIGS[c.__name__], type(args).__name__
    return None, ""


def template_markers(tok: Any, messages: list[dict], template: Any, generation_prompt: bool) -> tuple[list[str], str]:
    """The text the chat template puts around the messages' contents (role markers, turn ends), normalized,
    and the rendered conversation."""
    kwargs = {"tokenize": False, "add_generation_prompt": generation_prompt}
    if template is not None:
        kwargs["chat_template"] = template
    rendered = tok.apply_chat_template(messages, **kwargs)
    if not isinstance(rendered, str):
        raise TypeError(type(rendered).__name__)
    segments, pos = [], 0
    for content in contents(messages):
        at = rendered.find(content, pos)
        if at < 0:
            at = rendered.find(content.strip(), pos)
            content = content.strip()
        if at < 0:
            continue
        segments.append(rendered[pos:at])
        pos = at + len(content)
    segments.append(rendered[pos:])
    markers = []
    for seg in segments:
        n = norm(seg)
        if n and n not in markers:
            markers.append(n)
    return markers, rendered


@dataclass
class Unit:
    """One decoded training sequence (a row of a collated batch, or a packed document)."""

    text: str
    norm: str
    words: set[str]
    complete: bool


@dataclass
class Problem:
    evidence: list[str]
    cause: str
    fix: str


def decode_units(tok: Any, sample: Any) -> list[list[Unit]]:
    """For each collated batch, its decoded sequences. A sequence is complete (untruncated) when it ends with
    EOS or is shorter than the batch's longest one."""
    eos = lm.special_id(tok, "eos")
    out = []
    for batch in sample.batches:
        rows = lm.rows([batch])
        longest = max((len(r.content) for r in rows), default=0)
        units = []
        for r in rows:
            content = set(r.content)
            spans = r.documents()
            target = ""  # an encoder-decoder's labels are a sequence of their own: its text reaches the model too
            if r.labels is not None and len(r.labels) != len(r.input_ids):
                target = tok.decode([t for t in r.labels if t >= 0], skip_special_tokens=False)
            for start, end in spans:
                ids = [r.input_ids[p] for p in range(start, end) if p in content]
                if not ids:
                    continue
                text = tok.decode(ids, skip_special_tokens=False)
                if len(spans) > 1:  # a packed document is whole unless it is the row's cut tail
                    complete = ids[-1] == eos or end < len(r.input_ids)
                else:
                    complete = ids[-1] == eos or len(ids) < longest
                units.append(Unit(text, norm(text), words(text) | words(target), complete))
        out.append(units)
    return out


def present(column_words: set[str], unit_words: set[str]) -> float:
    return len(column_words & unit_words) / len(column_words) if column_words else 0.0


# --------------------------------------------------------------------------------------------------
# the check


@check(
    "L8",
    domain="llm",
    title="dataset schema does not fit the trainer; chat template never applied",
    roles=("tokenizer",),
    optional_roles=("raw_dataset", "trainer", "training_args", "collator", "dataset", "dataloader"),
    settings=(
        Setting(
            "min_examples",
            2,
            "sampled examples that must show a problem before L8 fails: one example can be "
            "an odd row, two identical symptoms in a sample of 8 are the pipeline",
        ),
        Setting(
            "min_share",
            0.5,
            "share of the judged examples that must show the problem: a pipeline bug hits "
            "every example; half leaves room for rows that are odd or truncated",
        ),
        Setting(
            "min_words",
            2,
            "distinct words (3+ letters, found in no other column of the row) a text column "
            "needs before L8 judges whether it reaches the model; fewer is too little to tell",
        ),
    ),
)
def check_schema(dlcheck):
    """The dataset's columns are the ones the trainer reads, and conversations go through the chat template.

    What it does
        Reads the trainer kind from dlcheck_trainer (or the class of dlcheck_training_args) and the
        columns of a few sampled raw examples (dlcheck_raw_dataset, else the Trainer's train_dataset or
        dlcheck_dataset): TRL 1.16's SFTTrainer reads 'text' (dataset_text_field), 'messages' or
        'prompt'+'completion'; DPOTrainer/RewardTrainer 'chosen'+'rejected' with an optional 'prompt';
        GRPOTrainer/RLOOTrainer 'prompt'; KTOTrainer 'prompt'+'completion'+'label'. Then it decodes the
        collated training batches of the same examples and checks that (1) conversational data (a
        column of role/content messages) shows the markers the tokenizer's chat template puts around
        the contents; (2) every text column (prompt, completion, chosen, rejected, answer, response,
        messages...) reaches the model: its words appear in the example's decoded input; (3) for
        preference trainers, chosen/rejected do not repeat the prompt TRL prepends.
    Why it is bad
        TRL raises at construction on most wrong schemas, but not on all: an SFTTrainer on a dataset
        with 'text' plus an 'answer' column trains on 'text' alone; preference rows fed to a plain
        Trainer through a hand pipeline drop every rejected answer; a DPO dataset whose chosen/rejected
        already contain the prompt trains on the prompt twice; a GRPOTrainer built on 'text' or
        'messages' constructs and then raises KeyError: 'prompt' at its first step, after the model
        and the generation server are loaded. Messages joined into plain text ("user: ...
        assistant: ...") before tokenization never show the model the role markers it is prompted with
        at inference (apply_chat_template), so the fine-tune answers a format it was not trained on.
    Example
        text = "\\n".join(f"{m['role']}: {m['content']}" for m in ex["messages"])   # template never applied
        dataset.map(lambda ex: tok(text))
    Use instead
        Pass the 'messages' column to trl.SFTTrainer (it applies the template), or build the text with
        tok.apply_chat_template(ex["messages"], tokenize=False); rename columns to the trainer's names;
        remove a column you mean to leave out (dataset.remove_columns(...)) so the intent is explicit.
    Known problems
        Needs a chat template on the tokenizer to judge conversations (skipped otherwise, except for
        GRPO, which applies one itself). The per-column judgement needs the examples aligned with the
        batches (dlcheck_collator + dlcheck_dataset, or a Trainer); with a dataloader alone only the
        template markers are checked. A text column with fewer than min_words distinct words, a
        truncated example, and a TRL trainer with its own schema (distillation, ...) are not judged. Text
        joined as "user: ..." with no conversation column left in the data cannot be told from a plain
        corpus and passes. With batches from a dataloader alone only the chat template markers are
        judged; without conversations there it skips, naming dlcheck_collator + dlcheck_dataset.
    Not applicable
        Examples with neither text, conversations nor token ids (images, tabular rows) when no LLM
        trainer kind is known. Pre-tokenized examples are a skip instead: their rows before
        tokenization (dlcheck_raw_dataset) would let the check run. Masked LMs, sequence and token
        classifiers with no schema L8 could judge (no generative training reads their columns).
    """
    (tok,) = dlcheck.require("tokenizer")
    trainer = dlcheck.optional("trainer")
    trainer = trainer if trainer is not None and is_hf_trainer(trainer) else None
    args = dlcheck.optional("training_args")
    kind, told_by = trainer_kind(trainer, args)
    if kind is None and dlcheck.role("raw_dataset") is MISSING:
        # no raw examples to read: a pipeline that trains no generative model (a sequence classifier) is not
        # concerned, as for L2/L6/L11; a generative one misses the role (a pipeline of another domain: the llm
        # domain's own rule says so first)
        reason = not_concerned("llm", dlcheck)
        if reason:
            dlcheck.not_applicable(reason)
        pipeline = pipeline_kind(dlcheck)
        if not pipeline.generates:
            pipeline.not_for(
                dlcheck, "the data schemas of generative training (text, prompt/completion, conversations)"
            )
    (raw,) = dlcheck.require("raw_dataset")
    template = getattr(trainer, "chat_template", None) if trainer is not None else None
    template = template or lm.chat_template(tok)

    sample, units = None, None
    if kind != "prompt-only":
        try:
            sample = get_sample(dlcheck)
        except pytest.skip.Exception:
            sample = None
        if sample is not None and lm.has_token_batches(sample.batches):
            try:
                units = decode_units(tok, sample)
            except Exception:  # noqa: BLE001 - a processor that cannot decode ids: only the schema is judged
                units = None
    if sample is not None and sample.raw_rows is not None and sample.rows is not None:
        rows, aligned = list(sample.raw_rows), True
    else:
        rows = dlcheck.memo(
            raw, f"l8:raw_rows:{dlcheck.samples}", lambda: sample_rows(raw, dlcheck.samples, "raw_dataset")[0]
        )
        aligned = False
    if not rows or not all(isinstance(r, Mapping) for r in rows):
        what = type(rows[0]).__name__ if rows else "absent"
        dlcheck.skip(f"the raw dataset's examples are {what}, not dicts of columns")
    columns = list(dict.fromkeys(k for r in rows for k in r))
    problems: list[Problem] = []
    judged: list[str] = []

    # ---- 1. the columns the trainer reads ---------------------------------------------------------
    if kind in NEEDS:
        problem = _schema(kind, told_by, columns, rows, args, template)
        judged.append(
            f"schema: {told_by} reads {NEEDS[kind]}; the {len(rows)} sampled examples have {', '.join(columns)}"
        )
        if problem:
            problems.append(problem)
        if kind in ("preference",):
            problem = _repeated_prompt(dlcheck, rows, units, told_by)
            if problem:
                problems.append(problem)

    # ---- 2. conversations rendered with the chat template ------------------------------------------
    if units is not None:
        problem, note = _template(dlcheck, tok, template, rows, units)
        if note:
            judged.append(note)
        if problem:
            problems.append(problem)

    # ---- 3. every text column reaches the model -----------------------------------------------------
    if units is not None and aligned and kind in ("sft", "preference", "lm", None) and sample.batch_rows:
        problem, note = _ignored_columns(dlcheck, tok, rows, sample, units, kind, told_by)
        if note:
            judged.append(note)
        if problem:
            problems.append(problem)

    if problems:
        first = problems[0]
        evidence = list(first.evidence) + [f"also: {p.evidence[0]}" for p in problems[1:]]
        dlcheck.fail(evidence, first.cause, first.fix)
    if judged:
        dlcheck.measured(*judged, examples=len(rows), aligned=aligned)
        return
    pipeline = pipeline_kind(dlcheck)
    if not pipeline.generates:
        pipeline.not_for(dlcheck, "the data schemas of generative training (text, prompt/completion, conversations)")
    why = (
        ""
        if kind is not None
        else f"{told_by} is a TRL trainer whose dataset schema L8 does not know yet, and "
        if told_by
        else "no trainer kind (dlcheck_trainer or dlcheck_training_args), and "
    )
    texts = [c for c in columns if c in PAYLOAD or any(is_conversation(r.get(c)) for r in rows)]
    if not texts:
        if kind is None and "input_ids" not in columns:
            dlcheck.not_applicable(
                f"{why}the examples carry no text or conversation column (columns: {', '.join(columns)})"
            )
        strings = [c for c in columns if any(isinstance(r.get(c), str) for r in rows)]
        if strings:
            dlcheck.skip(
                f"nothing to judge: {why}no column holds what L8 reads ({', '.join(PAYLOAD)} or conversations): "
                f"the string columns {', '.join(strings)} are none of them (columns: {', '.join(columns)})"
            )
        dlcheck.skip(
            f"nothing to judge: {why}the examples hold token ids only (columns: {', '.join(columns)}); if they were "
            "text or conversations before tokenization, define dlcheck_raw_dataset with those rows, in the same order"
        )
    if units is None:
        got = "no sampled token batch" if sample is None else f"the batches of {sample.source} cannot be decoded"
        dlcheck.skip(f"nothing to judge: {why}{got} to look for the columns {', '.join(texts)} in")
    if not aligned:
        dlcheck.skip(f"nothing to judge: {why}{unmatched(sample)}")
    dlcheck.skip(
        f"nothing to judge: {why}the text columns ({', '.join(texts)}) hold fewer than "
        f"{dlcheck.setting('min_words')} distinct words each, or none of the sampled examples could be recognised "
        f"in its batch ({sample.source})"
    )


def _example(row: Mapping, limit: int = 70) -> str:
    parts = []
    for k, v in row.items():
        if isinstance(v, str) or is_conversation(v):
            text = repr(v) if isinstance(v, str) else repr(as_messages(v))
            parts.append(f"{k}={text[:limit] + ('…' if len(text) > limit else '')}")
    return ", ".join(parts) or repr(dict(row))[:limit]


def _schema(kind: str, told_by: str, columns: list[str], rows: list, args: Any, template: Any) -> Problem | None:
    cols = set(columns)
    ok = True
    if kind == "sft":
        text_field = getattr(args, "dataset_text_field", "text") or "text"
        ok = bool({text_field, "messages", "conversations", "input_ids"} & cols) or {"prompt", "completion"} <= cols
    elif kind == "preference":
        ok = (
            {"chosen", "rejected"} <= cols
            or {"chosen_input_ids", "rejected_input_ids"} <= cols
            or {"chosen_ids", "rejected_ids"} <= cols
        )
    elif kind == "kto":
        ok = {"prompt", "completion", "label"} <= cols
    elif kind == "prompt-only":
        ok = "prompt" in cols
        if ok and template is None and any(is_conversation(r.get("prompt")) for r in rows):
            return Problem(
                [f"{told_by} gets conversational prompts ({_example(rows[0])}) and the tokenizer has no chat template"],
                f"{told_by} renders conversational prompts with tokenizer.apply_chat_template at its first "
                "training step, which raises: tokenizer.chat_template is not set",
                "set tokenizer.chat_template (the one the model is served with), or pass string prompts already "
                "rendered for the model",
            )
    if ok:
        return None
    have = ", ".join(columns)
    rename = ""
    if kind == "prompt-only":
        source = next((c for c in ("text", "question", "query", "instruction", "input") if c in cols), None)
        if "messages" in cols:
            rename = (
                "dataset.map(lambda ex: {'prompt': ex['messages'][:-1]}) (the conversation up to the "
                "turn to generate), or "
            )
        elif source:
            rename = f"dataset.rename_column({source!r}, 'prompt'), or "
    elif kind == "preference" and "completion" in cols:
        rename = "preference pairs need a rejected answer per prompt: "
    return Problem(
        [f"{told_by} reads {NEEDS[kind]}; the dataset's columns are: {have}", f"example 0: {_example(rows[0])}"],
        f"the dataset's schema does not fit {told_by}: "
        + (
            "GRPO-style trainers construct on any columns and raise KeyError: 'prompt' at the first training step"
            if kind == "prompt-only"
            else "the trainer reads other columns than the ones the data has"
        ),
        f"{rename}map the dataset to the columns {COLUMNS[kind]} before building the trainer",
    )


def _repeated_prompt(dlcheck: Any, rows: list, units: list | None, told_by: str) -> Problem | None:
    judged, repeated = 0, []
    for i, r in enumerate(rows):
        p, c, rej = r.get("prompt"), r.get("chosen"), r.get("rejected")
        if p is None or c is None or rej is None:
            continue
        if isinstance(p, str) and isinstance(c, str) and isinstance(rej, str):
            if len(norm(p)) < 8:
                continue
            judged += 1
            if norm(c).startswith(norm(p)) and norm(rej).startswith(norm(p)):
                repeated.append(i)
        elif is_conversation(p) and is_conversation(c) and is_conversation(rej):
            judged += 1
            pm = [(m.get("role"), m.get("content")) for m in as_messages(p)]
            if [(m.get("role"), m.get("content")) for m in as_messages(c)][: len(pm)] == pm and [
                (m.get("role"), m.get("content")) for m in as_messages(rej)
            ][: len(pm)] == pm:
                repeated.append(i)
    if (
        not judged
        or len(repeated) < min(dlcheck.setting("min_examples"), judged)
        or len(repeated) / judged < dlcheck.setting("min_share")
    ):
        return None
    r = rows[repeated[0]]
    evidence = [
        f"{len(repeated)} of {judged} sampled preference pairs: 'chosen' and 'rejected' both start with "
        f"the 'prompt' {told_by} puts in front of them",
        f"example {repeated[0]}: {_example(r)}",
    ]
    if units:
        key = norm(payload_text(r["prompt"]) or "")
        twice = next((u for batch in units for u in batch if key and u.norm.count(key) >= 2), None)
        if twice is not None:
            evidence.append(f"decoded training input: {twice.text[:160]!r}")
    return Problem(
        evidence,
        f"chosen/rejected hold the whole text, prompt included, while the 'prompt' column holds it too: {told_by} "
        "concatenates prompt + chosen, so every pair is trained on the prompt twice and scored in a context the "
        "model never sees at inference",
        "strip the prompt from chosen and rejected (chosen = chosen[len(prompt):]), or drop the 'prompt' column "
        "and let TRL extract the shared prefix (trl.extract_prompt)",
    )


def _conversation(row: Mapping) -> tuple[list[dict] | None, bool, str]:
    """(messages to render, add_generation_prompt, which columns) for a conversational row."""
    convs = {k: as_messages(v) for k, v in row.items() if is_conversation(v)}
    if not convs:
        return None, False, ""
    for key in ("messages", "conversations"):
        if key in convs:
            return convs[key], False, key
    prompt = convs.get("prompt", [])
    for key in ("completion", "chosen"):
        if key in convs:
            return prompt + convs[key], False, ("prompt+" if prompt else "") + key
    if prompt:
        return prompt, True, "prompt"
    key = next(iter(convs))
    return convs[key], False, key


def _template(dlcheck: Any, tok: Any, template: Any, rows: list, units: list) -> tuple[Problem | None, str]:
    convs = [(i, *_conversation(r)) for i, r in enumerate(rows)]
    convs = [c for c in convs if c[1]]
    if not convs:
        return None, ""
    if template is None:
        return None, ""  # nothing to compare with; a hand-made plain format is the user's choice
    hay = "".join(u.norm for batch in units for u in batch)
    hay_words = set().union(*(u.words for batch in units for u in batch)) if units else set()
    markers, reached, example = [], [], None
    for i, messages, gen, cols in convs:
        try:
            found, rendered = template_markers(tok, messages, template, gen)
        except Exception:  # noqa: BLE001, S112 - a template that cannot render this row tells nothing
            continue
        row_words = set().union(*(words(c) for c in contents(messages))) if contents(messages) else set()
        if present(row_words, hay_words) >= 0.5:
            reached.append(i)
            example = example or (i, rendered, cols)
        for m in found:
            if m not in markers:
                markers.append(m)
    if not markers or not reached:
        return None, ""
    hits = [m for m in markers if m in hay]
    if hits:
        shown = ", ".join(repr(m) for m in hits[:4])
        return None, (
            f"chat template: {len(reached)} of {len(convs)} sampled conversations reach the batches, which carry "
            f"its markers ({shown})"
        )
    if len(reached) < min(dlcheck.setting("min_examples"), len(convs)):
        return None, ""
    i, rendered, cols = example
    unit = max(
        (u for batch in units for u in batch),
        key=lambda u: present(set().union(*(words(c) for c in contents(convs[0][1]))), u.words),
    )
    shown = ", ".join(repr(m) for m in markers[:4])
    return Problem(
        [
            f"{len(reached)} sampled conversations ('{cols}') reach the training batches, and the decoded batches "
            f"carry none of the chat template's markers ({shown})",
            f"decoded training input: {unit.text[:160]!r}",
            f"tokenizer.apply_chat_template renders example {i} as: {rendered[:160]!r}",
        ],
        "the messages were turned into text without tokenizer.apply_chat_template (joined as plain 'role: content' "
        "lines, or rendered by another format), so the model never trains on the role markers it is prompted "
        "with at inference",
        "pass the 'messages' column to trl.SFTTrainer (it applies the template), or build the training text with "
        "tokenizer.apply_chat_template(example['messages'], tokenize=False)",
    ), ""


def _ignored_columns(
    dlcheck: Any, tok: Any, rows: list, sample: Any, units: list, kind: str | None, told_by: str
) -> tuple[Problem | None, str]:
    min_words = dlcheck.setting("min_words")
    payload = [
        c
        for c in dict.fromkeys(k for r in rows for k in r)
        if (c in PAYLOAD or any(is_conversation(r.get(c)) for r in rows)) and any(payload_text(r.get(c)) for r in rows)
    ]
    if not payload:
        return None, ""
    judged = {c: 0 for c in payload}
    missing: dict[str, list[int]] = {c: [] for c in payload}
    for b, group in enumerate(sample.batch_rows):
        batch_units = units[b] if b < len(units) else []
        if not batch_units:
            continue
        per_row = len(batch_units) == len(group)  # one sequence per example, in order
        per_pair = len(batch_units) == 2 * len(group)  # DPO: chosen rows, then rejected rows
        for j, i in enumerate(group):
            row = rows[i]
            if per_row:
                own = [batch_units[j]]
            elif per_pair:
                own = [batch_units[j], batch_units[j + len(group)]]
            else:
                own = batch_units
            own_words = set().union(*(u.words for u in own))
            texts = {c: payload_text(row.get(c)) for c in payload}
            col_words = {c: words(t) for c, t in texts.items() if t}
            distinct = {c: w - set().union(*(v for k, v in col_words.items() if k != c)) for c, w in col_words.items()}
            reached = {c for c, w in distinct.items() if len(w) >= min_words and present(w, own_words) >= 0.5}
            if not reached:
                continue  # this example is not recognisably in its batch (another order, or transformed)
            complete = all(u.complete for u in own)
            for c, w in distinct.items():
                if len(w) < min_words or c in reached:
                    if c in reached:
                        judged[c] += 1
                    continue
                if complete and present(w, own_words) == 0.0:
                    judged[c] += 1
                    missing[c].append(i)
    ignored = [
        c
        for c in payload
        if missing[c]
        and len(missing[c]) >= min(dlcheck.setting("min_examples"), judged[c])
        and len(missing[c]) / judged[c] >= dlcheck.setting("min_share")
    ]
    note = (
        "text columns reach the model: "
        + ", ".join(f"{c!r} in {judged[c] - len(missing[c])} of {judged[c]}" for c in payload if judged[c])
        + " sampled examples judged"
        if any(judged.values())
        else ""
    )
    if not ignored:
        return None, note
    col = ignored[0]
    i = missing[col][0]
    b = next(b for b, g in enumerate(sample.batch_rows) if i in g)
    j = sample.batch_rows[b].index(i)
    unit = units[b][j] if len(units[b]) in (len(sample.batch_rows[b]), 2 * len(sample.batch_rows[b])) else units[b][0]
    trainer_text = told_by or "the pipeline"
    evidence = [
        f"column {col!r} never reaches the model: its words are absent from the decoded training input "
        f"of {len(missing[col])} of the {judged[col]} sampled examples judged"
        + (f" (also: {', '.join(repr(c) for c in ignored[1:])})" if len(ignored) > 1 else ""),
        f"example {i}: {col}={payload_text(rows[i][col])[:80]!r}",
        f"decoded training input: {unit.text[:160]!r}",
    ]
    if {"chosen", "rejected"} & set(ignored) and kind != "preference":
        cause = (
            f"preference pairs handed to a trainer that is not a preference trainer ({trainer_text}): it reads "
            f"one side of each pair and silently drops {', '.join(repr(c) for c in ignored)}, so the "
            "preference signal is never trained"
        )
        fix = (
            "train preference pairs with trl.DPOTrainer (prompt/chosen/rejected); if SFT on the chosen answers "
            "is what you want, dataset.remove_columns(['rejected']) and map chosen to 'completion'"
        )
    else:
        reads = {
            "sft": "SFTTrainer reads 'text' (dataset_text_field), 'messages' or 'prompt'+'completion' and "
            "ignores other columns",
            "preference": f"{trainer_text} reads prompt/chosen/rejected only",
        }.get(kind, "the tokenization step builds its text from other columns")
        cause = f"the column is silently dropped before tokenization: {reads}"
        fix = (
            f"put {col!r} into the trained text (for SFTTrainer: give the pair as 'prompt' + 'completion' "
            f"columns, e.g. dataset.rename_columns({{'text': 'prompt', {col!r}: 'completion'}}), or a "
            f"formatting_func that uses it), or dataset.remove_columns([{col!r}]) if it is meant to be left out"
        )
    return Problem(evidence, cause, fix), note
