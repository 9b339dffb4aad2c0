"""What the vlm checks share: the model's towers, the declared stages and what each stage leaves
trainable (run once per session and reused by X1 and X3)."""

from __future__ import annotations

import inspect
from collections.abc import Mapping
from typing import Any

from ...errors import MISSING, RoleError
from ...sampling import get_sample
from ...session import NOT_APPLICABLE, user_call
from ..shared.diffusers_kind import is_denoiser, is_diffusers, what_it_is
from ..shared.lm import predicts_no_tokens
from . import measure as vlm

SETUP_HINT = (
    "define fixture dlcheck_stage_setup (your (model, stage) -> optimizer set-up, run for every stage) or "
    "dlcheck_stage (the stage dlcheck_model is set up for) in conftest.py"
)


#: roles whose diffusers object marks a diffusion training (the vlm checks do not concern it)
DIFFUSION_MARKERS = ("pipeline", "vae", "noise_scheduler", "unet")
#: roles of the rl domain that mark an RL training
RL_MARKERS = ("algorithm", "env")


def _forward_params(model: Any) -> list[str]:
    try:
        return list(inspect.signature(model.forward).parameters)
    except (TypeError, ValueError, AttributeError):
        return []


def not_vlm(model: Any) -> str | None:
    """Why ``model`` is certainly not a vision-language model (a transformers text-only LM: no vision
    config, no pixel_values in its forward; a torchvision/timm image model; a diffusers denoiser); None
    when it is one, or may be (a custom module whose towers have other names)."""
    import torch

    if not isinstance(model, torch.nn.Module) or vlm.find_towers(model) is not None:
        return None
    name = type(model).__name__
    if is_diffusers(model):
        return f"dlcheck_model is a diffusers {name}, " + (
            "a diffusion denoiser" if is_denoiser(model) else what_it_is(model)
        )
    config = getattr(model, "config", None)
    params = _forward_params(model)
    if config is not None and hasattr(config, "to_dict"):  # a transformers model: its config says what it is
        vision = [
            k
            for k in ("vision_config", "image_token_id", "image_token_index", "mm_vision_tower")
            if getattr(config, k, None) is not None
        ]
        if vision or any(p in params for p in ("pixel_values", "images", "image")):
            no_tokens = predicts_no_tokens(model)
            if no_tokens is not None:
                # a CLIP-style dual encoder: a vision tower beside a text encoder, no language model that reads the
                # image features through a projector
                return (
                    f"{no_tokens}: a vision tower beside a text encoder (a dual encoder), with no language model "
                    "reading image features, so no projector, image tokens or language-model tower to judge"
                )
            return None
        if "input_ids" in params:
            return (
                f"{name} is a text-only model: its config has no vision_config and its forward takes no pixel_values, "
                "so it has no vision tower, projector or image tokens"
            )
        return f"{name} takes no input_ids: not a vision-language model"
    library = type(model).__module__.split(".")[0]
    if library in ("torchvision", "timm"):
        return f"dlcheck_model is a {library} {name}, an image model without a language model"
    return None


def _images_in(batch: Any) -> bool:
    import torch

    return any(
        k in ("pixel_values", "images", "image")
        or (isinstance(v, torch.Tensor) and v.dim() >= 4 and v.is_floating_point())
        for k, v in batch.items()
    )


def _data_without_images(ctx: Any) -> str | None:
    """Why the sampled batches show a text-only pipeline (token batches without any image), an image-only one
    (images without token ids), or neither text nor images (a graph's node features, tabular rows), else None;
    the data is read only when it is there (a dataloader, or a collator with a dataset)."""
    import pytest

    if not (ctx.has("dataloader") or (ctx.has("collator") and ctx.has("dataset"))):
        return None
    try:
        sample = get_sample(ctx)
    except RoleError:
        return None  # the user's data raises: the checks that read it report it
    except pytest.skip.Exception as exc:
        if str(exc.msg).startswith(NOT_APPLICABLE):
            raise  # batches that are no token batches at all (tuples of tensors): not a vision-language pipeline
        return None
    neither = _neither_text_nor_images(ctx, sample.batches)
    if neither is not None:
        from ...training import describe_batch

        return (
            f"the sampled batches ({sample.source}) carry neither token ids nor images, and no processor is given: "
            f"{neither} ({describe_batch(sample.batches[0])}): no text for image features to join and no image for "
            "a vision tower, not a vision-language pipeline"
        )
    batches = [b for b in sample.batches if isinstance(b, Mapping)]
    if batches and all(_images_in(b) for b in batches) and not any("input_ids" in b for b in batches):
        keys = ", ".join(sorted(map(str, batches[0])))
        return f"the batches of {sample.source} carry images and no token ids (keys: {keys}): an image-only pipeline"
    if not batches or any(_images_in(b) for b in batches) or not all("input_ids" in b for b in batches):
        return None
    keys = ", ".join(sorted(map(str, batches[0])))
    return f"the batches of {sample.source} carry token ids and no image (keys: {keys}): a text-only pipeline"


def _neither_text_nor_images(ctx: Any, batches: list[Any]) -> str | None:
    """What the batches are when every field of every batch is a tensor that is neither token ids (an integer
    tensor of 2 or more dimensions, a field named input_ids) nor an image (a float tensor of 4 or more
    dimensions, a field named like pixel_values), and no tokenizer or processor is given: a graph's node
    features, tabular rows, 1-d signals. None when any field could be text or an image (strings, PIL images,
    lists of them), or a processor is given."""
    import torch

    if not batches or ctx.has("tokenizer"):
        return None
    for batch in batches:
        if isinstance(batch, Mapping):
            fields = list(batch.items())
        elif isinstance(batch, (list, tuple)):
            fields = list(enumerate(batch))
        else:
            fields = [("", batch)]
        if not fields:
            return None
        for key, value in fields:
            if not isinstance(value, torch.Tensor):
                return None  # strings, PIL images, nested structures: they may be the text or the images
            if str(key) in ("input_ids", "pixel_values", "images", "image", "pixel_values_videos"):
                return None
            if value.is_floating_point() and value.dim() >= 4:
                return None
            if (
                not value.is_floating_point()
                and not value.is_complex()
                and value.dtype != torch.bool
                and value.dim() >= 2
            ):
                return None
    return "their tensors are float features of fewer than 4 dimensions and 1-d integer fields"


def not_a_vlm_project(ctx: Any, model: Any = MISSING) -> str | None:
    """Why the project is not a vision-language training (a text-only or image-only dlcheck_model, a
    diffusion or RL training, token batches without images), else None."""
    import torch

    if isinstance(model, torch.nn.Module) and vlm.find_towers(model) is not None:
        return None
    if model is not MISSING:
        reason = not_vlm(model)
        if reason is not None:
            return reason
    for name in DIFFUSION_MARKERS:
        try:
            obj = ctx.role(name)
        except RoleError:
            continue
        if obj is not MISSING and is_diffusers(obj) and (name != "unet" or is_denoiser(obj)):
            return f"dlcheck_{name} is a diffusers {type(obj).__name__}: a diffusion training"
    for name in RL_MARKERS:
        try:
            obj = ctx.role(name)
        except RoleError:
            continue
        if obj is not MISSING and obj is not None:
            return f"dlcheck_{name} is a {type(obj).__name__}: an RL training, with no vision-language model"
    return _data_without_images(ctx)


def require_vlm(ctx: Any, model: Any = MISSING) -> None:
    """Not applicable when the project is certainly not a vision-language training (unless the user
    declares one: dlcheck_towers or dlcheck_stages)."""
    if ctx.has("towers") or ctx.has("stages"):
        return
    reason = not_a_vlm_project(ctx, model)
    if reason is not None:
        ctx.not_applicable(reason)


def towers(ctx: Any, model: Any) -> vlm.Towers:
    value = ctx.role("towers")
    if value is MISSING:
        require_vlm(ctx, model)
        ctx.skip(
            "missing role: define fixture dlcheck_towers ({'vision': ..., 'projector': ..., 'language_model': "
            f"[...]}}, module paths) in conftest.py: the towers of {type(model).__name__} were not found by name"
        )
    if isinstance(value, vlm.Towers):
        return value
    return ctx.memo((model, value), "vlm:declared_towers", lambda: vlm.declared_towers(model, value))


def maybe_towers(ctx: Any, model: Any) -> vlm.Towers | None:
    value = ctx.role("towers")
    if value is MISSING:
        return None
    if isinstance(value, vlm.Towers):
        return value
    return ctx.memo((model, value), "vlm:declared_towers", lambda: vlm.declared_towers(model, value))


def towers_for(model: Any, found: vlm.Towers, raw: Any) -> Any:
    """Towers on the model a stage set-up returns (a PEFT wrapper, a fresh copy): the same object keeps
    its towers; another is searched by name, declared paths matched as suffixes."""

    def resolve(target: Any) -> vlm.Towers:
        if target is model:
            return found
        if isinstance(raw, vlm.Towers) or raw is MISSING:
            auto = vlm.find_towers(target)
            if auto is None:
                raise RoleError(
                    "stage_setup",
                    f"returned a {type(target).__name__} whose vision tower, projector and "
                    "language model are not found by name; define dlcheck_towers",
                )
            return auto
        names = [n for n, _ in target.named_modules()]
        paths = {}
        for tower, items in found.paths.items():
            hits = [n for p in items for n in names if n == p or n.endswith("." + p)]
            if not hits:
                raise RoleError(
                    "stage_setup",
                    f"returned a {type(target).__name__} without the {tower} modules {items} of dlcheck_towers",
                )
            paths[tower] = hits
        return vlm.Towers(paths, found.source)

    return resolve


def stages(ctx: Any, found: vlm.Towers) -> list[vlm.Stage]:
    raw = ctx.role("stages")
    return ctx.memo((raw,), f"vlm:stages:{','.join(found.names)}", lambda: vlm.parse_stages(raw, found.names))


def _capture(make: Any) -> Any:
    try:
        return make()
    except Exception as exc:  # noqa: BLE001 - re-raised for each check that asks
        return exc


def stage_states(
    ctx: Any, model: Any, found: vlm.Towers, declared: list[vlm.Stage]
) -> tuple[list[vlm.StageState], str]:
    """What every declared stage leaves trainable (dlcheck_stage_setup), or the one stage the model is
    in now (dlcheck_stage). Returns the states and a phrase saying how they were measured."""
    names = [s.name for s in declared]
    setup = ctx.role("stage_setup")
    if setup is not MISSING:
        if not callable(setup):
            raise RoleError(
                "stage_setup", f"expected a callable (model, stage) -> optimizer, got {type(setup).__name__}"
            )
        resolve = towers_for(model, found, ctx.role("towers"))
        result = ctx.memo(
            (model, setup),
            f"vlm:stage_states:{','.join(names)}",
            lambda: _capture(lambda: [vlm.apply_stage(model, setup, n, resolve) for n in names]),
        )
        if isinstance(result, BaseException):
            raise result
        current = ctx.role("stage")
        optimizer = ctx.role("optimizer")
        if optimizer is not MISSING and current in names:
            for state in result:
                if state.name == current and state.optimizer is None:
                    state.optimizer = optimizer
        return result, "dlcheck_stage_setup run on dlcheck_model for each stage"
    current = ctx.role("stage")
    if current is MISSING:
        ctx.skip(f"missing role: {SETUP_HINT}: which stage is dlcheck_model set up for?")
    if current not in names:
        raise RoleError("stage", f"{current!r} is not a stage of dlcheck_stages ({', '.join(map(repr, names))})")
    state = vlm.count(model, found, current)
    optimizer = ctx.role("optimizer")
    how = f"dlcheck_model as set up for stage {current!r}"
    if optimizer is MISSING:
        optimizer = trainer_optimizer(ctx, model)
        if optimizer is not None:
            how += " (the optimizer the Trainer's create_optimizer builds, made on a copy of the Trainer)"
    state.optimizer = None if optimizer is MISSING else optimizer
    return [state], how


def trainer_optimizer(ctx: Any, model: Any) -> Any:
    """The optimizer a transformers Trainer that has not built one yet would create, built by
    ``create_optimizer`` on a shallow copy of it (the user's Trainer keeps ``optimizer=None``); the param
    groups hold the model's own parameters, and nothing steps it. None without such a Trainer."""
    import copy

    trainer = ctx.role("trainer")
    if (
        trainer is MISSING
        or getattr(trainer, "optimizer", None) is not None
        or not hasattr(trainer, "create_optimizer")
    ):
        return None
    if getattr(trainer, "model", None) is not model:
        return None
    clone = copy.copy(trainer)
    clone.optimizer = None
    return user_call("trainer", clone.create_optimizer)


def stage_named(declared: list[vlm.Stage], name: str) -> vlm.Stage:
    return next(s for s in declared if s.name == name)


def params_expression(found: vlm.Towers, tower: str) -> str:
    paths = found.paths[tower]
    if len(paths) == 1:
        return f"model.{paths[0]}.parameters()"
    return "[" + ", ".join(f"*model.{p}.parameters()" for p in paths) + "]"


def projector_module(model: Any, found: vlm.Towers) -> tuple[str, Any]:
    path = found.paths["projector"][0]
    return path, model.get_submodule(path)
