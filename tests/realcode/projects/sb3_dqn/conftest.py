"""Real-code corpus: SB3's DQN documentation example (see rc_sb3_dqn.py), handed to pytest-dlcheck as the README's
rl section says: the algorithm after its (short) learn, and the example's save / load code."""

import os

os.environ.update(OMP_NUM_THREADS="1")

import pytest
import torch

torch.set_num_threads(1)

import rc_sb3_dqn as ex


@pytest.fixture(scope="session")
def dlcheck_algorithm():
    return ex.train()


@pytest.fixture(scope="session")
def dlcheck_save_agent(dlcheck_algorithm):
    return lambda directory: ex.save(dlcheck_algorithm, directory)


@pytest.fixture(scope="session")
def dlcheck_load_agent():
    return ex.load
