"""Real-code corpus: transformers examples/pytorch/text-classification/run_glue.py (@ 242e7fc), fine-tuning a
tiny BERT on an MRPC-like sentence-pair task with the Trainer, padded to max_seq_length as the script does by
default. See rc_run_glue.py for what was shrunk. One fixture: the Trainer."""

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
    import rc_run_glue

    return rc_run_glue.build_trainer(tmp_path_factory.mktemp("run_glue"))
