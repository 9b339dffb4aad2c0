"""Tiny real RL pipelines for the rl tests: a CleanRL-style PPO on CartPole written by hand (agent,
rollout loop on a gymnasium vector env, GAE, minibatches), its classic mistakes, Stable-Baselines3
algorithms, and tiny GRPO setups. Imported at the top of the rl test modules, so that what is cached here
(one trained SB3 PPO) survives the in-process pytest runs and is built once per test process."""

from __future__ import annotations

import functools

import gymnasium as gym
import numpy as np
import stable_baselines3  # noqa: F401  (imported once, before any in-process run)
import torch
from torch import nn

# --------------------------------------------------------------------------------------------------
# CleanRL-style PPO (ppo.py), gymnasium 1.x SAME_STEP vector env so the final observation is at hand


def make_envs(num_envs: int = 2, env_id: str = "CartPole-v1", autoreset: str = "same_step"):
    mode = gym.vector.AutoresetMode.SAME_STEP if autoreset == "same_step" else gym.vector.AutoresetMode.NEXT_STEP
    return gym.make_vec(env_id, num_envs=num_envs, vectorization_mode="sync", vector_kwargs={"autoreset_mode": mode})


class Agent(nn.Module):
    def __init__(self, obs_dim: int = 4, n_actions: int = 2, seed: int = 0):
        super().__init__()
        torch.manual_seed(seed)
        self.critic = nn.Sequential(nn.Linear(obs_dim, 64), nn.Tanh(), nn.Linear(64, 1))
        self.actor = nn.Sequential(nn.Linear(obs_dim, 64), nn.Tanh(), nn.Linear(64, n_actions))

    def get_value(self, x):
        return self.critic(x)

    def get_action_and_value(self, x, generator=None):
        logits = self.actor(x)
        probs = torch.softmax(logits, -1)
        action = torch.multinomial(probs, 1, generator=generator).squeeze(-1)
        return action, torch.log(probs.gather(-1, action[:, None])).squeeze(-1), self.critic(x).squeeze(-1)


def collect_rollout(agent: Agent, envs, num_steps: int = 64, seed: int = 0) -> dict:
    """One rollout as CleanRL stores it, plus next_values: V(final observation) at episode ends."""
    n = envs.num_envs
    gen = torch.Generator().manual_seed(seed)
    store = {k: torch.zeros(num_steps, n) for k in ("rewards", "values", "terminations", "truncations", "next_values")}
    store["obs"] = torch.zeros(num_steps, n, *envs.single_observation_space.shape)
    next_obs, _ = envs.reset(seed=seed)
    with torch.no_grad():
        for step in range(num_steps):
            obs = torch.as_tensor(next_obs, dtype=torch.float32)
            store["obs"][step] = obs
            action, _, value = agent.get_action_and_value(obs, gen)
            next_obs, reward, term, trunc, info = envs.step(action.numpy())
            store["values"][step] = value
            store["rewards"][step] = torch.as_tensor(reward, dtype=torch.float32)
            store["terminations"][step] = torch.as_tensor(term, dtype=torch.float32)
            store["truncations"][step] = torch.as_tensor(trunc, dtype=torch.float32)
            final = np.array(next_obs, dtype=np.float32)
            if "final_obs" in info:
                for i in np.nonzero(info["_final_obs"])[0]:
                    final[i] = info["final_obs"][i]
            store["next_values"][step] = agent.get_value(torch.as_tensor(final)).squeeze(-1)
    return store


def compute_gae(rewards, values, terminations, truncations, next_values, gamma, gae_lambda):
    """GAE over (num_steps, num_envs) tensors: no bootstrap through a termination, bootstrap from the final
    observation at a truncation, and the λ-chain cut at every episode end."""
    advantages = torch.zeros_like(rewards)
    lastgaelam = 0
    for t in reversed(range(rewards.shape[0])):
        nextnonterminal = 1.0 - terminations[t]
        nextepisode = 1.0 - torch.maximum(terminations[t], truncations[t])
        delta = rewards[t] + gamma * next_values[t] * nextnonterminal - values[t]
        advantages[t] = lastgaelam = delta + gamma * gae_lambda * nextepisode * lastgaelam
    return advantages, advantages + values


def compute_gae_done_bootstrap(rewards, values, terminations, truncations, next_values, gamma, gae_lambda):
    """The classic bug: done = terminated or truncated, used for bootstrapping too."""
    advantages = torch.zeros_like(rewards)
    lastgaelam = 0
    for t in reversed(range(rewards.shape[0])):
        done = torch.maximum(terminations[t], truncations[t])
        nextnonterminal = 1.0 - done
        delta = rewards[t] + gamma * next_values[t] * nextnonterminal - values[t]
        advantages[t] = lastgaelam = delta + gamma * gae_lambda * nextnonterminal * lastgaelam
    return advantages, advantages + values


def compute_gae_ignoring_dones(rewards, values, next_value, gamma, gae_lambda):
    """GAE that ignores episode ends: bootstraps from whatever observation was stored next."""
    advantages = torch.zeros_like(rewards)
    lastgaelam = 0
    steps = rewards.shape[0]
    for t in reversed(range(steps)):
        nextvalues = next_value if t == steps - 1 else values[t + 1]
        delta = rewards[t] + gamma * nextvalues - values[t]
        advantages[t] = lastgaelam = delta + gamma * gae_lambda * lastgaelam
    return advantages, advantages + values


def ppo_minibatches(
    agent: Agent,
    envs,
    norm_adv: str = "minibatch",
    num_steps: int = 64,
    minibatch_size: int = 32,
    gamma: float = 0.99,
    gae_lambda: float = 0.95,
):
    """The advantages of each minibatch of one PPO update as the loss sees them. norm_adv: 'minibatch'
    (CleanRL's norm_adv=True), 'buffer' (whitened once over the whole rollout), or 'none'."""
    r = collect_rollout(agent, envs, num_steps)
    with torch.no_grad():
        adv, _ = compute_gae(
            r["rewards"], r["values"], r["terminations"], r["truncations"], r["next_values"], gamma, gae_lambda
        )
    b_adv = adv.reshape(-1)
    if norm_adv == "buffer":
        b_adv = (b_adv - b_adv.mean()) / (b_adv.std() + 1e-8)
    order = torch.randperm(len(b_adv), generator=torch.Generator().manual_seed(1))
    out = []
    for start in range(0, len(b_adv), minibatch_size):
        mb_adv = b_adv[order[start : start + minibatch_size]]
        if norm_adv == "minibatch":
            mb_adv = (mb_adv - mb_adv.mean()) / (mb_adv.std() + 1e-8)
        out.append({"advantages": mb_adv})
    return out


# --------------------------------------------------------------------------------------------------
# Stable-Baselines3


def sb3_ppo(env_id: str = "CartPole-v1", normalize: bool = True, n_envs: int = 2, **kw):
    from stable_baselines3 import PPO
    from stable_baselines3.common.env_util import make_vec_env
    from stable_baselines3.common.vec_env import VecNormalize

    env = make_vec_env(env_id, n_envs=n_envs, seed=0)
    if normalize:
        env = VecNormalize(env)
    args = dict(n_steps=64, batch_size=32, n_epochs=2, device="cpu", policy_kwargs=dict(net_arch=[32, 32]), seed=0)
    args.update(kw)
    return PPO("MlpPolicy", env, **args)


@functools.cache
def trained_ppo():
    """SB3 PPO with VecNormalize on CartPole after 256 steps (about 3.5 s): shared, never modified."""
    algo = sb3_ppo()
    algo.learn(256)
    return algo


@functools.cache
def trained_dqn():
    from stable_baselines3 import DQN
    from stable_baselines3.common.env_util import make_vec_env

    algo = DQN(
        "MlpPolicy",
        make_vec_env("CartPole-v1", n_envs=1, seed=0),
        buffer_size=500,
        learning_starts=50,
        train_freq=4,
        device="cpu",
        policy_kwargs=dict(net_arch=[32]),
        seed=0,
    )
    algo.learn(120)
    return algo


# --------------------------------------------------------------------------------------------------
# GRPO (TRL) on the tiny Llama of tests/tiny.py


def reward_brevity(completions, **kw):
    """A completion-dependent reward: close to 20 characters is best."""
    return [-abs(20 - len(c)) / 20 for c in completions]


def reward_matches_solution(completions, solution, **kw):
    return [1.0 if s in c else 0.0 for c, s in zip(completions, solution)]


def reward_prompt_length(prompts, completions, **kw):
    """The bug: the reward reads the prompt, so every completion of a prompt scores the same."""
    return [len(p) / 20 for p in prompts]


def grpo_dataset():
    import tiny
    from datasets import Dataset

    return Dataset.from_dict({"prompt": tiny.PROMPTS, "solution": [c.strip() for c in tiny.COMPLETIONS]})


def grpo_trainer(tmp_path, reward_funcs, beta: float = 0.0, model=None, **kw):
    import tiny
    from trl import GRPOConfig, GRPOTrainer

    tok = tiny.tokenizer()
    kw = dict(dict(num_generations=2, max_completion_length=8, per_device_train_batch_size=4), **kw)
    args = tiny.trainer_args(tmp_path, GRPOConfig, beta=beta, **kw)
    return GRPOTrainer(
        model=model if model is not None else tiny.llama(tok),
        reward_funcs=reward_funcs,
        args=args,
        train_dataset=grpo_dataset(),
        processing_class=tok,
    )


def group_advantages_trl(rewards, group_size):
    """TRL's group normalisation (scale_rewards='group')."""
    g = rewards.view(-1, group_size)
    return ((g - g.mean(1, keepdim=True)) / (g.std(1, keepdim=True) + 1e-4)).view(-1)


def group_advantages_no_eps(rewards, group_size):
    g = rewards.view(-1, group_size)
    return ((g - g.mean(1, keepdim=True)) / g.std(1, keepdim=True)).view(-1)


def group_advantages_whole_batch(rewards, group_size):
    return (rewards - rewards.mean()) / (rewards.std() + 1e-8)


def grpo_trainer_with_reference(tmp_path, beta: float = 0.04, reward_funcs=(reward_brevity,), **kw):
    """GRPO with a KL term: TRL reloads the reference from the policy's path, so the policy is saved first."""
    import tiny

    tok = tiny.tokenizer()
    model_dir = tmp_path / "policy"
    tiny.llama(tok).save_pretrained(model_dir)
    tok.save_pretrained(model_dir)
    return grpo_trainer(tmp_path / "out", list(reward_funcs), beta=beta, model=str(model_dir), **kw)


def reward_letter_e(completions, **kw):
    return [c.count("e") / max(len(c), 1) for c in completions]


@functools.cache
def grpo_noisy_run_log(tmp_dir: str) -> tuple:
    """log_history of a real 10-step GRPO run with a high learning rate (0.05) and a KL term: rewards and KL
    jump around step to step (KL 0 -> 1.95 at step 3), as short runs of tiny models do."""
    import pathlib

    trainer = grpo_trainer_with_reference(
        pathlib.Path(tmp_dir),
        reward_funcs=(reward_letter_e,),
        learning_rate=0.05,
        max_steps=10,
        num_generations=4,
        per_device_train_batch_size=8,
    )
    trainer.train()
    return tuple(trainer.state.log_history)


@functools.cache
def trained_grpo(tmp_dir: str):
    """A tiny GRPO run with a KL term, trained 6 steps (logging every step): shared, never modified."""
    import pathlib

    trainer = grpo_trainer_with_reference(
        pathlib.Path(tmp_dir), reward_funcs=(reward_brevity, reward_matches_solution), max_steps=6
    )
    trainer.train()
    return trainer


@functools.cache
def shared_agent():
    return Agent()


@functools.cache
def untrained_ppo():
    return sb3_ppo()
