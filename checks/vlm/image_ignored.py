from __future__ import annotations

from typing import Any

import torch

from ...errors import MISSING
from ...registry import Setting, check
from ...sampling import get_sample
from ..shared import lm
from . import common
from . import measure as vlm

#: largest per-image std of pixel_values below which the images are constant (a normalised photo has ~1;
#: pixels rescaled twice by 1/255 and then normalised have ~0.005)
CONSTANT_STD = 0.02


def _real(ids: torch.Tensor, mask: Any) -> list[int]:
    """The row's tokens the attention mask marks as real (padding dropped)."""
    if mask is None:
        return ids.tolist()
    return [int(i) for i, m in zip(ids.tolist(), torch.as_tensor(mask).tolist()) if m]


def _noise_like(pv: torch.Tensor, seed: int = 0) -> torch.Tensor:
    """Gaussian noise with the pixel values' own per-channel mean and std (channels on dim 1 of an
    image batch), so only the content changes, not the statistics."""
    g = torch.Generator().manual_seed(seed)
    x = pv.detach().float().cpu()
    noise = torch.randn(x.shape, generator=g)
    if x.dim() >= 4:
        dims = [d for d in range(x.dim()) if d != x.dim() - 3]
        mean, std = x.mean(dims, keepdim=True), x.std(dims, keepdim=True)
    else:
        mean, std = x.mean(), x.std()
    return (noise * std + mean).to(pv.dtype)


def _other_images(batch: dict) -> torch.Tensor | None:
    """The batch's images shifted by one (each example gets another example's image), when the batch
    holds two or more distinct fixed-size images."""
    pv = batch.get("pixel_values")
    if (
        not isinstance(pv, torch.Tensor)
        or pv.shape[0] < 2
        or any(k in batch for k in ("image_grid_thw", "image_sizes"))
    ):
        return None
    rolled = pv.roll(1, 0)
    return None if torch.equal(rolled, pv) else rolled


@check(
    "X5",
    domain="vlm",
    title="the model ignores the image",
    optional_roles=("model", "dataloader", "tokenizer", "towers"),
    settings=(
        Setting(
            "min_change",
            0.01,
            "smallest mean relative change of the (centered) logits at the text positions after "
            "the image when the image is replaced; measured on randomly initialised tiny Llavas (5 seeds): 0.76-0.91 "
            "with another example's image, 0.65-0.79 with noise, and exactly 0 with a zeroed projector; 0.01 sits 65× "
            "under the smallest and above bf16 rounding (2^-8 = 0.4%)",
        ),
    ),
)
def check_image_ignored(dlcheck):
    """The logits move when the image is replaced by another image or by noise.

    What it does
        On up to two sampled batches with pixel values, runs the model (eval mode, no grad) on the
        batch as it is, with each example's image swapped for the next example's, and with Gaussian
        noise of the same per-channel statistics. At every real text position at or after the first
        image placeholder (a causal LM sees the image only from there) it measures
        ‖Δ logits‖ / ‖logits‖ (logits centered, as softmax ignores a shift) and fails when the larger
        of the two mean changes is below ``min_change``. Also fails when batches carry image
        placeholders but no ``pixel_values``.
    Why it is bad
        A VLM that does not look at the image still trains: the loss falls on the text prior, the
        captions read fluently, and the failure shows only in evaluation. Causes: a projector whose
        weights are zero or were never loaded, a collator that drops pixel_values (the placeholder
        token is then embedded as an ordinary token), image tokens masked out by attention_mask.
    Example
        model.model.multi_modal_projector.load_state_dict(torch.load("mm_projector.bin"), strict=False)
        # keys saved as "mm_projector.0.weight": nothing loads; or the projector zero-initialised
    Use instead
        load with strict=True (or check missing_keys), keep transformers' projector initialisation,
        and let the processor's pixel_values reach the model.
    Known problems
        A model early in training (or a random one) already passes: the bound catches a model whose
        image path is cut, not one that uses the image badly. Variable-resolution models get only the
        noise replacement. Skips when the forward pass fails on a placeholder/feature mismatch (see X2
        and X4).
    Not applicable
        Models without a vision tower: text-only language models (GPT-2, Llama…), torchvision or timm image
        models, diffusion denoisers. Pipelines with neither text nor images (no processor, batches without token ids or images: a graph
        network's node features, tabular rows).
    """
    model = dlcheck.role("model")
    common.require_vlm(dlcheck, model)
    dlcheck.require("model")
    tok = dlcheck.role("tokenizer")
    sample = get_sample(dlcheck)
    if not lm.has_token_batches(sample.batches):
        dlcheck.skip(f"batches from {sample.source} carry no input_ids")
    image_id = vlm.model_image_token_id(model)
    if image_id is None and tok is not MISSING:
        image_id = vlm.image_token_id(tok, model)
    if image_id is None:
        dlcheck.skip(
            "X5 cannot decide: dlcheck_model's config has no image_token_id and dlcheck_tokenizer no image_token"
        )
    text_tok = lm.text_tokenizer(tok) if tok is not MISSING else None
    name = lm.token_text(text_tok, image_id)

    with_tokens = [b for b in sample.batches if bool((torch.as_tensor(b["input_ids"]) == image_id).any())]
    no_pixels = [b for b in with_tokens if b.get("pixel_values") is None]
    if no_pixels:
        b = no_pixels[0]
        ids = torch.as_tensor(b["input_ids"])
        dlcheck.fail(
            [
                f"{len(no_pixels)} of {len(sample.batches)} sampled batches carry {int((ids == image_id).sum())} "
                f"{name} placeholders but no pixel_values (batch keys: {', '.join(sorted(map(str, b)))})",
                f"example 0: {vlm.show_ids(text_tok, _real(ids[0], b.get('attention_mask', [None])[0]), image_id)}",
            ],
            f"the collator drops the images: without pixel_values the model embeds {name} as an ordinary token "
            "and trains on text alone, without an error",
            "return the processor's pixel_values (and image_sizes / image_grid_thw) from the collator; with a "
            "Trainer keep remove_unused_columns=False so the image column reaches the collator",
        )
    if not with_tokens or not vlm.image_batches(sample):
        dlcheck.skip(f"no sampled batch from {sample.source} carries images ({name} placeholders with pixel_values)")
    lm.forward_ready(dlcheck, model, vlm.image_batches(sample))
    projector = None
    found = common.maybe_towers(dlcheck, model)
    if found is not None and "projector" in found.paths:
        projector = model.get_submodule(found.paths["projector"][0])
    pairs = vlm.baseline(dlcheck, model, sample, projector, image_id)
    batches = [b for b, _ in pairs]
    base = [f for _, f in pairs]
    for f in base:
        if f.error is not None:
            if vlm.is_feature_mismatch(f.error):
                dlcheck.skip(f"the model cannot run on the sampled batches ({vlm.error_text(f.error)}); see X2 and X4")
            raise f.error

    changes: dict[str, list[torch.Tensor]] = {"another example's image": [], "noise": []}
    projected_same = []
    n_positions = 0
    for f, batch in zip(base, batches):
        positions = vlm.text_after_image(batch, image_id)
        if not bool(positions.any()):
            continue
        n_positions += int(positions.sum())
        for label, pv in (
            ("another example's image", _other_images(batch)),
            ("noise", _noise_like(batch["pixel_values"])),
        ):
            if pv is None:
                continue
            other = vlm.run_forward(model, batch, projector, positions=positions, pixel_values=pv)
            if other.error is not None:
                raise other.error
            changes[label].append(vlm.relative_change(f.logits, other.logits))
            if f.projected is not None and other.projected is not None and f.projected.shape == other.projected.shape:
                projected_same.append(float((f.projected - other.projected).abs().max()))
    if n_positions == 0:
        dlcheck.skip(f"no text follows the {name} placeholders in the sampled batches (truncated? see X4)")
    means = {k: float(torch.cat(v).mean()) for k, v in changes.items() if v}
    best = max(means.values())
    threshold = dlcheck.setting("min_change")
    if best >= threshold:
        moved = "; ".join(f"{v:.2g} with {k}" for k, v in means.items())
        dlcheck.measured(
            f"the logits at {n_positions} text positions after the image move by {moved} (mean ‖Δ logits‖ / "
            f"‖logits‖; at least {threshold:g} expected)",
            f"{len(batches)} sampled batch(es) from {sample.source}, each run as is, with each example's image "
            "replaced by another example's, and by noise of the same per-channel statistics",
            positions=n_positions,
            change={k: round(v, 4) for k, v in means.items()},
            min_change=threshold,
        )
        return

    batch = batches[0]
    ids = torch.as_tensor(batch["input_ids"])
    mask = torch.as_tensor(batch["attention_mask"]) if batch.get("attention_mask") is not None else None
    moved = "; ".join(f"{v:.2g} with {k}" for k, v in means.items())
    evidence = [
        f"the logits at {n_positions} text positions after the image move by {moved} (mean ‖Δ logits‖ / "
        f"‖logits‖; at least {threshold:g} expected)",
        f"example 0: {vlm.show_ids(text_tok, _real(ids[0], mask[0] if mask is not None else None), image_id)}",
    ]
    masked = int(((ids == image_id) & (mask == 0)).sum()) if mask is not None else 0
    spreads = [
        float(torch.as_tensor(b["pixel_values"]).float().flatten(1).std(dim=1).max())
        for b in batches
        if b.get("pixel_values") is not None and torch.as_tensor(b["pixel_values"]).dim() >= 2
    ]
    if spreads and max(spreads) < CONSTANT_STD:
        pv = torch.as_tensor(batches[0]["pixel_values"]).float()
        evidence.append(
            f"the images are (nearly) constant: the largest per-image std of pixel_values is {max(spreads):.2g} "
            f"(values {float(pv.min()):.4g} to {float(pv.max()):.4g}); a normalised photo has a std near 1"
        )
        cause = (
            "your images are constant: there is nothing in them to change the prediction — pixels rescaled twice "
            "(images already in [0, 1] given to a processor that divides by 255 again, then normalised), or blank "
            "images loaded"
        )
        fix = (
            "give the processor the images as loaded (PIL or uint8 0-255), or do_rescale=False when they are already "
            "in [0, 1]; look at a few decoded pixel_values"
        )
    elif masked:
        cause = f"{masked} {name} placeholders have attention_mask 0: the text cannot attend to the image features"
        fix = "set attention_mask 1 on the image placeholders (the processor's attention_mask does)"
    elif base[0].projected is not None and float(base[0].projected.abs().max()) == 0:
        cause = (
            "the projector outputs zeros for every image: its weights are zero or were never loaded, so the language "
            "model receives the same all-zero image tokens whatever the image"
        )
        fix = (
            "load the projector's weights with load_state_dict(..., strict=True) (a renamed prefix such as "
            "mm_projector.* loads nothing under strict=False) or keep transformers' initialisation; do not zero-initialise it"
        )
    elif projected_same and max(projected_same) == 0:
        cause = (
            "the projector's output is the same for every image: it ignores its input (zero weights with a bias, or "
            "a vision tower whose features are constant)"
        )
        fix = "load or re-initialise the projector and the vision tower weights; check load_state_dict's missing_keys"
    else:
        cause = (
            "the image features reach the language model but do not change its predictions: the image path is cut "
            "somewhere (vision features detached/zeroed in a custom forward, or a model collapsed to the text prior)"
        )
        fix = "check the custom forward between vision tower, projector and LM; retrain stage 1 (projector alignment)"
    dlcheck.fail(evidence, cause, fix)
