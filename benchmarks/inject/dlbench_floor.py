"""The floor: what a person's own smoke test of the same project has to do anyway. Given the project's
``dlcheck_*`` fixtures (already built by pytest, as the checks get them), draw one batch the way training
draws it and run one forward and one backward pass. Writes what it did to ``$DLBENCH_FLOOR_OUT``."""

from __future__ import annotations

import inspect
import json
import os
from collections.abc import Callable
from typing import Any


def _first(fixtures: dict[str, Any], *names: str) -> Any:
    for name in names:
        if fixtures.get(name) is not None:
            return fixtures[name]
    return None


def _rows(dataset: Any, n: int) -> list[Any]:
    try:
        return [dataset[i] for i in range(min(n, len(dataset)))]
    except TypeError:  # iterable
        out = []
        for row in dataset:
            out.append(row)
            if len(out) == n:
                break
        return out


def _device(model: Any):
    import torch

    return next(iter(model.parameters()), torch.empty(0)).device


def _to(value: Any, device: Any) -> Any:
    import torch

    if torch.is_tensor(value):
        return value.to(device)
    if isinstance(value, dict):
        return {k: _to(v, device) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return type(value)(_to(v, device) for v in value)
    return value


def _accepted(fn: Callable, kwargs: dict[str, Any]) -> dict[str, Any]:
    params = inspect.signature(fn).parameters
    if any(p.kind is inspect.Parameter.VAR_KEYWORD for p in params.values()):
        return kwargs
    return {k: v for k, v in kwargs.items() if k in params}


def trainable_bytes(*models: Any) -> int:
    seen, total = set(), 0
    for model in models:
        for p in model.parameters():
            if p.requires_grad and id(p) not in seen:
                seen.add(id(p))
                total += p.numel() * p.element_size()
    return total


def optimizer_state_bytes(optimizer: Any) -> int:
    """Bytes of the tensors an optimizer keeps per parameter (Adam's two moments, SGD's momentum)."""
    import torch

    inner = getattr(optimizer, "optimizer", optimizer)  # accelerate's AcceleratedOptimizer
    state = getattr(inner, "state", None) or {}
    return sum(v.numel() * v.element_size() for per in state.values() for v in per.values() if torch.is_tensor(v))


def training_state_bytes(model: Any, optimizer: Any) -> int:
    """One training state, as a step holds it: the trainable weights, their gradients and the optimizer's
    per-parameter tensors (under AdamW four times the weights)."""
    weights = trainable_bytes(model)
    return 2 * weights + (optimizer_state_bytes(optimizer) if optimizer is not None else 0)


# ---- one step per domain ----------------------------------------------------------------------------


def llm_step(fixtures: dict[str, Any], batch_size: int = 4) -> dict[str, Any]:
    """A causal LM: the trainer's own first batch (or the collator on the first examples), loss, backward."""
    import torch

    trainer = fixtures.get("dlcheck_trainer")
    if trainer is not None:
        model = trainer.model
        batch = next(iter(trainer.get_train_dataloader()))
    else:
        model = fixtures["dlcheck_model"]
        loader = fixtures.get("dlcheck_dataloader")
        if loader is not None:
            batch = next(iter(loader))
        else:
            batch = fixtures["dlcheck_collator"](_rows(fixtures["dlcheck_dataset"], batch_size))
    batch = {k: v for k, v in dict(batch).items() if torch.is_tensor(v)}
    batch.setdefault("labels", batch["input_ids"])
    batch = _to(batch, _device(model))
    loss = model(**_accepted(model.forward, batch)).loss
    loss.backward()
    stepped = trainer is not None and bool(os.environ.get("DLBENCH_FLOOR_OPTIMIZER"))
    optimizer = None
    if stepped:  # the realistic rows: a whole training step, the trainer's own optimizer included
        optimizer = trainer.create_optimizer()
        optimizer.step()
    return {
        "optimizer_step": stepped,
        "loss": float(loss.detach()),
        "batch": list(batch["input_ids"].shape),
        "trainable_bytes": trainable_bytes(model),
        **({"training_state_bytes": training_state_bytes(model, optimizer)} if stepped else {}),
    }


def vision_step(fixtures: dict[str, Any], batch_size: int = 4) -> dict[str, Any]:
    """An image classifier: the dataloader's first batch, the project's loss, backward."""
    import torch

    model = fixtures["dlcheck_model"]
    images, targets = next(iter(fixtures["dlcheck_dataloader"]))[:2]
    device = _device(model)
    logits = model(_to(images, device))
    loss_fn = fixtures.get("dlcheck_loss_fn") or torch.nn.functional.cross_entropy
    loss = loss_fn(logits, _to(targets, device))
    loss.backward()
    return {"loss": float(loss.detach()), "batch": list(images.shape), "trainable_bytes": trainable_bytes(model)}


def diffusion_step(fixtures: dict[str, Any], batch_size: int = 4) -> dict[str, Any]:
    """A latent-diffusion UNet: the collator on the first examples, the project's training inputs (noised
    latents, timesteps, text states, target), the UNet's prediction, MSE, backward."""
    import torch

    pipe = fixtures.get("dlcheck_pipeline")
    unet = _first(fixtures, "dlcheck_unet", "dlcheck_model") or pipe.unet
    batch = fixtures["dlcheck_collator"](_rows(fixtures["dlcheck_dataset"], batch_size))
    inputs = fixtures["dlcheck_training_inputs"](batch)
    pred = unet(inputs["noisy_latents"], inputs["timesteps"], inputs["encoder_hidden_states"]).sample
    loss = torch.nn.functional.mse_loss(pred.float(), inputs["target"].float())
    loss.backward()
    return {
        "loss": float(loss.detach()),
        "batch": list(inputs["noisy_latents"].shape),
        "trainable_bytes": trainable_bytes(unet),
    }


def train_step(fixtures: dict[str, Any], batch_size: int = 4) -> dict[str, Any]:
    """A plain PyTorch loop: a fresh model from the project's factory, the dataloader's first batch, the
    project's loss, backward."""
    import torch

    objects = fixtures["dlcheck_make_training"]()
    model = objects["model"] if isinstance(objects, dict) else objects
    inputs, targets = next(iter(fixtures["dlcheck_dataloader"]))[:2]
    device = _device(model)
    loss_fn = fixtures.get("dlcheck_loss_fn") or torch.nn.functional.cross_entropy
    loss = loss_fn(model(_to(inputs, device)), _to(targets, device))
    loss.backward()
    return {"loss": float(loss.detach()), "batch": list(inputs.shape), "trainable_bytes": trainable_bytes(model)}


def loop_step(fixtures: dict[str, Any], batch_size: int = 4) -> dict[str, Any]:
    """One training step of a plain loop, as the project trains: fresh objects from its factory, the
    dataloader's first batch, and the project's own step (``dlcheck_train_step``: forward, backward,
    optimizer step) or, without one, the loss (``dlcheck_compute_loss``, a mapping batch's ``.loss``, or
    ``dlcheck_loss_fn`` on (inputs, targets)), backward and an optimizer step."""
    import torch

    objects = fixtures["dlcheck_make_training"]()
    model = objects["model"]
    batch = _to(next(iter(fixtures["dlcheck_dataloader"])), _device(model))
    step = fixtures.get("dlcheck_train_step")
    if step is not None:
        loss = step(objects, batch, 0)
    else:
        model.train()
        if fixtures.get("dlcheck_compute_loss") is not None:
            loss = fixtures["dlcheck_compute_loss"](model, batch)
        elif isinstance(batch, dict):
            loss = model(**batch).loss
        else:
            loss_fn = fixtures.get("dlcheck_loss_fn") or torch.nn.functional.cross_entropy
            loss = loss_fn(model(batch[0]), batch[1])
        loss.backward()
        objects["optimizer"].step()
    first = batch["input_ids"] if isinstance(batch, dict) else batch[0]
    return {
        "loss": float(loss.detach() if torch.is_tensor(loss) else loss),
        "batch": list(first.shape),
        "trainable_bytes": trainable_bytes(model),
        "training_state_bytes": training_state_bytes(model, objects.get("optimizer")),
        "optimizer_step": True,
    }


def rl_step(fixtures: dict[str, Any], batch_size: int = 4) -> dict[str, Any]:
    """A Stable-Baselines3 on-policy algorithm: observations from its vectorised environment, the policy's
    log-probabilities and values of actions it samples, a policy-gradient-shaped loss, backward."""
    algo = fixtures["dlcheck_algorithm"]
    policy = algo.policy
    obs = algo.get_env().reset()
    obs_t, _ = policy.obs_to_tensor(obs)
    actions = policy.get_distribution(obs_t).get_actions()
    values, log_prob, entropy = policy.evaluate_actions(obs_t, actions)
    loss = -log_prob.mean() + values.pow(2).mean() - 0.01 * (entropy.mean() if entropy is not None else 0)
    loss.backward()
    return {"loss": float(loss.detach()), "batch": list(obs_t.shape), "trainable_bytes": trainable_bytes(policy)}


STEPS: dict[str, Callable[[dict[str, Any], int], dict[str, Any]]] = {
    "llm": llm_step,
    "vlm": llm_step,  # a TRL SFTTrainer over a vision-language model: the same step, pixel values included
    "vision": vision_step,
    "diffusion": diffusion_step,
    "train": train_step,
    "loop": loop_step,  # the realistic rows' plain loops: one full training step, the optimizer's included
    "rl": rl_step,
}


def run(domain: str, fixtures: dict[str, Any], batch_size: int = 4) -> dict[str, Any]:
    from dlbench_probe import memory_mb

    before = memory_mb()
    info = STEPS[domain](fixtures, batch_size)
    info.update(memory_before_step=before, memory_after_step=memory_mb())
    path = os.environ.get("DLBENCH_FLOOR_OUT")
    if path:
        with open(path, "w") as fh:
            json.dump(info, fh)
    return info
