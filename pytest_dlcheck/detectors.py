"""The runtime detectors, shared by the smoke checks and the watch of a real run.

S1-S5 judge a short run inside pytest (``checks/smoke``), R1 a run's log (``checks/rl``), and
:mod:`pytest_dlcheck.watch` runs the same detectors during the user's own training. Their logic and their
thresholds live here once: plain numbers in, a verdict out, nothing imported but the registry's
:class:`Setting` (no torch), so both sides judge a run the same way and ``--dlcheck-set S2.factor=5`` and
``watch(overrides={"S2.factor": 5})`` move the same number.

Each ``*Watch`` class is fed one point at a time (a step's loss, a gradient norm, a logged reward) and
returns a finding at the first point that fails; the checks feed it a smoke run's points, the watch a
real run's."""

from __future__ import annotations

import math
import statistics
from collections import deque
from dataclasses import dataclass, field

from .registry import Setting

LN2 = math.log(2)

#: the detectors' thresholds, by check ID: the checks declare exactly these (``@check(settings=...)``)
SETTINGS: dict[str, tuple[Setting, ...]] = {
    "S1": (
        Setting(
            "steps",
            20,
            "optimizer steps of the shared smoke run (sets the run of every smoke check, S1-S5): enough "
            "for a divergence or an fp16 update to show, a few seconds for a small model",
        ),
        Setting(
            "max_micro_steps",
            160,
            "the most micro-batches (forward and backward passes) the smoke run may take: S1.steps optimizer "
            "steps at a gradient accumulation of up to 8; beyond it the run makes as many optimizer steps as fit "
            "and says so, so that its cost stays that of a few seconds for a small model",
        ),
    ),
    "S2": (
        Setting(
            "factor",
            3.0,
            "a step's loss above this multiple of the mean of the previous steps is a spike; batch to "
            "batch noise of a healthy run stays well within 2x",
        ),
        Setting(
            "window",
            5,
            "how many previous steps the running mean covers (and the last steps whose median "
            "is the run's current level, for ``rise``)",
        ),
        Setting(
            "warmup",
            3,
            "first steps never judged as spikes (the running mean needs a few values); the lowest loss among "
            "them is where the run began, for ``rise``",
        ),
        Setting(
            "rise",
            3.0,
            "the median of the last ``window`` losses above this multiple of the lowest of the first ``warmup`` "
            "is a run that diverged from its start: a healthy run's loss falls or stays where it began, and "
            "batch-to-batch noise stays well within 2x; compared with the run's start, not with recent steps, "
            "so a loss that climbs steadily, or jumps at its second step and stays there, is caught too",
        ),
    ),
    "S3": (
        Setting(
            "factor",
            10.0,
            "a step's gradient norm above this multiple of the median of the first steps is an "
            "explosion; healthy runs drift by a few x at most over a short run",
        ),
        Setting("baseline", 3, "how many first steps give the reference median"),
    ),
    "S4": (
        Setting(
            "tol",
            1e-3,
            "a step's loss within this of ln 2 = 0.6931 counts as pinned; a DPO run that learns "
            "leaves ln 2 by far more within its first steps",
        ),
    ),
    "S5": (
        Setting(
            "max_ratio",
            1.5,
            "eval loss / train loss above which the gap fails (both in eval mode on sampled "
            "batches); a model that generalises keeps them within a few tens of percent over a short run",
        ),
        Setting(
            "min_gap",
            0.3,
            "and the eval loss must exceed the train loss by at least this many nats, so that "
            "near-zero losses do not make the ratio meaningless",
        ),
    ),
    "R1": (
        Setting(
            "min_points",
            5,
            "logged steps needed before the detector judges: a baseline of at least 3 steps before the step it tests",
        ),
        Setting(
            "reward_jump",
            5.0,
            "how many baseline spreads (median absolute deviation, at least 5% of the "
            "reward scale) a reward must move in one logged step to count as a jump; steady learning moves "
            "a little every step",
        ),
        Setting("kl_spike", 10.0, "factor over the baseline median KL (at least 1e-3) that counts as a KL spike"),
        Setting(
            "length_collapse",
            0.5,
            "a completion / episode length below this fraction of its baseline median counts as a collapse",
        ),
    ),
}

TITLES = {
    "S1": "NaN/Inf loss, gradients or weights",
    "S2": "loss spike",
    "S3": "gradient norm explodes",
    "S4": "DPO loss pinned at ln 2 / preference accuracy at chance",
    "S5": "train/eval loss gap beyond a threshold",
    "R1": "reward hacking or collapse",
}


def defaults(check_id: str) -> dict[str, object]:
    return {s.name: s.default for s in SETTINGS[check_id]}


def resolve(overrides: dict[str, object] | None) -> dict[str, dict[str, object]]:
    """Every detector's settings with ``{"S2.factor": 5}``-style overrides applied (parsed and checked as
    ``--dlcheck-set`` does: an unknown ID or name is an error, not silence)."""
    out = {cid: defaults(cid) for cid in SETTINGS}
    for key, value in (overrides or {}).items():
        cid, _, name = str(key).partition(".")
        if cid not in SETTINGS:
            raise ValueError(f"overrides: {key!r}: no runtime detector {cid!r} (choose from {', '.join(SETTINGS)})")
        known = {s.name: s for s in SETTINGS[cid]}
        if name not in known:
            raise ValueError(f"overrides: {key!r}: {cid} has no setting {name!r} (it has {', '.join(known)})")
        out[cid][name] = known[name].parse(str(value)) if isinstance(value, str) else type(known[name].default)(value)
    return out


# --------------------------------------------------------------------------------------------------
# S1: NaN/Inf


def diverged_before(finite_losses: list[float]) -> bool:
    """The losses before a non-finite one rose (to over twice the first): the run diverged into it."""
    return len(finite_losses) >= 3 and finite_losses[-1] > 2 * finite_losses[0]


#: (cause, fix) by what went non-finite first; ``{lr}`` is the step's learning rate
NONFINITE = {
    "diverging": (
        "the training diverges: at learning rate {lr} the loss grows until it overflows",
        "lower the learning rate (or add warmup and gradient clipping, e.g. max_grad_norm=1.0)",
    ),
    "forward": (
        "the forward pass produced a non-finite loss (an overflow or an undefined operation; T5 finds the module)",
        "run pytest --dlcheck=T5 to find the first module with a non-finite output; normalise the inputs, train in "
        "bfloat16 or float32",
    ),
    "backward": (
        "the backward pass overflowed (float16 gradients beyond 65504, or the derivative of sqrt/log at 0)",
        "scale the loss with a GradScaler (torch.amp.GradScaler) or train in bfloat16; clip gradients; add eps "
        "inside sqrt/log/norm",
    ),
    "update": (
        "the optimizer update itself produced NaN/Inf from finite gradients (an overflow in its state, or an eps "
        "too small for the dtype)",
        "keep float32 master weights (autocast + GradScaler, or bfloat16), and check the optimizer's eps and "
        "learning rate",
    ),
}


# --------------------------------------------------------------------------------------------------
# S2: loss spike


@dataclass
class Spike:
    step: int
    loss: float
    mean: float
    previous: list[float]

    @property
    def ratio(self) -> float:
        return self.loss / self.mean


class SpikeWatch:
    """S2: feed finite, positive losses in order; ``add`` returns the first :class:`Spike` (a loss above
    ``factor`` x the mean of the ``window`` previous ones, after ``warmup`` losses)."""

    def __init__(self, factor: float, window: int, warmup: int):
        self.factor, self.window, self.warmup = factor, window, warmup
        self.previous: deque[float] = deque(maxlen=window)
        self.seen = 0
        self.worst: tuple[float, int | None] = (0.0, None)  # (loss / running mean, step)

    def add(self, step: int, loss: float) -> Spike | None:
        hit = None
        if self.seen >= self.warmup and self.previous:
            mean = sum(self.previous) / len(self.previous)
            ratio = loss / mean
            if ratio > self.worst[0] or self.worst[1] is None:
                self.worst = (ratio, step)
            if loss > self.factor * mean:
                hit = Spike(step, loss, mean, list(self.previous))
        self.previous.append(loss)
        self.seen += 1
        return hit


@dataclass
class Rise:
    """S2 against the run's start: the median of the last losses far above where the run began."""

    step: int
    level: float  # the median of the last ``window`` losses
    start: float  # the lowest of the first ``warmup`` losses
    start_step: int
    last: list[tuple[int, float]]  # the (step, loss) points the median is taken over

    @property
    def ratio(self) -> float:
        return self.level / self.start


class RiseWatch:
    """S2 against the start: feed finite, positive losses in order; the lowest of the first ``start`` is
    where the run began, and ``add`` returns the first :class:`Rise` (the median of the last ``window``
    losses above ``factor`` x it). A running mean that follows the run cannot see a loss that climbs
    steadily, or one that jumps at step 2 and stays there: the start can."""

    def __init__(self, factor: float, window: int, start: int):
        self.factor, self.window, self.start_n = factor, max(1, int(window)), max(1, int(start))
        self.first: list[tuple[int, float]] = []
        self.last: deque[tuple[int, float]] = deque(maxlen=self.window)
        self.worst: tuple[float, int | None] = (0.0, None)  # (median of the last / start, step)

    @property
    def start(self) -> tuple[int, float] | None:
        return min(self.first, key=lambda t: t[1]) if self.first else None

    def add(self, step: int, loss: float) -> Rise | None:
        if len(self.first) < self.start_n:
            self.first.append((step, loss))
        self.last.append((step, loss))
        begin = self.start
        if begin is None or begin[1] <= 0 or len(self.last) < self.window:
            return None
        level = statistics.median(v for _, v in self.last)
        ratio = level / begin[1]
        if ratio > self.worst[0] or self.worst[1] is None:
            self.worst = (ratio, step)
        if ratio > self.factor:
            return Rise(step, level, begin[1], begin[0], list(self.last))
        return None


def divergence(
    losses: list[tuple[int, float]], factor: float, window: int, warmup: int, rise: float
) -> tuple[Spike | Rise | None, SpikeWatch, RiseWatch]:
    """S2 over a whole run's finite, positive (step, loss) points: the first spike over the running mean
    or rise over the start (a spike first when both come at one step), and the two watches (their worst)."""
    spikes, rises = SpikeWatch(factor, window, warmup), RiseWatch(rise, window, warmup)
    for step, value in losses:
        hit = spikes.add(step, value)
        up = rises.add(step, value)
        if hit is not None or up is not None:
            return (hit if hit is not None else up), spikes, rises
    return None, spikes, rises


SPIKE_FIX = (
    "lower the learning rate (by 10x to start), add warmup (warmup_steps / a LambdaLR ramp) and clip "
    "gradients (max_grad_norm=1.0, torch.nn.utils.clip_grad_norm_)"
)


def spike_cause(lr_text: str) -> str:
    return (
        f"the run diverges: each update overshoots, so the loss climbs instead of falling ({lr_text} is "
        "too high for this model and optimizer, or there is no warmup / gradient clipping)"
    )


def lr_text(lr: float | None) -> str:
    return f"lr {lr:.3g}" if lr is not None else "lr unknown"


# --------------------------------------------------------------------------------------------------
# S3: gradient norm explosion


@dataclass
class Explosion:
    step: int
    norm: float
    reference: float

    @property
    def ratio(self) -> float:
        return self.norm / self.reference


class GradWatch:
    """S3: feed finite gradient norms in order; the median of the first ``baseline`` is the reference, and
    ``add`` returns the first :class:`Explosion` above ``factor`` x it. ``reference`` stays None until the
    baseline is complete; a reference of 0 judges nothing."""

    def __init__(self, factor: float, baseline: int):
        self.factor, self.baseline = factor, baseline
        self.first: list[float] = []
        self.reference: float | None = None
        self.worst: tuple[float, int | None] = (0.0, None)

    def add(self, step: int, norm: float) -> Explosion | None:
        if self.reference is None:
            self.first.append(norm)
            if len(self.first) == self.baseline:
                self.reference = statistics.median(self.first)
            return None
        if self.reference <= 0:
            return None
        if norm / self.reference > self.worst[0] or self.worst[1] is None:
            self.worst = (norm / self.reference, step)
        return Explosion(step, norm, self.reference) if norm > self.factor * self.reference else None


GRAD_FIX = (
    "lower the learning rate, add warmup, and clip gradients (max_grad_norm=1.0 / "
    "torch.nn.utils.clip_grad_norm_(…, 1.0))"
)


def grad_cause(lr_text: str) -> str:
    return (
        f"the gradients explode: the updates at {lr_text} push the weights to where the loss is steep, "
        "and each step makes the next gradient larger"
    )


# --------------------------------------------------------------------------------------------------
# S4: a preference loss pinned at ln 2


def off_ln2(losses: list[tuple[int, float]], tol: float) -> list[tuple[int, float]]:
    """The (step, loss) points that leave ln 2 by more than ``tol``: none means the loss is pinned."""
    return [(s, v) for s, v in losses if abs(v - LN2) > tol]


def ahead_of_reference(accuracies: list[float]) -> bool:
    """The logged preference accuracy rose above chance: the policy does get ahead of its reference."""
    return bool(accuracies) and max(accuracies) > 0.5


PINNED_CAUSE = (
    "the policy does not move away from the reference: chosen and rejected completions are identical, the "
    "updates are too small to show, or the reference follows the policy"
)
PINNED_FIX = "check that chosen and rejected differ, the learning rate, and that ref_model is an independent copy"
SHARED_REF_CAUSE = (
    "the reference model shares its parameters with the policy (a shallow copy, or the same submodules): every "
    "update moves the reference too, so policy/reference log-ratios stay 0 and the loss stays ln 2"
)
SHARED_REF_FIX = (
    "give DPOTrainer an independent reference: ref_model=copy.deepcopy(model), or ref_model=None with a model "
    "loaded from a path"
)


# --------------------------------------------------------------------------------------------------
# S5: train/eval gap


def first_negative(losses) -> tuple | None:
    """The first (step, loss) below 0 of ``losses`` ((step, loss) pairs), or None. A loss that takes negative values
    (a policy-gradient objective such as GRPO's, centred on 0 by its baseline) is no measure of fit: a multiple of
    it (S2's spike, S5's train/eval ratio) means nothing."""
    return next(((s, v) for s, v in losses if v is not None and v < 0), None)


NEGATIVE_LOSS = "the loss takes negative values ({where}: {value:.4g}; a policy-gradient objective such as GRPO's)"


def gap_exceeded(train_loss: float, eval_loss: float, max_ratio: float, min_gap: float) -> tuple[bool, float]:
    """(the eval loss is beyond ``max_ratio`` x and ``min_gap`` nats above the train loss, the ratio)."""
    ratio = eval_loss / train_loss if train_loss > 0 else float("inf")
    return ratio > max_ratio and eval_loss - train_loss > min_gap, ratio


MEMORISE_FIX = (
    "check that each label belongs to its input (a misaligned join or shuffle), use more (deduplicated) "
    "training data, regularise (weight decay, dropout) or stop earlier"
)


# --------------------------------------------------------------------------------------------------
# R1: reward hacking


@dataclass
class RewardJump:
    step: int
    reward: float
    median: float
    z: float
    signs: list[str] = field(default_factory=list)


class RewardWatch:
    """R1: feed (step, reward, kl, length) per logged step, kl/length None where not logged. From the 4th
    point on, a reward more than ``reward_jump`` spreads (median absolute deviation, at least 5 % of the
    reward scale) from the median before it is a jump; a jump that comes with a KL above ``kl_spike`` x
    its median or a length below ``length_collapse`` x its median is returned (hacking or collapse); a
    jump with neither is kept in ``unpaired`` (learning). ``horizon`` bounds the baseline to the last
    points (a long run; None: every point before)."""

    def __init__(self, reward_jump: float, kl_spike: float, length_collapse: float, horizon: int | None = None):
        self.jump, self.kl_spike, self.length_collapse = reward_jump, kl_spike, length_collapse
        self.rewards: deque[float] = deque(maxlen=horizon)
        self.kls: deque[float] = deque(maxlen=horizon)
        self.lengths: deque[float] = deque(maxlen=horizon)
        self.largest: tuple[float, int | None] = (0.0, None)
        #: (the highest KL / its baseline, step, that KL, the baseline: the median before, at least 1e-3)
        self.kl_most: tuple[float, int, float, float] | None = None
        self.len_least: tuple[float, int] | None = None
        self.unpaired: list[int] = []

    def add(
        self, step: int, reward: float, kl: float | None = None, length: float | None = None, names=("kl", "length")
    ) -> RewardJump | None:
        hit = None
        if len(self.rewards) >= 3:
            base = list(self.rewards)
            median = statistics.median(base)
            mad = statistics.median(abs(b - median) for b in base)
            spread = max(mad, 0.05 * max(max(abs(b) for b in base), 1e-3), 1e-6)
            z = (reward - median) / spread
            if abs(z) > abs(self.largest[0]) or self.largest[1] is None:
                self.largest = (z, step)
            signs = []
            if kl is not None and self.kls:
                kl_med = max(statistics.median(self.kls), 1e-3)
                if self.kl_most is None or kl / kl_med > self.kl_most[0]:
                    self.kl_most = (kl / kl_med, step, kl, kl_med)
                if kl > self.kl_spike * kl_med:
                    signs.append(f"{names[0]} {kl:.3g} vs median {kl_med:.3g} before ({kl / kl_med:.3g}×)")
            if length is not None and self.lengths:
                len_med = statistics.median(self.lengths)
                if len_med > 0 and (self.len_least is None or length / len_med < self.len_least[0]):
                    self.len_least = (length / len_med, step)
                if len_med > 0 and length < self.length_collapse * len_med:
                    signs.append(f"{names[1]} {length:.3g} vs median {len_med:.3g} before")
            if abs(z) >= self.jump:
                if signs:
                    hit = RewardJump(step, reward, median, z, signs)
                else:
                    self.unpaired.append(step)
        self.rewards.append(reward)
        if kl is not None:
            self.kls.append(kl)
        if length is not None:
            self.lengths.append(length)
        return hit


REWARD_FIX = (
    "read sampled completions at that step; fix the reward (score the content, penalise empty or repeated "
    "outputs, cap length terms) and keep a KL term to the reference (GRPOConfig(beta=0.04))"
)


def reward_cause(z: float) -> str:
    if z > 0:
        return (
            "the reward rose abruptly exactly when the policy left its reference distribution or shortened its "
            "outputs: the signature of reward hacking — the policy found a flaw in the reward, not the task"
        )
    return "the reward collapsed together with the outputs (mode collapse): the policy degenerated"


#: where a training log keeps the reward, the KL and the completion (or episode) length R1 watches: TRL's
#: GRPO/PPO keys, then SB3's
LOG_KEYS = {
    "reward": ("reward", "rewards/mean", "rollout/ep_rew_mean", "ep_rew_mean", "env/reward_mean"),
    "kl": ("kl", "objective/kl", "train/approx_kl", "approx_kl"),
    "length": ("completions/mean_length", "rollout/ep_len_mean", "ep_len_mean", "completion_length"),
}


def shared_parameters(policy, ref) -> list[str]:
    """Names of the reference's parameters that share storage with the policy's (S4's cause)."""
    if policy is None or ref is None:
        return []
    ptrs = {p.data_ptr() for p in policy.parameters()}
    return [n for n, p in ref.named_parameters() if p.data_ptr() in ptrs]
