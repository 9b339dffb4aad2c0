from __future__ import annotations

import math
from collections.abc import Mapping

import torch
import torch.nn.functional as F

from ...errors import MISSING
from ...registry import Setting, check
from ...roles import ROLES, role
from ...training import (
    ModuleSnapshot,
    decode_example,
    device_of,
    draw_batches,
    is_preference,
    preference_loss,
    to_device,
)
from ..shared import lm
from .common import raw_rows

if "ref_model" not in ROLES:  # the rl domain declares it too (the KL reference)
    role("ref_model", "the frozen reference model of DPO (or of a KL penalty)", "dlcheck_trainer")

LN2 = math.log(2)


def completion_logps(model, batch) -> torch.Tensor:
    """Summed log-probabilities of the completion tokens of each row (the DPO log-likelihood)."""
    out = model(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"], use_cache=False)
    # the input's own positions: a prompt-tuned model's prepended virtual tokens dropped
    logits = lm.input_logits(model, out.logits, batch["input_ids"].shape[1])[:, :-1].float()
    target = batch["input_ids"][:, 1:]
    mask = batch["completion_mask"][:, 1:].to(logits.dtype)
    token = torch.gather(F.log_softmax(logits, -1), 2, target.unsqueeze(-1)).squeeze(-1)
    return (token * mask).sum(-1)


def dpo_loss(policy_logps: torch.Tensor, ref_logps: torch.Tensor, beta: float) -> float:
    chosen, rejected = (policy_logps - ref_logps).chunk(2)
    return float(-F.logsigmoid(beta * (chosen - rejected)).mean())


@check(
    "L9",
    domain="llm",
    title="DPO reference model moves with the policy; loss stays at ln 2",
    optional_roles=("trainer", "training_args", "raw_dataset"),
    settings=(
        Setting(
            "step_size",
            0.05,
            "size of the probing policy update (an SGD step normalised to this gradient-norm "
            "fraction): large enough to move the policy's log-probs visibly, the reference must not move at all",
        ),
    ),
)
def check_dpo_reference(dlcheck):
    """The DPO reference is a frozen, independent model: a policy update leaves its log-probs unchanged and
    moves the loss away from ln 2.

    What it does
        On your DPOTrainer's or KTOTrainer's own objects (restored afterwards), checks that no reference parameter shares
        storage with the policy and that the trainer's optimizer (when built) holds none of them. Then takes
        the first sampled preference batch (the trainer's collator), computes the completions' summed
        log-probs under the policy and the reference and the DPO loss, makes one small SGD step on the
        policy (a copy of its weights is kept and put back), and computes them again: the reference's
        log-probs must be identical, and the DPO loss must leave ln 2 (for KTO, whose unpaired batches have
        no DPO loss, the reference's log-probs and parameters are judged).
    Why it is bad
        DPO's loss is -log sigmoid(beta x ((policy - reference) on chosen - (policy - reference) on
        rejected)). A reference that moves with the policy keeps every log-ratio at 0: the loss stays at
        ln 2 = 0.693, the implicit rewards at 0, and the run trains on a constant gradient that never
        separates chosen from rejected. A shallow ``copy.copy(model)`` or a reference assembled from the
        policy's own submodules does exactly that, and TRL only refuses ``ref_model is model``. KTO's loss
        1 - sigmoid(beta x (log-ratio - KL estimate)) is pinned at 0.5 the same way.
    Example
        DPOTrainer(model=model, ref_model=copy.copy(model), ...)
    Use instead
        ref_model=copy.deepcopy(model), or ref_model=None with a model loaded from a path (TRL loads an
        independent reference), or a PEFT adapter (the reference is the adapter-free base).
    Known problems
        Skips when the reference log-probs are precomputed (precompute_ref_log_probs=True) or come from a
        PEFT model with its adapters disabled: both are frozen by construction. Without a preference
        batch (input_ids, attention_mask, completion_mask) to probe it skips, even when no parameter is
        shared: a reference can move without sharing storage.
    Not applicable
        Trainers that are not preference trainers with a reference model, DPO or KTO (SFT, GRPO/RLOO, a
        reward model's RewardTrainer, a plain Trainer); DPO or KTO without a separate
        reference model (precomputed reference log-probs, PEFT with the adapters disabled); pipelines
        with no trainer and no sign of DPO (DPO training arguments, chosen/rejected examples). DPO data
        without its trainer is a missing dlcheck_trainer.
    """
    trainer = dlcheck.role("trainer")
    if trainer is MISSING:
        if _preference_pipeline(dlcheck):
            dlcheck.require("trainer")  # DPO without its trainer: the DPOTrainer would let L9 run
        dlcheck.not_applicable(
            "no DPO training in the given fixtures: no dlcheck_trainer, no DPO training arguments, no "
            "chosen/rejected examples"
        )
    if not is_preference(trainer):
        dlcheck.not_applicable(
            f"{type(trainer).__name__} is not a preference trainer with a reference model: L9 concerns TRL's "
            "DPOTrainer and KTOTrainer"
        )
    # KTO's loss is no DPO loss (unpaired completions, 0.5 at the start): its reference is judged, not ln 2
    dpo = preference_loss(trainer) == "dpo"
    policy, ref = trainer.model, getattr(trainer, "ref_model", None)
    if ref is None:
        dlcheck.not_applicable(
            "the trainer has no separate reference model (precomputed reference log-probs, or PEFT with the "
            "adapters disabled): frozen by construction"
        )
    names = {p.data_ptr(): n for n, p in policy.named_parameters()}
    shared = [(n, names[p.data_ptr()]) for n, p in ref.named_parameters() if p.data_ptr() in names]
    in_optimizer = []
    if trainer.optimizer is not None:
        held = {id(p) for g in trainer.optimizer.param_groups for p in g["params"]}
        in_optimizer = [n for n, p in ref.named_parameters() if id(p) in held and p.data_ptr() not in names]

    loader = dlcheck.role("dataloader")
    batch = None
    if loader is not MISSING:
        batches = dlcheck.memo(loader, "l9:batches", lambda: draw_batches(loader, 1))
        batch = batches[0] if batches else None
    probe = None
    if isinstance(batch, Mapping) and {"input_ids", "attention_mask", "completion_mask"} <= set(batch):
        probe = _probe_step(
            policy, ref, to_device(batch, device_of(policy)), trainer.beta, dlcheck.setting("step_size"), dpo
        )

    moved = probe is not None and probe["ref_delta"] > 0
    pinned = dpo and probe is not None and abs(probe["loss_after"] - LN2) < 1e-6 and abs(probe["policy_delta"]) > 0
    if not shared and not in_optimizer and not moved and not pinned:
        if probe is None:
            dlcheck.skip(
                "no preference batch (input_ids, attention_mask, completion_mask) to probe, and no shared "
                "parameters found"
            )
        n_ref = sum(1 for _ in ref.parameters())
        optimizer = (
            "the trainer's optimizer holds none of them" if trainer.optimizer is not None else "no optimizer built yet"
        )
        dlcheck.measured(
            f"one SGD step on the policy (its {'chosen+rejected' if dpo else 'completions'} log-likelihood moved by {probe['policy_delta']:.4g} nats) "
            f"left the reference's log-probs of batch 0 unchanged (max |Δ| {probe['ref_delta']:g})",
            f"0 of {n_ref} reference parameter tensors share storage with the policy's; {optimizer}",
            *(
                [
                    f"DPO loss on batch 0 (beta {trainer.beta}): {probe['loss_before']:.5f} before the step, "
                    f"{probe['loss_after']:.5f} after (ln 2 = {LN2:.5f})"
                ]
                if dpo
                else []
            ),
            reference_tensors=n_ref,
            shared=0,
            policy_delta=probe["policy_delta"],
            reference_delta=probe["ref_delta"],
            **({"loss_before": probe["loss_before"], "loss_after": probe["loss_after"]} if dpo else {}),
        )
        return

    evidence = []
    if shared:
        evidence.append(
            f"{len(shared)} of {sum(1 for _ in ref.parameters())} reference parameter tensors share storage "
            f"with the policy's: ref {shared[0][0]} is policy {shared[0][1]}"
        )
    if in_optimizer:
        evidence.append(
            f"the trainer's optimizer updates {len(in_optimizer)} reference parameters: {', '.join(in_optimizer[:4])}"
        )
    if probe is not None:
        example = decode_example(dlcheck, batch)
        evidence.append(
            f"one SGD step on the policy (its {'chosen+rejected' if dpo else 'completions'} log-likelihood moved by {probe['policy_delta']:.4g} "
            f"nats) moved the reference's log-probs of batch 0 by {probe['ref_delta']:.4g} nats "
            f"(reference, chosen row 0: {probe['ref_before']:.4f} -> {probe['ref_after']:.4f}); a frozen one moves by 0"
        )
        if dpo:
            evidence.append(
                f"DPO loss on batch 0 (beta {trainer.beta}): {probe['loss_before']:.5f} before the step, "
                f"{probe['loss_after']:.5f} after (ln 2 = {LN2:.5f})"
            )
        if example:
            evidence.append(f"batch 0, row 0: {example}")
    if shared or moved:
        cause = (
            "the reference model shares its weights with the policy (a shallow copy.copy, or the policy's own "
            "submodules): every policy update moves the reference too, so the log-ratios stay 0 and the "
            + ("DPO loss stays ln 2" if dpo else "KTO loss stays 0.5 (its implicit rewards stay 0)")
        )
        fix = (
            "pass an independent reference: ref_model=copy.deepcopy(model), or ref_model=None with a model loaded "
            "from a path (TRL then loads its own reference), or train a PEFT adapter"
        )
    else:
        cause = "the reference model's parameters are in the optimizer: it is trained along with the policy"
        fix = "build the optimizer over the policy's parameters only (leave the reference out; TRL's default optimizer does)"
    dlcheck.fail(evidence, cause, fix)


def _preference_pipeline(dlcheck) -> bool:
    """DPO training shows without its trainer: DPO training arguments, or chosen/rejected examples."""
    args = dlcheck.optional("training_args")
    if args is not None and any(c.__name__ == "DPOConfig" for c in type(args).__mro__):
        return True
    rows = raw_rows(dlcheck) or []
    return any(isinstance(r, Mapping) and "chosen" in r and "rejected" in r for r in rows)


def _probe_step(policy, ref, batch, beta: float, step_size: float, dpo: bool = True) -> dict:
    """Log-probs and DPO loss before and after one normalised SGD step on the policy; every tensor of both
    models (and their grads, requires_grad and modes) is put back afterwards."""
    snaps = [(m, ModuleSnapshot.take(m)) for m in (policy, ref)]
    try:
        for m in (policy, ref):
            m.eval()
        with torch.no_grad():
            ref_before = completion_logps(ref, batch)
            pol_before = completion_logps(policy, batch)
        params = [p for p in policy.parameters() if p.requires_grad]
        with torch.enable_grad():
            objective = completion_logps(policy, batch).sum()
            grads = torch.autograd.grad(objective, params, allow_unused=True)
        norm = math.sqrt(sum(float(g.double().pow(2).sum()) for g in grads if g is not None)) or 1.0
        with torch.no_grad():
            for p, g in zip(params, grads):
                if g is not None:
                    p.add_(g, alpha=step_size / norm)
            ref_after = completion_logps(ref, batch)
            pol_after = completion_logps(policy, batch)
        return {
            "ref_delta": float((ref_after - ref_before).abs().max()),
            "policy_delta": float((pol_after - pol_before).sum()),
            "ref_before": float(ref_before[0]),
            "ref_after": float(ref_after[0]),
            # the DPO loss of the batch's chosen/rejected halves (a KTO batch holds no pairs)
            "loss_before": dpo_loss(pol_before, ref_before, beta) if dpo else None,
            "loss_after": dpo_loss(pol_after, ref_after, beta) if dpo else None,
        }
    finally:
        for m, snap in snaps:
            snap.restore(m)
