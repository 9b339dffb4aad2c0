"""Real-code corpus: transformers examples/pytorch/token-classification/run_ner.py (@ 0a8c149), fine-tuning a
tiny BERT for CoNLL-style NER with the Trainer and DataCollatorForTokenClassification, each word's label on
its first sub-token only (label_all_tokens False). See rc_run_ner.py for what was shrunk. One fixture: the Trainer."""

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
    import rc_run_ner

    return rc_run_ner.build_trainer(tmp_path_factory.mktemp("run_ner"))
