"""Real-code corpus: CleanRL's dqn.py (see rc_cleanrl_dqn.py). Handed to pytest-dlcheck with the rl roles of a
hand-written off-policy loop: the env factory (the script's SyncVectorEnv), the script's TD target with the done
it stores in the replay buffer, the observations it stored, the scalars it writes to TensorBoard as the run's
log, and its save_model / dqn_eval load as the agent's save and load."""

import os

os.environ.update(OMP_NUM_THREADS="1")

import pytest
import torch

torch.set_num_threads(1)

import rc_cleanrl_dqn as dqn

from pytest_dlcheck.rl import td_target_fn


@pytest.fixture(scope="session")
def dqn_run():
    return dqn.train(dqn.Args())


@pytest.fixture(scope="session")
def dlcheck_env():
    args = dqn.Args()
    return lambda: dqn.make_envs(args)


@pytest.fixture(scope="session")
def dlcheck_td_target_fn():
    args = dqn.Args()

    def target(rewards, terminations, truncations, target_max, gamma):
        # what rb.add stores as the done, then the line of the training step that builds the target
        dones = dqn.stored_dones(terminations, truncations)
        return dqn.td_target(rewards, target_max, dones, gamma)

    return td_target_fn(target, arrays="torch", gamma=args.gamma)


@pytest.fixture(scope="session")
def dlcheck_rollout(dqn_run):
    rb = dqn_run["rb"]
    return {"obs": torch.as_tensor(rb.observations[: rb.pos])}


@pytest.fixture(scope="session")
def dlcheck_train_log(dqn_run):
    return dqn_run["log"]


@pytest.fixture(scope="session")
def dlcheck_save_agent(dqn_run):
    return lambda directory: dqn.save_model(dqn_run["q_network"], directory / "dqn.cleanrl_model")


@pytest.fixture(scope="session")
def dlcheck_load_agent():
    args = dqn.Args()

    def load(directory):
        model, envs = dqn.load_model(directory / "dqn.cleanrl_model", args)
        return {"model": model, "env": envs}

    return load
