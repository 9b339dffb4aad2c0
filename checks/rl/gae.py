"""R7: GAE / returns wrong at episode ends."""

from __future__ import annotations

from typing import Any

import numpy as np

from ...errors import MISSING
from ...registry import Setting, check
from ...roles import is_hf_trainer
from ...session import user_call
from . import measure as rl


@check(
    "R7",
    domain="rl",
    title="GAE / returns wrong at episode ends",
    roles=(),
    optional_roles=("advantage_fn", "td_target_fn", "algorithm", "env", "trainer", "replay_buffer"),
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
        Setting(
            "truncation_probe_steps",
            200,
            "random-action steps of a copy of an SB3 off-policy algorithm's env, to see whether it truncates "
            "episodes when no TimeLimit and no stored timeout shows it (an env that truncates itself: SB3's "
            "BitFlippingEnv); a max_steps attribute lengthens the probe to reach it, up to 10 times this",
        ),
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
        Off-policy (DQN, SAC, TD3: one-step TD targets from a replay buffer): dlcheck_td_target_fn, your loop's
        stored done and target (see pytest_dlcheck.rl.Transitions), is compared with r + γ·(1 − terminated)·
        next_value on batches holding terminated, truncated and both-flagged transitions; an SB3 off-policy
        dlcheck_algorithm is judged by its replay buffer's handle_timeout_termination, shown on a fresh buffer
        of its class and arguments given transitions the way the algorithm stores them; whether its env
        truncates episodes is read from what the env and the buffer produce: a TimeLimit anywhere in its wrapper
        chain, the timeouts its replay buffer stored (SB3 stores every truncated=True its VecEnv reports, an env
        that truncates itself included), else, where the buffer would mistreat truncations, a short random-action
        probe of a deep copy of the env.
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
        Off-policy: rb.add(obs, real_next_obs, actions, rewards, terminations | truncations, infos), then
        td_target = rewards + gamma * target_max * (1 - data.dones); or SB3's DQN(...,
        optimize_memory_usage=True, replay_buffer_kwargs=dict(handle_timeout_termination=False)).
    Use instead
        delta = rewards[t] + gamma * next_values[t] * (1 - terminated[t]) - values[t]
        lastgaelam = delta + gamma * lam * (1 - (terminated[t] | truncated[t])) * lastgaelam
        with next_values[t] = V(final observation) at an episode end (SB3: info["terminal_observation"];
        gymnasium SAME_STEP: info["final_obs"]), V(next obs) otherwise; or keep done in the GAE and add
        gamma * V(final observation) to the reward of truncated steps, as SB3's collect_rollouts does.
        Off-policy: store terminations only (CleanRL's dqn.py: rb.add(..., terminations, infos)), or keep SB3's
        handle_timeout_termination=True (its default).
    Known problems
        Checks the function, not the loop that fills its inputs: a rollout loop that stores the reset
        observation's value as the final one is not seen. Under "next_step", reset steps are not compared
        (mask them out of the loss yourself). Functions with gamma/λ baked in must say so
        (advantage_fn(gamma=..., gae_lambda=...)) or match R7.gamma / R7.gae_lambda. Monte-Carlo returns
        over complete episodes (REINFORCE) never bootstrap: R7 is for value-bootstrapped estimators.
        Off-policy: the TD target function is checked, not the loop that fills real_next_obs (the final
        observation at a truncation); n-step targets are not generated; an SB3 replay buffer class without
        handle_timeout_termination skips. A buffer that would sample truncations as terminations on an env in
        which nothing shows a truncation (no TimeLimit, no max_episode_steps, none in the probe) skips: a
        trained policy's longer episodes may still be truncated. HER's relabelled samples keep the stored
        episode's done; R7 does not recompute it for the new goal.
    Not applicable
        Critic-free RL on language models (a TRL trainer such as GRPOTrainer: group-normalised rewards, R3).
    """
    if not dlcheck.has("advantage_fn"):
        if dlcheck.has("td_target_fn"):
            return _check_td_targets(dlcheck, rl.as_td_target_fn(dlcheck.role("td_target_fn")))
        algo = dlcheck.role("algorithm")
        if algo is not MISSING and rl.is_sb3_algorithm(algo) and not rl.is_on_policy(algo):
            return _check_sb3_replay_buffer(dlcheck, algo)
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
    adv, ret = dlcheck.call(
        "advantage_fn", lambda: run(smallest), synthetic=f"the generated rollout {rl.describe(smallest)}"
    )
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
    """No advantage function nor TD target: the pipeline has none to check, or the skip names the fixtures."""
    trainer = dlcheck.role("trainer")
    if trainer is not MISSING and is_hf_trainer(trainer):
        dlcheck.not_applicable(
            f"dlcheck_trainer is a {type(trainer).__name__}: it has no value function, so no GAE (GRPO's advantages "
            "are group-normalised rewards, which R3 checks)"
        )
    if dlcheck.has("replay_buffer"):  # a hand-written off-policy loop: its target is what R7 can check
        dlcheck.require("td_target_fn")
    dlcheck.require("advantage_fn")  # skips, naming the fixture


TD_FIX = (
    "store terminated, not terminated or truncated, as the replay buffer's done: rb.add(obs, real_next_obs, actions, "
    "rewards, terminations, infos) with real_next_obs[i] = infos['final_obs'][i] where truncated (CleanRL), and "
    "target = r + γ·(1 − done)·next_value; with SB3's ReplayBuffer given done = terminated or truncated, keep "
    "handle_timeout_termination=True so that infos['TimeLimit.truncated'] is stored as a timeout and sampled as "
    "done·(1 − timeout)"
)


def _check_td_targets(dlcheck, spec: rl.TDTargetFn) -> None:
    """An off-policy loop's one-step TD target against r + γ·(1 − terminated)·next_value."""
    gamma = spec.gamma if spec.gamma is not None else dlcheck.setting("gamma")
    rtol, atol = dlcheck.setting("rtol"), dlcheck.setting("atol")
    batches = rl.td_batches(gamma)
    outputs = []
    for b in batches:
        targets = dlcheck.call("td_target_fn", lambda b=b: spec(b), synthetic="a generated batch of transitions")
        outputs.append((b, targets))
    wrong = [(b, t) for b, t in outputs if not np.allclose(t, rl.reference_td(b), rtol=rtol, atol=atol)]
    counts = {k: sum(rl.td_kind(b, i) == k for b in batches for i in range(len(b.rewards))) for k in rl.TD_KINDS}
    if not wrong:
        dlcheck.measured(
            f"{spec.source} agrees with r + γ·(1 − terminated)·next_value on {sum(counts.values())} transitions "
            f"({counts['terminated']} terminated, {counts['truncated']} truncated, {counts['both']} both, "
            f"{counts['running']} inside an episode) within rtol {rtol:g} / atol {atol:g}: time-limit truncations "
            "are bootstrapped, terminations are not",
            f"gamma {gamma:g}",
            transitions=sum(counts.values()),
            truncated=counts["truncated"],
            terminated=counts["terminated"],
            gamma=gamma,
        )
        return
    mistake = next(
        (
            name
            for name in rl.TD_VARIANTS
            if all(np.allclose(t, rl.reference_td(b, name), rtol=rtol, atol=atol) for b, t in outputs)
        ),
        None,
    )
    b, targets = wrong[0]
    ref = rl.reference_td(b)
    bad = ~np.isclose(targets, ref, rtol=rtol, atol=atol)
    kinds = sorted({rl.td_kind(b, i) for i in np.flatnonzero(bad)}, key=rl.TD_KINDS.index)
    evidence = [
        f"{spec.source} disagrees with r + γ·(1 − terminated)·next_value (γ {gamma:g}) at the {' and '.join(kinds)} "
        f"transitions of {len(wrong)} of {len(batches)} batches; the first:"
    ]
    for i in range(min(len(ref), 8)):
        kind = rl.td_kind(b, i)
        expect = "r + γ·next_value" if not b.terminated[i] else "r"
        evidence.append(
            f"{kind:>10}: reward {b.rewards[i]:.3g}, next_value {b.next_values[i]:.3g} -> yours {targets[i]:.4g}, "
            f"reference {ref[i]:.4g} ({expect}){'   <-' if bad[i] else ''}"
        )
    if mistake is not None:
        evidence.append(f"on all {len(batches)} batches your targets equal exactly what this mistake computes")
        cause = rl.TD_VARIANTS[mistake]
    else:
        cause = f"the TD targets are wrong at {' and '.join(kinds)} transitions: episode ends are bootstrapped wrongly"
    dlcheck.fail(evidence, cause, TD_FIX)


def _check_sb3_replay_buffer(dlcheck, algo: Any) -> None:
    """An SB3 off-policy algorithm stores the VecEnv's done (terminated or truncated): its replay buffer's
    handle_timeout_termination decides whether a time-limit truncation is sampled as a termination."""
    name = type(algo).__name__
    rb = getattr(algo, "replay_buffer", None)
    if rb is None:
        dlcheck.skip(f"{name} has no replay buffer yet (it is built by _setup_model): R7 reads its arguments")
    handle = getattr(rb, "handle_timeout_termination", None)
    if handle is None:
        dlcheck.skip(
            f"{name}'s replay buffer ({type(rb).__name__}) has no handle_timeout_termination: R7 cannot tell how "
            "it samples a time-limit truncation (define dlcheck_td_target_fn)"
        )
    try:
        sampled = rl.sb3_sampled_dones(algo)
    except Exception as exc:  # noqa: BLE001 - a buffer class needing more (HER's env): the flag alone says it
        sampled, why = None, f"{type(exc).__name__}: {' '.join(str(exc).split())[:100]}"
    else:
        why = ""
    cls = type(rb).__name__
    stored = int(rb.buffer_size if rb.full else rb.pos) * int(getattr(rb, "n_envs", 1))
    shown = (
        f"a fresh {cls} with {name}'s arguments, given transitions as {name}._store_transition adds them (done = "
        f"terminated or truncated, infos['TimeLimit.truncated']), samples a truncation with done "
        f"{sampled['truncated']:g} and a termination with done {sampled['terminated']:g}"
        if sampled is not None
        else f"(a fresh {cls} could not be built to show it: {why})"
    )
    bootstraps = handle and (sampled is None or (sampled["truncated"] == 0 and sampled["terminated"] == 1))
    # the env is stepped (a copy of it) only where the verdict depends on whether it truncates
    truncation = rl.sb3_truncation(algo, 0 if bootstraps else dlcheck.setting("truncation_probe_steps"))
    limit = f" (time limit {truncation.limit} steps)" if truncation.limit is not None else ""
    truncates = (
        f"its env truncates episodes: {truncation.shown}"
        if truncation.seen
        else f"no truncation was seen ({truncation.shown}); the buffer would bootstrap one"
    )
    if bootstraps:
        timeouts = getattr(rb, "timeouts", None)
        seen = int(np.asarray(timeouts).sum()) if timeouts is not None and stored else 0
        dlcheck.measured(
            f"{name}.replay_buffer ({cls}) has handle_timeout_termination=True: its env's truncations"
            f"{limit} are stored as timeouts and sampled as done·(1 − timeout), so r + γ·(1 − done)·Q(s') "
            f"bootstraps them; {seen} of its {stored} stored transitions are such timeouts",
            truncates,
            shown,
            handle_timeout_termination=True,
            stored=stored,
            timeouts=seen,
            truncation_seen=truncation.seen,
        )
        return
    if not truncation.seen:
        dlcheck.skip(
            f"{name}.replay_buffer ({cls}) has handle_timeout_termination={handle}: it would sample a truncation "
            f"as a termination, but R7 saw none: {truncation.shown}; whether the env truncates longer episodes "
            "(a trained policy's) is not known, so the TD target at truncations is not judged"
        )
    evidence = [
        f"{name}.replay_buffer ({cls}) has handle_timeout_termination={handle}"
        + (
            " (optimize_memory_usage=True, which SB3 cannot combine with it)"
            if getattr(rb, "optimize_memory_usage", False)
            else ""
        )
        + f": it samples the done {name} stores, terminated or truncated, so its env's truncations{limit} "
        "enter r + γ·(1 − done)·Q(s') as terminations",
        truncates,
        shown,
    ]
    dlcheck.fail(
        evidence,
        rl.TD_VARIANTS["truncation_as_termination"],
        f"keep SB3's default: {name}(..., replay_buffer_kwargs=dict(handle_timeout_termination=True))"
        + (
            " with optimize_memory_usage=False (the two cannot be combined)"
            if getattr(rb, "optimize_memory_usage", False)
            else ""
        )
        + ": the buffer stores infos['TimeLimit.truncated'] as a timeout and samples done·(1 − timeout)",
    )


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
