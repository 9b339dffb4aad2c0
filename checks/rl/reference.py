"""R2: the KL reference shares the policy's parameters, is trained, or is unused."""

from __future__ import annotations

from typing import Any

from ...errors import MISSING
from ...registry import check
from ...roles import is_hf_trainer
from . import measure as rl


@check(
    "R2",
    domain="rl",
    title="reference model trained with the policy, or KL to it switched off",
    roles=(),
    optional_roles=(
        "model",
        "ref_model",
        "kl_coef",
        "optimizer",
        "trainer",
        "algorithm",
        "env",
        "advantage_fn",
        "advantage_minibatches",
    ),
)
def check_frozen_reference(dlcheck):
    """The reference model of the KL penalty is separate from the policy, frozen, and used.

    What it does
        Compares the storage of every parameter tensor of dlcheck_ref_model with the policy's
        (dlcheck_model; both derived from a TRL GRPOTrainer): a shared tensor means the reference moves
        with every update. Fails too when reference parameters sit in the optimizer's param groups, when
        they carry a non-zero .grad (gradients reached the reference), or when a reference is given but
        the KL coefficient (dlcheck_kl_coef, GRPO's beta) is 0. Skips when there is no reference and the
        KL coefficient is 0 (TRL's GRPO default beta=0.0: no KL term, nothing to check).
    Why it is bad
        A reference that shares the policy's tensors (ref_model = model, copy.copy(model), the same
        submodules reassigned) is updated with the policy: the KL term is 0 at every step, never pulls
        the policy back, and the run drifts into reward hacking with a KL plot that looks perfect. A
        reference in the optimizer is trained; one that gets gradients costs memory and time.
    Example
        ref_model = copy.copy(model)                   # shallow: same parameter tensors
        kl = (logp - ref_model(**batch).logits.log_softmax(-1)...).mean()   # always 0
    Use instead
        ref_model = copy.deepcopy(model).eval().requires_grad_(False), or AutoModelForCausalLM.
        from_pretrained(the same checkpoint); with TRL, GRPOConfig(beta=0.04) builds its own reference
        (pass the model as a path or a saved directory); PEFT uses the adapter-disabled base model.
    Known problems
        Tensors the policy does not train (a LoRA base model shared as the reference) are allowed to be
        shared. Static: it does not run an update step, so a reference refreshed by hand from the policy
        (TR-DPO's sync_ref_model is deliberate) is not judged. With PEFT, TRL keeps no separate
        reference and the check is not applicable.
    Not applicable
        Pipelines without a KL penalty to a frozen reference (a trainer whose loss compares the model with a
        teacher model, on-policy distillation, is a skip instead: the teacher is not judged yet): PPO/A2C/DQN/SAC (Stable-Baselines3, or a
        CleanRL-style loop given as dlcheck_env / dlcheck_advantage_fn) clip or regularise against the
        rollout policy instead; GRPO with beta=0.0; a supervised trainer (SFT); a TRL trainer on a PEFT
        model, whose reference is the policy with its adapters disabled.
    """
    ref = dlcheck.role("ref_model")
    kl = dlcheck.role("kl_coef")
    if ref is MISSING:
        _without_reference(dlcheck, kl)
    policy = dlcheck.require("model")[0]
    if not hasattr(ref, "named_parameters") or not hasattr(policy, "named_parameters"):
        dlcheck.skip("dlcheck_model and dlcheck_ref_model must be torch modules")

    # a tensor the policy does not train (a LoRA base, a frozen tower) may be shared: it never moves
    policy_storage = {_storage(p): name for name, p in policy.named_parameters() if _has_storage(p) and p.requires_grad}
    frozen_storage = {
        _storage(p): name for name, p in policy.named_parameters() if _has_storage(p) and not p.requires_grad
    }
    ref_params = list(ref.named_parameters())
    shared = [
        (name, policy_storage[_storage(p)])
        for name, p in ref_params
        if _has_storage(p) and _storage(p) in policy_storage
    ]
    shared_frozen = [name for name, p in ref_params if _has_storage(p) and _storage(p) in frozen_storage]
    evidence: list[str] = []
    causes: list[str] = []
    fixes: list[str] = []
    if shared:
        same = "is the policy object itself" if ref is policy else f"is a {type(ref).__name__} that shares tensors"
        evidence.append(
            f"dlcheck_ref_model {same}: {len(shared)} of {len(ref_params)} reference parameter tensors "
            f"have the same storage as a trainable policy parameter"
        )
        evidence += [f"reference {r} is policy {p}" for r, p in shared[:3]]
        causes.append(
            "the reference shares the policy's parameter tensors (ref = model, or a shallow copy.copy): every "
            "optimizer step moves it with the policy, so KL(policy || reference) stays 0 and never restrains "
            "the policy"
        )
        fixes.append(
            "ref_model = copy.deepcopy(model).eval().requires_grad_(False) (or load the reference from the same "
            "checkpoint); with TRL, set beta > 0 and let GRPOTrainer build the reference"
        )
    opt = dlcheck.role("optimizer")
    trained: list[str] = []
    if opt is not MISSING and hasattr(opt, "param_groups"):
        in_opt = {id(p) for g in opt.param_groups for p in g["params"]}
        trained = [name for name, p in ref_params if id(p) in in_opt]
        if trained and not shared:
            evidence.append(
                f"{len(trained)} of {len(ref_params)} reference parameters are in the optimizer's param "
                f"groups, e.g. {trained[0]}"
            )
            causes.append("the optimizer updates the reference: it drifts with training and the KL loses its anchor")
            fixes.append("build the optimizer from the policy's parameters only: torch.optim.AdamW(model.parameters())")
    with_grad = [name for name, p in ref_params if p.grad is not None and bool(p.grad.abs().sum() > 0)]
    if with_grad and not shared:
        evidence.append(f"{len(with_grad)} reference parameters carry a non-zero .grad, e.g. {with_grad[0]}")
        causes.append("gradients flow into the reference: its log-probs are computed with autograd on")
        fixes.append("compute the reference log-probs under torch.no_grad() and ref_model.requires_grad_(False)")
    if kl is not MISSING and float(kl) == 0.0:
        evidence.append("dlcheck_kl_coef is 0 while a reference model is given")
        causes.append("the KL coefficient is 0: the reference is built and run but its term is multiplied away")
        fixes.append(
            "set the KL coefficient you intended (GRPOConfig(beta=0.04), PPO-RLHF kl_coef), or drop the reference model"
        )
    if causes:
        dlcheck.fail(evidence, "; ".join(causes), "; ".join(fixes))

    trainable = len(policy_storage)
    lines = [
        f"dlcheck_ref_model ({type(ref).__name__}, {len(ref_params)} parameter tensors) shares no storage with the "
        f"policy's {trainable} trainable parameter tensors"
        + (f"; {len(shared_frozen)} share a frozen policy tensor (allowed: it never moves)" if shared_frozen else "")
    ]
    if opt is not MISSING and hasattr(opt, "param_groups"):
        lines.append(f"none of its parameters is in the {type(opt).__name__}'s {len(opt.param_groups)} param group(s)")
    else:
        lines.append("no dlcheck_optimizer: whether the optimizer holds reference parameters is not judged")
        dlcheck.not_judged("the optimizer", "no dlcheck_optimizer to tell whether it holds reference parameters")
    if kl is MISSING:
        dlcheck.not_judged("the KL coefficient", "no dlcheck_kl_coef")
    lines.append(
        "none carries a non-zero .grad; "
        + (
            f"KL coefficient {float(kl):g}"
            if kl is not MISSING
            else "no dlcheck_kl_coef: the coefficient is not judged"
        )
    )
    dlcheck.measured(
        *lines,
        reference_tensors=len(ref_params),
        policy_trainable_tensors=trainable,
        shared=0,
        shared_frozen=len(shared_frozen),
        in_optimizer=len(trained) if opt is not MISSING else None,
        with_grad=0,
        kl_coef=float(kl) if kl is not MISSING else None,
    )


def _without_reference(dlcheck, kl: Any) -> None:
    """No reference model: say why the check does not concern this pipeline, or name the fixture."""
    if kl is not MISSING and float(kl) == 0.0:
        dlcheck.not_applicable(
            "no reference model and the KL coefficient is 0 (GRPO's default beta=0.0): the loss has no KL term"
        )
    trainer = dlcheck.role("trainer")
    if trainer is not MISSING and is_hf_trainer(trainer):
        name = type(trainer).__name__
        if hasattr(getattr(trainer, "model", None), "peft_config"):
            dlcheck.not_applicable(
                f"{name} trains a PEFT model: its reference is the same model with the adapters disabled, so there "
                "is no separate reference model whose tensors could be shared or trained"
            )
        teacher = getattr(trainer, "teacher_model", None)
        if hasattr(teacher, "named_parameters") and not hasattr(trainer, "ref_model"):
            # a teacher the loss compares the model with: R2's question (a model the loss anchors to, moved or
            # trained with the policy) concerns it, but the check reads a KL reference, not a teacher
            inner = getattr(teacher, "module", teacher)
            dlcheck.skip(
                f"dlcheck_trainer is a {name}: it has no reference model of a KL penalty, but its loss compares the "
                f"model with a teacher model ({type(inner).__name__}, trainer.teacher_model); whether the teacher "
                "shares the model's tensors, sits in the optimizer or gets gradients is not judged (define "
                "dlcheck_ref_model returning trainer.teacher_model to have R2 judge it)"
            )
        if not rl.rewarded(trainer) and not hasattr(trainer, "ref_model"):
            dlcheck.not_applicable(f"dlcheck_trainer is a {name}: it trains with no reference model and no KL penalty")
    if kl is MISSING:
        algo = dlcheck.role("algorithm")
        if algo is not MISSING and rl.is_sb3_algorithm(algo):
            dlcheck.not_applicable(
                f"{type(algo).__name__} (Stable-Baselines3) has no reference model: "
                + (
                    "PPO/A2C anchor each update to the rollout policy (clipping, target_kl), not to a frozen reference"
                    if rl.is_on_policy(algo)
                    else "it learns from TD targets, with no KL penalty to a frozen reference"
                )
            )
        given = [
            f"dlcheck_{n}"
            for n in ("env", "advantage_fn", "advantage_minibatches", "td_target_fn", "replay_buffer")
            if dlcheck.has(n)
        ]
        if given:
            dlcheck.not_applicable(
                f"a classic RL pipeline ({', '.join(given)}) with no dlcheck_ref_model or dlcheck_kl_coef: it trains "
                "with no KL penalty to a frozen reference model ("
                + (
                    "a policy-gradient update is anchored to the rollout policy by its clipping or step size"
                    if dlcheck.has("advantage_fn") or dlcheck.has("advantage_minibatches")
                    else "a value-based or off-policy agent learns from TD targets"
                    if dlcheck.has("td_target_fn") or dlcheck.has("replay_buffer")
                    else "what anchors its updates is its own algorithm's"
                )
                + ")"
            )
    dlcheck.require("ref_model")


def _has_storage(p: Any) -> bool:
    # meta tensors (offloaded or not yet materialised) and empty ones all report data_ptr 0
    return p.numel() > 0 and p.device.type != "meta" and p.untyped_storage().data_ptr() != 0


def _storage(p: Any) -> tuple[str, int]:
    return (str(p.device), p.untyped_storage().data_ptr())
