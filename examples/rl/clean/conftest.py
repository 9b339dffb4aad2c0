"""A clean RL set-up: SB3 PPO behind VecNormalize, checkpointed with its normalisation statistics, and
a hand-written GAE that bootstraps time-limit truncations from the final observation."""

import pytest
import tinyrl

from pytest_dlcheck.rl import advantage_fn


@pytest.fixture(scope="session")
def dlcheck_algorithm():
    return tinyrl.train_ppo()  # env, policy, rollout buffer, VecNormalize are derived from it


@pytest.fixture(scope="session")
def dlcheck_save_agent(dlcheck_algorithm):
    def save(directory):
        dlcheck_algorithm.save(directory / "model")
        dlcheck_algorithm.get_vec_normalize_env().save(directory / "vecnormalize.pkl")

    return save


@pytest.fixture(scope="session")
def dlcheck_load_agent():
    def load(directory):
        from stable_baselines3 import PPO
        from stable_baselines3.common.vec_env import VecNormalize

        venv = VecNormalize.load(directory / "vecnormalize.pkl", tinyrl.make_env())
        return PPO.load(directory / "model", env=venv, device="cpu")

    return load


@pytest.fixture(scope="session")
def dlcheck_advantage_fn():
    # called with float32 tensors named after its parameters (see pytest_dlcheck.rl.Rollout)
    return advantage_fn(tinyrl.compute_gae, arrays="torch")
