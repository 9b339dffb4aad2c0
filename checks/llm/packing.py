"""L4: packing leaks attention across documents. In a packed row every document must lose as it does
alone, and no document's first token may be a target predicted from the previous document."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import torch

from ...errors import MISSING
from ...registry import Setting, check
from ..shared import lm
from .common import online_trainer, pipeline_kind, token_sample

#: documents compared per session (each costs one forward alone)
MAX_DOCUMENTS = 16


@dataclass
class Packed:
    """A sampled batch with packed rows: row index -> its documents (lists of positions) and how found."""

    batch: dict
    ids: torch.Tensor
    labels: torch.Tensor
    given: bool  # labels came with the batch
    rows: list[lm.Row]
    docs: dict[int, list[list[int]]] = field(default_factory=dict)
    modes: dict[int, str] = field(default_factory=dict)


@dataclass
class Doc:
    row: lm.Row
    mode: str  # "restart" or "eos"
    order: int  # 0 for the first document of its row
    idx: list[int]  # positions in the row
    packed: float | None = None
    alone: float | None = None
    isolated: float | None = None
    no_cache: float | None = None

    @property
    def delta(self) -> float:
        return abs(self.packed - self.alone)

    def control(self, name: str) -> float | None:
        value = getattr(self, name)
        return None if value is None else abs(value - self.alone)


def _split_by_positions(row: lm.Row) -> list[list[int]]:
    content = row.content
    docs, current = [], []
    for a, c in zip([None] + content, content):
        if a is not None and row.position_ids[c] <= row.position_ids[a]:
            docs.append(current)
            current = []
        current.append(c)
    return docs + [current]


def _split_by_eos(row: lm.Row, eos: int, pad: int | None) -> list[list[int]]:
    content = row.content
    docs, current = [], []
    for c in content:
        current.append(c)
        if row.input_ids[c] == eos:
            docs.append(current)
            current = []
    if current:
        docs.append(current)
    # trailing runs of eos/pad (pad == eos without a mask) are not documents
    return [d for d in docs if any(row.input_ids[c] not in (eos, pad) for c in d)]


def _eos_ambiguous(tok: Any, raw_rows: list | None) -> str | None:
    """Why EOS cannot be read as a document separator here (multi-turn chats end turns with it)."""
    template = lm.chat_template(tok)
    eos_text = lm.token_attr(tok, "eos_token")
    if isinstance(template, str):
        if isinstance(eos_text, str) and eos_text in template:
            return f"the chat template ends turns with the EOS token {eos_text!r}"
        if "eos_token" in template:
            return "the chat template inserts eos_token between turns"
    for row in raw_rows or []:
        if isinstance(row, Mapping) and any(
            isinstance(v, list) and v and isinstance(v[0], Mapping) and "role" in v[0] for v in row.values()
        ):
            return "the examples are conversations"
    return None


def _labels(batch: dict, ids: torch.Tensor) -> tuple[torch.Tensor, bool]:
    labels = batch.get("labels")
    if labels is not None:
        labels = torch.as_tensor(labels)
        if labels.shape == ids.shape:
            return labels, True
    labels = ids.clone()
    mask = batch.get("attention_mask")
    if mask is not None:
        labels[torch.as_tensor(mask) == 0] = lm.IGNORE
    return labels, False


def _found_by(plan: list[Packed], tok: Any, eos: int | None) -> str:
    modes_seen = sorted({m for item in plan for m in item.modes.values()})
    how = {
        "restart": "position_ids restarts",
        "eos": f"EOS separators ({lm.token_text(tok, eos)!r}, id {eos}) with no position_ids restart",
    }
    return " and ".join(how[m] for m in modes_seen)


def _isolated_positions(rows: list[lm.Row], docs: dict[int, list[list[int]]], width: int) -> torch.Tensor:
    """position_ids that restart at 0 at every document and at every run of padding, so that with no
    attention_mask transformers isolates each of them."""
    out = torch.zeros(len(rows), width, dtype=torch.long)
    for r, row in enumerate(rows):
        content = set(row.content)
        starts = {d[0] for d in docs.get(r, [])}
        starts |= {i for i in range(width) if i == 0 or (i in content) != (i - 1 in content)}
        p = 0
        for i in range(width):
            p = 0 if i in starts else p + 1
            out[r, i] = p
    return out


def _ids_of(example: Any) -> list[int] | None:
    """The token ids of a dataset example as the collator takes it (its ``input_ids``), None when it holds none."""
    if not isinstance(example, Mapping):
        return None
    value = example.get("input_ids")
    if hasattr(value, "tolist"):
        value = value.tolist()
    if isinstance(value, (list, tuple)) and value and isinstance(value[0], (list, tuple)):
        value = value[0] if len(value) == 1 else None
    if not isinstance(value, (list, tuple)) or not value or not all(isinstance(v, int) for v in value):
        return None
    return list(value)


def _occurrences(row: list[int], parts: list[tuple[int, list[int]]]) -> list[int]:
    """The examples (their indices) whose whole token ids occur in ``row``, at non-overlapping places."""
    taken: set[int] = set()
    found = []
    for i, ids in parts:
        n = len(ids)
        for start in range(len(row) - n + 1):
            if row[start : start + n] == ids and not taken & set(range(start, start + n)):
                taken |= set(range(start, start + n))
                found.append(i)
                break
    return found


@dataclass
class Shared:
    """A collated row that holds several dataset examples."""

    row: lm.Row
    examples: list[int]  # indices into Sample.rows; empty when only the counts show it


def _rows_sharing_examples(sample: Any, plan: list[Packed]) -> tuple[list[Shared], str | None]:
    """The packed rows of ``plan`` into which the collator put several of the dataset examples it was handed
    (several examples' tokens in one row, or fewer rows than examples), and how the examples were seen; None
    when they were not (a bare dataloader), an empty list when every row is one example of its own."""
    if sample.rows is None or sample.batch_rows is None:
        return [], None
    shared: list[Shared] = []
    for item in plan:
        for r in item.docs:
            row = item.rows[r]
            group = sample.batch_rows[row.batch] if row.batch < len(sample.batch_rows) else []
            parts = [(i, ids) for i in group if (ids := _ids_of(sample.rows[i])) is not None]
            found = _occurrences([row.input_ids[c] for c in row.content], parts)
            if len(found) >= 2:
                shared.append(Shared(row, found))
            elif len(item.rows) < len(group):
                shared.append(Shared(row, []))
    return shared, "compared"


def _examples_hold_one_document(dlcheck: Any, eos: int | None, pad: int | None) -> bool | None:
    """For a bare dataloader: whether every sampled example of its dataset holds at most one EOS-separated
    document (so a row holding several was packed by the loader's collator); None when they cannot be read."""
    loader = dlcheck.role("dataloader")
    dataset = getattr(loader, "dataset", None) if loader is not MISSING else None
    if dataset is None or eos is None:
        return None
    from ...sampling import sample_rows

    try:
        examples = dlcheck.memo(
            dataset, f"llm:L4:loader-examples:{dlcheck.samples}", lambda: sample_rows(dataset, dlcheck.samples)[0]
        )
    except Exception:  # noqa: BLE001 - a dataset we cannot index is only not compared
        return None
    counts = []
    for example in examples:
        ids = _ids_of(example)
        if ids is None:
            return None
        row = lm.Row(0, 0, ids, None, None, None)
        counts.append(len(_split_by_eos(row, eos, pad)))
    return bool(counts) and max(counts) <= 1


def _shared_line(sample: Any, shared: list[Shared]) -> str:
    """Which dataset examples the collator packed into one row (the first few rows)."""
    shown = []
    for item in shared[:3]:
        name = f"row {item.row.batch}.{item.row.index}"
        if not item.examples:
            shown.append(f"{name} (fewer rows than examples in its batch)")
            continue
        where = (
            " (dataset rows " + ", ".join(str(sample.positions[i]) for i in item.examples) + ")"
            if sample.positions is not None
            else ""
        )
        shown.append(f"sampled examples {', '.join(map(str, item.examples))}{where} share {name}")
    more = f"; {len(shared) - 3} more rows" if len(shared) > 3 else ""
    return "the collator packs several dataset examples into one row: " + "; ".join(shown) + more


def _pretraining_stream(plan: list[Packed], eos: int | None, pad: int | None) -> bool:
    """Every packed row is an EOS-separated stream (no position_ids restart) whose every real token is
    supervised, but for EOS/pad ids (DataCollatorForLanguageModeling masks them when pad == eos): plain
    causal-LM pretraining on concatenated text, not packed fine-tuning examples (whose prompts are masked)."""
    for item in plan:
        for r, mode in item.modes.items():
            row = item.rows[r]
            if mode != "eos":
                return False
            supervised = set(row.supervised)
            unsupervised = [c for c in row.content[1:] if c not in supervised]
            if any(row.input_ids[c] not in (eos, pad) for c in unsupervised):
                return False
    return True


@check(
    "L4",
    domain="llm",
    property_mode=True,
    title="packing leaks attention across documents",
    roles=("model", "dataloader"),
    optional_roles=("tokenizer",),
    settings=(
        Setting(
            "atol",
            1e-3,
            "largest |Δ| (nats) allowed between a packed document's mean NLL inside the row and "
            "alone; float32 rounding gives < 1e-5, attention to a previous document moved even a random-init "
            "tiny Llama by 1e-3 to 2e-2 per document and a GPT-2 by up to 8e-2",
        ),
        Setting(
            "noise_ratio",
            10.0,
            "a document fails only when its Δ is this many times the Δ left once attention "
            "is isolated per document (the rounding noise of the model's dtype)",
        ),
        Setting(
            "judge_streams",
            False,
            "true to judge a pre-chunked pretraining stream as packing: rows that are each one dataset example "
            "already holding several EOS-separated documents, fully supervised (run_clm's group_texts with EOS between "
            "texts); by default such a stream attends across documents by design (GPT-2 style) and L4 is not "
            "applicable to it. A collator that packs several dataset examples into one row is judged regardless",
        ),
        Setting(
            "allow_cross_document",
            False,
            "true for deliberate GPT-style pretraining on a concatenated stream: "
            "EOS-separated documents without position_ids restarts may then attend to each other and predict "
            "the next document's first token",
        ),
    ),
)
def check_packing(dlcheck):
    """Packed documents do not see each other, and no document's first token is a cross-document target.

    What it does
        Finds packed rows in the sampled training batches: rows whose position_ids restart (TRL
        packing/padding_free, DataCollatorWithFlattening, hand packers), or rows holding several
        EOS-terminated documents with no restart (naive concatenation). Compares the dataset examples
        handed to the collator with the rows it returns: several examples' token ids in one row (or
        fewer rows than examples) is packing of separate examples, named in the evidence (which
        examples share a row); each row one dataset example already holding several documents is a
        pre-chunked stream (for a bare dataloader: whether its dataset's examples hold one document
        each). Forwards each such batch as
        training does (input_ids, attention_mask and position_ids as collated, the model's own
        use_cache) and each document alone; the mean NLL over the same supervised next-token
        predictions must agree within `atol`. A leaking document is confirmed against a control (the
        same row with position_ids restarting per document, no attention_mask, use_cache=False): it
        fails only when its Δ is also `noise_ratio` times the control's, and further controls name
        the knob (attention_mask, use_cache) that breaks the isolation. Then checks that the label of
        every document's first token (after the first document of a row) is -100.
    Why it is bad
        Packing several short examples into one row is only equivalent to training on them separately
        if attention stops at document boundaries; otherwise each document is conditioned on
        unrelated text before it, and the model learns to use context that is not there at inference.
        In transformers 5.23 eager/sdpa attention splits documents at position_ids restarts only when
        the batch has no attention_mask and the forward builds no KV cache: measured, a
        DataCollatorWithFlattening batch through a tiny Llama with the default config.use_cache=True
        leaks (max |Δlogit| 0.7), with use_cache=False it matches separate runs to 2e-7 (the HF
        Trainer sets config.use_cache from TrainingArguments.use_cache=False; a custom loop does not).
        A supervised first token trains the model to predict a document's opening from the end of
        an unrelated one.
    Example
        ids = sum((ex["input_ids"] + [tok.eos_token_id] for ex in examples), [])   # naive SFT packer (TRL #3067)
        batch = {"input_ids": ids, "labels": ids}                                  # no restart, no -100
        ...
        model = AutoModelForCausalLM.from_config(cfg)                # config.use_cache=True
        loss = model(**DataCollatorWithFlattening()(examples)).loss  # custom loop: documents leak
    Use instead
        DataCollatorWithFlattening() (position_ids restart, first labels -100, no attention_mask) with
        model.config.use_cache = False, or the HF Trainer / TRL SFTConfig(packing=True), which set it;
        attn_implementation "sdpa"/"eager" (or "flash_attention_2" with return_flash_attn_kwargs=True).
    Known problems
        Classic pretraining on a concatenated token stream (GPT-2/3 style `group_texts`) lets documents
        attend across EOS on purpose: a stream cut into blocks before the collator (each row one
        dataset example) is not judged; a collator that concatenates examples on the fly is judged as
        packing, and stream pretraining done that way sets `allow_cross_document=true`. A dataset
        packed by a map before the collator (EOS-joined examples, no restart) looks like a pre-chunked
        stream. A bare dataloader whose dataset cannot be read is taken as a stream.
        EOS is not read as a separator when the chat template ends turns with it (Qwen-style
        <|im_end|>, Llama-2/Mistral-style eos_token) or the examples are conversations: a multi-turn
        chat is one document. Labels are
        assumed aligned with input_ids (the model shifts them).
    Not applicable
        Pipelines that do not pack: no sampled row has position_ids restarts or several
        EOS-separated documents (padded or one-example rows); GRPO/RLOO/distillation trainers, which build their
        batches from generations; a pre-chunked pretraining stream (each row one dataset example holding
        EOS-separated documents, no position_ids restart, every token but EOS/padding supervised:
        run_clm's group_texts with default_data_collator, or with DataCollatorForLanguageModeling and
        pad == eos), whose documents attend across EOS by design
        (L4.judge_streams=true judges it anyway), or any EOS stream with allow_cross_document=true;
        batches that are not token batches; masked LMs (BERT/RoBERTa pretraining packs across
        documents on purpose), sequence and token classifiers.
    """
    model = dlcheck.role("model")
    tok = dlcheck.role("tokenizer")
    tok = None if tok is MISSING else tok
    kind = online_trainer(dlcheck.role("trainer"))
    if kind:
        dlcheck.not_applicable(
            f"{kind} builds its training batches inside the trainer, from generations: nothing is packed"
        )
    sample = token_sample(dlcheck)
    pipeline_kind(dlcheck).require(
        dlcheck, lm.CAUSAL, lm.SEQ2SEQ, concerns="LMs whose packed documents must not attend to each other"
    )
    eos = lm.special_id(tok, "eos") if tok is not None else None
    if eos is None:
        value = getattr(getattr(model, "config", None), "eos_token_id", None)
        eos = value if isinstance(value, int) else None
    pad = lm.special_id(tok, "pad") if tok is not None else None
    ambiguous = _eos_ambiguous(tok, sample.raw_rows)
    allow = dlcheck.setting("allow_cross_document")

    # ---- find packed rows ----------------------------------------------------------------------
    plan: list[Packed] = []
    n_rows = 0
    for b, batch in enumerate(sample.batches):
        ids = torch.as_tensor(batch["input_ids"])
        if ids.dim() == 1:
            ids = ids[None]
        labels, given = _labels(batch, ids)
        rows = lm.rows([{**batch, "input_ids": ids, "labels": labels}])
        item = Packed(batch, ids, labels, given, rows)
        for r, row in enumerate(rows):
            row.batch = b
            n_rows += 1
            if lm.packed(row):
                found, mode = _split_by_positions(row), "restart"
            elif eos is not None and ambiguous is None:
                found, mode = _split_by_eos(row, eos, pad), "eos"
            else:
                continue
            if len(found) > 1:
                item.docs[r], item.modes[r] = found, mode
        if item.docs:
            plan.append(item)
    shared, seen = _rows_sharing_examples(sample, plan) if plan else ([], None)
    stream = bool(plan) and not allow and not shared and _pretraining_stream(plan, eos, pad)
    if stream and seen is None and _examples_hold_one_document(dlcheck, eos, pad):
        stream = False  # a bare dataloader whose examples are one document each: its collator packs them
    if stream and not dlcheck.setting("judge_streams"):
        how = (
            f"each row is one example of {sample.source.split(' of ', 1)[-1]} as the dataset holds it (already a "
            "block of the stream, as run_clm's group_texts cuts it), not several examples packed by the collator"
            if seen
            else "the dataset's examples already hold several documents each (blocks cut from the stream, as "
            "run_clm's group_texts cuts them)"
            if _examples_hold_one_document(dlcheck, eos, pad) is False
            else "the examples the loader's collator took could not be read (define dlcheck_collator and "
            "dlcheck_dataset to tell packed examples from a pre-chunked stream)"
        )
        dlcheck.not_applicable(
            f"the rows of {sample.source} are a pretraining stream: documents joined by EOS with no position_ids "
            f"restart and every token but EOS/padding supervised; {how}; its documents attend across EOS by design — L4 judges "
            "packing of separate examples (set L4.judge_streams=true to judge this one)"
        )
    if not plan:
        why = f" (EOS is not read as a separator: {ambiguous})" if ambiguous else ""
        dlcheck.not_applicable(
            f"no packed row among the {n_rows} sampled rows of {sample.source}: no position_ids restart "
            f"and no several EOS-separated documents in one row{why}"
        )
    lm.forward_ready(dlcheck, model, sample.batches)

    # ---- measure: each later document in its packed row and alone --------------------------------
    measured: list[Doc] = []
    starts: list[tuple[lm.Row, list[int], list[int], str]] = []  # (row, document, previous document, mode)
    unlabelled = False
    use_cache = bool(getattr(getattr(model, "config", None), "use_cache", False))
    for item in plan:
        mask, pos = item.batch.get("attention_mask"), item.batch.get("position_ids")
        if pos is not None and torch.as_tensor(pos).dim() == 1:
            pos = torch.as_tensor(pos)[None]
        nll = isolated = no_cache = None
        for r, found in item.docs.items():
            row, mode = item.rows[r], item.modes[r]
            if allow and mode == "eos":
                continue  # deliberate stream pretraining: nothing to hold against these rows
            for order in range(1, len(found)):
                d = found[order]
                if item.given:
                    starts.append((row, d, found[order - 1], mode))
                else:
                    unlabelled = True
                sup = [j for j in range(len(d) - 1) if row.labels[d[j + 1]] != lm.IGNORE]
                if not sup or len(measured) >= MAX_DOCUMENTS:
                    continue
                if nll is None:  # the batch as training forwards it, and the controls
                    nll = lm.token_nll(model, item.ids, item.labels, mask, pos)
                    iso_pos = _isolated_positions(item.rows, item.docs, item.ids.size(1))
                    isolated = lm.token_nll(model, item.ids, item.labels, None, iso_pos, use_cache=False)
                    if use_cache:
                        no_cache = lm.token_nll(model, item.ids, item.labels, mask, pos, use_cache=False)
                at = [d[j] for j in sup]
                alone = lm.token_nll(
                    model, torch.tensor([[row.input_ids[c] for c in d]]), torch.tensor([[row.labels[c] for c in d]])
                )[0]
                doc = Doc(
                    row,
                    mode,
                    order,
                    d,
                    float(nll[r, at].mean()),
                    float(alone[sup].mean()),
                    float(isolated[r, at].mean()),
                )
                if no_cache is not None:
                    doc.no_cache = float(no_cache[r, at].mean())
                measured.append(doc)

    atol, ratio = dlcheck.setting("atol"), dlcheck.setting("noise_ratio")
    leaks = [d for d in measured if d.delta > atol and d.delta > ratio * d.control("isolated")]
    cross = [(row, d, prev, mode) for row, d, prev, mode in starts if row.labels[d[0]] != lm.IGNORE]
    if not leaks and not cross:
        if not measured and not starts:
            if allow and all(m == "eos" for item in plan for m in item.modes.values()):
                dlcheck.not_applicable(
                    f"the packed rows of {sample.source} are EOS-separated documents of a concatenated stream, "
                    "where cross-document attention is allowed (L4.allow_cross_document=true)"
                )
            dlcheck.skip(
                f"the packed rows of {sample.source} have no later document with a supervised token to compare"
            )
        n_rows_packed = sum(len(item.docs) for item in plan)
        found_by = f"documents found by {_found_by(plan, tok, eos)} in {sample.source}"
        if measured:
            worst = max(measured, key=lambda d: d.delta)
            lines = [
                f"{len(measured)} later documents in {n_rows_packed} packed rows lose the same packed as alone: max "
                f"|Δ| {worst.delta:.1e} <= atol {atol:g} nats (mean NLL over the same supervised tokens); {found_by}",
                f"  document {worst.order + 1} of row {worst.row.batch}.{worst.row.index}: packed {worst.packed:.4f}, "
                f"alone {worst.alone:.4f}",
            ]
            noisy = [d for d in measured if d.delta > atol]
            if noisy:
                lines.append(
                    f"  {len(noisy)} above tolerance are within {ratio:g}x the Δ left with attention isolated per "
                    "document (rounding of the model's dtype)"
                )
        else:
            lines = [f"{n_rows_packed} packed rows, no later document with a supervised token to compare; {found_by}"]
        if starts:
            lines.append(f"{len(starts)} of {len(starts)} later document starts have label -100")
        elif unlabelled:
            lines.append("document starts not checked: the batches carry no labels")
        if shared:
            lines.append(_shared_line(sample, shared))
        dlcheck.measured(
            *lines,
            packed_rows=n_rows_packed,
            documents_compared=len(measured),
            max_delta=max((d.delta for d in measured), default=None),
            atol=atol,
            document_starts=len(starts),
        )
        return

    # ---- report ----------------------------------------------------------------------------------
    n_rows_packed = sum(len(item.docs) for item in plan)
    n_docs = sum(len(found) for item in plan for found in item.docs.values())
    evidence = [
        f"{n_rows_packed} packed rows holding {n_docs} documents (found by {_found_by(plan, tok, eos)}) in {sample.source}"
    ]
    if shared:
        evidence.append(_shared_line(sample, shared))
    causes, fixes = [], []
    if leaks:
        leaks.sort(key=lambda d: -d.delta)
        evidence.append(
            f"{len(leaks)} of {len(measured)} later documents lose differently inside the packed row than "
            f"alone (mean NLL over the same supervised tokens, tolerance {atol:g} nats):"
        )
        shown: set[tuple[int, ...]] = set()
        for d in leaks:
            key = tuple(d.row.input_ids[c] for c in d.idx)
            if key in shown or len(shown) == 3:
                continue
            shown.add(key)
            evidence.append(
                f"document {d.order + 1} of row {d.row.batch}.{d.row.index} (tokens {d.idx[0]}-{d.idx[-1]}): "
                f"packed {d.packed:.4f}, alone {d.alone:.4f} (Δ {d.delta:.4f}): "
                f"{lm.decode(tok, [d.row.input_ids[c] for c in d.idx], 80)}"
            )
        worst = max(d.control("isolated") for d in leaks)
        evidence.append(
            f"with attention isolated per document (position_ids restarting at each document, no "
            f"attention_mask, use_cache=False) the same documents match alone: Δ at most {worst:.1e}"
        )
        if any(d.mode == "eos" for d in leaks):
            causes.append(
                (
                    "the collator concatenates separate dataset examples into one row (a naive SFT packer) and "
                    "nothing marks their boundaries (position_ids run on across examples, one causal mask per "
                    "row): every example attends to the unrelated examples before it"
                )
                if shared
                else (
                    "documents are concatenated with EOS and nothing marks their boundaries (position_ids run on "
                    "across documents, one causal mask per row): every document attends to the ones before it"
                )
            )
            fixes.append(
                "pack with boundaries: DataCollatorWithFlattening() (position_ids restart at 0, first label "
                "of each document -100, no attention_mask) or TRL SFTConfig(packing=True); if the "
                "cross-document attention is deliberate (GPT-style pretraining on a concatenated stream), "
                "set --dlcheck-set L4.allow_cross_document=true"
            )
        restart_leaks = [d for d in leaks if d.mode == "restart"]
        if restart_leaks:
            has_mask = any(item.batch.get("attention_mask") is not None for item in plan)
            impl = getattr(getattr(model, "config", None), "_attn_implementation", None)
            cache_only = use_cache and all(
                d.control("no_cache") is not None and d.control("no_cache") <= atol for d in restart_leaks
            )
            if has_mask:
                causes.append(
                    "the packed batch carries an attention_mask, so transformers builds the causal mask from "
                    "it and ignores the position_ids restarts: each document attends to the documents "
                    "before it in its row"
                    + (" (model.config.use_cache=True would disable the split too)" if use_cache else "")
                )
                fixes.append(
                    "drop attention_mask from packed batches (DataCollatorWithFlattening returns none)"
                    + ("; set model.config.use_cache = False for training" if use_cache else "")
                )
            elif cache_only:
                causes.append(
                    "model.config.use_cache=True: the forward builds a KV cache, and transformers derives "
                    "per-document attention from restarting position_ids only when there is neither an "
                    "attention_mask nor a cache, so each document attends to the ones before it (the HF "
                    "Trainer sets config.use_cache from TrainingArguments.use_cache=False; a custom loop "
                    "does not)"
                )
                fixes.append(
                    "model.config.use_cache = False before training (or model(**batch, use_cache=False)); "
                    "the HF Trainer and TRL SFTTrainer do this for you"
                )
            else:
                causes.append(f"attn_implementation={impl!r} does not split packed documents at position_ids restarts")
                fixes.append(
                    "use attn_implementation='sdpa' or 'eager' (transformers >= 5 derive per-document masks "
                    "from position_ids), or 'flash_attention_2' with DataCollatorWithFlattening("
                    "return_flash_attn_kwargs=True)"
                )
    if cross:
        row, d, prev, _ = cross[0]
        evidence.append(
            f"{len(cross)} of {len(starts)} later document starts are supervised: a document's first token "
            f"is a target predicted from the end of the previous document"
        )
        evidence.append(
            f"row {row.batch}.{row.index}, boundary at token {d[0]}: "
            f"{lm.show_labels(tok, row, [prev[-1], d[0]])}; next document "
            f"{lm.decode(tok, [row.input_ids[c] for c in d], 60)}"
        )
        if any(mode == "restart" for *_, mode in cross) or not leaks:
            causes.append(
                "the packer keeps labels[start] = input_ids[start] at every document start, so the model is "
                "trained to predict each document's opening from an unrelated document"
            )
            fixes.append(
                "set labels[start] = -100 at every document start (DataCollatorWithFlattening does, with "
                "separator_id=-100)"
            )
    if unlabelled:
        evidence.append("(some batches carry no labels, so their document starts were not checked)")
    dlcheck.fail(evidence, "; ".join(causes), "; ".join(fixes))
