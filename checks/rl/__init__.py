"""Checks of reinforcement-learning pipelines: classic RL (gymnasium envs, PPO-style loops written by hand
in the CleanRL manner, Stable-Baselines3) and RL on language models (TRL's GRPO, reward functions,
reference models).

Roles of the domain. A Stable-Baselines3 user writes ``dlcheck_algorithm`` and gets the env, the policy
(``dlcheck_model``), the advantage computation, the minibatch advantages, the VecNormalize statistics and
the replay buffer derived from it, and the log of its run from its logger's progress.csv; a TRL user writes ``dlcheck_trainer`` (a ``GRPOTrainer``) and gets the
reference model, the KL coefficient, the reward functions and the log of a run. What only the user knows
(their GAE function or off-policy TD target, their checkpoint save/load) has its own fixture."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest

from ...errors import MISSING
from ...registry import applicability
from ...roles import deriver, is_hf_trainer, role
from . import measure as rl

role(
    "algorithm",
    "a Stable-Baselines3 algorithm (PPO, A2C, DQN, SAC, …); derives dlcheck_env, dlcheck_model (its "
    "policy), dlcheck_advantage_fn, dlcheck_advantage_minibatches, dlcheck_normalizer and dlcheck_replay_buffer",
)
role(
    "env",
    "the training environment: a gymnasium Env or vector env, an SB3 VecEnv, or (best) a function "
    "returning a fresh one; checks roll out a fresh env or a copy, never yours",
    "dlcheck_algorithm",
)
role(
    "advantage_fn",
    "your GAE/returns function: takes a pytest_dlcheck.rl.Rollout (or keyword arrays named after "
    "its fields: rewards, values, terminated, truncated, next_values, episode_starts, gamma, gae_lambda, …) and "
    "returns advantages, (advantages, returns) or a dict, each (steps, envs); wrap it with "
    "pytest_dlcheck.rl.advantage_fn(fn, arrays='torch', autoreset='next_step') to say how to call it",
    "dlcheck_algorithm (on-policy)",
)
role(
    "td_target_fn",
    "an off-policy loop's one-step TD target (DQN, SAC, TD3): takes a pytest_dlcheck.rl.Transitions (or keyword "
    "arrays rewards, terminated, truncated, next_values, gamma), stores the done your loop stores and returns "
    "r + γ·(1 − done)·next_value, (batch,); wrap it with pytest_dlcheck.rl.td_target_fn(fn, arrays='torch')",
    "dlcheck_algorithm (SB3 off-policy: its replay buffer's handle_timeout_termination)",
)
role(
    "advantage_minibatches",
    "the advantages your policy loss sees, minibatch by minibatch, after any "
    "normalisation: an iterable (or a function returning one) of 1-D arrays/tensors or of dicts with "
    "'advantages'",
    "dlcheck_algorithm (PPO, A2C)",
)
role(
    "group_advantages",
    "your GRPO advantage function: (rewards, group_size) -> advantages, rewards a 1-D float "
    "tensor where each run of group_size consecutive entries holds the completions of one prompt",
)
role(
    "reward_funcs",
    "GRPO reward function(s) as TRL calls them: f(prompts=, completions=, **dataset columns) -> "
    "list of floats; one or a list",
    "dlcheck_trainer (GRPOTrainer)",
)
role(
    "ref_model",
    "the frozen reference model: of the KL penalty (GRPO, RLHF-PPO) or of DPO",
    "dlcheck_trainer (a TRL GRPOTrainer with beta > 0, or a DPOTrainer)",
)
role("kl_coef", "the KL coefficient (beta) your loss multiplies the KL to the reference by", "dlcheck_trainer")
role(
    "normalizer",
    "the object holding running observation/return statistics: SB3 VecNormalize, gymnasium "
    "NormalizeObservation / NormalizeReward (or their vector versions), or any object with obs_rms / ret_rms",
    "dlcheck_algorithm, or a wrapper of dlcheck_env",
)
role("replay_buffer", "the replay buffer an off-policy run resumes with (SB3 ReplayBuffer)", "dlcheck_algorithm")
role(
    "save_agent",
    "your RL checkpoint save, called as save_agent(directory) with an empty pathlib.Path: policy, "
    "normalisation statistics, replay buffer, whatever your run saves (the ckpt domain's dlcheck_save_checkpoint "
    "takes (state, path) instead)",
)
role(
    "load_agent",
    "your RL checkpoint load, called as load_agent(directory) after save_agent; returns what your "
    "run resumes or evaluates with (an SB3 algorithm, an env, or a dict/tuple of them)",
)
role(
    "rollout",
    "a rollout your loop collected: a dict (or object) with 'obs' (or 'observations') as the policy "
    "takes them, shaped (steps, envs, *obs_shape) or (samples, *obs_shape); R8 measures it instead of rolling "
    "out dlcheck_env",
)
role(
    "preprocess_obs",
    "when your agent scales observations itself: a function from a batch of env observations "
    "to what the policy network takes",
)
role(
    "train_log",
    "the log of a short run: a list of dicts per logged step with reward, kl and completion length "
    "(TRL's trainer.state.log_history; SB3's rollout/ep_rew_mean, train/approx_kl, rollout/ep_len_mean)",
    "dlcheck_trainer after trainer.train(), or dlcheck_algorithm after model.learn() with a csv or json logger",
)

Get = Callable[[str], Any]
Cache = Callable[[Any, str, Callable[[], Any]], Any]

FROM_ALGORITHM = (
    "env",
    "model",
    "advantage_fn",
    "advantage_minibatches",
    "normalizer",
    "replay_buffer",
    "train_log",
)
FROM_TRAINER = ("ref_model", "kl_coef", "reward_funcs", "train_log")

#: env steps collected from an SB3 algorithm's policy when its rollout buffer is not full yet
ROLLOUT_STEPS = 256


def _get(get: Get, name: str) -> Any:
    # a core default fixture resolves other roles by fixture lookup; a domain role may have no fixture
    try:
        return get(name)
    except pytest.FixtureLookupError:
        return MISSING


@deriver
def from_sb3_algorithm(name: str, get: Get, cache: Cache) -> Any:
    if name not in FROM_ALGORITHM:
        return MISSING
    algo = _get(get, "algorithm")
    if algo is MISSING or not rl.is_sb3_algorithm(algo):
        if name == "normalizer":
            return _normalizer_of_env(_get(get, "env"))
        return MISSING
    if name == "env":
        env = algo.get_env()
        return MISSING if env is None else env
    if name == "model":
        return algo.policy
    if name == "advantage_fn":
        return rl.sb3_advantage_fn(algo) if rl.is_on_policy(algo) else MISSING
    if name == "advantage_minibatches":
        if not rl.is_on_policy(algo):
            return MISSING
        rollout = policy_rollout(cache, algo)
        if isinstance(rollout, rl.RolloutUnavailable):
            return rollout
        return cache(algo, "minibatches", lambda: rl.sb3_minibatches(algo, rollout))
    if name == "normalizer":
        vec_norm = algo.get_vec_normalize_env()
        return MISSING if vec_norm is None else vec_norm
    if name == "replay_buffer":
        buf = getattr(algo, "replay_buffer", None)
        return MISSING if buf is None else buf
    if name == "train_log":  # read afresh: the run may log more between checks
        try:
            log = rl.sb3_train_log(algo)
        except rl.LogUnavailable:
            return MISSING  # R1 says why, from the algorithm
        return log if rl.log_series(log, "reward")[1] or rl.log_series(log, "value_loss")[1] else MISSING
    return MISSING


def policy_rollout(cache: Cache, algo: Any) -> Any:
    """The SB3 algorithm's observations and advantages (:func:`rl.sb3_policy_rollout`), once per session
    for R3 and R8 alike; a rollout that cannot be had is remembered as the reason to skip with."""

    def make() -> Any:
        try:
            return rl.sb3_policy_rollout(algo, ROLLOUT_STEPS)
        except rl.RolloutUnavailable as exc:
            return exc

    return cache(algo, "policy_rollout", make)


def _normalizer_of_env(env: Any) -> Any:
    if env is MISSING or not rl.is_env(env):
        return MISSING
    stats, holders = rl.running_statistics(env)
    if not holders:
        return MISSING
    # statistics held by several wrappers (every sub-env of a SyncVectorEnv, a reward and an observation
    # normaliser): the env that holds them all, read the way the loaded env will be read
    return holders[0].owner if len({id(h.owner) for h in holders}) == 1 else env


@deriver
def from_grpo_trainer(name: str, get: Get, cache: Cache) -> Any:
    if name not in FROM_TRAINER:
        return MISSING
    trainer = _get(get, "trainer")
    if trainer is MISSING or not is_hf_trainer(trainer):
        return MISSING
    if name == "ref_model":
        ref = getattr(trainer, "ref_model", None)
        return MISSING if ref is None else ref
    if name == "kl_coef":
        if not hasattr(trainer, "ref_model") and not rl.rewarded(trainer):
            # beta is a KL coefficient only beside a reference model or rewards (a distillation trainer's beta
            # interpolates its divergence to the teacher: 0 is a forward KL, not "no KL")
            return MISSING
        beta = getattr(trainer, "beta", getattr(trainer.args, "beta", None))
        return MISSING if beta is None else float(beta)
    if name == "reward_funcs":
        funcs = getattr(trainer, "reward_funcs", None)
        return MISSING if not funcs else list(funcs)
    if name == "train_log":
        log = list(getattr(getattr(trainer, "state", None), "log_history", None) or [])
        return log if rl.log_series(log, "reward")[1] else MISSING  # an RL run's log: it logs rewards
    return MISSING


#: roles that mark a pipeline as reinforcement learning (given, or derived from an SB3 algorithm or a TRL
#: GRPO/DPO trainer); a pipeline with none of them is not asked for the others
RL_MARKERS = (
    "algorithm",
    "env",
    "advantage_fn",
    "td_target_fn",
    "rollout",
    "advantage_minibatches",
    "group_advantages",
    "reward_funcs",
    "ref_model",
    "kl_coef",
    "normalizer",
    "replay_buffer",
    "save_agent",
    "load_agent",
    "preprocess_obs",
)


@applicability("rl")
def concerns_rl(ctx) -> str | None:
    """The rl checks do not concern a pipeline with no sign of reinforcement learning: a role they miss is
    then "not applicable", not a fixture to define (an SFT or vision pipeline is not asked for an env)."""
    from ...roles import ROLES

    if any(name in ROLES and ctx.role(name) is not MISSING for name in RL_MARKERS):
        return None
    return (
        "no reinforcement learning in the given fixtures (no dlcheck_algorithm, dlcheck_env, dlcheck_advantage_fn, "
        "dlcheck_rollout, reference model or GRPO trainer): the rl checks do not concern this pipeline"
    )
