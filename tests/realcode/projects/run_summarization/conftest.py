"""Real-code corpus: transformers examples/pytorch/summarization/run_summarization.py (@ 00e6a18), training a tiny
T5 (t5-small's layout) on cnn_dailymail-like articles with the Seq2SeqTrainer, DataCollatorForSeq2Seq and
predict_with_generate, as the README's command runs it. See rc_run_summarization.py for what was shrunk. One
fixture: the Seq2SeqTrainer."""

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
    import rc_run_summarization

    return rc_run_summarization.build_trainer(tmp_path_factory.mktemp("run_summarization"))
