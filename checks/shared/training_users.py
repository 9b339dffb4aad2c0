"""Whether the training domains (train, ckpt, smoke, dist) concern a pipeline at all, decided from its objects.

Those checks run a supervised training step — a transformers/TRL Trainer, a LightningModule, or a plain loop's
``dlcheck_make_training`` — on batches of a dataset. A reinforcement-learning agent that learns from its own
rollouts (a Stable-Baselines3 algorithm, a CleanRL-style loop handed over as its env, TD target, rollout and
save/load) has no such step and no dataset: asking it for ``dlcheck_make_training`` or ``dlcheck_dataloader``
names a fixture that would not make those checks judge it (the rl domain judges it). Any sign of a supervised
training (the roles below) keeps the missing role: a loop that lacks its dataloader is asked for it."""

from __future__ import annotations

import inspect
from typing import Any

import pytest

from ...errors import MISSING, RoleError

#: roles of a supervised training (or its data): given or derived, the training domains concern the pipeline
SUPERVISED = (
    "trainer",
    "lightning_module",
    "datamodule",
    "make_training",
    "train_step",
    "compute_loss",
    "dataloader",
    "collator",
    "dataset",
    "save_checkpoint",
    "load_checkpoint",
    "dist_wrap",
    "make_dataloader",
)

#: roles of a reinforcement-learning agent that trains on its own rollouts
RL_AGENT = ("algorithm", "env", "td_target_fn", "advantage_fn", "rollout", "save_agent", "load_agent")

#: what each domain would have run, for the reason it gives
RUNS = {
    "train": "the train checks run a training step on batches of a dataset",
    "ckpt": "the ckpt checks save and resume a supervised training (an RL agent's save/load is R4's)",
    "smoke": "the smoke checks watch a short supervised training run on batches of a dataset",
    "dist": "the dist checks launch a supervised training loop in several processes",
    "llm": "the llm checks read a language model's token batches",
}


def _role(ctx: Any, name: str) -> Any:
    try:
        return ctx.role(name)
    except pytest.FixtureLookupError:  # a role no loaded domain declares, and no fixture
        return MISSING
    except RoleError:  # given but unusable: something is there; the check that needs it says what is wrong
        return name


def _describe(obj: Any) -> str:
    if inspect.isfunction(obj) or inspect.ismethod(obj):
        return "a function"
    kind = type(obj)
    package = kind.__module__.split(".")[0]
    return kind.__name__ if package == "builtins" else f"{kind.__name__} ({package})"


def rl_agent_only(ctx: Any, domain: str) -> str | None:
    """Why ``domain`` (train, ckpt, smoke, dist) does not concern the pipeline, or None: not applicable when
    the pipeline is a reinforcement-learning agent (given or derived) and nothing of a supervised training is
    there; None otherwise (a missing role is then the honest answer)."""
    agent = [(name, _role(ctx, name)) for name in RL_AGENT]  # first: most pipelines have none of these
    agent = [(name, obj) for name, obj in agent if obj is not MISSING]
    if not agent:
        return None
    if any(_role(ctx, name) is not MISSING for name in SUPERVISED):
        return None
    shown = ", ".join(f"dlcheck_{name}: {_describe(obj)}" for name, obj in agent[:3])
    return (
        f"the pipeline is a reinforcement-learning agent ({shown}) with no supervised training (no dlcheck_trainer, "
        f"dlcheck_lightning_module, dlcheck_make_training or dataloader): {RUNS.get(domain, 'these checks')}; "
        "the rl checks judge this pipeline"
    )


def rl_agent_without_text(ctx: Any) -> str | None:
    """Why the llm domain does not concern the pipeline, or None: a reinforcement-learning agent (given or derived)
    with no tokenizer and no Trainer, whose supervised-looking update (a CleanRL loop's factory and step) trains on
    observations, not text. A policy trained on text (GRPO) comes with its trainer or its tokenizer."""
    agent = [(name, _role(ctx, name)) for name in RL_AGENT]
    agent = [(name, obj) for name, obj in agent if obj is not MISSING]
    if not agent or any(_role(ctx, name) is not MISSING for name in ("tokenizer", "trainer", "collator")):
        return None
    shown = ", ".join(f"dlcheck_{name}: {_describe(obj)}" for name, obj in agent[:3])
    return (
        f"the pipeline is a reinforcement-learning agent ({shown}) with no tokenizer and no Trainer: the llm checks "
        "concern language models (a policy trained on text comes with its trainer or its tokenizer)"
    )
