"""Real-code corpus: CleanRL's ppo.py on gymnasium 1.x (see rc_cleanrl_ppo.py). Handed to pytest-dlcheck
with the rl roles of a hand-written loop: the env factory (the script's SyncVectorEnv), the script's GAE
block as the advantage function, the whitened minibatch advantages its update feeds the loss, the last
rollout's observations, and the scalars it writes to TensorBoard as the run's log.

The script's ``dones`` are passed as the Rollout's ``reset_steps``: under gymnasium 1.x's NEXT_STEP autoreset
they flag the step whose observation is the reset one (an earlier Rollout doc mapped them to ``episode_starts``,
which gave a false failure: FINDINGS-media.md). RC_PPO_DONES=episode_starts reproduces that mapping."""

import os

os.environ.update(OMP_NUM_THREADS="1")

import pytest
import torch

torch.set_num_threads(1)

import rc_cleanrl_ppo as ppo

from pytest_dlcheck.rl import advantage_fn


@pytest.fixture(scope="session")
def ppo_run():
    return ppo.train(ppo.Args())


@pytest.fixture(scope="session")
def dlcheck_env():
    args = ppo.Args().finish()
    return lambda: ppo.make_envs(args)


@pytest.fixture(scope="session")
def dlcheck_advantage_fn():
    args = ppo.Args()
    flag = os.environ.get("RC_PPO_DONES", "reset_steps")

    def gae(rollout):
        # the script's storage: dones[t] is the done flag stored *before* step t; next_value / next_done
        # belong to the observation after the rollout
        return ppo.compute_gae(
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
def dlcheck_advantage_minibatches(ppo_run):
    return ppo_run["minibatch_advantages"]


@pytest.fixture(scope="session")
def dlcheck_rollout(ppo_run):
    return {"obs": ppo_run["obs"]}


@pytest.fixture(scope="session")
def dlcheck_train_log(ppo_run):
    return ppo_run["log"]
