"""Real-code corpus: TRL trl/scripts/sft.py (trl 1.16.0) with a Qwen2-Instruct-style ChatML tokenizer and a
tiny Qwen2 checkpoint, messages dataset, SFTConfig at the script's defaults, no packing. See
rc_sft_chatml.py for what was shrunk. One fixture: the SFTTrainer."""

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
    import rc_sft_chatml

    return rc_sft_chatml.build_trainer(tmp_path_factory.mktemp("sft"))
