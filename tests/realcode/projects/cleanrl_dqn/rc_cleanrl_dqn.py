"""Re-creation of vwxyzjn/cleanrl cleanrl/dqn.py (commit fe8d8a03c41a7ef5b523e2e354bd01c363e786bb) with the
replay-buffer semantics of the gymnasium CleanRL pins (0.29.1, pyproject.toml).

Kept: the Args defaults that shape the algorithm (CartPole-v1, one env, lr 2.5e-4, gamma 0.99, tau 1.0,
target_network_frequency 500, batch 128, epsilon 1 -> 0.05 over exploration_fraction 0.5 of the run,
train_frequency 10); ``gym.vector.SyncVectorEnv`` of ``make_env`` thunks (RecordEpisodeStatistics,
``env.action_space.seed``); the QNetwork (120-84 ReLU MLP); Adam; ``linear_schedule``; a ``ReplayBuffer`` with
``handle_timeout_termination=False`` into which the script adds ``(obs, real_next_obs, actions, rewards,
terminations, infos)`` where ``real_next_obs`` is the final observation for the truncated envs (dqn.py:184-188);
``td_target = r + gamma * target_max * (1 - dones)`` from the target network, MSE to Q(s, a) (dqn.py:197-201); the
hard target update ``tau * q + (1 - tau) * target`` every target_network_frequency steps; the save_model path
(``torch.save(q_network.state_dict())``, loaded back as cleanrl_utils/evals/dqn_eval.py does); the scalars the
script writes to TensorBoard (here recorded in a list).

Changed: the ReplayBuffer is stable_baselines3's (cleanrl_utils/buffers.py at this commit is a copy of it, #505);
gymnasium 1.4 is installed, so the vector env is built with ``autoreset_mode=AutoresetMode.SAME_STEP`` (0.29's
behaviour: the step that ends an episode returns the reset observation, the final one in infos) and the final
observation is read from ``infos["final_obs"]`` (0.29: ``"final_observation"``), the episode statistics from
``infos["final_info"]["episode"]`` masked by ``"_episode"``. Shrunk: total_timesteps 500000 -> 2000,
learning_starts 10000 -> 500; no tyro, TensorBoard, wandb, video or hub upload; CPU.
"""

from __future__ import annotations

import random
from dataclasses import dataclass

import gymnasium as gym
import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F
import torch.optim as optim
from stable_baselines3.common.buffers import ReplayBuffer


@dataclass
class Args:
    exp_name: str = "dqn"
    seed: int = 1
    torch_deterministic: bool = True
    cuda: bool = False
    capture_video: bool = False
    save_model: bool = False
    env_id: str = "CartPole-v1"
    total_timesteps: int = 2000
    learning_rate: float = 2.5e-4
    num_envs: int = 1
    buffer_size: int = 10000
    gamma: float = 0.99
    tau: float = 1.0
    target_network_frequency: int = 500
    batch_size: int = 128
    start_e: float = 1
    end_e: float = 0.05
    exploration_fraction: float = 0.5
    learning_starts: int = 500
    train_frequency: int = 10


def make_env(env_id, seed, idx, capture_video, run_name):
    def thunk():
        env = gym.make(env_id)
        env = gym.wrappers.RecordEpisodeStatistics(env)
        env.action_space.seed(seed)
        return env

    return thunk


def make_envs(args, run_name="rc"):
    return gym.vector.SyncVectorEnv(
        [make_env(args.env_id, args.seed + i, i, args.capture_video, run_name) for i in range(args.num_envs)],
        autoreset_mode=gym.vector.AutoresetMode.SAME_STEP,
    )


class QNetwork(nn.Module):
    def __init__(self, env):
        super().__init__()
        self.network = nn.Sequential(
            nn.Linear(int(np.array(env.single_observation_space.shape).prod()), 120),
            nn.ReLU(),
            nn.Linear(120, 84),
            nn.ReLU(),
            nn.Linear(84, env.single_action_space.n),
        )

    def forward(self, x):
        return self.network(x)


def linear_schedule(start_e: float, end_e: float, duration: int, t: int):
    slope = (end_e - start_e) / duration
    return max(slope * t + start_e, end_e)


def stored_dones(terminations, truncations):
    """The done the script stores: rb.add(..., terminations, infos) (dqn.py:188), truncations are not dones."""
    return terminations


def real_next_observations(next_obs, truncations, infos):
    """dqn.py:184-187: the final observation replaces the reset one for the truncated envs."""
    real_next_obs = next_obs.copy()
    for idx, trunc in enumerate(truncations):
        if trunc:
            real_next_obs[idx] = infos["final_obs"][idx]
    return real_next_obs


def td_target(rewards, target_max, dones, gamma):
    """dqn.py:199."""
    return rewards.flatten() + gamma * target_max * (1 - dones.flatten())


class ScalarLog:
    """Stands in for SummaryWriter: add_scalar(tag, value, global_step) kept as one dict per step."""

    def __init__(self):
        self.rows: dict[int, dict] = {}

    def add_scalar(self, tag, value, global_step):
        value = value.item() if hasattr(value, "item") else value  # add_scalar takes tensors too
        self.rows.setdefault(int(global_step), {"step": int(global_step)})[tag] = float(value)

    def history(self) -> list[dict]:
        return [self.rows[k] for k in sorted(self.rows)]


def train(args: Args):
    """The script's __main__; returns the q network, the replay buffer and the logged scalars."""
    random.seed(args.seed)
    np.random.seed(args.seed)
    torch.manual_seed(args.seed)
    torch.backends.cudnn.deterministic = args.torch_deterministic
    device = torch.device("cpu")
    writer = ScalarLog()

    envs = make_envs(args)
    assert isinstance(envs.single_action_space, gym.spaces.Discrete), "only discrete action space is supported"

    q_network = QNetwork(envs).to(device)
    optimizer = optim.Adam(q_network.parameters(), lr=args.learning_rate)
    target_network = QNetwork(envs).to(device)
    target_network.load_state_dict(q_network.state_dict())

    rb = ReplayBuffer(
        args.buffer_size,
        envs.single_observation_space,
        envs.single_action_space,
        device,
        handle_timeout_termination=False,
    )

    obs, _ = envs.reset(seed=args.seed)
    for global_step in range(args.total_timesteps):
        epsilon = linear_schedule(
            args.start_e, args.end_e, args.exploration_fraction * args.total_timesteps, global_step
        )
        if random.random() < epsilon:
            actions = np.array([envs.single_action_space.sample() for _ in range(envs.num_envs)])
        else:
            q_values = q_network(torch.Tensor(obs).to(device))
            actions = torch.argmax(q_values, dim=1).cpu().numpy()

        next_obs, rewards, terminations, truncations, infos = envs.step(actions)

        if "final_info" in infos and "_episode" in infos["final_info"]:
            ep = infos["final_info"]["episode"]
            for i in np.flatnonzero(infos["final_info"]["_episode"]):
                writer.add_scalar("charts/episodic_return", ep["r"][i], global_step)
                writer.add_scalar("charts/episodic_length", ep["l"][i], global_step)

        real_next_obs = real_next_observations(next_obs, truncations, infos)
        rb.add(obs, real_next_obs, actions, rewards, stored_dones(terminations, truncations), infos)

        obs = next_obs

        if global_step > args.learning_starts:
            if global_step % args.train_frequency == 0:
                data = rb.sample(args.batch_size)
                with torch.no_grad():
                    target_max, _ = target_network(data.next_observations).max(dim=1)
                    target = td_target(data.rewards, target_max, data.dones, args.gamma)
                old_val = q_network(data.observations).gather(1, data.actions).squeeze()
                loss = F.mse_loss(target, old_val)

                if global_step % 100 == 0:
                    writer.add_scalar("losses/td_loss", loss, global_step)
                    writer.add_scalar("losses/q_values", old_val.mean().item(), global_step)

                optimizer.zero_grad()
                loss.backward()
                optimizer.step()

            if global_step % args.target_network_frequency == 0:
                for target_param, q_param in zip(target_network.parameters(), q_network.parameters()):
                    target_param.data.copy_(args.tau * q_param.data + (1.0 - args.tau) * target_param.data)

    envs.close()
    return {"q_network": q_network, "rb": rb, "log": writer.history(), "args": args}


def save_model(q_network, model_path):
    """The save_model block (dqn.py:221-223)."""
    torch.save(q_network.state_dict(), model_path)


def load_model(model_path, args):
    """cleanrl_utils/evals/dqn_eval.py: Model(envs) then load_state_dict(torch.load(model_path))."""
    envs = make_envs(args)
    model = QNetwork(envs)
    model.load_state_dict(torch.load(model_path, map_location="cpu"))
    return model, envs
