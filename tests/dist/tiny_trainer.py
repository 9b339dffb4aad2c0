"""A tiny real transformers ``Trainer`` user for the dist tests: a Llama built from a config (tests/tiny.py), a small
tokenized dataset, the causal-LM collator, CPU arguments; and a buggy twin whose ``TrainerCallback`` changes the
weights only where ``state.is_world_process_zero`` (a max-norm constraint put under the logging branch), so the
replicas drift apart although DDP averages every gradient. Imported by the throwaway user projects (and, in their
rank processes, through the fork)."""

from __future__ import annotations

import sys
from pathlib import Path

import torch
from transformers import DataCollatorForLanguageModeling, Trainer, TrainerCallback

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
import tiny  # noqa: E402

#: the embedding rows' norm constraint (the tiny Llama's rows start at about 0.16)
MAX_NORM = 0.1


class MaxNormOnMainProcess(TrainerCallback):
    """Buggy: renormalises the embedding rows after every step, but only on the main process (it sits next to the
    logging that is meant for rank 0 only): the other ranks keep the unconstrained rows."""

    def on_step_end(self, args, state, control, model=None, **kwargs):
        if state.is_world_process_zero and model is not None:
            with torch.no_grad():
                emb = model.get_input_embeddings().weight
                emb.copy_(torch.renorm(emb, p=2, dim=0, maxnorm=MAX_NORM))


def make_trainer(out: str, callback: bool = False) -> Trainer:
    tok = tiny.tokenizer()
    args = tiny.trainer_args(out, learning_rate=1e-3, max_steps=2, per_device_train_batch_size=2, seed=0)
    return Trainer(
        model=tiny.llama(tok),
        args=args,
        train_dataset=tiny.tokenized(tok, 16),
        data_collator=DataCollatorForLanguageModeling(tok, mlm=False),
        processing_class=tok,
        callbacks=[MaxNormOnMainProcess()] if callback else None,
    )


def project(callback: bool = False) -> str:
    """A user's conftest.py whose dlcheck_trainer is :func:`make_trainer` (with the buggy callback when asked)."""
    return "\n".join(
        [
            "import pytest",
            "import tiny_trainer as tt",
            "",
            "@pytest.fixture(scope='session')",
            "def dlcheck_trainer(tmp_path_factory):",
            f"    return tt.make_trainer(str(tmp_path_factory.mktemp('out')), callback={callback})",
            "",
        ]
    )
