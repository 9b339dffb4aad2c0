"""What multimodal (LLaVA-style) models look like, shared by the vlm checks and the training checks (T3
exempts a vision tower's layers above the feature layer): the three towers of a model found by module
name on transformers' VLM classes."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import torch

#: the three towers of a LLaVA-style model, in the order the evidence shows them
TOWERS = ("vision", "projector", "language_model")

#: how the evidence names each tower
DISPLAY = {"vision": "vision tower", "projector": "projector", "language_model": "language model"}

#: names a person may write in a stage declaration for each tower
ALIASES = {
    "vision": "vision",
    "vision_tower": "vision",
    "vision_encoder": "vision",
    "vision_model": "vision",
    "visual": "vision",
    "image_encoder": "vision",
    "vit": "vision",
    "projector": "projector",
    "multi_modal_projector": "projector",
    "mm_projector": "projector",
    "connector": "projector",
    "adapter": "projector",
    "merger": "projector",
    "language_model": "language_model",
    "language": "language_model",
    "lm": "language_model",
    "llm": "language_model",
    "text_model": "language_model",
    "text": "language_model",
    "decoder": "language_model",
}

#: module names (last path component) that hold each tower on transformers' VLM classes: Llava,
#: LlavaNext, LlavaOnevision, VipLlava, PaliGemma (vision_tower / multi_modal_projector /
#: language_model), Idefics3 / SmolVLM (vision_model / connector / text_model), Qwen2-VL (visual with
#: its merger); lm_head belongs to the language model (in transformers 5 it sits outside it)
AUTO_NAMES = {
    "vision": ("vision_tower", "vision_model", "visual", "vision_encoder", "image_encoder"),
    "projector": ("multi_modal_projector", "mm_projector", "connector", "merger"),
    "language_model": ("language_model", "text_model", "lm_head"),
}

#: parameters held directly by the VLM module that belong to the projector
PROJECTOR_PARAMS = ("image_newline",)


# --------------------------------------------------------------------------------------------------
# towers


@dataclass
class Towers:
    """Module paths (relative to the model) of each tower, and where they were found."""

    paths: dict[str, list[str]]
    source: str

    @property
    def names(self) -> list[str]:
        return list(self.paths)


def _children_with_params(model: Any) -> Iterator[tuple[str, Any]]:
    for name, module in model.named_modules():
        if name and any(True for _ in module.parameters()):
            yield name, module


def find_towers(model: Any) -> Towers | None:
    """The towers of a transformers VLM by module name; None unless all three are found."""
    if not isinstance(model, torch.nn.Module):
        return None
    found: dict[str, list[str]] = {t: [] for t in TOWERS}
    for name, _ in _children_with_params(model):
        last = name.rsplit(".", 1)[-1]
        for tower, names in AUTO_NAMES.items():
            if last in names:
                # the outermost match only (CLIP's vision_model sits inside vision_tower)
                if not any(name.startswith(p + ".") for p in found[tower]):
                    found[tower].append(name)
    if not all(found.values()):
        return None
    for name, _ in model.named_parameters():
        # LLaVA-NeXT's image_newline is trained with the projector
        if name.rsplit(".", 1)[-1] in PROJECTOR_PARAMS and tower_of(name, Towers(found, "")) is None:
            found["projector"].append(name)
    return Towers(found, f"found on {type(model).__name__}")


def tower_of(name: str, towers: Towers) -> tuple[str, str] | None:
    """(tower, path) of a parameter/module name: the longest matching tower path wins (a merger inside
    the visual module is the projector)."""
    best = None
    for tower, paths in towers.paths.items():
        for p in paths:
            if name == p or name.startswith(p + ".") or p == "":
                if best is None or len(p) > len(best[1]):
                    best = (tower, p)
    return best
