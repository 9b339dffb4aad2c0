"""The same project with two silent bugs pytest-dlcheck catches:
- the checkpoint is model.save() alone: SB3 does not store the VecNormalize statistics, so the loaded
  policy sees observations normalised with fresh statistics (R4);
- the GAE uses done = terminated or truncated to bootstrap: a time-limit truncation is treated as a real
  ending and the value of the final observation is dropped (R7)."""

import pytest
import tinyrl
import torch

from pytest_dlcheck.rl import advantage_fn


@pytest.fixture(scope="session")
def dlcheck_algorithm():
    return tinyrl.train_ppo()


@pytest.fixture(scope="session")
def dlcheck_save_agent(dlcheck_algorithm):
    return lambda directory: dlcheck_algorithm.save(directory / "model")


@pytest.fixture(scope="session")
def dlcheck_load_agent():
    def load(directory):
        from stable_baselines3 import PPO
        from stable_baselines3.common.vec_env import VecNormalize

        return PPO.load(directory / "model", env=VecNormalize(tinyrl.make_env()), device="cpu")

    return load


def compute_gae(rewards, values, terminations, truncations, next_values, gamma, gae_lambda):
    advantages = torch.zeros_like(rewards)
    lastgaelam = 0
    for t in reversed(range(rewards.shape[0])):
        done = torch.maximum(terminations[t], truncations[t])  # done = terminated or truncated
        delta = rewards[t] + gamma * next_values[t] * (1.0 - done) - values[t]
        advantages[t] = lastgaelam = delta + gamma * gae_lambda * (1.0 - done) * lastgaelam
    return advantages, advantages + values


@pytest.fixture(scope="session")
def dlcheck_advantage_fn():
    return advantage_fn(compute_gae, arrays="torch")
