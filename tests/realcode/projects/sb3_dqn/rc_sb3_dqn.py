"""Re-creation of Stable-Baselines3's DQN documentation example (docs/modules/dqn.md "Example", lines 55-76,
SB3 commit e05d2dbe6eda0acd0ef2e316e3e4065677add3eb): ``env = gym.make("CartPole-v1", render_mode="human")``,
``DQN("MlpPolicy", env, verbose=1)`` with every other hyper-parameter at its default (lr 1e-4, buffer 1e6,
learning_starts 100, batch 32, train_freq 4, target_update_interval 10000, exploration 1.0 -> 0.05 over 10% of
the run), ``model.learn(total_timesteps=10000, log_interval=4)``, ``model.save("dqn_cartpole")``,
``DQN.load("dqn_cartpole")`` and a ``predict(obs, deterministic=True)`` loop on the env. The example saves no
replay buffer (it loads the model only to predict).

Shrunk / changed: ``learn(total_timesteps=500)`` instead of 10000 (100 learning_starts, then 100 gradient steps);
no ``render_mode="human"`` (no display), ``verbose=0``, ``device="cpu"`` and a seed; the save / load go to the
directory dlcheck gives instead of the working directory; the endless predict loop is :func:`play`, bounded."""

from pathlib import Path

import gymnasium as gym
from stable_baselines3 import DQN


def make_env():
    return gym.make("CartPole-v1")


def train(seed: int = 0) -> DQN:
    env = make_env()
    model = DQN("MlpPolicy", env, verbose=0, seed=seed, device="cpu")
    model.learn(total_timesteps=500, log_interval=4)
    return model


def save(model: DQN, directory: Path) -> None:
    model.save(directory / "dqn_cartpole")


def load(directory: Path) -> DQN:
    return DQN.load(directory / "dqn_cartpole", device="cpu")


def play(model: DQN, env, steps: int = 50) -> None:
    obs, info = env.reset()
    for _ in range(steps):
        action, _states = model.predict(obs, deterministic=True)
        obs, reward, terminated, truncated, info = env.step(action)
        if terminated or truncated:
            obs, info = env.reset()
