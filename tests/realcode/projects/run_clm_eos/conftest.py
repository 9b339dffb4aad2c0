"""Real-code corpus: transformers examples/pytorch/language-modeling/run_clm.py (@ 00d481d), training a tiny
GPT-2 from scratch with the Trainer; every text closed by the tokenizer's eos before grouping. See
rc_run_clm_eos.py for what was shrunk. One fixture: the Trainer."""

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
    import rc_run_clm_eos as rc_run_clm

    return rc_run_clm.build_trainer(tmp_path_factory.mktemp("run_clm_eos"))


@pytest.fixture(scope="session")
def dlcheck_documents():
    """The texts before tokenize_function and group_texts (the script's raw_datasets["train"])."""
    import rc_run_clm_eos as rc_run_clm

    return rc_run_clm.raw_datasets()["train"]
