"""Real-code corpus: CleanRL's ppo_continuous_action.py on gymnasium 1.x with its per-sub-env
NormalizeObservation / NormalizeReward wrappers (see rc_cleanrl_ppo_cont.py). Handed to pytest-dlcheck
with the rl roles: the env factory, the trained vector env as the normaliser (the statistics live in its
sub-envs), the checkpoint save/load (agent state dict + obs statistics), the GAE block, the whitened
minibatch advantages and the last rollout's observations.

Experiments only (defaults are what a user writes):
RC_PPOC_NORMALIZER=wrappers hands over the list of the sub-envs' NormalizeObservation wrappers instead of
the vector env; RC_PPOC_LOADED=wrappers makes load_agent return those wrappers of the fresh envs instead of
(agent, envs); RC_PPOC_SAVE_STATS=0 saves only agent.state_dict(), as upstream does;
RC_PPO_DONES=episode_starts passes the script's dones as the Rollout's episode_starts (the old, wrong
mapping); by default they are its reset_steps (gymnasium 1.x NEXT_STEP autoreset)."""

import os

os.environ.update(OMP_NUM_THREADS="1")

import pytest
import torch

torch.set_num_threads(1)

import rc_cleanrl_ppo_cont as ppoc

from pytest_dlcheck.rl import advantage_fn


@pytest.fixture(scope="session")
def ppoc_run():
    return ppoc.train(ppoc.Args())


@pytest.fixture(scope="session")
def dlcheck_env():
    args = ppoc.Args().finish()
    return lambda: ppoc.make_envs(args)


@pytest.fixture(scope="session")
def dlcheck_normalizer(ppoc_run):
    if os.environ.get("RC_PPOC_NORMALIZER") == "wrappers":
        return ppoc.normalizers(ppoc_run["envs"])
    return ppoc_run["envs"]


@pytest.fixture(scope="session")
def dlcheck_save_agent(ppoc_run):
    save_stats = os.environ.get("RC_PPOC_SAVE_STATS", "1") != "0"

    def save(directory):
        if save_stats:
            ppoc.save_agent(ppoc_run["agent"], ppoc_run["envs"], directory)
        else:
            torch.save(ppoc_run["agent"].state_dict(), directory / "ppo_continuous_action.cleanrl_model")

    return save


@pytest.fixture(scope="session")
def dlcheck_load_agent(ppoc_run):
    args = ppoc_run["args"]
    save_stats = os.environ.get("RC_PPOC_SAVE_STATS", "1") != "0"

    def load(directory):
        if save_stats:
            agent, envs = ppoc.load_agent(args, directory)
        else:  # ppo_eval.evaluate: fresh envs, the state dict, nothing else
            envs = ppoc.make_envs(args)
            agent = ppoc.Agent(envs)
            agent.load_state_dict(torch.load(directory / "ppo_continuous_action.cleanrl_model", map_location="cpu"))
        if os.environ.get("RC_PPOC_LOADED") == "wrappers":
            return ppoc.normalizers(envs)
        return agent, envs

    return load


@pytest.fixture(scope="session")
def dlcheck_advantage_fn():
    args = ppoc.Args()
    flag = os.environ.get("RC_PPO_DONES", "reset_steps")

    def gae(rollout):
        return ppoc.compute_gae(
            rollout.rewards,
            rollout.values,
            getattr(rollout, flag),
            rollout.last_values.reshape(1, -1),
            rollout.last_dones,
            args.gamma,
            args.gae_lambda,
            rollout.rewards.shape[0],
        )

    return advantage_fn(gae, arrays="torch", gamma=args.gamma, gae_lambda=args.gae_lambda)


@pytest.fixture(scope="session")
def dlcheck_advantage_minibatches(ppoc_run):
    return ppoc_run["minibatch_advantages"]


@pytest.fixture(scope="session")
def dlcheck_rollout(ppoc_run):
    return {"obs": ppoc_run["obs"]}
