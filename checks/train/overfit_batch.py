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
            "at most this many optimizer steps on the one batch per attempt (an attempt stops as soon as the "
            "loss is under the target); a working pipeline halves a batch's loss in far fewer (the tiny "
            "models of the test suite need 5-15)",
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
        the first sampled batch only, at most ``steps`` times (an attempt stops as soon as the loss is
        under the target: a passing pipeline costs a handful of steps), with your optimizer at its base
        learning rate (the scheduler is left out, so a warmup does not hide the result). The loss is measured in train mode
        (BatchNorm's running statistics lag in eval mode) and the model's own randomness — dropout masks,
        a diffusion loss's noise and timesteps — is drawn the same way at every step, so one batch is one
        fixed objective. When the loss does not fall by ``min_reduction``, it tries 10x and 100x your
        learning rate; when it diverges at your rate, 0.1x and 0.01x. It fails only on conclusive
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
        steps: raise ``T2.steps``.
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
    steps = dlcheck.setting("steps")
    attempts = []
    spent: list[int] = []  # optimizer steps each attempt took (it stops once the target is reached)
    curves: dict[str, list[float]] = {}  # each attempt's loss per step, for the report's picture

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
            caption="the ladder of runs: your LR first, then 10x/100x when the loss falls too slowly, 0.1x/0.01x "
            "when it diverges; each stops once under the target",
        )

    def attempt(mult: float) -> float:
        start.restore(model)
        opt, _ = run_or_skip(dlcheck, fresh.make_optimizer)
        if opt is None:
            dlcheck.skip(f"{setup.describe()} gives no optimizer")
        base_lr(opt)
        for g in opt.param_groups:
            g["lr"] = g["lr"] * mult
        lr = opt.param_groups[0]["lr"]
        used = steps
        curve: list[float] = []
        curves[f"lr {lr:.3g} ({mult:g}x)"] = curve
        with modes(model, train=True):
            for i in range(steps):
                opt.zero_grad(set_to_none=True)
                loss = fixed(lambda: fresh.loss(batch))
                curve.append(float(loss.detach()))
                # the loss of the weights after i steps, measured as batch_loss does (train mode, randomness
                # held fixed): once it is under the target the verdict is in, and no further step is spent
                if i and math.isfinite(value := float(loss.detach())) and value <= target:
                    used = i
                    break
                loss.backward()
                opt.step()
        opt.zero_grad(set_to_none=True)
        last = batch_loss()
        attempts.append((mult, lr, last))
        spent.append(used)
        return last

    def diverged(value: float) -> bool:
        return not math.isfinite(value) or value > first

    try:
        # your learning rate first; up the ladder while the loss falls too slowly, down it when it diverges
        ladder = [1.0]
        while ladder:
            mult = ladder.pop(0)
            last = attempt(mult)
            if math.isfinite(last) and last <= target:
                others = "; ".join(
                    f"lr {a_lr:.3g} ({a_mult:g}x): {a_last:.4g}" for a_mult, a_lr, a_last in attempts[:-1]
                )
                dlcheck.measured(
                    f"batch 0 loss {first:.4g} -> {last:.4g} after {spent[-1]} steps on that batch alone at lr "
                    f"{attempts[-1][1]:.3g} ({mult:g}x your base LR), train mode, the model's randomness held fixed: "
                    f"{1 - last / first:.0%} less, {dlcheck.setting('min_reduction'):.0%} needed"
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
                    steps=spent[-1],
                    max_steps=steps,
                )
                return
            if mult == 1.0:
                ladder = [0.1, 0.01] if diverged(last) else [10.0, 100.0]
            elif mult > 1.0 and diverged(last):
                ladder = []  # higher still would only diverge more
    finally:
        start.restore(model)
        picture()

    tried = "; ".join(f"lr {lr:.3g} ({mult:g}x): {last:.4g}" for mult, lr, last in attempts)
    evidence = [
        f"batch 0 loss {first:.4g} before, after {steps} steps on that batch alone: {tried}; the target was "
        f"{target:.4g} ({dlcheck.setting('min_reduction'):.0%} less)"
    ]
    example = decode_example(dlcheck, batch)
    if example:
        evidence.append(f"batch 0, example 0: {example}")
    with modes(model, train=False), torch.no_grad():
        try:
            out = output_tensor(fresh.forward(batch))
        except Exception:  # noqa: BLE001 - the model takes the batch only through the user's loss
            out = None
    best = (
        min(last for _, _, last in attempts if math.isfinite(last))
        if any(math.isfinite(a[2]) for a in attempts)
        else first
    )
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
        evidence.append(
            "the loss rises at every learning rate tried, 100x below yours included: the optimizer climbs it"
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
            f"not conclusive: batch 0 loss {first:.4g} {how} in {steps} steps on that batch alone ({tried}); "
            f"{dlcheck.setting('min_reduction'):.0%} less was needed — raise T2.steps to judge it"
        )
    dlcheck.fail(evidence, cause, fix)
