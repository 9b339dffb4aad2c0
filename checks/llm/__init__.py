"""Checks of causal-LM data and training (SFT, DPO, GRPO, pretraining)."""

from collections.abc import Mapping

from ...errors import MISSING
from ...registry import applicability, kind_rule
from ...roles import role
from ..shared import lm
from ..shared.diffusers_kind import is_denoiser, is_diffusers, what_it_is
from ..shared.training_users import rl_agent_only, rl_agent_without_text

role(
    "generation_prompts",
    "prompts your pipeline generates from in batches, for L1's generation half: a list of prompt strings "
    "(tokenized with dlcheck_tokenizer as configured, its padding_side included) or the padded batch your code "
    "feeds to generate (a dict/BatchEncoding with input_ids and attention_mask)",
    "a TRL GRPOTrainer/RLOOTrainer as dlcheck_trainer",
)

role(
    "documents",
    "the texts before tokenization and grouping into fixed-size blocks (run_clm-style pretraining): a "
    "datasets.Dataset or list of {'text': ...} rows or strings; L11 reads the first 64 to tell separate "
    "documents from one continuous text",
)


@applicability("llm")
def concerns_token_data(ctx) -> str | None:
    """The llm checks do not concern a pipeline with no tokenizer and no Trainer whose training data are
    not token batches (images and labels, rollouts): drawing its sample says so ("not applicable"). Nor a
    reinforcement-learning agent with no supervised training (an SB3 algorithm, a CleanRL loop's env and
    update): asking it for a tokenizer names fixtures that do not describe it."""
    from ...training.runs import is_lightning_trainer

    trainer = ctx.role("trainer")
    hf_trainer = trainer is not MISSING and not is_lightning_trainer(trainer)
    tok = ctx.role("tokenizer")
    # a text tokenizer (or a processor holding one) makes the pipeline a language model's; an image processor (a
    # transformers Trainer's processing_class for ViT/MAE) does not: its batches decide, as without a tokenizer
    if tok is not MISSING and hasattr(lm.text_tokenizer(tok), "convert_ids_to_tokens"):
        return None
    # a transformers / TRL Trainer holds its tokenizer as processing_class; a Lightning Trainer says nothing of text
    if hf_trainer and tok is MISSING:
        return None
    agent = rl_agent_only(ctx, "llm") or rl_agent_without_text(ctx)
    if agent:
        return agent
    if not hf_trainer and ctx.role("dataloader") is MISSING and ctx.role("collator") is MISSING:
        return None  # nothing to look at: the missing role is the honest answer
    from ...sampling import get_sample

    sample = get_sample(ctx)
    if sample.batches and not lm.has_token_batches(sample.batches):
        # image batches (pixel_values and labels), rollouts: no tokenizer would make the llm checks concern them
        keys = sorted(sample.batches[0]) if isinstance(sample.batches[0], Mapping) else []
        return (
            f"batches from {sample.source} carry no input_ids"
            + (f" (keys: {', '.join(map(str, keys))})" if keys else "")
            + (
                f": they are not token batches, and dlcheck_tokenizer is a {type(tok).__name__}, no text tokenizer"
                if tok is not MISSING
                else ": they are not token batches, and the given fixtures hold no tokenizer and no Trainer"
            )
        )
    return None  # token batches: the tokenizer is really missing


@kind_rule("llm")
def not_a_language_model(ctx) -> str | None:
    """A diffusion training whose model is a diffusers denoiser is no language model: its token ids are captions
    for a text encoder, never the model's own inputs (decided from the model's library, not its name)."""
    # a reinforcement-learning agent with no tokenizer and no Trainer (a plain actor-critic loop whose dataloader
    # yields observation tensors): decided before any llm check reads its data as token batches (L4, L5, L7 had
    # blamed its dataloader for not yielding mappings)
    agent = rl_agent_only(ctx, "llm") or rl_agent_without_text(ctx)
    if agent:
        return agent
    for name in ("model", "unet"):
        model = ctx.role(name)
        if model is not MISSING and is_diffusers(model):
            if not is_denoiser(model):
                return (
                    f"dlcheck_{name} is a diffusers {type(model).__name__}, {what_it_is(model)}: no language model "
                    "(the llm checks concern language models)"
                )
            return (
                f"dlcheck_{name} is a diffusers {type(model).__name__}, a denoiser: what conditions it (caption token "
                "ids for a text encoder, image embeddings) is no language model's input (the llm checks concern "
                "language models)"
            )
    # the Trainer's own processing_class, read off the Trainer: a dlcheck_tokenizer fixture is not resolved here (one
    # that raises is reported once, by the checks that need it)
    from ...training.runs import is_lightning_trainer

    trainer = ctx.role("trainer")
    tok = (
        getattr(trainer, "processing_class", None)
        if trainer is not MISSING and not is_lightning_trainer(trainer)
        else None
    )
    if tok is not None and not hasattr(lm.text_tokenizer(tok), "convert_ids_to_tokens"):
        # an image processor as the Trainer's processing_class (ViT, MAE): the batches say whether text is trained
        import pytest

        from ...sampling import get_sample

        try:
            sample = get_sample(ctx)
        except (Exception, pytest.skip.Exception):  # noqa: BLE001 - no data to read: the checks say what they lack
            sample = None
        if sample is not None and sample.batches and not lm.has_token_batches(sample.batches):
            keys = sorted(sample.batches[0]) if isinstance(sample.batches[0], Mapping) else []
            return (
                f"the Trainer's processing_class is a {type(tok).__name__}, no text tokenizer, and the batches from "
                f"{sample.source} "
                "carry no input_ids" + (f" (keys: {', '.join(map(str, keys))})" if keys else "") + ": no language "
                "model is trained (the llm checks concern token batches)"
            )
    model = ctx.role("model")
    task = lm.model_task(model) if model is not MISSING else None
    if task is not None and task[0] == lm.MULTIPLE_CHOICE:
        # its batches nest the choices ((batch, choices, positions) token ids, one label per example): the llm checks
        # read token batches of (batch, positions) with labels per token or per sequence
        return (
            f"the model ({task[1]}) is a {task[0]}: the llm checks concern language models and sequence or token "
            "classifiers, whose batches hold one sequence per row"
        )
    return None
