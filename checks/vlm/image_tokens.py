from __future__ import annotations

from typing import Any

from ...errors import MISSING, RoleError
from ...registry import Setting, check
from ...sampling import get_sample
from ..shared import lm
from . import common
from . import measure as vlm

MISMATCH_TEXTS = ("image` token count", "image token count", "image tokens do not match")


def _max_length(dlcheck: Any) -> int | None:
    collator = dlcheck.role("collator")
    for obj in (collator, getattr(collator, "data_collator", None), dlcheck.role("training_args")):
        value = getattr(obj, "max_length", None) if obj is not MISSING and obj is not None else None
        if isinstance(value, int):
            return value
    return None


def _fix(ml: int | None, most: int) -> str:
    where = f"max_length (now {ml})" if ml else "max_length"
    tokens = f"the {most} image tokens" if most else "the image tokens"
    return (
        f"raise {where} well above {tokens} an example carries plus its text, or set it to None "
        f"(TRL: SFTConfig(max_length=None) / DataCollatorForVisionLanguageModeling(max_length=None)); truncate "
        f"the text before the processor expands the images, never the expanded input_ids"
    )


def _vision_model(model: Any) -> bool:
    """A model whose config says it sees images (a vision config, an image token id)."""
    config = getattr(model, "config", None)
    return any(getattr(config, k, None) is not None for k in ("vision_config", "image_token_id", "image_token_index"))


def _source_text(example: Any) -> str | None:
    """The example's text before collation (prompt + completion, text, or the messages' contents)."""
    if not isinstance(example, dict):
        return None
    if isinstance(example.get("prompt"), str) and isinstance(example.get("completion"), str):
        text = example["prompt"] + example["completion"]
    elif isinstance(example.get("text"), str):
        text = example["text"]
    elif isinstance(example.get("messages"), list):
        text = " | ".join(str(m.get("content")) for m in example["messages"] if isinstance(m, dict))
    else:
        return None
    return repr(text if len(text) <= 120 else text[:58] + " … " + text[-58:])


@check(
    "X4",
    domain="vlm",
    title="truncation cuts image tokens",
    optional_roles=("tokenizer", "dataloader", "model", "collator", "training_args"),
    settings=(
        Setting(
            "max_short_share",
            0.0,
            "share of sampled examples allowed to carry a different number of image "
            "placeholders than their images expand to; 0 because one such example already breaks the forward pass "
            "(or silently misaligns the image features)",
        ),
    ),
)
def check_image_tokens(dlcheck):
    """Every example carries exactly tokens-per-image × images image placeholder tokens.

    What it does
        Asks the processor (``dlcheck_tokenizer``) what one image expands to: it runs the processor on
        each sampled example's own images (or on a blank image, for fixed-size vision towers) without
        truncation and counts the placeholder tokens; with a Llava model it also checks the config
        agrees ((image_size / patch_size)², + 1 with ``vision_feature_select_strategy='full'``) and that
        processor and model use the same image token id. Then it counts the placeholders in every
        sampled, collated example and fails on any example whose count differs, showing it decoded
        (``<image>×N``) with the truncation that cut it. A collator whose processor refuses a
        truncated batch fails here too, with the processor's own message.
    Why it is bad
        The processor expands each ``<image>`` into one placeholder per visual feature (576 for
        LLaVA-1.5 at 336 px); a ``max_length`` chosen for text (512) then cuts them. The model either
        raises "Image features and image tokens do not match" mid-training — or, where features are
        scattered by count, feeds a truncated, misaligned image. TRL's prompt-completion collator
        truncates after expansion, silently.
    Example
        SFTConfig(max_length=512) for LLaVA-1.5, whose 336-px image expands to 576 <image> tokens;
        DataCollatorForVisionLanguageModeling(processor, max_length=512) likewise.
    Use instead
        SFTConfig(max_length=None), or a max_length above the image tokens plus the longest text.
    Known problems
        Needs the processor's image token (``processor.image_token``) or the model config's
        ``image_token_id``. Without the raw examples (dataloader only) the number of images per
        example is read from ``pixel_values`` and assumed equal per example for fixed-size towers;
        variable-resolution processors (LlavaNext anyres, Qwen2-VL) need the examples' images
        (dlcheck_collator + dlcheck_dataset, or a trainer).
    Not applicable
        Text-only pipelines (a text tokenizer without an image processor, a language model without a vision
        tower such as GPT-2 or Llama), torchvision or timm image models, diffusion trainings. Pipelines with neither text nor images (no processor, batches without token ids or images: a graph
        network's node features, tabular rows).
    """
    model = dlcheck.role("model")
    if not dlcheck.has("tokenizer"):
        common.require_vlm(dlcheck, model)
    (proc,) = dlcheck.require("tokenizer")
    tok = lm.text_tokenizer(proc)
    image_id = vlm.image_token_id(proc, model)
    if image_id is None:
        reason = common.not_vlm(model) if model is not MISSING else None
        if (
            reason is None
            and getattr(proc, "image_processor", None) is None
            and (model is MISSING or not _vision_model(model))
        ):
            reason = (
                f"dlcheck_tokenizer ({type(proc).__name__}) is a text tokenizer, with no image processor and no "
                "image token"
                + ("" if model is MISSING else f", and dlcheck_model ({type(model).__name__}) has no image_token_id")
            )
        reason = reason or common.not_a_vlm_project(dlcheck, model)
        if reason is not None:
            dlcheck.not_applicable(reason)
        dlcheck.skip(
            "X4 cannot decide: dlcheck_tokenizer is not a processor with image_token, and dlcheck_model's config "
            "has no image_token_id"
        )
    name = lm.token_text(tok, image_id)
    model_id = vlm.model_image_token_id(model)
    if model_id is not None and model_id != image_id:
        dlcheck.fail(
            [
                f"the processor writes image placeholders as {name!r} (id {image_id}); the model replaces id "
                f"{model_id} ({lm.token_text(tok, model_id)!r}, config.image_token_id)"
            ],
            "processor and model disagree on the image token: the model finds no placeholder to put the image "
            "features at, and raises or ignores the image",
            f"set model.config.image_token_id = {image_id} (processor.image_token_id), or build the processor "
            f"with image_token={lm.token_text(tok, model_id)!r}",
        )
    ml = _max_length(dlcheck)
    try:
        sample = get_sample(dlcheck)
    except RoleError as exc:
        if any(t in exc.message for t in MISMATCH_TEXTS):
            dlcheck.fail(
                [f"collating the sampled examples fails: {exc.message}"],
                f"the collator calls the processor with truncation (max_length={ml}): the text is truncated after "
                f"each image was expanded into its placeholder tokens, so some are cut",
                _fix(ml, 0),
            )
        raise
    if not lm.has_token_batches(sample.batches):
        dlcheck.skip(f"batches from {sample.source} carry no input_ids")

    can_process = callable(proc) and vlm.image_token_text(proc) is not None and hasattr(proc, "image_processor")
    per_image, fixed, how = None, False, ""
    if can_process:
        size = vlm.processor_image_size(proc, model)
        per_image = dlcheck.memo(
            proc,
            f"vlm:expansion:{size}",
            lambda: vlm.processor_expansion(proc, [vlm.dummy_image(size)], image_id, f"a blank {size}px image"),
        )
        bigger = (size[0] * 2, size[1] * 2)
        fixed = per_image == dlcheck.memo(
            proc,
            f"vlm:expansion:{bigger}",
            lambda: vlm.processor_expansion(proc, [vlm.dummy_image(bigger, 1)], image_id, f"a blank {bigger}px image"),
        )
        how = f"the processor expands one {name} into {per_image} tokens"
    cfg = vlm.config_tokens_per_image(model) if model is not MISSING else None
    if cfg is not None:
        if per_image is not None and fixed and per_image != cfg[0]:
            ip = getattr(proc, "image_processor", None)
            dlcheck.fail(
                [
                    f"the processor expands one image into {per_image} {name} tokens, but the model makes {cfg[0]} "
                    f"image features ({cfg[1]})",
                    f"processor: patch_size={getattr(proc, 'patch_size', None)}, num_additional_image_tokens="
                    f"{getattr(proc, 'num_additional_image_tokens', None)}, vision_feature_select_strategy="
                    f"{getattr(proc, 'vision_feature_select_strategy', None)!r}, image size "
                    f"{vlm.processor_image_size(proc, model)} ({type(ip).__name__})",
                ],
                "the processor and the model's config disagree on tokens per image, so every example carries the "
                "wrong number of placeholders for the features the model makes",
                f"build the processor from the model's config: patch_size={model.config.vision_config.patch_size}, "
                f"vision_feature_select_strategy={model.config.vision_feature_select_strategy!r}, "
                "num_additional_image_tokens=1 for CLIP-style towers with a CLS token, 0 for towers without one "
                "(SigLIP)",
            )
        if per_image is None:
            per_image, fixed, how = cfg[0], True, f"the model makes {cfg[0]} features per image: {cfg[1]}"
        else:
            how += f", as the model's config says: {cfg[1]}"
    if per_image is None:
        dlcheck.skip(
            "cannot tell how many tokens one image expands to: dlcheck_tokenizer is not an image processor and "
            "dlcheck_model is not a Llava model"
        )

    rows = lm.rows(sample.batches)
    raw = sample.raw_rows or sample.rows
    per_batch: dict[int, int] = {}
    for row in rows:
        per_batch[row.batch] = per_batch.get(row.batch, 0) + 1
    judged, bad = 0, []  # (row, count, expected, images)
    for row in rows:
        ids = row.input_ids
        count = sum(1 for i in ids if i == image_id)
        images = None
        # a row per example only: a preference collator stacks each example's chosen and rejected rows (TRL's
        # DataCollatorForVisionPreference: 2 rows an example), whose order is its own (X4 had indexed past the examples)
        if (
            sample.batch_rows is not None
            and raw is not None
            and len(sample.batch_rows[row.batch]) == per_batch.get(row.batch)
        ):
            images = vlm.example_images(raw[sample.batch_rows[row.batch][row.index]])
        if images is not None:
            if not images:
                expected = 0
            elif fixed:
                expected = per_image * len(images)
            else:
                expected = dlcheck.memo(
                    proc,
                    f"vlm:expansion:{row.batch}:{row.index}:{id(images[0])}",
                    lambda images=images: vlm.processor_expansion(proc, images, image_id),
                )
            n_images = len(images)
        else:
            if not fixed:
                dlcheck.skip(
                    "missing role: define fixtures dlcheck_collator and dlcheck_dataset (or dlcheck_trainer) in "
                    "conftest.py: the processor's expansion depends on the image size and the examples' images are "
                    "not known"
                )
            pv = sample.batches[row.batch].get("pixel_values")
            batch_size = len(sample.batches[row.batch]["input_ids"])
            if pv is None or not hasattr(pv, "shape") or len(pv.shape) != 4:
                if count % per_image:
                    expected, n_images = per_image * (count // per_image + 1), count // per_image + 1
                else:
                    expected, n_images = count, count // per_image
            else:
                per_row = int(pv.shape[0]) // batch_size if int(pv.shape[0]) % batch_size == 0 else None
                if per_row is None:
                    n_images = -(-count // per_image)
                    expected = per_image * n_images
                else:
                    n_images, expected = per_row, per_row * per_image
        judged += 1
        if count != expected:
            bad.append((row, count, expected, n_images))
    if not bad or len(bad) / max(judged, 1) <= dlcheck.setting("max_short_share"):
        counts = sorted({sum(1 for i in r.input_ids if i == image_id) for r in rows})
        dlcheck.measured(
            f"{judged - len(bad)} of {judged} sampled examples carry as many {name} tokens as their images expand "
            f"to ({'/'.join(map(str, counts))} per example); {how}",
            f"examples from {sample.source}"
            + (f"; max_length={ml}" if ml is not None else "; no max_length")
            + ("; image counts from the raw examples" if raw is not None else "; image counts from pixel_values"),
            examples=judged,
            mismatched=len(bad),
            tokens_per_image=per_image,
            max_length=ml,
        )
        return

    row, count, expected, n_images = bad[0]
    real = row.content
    length = len(real)
    last = row.input_ids[real[-1]] if real else None
    cut = count < expected and (last == image_id or (ml is not None and length >= ml))
    short = [b for b in bad if b[1] < b[2]]
    evidence = [
        f"{len(bad)} of {judged} sampled examples carry a different number of {name} tokens than their images "
        f"expand to; {how}",
        f"example {row.batch}.{row.index}: {count} {name} tokens, expected {expected} ({n_images} image"
        f"{'s' if n_images != 1 else ''} × {expected // max(n_images, 1)}); the example is {length} tokens long"
        + (f", ending on {name}" if last == image_id else "")
        + (f" (max_length={ml})" if ml is not None else ""),
        f"  collated: {vlm.show_ids(tok, [row.input_ids[p] for p in real] or row.input_ids, image_id)}",
    ]
    source = (
        _source_text(raw[sample.batch_rows[row.batch][row.index]]) if sample.batch_rows is not None and raw else None
    )
    if source:
        evidence.append(f"  before collation: {source}")
    for r, c, e, _ in bad[1:3]:
        evidence.append(f"example {r.batch}.{r.index}: {c} {name} tokens, expected {e}")
    most = max(b[2] for b in bad)
    if short and (cut or ml is not None):
        cause = (
            f"truncation{f' to max_length={ml}' if ml else ''} runs after the processor expanded each image into "
            f"{per_image if fixed else 'its'} placeholder tokens and cuts them: the model raises 'Image features and "
            f"image tokens do not match' when it meets the batch, or feeds a truncated, misaligned image"
        )
        fix = _fix(ml, most)
    elif count == n_images and per_image > 1:
        cause = (
            f"the examples carry one {name} per image: the text was tokenized by the tokenizer alone, which does not "
            f"expand {name} into the {per_image} placeholders the processor writes"
        )
        fix = "tokenize text and images together with the processor: processor(images=..., text=..., ...)"
    else:
        cause = (
            f"the number of {name} tokens in the text does not match the images given with it (an image token "
            f"written in the text by hand, an image missing from the example, or ids expanded twice)"
        )
        fix = (
            f"write exactly one {name} per image in each example's text (or let the chat template add it) and process "
            "text and images together with the processor"
        )
    dlcheck.fail(evidence, cause, fix)
