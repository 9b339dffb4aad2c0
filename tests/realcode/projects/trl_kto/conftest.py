"""Real-code corpus: TRL examples/scripts/kto.py (@ f2cd577, run with trl 1.16.0's KTOTrainer) at the documented
learning rate 5e-7 and batch size 16: a tiny Qwen2 ChatML stand-in loaded twice (policy and reference),
conversational prompt/completion/label rows. See rc_kto.py for what was shrunk. One fixture: the KTOTrainer."""

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
    import rc_kto

    return rc_kto.build_trainer(tmp_path_factory.mktemp("kto"))
