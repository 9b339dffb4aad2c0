"""R7: GAE / returns wrong at episode ends."""

from __future__ import annotations

from typing import Any

import numpy as np

from ...errors import MISSING, RoleError
from ...registry import Setting, check
from ...roles import is_hf_trainer
from ...session import user_call
from . import measure as rl


@check(
    "R7",
    domain="rl",
    title="GAE / returns wrong at episode ends",
    roles=(),
    optional_roles=("advantage_fn", "algorithm", "env", "trainer"),
    settings=(
        Setting(
            "max_examples",
            200,
            "rollouts Hypothesis generates before it concludes; each mistake R7 names (no "
            "bootstrap at truncation, ends ignored, chain not cut, last step, off-by-one flags, …) shows within "
            "the first 20 generated rollouts, and 200 cost about a second for a torch GAE",
        ),
        Setting(
            "max_steps",
            8,
            "longest generated rollout; every mistake at episode ends already shows on 1-3 "
            "steps, and 8 keeps the evidence table within a terminal line",
        ),
        Setting("max_envs", 2, "most parallel envs per rollout: 2 catch functions that mix envs up"),
        Setting(
            "gamma",
            0.99,
            "discount used when dlcheck_advantage_fn does not say (advantage_fn(gamma=...)) "
            "and no dlcheck_algorithm gives it; 0.99 is the CleanRL and SB3 default",
        ),
        Setting(
            "gae_lambda",
            0.95,
            "GAE λ used likewise; 0.95 is the CleanRL and SB3 default (1.0 for plain discounted returns)",
        ),
        Setting(
            "rtol", 1e-4, "relative tolerance against the float64 reference: float32 GAE over 8 steps is within 1e-6"
        ),
        Setting("atol", 1e-4, "absolute tolerance, likewise"),
    ),
)
def check_gae_episode_ends(dlcheck):
    """Your advantage/returns function agrees with a reference GAE on rollouts with episode ends anywhere.

    What it does
        A Hypothesis property test inside the check (derandomised, no example database): it generates
        rollouts of 1-8 steps on 1-2 envs that mix terminations, time-limit truncations, both at once,
        and episode starts at every position, the rollout's last step included, calls
        dlcheck_advantage_fn on each, and compares advantages (and returns, when given: the λ-return
        advantages + values, or the plain discounted return) with a float64 reference GAE. A
        disagreement is shrunk to the smallest rollout that shows it, printed with both results side by
        side; the mistake is named when the function's outputs on 40 more rollouts all equal a known one.
        Calling convention: see pytest_dlcheck.rl.Rollout — a Rollout, or keyword arrays named after
        its fields; SB3-derived: the algorithm's rollout buffer class, with the time-limit bootstrap
        folded into the reward as collect_rollouts does. Layout: "same_step" (SB3 VecEnvs, gymnasium
        SAME_STEP: every step a real transition, the final observation's value in next_values) or
        "next_step" (gymnasium 1.x vector envs' default: a reset step after each episode end), taken from
        advantage_fn(autoreset=...), else from a gymnasium vector dlcheck_env.
    Why it is bad
        Bootstrapping through a termination adds value that does not exist; not bootstrapping at a
        time-limit truncation (done = terminated or truncated) teaches the critic that the episode ended
        when it was only cut, biasing values low near the time limit; carrying the λ-sum across an
        episode boundary leaks the next episode's advantages into this one. Training still "works", just
        worse, so nothing points at the GAE.
    Example
        done = np.logical_or(terminations, truncations)
        nextnonterminal = 1.0 - done[t]                      # truncation treated as termination
        delta = rewards[t] + gamma * next_values[t] * nextnonterminal - values[t]
    Use instead
        delta = rewards[t] + gamma * next_values[t] * (1 - terminated[t]) - values[t]
        lastgaelam = delta + gamma * lam * (1 - (terminated[t] | truncated[t])) * lastgaelam
        with next_values[t] = V(final observation) at an episode end (SB3: info["terminal_observation"];
        gymnasium SAME_STEP: info["final_obs"]), V(next obs) otherwise; or keep done in the GAE and add
        gamma * V(final observation) to the reward of truncated steps, as SB3's collect_rollouts does.
    Known problems
        Checks the function, not the loop that fills its inputs: a rollout loop that stores the reset
        observation's value as the final one is not seen. Under "next_step", reset steps are not compared
        (mask them out of the loss yourself). Functions with gamma/λ baked in must say so
        (advantage_fn(gamma=..., gae_lambda=...)) or match R7.gamma / R7.gae_lambda. Monte-Carlo returns
        over complete episodes (REINFORCE) never bootstrap: R7 is for value-bootstrapped estimators.
    Not applicable
        Off-policy algorithms (SB3 DQN, SAC, TD3: one-step TD targets from a replay buffer, no GAE) and
        critic-free RL on language models (a TRL trainer such as GRPOTrainer: group-normalised rewards, R3).
    """
    if not dlcheck.has("advantage_fn"):
        _without_advantage_fn(dlcheck)
    spec = rl.as_advantage_fn(dlcheck.role("advantage_fn"))
    if rl.hypothesis_missing():
        dlcheck.skip(rl.hypothesis_missing())
    autoreset = spec.autoreset or _env_autoreset(dlcheck) or rl.SAME_STEP
    gamma = spec.gamma if spec.gamma is not None else dlcheck.setting("gamma")
    lam = spec.gae_lambda if spec.gae_lambda is not None else dlcheck.setting("gae_lambda")
    rtol, atol = dlcheck.setting("rtol"), dlcheck.setting("atol")
    shape_kw = dict(
        max_steps=dlcheck.setting("max_steps"),
        max_envs=dlcheck.setting("max_envs"),
        gamma=gamma,
        gae_lambda=lam,
        autoreset=autoreset,
    )

    def run(r: rl.Rollout) -> tuple[Any, Any]:
        return rl.parse_advantage_output(spec(r), (r.num_steps, r.num_envs))

    seen = {"rollouts": 0, "terminated": 0, "truncated": 0}

    def disagrees(r: rl.Rollout) -> bool:
        seen["rollouts"] += 1
        seen["terminated"] += int(np.asarray(r.terminated).sum())
        seen["truncated"] += int(np.asarray(r.truncated).sum())
        try:
            adv, ret = run(r)
        except Exception:  # noqa: BLE001 - a rollout the function cannot take is a counterexample too
            return True
        return not rl.compare(r, adv, ret, rtol, atol).agrees

    examples = dlcheck.setting("max_examples")
    smallest = rl.search(rl.rollouts(**shape_kw), disagrees, examples)
    if smallest is None:
        dlcheck.measured(
            f"{spec.source} agrees with the float64 reference GAE on {seen['rollouts']} Hypothesis-generated "
            f"rollouts (1-{shape_kw['max_steps']} steps × 1-{shape_kw['max_envs']} envs, {seen['terminated']} "
            f"terminated and {seen['truncated']} truncated steps among them) within rtol {rtol:g} / atol {atol:g}",
            f"gamma {gamma:g}, gae_lambda {lam:g}, {autoreset} autoreset",
            rollouts=seen["rollouts"],
            terminated_steps=seen["terminated"],
            truncated_steps=seen["truncated"],
            gamma=gamma,
            gae_lambda=lam,
            autoreset=autoreset,
        )
        return
    smallest = rl.reduce_rollout(smallest, disagrees)
    try:
        adv, ret = dlcheck.call("advantage_fn", lambda: run(smallest))
    except RoleError as exc:  # the function cannot take this rollout: say which one
        raise RoleError(exc.role, f"{exc.message}, on the generated rollout {rl.describe(smallest)}") from exc
    comparison = rl.compare(smallest, adv, ret, rtol, atol)
    outputs = []
    for r in rl.sample_rollouts(40, **shape_kw):
        try:
            outputs.append((r, *run(r)))
        except Exception:  # noqa: BLE001 - the shrunk example already is the evidence
            break
    mistake = rl.identify_mistake(outputs, rtol, atol) if len(outputs) == 40 else None

    where = rl.describe_kinds(smallest, comparison.mismatches())
    evidence = [
        f"{spec.source} disagrees with the reference GAE at {where}; the smallest rollout that shows "
        f"it (Hypothesis search of up to {examples} rollouts, shrunk):"
    ] + rl.show_rollout(comparison)
    ended = np.asarray(smallest.dones)
    if mistake is not None:
        cause = rl.VARIANTS[mistake]
        evidence.append(f"on 40 more varied rollouts your {comparison.what} equal exactly what this mistake computes")
    elif not ended.any() and not np.asarray(smallest.episode_starts).any():
        cause = (
            f"the disagreement needs no episode end: the discounting itself differs — the function should use "
            f"gamma {gamma:g} and gae_lambda {lam:g} from the rollout (or declare its own with "
            f"pytest_dlcheck.rl.advantage_fn(fn, gamma=..., gae_lambda=...))"
        )
    else:
        cause = f"the {comparison.what} are wrong at {where}: episode ends are bootstrapped or accumulated wrongly"
    dlcheck.fail(evidence, cause, rl.FIX)


def _without_advantage_fn(dlcheck) -> None:
    """No advantage function: the pipeline has none to check, or the skip names the fixture."""
    algo, trainer = dlcheck.role("algorithm"), dlcheck.role("trainer")
    if algo is not MISSING and rl.is_sb3_algorithm(algo) and not rl.is_on_policy(algo):
        dlcheck.not_applicable(
            f"{type(algo).__name__} is off-policy: it learns from one-step TD targets on its replay buffer, with no "
            "GAE or returns over rollouts"
        )
    if trainer is not MISSING and is_hf_trainer(trainer):
        dlcheck.not_applicable(
            f"dlcheck_trainer is a {type(trainer).__name__}: it has no value function, so no GAE (GRPO's advantages "
            "are group-normalised rewards, which R3 checks)"
        )
    dlcheck.require("advantage_fn")  # skips, naming the fixture


def _env_autoreset(dlcheck) -> str | None:
    """ "next_step" when dlcheck_env is (or its factory builds) a gymnasium vector env in NEXT_STEP
    autoreset mode, gymnasium 1.x's default; "same_step" for SAME_STEP; None when it does not say."""
    env = dlcheck.role("env")
    if env is MISSING:
        return None
    return dlcheck.memo(env, "rl:autoreset", lambda: _autoreset_of(env))


def _autoreset_of(env: Any) -> str | None:
    built = None
    if callable(env) and not rl.is_env(env):
        built = env = _build_env(env)
    try:
        mode = (getattr(env, "metadata", None) or {}).get("autoreset_mode")
        if mode is None:
            return None
        return rl.NEXT_STEP if "NEXT_STEP" in str(mode).upper() else rl.SAME_STEP
    finally:
        if built is not None and hasattr(built, "close"):
            built.close()


def _build_env(factory: Any) -> Any:
    return user_call("env", factory)
