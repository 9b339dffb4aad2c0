"""Re-creation of Stable-Baselines3's documentation example "Advanced Saving and Loading"
(docs/guide/examples.md, SB3 commit e05d2dbe): ``SAC("MlpPolicy", "Pendulum-v1", learning_rate=1e-3)``,
``model.save(...)``, ``model.save_replay_buffer(...)``, then ``SAC.load(...)`` and
``loaded_model.load_replay_buffer(...)`` so that the loaded model's buffer is not empty.

Shrunk: ``learn(total_timesteps=6000)`` -> ``learn(300)`` (learning_starts stays at its default 100, so
200 gradient steps run); ``device="cpu"``, a seed; the policy-only save/evaluate tail of the example is
left out."""

from pathlib import Path

from stable_baselines3 import SAC


def train(seed: int = 0) -> SAC:
    model = SAC("MlpPolicy", "Pendulum-v1", learning_rate=1e-3, seed=seed, device="cpu")
    model.learn(total_timesteps=300)
    return model


def save(model: SAC, directory: Path) -> None:
    model.save(directory / "sac_pendulum")
    model.save_replay_buffer(directory / "sac_replay_buffer")


def load(directory: Path) -> SAC:
    loaded_model = SAC.load(directory / "sac_pendulum", device="cpu")
    loaded_model.load_replay_buffer(directory / "sac_replay_buffer")
    return loaded_model
