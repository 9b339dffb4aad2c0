"""Re-creation of Stable-Baselines3's documentation example "PyBullet: Normalizing input features"
(docs/guide/examples.md, SB3 commit e05d2dbe): PPO behind ``VecNormalize(norm_obs=True, norm_reward=True,
clip_obs=10.0)``, the model and the VecNormalize statistics saved side by side, and the evaluation-time
load: ``VecNormalize.load(stats_path, make_vec_env(...))``, ``training = False``, ``norm_reward = False``,
``PPO.load(path, env=vec_env)``.

Shrunk: HalfCheetahBulletEnv-v0 (needs pybullet) -> Pendulum-v1; ``learn(total_timesteps=2000)`` with
PPO's default n_steps=2048 -> ``n_steps=256, batch_size=64`` and ``learn(512)`` (two rollouts);
``device="cpu"``; everything else is the example's (MlpPolicy defaults, n_envs=1)."""

from pathlib import Path

from stable_baselines3 import PPO
from stable_baselines3.common.env_util import make_vec_env
from stable_baselines3.common.vec_env import VecNormalize

ENV_ID = "Pendulum-v1"


def train(seed: int = 0) -> PPO:
    vec_env = make_vec_env(ENV_ID, n_envs=1, seed=seed)
    # Automatically normalize the input features and reward
    vec_env = VecNormalize(vec_env, norm_obs=True, norm_reward=True, clip_obs=10.0)
    model = PPO("MlpPolicy", vec_env, n_steps=256, batch_size=64, seed=seed, device="cpu")
    model.learn(total_timesteps=512)
    return model


def save(model: PPO, log_dir: Path) -> None:
    # Don't forget to save the VecNormalize statistics when saving the agent
    model.save(log_dir / "ppo_pendulum")
    stats_path = log_dir / "vec_normalize.pkl"
    model.get_vec_normalize_env().save(stats_path)


def load(log_dir: Path) -> PPO:
    vec_env = make_vec_env(ENV_ID, n_envs=1)
    vec_env = VecNormalize.load(log_dir / "vec_normalize.pkl", vec_env)
    #  do not update them at test time
    vec_env.training = False
    # reward normalization is not needed at test time
    vec_env.norm_reward = False
    return PPO.load(log_dir / "ppo_pendulum", env=vec_env, device="cpu")
