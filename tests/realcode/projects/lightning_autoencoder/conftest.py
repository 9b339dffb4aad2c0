"""Real-code corpus: Lightning's examples/pytorch/basics/autoencoder.py (see rc_lit_autoencoder.py), handed over
as the README's Lightning section says: the LightningModule and the LightningDataModule (the example's
ImageSampler callback has no role to be handed over as)."""

import os

os.environ.update(OMP_NUM_THREADS="1")

import pytest
import torch

torch.set_num_threads(1)

import rc_lit_autoencoder as ae


@pytest.fixture(scope="session")
def dlcheck_lightning_module():
    torch.manual_seed(1234)  # LightningCLI(seed_everything_default=1234)
    return ae.LitAutoEncoder()


@pytest.fixture(scope="session")
def dlcheck_datamodule():
    return ae.MyDataModule()
