"""Re-creation of vwxyzjn/cleanrl cleanrl/ppo_continuous_action.py (commit fe8d8a03) and the checkpoint
path it uses (``--save-model``: ``torch.save(agent.state_dict(), model_path)``, then
cleanrl_utils/evals/ppo_eval.py builds fresh envs with ``make_env`` and loads the state dict), on
gymnasium 1.4.

Kept: the Args defaults (lr 3e-4 annealed, 2048-step rollouts, 32 minibatches, 10 update epochs,
gamma 0.99, lambda 0.95, clip 0.2, ent 0.0, vf 0.5, max grad norm 0.5); ``make_env``'s wrapper stack in
each sub-env of the SyncVectorEnv: FlattenObservation, RecordEpisodeStatistics, ClipAction,
NormalizeObservation, TransformObservation(clip ±10), NormalizeReward(gamma), TransformReward(clip ±10);
the Gaussian Agent (actor_mean MLP, state-independent actor_logstd, critic MLP, layer_init); the same
storage/GAE/update as ppo.py.

gymnasium 1.x port: TransformObservation takes the observation space as a third argument (1.x made it
required); everything else is unchanged.

Beyond the upstream script (as the corpus brief asks): the checkpoint also stores each sub-env's
NormalizeObservation statistics (obs_rms mean/var/count) and the load puts them back into the freshly
built envs. Upstream saves only ``agent.state_dict()``, so its evaluation runs with fresh statistics.

Shrunk: HalfCheetah-v4 (MuJoCo, not installed) -> Pendulum-v1; num_envs 1 -> 2 (two sub-envs, two sets
of statistics); num_steps 2048 -> 256; total_timesteps 1e6 -> 1024 (2 iterations); CPU, no TensorBoard.
"""

from __future__ import annotations

import random
from dataclasses import dataclass

import gymnasium as gym
import numpy as np
import torch
import torch.nn as nn
import torch.optim as optim
from torch.distributions.normal import Normal


@dataclass
class Args:
    exp_name: str = "ppo_continuous_action"
    seed: int = 1
    torch_deterministic: bool = True
    capture_video: bool = False
    save_model: bool = True
    env_id: str = "Pendulum-v1"
    total_timesteps: int = 1024
    learning_rate: float = 3e-4
    num_envs: int = 2
    num_steps: int = 256
    anneal_lr: bool = True
    gamma: float = 0.99
    gae_lambda: float = 0.95
    num_minibatches: int = 32
    update_epochs: int = 10
    norm_adv: bool = True
    clip_coef: float = 0.2
    clip_vloss: bool = True
    ent_coef: float = 0.0
    vf_coef: float = 0.5
    max_grad_norm: float = 0.5
    target_kl: float = None
    batch_size: int = 0
    minibatch_size: int = 0
    num_iterations: int = 0

    def finish(self) -> Args:
        self.batch_size = int(self.num_envs * self.num_steps)
        self.minibatch_size = int(self.batch_size // self.num_minibatches)
        self.num_iterations = self.total_timesteps // self.batch_size
        return self


def make_env(env_id, idx, capture_video, run_name, gamma):
    def thunk():
        env = gym.make(env_id)
        env = gym.wrappers.FlattenObservation(env)
        env = gym.wrappers.RecordEpisodeStatistics(env)
        env = gym.wrappers.ClipAction(env)
        env = gym.wrappers.NormalizeObservation(env)
        env = gym.wrappers.TransformObservation(env, lambda obs: np.clip(obs, -10, 10), env.observation_space)
        env = gym.wrappers.NormalizeReward(env, gamma=gamma)
        env = gym.wrappers.TransformReward(env, lambda reward: np.clip(reward, -10, 10))
        return env

    return thunk


def make_envs(args, run_name="rc", num_envs=None):
    n = args.num_envs if num_envs is None else num_envs
    return gym.vector.SyncVectorEnv(
        [make_env(args.env_id, i, args.capture_video, run_name, args.gamma) for i in range(n)]
    )


def layer_init(layer, std=np.sqrt(2), bias_const=0.0):
    torch.nn.init.orthogonal_(layer.weight, std)
    torch.nn.init.constant_(layer.bias, bias_const)
    return layer


class Agent(nn.Module):
    def __init__(self, envs):
        super().__init__()
        n_obs = int(np.array(envs.single_observation_space.shape).prod())
        n_act = int(np.prod(envs.single_action_space.shape))
        self.critic = nn.Sequential(
            layer_init(nn.Linear(n_obs, 64)),
            nn.Tanh(),
            layer_init(nn.Linear(64, 64)),
            nn.Tanh(),
            layer_init(nn.Linear(64, 1), std=1.0),
        )
        self.actor_mean = nn.Sequential(
            layer_init(nn.Linear(n_obs, 64)),
            nn.Tanh(),
            layer_init(nn.Linear(64, 64)),
            nn.Tanh(),
            layer_init(nn.Linear(64, n_act), std=0.01),
        )
        self.actor_logstd = nn.Parameter(torch.zeros(1, n_act))

    def get_value(self, x):
        return self.critic(x)

    def get_action_and_value(self, x, action=None):
        action_mean = self.actor_mean(x)
        action_logstd = self.actor_logstd.expand_as(action_mean)
        action_std = torch.exp(action_logstd)
        probs = Normal(action_mean, action_std)
        if action is None:
            action = probs.sample()
        return action, probs.log_prob(action).sum(1), probs.entropy().sum(1), self.critic(x)


def compute_gae(rewards, values, dones, next_value, next_done, gamma, gae_lambda, num_steps):
    with torch.no_grad():
        advantages = torch.zeros_like(rewards)
        lastgaelam = 0
        for t in reversed(range(num_steps)):
            if t == num_steps - 1:
                nextnonterminal = 1.0 - next_done
                nextvalues = next_value
            else:
                nextnonterminal = 1.0 - dones[t + 1]
                nextvalues = values[t + 1]
            delta = rewards[t] + gamma * nextvalues * nextnonterminal - values[t]
            advantages[t] = lastgaelam = delta + gamma * gae_lambda * nextnonterminal * lastgaelam
        returns = advantages + values
    return advantages, returns


def normalizers(envs, kind=gym.wrappers.NormalizeObservation):
    """The wrappers of one kind inside each sub-env of a SyncVectorEnv, in env order."""
    found = []
    for sub in envs.envs:
        e = sub
        while isinstance(e, gym.Wrapper):
            if isinstance(e, kind):
                found.append(e)
                break
            e = e.env
    return found


def save_agent(agent, envs, directory):
    """``torch.save(agent.state_dict(), model_path)`` as the script does, plus the obs statistics."""
    import pathlib

    directory = pathlib.Path(directory)
    torch.save(agent.state_dict(), directory / "ppo_continuous_action.cleanrl_model")
    stats = [{"mean": w.obs_rms.mean, "var": w.obs_rms.var, "count": w.obs_rms.count} for w in normalizers(envs)]
    torch.save(stats, directory / "obs_rms.pt")


def load_agent(args, directory):
    """ppo_eval.evaluate's set-up (fresh envs from make_env, Agent(envs), load_state_dict, eval) plus the
    obs statistics put back into the fresh envs (frozen, as an evaluation uses them)."""
    import pathlib

    directory = pathlib.Path(directory)
    envs = make_envs(args)
    agent = Agent(envs)
    agent.load_state_dict(torch.load(directory / "ppo_continuous_action.cleanrl_model", map_location="cpu"))
    agent.eval()
    stats = torch.load(directory / "obs_rms.pt", weights_only=False)
    for w, s in zip(normalizers(envs), stats):
        w.obs_rms.mean, w.obs_rms.var, w.obs_rms.count = s["mean"], s["var"], s["count"]
        w.update_running_mean = False
    return agent, envs


def train(args: Args):
    args.finish()
    random.seed(args.seed)
    np.random.seed(args.seed)
    torch.manual_seed(args.seed)
    torch.backends.cudnn.deterministic = args.torch_deterministic
    device = torch.device("cpu")

    envs = make_envs(args)
    assert isinstance(envs.single_action_space, gym.spaces.Box), "only continuous action space is supported"
    agent = Agent(envs).to(device)
    optimizer = optim.Adam(agent.parameters(), lr=args.learning_rate, eps=1e-5)

    obs = torch.zeros((args.num_steps, args.num_envs) + envs.single_observation_space.shape).to(device)
    actions = torch.zeros((args.num_steps, args.num_envs) + envs.single_action_space.shape).to(device)
    logprobs = torch.zeros((args.num_steps, args.num_envs)).to(device)
    rewards = torch.zeros((args.num_steps, args.num_envs)).to(device)
    dones = torch.zeros((args.num_steps, args.num_envs)).to(device)
    values = torch.zeros((args.num_steps, args.num_envs)).to(device)

    global_step = 0
    next_obs, _ = envs.reset(seed=args.seed)
    next_obs = torch.Tensor(next_obs).to(device)
    next_done = torch.zeros(args.num_envs).to(device)
    minibatch_advantages = []

    for iteration in range(1, args.num_iterations + 1):
        if args.anneal_lr:
            frac = 1.0 - (iteration - 1.0) / args.num_iterations
            optimizer.param_groups[0]["lr"] = frac * args.learning_rate
        for step in range(0, args.num_steps):
            global_step += args.num_envs
            obs[step] = next_obs
            dones[step] = next_done
            with torch.no_grad():
                action, logprob, _, value = agent.get_action_and_value(next_obs)
                values[step] = value.flatten()
            actions[step] = action
            logprobs[step] = logprob
            next_obs, reward, terminations, truncations, infos = envs.step(action.cpu().numpy())
            next_done = np.logical_or(terminations, truncations)
            rewards[step] = torch.tensor(reward).to(device).view(-1)
            next_obs, next_done = torch.Tensor(next_obs).to(device), torch.Tensor(next_done).to(device)

        with torch.no_grad():
            next_value = agent.get_value(next_obs).reshape(1, -1)
        advantages, returns = compute_gae(
            rewards, values, dones, next_value, next_done, args.gamma, args.gae_lambda, args.num_steps
        )
        b_obs = obs.reshape((-1,) + envs.single_observation_space.shape)
        b_logprobs = logprobs.reshape(-1)
        b_actions = actions.reshape((-1,) + envs.single_action_space.shape)
        b_advantages = advantages.reshape(-1)
        b_returns = returns.reshape(-1)
        b_values = values.reshape(-1)
        b_inds = np.arange(args.batch_size)
        last = iteration == args.num_iterations
        for epoch in range(args.update_epochs):
            np.random.shuffle(b_inds)
            for start in range(0, args.batch_size, args.minibatch_size):
                mb_inds = b_inds[start : start + args.minibatch_size]
                _, newlogprob, entropy, newvalue = agent.get_action_and_value(b_obs[mb_inds], b_actions[mb_inds])
                logratio = newlogprob - b_logprobs[mb_inds]
                ratio = logratio.exp()
                with torch.no_grad():
                    approx_kl = ((ratio - 1) - logratio).mean()
                mb_advantages = b_advantages[mb_inds]
                if args.norm_adv:
                    mb_advantages = (mb_advantages - mb_advantages.mean()) / (mb_advantages.std() + 1e-8)
                if last and epoch == 0:
                    minibatch_advantages.append(mb_advantages.detach().clone())
                pg_loss = torch.max(
                    -mb_advantages * ratio, -mb_advantages * torch.clamp(ratio, 1 - args.clip_coef, 1 + args.clip_coef)
                ).mean()
                newvalue = newvalue.view(-1)
                if args.clip_vloss:
                    v_loss_unclipped = (newvalue - b_returns[mb_inds]) ** 2
                    v_clipped = b_values[mb_inds] + torch.clamp(
                        newvalue - b_values[mb_inds], -args.clip_coef, args.clip_coef
                    )
                    v_loss = 0.5 * torch.max(v_loss_unclipped, (v_clipped - b_returns[mb_inds]) ** 2).mean()
                else:
                    v_loss = 0.5 * ((newvalue - b_returns[mb_inds]) ** 2).mean()
                loss = pg_loss - args.ent_coef * entropy.mean() + v_loss * args.vf_coef
                optimizer.zero_grad()
                loss.backward()
                nn.utils.clip_grad_norm_(agent.parameters(), args.max_grad_norm)
                optimizer.step()
            if args.target_kl is not None and approx_kl > args.target_kl:
                break

    return {
        "agent": agent,
        "envs": envs,
        "obs": obs.clone(),
        "minibatch_advantages": minibatch_advantages,
        "args": args,
    }
