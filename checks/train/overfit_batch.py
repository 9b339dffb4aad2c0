from __future__ import annotations

import functools
import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch

from ...cost import reused
from ...errors import MISSING
from ...guard import preserved_rng
from ...registry import Setting, check
from ...training import (
    SEED,
    ModuleSnapshot,
    base_lr,
    decode_example,
    describe_batch,
    device_of,
    get_setup,
    modes,
    output_tensor,
    probe,
    run_or_skip,
    seed_all,
    soft_targets,
    targets_of,
    to_device,
)
from ...training.backward import own_backward
from ...training.runs import Fresh, digest, is_grpo
from ..shared import frozen
from ..shared.forward import put_forward, restore_forward

#: steps of the direct descent on the model's outputs (the loss alone, no weights: cheap) and its rate, in the
#: outputs' own units (a logit, or the logit of a squashed output). Adam-style steps move each value by about the
#: rate whatever its gradient's size, so 300 of them carry a saturating output 30 logits out, far past where a
#: sigmoid or softmax stops changing in float32
FLOOR_STEPS = 300
FLOOR_LR = 0.1
#: how the outputs fed to the loss are confined, by what every forward of the steps showed
SQUASHES = {
    "simplex": "probabilities: every row sums to 1",
    "unit": "within [0, 1]",
    "symmetric": "within [-1, 1]",
}


@dataclass
class OutputRange:
    """What the model's output tensor held over every forward of the steps (the outputs fed to the loss)."""

    lo: float = math.inf
    hi: float = -math.inf
    sum_dev: float = 0.0  # the largest |row sum - 1| over the last dimension
    forwards: int = 0
    last_dim: int = 0

    def see(self, out: Any) -> None:
        t = output_tensor(out)
        if t is None or not t.is_floating_point() or t.numel() == 0:
            return
        t = t.detach().float()
        self.forwards += 1
        self.lo, self.hi = min(self.lo, float(t.min())), max(self.hi, float(t.max()))
        self.last_dim = int(t.shape[-1]) if t.dim() >= 2 else 0
        if t.dim() >= 2:
            self.sum_dev = max(self.sum_dev, float((t.sum(-1) - 1).abs().max()))
        else:
            self.sum_dev = math.inf

    @property
    def squash(self) -> str | None:
        """How the outputs stayed confined at every step: the rows of a softmax, a sigmoid's [0, 1], a tanh's
        [-1, 1]; None when they left every such range (or none was seen)."""
        if not self.forwards or not (math.isfinite(self.lo) and math.isfinite(self.hi)):
            return None
        if self.lo >= -1e-6 and self.last_dim > 1 and self.sum_dev <= 1e-3:
            return "simplex"
        # a bounded range counts only when the steps pressed the outputs against its edge (a saturated sigmoid
        # or tanh), not when unbounded outputs merely happened to stay in it
        if self.lo >= 0 and self.hi <= 1 and (self.lo <= 1e-3 or self.hi >= 1 - 1e-3):
            return "unit"
        if self.lo >= -1 and self.hi <= 1 and (self.lo <= -1 + 1e-3 or self.hi >= 1 - 1e-3):
            return "symmetric"
        return None


def _descend(loss_at: Callable[[torch.Tensor], torch.Tensor], out0: torch.Tensor, squash: str | None, stop: float):
    """The lowest loss on the batch over outputs of the model's shape, found by descending on the outputs
    themselves (Adam-style steps, no weights, no optimizer object), confined as ``squash`` says (free when None):
    (lowest loss, steps), stopping once under ``stop``; None when the loss does not depend on the outputs."""
    x = out0.detach().float()
    if squash == "unit":
        phi, shape = torch.logit(x.clamp(1e-6, 1 - 1e-6)), torch.sigmoid
    elif squash == "symmetric":
        phi, shape = torch.atanh(x.clamp(-1 + 1e-6, 1 - 1e-6)), torch.tanh
    elif squash == "simplex":
        phi, shape = x.clamp_min(1e-12).log(), (lambda p: torch.softmax(p, dim=-1))
    else:
        phi, shape = x.clone(), (lambda p: p)
    lr = FLOOR_LR * (max(1.0, float(x.abs().max())) if squash is None else 1.0)
    phi.requires_grad_(True)
    m, v = torch.zeros_like(phi), torch.zeros_like(phi)
    best, step = math.inf, 0
    for step in range(1, FLOOR_STEPS + 1):
        loss = loss_at(shape(phi).to(out0.dtype))
        value = float(loss.detach())
        if not math.isfinite(value):
            break
        best = min(best, value)
        if value <= stop:
            break
        with own_backward():
            (g,) = torch.autograd.grad(loss, phi, allow_unused=True)
        if g is None:
            return None
        with torch.no_grad():
            m.mul_(0.9).add_(g, alpha=0.1)
            v.mul_(0.999).addcmul_(g, g, value=0.001)
            phi -= lr * (m / (1 - 0.9**step)) / ((v / (1 - 0.999**step)).sqrt() + 1e-12)
    return best, step


@dataclass
class Floors:
    """The loss's lowest value on the batch over the outputs themselves: free, and confined as the model's
    outputs were at every step."""

    free: float
    free_steps: int
    confined: float | None
    confined_steps: int


def _floors(fresh, batch, fixed, squash: str | None, target: float) -> Floors | None:
    """Descends on the model's outputs, the weights left out: the model's forward returns the outputs being
    descended on, and the user's loss takes them as it takes the model's. None when the loss is not a function
    of a plain output tensor (a loss computed inside the model, an output the loss does not read as returned)."""
    model = fresh.model
    captured: list[Any] = []
    handle = model.register_forward_hook(lambda _m, _i, o: captured.append(o))
    try:
        with modes(model, train=True), torch.no_grad():
            first = float(fixed(lambda: fresh.loss(batch)))
    finally:
        handle.remove()
    if len(captured) != 1 or not isinstance(captured[0], torch.Tensor) or not captured[0].is_floating_point():
        return None
    out0 = captured[0].detach()
    own = model.__dict__.get("forward")
    current = [out0]

    @functools.wraps(model.forward)
    def replay(*_args, **_kwargs):
        reused()  # no model ran: this call returns the outputs being descended on
        return current[0]

    def loss_at(theta: torch.Tensor) -> torch.Tensor:
        current[0] = theta
        return fixed(lambda: fresh.loss(batch))

    put_forward(model, replay)
    try:
        with modes(model, train=True):
            with torch.no_grad():
                again = float(loss_at(out0.clone()))
            if not math.isclose(again, first, rel_tol=1e-4, abs_tol=1e-6):
                return None  # the loss reads more than the output the model returned
            free = _descend(loss_at, out0, None, target)
            if free is None:
                return None
            confined = _descend(loss_at, out0, squash, target) if squash else None
    finally:
        restore_forward(model, own)
    return Floors(free[0], free[1], confined[0] if confined else None, confined[1] if confined else 0)


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
        evidence: the loss does not move at all; the outputs fed to the loss are squashed so that no
        weights can reach the target; the output layer is frozen at PyTorch's default (random)
        initialisation while at most 10% of the parameters train (named with the trainable share and the
        modules that train; a model with no trainable parameter fails at once); or the loss rises at
        every rate tried, lower ones included. Squashed outputs are judged by behaviour, not by source
        text: when every forward of the steps kept the outputs probabilities (rows summing to 1), or
        within [0, 1] / [-1, 1] pressed against an edge (a saturated sigmoid or tanh), T2 descends on
        the outputs themselves with the weights left out (the model returns the values being descended
        on, your loss takes them as it takes the model's output; Adam-style steps, up to 300). When the
        loss, kept in that range, goes no lower than above the target while the same descent with the
        outputs free reaches it, no weights can halve the loss: a sigmoid before ``BCEWithLogitsLoss``,
        a softmax before ``CrossEntropyLoss``. A loss that falls too slowly in the budget (a 2e-5
        fine-tuning rate, a DPO step at 5e-7, a BatchNorm ResNet) is reported as not conclusive, naming
        each rate's loss, and, when the outputs could be descended on, the loss they reach free (the
        target is within reach of some output, so nothing shows that no weights can reach it).
        A plain loop whose ``dlcheck_train_step`` updates the weights itself (no optimizer object in the
        training dict: a hand-written ``p.data.add_(p.grad, alpha=-lr)``) is trained by calling that step on the
        batch, on fresh objects of its own, the whole budget at its own update (T2 cannot set its rate). It
        fails when the loss does not move at all (the evidence says whether the weights changed: a learning
        rate of 0 leaves them as they were), or when the loss rises and the step's first update points up the
        loss's gradient (a positive cosine between the update and the gradient at the start: the sign of the
        update is flipped); a loss that rises with an update that points down its gradient is not conclusive.
    Why it is bad
        A model that cannot memorise eight examples cannot learn the dataset: the loss is detached from
        the parameters, the outputs are squashed (a softmax before ``CrossEntropyLoss``), the targets do
        not match the outputs, the new classification head is frozen at its random initialisation with
        the backbone, or the optimizer never moves the weights. Such pipelines train for days with
        a flat loss curve.
    Example
        def forward(self, x): return torch.softmax(self.head(self.body(x)), -1)   # then CrossEntropyLoss
        def forward(self, x): return torch.sigmoid(self.head(self.body(x)))       # then BCEWithLogitsLoss
        model.fc = nn.Linear(512, 10)
        for p in model.parameters(): p.requires_grad = False                     # the new head too
    Use instead
        return logits from the model (CrossEntropyLoss applies log-softmax itself, BCEWithLogitsLoss the
        sigmoid); make sure the loss is computed from the model's output with gradients, against the right
        targets; freeze the backbone first, then put the new head in place.
    Known problems
        Needs a training set-up (dlcheck_trainer, dlcheck_lightning_module, or dlcheck_make_training).
        Models with heavy regularisation (large weight decay, strong dropout in train mode) may need more
        steps: raise ``T2.steps`` (the budget of all the learning rates tried together). The descent on
        the outputs needs the model to return a plain tensor that your loss reads as returned (one call of
        the model per loss); a loss computed inside the model (a transformers model given labels) is not
        descended on, and squashed outputs are then named only when they are probabilities.
        Soft targets (Mixup/CutMix, label smoothing: a float (batch, classes) distribution per row) leave the
        loss a floor above 0, their entropy: T2 measures that floor on the batch by descending on the outputs
        themselves and asks that ``min_reduction`` of the loss above it go; when the floor cannot be measured
        that way it says so and does not judge.
        A model set up by Lightning Fabric under a precision plugin that wants ``fabric.backward(loss)``
        (``bf16-mixed``, ``16-mixed``) is backpropagated as ``fabric.backward`` runs it on one device (its
        gradients unscaled); a strategy with a backward of its own (DeepSpeed) is not run through.
    Not applicable
        GRPO, RLOO and other trainers that generate their completions inside each step (a generation buffer):
        their loss is computed on those completions, so there is no fixed batch to memorise.
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
    # a step that updates the weights itself (no optimizer object in the state): T2 runs that step on the batch, on
    # fresh objects of its own (the step may keep what it likes in the state)
    own = _own_update_state(setup, fresh)
    if own is not None:
        own = run_or_skip(dlcheck, setup.state)
        fresh = Fresh(
            own["model"],
            lambda b, m=own["model"]: setup.loss_of(m, to_device(b, device_of(m))),
            lambda: (None, None),
            owner=own,
        )
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
    floor_note, floor = "", 0.0
    if soft_targets(targets_of(batch)):
        # soft targets (Mixup/CutMix, label smoothing): a cross-entropy against a distribution cannot go below its
        # entropy, so the share is taken of what lies above the loss's own floor on this batch, measured by
        # descending on the outputs themselves (the weights left out)
        floors = _floors(fresh, batch, fixed, None, -math.inf)
        start.restore(model)
        if floors is None:
            dlcheck.skip(
                f"not judged: the batch's targets are soft ({describe_batch(targets_of(batch))}: Mixup/CutMix or label "
                "smoothing), so the loss has a floor above 0 on it, and that floor could not be measured (the loss does "
                "not read the model's output tensor as returned): a share of the loss is no target"
            )
        floor = floors.free
        if first - floor <= 1e-6 * max(1.0, abs(first)):
            dlcheck.skip(
                f"not judged: batch 0's loss {first:.4g} is at the floor its soft targets leave ({floor:.4g}): nothing "
                "above it to cut"
            )
        target = floor + (first - floor) * (1 - dlcheck.setting("min_reduction"))
        floor_note = (
            f"; the targets are soft ({describe_batch(targets_of(batch))}), so the loss cannot go below "
            f"{floors.free:.4g} on this batch (reached by the outputs themselves, the weights left out): "
            f"{dlcheck.setting('min_reduction'):.0%} of the loss above that floor must go (target {target:.4g})"
        )
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

    def own_attempt(cap: int) -> float:
        """At most ``cap`` calls of the user's step on the batch (its own update at its own rate, the model's
        randomness drawn the same way at every call); stops under the target or at a non-finite loss."""
        start.restore(model)
        curve: list[float] = []
        curves["your step's own update"] = curve
        with modes(model, train=True):
            for i in range(cap + 1):
                with torch.no_grad():
                    value = float(fixed(lambda: fresh.loss(batch)))
                curve.append(value)
                if i == cap or (i and (not math.isfinite(value) or value <= target)):
                    break
                fixed(lambda i=i: setup.step(own, batch, i))
        moved.append(digest(model) != digest_start)
        attempts.append((1.0, math.nan, value, i, False))
        return value

    def attempt(mult: float, cap: int, may_move_up: bool) -> float:
        """At most ``cap`` steps at ``mult`` x the base LR; stops under the target, at a non-finite loss, or
        (``may_move_up``) once the loss falls too slowly to reach the target in ``cap``."""
        if own is not None:
            return own_attempt(cap)
        start.restore(model)
        opt, _ = run_or_skip(dlcheck, fresh.make_optimizer)
        if opt is None:
            dlcheck.skip(f"{setup.describe()} gives no optimizer")
        base_lr(opt)
        needs_closure = _needs_closure(opt)
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
                with own_backward():
                    loss.backward()
                if needs_closure:
                    # LBFGS (time_sequence_prediction): the optimizer re-evaluates the loss itself, as the user's
                    # step hands it a closure (it had raised a TypeError inside T2: blind set 11)
                    def closure() -> Any:
                        opt.zero_grad(set_to_none=True)
                        again = fixed(lambda: fresh.loss(batch))
                        with own_backward():
                            again.backward()
                        return again

                    opt.step(closure)
                else:
                    opt.step()
        opt.zero_grad(set_to_none=True)
        attempts.append((mult, lr, value, i, early))
        return value

    def diverged(value: float) -> bool:
        return not math.isfinite(value) or value > first

    seen = OutputRange()  # the outputs fed to the loss at every step of every attempt
    digest_start = digest(model)
    moved: list[bool] = []  # a step's own update: whether its calls changed the weights at all

    def rate(mult: float, lr: float) -> str:
        return "your step's own update" if own is not None else f"lr {lr:.3g} ({mult:.3g}x)"

    watch = model.register_forward_hook(lambda _m, _i, out: seen.see(out))
    try:
        # your learning rate first (about half the budget); up the ladder while the loss falls too slowly, down it
        # when it diverges; the steps of all the attempts together stay within the budget
        ladder = [1.0]
        while ladder and left() > 0:
            mult = ladder.pop(0)
            # a step's own update has no rate T2 can set: the whole budget goes to it
            cap = left() if own is not None or (not ladder and mult != 1.0) else math.ceil(left() / 2)
            last = attempt(mult, cap, may_move_up=mult >= 1.0 and (mult == 1.0 or bool(ladder)))
            if math.isfinite(last) and last <= target:
                others = "; ".join(
                    f"{rate(a_mult, a_lr)}: {a_last:.4g} after {_steps(a_n)}"
                    for a_mult, a_lr, a_last, a_n, _ in attempts[:-1]
                )
                where = (
                    f"{attempts[-1][3]} calls of dlcheck_train_step on that batch alone (its own update: no optimizer "
                    "object)"
                    if own is not None
                    else f"{_steps(attempts[-1][3])} on that batch alone at lr {attempts[-1][1]:.3g} ({mult:.3g}x your "
                    "base LR)"
                )
                dlcheck.measured(
                    f"batch 0 loss {first:.4g} -> {last:.4g} after {where}, train mode, the model's randomness held fixed: {(first - last) / (first - floor):.0%} less{' of the loss above its floor' if floor_note else ''}, "
                    f"{dlcheck.setting('min_reduction'):.0%} needed"
                    + (f" (also tried: {others})" if others else "")
                    + floor_note
                    + (
                        f"; at your base LR the loss diverged on this batch ({attempts[0][2]:.4g}): without the "
                        "scheduler's warmup that rate is too high for it"
                        if mult < 1.0 and attempts and diverged(attempts[0][2])
                        else ""
                    ),
                    first_loss=round(first, 6),
                    last_loss=round(last, 6),
                    lr=None if own is not None else attempts[-1][1],
                    lr_multiplier=mult,
                    steps=attempts[-1][3],
                    steps_in_all=budget - left(),
                    max_steps=budget,
                )
                return
            if own is not None:
                break  # the step's own rate is the only one
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
        watch.remove()
        start.restore(model)
        picture()

    spent = budget - left()
    tried = "; ".join(
        f"{rate(mult, lr)}: {last:.4g} after {_steps(n)}" + (" (falling too slowly: moved up)" if early else "")
        for mult, lr, last, n, early in attempts
    )
    evidence = [
        f"batch 0 loss {first:.4g} before; on that batch alone, {spent} steps in all (T2.steps={budget}): {tried}; "
        f"the target was {target:.4g} ({dlcheck.setting('min_reduction'):.0%} less){floor_note}"
    ]
    example = decode_example(dlcheck, batch)
    if example:
        evidence.append(f"batch 0, example 0: {example}")
    squash = seen.squash
    try:
        floors = _floors(fresh, batch, fixed, squash, target)
    except Exception:  # noqa: BLE001 - the user's loss fed outputs it may not take: no floor, no verdict from it
        floors = None
    start.restore(model)  # the floors' forward updated BatchNorm's running statistics
    best = min(a[2] for a in attempts if math.isfinite(a[2])) if any(math.isfinite(a[2]) for a in attempts) else first
    out = None
    if floors is None:
        with modes(model, train=False), torch.no_grad():
            try:
                out = output_tensor(fresh.forward(batch))
            except Exception:  # noqa: BLE001 - the model takes the batch only through the user's loss
                out = None
    if squash and floors is not None and floors.confined is not None and floors.confined > target >= floors.free:
        # conclusive: no weights can halve the loss, because of how the outputs are confined
        kept = {
            "simplex": "the model's outputs are probabilities: every row of its output sums to 1",
            "unit": "the model's outputs lie within [0, 1]",
            "symmetric": "the model's outputs lie within [-1, 1]",
        }[squash]
        evidence += [
            f"{kept} at every one of the {seen.forwards} forwards of those steps, up to the highest learning rate "
            f"tried (they spanned [{seen.lo:.6g}, {seen.hi:.6g}])",
            f"descending on the outputs themselves (the weights left out, up to {FLOOR_STEPS} steps): kept so, the "
            f"loss on batch 0 goes no lower than {floors.confined:.4g}, above the target {target:.4g}; left free, it "
            f"reaches {floors.free:.4g} in {_steps(floors.free_steps)}",
        ]
        cause, fix = {
            "simplex": (
                "the model ends with a softmax and the loss applies log-softmax again (CrossEntropyLoss expects "
                f"logits): over probabilities the loss cannot go below {floors.confined:.4g}, whatever the weights",
                "return logits: drop the final softmax (nn.Softmax / torch.softmax) from the model; apply it only at "
                "inference",
            ),
            "unit": (
                "the model squashes its outputs into [0, 1] (a final sigmoid) and the loss expects logits "
                "(BCEWithLogitsLoss applies the sigmoid itself): over outputs in [0, 1] the loss saturates at "
                f"{floors.confined:.4g}, whatever the weights",
                "return logits: drop the final sigmoid (torch.sigmoid / nn.Sigmoid) from the model and keep "
                "BCEWithLogitsLoss; apply the sigmoid only at inference",
            ),
            "symmetric": (
                "the model squashes its outputs into [-1, 1] (a final tanh) and the loss needs values beyond: over "
                f"outputs in [-1, 1] the loss cannot go below {floors.confined:.4g}, whatever the weights",
                "return the unsquashed outputs: drop the final tanh (nn.Tanh / torch.tanh) from the model",
            ),
        }[squash]
    elif (
        floors is None
        and out is not None
        and out.dim() >= 2
        and out.is_floating_point()
        and bool((out >= 0).all())
        and torch.allclose(out.float().sum(-1), torch.ones(out.shape[:-1]), atol=1e-3)
    ):
        # the loss could not be descended on through the model's output (a loss computed inside the model)
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
    elif own is not None and abs(best - first) <= 1e-6 * max(1.0, abs(first)):
        evidence.append(
            f"{attempts[-1][3]} calls of dlcheck_train_step on batch 0 "
            + ("changed the weights, but not the loss" if moved and moved[-1] else "left every weight as it was")
        )
        cause = (
            "the loss does not move at all: the step's own update changes nothing the loss depends on (a learning "
            "rate of 0, an update applied to other tensors than the state's model's parameters, or a loss detached "
            "from the outputs; see T3)"
            if moved and moved[-1]
            else "the loss does not move at all: your step's own update leaves the weights unchanged (a learning "
            "rate of 0, or an update applied to other tensors than state['model']'s parameters)"
        )
        fix = (
            "update the model's parameters with a non-zero learning rate (p.data.add_(p.grad, alpha=-lr)), or hand "
            "the step an optimizer over model.parameters()"
        )
    elif (
        own is not None
        and all(math.isfinite(a[2]) and a[2] > first for a in attempts)
        and (
            (cos := _update_direction(model, start, fixed, fresh, batch, lambda: setup.step(own, batch, 0))) is not None
            and cos > 0
        )
    ):
        evidence.append(
            f"the first call of dlcheck_train_step moved the weights along the gradient of the loss on batch 0 "
            f"(cosine {cos:+.2f} between the update and the gradient; a descent step has a negative one): the step "
            "climbs the loss"
        )
        cause = (
            "your step's own update goes up the gradient, not down: it adds the gradient to the weights "
            "(p.data.add_(p.grad, alpha=lr)) or differentiates a negated loss"
        )
        fix = "subtract the gradient: p.data.add_(p.grad, alpha=-lr), and differentiate the loss to minimise"
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
        measured = ""
        if floors is not None:
            measured = (
                f"; descending on the model's outputs themselves (the weights left out), the loss on batch 0 reaches "
                f"{floors.free:.4g}, under the target {target:.4g}"
                + (
                    f", and {floors.confined:.4g} with the outputs kept {SQUASHES[squash]} as the model keeps them"
                    if squash and floors.confined is not None
                    else f"; the outputs are not confined away from it (they spanned {seen.lo:.4g} to {seen.hi:.4g} "
                    "at the steps)"
                    if seen.forwards
                    else ""
                )
                + ": nothing shows that no weights can reach it"
            )
        dlcheck.skip(
            f"not conclusive: batch 0 loss {first:.4g} {how} in {spent} steps on that batch alone, "
            + (
                "at your step's own update (T2 cannot set the rate of a step without an optimizer object)"
                if own is not None
                else "all the learning rates together"
            )
            + f" ({tried}); {dlcheck.setting('min_reduction'):.0%} less was needed{floor_note}{measured} — "
            f"raise T2.steps to judge it (now {budget}: the budget of every rate tried)"
        )
    dlcheck.fail(evidence, cause, fix)


def _own_update_state(setup: Any, fresh: Any) -> bool | None:
    """True when the training is a plain loop (or Accelerate) whose own ``dlcheck_train_step`` updates the weights
    itself: no optimizer object anywhere in the training state; None otherwise."""
    state = getattr(fresh, "owner", None)
    if setup is None or getattr(setup, "kind", None) not in ("loop", "accelerate"):
        return None
    if getattr(setup, "train_step", MISSING) is MISSING or not isinstance(state, dict):
        return None
    if state.get("optimizer") is not None or any(isinstance(v, torch.optim.Optimizer) for v in state.values()):
        return None
    return True if isinstance(state.get("model"), torch.nn.Module) else None


def _update_direction(model, start, fixed, fresh, batch, call) -> float | None:
    """The cosine between the first update of a step that updates the weights itself and the gradient of the loss
    on ``batch`` at the start (both from the start's weights, the randomness held fixed); None when either is 0.
    The model is put back at the start."""
    start.restore(model)
    params = [p for p in model.parameters() if p.requires_grad]
    try:
        with modes(model, train=True):
            loss = fixed(lambda: fresh.loss(batch))
            with own_backward():
                grads = torch.autograd.grad(loss, params, allow_unused=True)
            before = [p.detach().clone() for p in params]
            fixed(call)
        dot = sum(
            float(((p.detach() - b) * g).double().sum()) for p, b, g in zip(params, before, grads) if g is not None
        )
        size = math.sqrt(sum(float((p.detach() - b).double().pow(2).sum()) for p, b in zip(params, before)))
        gsize = math.sqrt(sum(float(g.double().pow(2).sum()) for g in grads if g is not None))
    finally:
        start.restore(model)
    return dot / (size * gsize) if size > 0 and gsize > 0 else None


def _needs_closure(opt: Any) -> bool:
    """Whether the optimizer's step requires a closure that re-evaluates the loss (torch.optim.LBFGS)."""
    import inspect

    try:
        param = inspect.signature(type(opt).step).parameters.get("closure")
    except (TypeError, ValueError):
        return False
    return param is not None and param.default is inspect.Parameter.empty
