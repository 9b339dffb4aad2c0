"""Shared measurement for vision-language (LLaVA-style) checks: the towers of a model (vision encoder,
projector, language model) found on transformers' Llava-family classes or by declared module names;
the declared training stages; trainable-parameter counts and optimizer learning rates per tower and
stage; image placeholder tokens; one forward pass per sampled batch shared by the checks that need it.

Imported only when a vlm check runs; torch is imported at the top (fine for a check-side module),
transformers never."""

from __future__ import annotations

import contextlib
import math
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch

from ...errors import MISSING, RoleError
from ...guard import eval_mode, preserved_tokenizer
from ...session import user_call
from ..shared.lm import forward_names, model_device, token_text

# the towers of a multimodal model are shared with T3; the vlm checks read them through this module
from ..shared.multimodal import (  # noqa: F401
    ALIASES,
    AUTO_NAMES,
    DISPLAY,
    PROJECTOR_PARAMS,
    TOWERS,
    Towers,
    find_towers,
    tower_of,
)


def fmt_int(n: int) -> str:
    return f"{n:,}"


def fmt_lr(lr: float | None) -> str:
    return "-" if lr is None else f"{lr:.0e}" if lr == float(f"{lr:.0e}") else f"{lr:.3g}"


def declared_towers(model: Any, value: Any) -> Towers:
    """``dlcheck_towers``: {tower: module path or list of paths}; paths are checked to exist."""
    if not isinstance(value, Mapping) or not value:
        raise RoleError(
            "towers",
            f"expected a dict {{tower: module path(s)}}, e.g. {{'vision': 'encoder', 'projector': "
            f"'proj', 'language_model': ['decoder', 'lm_head']}}, got {type(value).__name__}",
        )
    paths: dict[str, list[str]] = {}
    for tower, spec in value.items():
        name = ALIASES.get(str(tower), str(tower))
        items = [spec] if isinstance(spec, str) else list(spec)
        for p in items:
            try:
                model.get_submodule(p)
            except AttributeError:
                try:
                    model.get_parameter(p)
                except AttributeError:
                    raise RoleError(
                        "towers", f"tower {tower!r}: the model has no submodule or parameter {p!r}"
                    ) from None
        paths[name] = items
    return Towers(paths, "declared by dlcheck_towers")


@dataclass
class TowerCount:
    trainable: int = 0
    total: int = 0
    #: per declared module path: [trainable, total]
    by_path: dict[str, list[int]] = field(default_factory=dict)
    #: names of a few trainable parameters (for evidence)
    trainable_names: list[str] = field(default_factory=list)


@dataclass
class StageState:
    """What a stage set up: trainable counts per tower, the trainable parameters of each tower (for
    optimizer look-ups) and the optimizer it returned, if any."""

    name: str
    counts: dict[str, TowerCount]
    trainable: dict[str, list[tuple[str, Any]]]
    optimizer: Any = None
    model: Any = None


def count(model: Any, towers: Towers, name: str = "") -> StageState:
    counts = {t: TowerCount() for t in list(towers.paths) + ["other"]}
    trainable: dict[str, list[tuple[str, Any]]] = {t: [] for t in counts}
    for pname, param in model.named_parameters():
        hit = tower_of(pname, towers)
        tower, path = hit if hit else ("other", "")
        c = counts[tower]
        n = param.numel()
        c.total += n
        slot = c.by_path.setdefault(path, [0, 0])
        slot[1] += n
        if param.requires_grad:
            c.trainable += n
            slot[0] += n
            trainable[tower].append((pname, param))
            if len(c.trainable_names) < 3:
                c.trainable_names.append(pname)
    return StageState(name, counts, trainable, model=model)


@contextlib.contextmanager
def preserved_training_state(model: Any) -> Iterator[Any]:
    """Put back every parameter's requires_grad and every module's train/eval flag (a stage set-up
    freezes and unfreezes towers of the user's model)."""
    grads = [(p, p.requires_grad) for p in model.parameters()]
    modes = [(m, m.training) for m in model.modules()]
    try:
        yield model
    finally:
        for p, flag in grads:
            if p.requires_grad != flag:
                p.requires_grad_(flag)
        for m, training in modes:
            m.training = training


def is_optimizer(obj: Any) -> bool:
    return isinstance(obj, torch.optim.Optimizer) or (hasattr(obj, "param_groups") and hasattr(obj, "step"))


def apply_stage(model: Any, setup: Callable[..., Any], stage: str, towers_for: Callable[[Any], Towers]) -> StageState:
    """Run the user's stage set-up on the model, count what it left trainable, put the model back.
    The set-up may return None, an optimizer, a model (a new or wrapped one) or (model, optimizer)."""
    before = [id(p) for p in model.parameters()]
    with preserved_training_state(model):
        out = user_call("stage_setup", lambda: setup(model, stage))
        if [id(p) for p in model.parameters()] != before:
            raise RoleError(
                "stage_setup",
                f"stage {stage!r} replaced or added modules of dlcheck_model (a PEFT wrapper "
                "injects its layers in place), which cannot be put back: wrap a copy inside "
                "the set-up (get_peft_model(copy.deepcopy(model), config)) and return it",
            )
        target, optimizer = model, None
        items = out if isinstance(out, (tuple, list)) else [out]
        for item in items:
            if item is None:
                continue
            if is_optimizer(item):
                optimizer = item
            elif isinstance(item, torch.nn.Module):
                target = item
            else:
                raise RoleError(
                    "stage_setup",
                    f"stage {stage!r} returned a {type(item).__name__}; return None, the "
                    "optimizer, the model, or (model, optimizer)",
                )
        with preserved_training_state(target) if target is not model else contextlib.nullcontext():
            state = count(target, towers_for(target), stage)
    state.optimizer = optimizer
    return state


# --------------------------------------------------------------------------------------------------
# the stage declaration


@dataclass
class Stage:
    name: str
    #: towers trained in this stage -> declared learning rate (None: not declared)
    lrs: dict[str, float | None]

    def trained(self, tower: str) -> bool:
        return tower in self.lrs


STAGES_FORM = (
    "write dlcheck_stages as {stage: {tower: lr}} (or {stage: [towers]}), towers among vision, projector, "
    "language_model, e.g. {'align': {'projector': 1e-3}, 'instruct': {'projector': 2e-5, "
    "'language_model': 2e-5}}"
)


def parse_stages(value: Any, tower_names: Sequence[str] = TOWERS) -> list[Stage]:
    """The declaration a person writes, in declared order: a tower not listed is frozen in that stage."""
    if not isinstance(value, Mapping) or not value:
        raise RoleError("stages", f"got {type(value).__name__}: {STAGES_FORM}")
    stages = []
    for name, spec in value.items():
        if isinstance(spec, str):
            spec = [spec]
        if isinstance(spec, Mapping):
            items = list(spec.items())
        elif isinstance(spec, (list, tuple, set, frozenset)):
            items = [(t, None) for t in spec]
        else:
            raise RoleError("stages", f"stage {name!r} is a {type(spec).__name__}: {STAGES_FORM}")
        lrs: dict[str, float | None] = {}
        for tower, lr in items:
            key = ALIASES.get(str(tower), str(tower)) if str(tower) not in tower_names else str(tower)
            if key not in tower_names:
                raise RoleError("stages", f"stage {name!r}: unknown tower {tower!r} (towers: {', '.join(tower_names)})")
            if lr is not None:
                if isinstance(lr, bool) or not isinstance(lr, (int, float)) or not lr > 0:
                    raise RoleError(
                        "stages",
                        f"stage {name!r}, tower {tower!r}: the learning rate must be a positive "
                        f"number or None, got {lr!r}",
                    )
                lr = float(lr)
            lrs[key] = lr
        stages.append(Stage(str(name), lrs))
    return stages


# --------------------------------------------------------------------------------------------------
# optimizers


def param_lrs(optimizer: Any) -> dict[int, list[float]]:
    """id(param) -> the learning rates of the groups that hold it (the scheduler's ``initial_lr`` when a
    scheduler has rewritten ``lr``; warm-up starts it at 0)."""
    out: dict[int, list[float]] = {}
    for group in optimizer.param_groups:
        lr = group.get("initial_lr", group.get("lr"))
        for p in group["params"]:
            out.setdefault(id(p), []).append(float(lr) if lr is not None else float("nan"))
    return out


def same_lr(a: float, b: float, rtol: float) -> bool:
    return math.isclose(a, b, rel_tol=rtol, abs_tol=0.0)


# --------------------------------------------------------------------------------------------------
# image tokens


def config_of(model: Any) -> Any:
    return getattr(model, "config", None) if model is not MISSING and model is not None else None


def image_token_id(processor: Any, model: Any = None) -> int | None:
    """The image placeholder id: the processor's, else the tokenizer's id of its image token, else the
    model config's ``image_token_id`` / ``image_token_index``."""
    value = getattr(processor, "image_token_id", None)
    if isinstance(value, int):
        return value
    token = getattr(processor, "image_token", None)
    tok = getattr(processor, "tokenizer", processor)
    if isinstance(token, str) and hasattr(tok, "convert_tokens_to_ids"):
        value = tok.convert_tokens_to_ids(token)
        if isinstance(value, int) and value != getattr(tok, "unk_token_id", None):
            return value
    return model_image_token_id(model)


def model_image_token_id(model: Any) -> int | None:
    cfg = config_of(model)
    for attr in ("image_token_id", "image_token_index"):
        value = getattr(cfg, attr, None)
        if isinstance(value, int):
            return value
    return None


def image_token_text(processor: Any) -> str | None:
    token = getattr(processor, "image_token", None)
    return token if isinstance(token, str) else None


def dummy_image(size: tuple[int, int], seed: int = 0) -> Any:
    """A plain RGB test image (PIL when available, else an HWC uint8 array)."""
    import numpy as np

    h, w = size
    arr = (np.random.default_rng(seed).integers(0, 255, (h, w, 3))).astype("uint8")
    try:
        from PIL import Image

        return Image.fromarray(arr)
    except ImportError:  # pragma: no cover - PIL ships with torchvision/transformers' vision extras
        return arr


def processor_image_size(processor: Any, model: Any = None) -> tuple[int, int]:
    ip = getattr(processor, "image_processor", None)
    for attr in ("crop_size", "size"):
        value = getattr(ip, attr, None)
        if isinstance(value, Mapping):
            if "height" in value and "width" in value:
                return int(value["height"]), int(value["width"])
            if "shortest_edge" in value:
                return int(value["shortest_edge"]), int(value["shortest_edge"])
    size = getattr(getattr(config_of(model), "vision_config", None), "image_size", None)
    if isinstance(size, int):
        return size, size
    return 224, 224


def processor_expansion(processor: Any, images: list[Any], token_id: int, made_up: str | bool = False) -> int:
    """How many placeholder tokens the processor writes for these images (one image token each in the
    text), with no truncation: what the example should carry. ``made_up``: the images are the check's own
    (said in words), not the dataset's: the processor raising on them is pytest-dlcheck's error."""
    token = image_token_text(processor)
    tok = getattr(processor, "tokenizer", None)
    with preserved_tokenizer(tok) if tok is not None else contextlib.nullcontext():
        out = user_call(
            "tokenizer",
            lambda: processor(images=images, text=[token * len(images)], return_tensors="pt"),
            synthetic=made_up,
        )
    ids = torch.as_tensor(out["input_ids"])
    return int((ids == token_id).sum())


def config_tokens_per_image(model: Any) -> tuple[int, str] | None:
    """(tokens, how) one image becomes in a Llava-style model: measured by running its vision tower once on a
    blank image of the configured size (``get_image_features``, with the model's own feature layer and select
    strategy: a SigLIP tower has no CLS feature, a CLIP tower has one), else from the config's
    (image_size / patch_size)² patch features plus the CLS feature kept by 'full'. None for other families."""
    cfg = config_of(model)
    vc = getattr(cfg, "vision_config", None)
    strategy = getattr(cfg, "vision_feature_select_strategy", None)
    size, patch = getattr(vc, "image_size", None), getattr(vc, "patch_size", None)
    if not (isinstance(size, int) and isinstance(patch, int) and patch > 0 and strategy in ("default", "full")):
        return None
    if type(model).__name__ not in ("LlavaForConditionalGeneration", "LlavaModel", "VipLlavaForConditionalGeneration"):
        return None
    measured = _features_per_image(model, size)
    if measured is not None:
        return measured, (
            f"its {type(vc).__name__.removesuffix('Config')} vision tower, run once on a {size}x{size} image, emits "
            f"{measured} features with vision_feature_select_strategy={strategy!r}"
        )
    n = (size // patch) ** 2 + (1 if strategy == "full" else 0)
    how = f"vision_config.image_size {size} / patch_size {patch} = {(size // patch) ** 2} patch features" + (
        ", + 1 CLS feature kept by vision_feature_select_strategy='full'"
        if strategy == "full"
        else ", the CLS feature dropped by vision_feature_select_strategy='default'"
    )
    return n, how


def _features_per_image(model: Any, size: int) -> int | None:
    """How many features ``get_image_features`` gives one image of ``size`` pixels, or None."""
    get = getattr(model, "get_image_features", None)
    if not callable(get):
        return None
    try:
        param = next(model.parameters())
        pixels = torch.zeros(1, 3, size, size, dtype=param.dtype, device=param.device)
        with eval_mode(model), torch.no_grad():
            out = get(pixel_values=pixels)
    except Exception:  # noqa: BLE001 - an unusual tower: fall back to the config's arithmetic
        return None
    feats = getattr(out, "pooler_output", out)
    if isinstance(feats, (list, tuple)) and feats and isinstance(feats[0], torch.Tensor):
        feats = feats[0]
    if not isinstance(feats, torch.Tensor) or feats.dim() not in (2, 3):
        return None
    return int(feats.shape[-2]) if feats.dim() == 3 else int(feats.shape[0])


def example_images(row: Any) -> list[Any] | None:
    """The images of one raw example (TRL's ``images`` list or a single ``image``), None if unknown."""
    if not isinstance(row, Mapping):
        return None
    if "images" in row and isinstance(row["images"], (list, tuple)):
        return list(row["images"])
    if "image" in row and row["image"] is not None:
        return [row["image"]]
    return None


def show_ids(tok: Any, ids: Sequence[int], image_id: int | None, limit: int = 140) -> str:
    """The example's text with each run of image placeholders shown once as ``<image>×N``."""
    parts: list[str] = []
    run: list[int] = []
    i = 0
    while i < len(ids):
        if image_id is not None and ids[i] == image_id:
            j = i
            while j < len(ids) and ids[j] == image_id:
                j += 1
            if run:
                parts.append(_decode(tok, run))
                run = []
            parts.append(f"{token_text(tok, image_id)}×{j - i}")
            i = j
            continue
        run.append(int(ids[i]))
        i += 1
    if run:
        parts.append(_decode(tok, run))
    text = "".join(parts)
    if len(text) > limit:
        text = text[: limit // 2 - 2] + " … " + text[-(limit // 2 - 2) :]
    return repr(text)


def _decode(tok: Any, ids: list[int]) -> str:
    try:
        return tok.decode(ids, skip_special_tokens=False)
    except Exception:
        return " ".join(token_text(tok, i) for i in ids)


# --------------------------------------------------------------------------------------------------
# forward passes


#: batch keys a collator adds that are not model inputs
NOT_INPUTS = ("labels", "completion_mask", "assistant_masks")


def forward_kwargs(model: Any, batch: Mapping[str, Any], device: torch.device) -> dict[str, Any]:
    """The batch's model inputs (keys the model's forward names), on the model's device."""
    # through a PEFT wrapper's forward(*args, **kwargs) to the model it hands them to (X5 had dropped the images)
    names = forward_names(model)
    out = {}
    for k, v in batch.items():
        if k in NOT_INPUTS or (names and k not in names):
            continue
        out[k] = v.to(device) if isinstance(v, torch.Tensor) else v
    return out


@dataclass
class Forward:
    """One forward pass of a sampled batch: its logits (float, CPU) or the error the model raised, and
    what the projector output (the image tokens as the LM receives them)."""

    logits: torch.Tensor | None
    error: BaseException | None
    projected: torch.Tensor | None
    #: the language model's input embeddings (B, T, H) as it received them (image features scattered in,
    #: after any rescaling the model applies past the projector), when the language model was found
    lm_inputs: torch.Tensor | None = None


def _logits(out: Any) -> torch.Tensor:
    logits = getattr(out, "logits", None)
    if logits is None and isinstance(out, (tuple, list)) and out:
        logits = out[0]
    if logits is None and isinstance(out, torch.Tensor):
        logits = out
    if not isinstance(logits, torch.Tensor):
        raise RoleError("model", f"returned a {type(out).__name__} without logits")
    return logits


def language_module(model: Any) -> Any:
    """The language model a transformers VLM feeds its merged embeddings to (``model.language_model`` or
    ``model.model.language_model``), or None."""
    for owner in (model, getattr(model, "model", None)):
        try:
            lm = getattr(owner, "language_model", None)
        except Exception:
            lm = None
        if isinstance(lm, torch.nn.Module):
            return lm
    return None


def run_forward(
    model: Any,
    batch: Mapping[str, Any],
    projector: Any = None,
    positions: torch.Tensor | None = None,
    lm_module: Any = None,
    **replace: Any,
) -> Forward:
    """Eval mode, no grad, the model left as it was; ``replace`` overrides batch keys (pixel_values).
    With ``positions`` (a (B, T) mask) only the logits there are kept, (N, V): a 32k vocabulary makes
    whole-batch logits hundreds of MB."""
    device = model_device(model)
    inputs = forward_kwargs(model, {**batch, **replace}, device)
    captured: list[torch.Tensor] = []

    def hook(_module: Any, _args: Any, output: Any) -> None:
        out = output[0] if isinstance(output, (tuple, list)) else output
        if isinstance(out, torch.Tensor):
            captured.append(out.detach().float().cpu())

    lm_inputs: list[torch.Tensor] = []

    def pre_hook(_module: Any, args: Any, kwargs: Any) -> None:
        emb = kwargs.get("inputs_embeds")
        if emb is None and args and isinstance(args[0], torch.Tensor) and args[0].is_floating_point():
            emb = args[0]
        if isinstance(emb, torch.Tensor) and not lm_inputs:
            lm_inputs.append(emb.detach().float().cpu())

    handle = projector.register_forward_hook(hook) if projector is not None else None
    lm_handle = lm_module.register_forward_pre_hook(pre_hook, with_kwargs=True) if lm_module is not None else None
    try:
        with eval_mode(model):
            try:
                made_up = f"a sampled batch with its {', '.join(replace)} replaced by the check's" if replace else False
                out = user_call("model", lambda: model(**inputs), synthetic=made_up)
                logits = _logits(out).detach()
                if positions is not None:
                    logits = logits[positions.to(logits.device)]
                logits = logits.float().cpu()
                error = None
            except RoleError as exc:
                logits, error = None, exc
    finally:
        if handle is not None:
            handle.remove()
        if lm_handle is not None:
            lm_handle.remove()
    return Forward(
        logits,
        error,
        torch.cat([c.reshape(-1, c.shape[-1]) for c in captured]) if captured else None,
        lm_inputs[0] if lm_inputs else None,
    )


def error_text(error: BaseException) -> str:
    """The model's own exception, as a person reads it (not the role wrapper)."""
    inner = error.__cause__ or error
    return f"{type(inner).__name__}: {inner}"


#: what a transformers VLM raises when the image placeholders and the image features disagree (the
#: training checks read it too: training.root_cause)
FEATURE_MISMATCH = ("image tokens do not match", "Image features and image tokens")
#: what TRL's SFTTrainer raises when its max_length cuts the image placeholders
PLACEHOLDERS_TRUNCATED = "causes image placeholder tokens in `input_ids` to be truncated"


def is_feature_mismatch(error: BaseException | None) -> bool:
    text = str(error or "")
    return any(part in text for part in FEATURE_MISMATCH)


def image_batches(sample: Any, limit: int = 2) -> list[Mapping[str, Any]]:
    """The first sampled batches that carry pixel values (the ones the forward checks run)."""
    return [b for b in sample.batches if b.get("pixel_values") is not None][:limit]


def baseline(
    ctx: Any, model: Any, sample: Any, projector: Any, image_id: int | None
) -> list[tuple[Mapping[str, Any], Forward]]:
    """(batch, forward pass) for each of :func:`image_batches`, shared by X2 and X5; the logits are kept
    at :func:`text_after_image` positions only."""
    chosen = image_batches(sample)

    def make() -> list[Forward]:
        return [
            run_forward(
                model,
                b,
                projector,
                positions=text_after_image(b, image_id) if image_id is not None else None,
                lm_module=language_module(model),
            )
            for b in chosen
        ]

    forwards = ctx.memo((model, sample), f"vlm:baseline:{id(projector)}:{image_id}", make)
    return list(zip(chosen, forwards))


def centered(logits: torch.Tensor) -> torch.Tensor:
    return logits - logits.mean(-1, keepdim=True)


def relative_change(base: torch.Tensor, other: torch.Tensor, positions: torch.Tensor | None = None) -> torch.Tensor:
    """Per position: ‖Δ centered logits‖ / ‖centered logits‖ (softmax ignores a constant shift);
    ``positions`` selects from whole-batch logits (not needed for logits already selected)."""
    a, b = centered(base), centered(other)
    change = (b - a).norm(dim=-1) / a.norm(dim=-1).clamp(min=1e-12)
    return change if positions is None else change[positions]


def text_after_image(batch: Mapping[str, Any], image_id: int) -> torch.Tensor:
    """Mask of real, non-image positions at or after a row's first image token (a causal LM sees the
    image only from there)."""
    ids = torch.as_tensor(batch["input_ids"])
    mask = (
        torch.as_tensor(batch["attention_mask"]).bool()
        if batch.get("attention_mask") is not None
        else torch.ones_like(ids, dtype=torch.bool)
    )
    is_image = ids == image_id
    seen = is_image.long().cumsum(-1) > 0
    return mask & seen & ~is_image
