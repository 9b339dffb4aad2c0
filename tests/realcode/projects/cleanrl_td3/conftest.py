"""Real-code corpus: CleanRL's td3_continuous_action.py (see rc_cleanrl_td3.py). Handed to pytest-dlcheck with the
rl roles of a hand-written off-policy loop: the env factory (the script's SyncVectorEnv), the script's critic target
with the done it stores in the replay buffer, the observations it stored, the scalars it writes to TensorBoard as
the run's log, and its save_model / td3_eval load as the agent's save and load."""

import os

os.environ.update(OMP_NUM_THREADS="1")

import pytest
import torch

torch.set_num_threads(1)

import rc_cleanrl_td3 as td3

from pytest_dlcheck.rl import td_target_fn


@pytest.fixture(scope="session")
def td3_run():
    return td3.train(td3.Args())


@pytest.fixture(scope="session")
def dlcheck_env():
    args = td3.Args()
    return lambda: td3.make_envs(args)


@pytest.fixture(scope="session")
def dlcheck_td_target_fn():
    args = td3.Args()

    def target(rewards, terminations, truncations, next_values, gamma):
        # what rb.add stores as the done, then next_q_value from min(Q1'(s', a'), Q2'(s', a'))
        dones = td3.stored_dones(terminations, truncations)
        return td3.next_q_value(rewards, dones, next_values, gamma)

    return td_target_fn(target, arrays="torch", gamma=args.gamma)


@pytest.fixture(scope="session")
def dlcheck_rollout(td3_run):
    rb = td3_run["rb"]
    return {"obs": torch.as_tensor(rb.observations[: rb.pos])}


@pytest.fixture(scope="session")
def dlcheck_train_log(td3_run):
    return td3_run["log"]


@pytest.fixture(scope="session")
def dlcheck_save_agent(td3_run):
    return lambda directory: td3.save_model(
        td3_run["actor"], td3_run["qf1"], td3_run["qf2"], directory / "td3_continuous_action.cleanrl_model"
    )


@pytest.fixture(scope="session")
def dlcheck_load_agent():
    args = td3.Args()

    def load(directory):
        actor, qf1, qf2, envs = td3.load_model(directory / "td3_continuous_action.cleanrl_model", args)
        return {"actor": actor, "qf1": qf1, "qf2": qf2, "env": envs}

    return load
