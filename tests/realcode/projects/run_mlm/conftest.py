"""Real-code corpus: transformers examples/pytorch/language-modeling/run_mlm.py (@ c21aadb), fine-tuning a
tiny BERT masked LM with the Trainer and DataCollatorForLanguageModeling(mlm_probability=0.15), the texts
grouped into 64-token blocks (group_texts, the default). See rc_run_mlm.py for what was shrunk. One fixture: the Trainer."""

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
    import rc_run_mlm

    return rc_run_mlm.build_trainer(tmp_path_factory.mktemp("run_mlm"))
