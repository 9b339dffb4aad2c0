"""R1: reward collapse / hacking, seen in the log of a short run."""

from __future__ import annotations

import numpy as np

from ... import detectors
from ...errors import MISSING
from ...registry import check
from ...roles import is_hf_trainer
from . import measure as rl

SB3_FIX = (
    "watch the episodes at that step (model.predict on the env); a reward that jumps with shorter episodes is a "
    "reward the env pays for ending early: fix the reward; a collapse with a KL spike is one update that moved the "
    "policy too far: lower learning_rate or fix its schedule (SB3 calls it with the progress remaining, 1 -> 0: "
    "lambda p: 3e-4 * p decays; print train/learning_rate), keep clip_range, set target_kl=0.02"
)


@check(
    "R1",
    domain="rl",
    title="reward hacking or collapse in a short run",
    roles=(),
    optional_roles=("train_log", "trainer", "algorithm"),
    settings=detectors.SETTINGS["R1"],
)
def check_reward_hacking(dlcheck):
    """A short run shows no reward jump together with a KL spike or a length collapse.

    What it does
        Reads reward, KL and completion (or episode) length per logged step from dlcheck_train_log (TRL's
        trainer.state.log_history: reward, kl, completions/mean_length; SB3-style keys rollout/ep_rew_mean,
        train/approx_kl, rollout/ep_len_mean are understood too, and the TensorBoard-style tags of a
        hand-written loop whose words name them: charts/episodic_return, losses/approx_kl; a row's step is
        its step, global_step or time/total_timesteps) or, for a Stable-Baselines3 user, from
        dlcheck_algorithm's logger after model.learn(): the progress.csv (or progress.json) its csv/json
        output wrote, one row per dump, its step time/total_timesteps. At each step after the first 3 it
        compares with the median of the steps before: a reward that moves by more than R1.reward_jump
        spreads in one step, at the same step as a KL above R1.kl_spike × its median or a length below
        R1.length_collapse × its median, fails.
    Why it is bad
        A policy that finds a flaw in the reward (an empty answer that a format reward accepts, a
        repeated token a reward model likes) raises the reward abruptly while it leaves the reference
        distribution (KL spike) or shortens its outputs to almost nothing; the mean reward curve alone
        looks like success.
    Example
        GRPO with a brevity reward and beta=0.0: at step 6 reward 0.12 -> 0.91, mean length 58 -> 3 tokens.
        PPO("MlpPolicy", "CartPole-v1", learning_rate=lambda p: 3e-4 if p > 0.25 else 3e-4 * 1000): a step
        decay written with * for / (SB3 passes the progress remaining, 1 -> 0); at the step the policy
        collapses: rollout/ep_rew_mean 25 -> 8.9, train/approx_kl 1e-4 -> 113, rollout/ep_len_mean 25 -> 8.9.
    Use instead
        Fix the reward (score the content, cap length terms, penalise empty answers), keep a KL term
        (GRPOConfig(beta=0.04)), and look at sampled completions at the step the jump happens.
    Known problems
        A smoke detector on a few logged steps: it needs the log of a run (trainer.train() with
        logging_steps=1 in the fixture) and at least R1.min_points logged steps; a gradual drift is not
        a jump. Fast genuine learning with a new behaviour can trip it: look at the completions. A log
        with rewards but neither KL nor lengths cannot tell a jump from hacking: the check skips. SB3's
        default logger (stdout, or nothing at verbose=0) and TensorBoard event files keep no history R1
        reads: it skips naming configure(folder, ["stdout", "csv"]). SB3's rollout/ep_rew_mean is a mean over
        the last stats_window_size (100) episodes: a collapse shows within one dump only when many short
        episodes fill that window.
    Not applicable
        Runs that log no reward: a supervised or DPO trainer given as dlcheck_trainer, a log without reward
        keys.
    """
    log = dlcheck.role("train_log")
    if log is MISSING:
        trainer, algo = dlcheck.role("trainer"), dlcheck.role("algorithm")
        if trainer is not MISSING and is_hf_trainer(trainer) and not rl.rewarded(trainer):
            dlcheck.not_applicable(
                f"dlcheck_trainer is a {type(trainer).__name__}: it trains without rewards, so its log has no reward "
                "to watch for hacking"
            )
        if algo is not MISSING and rl.is_sb3_algorithm(algo):
            try:
                log = rl.sb3_train_log(algo)
            except rl.LogUnavailable as exc:
                dlcheck.skip(f"missing role: define fixture dlcheck_train_log in conftest.py, or: {exc}")
        else:
            dlcheck.require("train_log")
    source = getattr(log, "source", "dlcheck_train_log")
    reward_key, rewards = rl.log_series(log, "reward")
    if not rewards:
        if isinstance(log, rl.TrainLog):  # an SB3 run's log: the episode statistics come from Monitor
            dlcheck.skip(
                f"{source} logs no rollout/ep_rew_mean: SB3 logs episode rewards and lengths only from envs wrapped "
                "in Monitor (make_vec_env wraps them), or no episode ended during the run"
            )
        dlcheck.not_applicable(
            "dlcheck_train_log logs no reward (reward, rewards/mean, rollout/ep_rew_mean, or a tag such as "
            "charts/episodic_return): not the log of an RL run"
        )
    need = max(4, dlcheck.setting("min_points"))  # a baseline of 3 steps before the one tested
    if len(rewards) < need:
        dlcheck.skip(
            f"{source} has {len(rewards)} logged reward(s); R1 needs {need} "
            + (
                "(learn a few more rollouts; SB3 dumps its log every log_interval iterations, or episodes off-policy)"
                if isinstance(log, rl.TrainLog)
                else "(log the reward at every update and train a few more: logging_steps=1 for a transformers or "
                "TRL Trainer)"
            )
        )
    kl_key, kls = rl.log_series(log, "kl")
    len_key, lengths = rl.log_series(log, "length")
    if not kls and not lengths:
        dlcheck.skip(
            f"{source} logs {reward_key} but neither a KL nor a completion/episode length (a per-episode length "
            "tag such as charts/episodic_length is not read: one episode a row is too noisy to tell a collapse): a "
            "reward jump cannot be told from reward hacking without them"
        )
    kl_at, len_at = dict(kls), dict(lengths)
    steps = [s for s, _ in rewards]
    r = np.array([v for _, v in rewards])
    jump = dlcheck.setting("reward_jump")
    watch = detectors.RewardWatch(jump, dlcheck.setting("kl_spike"), dlcheck.setting("length_collapse"))
    for i, step in enumerate(steps):
        hit = watch.add(step, float(r[i]), kl_at.get(step), len_at.get(step), names=(kl_key, len_key))
        if hit is None:
            continue
        direction = "jumps" if hit.z > 0 else "drops"
        evidence = [
            f"{source}, step {step}: {reward_key} {direction} to {r[i]:.3g} from a median {hit.median:.3g} "
            f"({hit.z:+.3g} spreads) while " + " and ".join(hit.signs)
        ]
        window = range(max(0, i - 3), min(len(r), i + 2))
        for j in window:
            s = steps[j]
            parts = (
                [f"{reward_key} {r[j]:.3g}"]
                + ([f"{kl_key} {kl_at[s]:.3g}"] if s in kl_at else [])
                + ([f"{len_key} {len_at[s]:.3g}"] if s in len_at else [])
            )
            evidence.append(f"step {s}: " + ", ".join(parts))
        series = {reward_key: list(r)}
        for key, points in ((kl_key, kls), (len_key, lengths)):
            if points:
                series[key] = [v for _, v in points]
        dlcheck.attach(
            "series",
            series=series,
            title=f"{source}: the jump at step {step}",
            caption="reward, KL and length per logged step",
        )
        if isinstance(log, rl.TrainLog):  # an SB3 run: episodes, not completions; no KL term to keep
            lr = rl.log_series(log, "learning_rate")[1]
            if lr:
                evidence.append(
                    f"train/learning_rate: {lr[0][1]:.3g} at step {lr[0][0]} -> {lr[-1][1]:.3g} at step {lr[-1][0]}"
                )
            dlcheck.fail(evidence, detectors.reward_cause(hit.z), SB3_FIX)
        dlcheck.fail(evidence, detectors.reward_cause(hit.z), detectors.REWARD_FIX)
    largest, kl_most, len_least, unpaired = watch.largest, watch.kl_most, watch.len_least, watch.unpaired

    evidence = [
        f"{len(r)} logged steps of {source}: {reward_key} {r[0]:.3g} -> {r[-1]:.3g}; largest one-step move "
        f"{largest[0]:+.3g} spreads (step {largest[1]}; a jump is ±{jump:g}), none together with a KL spike or a "
        f"length collapse"
    ]
    if kl_most is not None:
        evidence.append(
            f"{kl_key}: at most {kl_most[0]:.3g}× its baseline before (step {kl_most[1]}: {kl_most[2]:.3g} against "
            + (
                f"the median {kl_most[3]:.3g}"
                if kl_most[3] > 1e-3
                else "the floor 1e-3 (the median before is below it: a KL that small is no spike)"
            )
            + f"; a spike is {dlcheck.setting('kl_spike'):g}×)"
        )
    if len_least is not None:
        evidence.append(
            f"{len_key}: at least {len_least[0]:.3g}× its median before (step {len_least[1]}; a collapse is below "
            f"{dlcheck.setting('length_collapse'):g}×)"
        )
    if unpaired:
        evidence.append(
            f"reward jump(s) at step(s) {', '.join(map(str, unpaired[:6]))} came with neither: learning, not hacking"
        )
    dlcheck.measured(
        *evidence,
        logged_steps=len(r),
        largest_reward_move=round(largest[0], 4),
        largest_kl_ratio=None if kl_most is None else round(kl_most[0], 4),
        smallest_length_ratio=None if len_least is None else round(len_least[0], 4),
        unpaired_jumps=len(unpaired),
    )
