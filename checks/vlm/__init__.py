"""Checks of vision-language training (LLaVA-style: a vision tower, a projector, a language model;
staged training) with transformers' Llava family and models declared by module names.

The vlm roles a user may define, besides the core ones (dlcheck_model, dlcheck_tokenizer — the
processor —, dlcheck_collator/dlcheck_dataset/dlcheck_dataloader, dlcheck_optimizer, dlcheck_trainer):

    @pytest.fixture(scope="session")
    def dlcheck_stages():                 # the recipe: a tower not listed is frozen in that stage
        return {"align":    {"projector": 1e-3},
                "instruct": {"projector": 2e-5, "language_model": 2e-5}}

    @pytest.fixture(scope="session")
    def dlcheck_stage_setup():            # your code that sets a stage up: (model, stage) -> optimizer
        return my_training.setup_stage

or, for a model and optimizer already set up for one stage, ``dlcheck_stage`` (its name)."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

import pytest

from ...errors import MISSING
from ...roles import deriver, role
from ...training import explains_failures

role(
    "stages",
    "the training recipe, {stage: {tower: lr}} or {stage: [towers]}, in order; towers: vision, projector, "
    "language_model; a tower not listed is frozen in that stage, e.g. {'align': {'projector': 1e-3}, 'instruct': "
    "{'projector': 2e-5, 'language_model': 2e-5}}",
)
role(
    "stage_setup",
    "callable (model, stage) -> optimizer, None, a model, or (model, optimizer): your code that freezes/"
    "unfreezes the towers for a stage and builds its optimizer; run on the model for every declared stage, "
    "requires_grad and train/eval flags put back afterwards",
)
role(
    "stage",
    "the name of the declared stage that dlcheck_model and dlcheck_optimizer are set up for",
    "the only stage of dlcheck_stages",
)
role(
    "towers",
    "module paths of the towers when they are not found on a transformers Llava-family model: {'vision': "
    "'encoder', 'projector': 'proj', 'language_model': ['decoder', 'lm_head']}",
    "found automatically on transformers' Llava, LlavaNext, PaliGemma, Idefics3, Qwen2-VL… models",
)

Get = Callable[[str], Any]
Cache = Callable[[Any, str, Callable[[], Any]], Any]


def _get(get: Get, name: str) -> Any:
    # a core default fixture resolves other roles by fixture lookup; a domain role has no fixture
    try:
        return get(name)
    except pytest.FixtureLookupError:
        return MISSING


@deriver
def from_vlm_model(name: str, get: Get, cache: Cache) -> Any:
    if name == "towers":
        model = _get(get, "model")
        if model is MISSING:
            return MISSING
        from ..shared.multimodal import find_towers

        found = cache(model, "vlm:towers", lambda: find_towers(model))
        return MISSING if found is None else found
    if name == "stage":
        stages = _get(get, "stages")
        if isinstance(stages, Mapping) and len(stages) == 1:
            return str(next(iter(stages)))
    return MISSING


@explains_failures
def image_tokens_broken(exc: BaseException) -> str | None:
    """Root cause first: a model or trainer that cannot run on the sampled batches because truncation cut
    the image tokens, or the placeholders do not match the image features, is X4's finding — the
    training checks skip naming it instead of repeating the model's error."""
    from .measure import PLACEHOLDERS_TRUNCATED, is_feature_mismatch

    if PLACEHOLDERS_TRUNCATED in str(exc):
        return "the model cannot run on the sampled batches: truncation cuts the image tokens (see X4)"
    if is_feature_mismatch(exc):
        return (
            "the model cannot run on the sampled batches: the image placeholder tokens do not match the image "
            "features (see X4)"
        )
    return None
