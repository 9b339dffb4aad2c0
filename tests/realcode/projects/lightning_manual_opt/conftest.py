"""Real-code corpus: Lightning's manual-optimization guide (see rc_lit_manual.py), handed over as a
Lightning user does: the LightningModule and the LightningDataModule."""

import os

os.environ.update(OMP_NUM_THREADS="1")

import pytest
import torch

torch.set_num_threads(1)

import rc_lit_manual as lit


@pytest.fixture(scope="session")
def dlcheck_lightning_module():
    torch.manual_seed(0)
    return lit.ManualModel()


@pytest.fixture(scope="session")
def dlcheck_datamodule():
    return lit.BlobsData()
