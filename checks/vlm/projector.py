from __future__ import annotations

from typing import Any

import torch

from ...errors import MISSING
from ...registry import Setting, check
from ...sampling import get_sample
from ..shared import lm
from . import common
from . import measure as vlm


def _has_data(dlcheck: Any) -> bool:
    return dlcheck.has("dataloader") or (dlcheck.has("collator") and dlcheck.has("dataset"))


def _last_linear(module: Any) -> Any:
    last = None
    for m in module.modules():
        if isinstance(m, torch.nn.Linear):
            last = m
    return last


def _embedding(model: Any) -> tuple[str, Any] | None:
    try:
        emb = model.get_input_embeddings()
    except Exception:
        return None
    if emb is None:
        return None
    name = next((n for n, m in model.named_modules() if m is emb), "get_input_embeddings()")
    return name, emb


@check(
    "X2",
    domain="vlm",
    title="projector misfit",
    optional_roles=("model", "dataloader", "tokenizer", "towers"),
    settings=(
        Setting(
            "max_scale_ratio",
            40.0,
            "the projected image tokens' mean norm may differ from the text token embeddings' mean norm by up to "
            "this factor either way. Measured on tiny Llavas (CLIP tower, 2-layer Llama, 5 seeds, LM width 64/256/"
            "1024): transformers' initialisation 0.52-0.62x / 1.0-1.15x / 1.9-2.2x; a hand-written nn.Linear "
            "projector with PyTorch's default init (LLaVA's own builder) 10.5-13.6x at every width; the same "
            "projector with a stray sqrt(hidden) factor on its output 86-109x / 169-202x / 358-406x, and "
            "transformers' projector with it 4.1-4.9x / 16-18x / 62-70x; un-normalised 0-255 pixels change "
            "nothing (CLIP's pre-layernorm absorbs them). 40 keeps ~3x of headroom over the widest legitimate "
            "ratio measured (13.6x) and fails every sqrt(hidden) bug on a default-init projector, and the one on "
            "transformers' projector from an LM width of ~1024 up; the former 100 let the 64-wide 86-100x cases pass",
        ),
    ),
)
def check_projector(dlcheck):
    """The projector's output dim equals the LM hidden size and its scale is comparable to the token embeddings.

    What it does
        Runs one sampled batch through the model (eval mode, no grad) with a hook on the projector
        (found on Llava-family models, or ``dlcheck_towers['projector']``) and compares the width
        of the image tokens it makes with the language model's embedding width, then their mean norm,
        as the language model receives them (after any rescaling past the projector), with that of
        the batch's text token embeddings. Without data, compares the projector's last
        ``nn.Linear.out_features`` with the embedding width.
    Why it is bad
        A projector built for another LM size (a hard-coded 4096 for a 5120-wide LM, a connector
        kept when the LM was swapped) cannot be scattered into the text embeddings: transformers
        raises "Image features and image tokens do not match, tokens: 64, features: 3072", which
        reads like truncation (X4) and sends people hunting in the data. A projector whose output is
        orders of magnitude off the embedding scale (unscaled features, a broken checkpoint) makes the
        image tokens drown the text or vanish in it.
    Example
        model.model.multi_modal_projector = nn.Sequential(nn.Linear(vision_dim, 4096), nn.GELU(),
                                                          nn.Linear(4096, 4096))   # LM hidden size is 5120
    Use instead
        hidden = model.config.text_config.hidden_size
        nn.Sequential(nn.Linear(vision_dim, hidden), nn.GELU(), nn.Linear(hidden, hidden)),
        or transformers' own LlavaMultiModalProjector(model.config).
    Known problems
        The scale bound (40x either way) is measured, not derived: on tiny Llavas a legitimate projector
        gives 0.5-2.2x (transformers' init) or 10.5-13.6x (PyTorch's default nn.Linear init, LLaVA's
        builder) at LM widths 64-1024, while a stray sqrt(hidden) factor on the projector output gives
        86-406x on the default-init projector and 4.1-70x on transformers' (it grows with the width:
        about sqrt(hidden) times the clean ratio). A stray factor on a small-scale projector in a narrow
        LM (4-18x at widths 64-256) stays inside the bound, indistinguishable by scale from a default-
        init projector. Trained LLaVA projectors output tokens several times the norm of the text
        embeddings; trained checkpoints were not measured here (offline), so a trained model far
        above 40x should raise the bound (--dlcheck-set X2.max_scale_ratio=...). The norm is taken at
        the projector's output: a model that rescales image features after the projector (PaliGemma
        divides them by sqrt(hidden)) is judged on the image tokens the language model receives. A zero projector output (zeroed or never-loaded weights) fails the
        lower bound here and X5. Models whose projector output is not the LM input (cross-attention
        VLMs) are out of scope: declare no projector tower.
    Not applicable
        Models without a vision tower (text-only language models such as GPT-2 or Llama, torchvision or timm
        image models, diffusion denoisers), and VLMs without a projector tower (cross-attention VLMs,
        declared without one in dlcheck_towers). Pipelines with neither text nor images (no processor, batches without token ids or images: a graph
        network's node features, tabular rows).
    """
    model = dlcheck.role("model")
    common.require_vlm(dlcheck, model)
    dlcheck.require("model")
    found = common.towers(dlcheck, model)
    if "projector" not in found.paths:
        dlcheck.not_applicable(
            f"dlcheck_towers declares no projector ({', '.join(found.names)}): X2 judges a projector whose output "
            "takes the place of token embeddings"
        )
    path, projector = common.projector_module(model, found)
    embedding = _embedding(model)
    if embedding is None:
        dlcheck.skip(f"{type(model).__name__} has no get_input_embeddings(): the LM hidden size is unknown")
    emb_name, emb = embedding
    hidden = int(emb.weight.shape[-1])
    tok = dlcheck.role("tokenizer")
    image_id = vlm.model_image_token_id(model)
    if image_id is None and tok is not MISSING:
        image_id = vlm.image_token_id(tok, model)

    forward = None
    batch = None
    if _has_data(dlcheck):
        sample = get_sample(dlcheck)
        lm.forward_ready(dlcheck, model, sample.batches)
        pairs = [
            (b, f) for b, f in vlm.baseline(dlcheck, model, sample, projector, image_id) if f.projected is not None
        ]
        if pairs:
            batch, forward = pairs[0]
    if forward is not None:
        out_dim = int(forward.projected.shape[-1])
        shape_text = f"the projector model.{path} outputs image tokens of width {out_dim} (on a sampled batch)"
    else:
        last = _last_linear(projector)
        if last is None:
            if not _has_data(dlcheck):
                dlcheck.skip(
                    f"missing role: define fixture dlcheck_dataloader in conftest.py: model.{path} has no nn.Linear "
                    "whose out_features give its width"
                )
            dlcheck.skip(f"no sampled batch with pixel_values and no nn.Linear in model.{path}: X2 cannot decide")
        out_dim = int(last.out_features)
        shape_text = f"the projector model.{path} ends in {last} (out_features={out_dim})"
    emb_text = (
        f"the language model's token embeddings model.{emb_name} are {type(emb).__name__}{tuple(emb.weight.shape)}"
    )

    if out_dim != hidden:
        evidence = [f"{shape_text}; {emb_text}: hidden size {hidden}"]
        if forward is not None and forward.error is not None:
            evidence.append(f"the forward pass raises {vlm.error_text(forward.error)}")
        cfg_hidden = getattr(getattr(getattr(model, "config", None), "text_config", None), "hidden_size", None)
        dlcheck.fail(
            evidence,
            f"the projector was built for a language model of width {out_dim}, not this one's {hidden}: its image tokens "
            f"cannot take the place of {hidden}-wide token embeddings"
            + (
                " (transformers reports it as an image token/feature count mismatch, which reads like truncation)"
                if forward is not None and vlm.is_feature_mismatch(forward.error)
                else ""
            ),
            f"build the projector's last layer with out_features={hidden}"
            + (f" (model.config.text_config.hidden_size = {cfg_hidden})" if cfg_hidden else "")
            + ", e.g. transformers' LlavaMultiModalProjector(model.config), or re-create it when you swap the LM",
        )
    width_line = f"{shape_text}; {emb_text}: hidden size {hidden}, equal"
    if forward is None:
        dlcheck.measured(
            f"projector output width {out_dim} = the LM's hidden size {hidden}",
            width_line,
            "the scale was not compared: "
            + ("no sampled batch with pixel_values" if _has_data(dlcheck) else "no data (define dlcheck_dataloader)"),
            width=out_dim,
            hidden=hidden,
        )
        return
    ids = torch.as_tensor(batch["input_ids"])
    mask = (
        torch.as_tensor(batch["attention_mask"]).bool()
        if batch.get("attention_mask") is not None
        else torch.ones_like(ids, dtype=torch.bool)
    )
    if image_id is not None:
        mask &= ids != image_id
    text_ids = ids[mask]
    if text_ids.numel() == 0:
        dlcheck.measured(
            f"projector output width {out_dim} = the LM's hidden size {hidden}",
            width_line,
            "the scale was not compared: the sampled batch has no text token besides the image placeholders",
            width=out_dim,
            hidden=hidden,
        )
        return
    with torch.no_grad():
        text_norm = float(emb.weight.detach()[text_ids.to(emb.weight.device)].float().norm(dim=-1).mean())
    image_rows, where = forward.projected, f"model.{path}"
    lm_in = forward.lm_inputs
    if (
        image_id is not None
        and lm_in is not None
        and lm_in.shape[:2] == ids.shape
        and int((ids == image_id).sum()) == int(forward.projected.shape[0])
    ):
        # the image tokens as the language model receives them: a model that rescales the features after
        # the projector (PaliGemma divides them by sqrt(hidden)) is judged on what reaches the LM
        image_rows = lm_in[ids.to(lm_in.device) == image_id]
        scaled = float(image_rows.norm(dim=-1).mean()) / max(float(forward.projected.norm(dim=-1).mean()), 1e-30)
        if abs(scaled - 1) > 1e-3:
            where = f"model.{path} (×{scaled:.3g} after it, as the language model receives them)"
    image_norm = float(image_rows.norm(dim=-1).mean())
    limit = float(dlcheck.setting("max_scale_ratio"))
    ratio = image_norm / text_norm if text_norm > 0 else float("inf")
    if 1 / limit <= ratio <= limit:
        dlcheck.measured(
            f"projector output width {out_dim} = the LM's hidden size {hidden}; image tokens' mean norm "
            f"{image_norm:.3g} is {ratio:.3g}× the text embeddings' {text_norm:.3g} (allowed 1/{limit:g} to {limit:g}×)",
            width_line,
            f"image tokens from {where}: mean norm {image_norm:.3g} over {image_rows.shape[0]} tokens; "
            f"text token embeddings (model.{emb_name}) of the same batch: mean norm {text_norm:.3g} over "
            f"{text_ids.numel()} tokens",
            width=out_dim,
            hidden=hidden,
            image_norm=round(image_norm, 4),
            text_norm=round(text_norm, 4),
            ratio=round(ratio, 4),
        )
        return
    evidence = [
        f"image tokens from {where}: mean norm {image_norm:.3g} over {image_rows.shape[0]} tokens; "
        f"text token embeddings (model.{emb_name}) of the same batch: mean norm {text_norm:.3g}",
        f"ratio {ratio:.3g}× (allowed 1/{limit:g} to {limit:g}×)",
    ]
    if ratio < 1 / limit:
        cause = (
            f"the projector's output is {'zero' if image_norm == 0 else 'vanishingly small'} next to the text: its "
            "weights are zeroed or were never loaded (check load_state_dict's missing_keys), so the image barely "
            "reaches the LM (see X5)"
        )
        fix = (
            f"load or initialise model.{path}'s weights (transformers' init, or the stage-1 checkpoint: "
            "load_state_dict(..., strict=True) reports missing keys)"
        )
    else:
        cause = (
            f"the projector's output is {ratio:.3g}× the scale of the text embeddings: the image tokens dominate "
            "every attention and norm in the LM's first layers"
        )
        fix = (
            f"re-initialise or rescale model.{path} (its last layer's weights), or check the vision features it is fed "
            "(vision_feature_layer, the image normalisation) and the checkpoint it was loaded from"
        )
    dlcheck.fail(evidence, cause, fix)
