"""Real-code corpus: karpathy/nanoGPT train.py + model.py (commit 3adf61e154c3fe3fca428ad6bc3818b27a3b8291),
the README's CPU shakespeare_char run, shrunk (see rc_nanogpt_train.py). Handed to pytest-dlcheck as a
plain loop: a factory of fresh training objects, the script's micro-step, its checkpoint save/resume, and
get_batch wrapped as DataLoaders."""

import os

os.environ.update(
    HF_HUB_OFFLINE="1",
    TRANSFORMERS_OFFLINE="1",
    HF_DATASETS_OFFLINE="1",
    OMP_NUM_THREADS="1",
    HF_DATASETS_DISABLE_PROGRESS_BARS="1",
    TOKENIZERS_PARALLELISM="false",
)

import pytest
import torch

torch.set_num_threads(1)

import rc_nanogpt_train as train


@pytest.fixture(scope="session")
def dlcheck_make_training():
    return train.make_training


@pytest.fixture(scope="session")
def dlcheck_train_step():
    return train.train_step


@pytest.fixture(scope="session")
def dlcheck_compute_loss():
    return train.compute_loss


@pytest.fixture(scope="session")
def dlcheck_dataloader():
    return train.loader("train")


@pytest.fixture(scope="session")
def dlcheck_eval_dataloader():
    return train.loader("val")


@pytest.fixture(scope="session")
def dlcheck_save_checkpoint():
    return train.save_checkpoint


@pytest.fixture(scope="session")
def dlcheck_load_checkpoint():
    return train.load_checkpoint
