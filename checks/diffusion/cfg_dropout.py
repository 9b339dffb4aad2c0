"""DF5: conditioning dropout, so that classifier-free guidance has an unconditional model to use."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from ...errors import MISSING
from ...registry import Setting, check
from ..shared.reuse import reusing
from . import measure as D

#: relative L2 distance under which a training row is the inference unconditional input (bf16 text
#: encoders reproduce an embedding to ~4e-3; two different prompts differ by 0.1 or more)
SAME_RTOL = 1e-2


#: numbers of calls after which DF5 may stop early, passing, when the rate is clearly inside the band
LOOKS = (25, 50, 100, 200)
#: confidence of the early-pass interval (stopping early cannot fail, so this only costs power)
EARLY_ALPHA = 1e-3


def _units(tally: Tally) -> tuple[int, int, str]:
    """(n, k, unit): rows are independent draws when dropout varies within a batch; calls are counted
    when every batch is dropped or kept as a whole, and when no null was seen at all (the conservative
    reading, valid for per-batch dropout too)."""
    per_batch = tally.nulls == 0 or (tally.uniform_calls == tally.calls and tally.rows > tally.calls)
    return (tally.calls, tally.null_calls, "calls") if per_batch else (tally.rows, tally.nulls, "rows")


def _clearly_inside(tally: Tally, low: float, high: float) -> bool:
    n, k, _ = _units(tally)
    return (
        k > 0
        and D.lower_bound(k, n, EARLY_ALPHA) >= low / 2
        and D.upper_bound(k, n, EARLY_ALPHA) <= min(1.0, 1.5 * high)
    )


@dataclass
class Tally:
    kind: str = ""
    rows: int = 0
    calls: int = 0
    null_u: int = 0  # rows equal to the inference unconditional input
    null_other: int = 0  # rows that are another null (all-zero embedding, all-pad ids)
    null_empty: int = 0  # rows equal to the empty prompt's embedding while the sampler's null is zeros
    other_what: str = ""
    uniform_calls: int = 0  # calls whose rows are all null or all kept
    null_calls: int = 0  # calls with at least one null row
    kept_example: str = ""  # a caption that was never dropped, for the evidence
    notes: list[str] = field(default_factory=list)

    @property
    def nulls(self) -> int:
        return self.null_u + self.null_other + self.null_empty


def _kind(c: Any) -> str:
    import torch

    if isinstance(c, (list, tuple)) and c and all(isinstance(s, str) for s in c):
        return "caption"
    if isinstance(c, torch.Tensor):
        if not c.is_floating_point():
            return "class" if c.dim() == 1 else "ids" if c.dim() == 2 else ""
        return "embeddings" if c.dim() >= 2 else ""
    return ""


KIND_WORDS = {"caption": "captions", "ids": "token-id rows", "class": "class labels", "embeddings": "embedding rows"}


def _cond_from_inputs(out: Any) -> Any:
    if not isinstance(out, Mapping):
        return None
    for alias in D.INPUT_KEYS["encoder_hidden_states"]:
        if out.get(alias) is not None:
            return out[alias]
    return None


def _caption_field(batch: Mapping[str, Any]) -> tuple[str, Any] | None:
    if not isinstance(batch, Mapping):  # a loader's bare tensor: no fields
        return None
    for key in D.CAPTION_KEYS:
        if key in batch and _kind(batch[key]) in ("caption", "ids"):
            return key, batch[key]
    return None


def _fields(batch: Any) -> str:
    if isinstance(batch, Mapping):
        return ", ".join(map(str, batch))
    return f"bare {type(batch).__name__}s {tuple(getattr(batch, 'shape', ()))}, no fields"


def _caption_text(tok: Any, batch: Mapping[str, Any], i: int) -> str:
    found = _caption_field(batch)
    if found is None:
        return ""
    value = found[1][i]
    if isinstance(value, str):
        return value
    if tok is MISSING or not hasattr(tok, "decode"):
        return ""
    try:
        return tok.decode([int(x) for x in value], skip_special_tokens=True)
    except Exception:  # noqa: BLE001 - only for the evidence line
        return ""


class Nulls:
    """Recognises the null condition in one representation and compares it with the sampler's."""

    def __init__(self, kind: str, uncond: Any, tok: Any, first: Any):
        import torch

        self.kind = kind
        self.u = None  # the inference unconditional input in this representation
        self.u_what = ""
        self.pad = None
        self.empty = None  # the empty prompt's embedding, compared when the sampler's null is all zeros
        if kind == "caption":
            self.u = uncond if isinstance(uncond, str) else ""
            self.u_what = f"the caption {self.u!r}"
        elif kind == "class":
            if isinstance(uncond, int) or (
                isinstance(uncond, torch.Tensor) and uncond.numel() == 1 and not uncond.is_floating_point()
            ):
                self.u = int(uncond)
                self.u_what = f"the class id {self.u}"
        elif kind == "ids":
            length = first.shape[1]
            if isinstance(uncond, torch.Tensor) and not uncond.is_floating_point() and uncond.numel() == length:
                self.u = uncond.flatten().cpu()
                self.u_what = "dlcheck_uncond's token ids"
            elif tok is not MISSING and callable(tok):
                ids = tok([""], padding="max_length", max_length=length, truncation=True)["input_ids"][0]
                self.u = torch.tensor(ids)
                self.u_what = f"the empty prompt tokenized to {length} ids"
            self.pad = getattr(tok, "pad_token_id", None) if tok is not MISSING else None
        elif kind == "embeddings":
            if isinstance(uncond, torch.Tensor) and uncond.is_floating_point():
                u = uncond.detach().float().cpu()
                while u.dim() > first.dim() - 1 and u.shape[0] == 1:
                    u = u[0]
                if tuple(u.shape) == tuple(first.shape[1:]):
                    self.u = u
                    self.u_what = (
                        "dlcheck_uncond, an all-zero embedding"
                        if float(u.norm()) == 0.0
                        else f"dlcheck_uncond, an embedding of norm {float(u.norm()):.3g} (the empty prompt's, "
                        "when derived from the pipeline)"
                    )
                else:
                    self.u_what = (
                        f"dlcheck_uncond of shape {tuple(uncond.shape)}, which does not match the training "
                        f"rows {tuple(first.shape[1:])}"
                    )

    def classify(self, c: Any) -> list[str]:
        """For each row: 'u' (the inference null), 'other' (another null) or '' (conditioned)."""
        import torch

        out = []
        if self.kind == "caption":
            return ["u" if s.strip() == self.u.strip() or not s.strip() else "" for s in c]
        c = c.detach().cpu()
        if self.kind == "class":
            return ["u" if self.u is not None and int(v) == self.u else "" for v in c]
        if self.kind == "ids":
            for row in c:
                if self.u is not None and torch.equal(row, self.u.to(row.dtype)):
                    out.append("u")
                elif (self.pad is not None and bool(torch.all(row == self.pad))) or not bool(row.any()):
                    out.append("other")
                else:
                    out.append("")
            return out
        c = c.float()
        for row in c:
            norm = float(row.norm())
            if self.u is not None and float((row - self.u).norm()) <= SAME_RTOL * max(float(self.u.norm()), 1e-12):
                out.append("u")
            elif norm == 0.0:
                out.append("other")
            elif self.empty is not None and float((row - self.empty).norm()) <= SAME_RTOL * max(
                float(self.empty.norm()), 1e-12
            ):
                out.append("empty")
            else:
                out.append("")
        return out

    @property
    def other_what(self) -> str:
        return {"ids": "all-pad (or all-zero) token rows", "embeddings": "all-zero embeddings"}.get(self.kind, "")


@dataclass
class _State:
    get: Any
    source: str
    from_batch: bool = False
    nulls: Any = None
    early: bool = False
    rows_per_call: int = 0  # examples the collator gets per call: many at first when it may choose, else the batch size
    look: int = 0  # the next of LOOKS to look at


def _empty_when_sampler_null_is_zero(dlcheck, nulls: Nulls, tok: Any, first: Any) -> Any:
    """The empty prompt's embedding (one row) when the sampler's null is an all-zero embedding, so that a
    training path dropping to "" is recognised as dropping to another null; None otherwise."""
    if nulls.kind != "embeddings" or nulls.u is None or float(nulls.u.norm()) != 0.0:
        return None
    from . import own_encoding_of_the_null, pipeline_null_embeddings

    pipe = dlcheck.optional("pipeline")
    if pipe is not None and own_encoding_of_the_null(pipe):
        # several text encoders (SDXL): the empty prompt as the pipeline itself encodes it
        e = dlcheck.memo(pipe, "diffusion:empty-prompt", lambda: pipeline_null_embeddings(pipe, negative_prompt=""))
        e = e.detach().float().cpu()
        while e.dim() > first.dim() - 1 and e.shape[0] == 1:
            e = e[0]
        return e if tuple(e.shape) == tuple(first.shape[1:]) else None
    enc = dlcheck.optional("text_encoder")
    if tok is MISSING or tok is None or enc is None:
        return None
    from . import empty_prompt_embeddings

    try:
        e = empty_prompt_embeddings(tok, enc).detach().float().cpu()
    except Exception:  # noqa: BLE001 - an encoder that does not take the tokenizer's ids: unknown
        return None
    while e.dim() > first.dim() - 1 and e.shape[0] == 1:
        e = e[0]
    return e if tuple(e.shape) == tuple(first.shape[1:]) else None


def _draw(dlcheck, batches, tally: Tally, state: _State, low: float, high: float, tok: Any, calls: int) -> None:
    """Draw the conditioning path on each fresh batch, classify every row, stop early when clearly fine."""
    import torch

    bs = dlcheck.batch_size

    for _keys, batch in batches:
        c = None
        if state.get is None:
            if dlcheck.has("training_inputs"):
                fn_in = D.user_callable(dlcheck, "training_inputs", dlcheck.role("training_inputs"))

                def get_from_inputs(b, fn_in=fn_in):
                    with torch.no_grad(), reusing(dlcheck, dlcheck.optional("text_encoder")):
                        return _cond_from_inputs(dlcheck.call("training_inputs", lambda: fn_in(b)))

                c = get_from_inputs(batch)
                if c is not None:
                    state.get, state.source = get_from_inputs, "the 'encoder_hidden_states' of dlcheck_training_inputs"
            if state.get is None:
                found = _caption_field(batch)
                if found is None:
                    dlcheck.skip(
                        "missing role: define fixture dlcheck_condition (callable batch -> conditioning) in "
                        f"conftest.py: the batches ({_fields(batch)}) carry no captions or input_ids"
                    )
                key = found[0]
                state.get, state.source, state.from_batch = (lambda b, key=key: b[key]), f"the batch's {key!r}", True
                c = None
        if c is None:
            with torch.no_grad(), reusing(dlcheck, dlcheck.optional("text_encoder")):
                c = state.get(batch)  # the same caption encoded again is a copy of the first encoding, no pass
        if state.nulls is None:
            kind = _kind(c)
            if not kind:
                dlcheck.skip(
                    f"{state.source} returned a {type(c).__name__}"
                    f"{' of shape ' + str(tuple(c.shape)) if hasattr(c, 'shape') else ''}; DF5 reads "
                    "embeddings (B, seq, dim), token ids (B, seq), class ids (B,) or a list of captions"
                )
            uncond = dlcheck.role("uncond")
            state.nulls = Nulls(kind, uncond, tok, c)
            state.nulls.empty = _empty_when_sampler_null_is_zero(dlcheck, state.nulls, tok, c)
            tally.kind = kind
            if kind == "class" and state.nulls.u is None:
                dlcheck.skip(
                    "class-label conditioning: define dlcheck_uncond as the class id your sampler uses as "
                    "the unconditional input, so DF5 can recognise the null"
                )
        labels = state.nulls.classify(c)
        tally.calls += 1
        tally.rows += len(labels)
        tally.null_u += labels.count("u")
        tally.null_other += labels.count("other")
        tally.null_empty += labels.count("empty")
        dropped = sum(1 for x in labels if x)
        tally.null_calls += dropped > 0
        tally.uniform_calls += dropped in (0, len(labels))
        if not tally.kept_example and labels and not labels[0]:
            tally.kept_example = _caption_text(tok, batch, 0)
        if state.rows_per_call > bs and dropped in (0, len(labels)):
            # a large call dropped all or nothing: the dropout may be decided per batch (or never), which only
            # many calls can tell: batches of the batch size from now on
            state.rows_per_call = bs
        n, _, unit = _units(tally)
        scale = bs if unit == "rows" else 1
        looked = False
        while state.look < len(LOOKS) and n >= LOOKS[state.look] * scale:
            state.look += 1
            looked = True
        if looked and _clearly_inside(tally, low, high):
            state.early = True
            return  # stopping early only passes the rate, so the false-alarm bound of the full test holds
        if unit == "rows" and tally.rows >= calls * bs:
            return  # as many independent rows as the full test of `calls` batches would have


@check(
    "DF5",
    domain="diffusion",
    title="no conditioning dropout, so classifier-free guidance does nothing",
    optional_roles=("dataloader", "condition", "training_inputs", "uncond", "tokenizer", "unet"),
    settings=(
        Setting(
            "low",
            0.05,
            "lowest acceptable share of null conditions; 10% is the usual choice (Stable "
            "Diffusion v1, Imagen, DiT, diffusers' proportion_empty_prompts examples), 5% the lowest in common use",
        ),
        Setting(
            "high",
            0.5,
            "highest acceptable share: half, the most that published recipes drop on purpose (diffusers' ControlNet "
            "example, --proportion_empty_prompts 0.5; DALL-E 2's decoder drops its captions 50% of the time); above "
            "it the condition is dropped more often than kept, the mark of an inverted test (random() > 0.1 drops "
            "90%) or of a path that drops every condition",
        ),
        Setting(
            "draws",
            300,
            "calls of the conditioning path, each on a freshly collated batch. 300 makes a "
            "path that never drops fail at low = 5% even when the dropout were decided per batch: "
            "0.95^300 = 2e-7 < false_alarm / 2",
        ),
        Setting(
            "false_alarm",
            1e-6,
            "probability of failing a path whose true null rate lies within [low, high]: "
            "each side's exact binomial test runs at false_alarm / 2",
        ),
    ),
)
def check_cfg_dropout(dlcheck):
    """The training conditioning path drops the condition 5–50% of the time, to the sampler's null.

    What it does
        Draws the training conditioning path ``draws`` times (default 300), each time on a batch freshly
        collated from the dataset (so dropout in a dataset transform or collator is redrawn), through
        ``dlcheck_condition(batch)``, else the 'encoder_hidden_states' of ``dlcheck_training_inputs(batch)``,
        else the batch's own captions / input_ids. A row is null when it equals the sampler's
        unconditional input (``dlcheck_uncond``, derived from the pipeline as the empty prompt's
        embedding; "" for captions; the empty prompt's ids for token ids), or is another null (an
        all-zero embedding, an all-pad token row). The null rate is tested against [low, high] with
        exact one-sided binomial tests at false_alarm / 2 each, so a path whose true rate lies in the
        band fails with probability ≤ 1e-6 (rows are counted when dropout varies within a batch;
        calls are counted when every batch is dropped or kept as a whole, and when nothing is dropped).
        It stops early, passing, after 25/50/100/200 calls (or as many batches' worth of rows) once a
        1 − 1e-3 confidence interval of the rate lies within [low/2, 1.5·high]; it fails only on the full
        draws, so the bound holds. With ``dlcheck_condition`` and a collator, the collator gets 25 batches'
        worth of examples per call, so the text encoder runs once for them (a clean path passes in one or
        two passes); a call that drops all or nothing switches to batch-sized calls, since only many calls
        can tell a per-batch dropout from none.
        Nulls that differ from the sampler's unconditional input (zeros in training, the empty prompt at
        inference) fail too. It runs only in a project with a diffusion role (dlcheck_pipeline,
        _noise_scheduler, _vae, _condition, _training_inputs, _uncond …), so that an LLM's or VLM's
        data is never read as captions under ``--dlcheck=all``.
    Why it is bad
        Classifier-free guidance computes uncond + s·(cond − uncond). A model never trained on the
        unconditional input returns garbage for it, and guidance amplifies that garbage; a model trained
        on a zero embedding as its null but sampled with the empty prompt's embedding has the same
        problem. Dropping the condition more often than keeping it (an inverted comparison, a path that
        drops everything) starves the conditional model. The band is wide on purpose: 10% is the usual
        rate, and recipes that condition on something else too drop half the prompts (ControlNet).
    Example
        caption = example["text"]                       # no dropout anywhere: proportion_empty_prompts = 0
        ehs = torch.where(drop[:, None, None], torch.zeros_like(ehs), ehs)   # null = zeros, sampler uses ""
    Use instead
        caption = "" if random.random() < 0.1 else caption (dataset transform or collator), or
        ehs = torch.where((torch.rand(B, device=d) < 0.1)[:, None, None], null_ehs, ehs) with null_ehs the
        text encoder's output for "" (what StableDiffusionPipeline uses as negative_prompt_embeds).
    Known problems
        A learned null embedding (an nn.Parameter) is recognised only when dlcheck_uncond returns it. A
        pipeline with more than one text encoder (SDXL, SD3) gives the unconditional input its own
        ``encode_prompt`` builds with classifier-free guidance and no negative prompt (SDXL: both encoders'
        penultimate hidden states concatenated, or zeros with force_zeros_for_empty_prompt); a one-encoder
        pipeline gives its text encoder's encoding of "". An unconditional input of another shape than the
        training rows is not compared, and the check skips unless dlcheck_uncond is given.
        With only the batch's own captions and no null seen, the check skips: dropout applied later in the
        training step is invisible there (give dlcheck_condition). Ignore DF5 if you never sample with
        guidance_scale > 1. Each draw reads the dataset again, and through dlcheck_training_inputs also
        encodes the images with the VAE: give dlcheck_condition (the caption → embeddings path alone)
        to make the 300 draws cheap, or lower DF5.draws.
    Not applicable
        A training whose sampler is a consistency sampler (an ``LCMScheduler``, ``TCDScheduler`` or
        ``CMStochasticIterativeScheduler`` as dlcheck_inference_scheduler or the pipeline's scheduler: diffusers'
        consistency distillation, LCM-LoRA), whose guidance is distilled from a guided teacher.
        Unconditional diffusion (a UNet2DModel without class embeddings, DDPMPipeline; a training whose
        dataloader yields bare image tensors, with no caption, class label or any other field, no role that
        brings a condition (dlcheck_condition, dlcheck_uncond, a text encoder, a pipeline, a collator or a
        tokenizer) and a dlcheck_training_inputs, when given, that feeds the denoiser no conditioning): there
        is no condition to drop. Such a loader whose training step does condition the denoiser (class ids it
        draws, returned by dlcheck_training_inputs) is judged: its bare batches are handed to that code as
        yielded. A frozen denoiser (no parameter of dlcheck_unet requires grad, and no trained
        ControlNet or adapter in the pipeline: textual inversion's unet.requires_grad_(False), training one
        token embedding): caption dropout trains the denoiser's unconditional prediction, which a frozen
        denoiser cannot learn; its pretrained one is what guidance uses. A LoRA inside the UNet is trained,
        and judged. Projects that are not a diffusion training (no diffusion role: an LLM's or
        VLM's data is never read as captions).
    """
    if not D.diffusion_roles(dlcheck):
        dlcheck.not_applicable(
            "no diffusion role: DF5 judges the conditioning of a text-to-image training and needs one of "
            + ", ".join(f"dlcheck_{r}" for r in D.DIFFUSION_ROLES)
            + " beside the data"
        )
    if not dlcheck.has("condition"):
        reason = D.unconditional(dlcheck)
        if reason is not None:
            dlcheck.not_applicable(f"{reason}: classifier-free guidance has no condition to drop")
    frozen = D.frozen_denoiser(dlcheck)
    if frozen is not None:
        dlcheck.not_applicable(
            f"{frozen}: dropping the condition trains the denoiser's unconditional prediction, which a frozen "
            "denoiser cannot learn; guidance uses the one it was pretrained with (textual inversion trains a token "
            "embedding, not the denoiser)"
        )
    consistency = D.consistency_sampler(dlcheck)
    if consistency is not None:
        dlcheck.not_applicable(
            f"{consistency}, the sampler of a consistency-distilled model (LCM, LCM-LoRA, TCD): its few steps carry "
            "the guidance distilled from a guided teacher (the teacher's unconditional prediction is what the "
            "distillation used), not classifier-free guidance on an unconditional prediction of the student that "
            "conditioning dropout would train"
        )
    calls = dlcheck.setting("draws")
    alpha = dlcheck.setting("false_alarm")
    low, high = dlcheck.setting("low"), dlcheck.setting("high")
    tok = dlcheck.role("tokenizer")

    get: Callable[[Mapping[str, Any]], Any] | None = None
    source = ""
    if dlcheck.has("condition"):
        fn = D.user_callable(dlcheck, "condition", dlcheck.role("condition"))
        get, source = (lambda b: dlcheck.call("condition", lambda: fn(b))), "dlcheck_condition"
    tally = Tally()
    # the conditioning path alone (a text encoder) takes the rows of many batches in one call: the first
    # looks at the rate cost a pass or two, not 25-50
    state = _State(get, source, rows_per_call=LOOKS[0] * dlcheck.batch_size if get is not None else 0)
    desc, batches, sized = D.redraw_batches(dlcheck, calls, lambda: state.rows_per_call or dlcheck.batch_size)
    if not sized:
        state.rows_per_call = dlcheck.batch_size
    try:
        _draw(dlcheck, batches, tally, state, low, high, tok, calls)
    finally:
        batches.close()  # a dataloader's generator is put back now, not at garbage collection
    source, from_batch, nulls, early = state.source, state.from_batch, state.nulls, state.early

    if nulls is None or tally.rows == 0:
        dlcheck.skip(f"{desc} gave no batch")
    what = KIND_WORDS[tally.kind]
    if tally.kind == "embeddings" and nulls.u is None and tally.nulls == 0:
        dlcheck.skip(
            f"no all-zero embedding in {tally.rows} {what} from {source}, and the sampler's unconditional "
            f"input is unknown ({nulls.u_what or 'no dlcheck_uncond, dlcheck_pipeline or tokenizer + text encoder'}): "
            "define dlcheck_uncond"
            + ("" if dlcheck.has("pipeline") else " (or dlcheck_pipeline)")
            + " so DF5 can recognise the null"
        )
    if tally.kind == "ids" and nulls.u is None and tally.nulls == 0:
        dlcheck.skip(
            f"no all-pad row in {tally.rows} {what} from {source} and no tokenizer to encode the empty "
            "prompt: define dlcheck_tokenizer (or dlcheck_uncond)"
        )
    if from_batch and tally.nulls == 0:
        dlcheck.skip(
            f"no null caption in {tally.rows} {what} of {tally.calls} {desc}; caption dropout applied inside the training "
            "step is invisible there: define dlcheck_condition (or dlcheck_training_inputs returning "
            "'encoder_hidden_states') so DF5 can decide"
        )

    # ---- the rate --------------------------------------------------------------------------------------
    n, k, unit = _units(tally)
    rate = tally.nulls / tally.rows
    head = (
        f"{tally.nulls} of {tally.rows} {what} from {tally.calls} calls of {source} were null ({rate:.1%}) — on {desc}"
    )
    null_words = f"null = {nulls.u_what or 'unknown'}" + (f" or {nulls.other_what}" if nulls.other_what else "")
    findings: list[tuple[list[str], str, str]] = []
    p_low = D.binom_cdf(k, n, low)
    p_high = D.binom_sf(k, n, high)
    dlcheck.attach(
        "bars",
        title=f"DF5: null-condition rate, {k} of {n} {unit}",
        values={"measured null rate": k / n if n else 0.0},
        ci={"measured null rate": [D.lower_bound(k, n, alpha), D.upper_bound(k, n, alpha)]},
        bands=[{"lo": low, "hi": high, "label": f"accepted band [{low:g}, {high:g}]"}],
        caption=f"the bar's whisker is its {1 - alpha:.4g} confidence interval",
    )
    fix_rate = (
        "replace the condition by the empty prompt for ~10% of training examples: caption = '' if "
        "random.random() < 0.1 else caption (dataset transform or collator; proportion_empty_prompts=0.1 in "
        "diffusers scripts), or ehs = torch.where((torch.rand(B) < 0.1)[:, None, None], null_ehs, ehs) with "
        "null_ehs the text encoder's output for ''; set DF5.low/DF5.high if you intend another rate"
    )
    if tally.kind == "class":
        null_id = nulls.u if nulls.u is not None else "num_classes"
        fix_rate = (
            f"replace the class label by the null class id ({null_id}, the extra row of the class embedding that the "
            f"sampler passes as its unconditional input) for ~10% of training examples: class_labels = "
            f"torch.where(torch.rand(B) < 0.1, {null_id}, class_labels) (DiT: class_dropout_prob=0.1); set "
            "DF5.low/DF5.high if you intend another rate"
        )
    if early:
        pass  # the rate is inside the band (checked above); only the null itself is left to compare
    elif p_low <= alpha / 2:
        ub = D.upper_bound(k, n, alpha / 2)
        example = f"; e.g. {tally.kept_example!r} was kept" if tally.kept_example else ""
        findings.append(
            (
                [
                    head,
                    f"{null_words}{example}",
                    f"with a true null rate ≥ {low:.0%}, {f'{k} or fewer null {unit}' if k else f'no null {unit[:-1]}'} "
                    f"in {n} has probability {p_low:.1e} "
                    f"(≤ {alpha / 2:g}): the rate is below {ub:.1%} with confidence 1 − {alpha / 2:g}",
                ],
                "the training conditioning path (almost) never replaces the condition by the unconditional input, so the "
                "model never learns the unconditional prediction that classifier-free guidance extrapolates from",
                fix_rate,
            )
        )
    elif p_high <= alpha / 2:
        lb = D.lower_bound(k, n, alpha / 2)
        findings.append(
            (
                [
                    head,
                    null_words,
                    f"with a true null rate ≤ {high:.0%}, {k} or more null {unit} in {n} has probability {p_high:.1e} "
                    f"(≤ {alpha / 2:g}): the rate is above {lb:.1%} with confidence 1 − {alpha / 2:g}",
                ],
                "the conditioning is dropped far more often than needed, starving the conditional model",
                "lower the dropout probability (proportion_empty_prompts, conditioning_dropout_prob) to ~0.1; set "
                "DF5.low/DF5.high if you intend this rate",
            )
        )

    # ---- the null itself -------------------------------------------------------------------------------
    if tally.null_other and nulls.u is not None and tally.kind in ("embeddings", "ids"):
        u_is_zero = tally.kind == "embeddings" and float(nulls.u.norm()) == 0.0
        if not u_is_zero:
            findings.append(
                (
                    [
                        f"{tally.null_other} of {tally.nulls} null rows are {nulls.other_what}; the sampler's unconditional "
                        f"input is {nulls.u_what}"
                    ]
                    + ([head] if not findings else []),
                    "the model learns its unconditional prediction for another input than the one classifier-free "
                    "guidance feeds at inference",
                    "use the empty prompt's encoding as the training null (null_ehs = text_encoder(tokenizer('', "
                    "padding='max_length', max_length=tokenizer.model_max_length, return_tensors='pt').input_ids)[0]), "
                    "or give the sampler the same null (negative_prompt_embeds=torch.zeros_like(prompt_embeds))",
                )
            )
    if tally.null_empty:
        findings.append(
            (
                [
                    f"{tally.null_empty} of {tally.nulls} null rows are the empty prompt's embedding (text_encoder('')); "
                    f"the sampler's unconditional input is {nulls.u_what}"
                ]
                + ([head] if not findings else []),
                "the model learns its unconditional prediction for the empty prompt's embedding, but classifier-free "
                "guidance feeds it an all-zero embedding, an input it was never trained on",
                "give the sampler the null it was trained with (negative_prompt='' and no zero "
                "negative_prompt_embeds"
                + (
                    ", or the pipeline built with force_zeros_for_empty_prompt=False"
                    if D.sched_config(dlcheck.optional("pipeline")).get("force_zeros_for_empty_prompt")
                    else ""
                )
                + "; dlcheck_uncond = the empty prompt's embedding), or train with the zero "
                "null (null_ehs = torch.zeros_like(ehs))",
            )
        )
    if findings:
        evidence = [line for f in findings for line in f[0]]
        dlcheck.fail(evidence, "; ".join(f[1] for f in findings), "; ".join(f[2] for f in findings))
    lb, ub = (
        D.lower_bound(k, n, EARLY_ALPHA if early else alpha / 2),
        D.upper_bound(k, n, EARLY_ALPHA if early else alpha / 2),
    )
    dlcheck.measured(
        f"{tally.nulls} of {tally.rows} {what} null ({rate:.1%}) from {tally.calls} calls of {source}, within "
        f"[{low:.0%}, {high:.0%}]",
        head,
        null_words
        + (
            f"; every null row is the sampler's unconditional input ({tally.null_u} of {tally.nulls})"
            if nulls.u is not None and not tally.null_other
            else ""
        ),
        (
            f"stopped early after {tally.calls} calls: the rate lies in [{lb:.1%}, {ub:.1%}] with confidence "
            f"1 − {EARLY_ALPHA:g}, inside [{low / 2:.1%}, {min(1.0, 1.5 * high):.0%}]"
            if early
            else f"neither bound rejected at {alpha / 2:g}: P(≤ {k} null {unit} | {low:.0%}) = {p_low:.2g}, "
            f"P(≥ {k} | {high:.0%}) = {p_high:.2g}"
        ),
        nulls=tally.nulls,
        rows=tally.rows,
        calls=tally.calls,
        rate=round(rate, 4),
        low=low,
        high=high,
        early=early,
    )
