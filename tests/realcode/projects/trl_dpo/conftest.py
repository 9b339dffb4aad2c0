"""Real-code corpus: TRL trl/scripts/dpo.py (trl 1.16.0) at the documented learning rate 5e-7, a tiny
Qwen2-Instruct stand-in loaded from a path (TRL builds the reference model itself), a conversational
prompt/chosen/rejected dataset. See rc_dpo.py for what was shrunk. One fixture: the DPOTrainer."""

import os
import sys

os.environ.update(
    HF_HUB_OFFLINE="1",
    TRANSFORMERS_OFFLINE="1",
    HF_DATASETS_OFFLINE="1",
    OMP_NUM_THREADS="1",
    HF_DATASETS_DISABLE_PROGRESS_BARS="1",
    TOKENIZERS_PARALLELISM="false",
)
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # rc_text.py

import pytest
import torch

torch.set_num_threads(1)


@pytest.fixture(scope="session")
def dlcheck_trainer(tmp_path_factory):
    import rc_dpo

    return rc_dpo.build_trainer(tmp_path_factory.mktemp("dpo"))
