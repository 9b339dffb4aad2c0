"""Re-creation of vwxyzjn/cleanrl cleanrl/td3_continuous_action.py (commit
fe8d8a03c41a7ef5b523e2e354bd01c363e786bb) with the replay-buffer semantics of the gymnasium CleanRL pins (0.29.1).

Kept: the Args defaults of the algorithm (lr 3e-4, gamma 0.99, tau 0.005, batch 256, policy_noise 0.2,
exploration_noise 0.1, policy_frequency 2, noise_clip 0.5); ``make_env`` (RecordEpisodeStatistics,
``env.action_space.seed``) in a SyncVectorEnv; the Actor (256-256 ReLU, tanh output rescaled by the
``action_scale`` / ``action_bias`` buffers) and the QNetwork (256-256 ReLU on concat(obs, action)); twin critics with
one Adam over both, a separate actor Adam, target copies loaded from the online nets; ``single_observation_space.dtype
= float32``; random actions before learning_starts, then actor + N(0, action_scale * exploration_noise) clipped to the
bounds; a ``ReplayBuffer`` with ``handle_timeout_termination=False`` fed ``(obs, real_next_obs, actions, rewards,
terminations, infos)`` with the final observation for truncated envs (td3_continuous_action.py:219-223); target policy
smoothing (clipped noise * action_scale, clamped to the action bounds), ``min(Q1', Q2')``, ``next_q_value = r + (1 -
dones) * gamma * min_q`` (lines 231-242); MSE on both critics; the delayed actor update and the Polyak update of all three
targets every policy_frequency steps (lines 255-267); the save_model tuple of the three state dicts and
cleanrl_utils/evals/td3_eval.py's load; the scalars written to TensorBoard (here kept in a list).

Changed: Hopper-v4 (MuJoCo) -> Pendulum-v1 (gymnasium classic control: no termination, a 200-step time limit, so every
episode ends in a truncation); the ReplayBuffer is stable_baselines3's (cleanrl_utils/buffers.py is a copy of it);
gymnasium 1.4 is installed, so the vector env uses ``autoreset_mode=AutoresetMode.SAME_STEP`` (0.29's behaviour) and
the final observation is read from ``infos["final_obs"]`` (0.29: ``"final_observation"``). Shrunk: total_timesteps
1e6 -> 1250, learning_starts 25e3 -> 1000, buffer_size 1e6 -> 10000 (never filled either way); no tyro, TensorBoard,
wandb, video or hub upload; CPU.
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
    exp_name: str = "td3_continuous_action"
    seed: int = 1
    torch_deterministic: bool = True
    cuda: bool = False
    capture_video: bool = False
    save_model: bool = False
    env_id: str = "Pendulum-v1"
    total_timesteps: int = 1250
    learning_rate: float = 3e-4
    num_envs: int = 1
    buffer_size: int = 10000
    gamma: float = 0.99
    tau: float = 0.005
    batch_size: int = 256
    policy_noise: float = 0.2
    exploration_noise: float = 0.1
    learning_starts: int = 1000
    policy_frequency: int = 2
    noise_clip: float = 0.5


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
        n_in = int(np.array(env.single_observation_space.shape).prod() + np.prod(env.single_action_space.shape))
        self.fc1 = nn.Linear(n_in, 256)
        self.fc2 = nn.Linear(256, 256)
        self.fc3 = nn.Linear(256, 1)

    def forward(self, x, a):
        x = torch.cat([x, a], 1)
        x = F.relu(self.fc1(x))
        x = F.relu(self.fc2(x))
        return self.fc3(x)


class Actor(nn.Module):
    def __init__(self, env):
        super().__init__()
        self.fc1 = nn.Linear(int(np.array(env.single_observation_space.shape).prod()), 256)
        self.fc2 = nn.Linear(256, 256)
        self.fc_mu = nn.Linear(256, int(np.prod(env.single_action_space.shape)))
        high, low = env.single_action_space.high, env.single_action_space.low
        self.register_buffer("action_scale", torch.tensor((high - low) / 2.0, dtype=torch.float32))
        self.register_buffer("action_bias", torch.tensor((high + low) / 2.0, dtype=torch.float32))

    def forward(self, x):
        x = F.relu(self.fc1(x))
        x = F.relu(self.fc2(x))
        x = torch.tanh(self.fc_mu(x))
        return x * self.action_scale + self.action_bias


def stored_dones(terminations, truncations):
    """The done the script stores: rb.add(..., terminations, infos) (line 223); truncations are not dones."""
    return terminations


def real_next_observations(next_obs, truncations, infos):
    """Lines 219-222: the final observation replaces the reset one for the truncated envs."""
    real_next_obs = next_obs.copy()
    for idx, trunc in enumerate(truncations):
        if trunc:
            real_next_obs[idx] = infos["final_obs"][idx]
    return real_next_obs


def next_q_value(rewards, dones, min_qf_next_target, gamma):
    """Line 242."""
    return rewards.flatten() + (1 - dones.flatten()) * gamma * (min_qf_next_target).view(-1)


class ScalarLog:
    """Stands in for SummaryWriter: add_scalar(tag, value, global_step) kept as one dict per step."""

    def __init__(self):
        self.rows: dict[int, dict] = {}

    def add_scalar(self, tag, value, global_step):
        value = value.item() if hasattr(value, "item") else value
        self.rows.setdefault(int(global_step), {"step": int(global_step)})[tag] = float(value)

    def history(self) -> list[dict]:
        return [self.rows[k] for k in sorted(self.rows)]


def train(args: Args):
    """The script's __main__; returns the networks, the replay buffer and the logged scalars."""
    random.seed(args.seed)
    np.random.seed(args.seed)
    torch.manual_seed(args.seed)
    torch.backends.cudnn.deterministic = args.torch_deterministic
    device = torch.device("cpu")
    writer = ScalarLog()

    envs = make_envs(args)
    assert isinstance(envs.single_action_space, gym.spaces.Box), "only continuous action space is supported"

    actor = Actor(envs).to(device)
    qf1 = QNetwork(envs).to(device)
    qf2 = QNetwork(envs).to(device)
    qf1_target = QNetwork(envs).to(device)
    qf2_target = QNetwork(envs).to(device)
    target_actor = Actor(envs).to(device)
    target_actor.load_state_dict(actor.state_dict())
    qf1_target.load_state_dict(qf1.state_dict())
    qf2_target.load_state_dict(qf2.state_dict())
    q_optimizer = optim.Adam(list(qf1.parameters()) + list(qf2.parameters()), lr=args.learning_rate)
    actor_optimizer = optim.Adam(list(actor.parameters()), lr=args.learning_rate)

    envs.single_observation_space.dtype = np.float32
    rb = ReplayBuffer(
        args.buffer_size,
        envs.single_observation_space,
        envs.single_action_space,
        device,
        n_envs=args.num_envs,
        handle_timeout_termination=False,
    )

    obs, _ = envs.reset(seed=args.seed)
    for global_step in range(args.total_timesteps):
        if global_step < args.learning_starts:
            actions = np.array([envs.single_action_space.sample() for _ in range(envs.num_envs)])
        else:
            with torch.no_grad():
                actions = actor(torch.Tensor(obs).to(device))
                actions += torch.normal(0, actor.action_scale * args.exploration_noise)
                actions = actions.cpu().numpy().clip(envs.single_action_space.low, envs.single_action_space.high)

        next_obs, rewards, terminations, truncations, infos = envs.step(actions)

        if "final_info" in infos and "_episode" in infos["final_info"]:
            ep = infos["final_info"]["episode"]
            for i in np.flatnonzero(infos["final_info"]["_episode"]):
                writer.add_scalar("charts/episodic_return", ep["r"][i], global_step)
                writer.add_scalar("charts/episodic_length", ep["l"][i], global_step)
                break

        real_next_obs = real_next_observations(next_obs, truncations, infos)
        rb.add(obs, real_next_obs, actions, rewards, stored_dones(terminations, truncations), infos)

        obs = next_obs

        if global_step > args.learning_starts:
            data = rb.sample(args.batch_size)
            with torch.no_grad():
                clipped_noise = (torch.randn_like(data.actions, device=device) * args.policy_noise).clamp(
                    -args.noise_clip, args.noise_clip
                ) * target_actor.action_scale
                next_state_actions = (target_actor(data.next_observations) + clipped_noise).clamp(
                    envs.single_action_space.low[0], envs.single_action_space.high[0]
                )
                qf1_next_target = qf1_target(data.next_observations, next_state_actions)
                qf2_next_target = qf2_target(data.next_observations, next_state_actions)
                min_qf_next_target = torch.min(qf1_next_target, qf2_next_target)
                target = next_q_value(data.rewards, data.dones, min_qf_next_target, args.gamma)

            qf1_a_values = qf1(data.observations, data.actions).view(-1)
            qf2_a_values = qf2(data.observations, data.actions).view(-1)
            qf1_loss = F.mse_loss(qf1_a_values, target)
            qf2_loss = F.mse_loss(qf2_a_values, target)
            qf_loss = qf1_loss + qf2_loss

            q_optimizer.zero_grad()
            qf_loss.backward()
            q_optimizer.step()

            if global_step % args.policy_frequency == 0:
                actor_loss = -qf1(data.observations, actor(data.observations)).mean()
                actor_optimizer.zero_grad()
                actor_loss.backward()
                actor_optimizer.step()

                for param, target_param in zip(actor.parameters(), target_actor.parameters()):
                    target_param.data.copy_(args.tau * param.data + (1 - args.tau) * target_param.data)
                for param, target_param in zip(qf1.parameters(), qf1_target.parameters()):
                    target_param.data.copy_(args.tau * param.data + (1 - args.tau) * target_param.data)
                for param, target_param in zip(qf2.parameters(), qf2_target.parameters()):
                    target_param.data.copy_(args.tau * param.data + (1 - args.tau) * target_param.data)

            if global_step % 100 == 0:
                writer.add_scalar("losses/qf1_values", qf1_a_values.mean().item(), global_step)
                writer.add_scalar("losses/qf2_values", qf2_a_values.mean().item(), global_step)
                writer.add_scalar("losses/qf1_loss", qf1_loss.item(), global_step)
                writer.add_scalar("losses/qf2_loss", qf2_loss.item(), global_step)
                writer.add_scalar("losses/qf_loss", qf_loss.item() / 2.0, global_step)
                writer.add_scalar("losses/actor_loss", actor_loss.item(), global_step)

    envs.close()
    return {"actor": actor, "qf1": qf1, "qf2": qf2, "rb": rb, "log": writer.history(), "args": args}


def save_model(actor, qf1, qf2, model_path):
    """The save_model block (line 285)."""
    torch.save((actor.state_dict(), qf1.state_dict(), qf2.state_dict()), model_path)


def load_model(model_path, args):
    """cleanrl_utils/evals/td3_eval.py: Actor and two QNetworks, then the three state dicts."""
    envs = make_envs(args)
    actor, qf1, qf2 = Actor(envs), QNetwork(envs), QNetwork(envs)
    actor_params, qf1_params, qf2_params = torch.load(model_path, map_location="cpu")
    actor.load_state_dict(actor_params)
    qf1.load_state_dict(qf1_params)
    qf2.load_state_dict(qf2_params)
    return actor, qf1, qf2, envs
