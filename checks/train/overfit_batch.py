from __future__ import annotations

import math

import torch

from ...errors import MISSING
from ...guard import preserved_rng
from ...registry import Setting, check
from ...training import (
    SEED,
    ModuleSnapshot,
    base_lr,
    decode_example,
    get_setup,
    modes,
    output_tensor,
    probe,
    run_or_skip,
    seed_all,
)
from ...training.runs import is_grpo
from ..shared import frozen


def _frozen_head(fresh, batch) -> frozen.Trainable | None:
    """What of the model trains and its output layer, found on a forward of ``batch`` in eval mode."""
    model = fresh.model
    with modes(model, train=False), torch.no_grad():
        try:
            out = output_tensor(fresh.forward(batch))
        except Exception:  # noqa: BLE001 - the model takes the batch only through the user's loss
            out = None
        if out is None or out.dim() < 1:
            return frozen.trainable(model)
        return frozen.trainable(model, lambda: fresh.forward(batch), int(out.shape[-1]))


def _steps(n: int) -> str:
    return f"{n} step" if n == 1 else f"{n} steps"


def _too_slow(curve: list[float], target: float, room: int) -> bool:
    """Whether a loss ``curve`` (one value per step, the first at the start) that falls steadily over its latest
    half needs more than twice the ``room`` steps left to it to reach ``target`` at that half's rate. A rate
    measured over steps that slow down overstates what is to come, so a curve this judges too slow is hopeless
    at its learning rate; one that rises or wavers is left to run (it may be diverging, or settling)."""
    i = len(curve) - 1
    j = i // 2
    tail = curve[j:]
    if not all(math.isfinite(v) for v in tail) or any(b > a for a, b in zip(tail, tail[1:])):
        return False
    rate = (curve[j] - curve[-1]) / (i - j)
    return rate <= 0 or (curve[-1] - target) / rate > 2 * room


@check(
    "T2",
    domain="train",
    title="the model cannot overfit one batch",
    roles=(),
    optional_roles=("trainer", "lightning_module", "make_training", "dataloader", "tokenizer"),
    settings=(
        Setting(
            "steps",
            30,
            "at most this many optimizer steps on the one batch in all, over every learning rate tried (about "
            "half at yours, the rest for the next rungs; an attempt stops as soon as the loss is under the "
            "target, or early when it falls too slowly to get there); a working pipeline halves a batch's "
            "loss in far fewer (the tiny models of the test suite need 5-15)",
        ),
        Setting(
            "min_reduction",
            0.5,
            "share of the first-batch loss the steps must remove; memorising a single batch "
            "is the easiest thing a model can do, so half is a low bar",
        ),
    ),
)
def check_overfit_batch(dlcheck):
    """Repeated optimizer steps on a single batch cut its loss by at least half.

    What it does
        Takes fresh objects (a clone of the Trainer's model and optimizer, a copy of your
        LightningModule with its ``configure_optimizers``, or ``dlcheck_make_training``), and trains on
        the first sampled batch only, with your optimizer at its base learning rate (the scheduler is left
        out, so a warmup does not hide the result). The loss is measured in train mode (BatchNorm's running
        statistics lag in eval mode) and the model's own randomness — dropout masks, a diffusion loss's
        noise and timesteps — is drawn the same way at every step, so one batch is one fixed objective.
        ``steps`` is the budget of all attempts together: about half of it at your learning rate; when the
        loss does not fall by ``min_reduction`` there, the rest goes to 10x and then 100x your rate (a
        loss that falls steadily but too slowly to get there in its share moves up early, and when a
        higher rate diverges, the rest goes to the rate halfway between, on a log scale); when it
        diverges at your rate, to 0.1x and 0.01x. An attempt stops as soon as the loss is under the
        target, so a passing pipeline costs a handful of steps. It fails only on conclusive
        evidence: the loss does not move at all, the outputs are probabilities fed to a loss that
        applies log-softmax again, or the output layer is frozen at PyTorch's default (random)
        initialisation while at most 10% of the parameters train (named with the trainable share and the
        modules that train; a model with no trainable parameter fails at once). A loss that falls too slowly in the budget (a 2e-5 fine-tuning rate, a
        DPO step at 5e-7) is reported as not conclusive.
    Why it is bad
        A model that cannot memorise eight examples cannot learn the dataset: the loss is detached from
        the parameters, the outputs are squashed (a softmax before ``CrossEntropyLoss``), the targets do
        not match the outputs, the new classification head is frozen at its random initialisation with
        the backbone, or the optimizer never moves the weights. Such pipelines train for days with
        a flat loss curve.
    Example
        def forward(self, x): return torch.softmax(self.head(self.body(x)), -1)   # then CrossEntropyLoss
        model.fc = nn.Linear(512, 10)
        for p in model.parameters(): p.requires_grad = False                     # the new head too
    Use instead
        return logits from the model (CrossEntropyLoss applies log-softmax itself); make sure the loss is
        computed from the model's output with gradients, against the right targets; freeze the backbone
        first, then put the new head in place.
    Known problems
        Needs a training set-up (dlcheck_trainer, dlcheck_lightning_module, or dlcheck_make_training).
        Models with heavy regularisation (large weight decay, strong dropout in train mode) may need more
        steps: raise ``T2.steps`` (the budget of all the learning rates tried together).
    Not applicable
        GRPO: its loss is computed on completions generated inside each step, so there is no fixed batch
        to memorise.
    """
    trainer = dlcheck.role("trainer")
    if trainer is not MISSING and is_grpo(trainer):
        dlcheck.not_applicable(
            f"{type(trainer).__name__}'s loss is computed on completions it generates inside each step: there is no "
            "fixed batch to memorise"
        )
    setup = get_setup(dlcheck)
    fresh, batches, _ = probe(dlcheck)
    batch = batches[0]
    model = fresh.model
    start = ModuleSnapshot.take(model)

    def fixed(compute):
        # the model's own randomness (dropout masks, a diffusion loss's noise and timesteps) is drawn the same
        # way at every step: one batch is one fixed objective to memorise
        with preserved_rng():
            seed_all(SEED)
            return compute()

    def batch_loss() -> float:
        # train mode, as the steps run (in eval mode BatchNorm's running statistics lag the batch's own)
        with modes(model, train=True), torch.no_grad():
            return float(fixed(lambda: fresh.loss(batch)))

    first = run_or_skip(dlcheck, batch_loss)
    start.restore(model)  # the measurement updated BatchNorm's running statistics
    if not math.isfinite(first) or first <= 0:
        dlcheck.skip(
            f"the first-batch loss is {first:.4g}: "
            + (
                "T5 owns non-finite values"
                if not math.isfinite(first)
                else "a zero loss has nothing to cut"
                if first == 0
                else "a share of a negative loss is no target (a log-density or a negated objective); T2 judges "
                "losses that are positive at the start"
            )
        )
    if not any(p.requires_grad for p in model.parameters()):
        # nothing can train: no step would change the loss (and backward has nothing to differentiate)
        info = _frozen_head(fresh, batch)
        start.restore(model)
        if info.frozen_random_head():
            dlcheck.fail(
                [f"batch 0 loss {first:.4g}; no optimizer step can change it", *info.evidence()],
                info.cause(),
                info.fix(),
            )
        dlcheck.fail(
            [
                f"batch 0 loss {first:.4g}; none of the model's {info.total:,} parameters requires grad: no optimizer "
                "step can change it"
            ],
            "the whole model is frozen (requires_grad=False everywhere): nothing trains",
            "unfreeze what should train (module.requires_grad_(True)) and give those parameters to the optimizer",
        )
    target = first * (1 - dlcheck.setting("min_reduction"))
    budget = int(dlcheck.setting("steps"))  # optimizer steps of all the attempts together
    attempts: list[tuple[float, float, float, int, bool]] = []  # (multiplier, lr, last loss, steps, moved up early)
    curves: dict[str, list[float]] = {}  # each attempt's loss per step, for the report's picture

    def left() -> int:
        return budget - sum(a[3] for a in attempts)

    def picture() -> None:
        finite = [v for c in curves.values() for v in c if math.isfinite(v) and v > 0]
        if not finite:
            return
        logy = len(finite) == sum(len(c) for c in curves.values())
        dlcheck.attach(
            "series",
            title="T2: the batch's loss per step, one curve per learning rate tried",
            series={k: [v if math.isfinite(v) else None for v in c] for k, c in curves.items()},
            bands=[{"lo": min(finite) / 2 if logy else 0.0, "hi": target, "label": f"target ≤ {target:.4g}"}],
            logy=logy,
            ylabel="loss on batch 0",
            caption=f"the ladder of runs, {budget} steps in all: your LR first, then 10x/100x when the loss falls too "
            "slowly, 0.1x/0.01x when it diverges; each stops once under the target",
        )

    def attempt(mult: float, cap: int, may_move_up: bool) -> float:
        """At most ``cap`` steps at ``mult`` x the base LR; stops under the target, at a non-finite loss, or
        (``may_move_up``) once the loss falls too slowly to reach the target in ``cap``."""
        start.restore(model)
        opt, _ = run_or_skip(dlcheck, fresh.make_optimizer)
        if opt is None:
            dlcheck.skip(f"{setup.describe()} gives no optimizer")
        base_lr(opt)
        for g in opt.param_groups:
            g["lr"] = g["lr"] * mult
        lr = opt.param_groups[0]["lr"]
        curve: list[float] = []
        curves[f"lr {lr:.3g} ({mult:.3g}x)"] = curve
        judge_from = max(3, cap // 3)  # steps before the rate is judged (momentum builds up over the first ones)
        early = False
        with modes(model, train=True):
            for i in range(cap + 1):
                opt.zero_grad(set_to_none=True)
                loss = fixed(lambda: fresh.loss(batch))
                # the loss of the weights after i steps, measured as batch_loss does (train mode, randomness held
                # fixed): once it is under the target (or not finite) the verdict is in, and no further step is spent
                value = float(loss.detach())
                curve.append(value)
                if i == cap or (i and (not math.isfinite(value) or value <= target)):
                    break
                if may_move_up and i >= judge_from and _too_slow(curve, target, cap - i):
                    early = True
                    break
                loss.backward()
                opt.step()
        opt.zero_grad(set_to_none=True)
        attempts.append((mult, lr, value, i, early))
        return value

    def diverged(value: float) -> bool:
        return not math.isfinite(value) or value > first

    try:
        # your learning rate first (about half the budget); up the ladder while the loss falls too slowly, down it
        # when it diverges; the steps of all the attempts together stay within the budget
        ladder = [1.0]
        while ladder and left() > 0:
            mult = ladder.pop(0)
            cap = left() if not ladder and mult != 1.0 else math.ceil(left() / 2)
            last = attempt(mult, cap, may_move_up=mult >= 1.0 and (mult == 1.0 or bool(ladder)))
            if math.isfinite(last) and last <= target:
                others = "; ".join(
                    f"lr {a_lr:.3g} ({a_mult:.3g}x): {a_last:.4g} after {_steps(a_n)}"
                    for a_mult, a_lr, a_last, a_n, _ in attempts[:-1]
                )
                dlcheck.measured(
                    f"batch 0 loss {first:.4g} -> {last:.4g} after {_steps(attempts[-1][3])} on that batch alone at lr "
                    f"{attempts[-1][1]:.3g} ({mult:.3g}x your base LR), train mode, the model's randomness held "
                    f"fixed: {1 - last / first:.0%} less, {dlcheck.setting('min_reduction'):.0%} needed"
                    + (f" (also tried: {others})" if others else "")
                    + (
                        f"; at your base LR the loss diverged on this batch ({attempts[0][2]:.4g}): without the "
                        "scheduler's warmup that rate is too high for it"
                        if mult < 1.0 and attempts and diverged(attempts[0][2])
                        else ""
                    ),
                    first_loss=round(first, 6),
                    last_loss=round(last, 6),
                    lr=attempts[-1][1],
                    lr_multiplier=mult,
                    steps=attempts[-1][3],
                    steps_in_all=budget - left(),
                    max_steps=budget,
                )
                return
            if mult == 1.0:
                ladder = [0.1, 0.01] if diverged(last) else [10.0, 100.0]
            elif mult > 1.0 and diverged(last):
                # higher still would only diverge more; the rest of the budget goes halfway (on a log scale) to
                # the last rate that fell, too slowly
                slower = [a[0] for a in attempts if a[0] < mult and not diverged(a[2])]
                halfway = math.sqrt(max(slower) * mult) if slower else None
                ladder = (
                    [halfway] if halfway is not None and left() >= 3 and all(a[0] != halfway for a in attempts) else []
                )
    finally:
        start.restore(model)
        picture()

    spent = budget - left()
    tried = "; ".join(
        f"lr {lr:.3g} ({mult:.3g}x): {last:.4g} after {_steps(n)}"
        + (" (falling too slowly: moved up)" if early else "")
        for mult, lr, last, n, early in attempts
    )
    evidence = [
        f"batch 0 loss {first:.4g} before; on that batch alone, {spent} steps in all (T2.steps={budget}): {tried}; "
        f"the target was {target:.4g} ({dlcheck.setting('min_reduction'):.0%} less)"
    ]
    example = decode_example(dlcheck, batch)
    if example:
        evidence.append(f"batch 0, example 0: {example}")
    with modes(model, train=False), torch.no_grad():
        try:
            out = output_tensor(fresh.forward(batch))
        except Exception:  # noqa: BLE001 - the model takes the batch only through the user's loss
            out = None
    best = min(a[2] for a in attempts if math.isfinite(a[2])) if any(math.isfinite(a[2]) for a in attempts) else first
    if (
        out is not None
        and out.dim() >= 2
        and out.is_floating_point()
        and bool((out >= 0).all())
        and torch.allclose(out.float().sum(-1), torch.ones(out.shape[:-1]), atol=1e-3)
    ):
        evidence.append(f"the model's outputs are probabilities: every row of its {tuple(out.shape)} output sums to 1")
        cause = (
            "the model ends with a softmax and the loss applies log-softmax again (CrossEntropyLoss expects "
            "logits): the loss can only move within a narrow band, whatever the weights"
        )
        fix = "return logits: drop the final softmax (nn.Softmax / torch.softmax) from the model; apply it only at inference"
    elif (info := _frozen_head(fresh, batch)).frozen_random_head():
        start.restore(model)
        evidence += info.evidence()
        cause, fix = info.cause(), info.fix()
    elif abs(best - first) <= 1e-6 * max(1.0, abs(first)):
        cause = (
            "the loss does not move at all: the optimizer steps change nothing the loss depends on (a learning "
            "rate of 0, parameters outside the optimizer, or a loss detached from the outputs; see T3)"
        )
        fix = "check the optimizer's param groups and learning rate, and that the loss is computed from the model's output with gradients"
    elif all(math.isfinite(a[2]) and a[2] > first for a in attempts) and any(a[0] < 1.0 for a in attempts):
        lowest = min(a[0] for a in attempts)
        evidence.append(
            f"the loss rises at every learning rate tried, {1 / lowest:.3g}x below yours included: the optimizer "
            "climbs it"
        )
        cause = (
            "the loss is maximised, not minimised: its sign is flipped (a negated loss, a reward used as a loss, "
            "maximize=True on the optimizer), or the step moves against the gradient"
        )
        fix = (
            "return the loss to minimise (e.g. -log_prob of the targets, not +log_prob; -reward, not reward) and "
            "leave the optimizer's maximize=False"
        )
    else:
        # the loss moved but did not halve in this budget: a fine-tuning LR, a small DPO step, a regularised
        # model — not conclusive evidence of a bug
        how = (
            "diverged at every learning rate tried"
            if all(diverged(a[2]) for a in attempts)
            else (f"fell to {best:.4g} at best ({1 - best / first:.0%} less)")
        )
        dlcheck.skip(
            f"not conclusive: batch 0 loss {first:.4g} {how} in {spent} steps on that batch alone, all the "
            f"learning rates together ({tried}); {dlcheck.setting('min_reduction'):.0%} less was needed — raise "
            f"T2.steps to judge it (now {budget}: the budget of every rate tried)"
        )
    dlcheck.fail(evidence, cause, fix)
