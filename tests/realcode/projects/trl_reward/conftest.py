"""Real-code corpus: TRL examples/scripts/reward_modeling.py (@ f2cd577, run with trl 1.16.0's RewardTrainer): a
tiny Qwen2-Instruct stand-in loaded as AutoModelForSequenceClassification(num_labels=1), conversational
chosen/rejected rows. See rc_reward.py for what was shrunk. One fixture: the RewardTrainer."""

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
    import rc_reward

    return rc_reward.build_trainer(tmp_path_factory.mktemp("reward"))
