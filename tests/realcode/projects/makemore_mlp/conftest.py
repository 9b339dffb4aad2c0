"""Real-code corpus: the MLP of "Building makemore Part 2" (karpathy/nn-zero-to-hero
lectures/makemore/makemore_part2_mlp.ipynb @ 73c3fcc), shrunk to 320 names (see rc_makemore_mlp.py). Handed to
pytest-dlcheck as a plain loop: the factory, the notebook's step, F.cross_entropy as the loss, the train
minibatches and the dev split."""

import os

os.environ.update(HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1", HF_DATASETS_OFFLINE="1", OMP_NUM_THREADS="1")

import pytest
import torch
import torch.nn.functional as F

torch.set_num_threads(1)

import rc_makemore_mlp as mm


@pytest.fixture(scope="session")
def dlcheck_make_training():
    return mm.make_training


@pytest.fixture(scope="session")
def dlcheck_train_step():
    return mm.train_step


@pytest.fixture(scope="session")
def dlcheck_loss_fn():
    return F.cross_entropy


@pytest.fixture(scope="session")
def dlcheck_dataloader():
    return mm.train_loader()


@pytest.fixture(scope="session")
def dlcheck_eval_dataloader():
    return mm.dev_loader()
