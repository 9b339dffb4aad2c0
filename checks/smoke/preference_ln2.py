from __future__ import annotations

import math

from ... import detectors
from ...errors import MISSING
from ...registry import check
from ...training import is_preference, is_reward_trainer, preference_loss, smoke_run

LN2 = detectors.LN2


@check(
    "S4",
    domain="smoke",
    title="DPO loss pinned at ln 2 / preference accuracy at chance",
    roles=(),
    optional_roles=("trainer",),
    settings=detectors.SETTINGS["S4"],
)
def check_preference_pinned(dlcheck):
    """A short real DPO run moves its loss away from ln 2 and its preference accuracy away from 0.

    What it does
        For a preference trainer (TRL's DPOTrainer and subclasses), uses the shared smoke run (see S1) and
        fails when every step's loss stays within ``tol`` of ln 2 (the DPO loss when policy and reference
        agree) and the logged ``rewards/accuracies`` never rises above 0: the policy never gets ahead of
        the reference. Names the cause it can see: a reference sharing parameters with the policy, beta 0,
        a learning rate of 0, chosen identical to rejected.
    Why it is bad
        At step 0 the policy equals the reference, so the loss is ln 2 and the implicit rewards are 0.
        Training must move the policy away; if the loss stays pinned, the reference moves with the policy
        (shared weights), the preference signal is zero, or nothing is updated — and the run learns nothing.
    Example
        ref_model = copy.copy(model)          # a shallow copy: the same parameter tensors
        DPOTrainer(model=model, ref_model=ref_model, ...)
    Use instead
        ref_model=copy.deepcopy(model) (or ref_model=None with a model loaded from a path, or PEFT, whose
        reference is the adapter-free base), a beta > 0, a non-zero learning rate.
    Known problems
        Only TRL's preference trainers are recognised: a DPO loss written by hand in a plain loop is not
        judged. L9 tests the reference's freezing directly in one step.
    Not applicable
        Every other kind of training: SFT, GRPO, a plain Trainer, a Lightning module, a plain loop. Their
        loss has no reason to start at ln 2. KTO (KTOTrainer): its loss starts at 0.5, not ln 2, and it logs
        no preference accuracy. A reward model (RewardTrainer): its pairwise loss starts near ln 2 but not at
        it (a fresh score head ranks pairs at random), and without a reference a loss near ln 2 after a short
        run does not tell slow learning from none.
    """
    trainer = dlcheck.role("trainer")
    if trainer is not MISSING and preference_loss(trainer) == "kto":
        dlcheck.not_applicable(
            f"dlcheck_trainer is a {type(trainer).__name__}: KTO's loss 1 - σ(β x (log-ratio - KL estimate)) starts "
            "at 0.5 (times the desirable/undesirable weights), not at ln 2, and KTO logs no preference accuracy: S4 "
            "judges DPO's loss"
        )
    if trainer is not MISSING and is_reward_trainer(trainer):
        dlcheck.not_applicable(
            f"dlcheck_trainer is a {type(trainer).__name__}: its pairwise loss -log σ(r_chosen - r_rejected) starts "
            "near ln 2, but not at it (the fresh score head already ranks chosen and rejected at random, and its "
            "accuracy is at chance from the first step): with no reference model, a loss near ln 2 after a short "
            "run does not tell a reward model that learns slowly from one that learns nothing; S4 judges DPO, whose "
            "loss is ln 2 exactly while the policy equals its reference"
        )
    if trainer is not MISSING and not is_preference(trainer):
        dlcheck.not_applicable(
            f"dlcheck_trainer is a {type(trainer).__name__}, not a preference trainer (DPOTrainer): its loss has no "
            "reason to start at ln 2"
        )
    if trainer is MISSING:
        others = [f"dlcheck_{n}" for n in ("lightning_module", "make_training") if dlcheck.has(n)]
        if others:
            dlcheck.not_applicable(
                f"the training is given as {', '.join(others)}: S4 judges TRL's preference trainers (DPOTrainer), "
                "whose loss starts at ln 2"
            )
        dlcheck.skip("missing role: define fixture dlcheck_trainer (a TRL DPOTrainer) in conftest.py")
    run = smoke_run(dlcheck)
    losses = [(s, v) for s, v in run.trajectory.losses() if v is not None and math.isfinite(v)]
    if len(losses) < 2:
        dlcheck.skip(f"the smoke run logged {len(losses)} finite losses (raise S1.steps)")
    tol = dlcheck.setting("tol")
    left = detectors.off_ln2(losses, tol)
    if left:
        dlcheck.measured(
            f"{run.steps}-step DPO smoke run: loss {losses[0][1]:.5f} -> {losses[-1][1]:.5f}; it leaves ln 2 = "
            f"{LN2:.4f} by more than {tol:g} at step {left[0][0]} ({left[0][1]:.5f}), and at {len(left)} of "
            f"{len(losses)} steps",
            steps=len(losses),
            first_loss=losses[0][1],
            last_loss=losses[-1][1],
            first_step_off_ln2=left[0][0],
        )
        return
    accs = [
        r.metrics.get("rewards/accuracies")
        for r in run.trajectory.steps
        if r.metrics.get("rewards/accuracies") is not None
    ]
    margins = [
        r.metrics.get("rewards/margins") for r in run.trajectory.steps if r.metrics.get("rewards/margins") is not None
    ]
    if detectors.ahead_of_reference(accs):
        dlcheck.measured(
            f"{run.steps}-step DPO smoke run: the loss stays within {tol:g} of ln 2, but rewards/accuracies reaches "
            f"{max(accs):.2f} (> 0.5): the policy does get ahead of the reference",
            steps=len(losses),
            max_accuracy=max(accs),
        )
        return
    evidence = [
        f"all {len(losses)} steps of the smoke run: loss within {tol:g} of ln 2 = {LN2:.4f} "
        f"({', '.join(f'{s}: {v:.5f}' for s, v in losses[:6])}{' …' if len(losses) > 6 else ''})"
    ]
    if accs:
        evidence.append(
            f"rewards/accuracies: max {max(accs):.2f}; largest |rewards/margins|: {max(abs(m) for m in margins):.3g}"
            if margins
            else f"rewards/accuracies: max {max(accs):.2f}"
        )
    grads = [r.grad_norm for r in run.trajectory.steps if r.grad_norm is not None]
    if grads:
        evidence.append(f"the policy does get gradients: norms {', '.join(f'{g:.3g}' for g in grads[:4])}")
    shared = detectors.shared_parameters(trainer.model, getattr(trainer, "ref_model", None))
    args = trainer.args
    if shared:
        evidence.append(
            f"{len(shared)} of {sum(1 for _ in trainer.ref_model.parameters())} reference parameters share "
            f"storage with the policy's (e.g. {shared[0]})"
        )
        cause, fix = detectors.SHARED_REF_CAUSE, detectors.SHARED_REF_FIX
    elif getattr(args, "beta", None) == 0:
        cause = "beta=0: the DPO logits are beta x (log-ratio difference) = 0 whatever the policy does"
        fix = "set DPOConfig(beta=0.1) (the usual range is 0.01-0.5)"
    elif args.learning_rate == 0:
        cause = "learning_rate=0: the policy never moves away from the reference"
        fix = "set a learning rate (DPOConfig(learning_rate=5e-7 ... 5e-6) for full fine-tuning, higher for LoRA)"
    else:
        cause, fix = detectors.PINNED_CAUSE, detectors.PINNED_FIX
    dlcheck.fail(evidence, cause, fix)
