"""Real-code corpus: Lightning's torch.compile-in-configure_model guide (see rc_lit_compiled.py), handed
over as a Lightning user does: the LightningModule (as constructed: its compiled submodule is built by
configure_model when a Trainer sets it up) and the LightningDataModule."""

import os

os.environ.update(OMP_NUM_THREADS="1")

import pytest
import torch

torch.set_num_threads(1)

import rc_lit_compiled as lit


@pytest.fixture(scope="session")
def dlcheck_lightning_module():
    torch.manual_seed(0)
    return lit.LanguageModelWithIdx() if os.environ.get("RC_LIT_STEP_IDX") == "1" else lit.LanguageModel()


@pytest.fixture(scope="session")
def dlcheck_datamodule():
    return lit.PatternData()
