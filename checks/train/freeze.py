from __future__ import annotations

from typing import Any

import torch

from ...registry import check
from ...training import find_setup, fresh_probe
from ...training.runs import unwrap_prepared


def _model(dlcheck) -> tuple[Any, str, list[tuple[str, Any]]]:
    """(the model, where it comes from, the other modules of the training dict as (key, module)): a loop's
    training dict may hold networks beside ``state['model']`` (a discriminator, a frozen perceptual network, a
    teacher) whose freeze is as much the script's as the model's."""
    setup = find_setup(dlcheck)
    if setup is not None:
        fresh = fresh_probe(dlcheck, setup)
        others: list[tuple[str, Any]] = []
        if isinstance(fresh.owner, dict):
            inner = unwrap_prepared(fresh.model)
            for key, value in fresh.owner.items():
                module = unwrap_prepared(value)
                if (
                    key != "model"
                    and isinstance(module, torch.nn.Module)
                    and module is not inner
                    and all(module is not m for _, m in others)
                ):
                    others.append((str(key), module))
        return fresh.model, f"the model of {setup.describe()}", others
    model = dlcheck.require("model")[0]
    return model, "dlcheck_model", []


@check(
    "T11",
    domain="train",
    title="a freeze that does not take effect (module.requires_grad = False)",
    optional_roles=("trainer", "lightning_module", "make_training", "model"),
)
def check_freeze(dlcheck):
    """A module meant to be frozen has parameters that no longer require gradients.

    What it does
        Walks the modules of the model (a fresh one from your training set-up, or dlcheck_model) — and of the
        other networks of a training dict (``dlcheck_make_training``'s discriminator, frozen perceptual network or
        teacher, whether an optimizer holds them or not) — and fails
        when a module carries ``requires_grad = False`` as a plain attribute — set by
        ``module.requires_grad = False`` — while its parameters still require gradients. It also
        reports, without failing, submodules put in eval mode whose parameters still train: ``.eval()``
        changes dropout and BatchNorm, not what the optimizer updates.
    Why it is bad
        ``nn.Module`` has a ``requires_grad_()`` method but no ``requires_grad`` flag: assigning
        ``backbone.requires_grad = False`` just creates an attribute. The backbone goes on training at the
        full learning rate — a "linear probe" that is really a fine-tune, a frozen tower that drifts —
        with no error and no warning.
    Example
        model.vision_tower.requires_grad = False          # an attribute: nothing is frozen
    Use instead
        model.vision_tower.requires_grad_(False)          # or: for p in module.parameters(): p.requires_grad = False
        (build the optimizer from the parameters that still require gradients afterwards)
    Known problems
        A module in eval mode is reported, never failed: eval mode is also how people keep BatchNorm
        statistics fixed while training the weights on purpose.
    Not applicable
        None: every model's freeze can be read.
    """
    model, where, others = _model(dlcheck)
    if not isinstance(model, torch.nn.Module):
        dlcheck.not_applicable(f"{where} is a {type(model).__name__}, not a torch.nn.Module")
    total = sum(1 for _ in model.parameters())
    trainable = sum(1 for p in model.parameters() if p.requires_grad)
    mistaken = []
    for prefix, root in [("", model)] + [(f"state[{key!r}]", m) for key, m in others]:
        for name, module in root.named_modules():
            flag = vars(module).get("requires_grad", None)
            if flag is False:
                live = [p for p in module.parameters() if p.requires_grad]
                if live:
                    label = ".".join(x for x in (prefix, name) if x) or type(module).__name__
                    mistaken.append((label, len(live), sum(p.numel() for p in live)))
    if mistaken:
        evidence = [
            f"{name}.requires_grad = False is a plain attribute: {n} of its parameter tensors ({numel:,} values) "
            "still require gradients"
            for name, n, numel in mistaken[:4]
        ]
        evidence.append(f"{trainable} of {total} parameter tensors of {where} require gradients")
        first = mistaken[0][0]
        dlcheck.fail(
            evidence,
            cause="nn.Module has no requires_grad flag: assigning module.requires_grad = False creates an attribute "
            "and freezes nothing, so the module trains at the full learning rate",
            fix=f"{first}.requires_grad_(False) (the method, with the underscore), then build the optimizer from "
            "[p for p in model.parameters() if p.requires_grad]",
        )
    # optimizers the modules keep (SB3's actor.optimizer / critic.optimizer): a module in eval mode whose parameters
    # none of them holds (a TD3 / SAC target network, updated by copying weights) is not trained at all
    held = {
        id(p)
        for module in model.modules()
        for value in vars(module).values()
        if isinstance(value, torch.optim.Optimizer)
        for group in value.param_groups
        for p in group["params"]
    }
    eval_but_training = [
        name
        for name, module in model.named_modules()
        if name
        and not module.training
        and model.training
        and any(p.requires_grad and (not held or id(p) in held) for p in module.parameters(False))
    ]
    note = (
        f"; {len(eval_but_training)} submodules in eval mode still have trainable parameters (e.g. "
        f"{eval_but_training[0]}): eval() does not freeze them"
        if eval_but_training
        else ""
    )
    beside = (
        f" (nor of the other modules of the training dict: {', '.join(f'state[{k!r}]' for k, _ in others)})"
        if others
        else ""
    )
    dlcheck.measured(
        f"no module of {where} carries a requires_grad attribute{beside}; {trainable} of {total} parameter tensors "
        f"require gradients{note}",
        trainable=trainable,
        parameters=total,
    )
