"""The pieces of a small RL project: a Stable-Baselines3 PPO on CartPole behind VecNormalize, and a
CleanRL-style GAE written by hand. Kept tiny so that the example runs in seconds on a CPU."""

import torch


def make_env():
    from stable_baselines3.common.env_util import make_vec_env

    return make_vec_env("CartPole-v1", n_envs=2, seed=0)


def train_ppo():
    """PPO with normalised observations and rewards, trained for one rollout (128 steps)."""
    from stable_baselines3 import PPO
    from stable_baselines3.common.vec_env import VecNormalize

    model = PPO(
        "MlpPolicy",
        VecNormalize(make_env()),
        n_steps=64,
        batch_size=64,
        n_epochs=1,
        device="cpu",
        seed=0,
        policy_kwargs=dict(net_arch=[32, 32]),
    )
    model.learn(128)
    return model


def compute_gae(rewards, values, terminations, truncations, next_values, gamma, gae_lambda):
    """GAE over (num_steps, num_envs) tensors. next_values[t] is the value of the observation step t led to:
    the final observation when the episode ended there (gymnasium's info["final_obs"])."""
    advantages = torch.zeros_like(rewards)
    lastgaelam = 0
    for t in reversed(range(rewards.shape[0])):
        nextnonterminal = 1.0 - terminations[t]  # bootstrap unless terminated
        nextepisode = 1.0 - torch.maximum(terminations[t], truncations[t])  # cut the λ-chain at every end
        delta = rewards[t] + gamma * next_values[t] * nextnonterminal - values[t]
        advantages[t] = lastgaelam = delta + gamma * gae_lambda * nextepisode * lastgaelam
    return advantages, advantages + values
