"""Shared measurement of the rl domain: the rollout convention of the user's advantage function, the
reference GAE/returns implementation and the mistakes it recognises, Hypothesis strategies for rollouts
and GRPO reward groups, Stable-Baselines3 adapters (rollout buffer GAE, a short policy rollout on a copy
of the user's env), running-statistics extraction for checkpoint round-trips, and observation scales.

Importing this module imports numpy only; hypothesis, torch, gymnasium and stable_baselines3 are imported
inside the functions that need them. Users may use :func:`rollouts` and :func:`reward_groups` in their
own Hypothesis tests, and :func:`advantage_fn` to declare how R7 calls their function."""

from __future__ import annotations

import copy
import dataclasses
import hashlib
import inspect
import math
import re
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import numpy as np

from ... import detectors
from ...errors import RoleError
from ...guard import eval_mode
from ...session import user_call

SAME_STEP, NEXT_STEP = "same_step", "next_step"
AUTORESET_MODES = (SAME_STEP, NEXT_STEP)


# --------------------------------------------------------------------------------------------------
# the rollout convention


@dataclass(frozen=True)
class Rollout:
    """One rollout of ``T`` steps on ``N`` environments, as a PPO-style loop stores it. Arrays are
    ``(T, N)``: float32 for numbers; flags are bool numpy arrays (as gymnasium returns them), or float32
    tensors of 0/1 after :meth:`as_torch` (as CleanRL stores them).

    - ``rewards[t]``: the reward of step t.
    - ``values[t]``: V(obs_t), the critic's value of the observation step t acted on.
    - ``terminated[t]``, ``truncated[t]``: the flags ``env.step`` returned at step t (both may be set;
      termination wins: no bootstrap).
    - ``next_values[t]``: the value of the observation step t led to: V(obs_t+1) inside an episode;
      V(final observation) where step t ended the episode (SB3's ``info["terminal_observation"]``,
      gymnasium's ``info["final_obs"]``); V(observation after the rollout) at t = T-1.
    - ``episode_starts[t]``: obs_t is the first observation of an episode (SB3's ``episode_starts[t]``;
      CleanRL's ``dones[t]`` under gymnasium < 1.0's same-step autoreset); row 0 comes from the previous
      rollout.
    - ``reset_steps[t]``: only with ``autoreset == "next_step"`` (gymnasium 1.x vector envs' default):
      step t is the autoreset step after an episode end (action ignored, reward 0, obs_t the final
      observation); its advantage is not compared and should be masked out of the loss. CleanRL's
      ``dones[t]`` on gymnasium 1.x vector envs are these flags (its ``next_done`` is the step's
      ``terminations | truncations``, and the next step is the autoreset one).
    - ``gamma``, ``gae_lambda``: the discount and the GAE λ to use.
    """

    rewards: Any
    values: Any
    terminated: Any
    truncated: Any
    next_values: Any
    episode_starts: Any
    reset_steps: Any
    gamma: float
    gae_lambda: float
    autoreset: str = SAME_STEP

    @property
    def num_steps(self) -> int:
        return int(self.rewards.shape[0])

    @property
    def num_envs(self) -> int:
        return int(self.rewards.shape[1])

    @property
    def dones(self) -> Any:
        """terminated | truncated: the episode ended at step t (0./1. tensors after :meth:`as_torch`)."""
        if isinstance(self.terminated, np.ndarray):
            return np.logical_or(self.terminated, self.truncated)
        return (self.terminated + self.truncated).clamp(max=1.0)

    @property
    def last_values(self) -> Any:
        """V(observation after the rollout), per env: ``next_values[-1]``."""
        return self.next_values[-1]

    @property
    def last_dones(self) -> Any:
        """The episode ended at the rollout's last step, per env (SB3's ``dones`` argument)."""
        return self.dones[-1]

    def copy(self) -> Rollout:
        return dataclasses.replace(self, **{f: np.array(getattr(self, f)) for f in ARRAY_FIELDS})

    def as_torch(self) -> Rollout:
        """The same rollout as float32 torch tensors, flags as 0./1. (CleanRL's storage)."""
        import torch

        return dataclasses.replace(
            self, **{f: torch.tensor(np.asarray(getattr(self, f), np.float32)) for f in ARRAY_FIELDS}
        )


ARRAY_FIELDS = ("rewards", "values", "terminated", "truncated", "next_values", "episode_starts", "reset_steps")

#: parameter names R7 fills by keyword when the user's function takes them
PARAMETERS = {
    "rewards": "rewards",
    "values": "values",
    "terminated": "terminated",
    "terminations": "terminated",
    "truncated": "truncated",
    "truncations": "truncated",
    "next_values": "next_values",
    "episode_starts": "episode_starts",
    "reset_steps": "reset_steps",
    "last_values": "last_values",
    "next_value": "last_values",
    "last_dones": "last_dones",
    "gamma": "gamma",
    "gae_lambda": "gae_lambda",
    "lam": "gae_lambda",
    "lmbda": "gae_lambda",
}


@dataclass(frozen=True)
class AdvantageFn:
    """How R7 calls the user's advantage function (see :func:`advantage_fn`)."""

    fn: Callable[..., Any]
    arrays: str = "numpy"
    autoreset: str | None = None
    gamma: float | None = None
    gae_lambda: float | None = None
    source: str = "dlcheck_advantage_fn"

    def __call__(self, rollout: Rollout) -> Any:
        return call_advantage_fn(self, rollout)


def advantage_fn(
    fn: Callable[..., Any] | None = None,
    *,
    arrays: str = "numpy",
    autoreset: str | None = None,
    gamma: float | None = None,
    gae_lambda: float | None = None,
) -> Any:
    """Declare how R7 calls your GAE/returns function; usable as a decorator.

    ``fn`` takes either one :class:`Rollout`, or keyword parameters named after its fields
    (``rewards, values, terminated|terminations, truncated|truncations, next_values, episode_starts,
    reset_steps, last_values|next_value, last_dones, gamma, gae_lambda|lam``), and returns the
    advantages, ``(advantages, returns)``, or a dict with those keys, each ``(T, N)``.
    ``arrays="torch"`` passes float32 tensors; ``autoreset="next_step"`` generates rollouts laid out as
    gymnasium 1.x vector envs' default autoreset makes them (else inferred from dlcheck_env, or
    "same_step"); ``gamma``/``gae_lambda`` fix the discount your function uses."""
    if arrays not in ("numpy", "torch"):
        raise ValueError(f"arrays must be 'numpy' or 'torch', not {arrays!r}")
    if autoreset not in (None,) + AUTORESET_MODES:
        raise ValueError(f"autoreset must be one of {AUTORESET_MODES}, not {autoreset!r}")

    def wrap(f: Callable[..., Any]) -> AdvantageFn:
        return AdvantageFn(f, arrays, autoreset, gamma, gae_lambda)

    return wrap(fn) if fn is not None else wrap


def as_advantage_fn(obj: Any) -> AdvantageFn:
    if isinstance(obj, AdvantageFn):
        return obj
    if not callable(obj):
        raise RoleError("advantage_fn", f"is a {type(obj).__name__}, expected a callable (Rollout -> advantages)")
    return AdvantageFn(obj)


def _signature_plan(fn: Callable[..., Any]) -> list[str] | None:
    """Keyword parameters to fill, or None to pass the Rollout positionally."""
    try:
        params = list(inspect.signature(fn).parameters.values())
    except (TypeError, ValueError):
        return None
    named = [p for p in params if p.kind not in (p.VAR_POSITIONAL, p.VAR_KEYWORD)]
    required = [p for p in named if p.default is p.empty]
    if "dones" in [p.name for p in required]:
        raise RoleError(
            "advantage_fn",
            "takes a parameter named 'dones', which is ambiguous (CleanRL's dones flag the autoreset step on "
            "gymnasium 1.x, episode starts on older gymnasium; gymnasium's are terminated|truncated): wrap it, "
            "e.g. lambda r: f(..., dones=r.reset_steps) for CleanRL on gymnasium 1.x, see pytest_dlcheck.rl.Rollout",
        )
    if len(required) == 1 and required[0].name not in PARAMETERS:
        return None
    unknown = [p.name for p in required if p.name not in PARAMETERS]
    if unknown:
        raise RoleError(
            "advantage_fn",
            f"has required parameters {unknown} that R7 cannot fill: take one Rollout, or "
            f"parameters named {sorted(set(PARAMETERS))} (see pytest_dlcheck.rl.Rollout)",
        )
    return [p.name for p in named if p.name in PARAMETERS]


def call_advantage_fn(spec: AdvantageFn, rollout: Rollout) -> Any:
    r = rollout.copy()  # the function may work in place
    if spec.arrays == "torch":
        r = r.as_torch()
    plan = _signature_plan(spec.fn)
    if plan is None:
        return spec.fn(r)
    return spec.fn(**{name: getattr(r, PARAMETERS[name]) for name in plan})


def to_numpy(x: Any) -> np.ndarray:
    if hasattr(x, "detach"):
        x = x.detach().float().cpu().numpy()
    return np.asarray(x, dtype=np.float64)


def parse_advantage_output(out: Any, shape: tuple[int, int]) -> tuple[np.ndarray | None, np.ndarray | None]:
    """(advantages, returns) from what the user's function returned; either may be None."""
    if isinstance(out, dict):
        adv, ret = out.get("advantages"), out.get("returns")
    elif isinstance(out, (tuple, list)) and len(out) == 2:
        adv, ret = out
    else:
        adv, ret = out, None
    if adv is None and ret is None:
        raise RoleError("advantage_fn", "returned neither advantages nor returns")

    def fit(x: Any, what: str) -> np.ndarray | None:
        if x is None:
            return None
        try:
            a = to_numpy(x)
        except (TypeError, ValueError) as exc:
            raise RoleError(
                "advantage_fn",
                f"returned {what} as a {type(x).__name__} that is not numeric "
                f"({' '.join(str(exc).split())[:120]}): expected an array of shape {shape} (steps, envs)",
            ) from None
        if a.shape == shape:
            return a
        if a.size == shape[0] * shape[1] and (a.shape == (shape[0],) or a.shape == shape + (1,)):
            return a.reshape(shape)
        raise RoleError(
            "advantage_fn",
            f"returned {what} of shape {a.shape} for a rollout of {shape[0]} steps × "
            f"{shape[1]} envs; expected {shape} (steps, envs)",
        )

    return fit(adv, "advantages"), fit(ret, "returns")


# --------------------------------------------------------------------------------------------------
# the reference and the mistakes it recognises

#: mistakes a GAE commonly makes at episode ends: name -> the cause a failure names
VARIANTS = {
    "truncation_not_bootstrapped": (
        "done = terminated or truncated used for bootstrapping: a time-limit truncation is treated as a termination, "
        "so the value of the final observation is dropped and the cut-off episode looks like a real ending"
    ),
    "ends_ignored": (
        "the GAE ignores episode ends: it bootstraps from the next stored observation (the next episode's first "
        "one) and carries the λ-accumulation across the boundary"
    ),
    "chain_not_cut": (
        "the λ-accumulation (lastgaelam) is not reset at episode ends: advantages leak from the next episode into "
        "the last steps of this one, although each step's TD error is right"
    ),
    "reset_obs_bootstrapped": (
        "at a truncation the bootstrap uses values[t+1], the value of the next episode's first observation (the "
        "autoreset one), instead of the value of the final observation"
    ),
    "termination_bootstrapped": (
        "a termination is bootstrapped like a truncation: the value of the terminal observation is added where "
        "the episode really ended (its value is 0)"
    ),
    "last_step_not_bootstrapped": (
        "the rollout's last step is not bootstrapped from the value of the observation after the rollout: an "
        "episode still running at the end of the rollout is treated as terminated"
    ),
    "flags_shifted": (
        "the episode-end flags are off by one step: the flag of obs_t (an episode start, CleanRL's dones[t]) is "
        "used where the end of step t (dones[t+1]) is meant"
    ),
}

FIX = (
    "delta_t = r_t + γ·V(s'_t)·(1 − terminated_t) − V(s_t) and A_t = delta_t + γλ·(1 − done_t)·A_t+1 with "
    "done_t = terminated_t | truncated_t, V(s'_t) the value of the final observation at an episode end (SB3 "
    "info['terminal_observation'], gymnasium info['final_obs']) and of the observation after the rollout at "
    "the last step; or keep done in the GAE and add γ·V(final observation) to the reward of truncated steps, "
    "as SB3's collect_rollouts does"
)


def _continuation_values(r: Rollout) -> np.ndarray:
    """What a loop finds stored 'next' for step t: values[t+1], and the last value at the end."""
    v = np.asarray(r.values, np.float64)
    nxt = np.empty_like(v)
    nxt[:-1] = v[1:]
    nxt[-1] = np.asarray(r.next_values, np.float64)[-1]
    return nxt


def reference_gae(
    r: Rollout, variant: str | None = None, gae_lambda: float | None = None
) -> tuple[np.ndarray, np.ndarray]:
    """GAE advantages and λ-returns (advantages + values), float64; ``variant`` computes one of the
    :data:`VARIANTS` instead. Reset steps (NEXT_STEP autoreset) get advantage 0 and no transition."""
    rewards = np.asarray(r.rewards, np.float64)
    values = np.asarray(r.values, np.float64)
    next_values = np.asarray(r.next_values, np.float64)
    term = np.asarray(r.terminated, bool)
    trunc = np.asarray(r.truncated, bool)
    ended = term | trunc
    starts = np.asarray(r.episode_starts, bool)
    reset = np.asarray(r.reset_steps, bool)
    cont = _continuation_values(r)
    gamma, lam = float(r.gamma), float(r.gae_lambda if gae_lambda is None else gae_lambda)
    steps = rewards.shape[0]
    adv = np.zeros_like(rewards)
    last = np.zeros(rewards.shape[1])
    for t in reversed(range(steps)):
        boot, cut = np.where(term[t], 0.0, next_values[t]), ended[t]
        if variant == "truncation_not_bootstrapped":
            boot = np.where(ended[t], 0.0, next_values[t])
        elif variant == "ends_ignored":
            boot, cut = cont[t], np.zeros_like(cut)
        elif variant == "chain_not_cut":
            cut = np.zeros_like(cut)
        elif variant == "reset_obs_bootstrapped":
            boot = np.where(term[t], 0.0, np.where(trunc[t], cont[t], next_values[t]))
        elif variant == "termination_bootstrapped":
            boot = next_values[t]
        elif variant == "last_step_not_bootstrapped" and t == steps - 1:
            boot = np.zeros_like(boot)
        elif variant == "flags_shifted" and t < steps - 1:  # the last step has its own flag (next_done)
            boot, cut = np.where(starts[t], 0.0, cont[t]), starts[t]
        delta = rewards[t] + gamma * boot - values[t]
        last = delta + gamma * lam * np.where(cut, 0.0, 1.0) * last
        if variant not in ("ends_ignored", "chain_not_cut"):  # those treat a reset step as a transition
            last = np.where(reset[t], 0.0, last)
        adv[t] = last
    return adv, adv + values


@dataclass
class Comparison:
    """The user's output on one rollout next to the reference's."""

    rollout: Rollout
    advantages: np.ndarray | None
    returns: np.ndarray | None
    ref_advantages: np.ndarray
    ref_returns: np.ndarray
    mc_returns: np.ndarray  # λ = 1: discounted returns bootstrapped the same way
    mask: np.ndarray  # steps compared (not reset steps)
    rtol: float
    atol: float

    def _close(self, a: np.ndarray, b: np.ndarray) -> np.ndarray:
        return np.isclose(a, b, rtol=self.rtol, atol=self.atol) | ~self.mask

    @property
    def advantages_ok(self) -> bool:
        return self.advantages is None or bool(self._close(self.advantages, self.ref_advantages).all())

    @property
    def returns_ok(self) -> bool:
        if self.returns is None:
            return True
        return bool(
            self._close(self.returns, self.ref_returns).all() or self._close(self.returns, self.mc_returns).all()
        )

    @property
    def agrees(self) -> bool:
        return self.advantages_ok and self.returns_ok

    @property
    def what(self) -> str:
        """'advantages' or 'returns': the output shown."""
        return "advantages" if not self.advantages_ok else "returns"

    def mismatches(self) -> np.ndarray:
        if not self.advantages_ok:
            return ~self._close(self.advantages, self.ref_advantages)
        return ~(self._close(self.returns, self.ref_returns))


def folded(r: Rollout) -> Rollout:
    """The rollout as SB3's RolloutBuffer sees it: γ·V(final observation) added to the reward of
    time-limit truncations, which then count as plain episode ends (dones)."""
    timeout = np.asarray(r.truncated, bool) & ~np.asarray(r.terminated, bool)
    rewards = np.asarray(r.rewards, np.float64) + r.gamma * np.asarray(r.next_values, np.float64) * timeout
    return dataclasses.replace(r, rewards=rewards, terminated=np.asarray(r.dones), truncated=np.zeros_like(r.dones))


def matches_variant(
    r: Rollout, advantages: np.ndarray | None, returns: np.ndarray | None, variant: str, rtol: float, atol: float
) -> bool:
    """The user's output on ``r`` equals what the :data:`VARIANTS` mistake ``variant`` computes."""
    mask = ~np.asarray(r.reset_steps, bool)

    def close(a: np.ndarray, b: np.ndarray) -> bool:
        return bool((np.isclose(a, b, rtol=rtol, atol=atol) | ~mask).all())

    adv, ret = reference_gae(r, variant)
    if advantages is not None and not close(advantages, adv):
        return False
    return returns is None or close(returns, ret) or close(returns, reference_gae(r, variant, gae_lambda=1.0)[1])


def identify_mistake(
    outputs: list[tuple[Rollout, np.ndarray | None, np.ndarray | None]], rtol: float, atol: float
) -> str | None:
    """The :data:`VARIANTS` mistake the user's function makes on every one of ``outputs``
    ((rollout, advantages, returns) triples of varied rollouts), if one explains them all, on the
    rollouts as given or as an SB3-style buffer sees them (:func:`folded`)."""
    for name in VARIANTS:
        for view in (lambda r: r, folded):
            if all(matches_variant(view(r), adv, ret, name, rtol, atol) for r, adv, ret in outputs):
                return name
    return None


def compare(
    rollout: Rollout, advantages: np.ndarray | None, returns: np.ndarray | None, rtol: float, atol: float
) -> Comparison:
    ref_adv, ref_ret = reference_gae(rollout)
    _, mc = reference_gae(rollout, gae_lambda=1.0)
    mask = ~np.asarray(rollout.reset_steps, bool)
    return Comparison(rollout, advantages, returns, ref_adv, ref_ret, mc, mask, rtol, atol)


# --------------------------------------------------------------------------------------------------
# off-policy one-step TD targets (DQN, SAC, TD3): the same bootstrap rule, one transition at a time


@dataclass(frozen=True)
class Transitions:
    """A batch of ``B`` transitions as an off-policy loop stores and samples them; arrays are ``(B,)``.

    - ``rewards[i]``: the reward of transition i.
    - ``terminated[i]``, ``truncated[i]``: the flags ``env.step`` returned (both may be set; termination
      wins). What a replay buffer should store as its done is ``terminated`` (CleanRL's
      ``rb.add(..., terminations, ...)``, or SB3's done with ``infos["TimeLimit.truncated"]`` kept as a timeout).
    - ``next_values[i]``: the target network's value of the next (final, at an episode end) observation:
      DQN's ``max_a Q_target(s', a)``, SAC's ``min Q_target(s', a') − α log π(a'|s')``, TD3's ``min Q_target(s', a')``.
    - ``gamma``: the discount.
    """

    rewards: Any
    terminated: Any
    truncated: Any
    next_values: Any
    gamma: float

    @property
    def dones(self) -> Any:
        """terminated | truncated."""
        if isinstance(self.terminated, np.ndarray):
            return np.logical_or(self.terminated, self.truncated)
        return (self.terminated + self.truncated).clamp(max=1.0)

    def as_torch(self) -> Transitions:
        import torch

        return dataclasses.replace(
            self, **{f: torch.tensor(np.asarray(getattr(self, f), np.float32)) for f in TD_FIELDS}
        )


TD_FIELDS = ("rewards", "terminated", "truncated", "next_values")

#: parameter names R7 fills by keyword when the user's TD target function takes them
TD_PARAMETERS = {
    "rewards": "rewards",
    "terminated": "terminated",
    "terminations": "terminated",
    "truncated": "truncated",
    "truncations": "truncated",
    "next_values": "next_values",
    "next_value": "next_values",
    "next_q_values": "next_values",
    "next_q": "next_values",
    "target_max": "next_values",
    "gamma": "gamma",
}


@dataclass(frozen=True)
class TDTargetFn:
    """How R7 calls the user's one-step TD target (see :func:`td_target_fn`)."""

    fn: Callable[..., Any]
    arrays: str = "numpy"
    gamma: float | None = None
    source: str = "dlcheck_td_target_fn"

    def __call__(self, batch: Transitions) -> np.ndarray:
        b = batch.as_torch() if self.arrays == "torch" else batch
        try:
            params = [
                p
                for p in inspect.signature(self.fn).parameters.values()
                if p.kind not in (p.VAR_POSITIONAL, p.VAR_KEYWORD)
            ]
        except (TypeError, ValueError):
            params = []
        required = [p.name for p in params if p.default is p.empty]
        if "dones" in required:
            raise RoleError(
                "td_target_fn",
                "takes a parameter named 'dones', which is what R7 checks: take terminated and truncated "
                "(terminations, truncations) and store/use the done flag in it as your loop does",
            )
        if len(required) == 1 and required[0] not in TD_PARAMETERS:
            out = self.fn(b)
        else:
            unknown = [n for n in required if n not in TD_PARAMETERS]
            if unknown:
                raise RoleError(
                    "td_target_fn",
                    f"has required parameters {unknown} that R7 cannot fill: take one Transitions, or parameters "
                    f"named {sorted(TD_PARAMETERS)} (see pytest_dlcheck.rl.Transitions)",
                )
            out = self.fn(**{p.name: getattr(b, TD_PARAMETERS[p.name]) for p in params if p.name in TD_PARAMETERS})
        a = to_numpy(out).reshape(-1)
        if a.shape != (len(np.asarray(batch.rewards)),):
            raise RoleError(
                "td_target_fn", f"returned {a.size} targets for a batch of {len(np.asarray(batch.rewards))} transitions"
            )
        return a


def td_target_fn(fn: Callable[..., Any] | None = None, *, arrays: str = "numpy", gamma: float | None = None) -> Any:
    """Declare how R7 calls your off-policy TD target; usable as a decorator.

    ``fn`` takes one :class:`Transitions`, or keyword parameters named after its fields (``rewards,
    terminated|terminations, truncated|truncations, next_values|next_q_values|target_max, gamma``), does what
    your loop does with them (the done it stores in the replay buffer, then ``r + γ·(1 − done)·next_value``)
    and returns the targets ``(B,)``. ``arrays="torch"`` passes float32 tensors (flags as 0./1.)."""
    if arrays not in ("numpy", "torch"):
        raise ValueError(f"arrays must be 'numpy' or 'torch', not {arrays!r}")

    def wrap(f: Callable[..., Any]) -> TDTargetFn:
        return TDTargetFn(f, arrays, gamma)

    return wrap(fn) if fn is not None else wrap


def as_td_target_fn(obj: Any) -> TDTargetFn:
    if isinstance(obj, TDTargetFn):
        return obj
    if not callable(obj):
        raise RoleError("td_target_fn", f"is a {type(obj).__name__}, expected a callable (transitions -> targets)")
    return TDTargetFn(obj)


TD_KINDS = ("running", "terminated", "truncated", "both")

#: mistakes a TD target makes at episode ends: name -> the cause a failure names
TD_VARIANTS = {
    "truncation_as_termination": (
        "done = terminated or truncated is stored and used as (1 − done) in the target: a time-limit truncation is "
        "treated as a termination, so r + γ·(1 − done)·Q(s') drops the value of the final observation where the "
        "episode was only cut, and the critic learns that states near the time limit are worth less"
    ),
    "ends_ignored": (
        "the target bootstraps every transition (r + γ·Q(s')), terminations included: the value of a terminal "
        "state, which is 0, is added where the episode really ended"
    ),
    "termination_ignored": (
        "the target cuts at truncations and bootstraps terminations (the flags are swapped): exactly the wrong "
        "transitions lose their bootstrap"
    ),
}


def td_batches(gamma: float, batches: int = 24, size: int = 8, seed: int = 0) -> list[Transitions]:
    """One batch with one transition of each :data:`TD_KINDS` (distinct numbers), then random batches."""
    out = [
        Transitions(
            np.array([0.5, 1.0, 1.5, 2.0]),
            np.array([False, True, False, True]),
            np.array([False, False, True, True]),
            np.array([2.0, 3.0, 4.0, 5.0]),
            gamma,
        )
    ]
    rng = np.random.default_rng(seed)
    for _ in range(batches):
        kinds = rng.integers(0, 4, size)
        out.append(
            Transitions(
                rng.integers(-3, 4, size).astype(np.float64),
                (kinds == 1) | (kinds == 3),
                (kinds == 2) | (kinds == 3),
                rng.integers(-3, 4, size).astype(np.float64) + 0.5,
                gamma,
            )
        )
    return out


def reference_td(b: Transitions, variant: str | None = None) -> np.ndarray:
    """r + γ·(1 − terminated)·next_value (float64); ``variant`` computes a :data:`TD_VARIANTS` mistake."""
    term, trunc = np.asarray(b.terminated, bool), np.asarray(b.truncated, bool)
    keep = ~term
    if variant == "truncation_as_termination":
        keep = ~(term | trunc)
    elif variant == "ends_ignored":
        keep = np.ones_like(term)
    elif variant == "termination_ignored":
        keep = ~trunc
    return np.asarray(b.rewards, np.float64) + b.gamma * np.asarray(b.next_values, np.float64) * keep


def td_kind(b: Transitions, i: int) -> str:
    return TD_KINDS[int(bool(b.terminated[i])) + 2 * int(bool(b.truncated[i]))]


# --------------------------------------------------------------------------------------------------
# Hypothesis strategies

END_KINDS = ("-", "-", "terminated", "truncated", "both")
CARRIED = ("running", "start", "reset")


def rollouts(
    *, max_steps: int = 8, max_envs: int = 2, gamma: float = 0.99, gae_lambda: float = 0.95, autoreset: str = SAME_STEP
) -> Any:
    """Hypothesis strategy of :class:`Rollout`: 1..max_steps steps on 1..max_envs envs, small integer
    rewards and values, and episode ends (termination, truncation, both) at any step, the last one
    included. The rollout is decoded from one byte string (4 bytes per step and env), which keeps
    generation cheap; shrinking the bytes toward zero gives fewer steps, fewer ends and zero values."""
    from hypothesis import strategies as st

    @st.composite
    def build(draw: Any) -> Rollout:
        envs = draw(st.integers(1, max_envs), label="envs")
        head = 2 * envs  # per env: where the previous rollout left it, V(obs after the rollout)
        data = draw(st.binary(min_size=head + 4 * envs, max_size=head + 4 * envs * max_steps), label="rollout bytes")
        return decode_rollout(data, envs, gamma, gae_lambda, autoreset)

    return build()


#: byte -> small integer, 0 first so that shrinking toward zero bytes gives zero values
NUMBERS = (0.0, 1.0, -1.0, 2.0, -2.0, 3.0, -3.0)


def decode_rollout(data: bytes, envs: int, gamma: float, gae_lambda: float, autoreset: str) -> Rollout:
    """The rollout :func:`rollouts` draws: 2 bytes per env (previous rollout, value after the rollout),
    then 4 per step and env (end kind, reward, value, value of the final observation)."""
    head = 2 * envs
    steps = max(1, (len(data) - head) // (4 * envs))
    data = bytes(data) + bytes(max(0, head + 4 * envs * steps - len(data)))
    cols = []
    for n in range(envs):
        records = []
        for t in range(steps):
            b = data[head + 4 * (t * envs + n) : head + 4 * (t * envs + n) + 4]
            records.append((END_KINDS[b[0] % len(END_KINDS)], NUMBERS[b[1] % 7], NUMBERS[b[2] % 7], NUMBERS[b[3] % 7]))
        cols.append(_env_column(records, CARRIED[data[2 * n] % len(CARRIED)], NUMBERS[data[2 * n + 1] % 7], autoreset))
    return _assemble(cols, gamma, gae_lambda, autoreset)


def sample_rollouts(
    count: int,
    *,
    seed: int = 0,
    max_steps: int = 8,
    max_envs: int = 2,
    gamma: float = 0.99,
    gae_lambda: float = 0.95,
    autoreset: str = SAME_STEP,
) -> list[Rollout]:
    """``count`` rollouts drawn like :func:`rollouts`, from a seeded numpy generator (no shrinking)."""
    rng = np.random.default_rng(seed)

    def number() -> float:
        return float(rng.integers(-3, 4))

    out = []
    for _ in range(count):
        steps, envs = int(rng.integers(2, max_steps + 1)), int(rng.integers(1, max_envs + 1))
        cols = []
        for _ in range(envs):
            records = [
                (END_KINDS[int(rng.integers(len(END_KINDS)))], number(), number(), number()) for _ in range(steps)
            ]
            cols.append(_env_column(records, CARRIED[int(rng.integers(len(CARRIED)))], number(), autoreset))
        out.append(_assemble(cols, gamma, gae_lambda, autoreset))
    return out


def _assemble(cols: list[dict[str, np.ndarray]], gamma: float, gae_lambda: float, autoreset: str) -> Rollout:
    arrays = {f: np.stack([c[f] for c in cols], axis=1) for f in ARRAY_FIELDS}
    for f in ("terminated", "truncated", "episode_starts", "reset_steps"):
        arrays[f] = arrays[f].astype(bool)
    for f in ("rewards", "values", "next_values"):
        arrays[f] = arrays[f].astype(np.float32)
    return Rollout(gamma=gamma, gae_lambda=gae_lambda, autoreset=autoreset, **arrays)


def _env_column(
    records: list[tuple[str, float, float, float]], carried: str, after: float, autoreset: str
) -> dict[str, np.ndarray]:
    """One env's arrays from per-step records (end kind, reward, value, value of the final observation),
    ``carried`` (where the previous rollout left the env: mid-episode, at an episode start, or, under
    NEXT_STEP, right after an episode end so that this rollout opens with a reset step) and ``after``,
    V(observation after the rollout)."""
    steps = len(records)
    col = {f: np.zeros(steps) for f in ARRAY_FIELDS}
    final = np.zeros(steps)
    pending_reset = autoreset == NEXT_STEP and carried == "reset"
    start = carried == "start"
    for t, (kind, reward, value, final_value) in enumerate(records):
        col["episode_starts"][t] = start
        if pending_reset:  # the reset step: action ignored, reward 0, its observation the final one
            col["reset_steps"][t] = 1
            col["values"][t] = final_value
            pending_reset, start = False, True
            continue
        col["rewards"][t], col["values"][t], final[t] = reward, value, final_value
        col["terminated"][t] = kind in ("terminated", "both")
        col["truncated"][t] = kind in ("truncated", "both")
        start = kind != "-"
        if start and autoreset == NEXT_STEP:
            pending_reset, start = True, False
    for t in range(steps):
        if autoreset == SAME_STEP and (col["terminated"][t] or col["truncated"][t]):
            col["next_values"][t] = final[t]  # V(final observation), stored apart from the reset one
        else:  # the next stored observation is the one step t led to (the final one under NEXT_STEP)
            col["next_values"][t] = col["values"][t + 1] if t + 1 < steps else after
    return col


def reward_groups(*, max_groups: int = 4, max_group_size: int = 6) -> Any:
    """Hypothesis strategy of (rewards, group_size): ``rewards`` a list of floats, consecutive runs of
    ``group_size`` being the completions of one prompt (TRL's layout). Groups whose rewards are all
    equal are the simplest values, so shrinking finds them first."""
    from hypothesis import strategies as st

    @st.composite
    def build(draw: Any) -> tuple[list[float], int]:
        size = draw(st.integers(2, max_group_size), label="group_size")
        groups = draw(st.integers(1, max_groups), label="groups")
        rewards = draw(st.lists(st.integers(-2, 3).map(float), min_size=size * groups, max_size=size * groups))
        return rewards, size

    return build()


def hypothesis_missing() -> str | None:
    """The skip reason when Hypothesis, which R3 and R7 search with, is not installed."""
    import importlib.util

    if importlib.util.find_spec("hypothesis") is None:
        return "Hypothesis is not installed: pip install 'pytest-dlcheck[rl]' (or hypothesis)"
    return None


def search(strategy: Any, disagrees: Callable[[Any], bool], max_examples: int) -> Any:
    """The smallest generated value for which ``disagrees`` holds (Hypothesis shrinking), or None.
    Derandomised and without an example database, so every run explores the same values."""
    from hypothesis import HealthCheck, Phase, find, settings
    from hypothesis.errors import NoSuchExample

    # no explain phase: it re-runs the function hundreds of times to annotate a report we do not print
    conf = settings(
        derandomize=True,
        database=None,
        deadline=None,
        max_examples=max_examples,
        suppress_health_check=list(HealthCheck),
        print_blob=False,
        phases=(Phase.explicit, Phase.reuse, Phase.generate, Phase.shrink),
    )
    try:
        return find(strategy, disagrees, settings=conf)
    except NoSuchExample:
        return None


def sub_rollout(r: Rollout, steps: slice, envs: list[int]) -> Rollout:
    """The steps ``steps`` of envs ``envs``: still a valid rollout (a cut before step t leaves obs_t's
    flags as carried state; a cut after step t makes next_values[t] the value after the rollout)."""
    return dataclasses.replace(r, **{f: np.asarray(getattr(r, f))[steps][:, envs] for f in ARRAY_FIELDS})


def reduce_rollout(r: Rollout, disagrees: Callable[[Rollout], bool]) -> Rollout:
    """Greedy cuts after Hypothesis' shrinking, which keeps a few needless leading steps or a second env
    when the failing step sits late in a wide rollout: one env, then fewer leading and trailing steps,
    as long as the disagreement stays."""
    for n in range(r.num_envs):
        if r.num_envs > 1 and disagrees(one := sub_rollout(r, slice(None), [n])):
            r = one
            break
    while r.num_steps > 1 and disagrees(shorter := sub_rollout(r, slice(1, None), list(range(r.num_envs)))):
        r = shorter
    while r.num_steps > 1 and disagrees(shorter := sub_rollout(r, slice(None, -1), list(range(r.num_envs)))):
        r = shorter
    return r


# --------------------------------------------------------------------------------------------------
# showing a rollout


def _cell(x: Any) -> str:
    if isinstance(x, str):
        return f"{x:>7}"
    x = float(x)
    if not math.isfinite(x):
        return f"{x!s:>7}"
    return f"{x:>7.4g}" if x != 0 else f"{0:>7}"


def end_label(r: Rollout, t: int, n: int) -> str:
    term, trunc = bool(r.terminated[t, n]), bool(r.truncated[t, n])
    if r.reset_steps[t, n]:
        return "reset"
    return {(True, True): "both", (True, False): "term", (False, True): "trunc"}.get((term, trunc), "-")


def show_rollout(c: Comparison, label: str = "yours") -> list[str]:
    """Evidence lines: the rollout, env by env (those that disagree), with the user's output and the
    reference side by side, '^' under the steps that differ."""
    r = c.rollout
    what = c.what
    mine = c.advantages if what == "advantages" else c.returns
    ref = c.ref_advantages if what == "advantages" else c.ref_returns
    bad = c.mismatches()
    lines = [
        f"rollout of {r.num_steps} step{'s' * (r.num_steps > 1)} × {r.num_envs} env{'s' * (r.num_envs > 1)}, "
        f"gamma {r.gamma:g}, gae_lambda {r.gae_lambda:g}, {r.autoreset} autoreset:"
    ]
    for n in range(r.num_envs):
        if not bad[:, n].any() and r.num_envs > 1:
            continue
        steps = range(r.num_steps)
        rows = [
            ("step", [str(t) for t in steps]),
            ("reward", [r.rewards[t, n] for t in steps]),
            ("value", [r.values[t, n] for t in steps]),
            ("end", [end_label(r, t, n) for t in steps]),
            ("next value", [r.next_values[t, n] for t in steps]),
            (f"{what[:3]}. {label}", [mine[t, n] for t in steps]),
            (f"{what[:3]}. reference", [ref[t, n] for t in steps]),
            ("", ["^" if bad[t, n] else "" for t in steps]),
        ]
        if r.num_envs > 1:
            lines.append(f"env {n}:")
        for name, cells in rows:
            lines.append(f"  {name:<14}" + " ".join(_cell(x) for x in cells))
    return lines


def describe(r: Rollout) -> str:
    """One line: '2 steps × 1 env, ends: env 0 step 1 trunc'."""
    ends = [
        f"env {n} step {t} {end_label(r, t, n)}"
        for t in range(r.num_steps)
        for n in range(r.num_envs)
        if end_label(r, t, n) != "-"
    ]
    return (
        f"of {r.num_steps} step{'s' * (r.num_steps > 1)} × {r.num_envs} env{'s' * (r.num_envs > 1)} "
        f"({r.autoreset}), ends: {', '.join(ends) or 'none'}"
    )


def describe_kinds(r: Rollout, mask: np.ndarray) -> str:
    """Which kinds of steps the disagreement sits at: 'a truncated step', 'the last step', …"""
    kinds = []
    for t, n in zip(*np.nonzero(mask)):
        label = end_label(r, t, n)
        if label in ("trunc", "term", "both"):
            kinds.append({"trunc": "a truncated step", "term": "a terminated step", "both": "a terminated step"}[label])
        elif t == r.num_steps - 1:
            kinds.append("the rollout's last step")
    return ", ".join(dict.fromkeys(kinds)) or "steps inside an episode"


# --------------------------------------------------------------------------------------------------
# Stable-Baselines3


def is_sb3_algorithm(obj: Any) -> bool:
    return any(
        c.__name__ == "BaseAlgorithm" and c.__module__.startswith("stable_baselines3") for c in type(obj).__mro__
    )


def rewarded(trainer: Any) -> bool:
    """Whether a transformers/TRL trainer trains on rewards (GRPO, RLOO, online DPO, PPO): it holds reward
    functions or a reward model. SFT, DPO and a plain Trainer do not."""
    return bool(getattr(trainer, "reward_funcs", None) or getattr(trainer, "reward_model", None))


def is_on_policy(algo: Any) -> bool:
    return any(c.__name__ == "OnPolicyAlgorithm" for c in type(algo).__mro__)


def _zeros_for(space: Any, n: int) -> Any:
    from stable_baselines3.common.preprocessing import get_obs_shape

    shape = get_obs_shape(space)
    if isinstance(shape, dict):
        return {k: np.zeros((n, *s), np.float32) for k, s in shape.items()}
    return np.zeros((n, *shape), np.float32)


def _buffer_class(algo: Any) -> tuple[type, dict]:
    from stable_baselines3.common.buffers import DictRolloutBuffer, RolloutBuffer

    cls = getattr(algo, "rollout_buffer_class", None)
    if cls is None:
        buf = getattr(algo, "rollout_buffer", None)
        cls = type(buf) if buf is not None else None
    if cls is None:
        from gymnasium import spaces

        cls = DictRolloutBuffer if isinstance(algo.observation_space, spaces.Dict) else RolloutBuffer
    return cls, dict(getattr(algo, "rollout_buffer_kwargs", None) or {})


def sb3_advantage_fn(algo: Any) -> AdvantageFn:
    """R7's view of an SB3 on-policy algorithm: its rollout buffer class computes the advantages, the
    time-limit bootstrap folded into the reward of truncated steps as ``collect_rollouts`` does."""
    import torch
    from stable_baselines3.common.preprocessing import get_action_dim

    cls, kwargs = _buffer_class(algo)

    def gae(r: Rollout) -> tuple[np.ndarray, np.ndarray]:
        steps, envs = r.num_steps, r.num_envs
        buf = cls(
            steps,
            algo.observation_space,
            algo.action_space,
            device="cpu",
            gamma=r.gamma,
            gae_lambda=r.gae_lambda,
            n_envs=envs,
            **kwargs,
        )
        timeout = np.asarray(r.truncated, bool) & ~np.asarray(r.terminated, bool)
        rewards = np.asarray(r.rewards, np.float32) + r.gamma * np.asarray(r.next_values, np.float32) * timeout
        obs = _zeros_for(algo.observation_space, envs)
        actions = np.zeros((envs, get_action_dim(algo.action_space)), np.float32)
        for t in range(steps):
            buf.add(
                obs,
                actions,
                rewards[t],
                np.asarray(r.episode_starts[t], np.float32),
                torch.as_tensor(np.asarray(r.values[t], np.float32)),
                torch.zeros(envs),
            )
        buf.compute_returns_and_advantage(
            last_values=torch.as_tensor(np.asarray(r.last_values, np.float32)), dones=np.asarray(r.last_dones, bool)
        )
        return buf.advantages, buf.returns

    return AdvantageFn(
        gae,
        "numpy",
        SAME_STEP,
        float(algo.gamma),
        float(algo.gae_lambda),
        source=f"{type(algo).__name__}'s {cls.__name__}.compute_returns_and_advantage",
    )


#: transitions an SB3 off-policy algorithm stores, in order: (kind, VecEnv done, infos["TimeLimit.truncated"])
SB3_STORED = (
    ("running", False, False),
    ("truncated", True, True),
    ("running", False, False),
    ("terminated", True, False),
)


def sb3_sampled_dones(algo: Any) -> dict[str, float]:
    """The done each kind of transition is sampled with from a fresh replay buffer of the algorithm's class and
    arguments, given the transitions the way ``OffPolicyAlgorithm._store_transition`` adds them (the VecEnv's
    done = terminated or truncated, ``infos["TimeLimit.truncated"]`` for a time-limit truncation)."""
    from stable_baselines3.common.preprocessing import get_action_dim

    rb = algo.replay_buffer
    kwargs = dict(getattr(algo, "replay_buffer_kwargs", None) or {})
    if "env" in inspect.signature(type(rb).__init__).parameters and "env" not in kwargs:
        kwargs["env"] = algo.get_env()  # HerReplayBuffer: _setup_model hands it the algorithm's env
    buf = type(rb)(
        len(SB3_STORED) * 2,
        algo.observation_space,
        algo.action_space,
        device="cpu",
        n_envs=1,
        optimize_memory_usage=bool(getattr(rb, "optimize_memory_usage", False)),
        **kwargs,
    )
    obs = _zeros_for(algo.observation_space, 1)
    actions = np.zeros((1, get_action_dim(algo.action_space)), np.float32)
    for _, done, timeout in SB3_STORED:
        infos = [{"TimeLimit.truncated": True}] if timeout else [{}]
        buf.add(obs, obs, actions, np.ones(1, np.float32), np.array([done]), infos)
    indices = np.arange(len(SB3_STORED))
    if hasattr(buf, "_get_real_samples"):  # HER: its relabelled samples keep the same stored done·(1 − timeout)
        samples = buf._get_real_samples(indices, np.zeros_like(indices))
    else:
        samples = buf._get_samples(indices)
    dones = to_numpy(samples.dones).reshape(-1)
    return {kind: float(dones[i]) for i, (kind, _, _) in enumerate(SB3_STORED) if kind != "running" or i == 0}


@dataclass
class Truncation:
    """Whether an SB3 off-policy algorithm's env truncates episodes, from what its env and replay buffer produce."""

    seen: bool
    shown: str  # what shows it, or what was looked at without seeing one
    limit: int | None = None  # the TimeLimit's steps, when one shows it


def sb3_truncation(algo: Any, probe_steps: int) -> Truncation:
    """Whether the algorithm's env truncates episodes (``truncated=True`` from step, which an SB3 VecEnv stores as
    ``infos["TimeLimit.truncated"]``), from, in order: a TimeLimit anywhere in its wrapper chain (or its spec's
    max_episode_steps), the timeouts its replay buffer stored, and ``probe_steps`` random-action steps of a deep
    copy of its first env (the user's env is not stepped; 0: no probe). An attribute such as ``max_steps`` is only a hint:
    it lengthens the probe so that a truncation at that step can show."""
    name = type(algo).__name__
    env = algo.get_env()
    if env is None:
        return Truncation(False, f"{name} has no env to look at")
    limits = [limit for limit in (env_time_limits(algo) or []) if limit is not None]
    limits += [limit for limit in _wrapper_attr(env, "_max_episode_steps") if isinstance(limit, int)]
    if limits:
        return Truncation(True, f"a TimeLimit of {min(limits)} steps is in its wrapper chain", min(limits))
    looked = ["no TimeLimit in its env's wrapper chain, spec.max_episode_steps None"]
    rb = getattr(algo, "replay_buffer", None)
    stored = (rb.buffer_size if rb.full else rb.pos) if rb is not None and hasattr(rb, "pos") else 0
    if stored and getattr(rb, "handle_timeout_termination", False) and getattr(rb, "timeouts", None) is not None:
        ends = int(np.asarray(rb.dones[:stored]).sum())
        timeouts = int(np.asarray(rb.timeouts[:stored]).sum())
        if timeouts:
            return Truncation(
                True,
                f"{timeouts} of the {ends} episode ends stored in {name}.replay_buffer are truncations (its "
                f"timeouts: the env returned truncated=True; {looked[0]})",
            )
        looked.append(f"none of the {ends} episode ends stored in {name}.replay_buffer is a truncation")
    if probe_steps <= 0:
        return Truncation(False, "; ".join(looked))
    hints = [h for h in _wrapper_attr(env, "max_steps") if isinstance(h, int) and h > 0]
    steps = max(probe_steps, min(10 * probe_steps, 2 * max(hints) + 2)) if hints else probe_steps
    probe = _probe_truncations(env, steps)
    if isinstance(probe, str):
        looked.append(probe)
        return Truncation(False, "; ".join(looked))
    episodes, truncated, terminated, stepped, what = probe
    if truncated:
        return Truncation(
            True,
            f"a deep copy of its env ({what}) returned truncated=True at {truncated} of {episodes} episode ends in "
            f"{stepped} random-action steps ({looked[0]})",
        )
    looked.append(
        f"a deep copy of its env ({what}) ended {episodes} episode(s) in {steps} random-action steps, "
        f"{terminated} by termination, none by truncation"
        + (f" (its max_steps attribute says {max(hints)})" if hints else "")
    )
    return Truncation(False, "; ".join(looked))


def _wrapper_attr(env: Any, attr: str) -> list[Any]:
    """``attr`` of each of a VecEnv's envs, found anywhere in its wrapper chain; [] when not all have it. Asked
    with has_attr first: a SubprocVecEnv's worker dies on a get_attr of a name its env lacks."""
    has = getattr(env, "has_attr", None)
    if has is None or not has(attr):
        return []
    return list(env.get_attr(attr))


def _probe_truncations(env: Any, steps: int) -> tuple[int, int, int, int, str] | str:
    """(episodes ended, truncated, terminated, steps, env) over ``steps`` random-action steps of a deep copy of a
    VecEnv's first env, stopping at the first truncation; a sentence when no copy can be stepped."""
    inner = env
    while getattr(inner, "venv", None) is not None:  # VecNormalize, VecFrameStack, ...
        inner = inner.venv
    envs = getattr(inner, "envs", None)
    if not envs:
        return f"its {type(inner).__name__} keeps its envs in other processes: no copy of one was stepped"
    try:
        probe = copy.deepcopy(envs[0])
    except Exception as exc:  # noqa: BLE001 - an env that cannot be copied (a file, a process): not probed
        return f"its env could not be copied to be stepped ({type(exc).__name__})"
    what = " → ".join(type(e).__name__ for e in _wrapper_chain(probe))
    probe.action_space.seed(0)

    def run() -> tuple[int, int, int, int]:
        probe.reset(seed=0)
        episodes = truncated = terminated = 0
        for t in range(1, steps + 1):
            _, _, term, trunc, _ = probe.step(probe.action_space.sample())
            if term or trunc:
                episodes += 1
                truncated += bool(trunc) and not term
                terminated += bool(term)
                if truncated:
                    return episodes, truncated, terminated, t
                probe.reset()
        return episodes, truncated, terminated, steps

    counts = user_call("env", run, synthetic="random actions of its action space, on a deep copy of its env")
    return (*counts, what)


def _wrapper_chain(env: Any) -> list[Any]:
    chain = [env]
    while getattr(chain[-1], "env", None) is not None and len(chain) < 32:
        chain.append(chain[-1].env)
    return chain


def env_time_limits(algo: Any) -> list[int | None] | None:
    """max_episode_steps of each of the algorithm's envs (None: no time limit), or None when unknown."""
    env = algo.get_env()
    if env is None:
        return None
    try:
        specs = env.get_attr("spec")
    except Exception:  # noqa: BLE001 - a VecEnv that cannot say
        return None
    if any(s is None for s in specs):
        return None
    return [getattr(s, "max_episode_steps", None) for s in specs]


@dataclass
class PolicyRollout:
    """Observations as the policy saw them, and (on-policy) the raw GAE advantages of the same steps."""

    observations: np.ndarray
    advantages: np.ndarray | None
    source: str


class RolloutUnavailable(Exception):
    """No rollout can be had without touching the user's objects; the check skips with this reason."""


class NotBoxSpace(RolloutUnavailable):
    """The env's observations are not a Box (Discrete, MultiDiscrete): R8 does not concern them."""


def sb3_policy_rollout(algo: Any, steps: int) -> PolicyRollout:
    """The algorithm's last rollout if its buffer is full; else ``steps`` env steps collected with its
    policy on a deep copy of its env, the way ``OnPolicyAlgorithm.collect_rollouts`` collects them
    (the user's env, buffer and counters are left alone)."""
    name = type(algo).__name__
    buf = getattr(algo, "rollout_buffer", None)
    if buf is not None and getattr(buf, "full", False) and not isinstance(buf.observations, dict):
        obs = np.array(buf.observations).reshape(-1, *algo.observation_space.shape)
        return PolicyRollout(
            obs, np.array(buf.advantages).reshape(-1), f"the last rollout in {name}.rollout_buffer ({len(obs)} steps)"
        )
    rb = getattr(algo, "replay_buffer", None)
    if rb is not None and (rb.full or rb.pos > 0) and not isinstance(rb.observations, dict):
        n = rb.buffer_size if rb.full else rb.pos
        obs = np.array(rb.observations[:n]).reshape(-1, *algo.observation_space.shape)[-steps:]
        vec_norm = algo.get_vec_normalize_env()
        if vec_norm is not None:
            obs = vec_norm.normalize_obs(obs)
        return PolicyRollout(obs, None, f"the last {len(obs)} observations in {name}.replay_buffer")
    return collect_sb3(algo, steps)


def collect_sb3(algo: Any, steps: int) -> PolicyRollout:
    import torch
    from gymnasium import spaces
    from stable_baselines3.common.utils import obs_as_tensor

    env = algo.get_env()
    if env is None:
        raise RolloutUnavailable(f"{type(algo).__name__} has no env to roll out (define dlcheck_env)")
    if isinstance(algo.observation_space, spaces.Dict):
        raise RolloutUnavailable("Dict observation spaces are not sampled")
    try:
        env = copy_vec_env(env)
    except Exception as exc:  # noqa: BLE001 - subprocess vector envs cannot be copied
        raise RolloutUnavailable(
            f"cannot copy {type(env).__name__} to roll it out ({type(exc).__name__}); "
            "define dlcheck_env as a factory (a function returning a fresh env)"
        ) from None
    policy, on_policy = algo.policy, is_on_policy(algo)
    per_env = max(1, math.ceil(steps / env.num_envs))
    buf = None
    if on_policy:
        cls, kwargs = _buffer_class(algo)
        buf = cls(
            per_env,
            algo.observation_space,
            algo.action_space,
            device="cpu",
            gamma=algo.gamma,
            gae_lambda=algo.gae_lambda,
            n_envs=env.num_envs,
            **kwargs,
        )
    seen = []
    try:
        obs = env.reset()
        starts = np.ones(env.num_envs, dtype=np.float32)
        with eval_mode(policy), torch.no_grad():
            for _ in range(per_env):
                seen.append(np.array(obs))
                if not on_policy:
                    actions, _ = policy.predict(obs, deterministic=False)
                    obs, _, _, _ = env.step(actions)
                    continue
                actions, values, log_probs = policy(obs_as_tensor(obs, algo.device))
                actions = actions.cpu().numpy()
                clipped = actions
                if isinstance(algo.action_space, spaces.Box):
                    clipped = (
                        policy.unscale_action(actions)
                        if policy.squash_output
                        else np.clip(actions, algo.action_space.low, algo.action_space.high)
                    )
                new_obs, rewards, dones, infos = env.step(clipped)
                if isinstance(algo.action_space, spaces.Discrete):
                    actions = actions.reshape(-1, 1)
                for i, done in enumerate(dones):
                    if (
                        done
                        and infos[i].get("terminal_observation") is not None
                        and infos[i].get("TimeLimit.truncated", False)
                    ):
                        final = policy.obs_to_tensor(infos[i]["terminal_observation"])[0]
                        rewards[i] += algo.gamma * policy.predict_values(final)[0].item()
                buf.add(obs, actions, rewards, starts, values, log_probs)
                obs, starts = new_obs, dones.astype(np.float32)
            if on_policy:
                buf.compute_returns_and_advantage(policy.predict_values(obs_as_tensor(obs, algo.device)), dones)
    finally:
        env.close()
    observations = np.concatenate(seen).reshape(-1, *algo.observation_space.shape)
    advantages = np.array(buf.advantages).reshape(-1) if buf is not None else None
    return PolicyRollout(
        observations, advantages, f"{len(observations)} steps of {type(algo).__name__}'s policy on a copy of its env"
    )


def copy_vec_env(env: Any) -> Any:
    """A deep copy of an SB3 VecEnv wrapper chain. VecNormalize pickles without its inner env (its
    ``__getstate__`` drops ``venv``), so each wrapper is copied around a copy of the env it wraps."""
    inner = getattr(env, "venv", None)
    if inner is None:
        return copy.deepcopy(env)
    inner_copy = copy_vec_env(inner)
    out = copy.deepcopy(env, {id(inner): inner_copy})
    if getattr(out, "venv", None) is not inner_copy:
        out.set_venv(inner_copy)
        if hasattr(env, "returns"):
            out.returns = np.array(env.returns)
    return out


def sb3_preprocess(algo: Any, obs: np.ndarray) -> np.ndarray:
    """What the policy network takes: SB3 scales image observations by 1/255 and one-hots discrete ones."""
    import torch
    from stable_baselines3.common.preprocessing import preprocess_obs

    policy = algo.policy
    out = preprocess_obs(
        torch.as_tensor(obs), algo.observation_space, normalize_images=getattr(policy, "normalize_images", True)
    )
    return out.float().cpu().numpy()


# --------------------------------------------------------------------------------------------------
# observations from a gymnasium / SB3 env


def is_env(obj: Any) -> bool:
    names = {c.__name__ for c in type(obj).__mro__}
    return bool(names & {"Env", "VectorEnv", "VecEnv", "Wrapper", "VectorWrapper", "VecEnvWrapper"})


def env_name(env: Any) -> str:
    """The registered id (``MountainCar-v0``) of an env, a vector env or an SB3 VecEnv, else its class."""
    for candidate in (env, getattr(env, "unwrapped", None), *(getattr(env, "envs", None) or [])[:1]):
        spec = getattr(candidate, "spec", None)
        if getattr(spec, "id", None):
            return spec.id
    inner = getattr(env, "venv", None)
    return env_name(inner) if inner is not None else type(env).__name__


def env_observations(env_or_factory: Any, steps: int, seed: int = 0) -> tuple[np.ndarray, str]:
    """``steps`` observations of a fresh env from the factory (or a deep copy of the env), acting
    uniformly at random; the user's env is never stepped."""
    if callable(env_or_factory) and not is_env(env_or_factory):
        env = user_call("env", env_or_factory)
        where = f"a fresh env from dlcheck_env ({env_name(env)})"
    else:
        try:
            env = copy_vec_env(env_or_factory) if hasattr(env_or_factory, "venv") else copy.deepcopy(env_or_factory)
        except Exception as exc:  # noqa: BLE001
            raise RolloutUnavailable(
                f"cannot copy {type(env_or_factory).__name__} to roll it out ({type(exc).__name__}); "
                "define dlcheck_env as a factory (a function returning a fresh env)"
            ) from None
        where = f"a copy of dlcheck_env ({env_name(env)})"
    names = {c.__name__ for c in type(env).__mro__}
    seen = []
    try:
        space = getattr(env, "single_observation_space", None) or env.observation_space
        if type(space).__name__ != "Box":
            if type(space).__name__ == "Dict":
                raise RolloutUnavailable(f"R8 does not sample Dict observation spaces ({env_name(env)})")
            raise NotBoxSpace(f"R8 measures Box observation spaces; {env_name(env)} has {type(space).__name__}")
        if "VecEnv" in names:  # SB3: reset() -> obs; step -> 4-tuple, autoreset on the same step
            env.seed(seed)
            env.action_space.seed(seed)
            obs = env.reset()
            for _ in range(max(1, math.ceil(steps / env.num_envs))):
                seen.append(np.array(obs))
                obs = env.step(np.stack([env.action_space.sample() for _ in range(env.num_envs)]))[0]
        elif "VectorEnv" in names:
            obs, _ = env.reset(seed=seed)
            env.action_space.seed(seed)
            for _ in range(max(1, math.ceil(steps / env.num_envs))):
                seen.append(np.array(obs))
                obs = env.step(env.action_space.sample())[0]
        else:
            obs, _ = env.reset(seed=seed)
            env.action_space.seed(seed)
            for _ in range(steps):
                seen.append(np.array(obs)[None])
                obs, _, term, trunc, _ = env.step(env.action_space.sample())
                if term or trunc:
                    obs, _ = env.reset()
    finally:
        env.close()
    return np.concatenate(seen), f"{sum(len(s) for s in seen)} observations of {where}, random actions"


@dataclass
class Scale:
    index: int
    scale: float  # 90th percentile of |x|
    mean: float
    std: float


def rollout_observations(rollout: Any) -> np.ndarray:
    """The observations of a user's rollout ('obs' or 'observations', key or attribute), flattened over
    steps and envs: a (steps, envs, features) buffer becomes (samples, features)."""
    for key in ("obs", "observations"):
        value = rollout.get(key) if isinstance(rollout, dict) else getattr(rollout, key, None)
        if value is not None:
            x = to_numpy(value)
            square_frames = x.ndim == 3 and x.shape[1] == x.shape[2] and x.shape[1] >= 16  # (N, H, W) images
            return x.reshape(-1, x.shape[-1]) if x.ndim == 3 and not square_frames else x
    raise RoleError("rollout", f"has no 'obs' or 'observations' ({type(rollout).__name__})")


def observation_matrix(obs: np.ndarray) -> np.ndarray:
    """(samples, dimensions) for flat observations (or small arrays), (values, 1) for image-like ones."""
    x = np.asarray(obs, np.float64)
    if x.ndim == 2 or (x.ndim > 2 and x[0].size <= 64):
        return x.reshape(len(x), -1)
    return x.reshape(-1, 1)[:: max(1, x.size // 1_000_000)]


def observation_scales(obs: np.ndarray) -> list[Scale]:
    """Per-dimension scale of flat observations (one entry for image-like ones): the 90th percentile of
    |x|, robust to rare outliers, with the mean and std for the evidence."""
    x = observation_matrix(obs)
    raw = np.asarray(obs)
    if raw.ndim > 2 and raw[0].size > 64:
        # image-like: the pixels pooled; a sparse frame (a few lit pixels on black) is mostly zeros, so its scale is
        # read off the pixels that are lit (a 0-255 frame whose lit pixels are 255 is unscaled, however few)
        lit = np.abs(x[x != 0])
        scale = float(np.percentile(lit, 90)) if lit.size else 0.0
        return [Scale(0, scale, float(x.mean()), float(x.std()))]
    p90 = np.percentile(np.abs(x), 90, axis=0)
    return [Scale(i, float(p90[i]), float(x[:, i].mean()), float(x[:, i].std())) for i in range(x.shape[1])]


# --------------------------------------------------------------------------------------------------
# running statistics and buffers, for checkpoint round-trips


@dataclass
class Holder:
    """Where a statistic lives on a live object, so that R4 can swap it out and put it back."""

    owner: Any
    attr: str


def _rms_like(x: Any) -> bool:
    return all(hasattr(x, a) for a in ("mean", "var", "count")) and not callable(x.mean)


def _is_replay_buffer(x: Any) -> bool:
    return any(
        c.__name__ == "ReplayBuffer" and c.__module__.startswith("stable_baselines3") for c in type(x).__mro__
    ) or (hasattr(x, "observations") and hasattr(x, "pos") and hasattr(x, "full") and hasattr(x, "buffer_size"))


is_replay_buffer = _is_replay_buffer  # R4 names a plain loop's buffer arrays in its fix

RMS_ATTRS = ("obs_rms", "ret_rms", "return_rms", "reward_rms")


def running_statistics(root: Any, depth: int = 6) -> tuple[dict[str, Any], list[Holder]]:
    """Running normalisation statistics and replay buffers reachable from ``root`` (an SB3 algorithm,
    VecNormalize or any VecEnv wrapper chain, gymnasium Normalize* wrappers, objects with ``obs_rms`` /
    ``ret_rms`` / ``return_rms``, replay buffers, and dicts/lists/tuples of those): name -> value, and
    where each lives."""
    stats: dict[str, Any] = {}
    holders: list[Holder] = []
    seen: set[int] = set()

    def add(name: str, value: Any) -> None:
        key, i = name, 2
        while key in stats:
            key, i = f"{name}#{i}", i + 1
        stats[key] = value

    def visit(obj: Any, d: int) -> None:
        if obj is None or d < 0 or id(obj) in seen or isinstance(obj, (str, bytes, int, float, bool, np.ndarray)):
            return
        seen.add(id(obj))
        if isinstance(obj, dict):
            for v in obj.values():
                visit(v, d - 1)
            return
        if isinstance(obj, (list, tuple)):
            for v in obj[:16]:
                visit(v, d - 1)
            return
        own = getattr(obj, "__dict__", {})  # SB3 VecEnvWrapper forwards unknown attributes to the inner env
        for attr in RMS_ATTRS:
            rms = own.get(attr)
            if isinstance(rms, dict):
                holders.append(Holder(obj, attr))
                for k, v in rms.items():
                    if _rms_like(v):
                        _add_rms(add, f"{attr}[{k}]", v)
            elif rms is not None and _rms_like(rms):
                holders.append(Holder(obj, attr))
                _add_rms(add, "ret_rms" if attr in ("return_rms", "reward_rms") else attr, rms)
        rb = own.get("replay_buffer")
        if rb is not None and _is_replay_buffer(rb):
            holders.append(Holder(obj, "replay_buffer"))
            if id(rb) not in seen:
                seen.add(id(rb))
                _add_buffer(add, rb)
        elif _is_replay_buffer(obj):
            _add_buffer(add, obj)
        for attr in ("venv", "env"):  # SB3 VecEnvWrapper, gymnasium (vector) wrappers, an algorithm's env
            inner = own.get(attr)
            if inner is not None and is_env(inner):
                # a wrapper chain costs no depth: CleanRL's sub-envs hold NormalizeObservation under 4 wrappers
                visit(inner, d if is_env(obj) else d - 1)
        subs = own.get("envs")  # gymnasium's SyncVectorEnv: CleanRL wraps each sub-env in NormalizeObservation
        if isinstance(subs, (list, tuple)):
            for i, sub in enumerate(subs[:16]):
                before = len(stats)
                visit(sub, d - 1)
                for key in list(stats)[before:]:  # which sub-env each statistic belongs to
                    stats[f"envs[{i}].{key}"] = stats.pop(key)

    visit(root, depth)
    return stats, holders


def _add_rms(add: Callable[[str, Any], None], name: str, rms: Any) -> None:
    add(f"{name}.mean", np.array(rms.mean, np.float64))
    add(f"{name}.var", np.array(rms.var, np.float64))
    add(f"{name}.count", float(np.asarray(rms.count)))


def _add_buffer(add: Callable[[str, Any], None], rb: Any) -> None:
    n = int(rb.buffer_size if rb.full else rb.pos)
    digest = hashlib.sha1()
    for field in ("observations", "actions", "rewards", "dones"):
        arr = getattr(rb, field, None)
        if isinstance(arr, dict):
            for k in sorted(arr):
                digest.update(np.ascontiguousarray(arr[k][:n]).tobytes())
        elif arr is not None:
            digest.update(np.ascontiguousarray(arr[:n]).tobytes())
    add("replay_buffer.transitions", n)
    add("replay_buffer.content", digest.hexdigest()[:12])


def fresh_statistics(stats: dict[str, Any]) -> bool:
    """Every running statistic still at its initial value (count ~1e-4) and every buffer empty."""
    counts = [v for k, v in stats.items() if k.endswith(".count")]
    transitions = [v for k, v in stats.items() if k.endswith(".transitions")]
    return all(c <= 1 for c in counts) and all(n == 0 for n in transitions)


def blank_copy(value: Any) -> Any:
    """A copy of a statistics holder's value reset to its initial state (mean 0, var 1, count 1e-4; an
    empty buffer), to stand in for the live one while the user's load runs."""
    if isinstance(value, dict):
        return {k: blank_copy(v) for k, v in value.items()}
    out = copy.deepcopy(value)
    if _rms_like(out):
        out.mean = np.zeros_like(np.asarray(out.mean, np.float64))
        out.var = np.ones_like(np.asarray(out.var, np.float64))
        out.count = 1e-4
    elif _is_replay_buffer(out):
        out.pos, out.full = 0, False
    return out


def same_value(a: Any, b: Any, rtol: float) -> bool:
    if isinstance(a, str) or isinstance(b, str):
        return a == b
    a, b = np.asarray(a, np.float64), np.asarray(b, np.float64)
    return a.shape == b.shape and bool(np.allclose(a, b, rtol=rtol, atol=0.0))


def fmt_values(v: Any, limit: int = 5) -> str:
    if isinstance(v, str):
        return v
    a = np.asarray(v, np.float64).reshape(-1)
    if a.size == 1:
        return f"{a[0]:.4g}"
    body = ", ".join(f"{x:.4g}" for x in a[:limit])
    return f"[{body}{', …' if a.size > limit else ''}]"


# --------------------------------------------------------------------------------------------------
# logs of a short run (TRL log_history, or any list of dicts)

LOG_KEYS = {
    **detectors.LOG_KEYS,  # R1's reward, kl and length: shared with the watch of a real run
    "value_loss": ("train/value_loss", "value_loss", "loss/value", "vf_loss"),
    "zero_std": ("frac_reward_zero_std",),
    "learning_rate": ("train/learning_rate", "learning_rate"),
}


#: what a tag's last part (split at "/", "_", "-", ".") must hold to name a quantity when none of its
#: known keys is logged (TensorBoard-style tags of hand-written loops: CleanRL's charts/episodic_return,
#: losses/qf_loss, losses/td_loss, losses/value_loss, losses/approx_kl): (any of these words, none of these). A
#: length is read from its known keys only: a per-episode tag (charts/episodic_length) is one noisy episode a row,
#: where CartPole's return is its length, so a bad episode would read as a reward drop with a length collapse
TAG_WORDS = {
    "reward": (
        {"return", "returns", "reward", "rewards", "rew"},
        {"loss", "std", "min", "max", "var", "length", "len"},
    ),
    "value_loss": ({"value", "vf", "qf", "qf1", "qf2", "critic", "td", "q"}, {"actor", "policy", "alpha", "entropy"}),
    "kl": ({"kl"}, {"coef", "beta", "target", "loss"}),
}
#: the word that must be there too (a value *loss*, not the values themselves)
TAG_NEEDS = {"value_loss": "loss"}
#: the keys read as the step of a row, in order (CleanRL's writer.add_scalar(tag, value, global_step))
STEP_KEYS = ("step", "global_step", "time/total_timesteps")


def _tag_words(key: str) -> set[str]:
    return {w for w in re.split(r"[/_.\-]+", key.lower().rsplit("/", 1)[-1]) if w}


def _tagged_keys(entries: list[Any], what: str) -> list[str]:
    """The keys of a log that name ``what`` by their words, the plainest first (qf_loss before qf1_loss)."""
    if what not in TAG_WORDS:
        return []
    anyof, noneof = TAG_WORDS[what]
    need = TAG_NEEDS.get(what)
    keys = dict.fromkeys(k for e in entries if isinstance(e, dict) for k in e if isinstance(k, str))
    found = []
    for key in keys:
        words = _tag_words(key)
        if words & anyof and not words & noneof and (need is None or need in words) and key not in STEP_KEYS:
            found.append(key)
    return sorted(found, key=lambda k: (any(c.isdigit() for c in k), len(k)))


def _step_of(entry: dict, index: int) -> int:
    for key in STEP_KEYS:
        value = entry.get(key)
        if isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(float(value)):
            return int(value)
    return index


def log_series(log: Any, what: str) -> tuple[str | None, list[tuple[int, float]]]:
    """(key found, [(step, value)]) of one quantity in a list-of-dicts log: its known keys first, then a
    tag whose words name it (:data:`TAG_WORDS`)."""
    entries = list(log or [])
    for key in (*LOG_KEYS[what], *_tagged_keys(entries, what)):
        points = [
            (_step_of(e, i), float(e[key]))
            for i, e in enumerate(entries)
            if isinstance(e, dict)
            and isinstance(e.get(key), (int, float))
            and not isinstance(e.get(key), bool)
            and math.isfinite(float(e[key]))
        ]
        if points:
            return key, points
    return None, []


class TrainLog(list):
    """A log derived from a user's object (list of dicts per logged step), with where it was read."""

    source: str = "dlcheck_train_log"


class LogUnavailable(Exception):
    """An SB3 algorithm whose logger keeps no history R1 can read; the message says why and how."""


#: SB3 logs the env steps done so far under this key: the step of each row
SB3_STEP_KEY = "time/total_timesteps"


def _log_number(value: Any) -> Any:
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        return float(value)
    try:
        return float(value)
    except (TypeError, ValueError):
        return None


def sb3_train_log(algo: Any) -> TrainLog:
    """The log of an SB3 algorithm's run, read back from its logger's file outputs: a csv logger's
    progress.csv or a json logger's progress.json (``configure(folder, ["csv"])`` then
    ``model.set_logger(...)`` or ``learn()``), one dict per dump with ``step`` = time/total_timesteps.
    Raises :class:`LogUnavailable` when the logger writes no such file (SB3's default logger: stdout
    or nothing; TensorBoard event files are not read)."""
    import csv
    import json
    from pathlib import Path

    name = type(algo).__name__
    logger = getattr(algo, "_logger", None)
    if logger is None:
        raise LogUnavailable(f"{name} has no logger yet: call model.learn(...) in the fixture")
    formats = list(getattr(logger, "output_formats", None) or [])
    kinds = [type(f).__name__ for f in formats]
    rows: list[dict[str, Any]] = []
    source = ""
    for fmt in formats:
        path = getattr(getattr(fmt, "file", None), "name", None)
        kind = type(fmt).__name__
        if not isinstance(path, str) or kind not in ("CSVOutputFormat", "JSONOutputFormat"):
            continue
        getattr(fmt.file, "flush", lambda: None)()
        text = Path(path).read_text()
        if kind == "CSVOutputFormat":
            raw = list(csv.DictReader(text.splitlines()))
        else:
            raw = [json.loads(line) for line in text.splitlines() if line.strip()]
        rows = [{k: v for k, v in ((k, _log_number(v)) for k, v in r.items()) if v is not None} for r in raw]
        source = f"{name}'s logger ({Path(path).name} in {Path(path).parent})"
        break
    if not source:
        pending = len(getattr(logger, "name_to_value", None) or {})
        raise LogUnavailable(
            f"{name}'s logger writes no history R1 can read (outputs: "
            f"{', '.join(k.replace('OutputFormat', '').lower() for k in kinds) or 'none'}; name_to_value holds only "
            f"the {pending} value(s) recorded since its last dump): give it a csv output, "
            f"model.set_logger(stable_baselines3.common.logger.configure(folder, ['stdout', 'csv'])), before "
            "model.learn(...), or define dlcheck_train_log"
        )
    log = TrainLog()
    for i, row in enumerate(rows):
        step = row.get(SB3_STEP_KEY)
        log.append({**row, "step": int(step) if step is not None and math.isfinite(step) else i})
    log.source = source
    return log


def iter_minibatches(value: Any) -> Iterator[Any]:
    """The advantages of each minibatch from dlcheck_advantage_minibatches: an iterable, or a callable
    returning one, of arrays/tensors or of dicts with an 'advantages' entry."""
    items = user_call("advantage_minibatches", value) if callable(value) else value
    for item in user_call("advantage_minibatches", lambda: list(items)):
        if isinstance(item, dict):
            if "advantages" not in item:
                raise RoleError(
                    "advantage_minibatches", f"yields dicts without an 'advantages' entry (keys: {sorted(item)})"
                )
            item = item["advantages"]
        elif hasattr(item, "advantages"):  # SB3 RolloutBufferSamples
            item = item.advantages
        yield to_numpy(item).reshape(-1)


@dataclass
class Minibatches:
    """Derived dlcheck_advantage_minibatches of an SB3 algorithm: the minibatches its ``train()`` would
    form from a rollout, with its advantage normalisation applied; ``recipe`` is the level the
    algorithm's recipe whitens at ("minibatch" for PPO, None for A2C without normalize_advantage)."""

    batches: list[np.ndarray]
    source: str
    recipe: str | None

    def __iter__(self) -> Iterator[np.ndarray]:
        return iter(self.batches)


def sb3_minibatches(algo: Any, rollout: PolicyRollout) -> Minibatches:
    adv = rollout.advantages
    batch_size = getattr(algo, "batch_size", None) or len(adv)
    order = np.random.default_rng(0).permutation(len(adv))
    normalize = bool(getattr(algo, "normalize_advantage", False))
    batches = []
    for start in range(0, len(adv), batch_size):
        mb = adv[order[start : start + batch_size]].astype(np.float32)
        if normalize and len(mb) > 1:  # PPO.train / A2C.train: (a - mean) / (std + 1e-8), std unbiased
            mb = (mb - mb.mean()) / (mb.std(ddof=1) + 1e-8)
        batches.append(mb.astype(np.float64))
    name = type(algo).__name__
    recipe = "minibatch" if getattr(algo, "batch_size", None) is not None or normalize else None
    source = f"{name}.train()'s minibatches of {batch_size} from {rollout.source}, normalize_advantage={normalize}"
    return Minibatches(batches, source, recipe)


def minibatch_stats(mb: np.ndarray) -> tuple[int, float, float]:
    n = len(mb)
    return n, float(mb.mean()), float(mb.std(ddof=1)) if n > 1 else 0.0


def whitened(mb: np.ndarray, tol: float) -> bool:
    """Mean 0 and std 1 (with either the biased or the unbiased std) within ``tol``."""
    n, mean, std = minibatch_stats(mb)
    if n < 2:
        return True
    gap = math.sqrt(n / (n - 1)) - 1
    return abs(mean) <= tol and (1 - gap - tol) <= std <= 1 + tol


__all__ = [
    "AdvantageFn",
    "Comparison",
    "Minibatches",
    "PolicyRollout",
    "Rollout",
    "Scale",
    "TrainLog",
    "advantage_fn",
    "compare",
    "reference_gae",
    "reward_groups",
    "rollouts",
    "running_statistics",
    "search",
    "show_rollout",
]
