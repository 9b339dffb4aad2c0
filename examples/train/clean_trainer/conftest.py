"""A clean transformers Trainer: one fixture is all pytest-dlcheck needs. Its runs go through a clone of
this Trainer (fresh model copy, same arguments, output under pytest's tmp dir)."""

import pytest
import tinytrain


@pytest.fixture(scope="session")
def dlcheck_trainer(tmp_path_factory):
    import torch
    from transformers import Trainer, TrainingArguments, default_data_collator

    torch.manual_seed(0)
    args = TrainingArguments(
        output_dir=str(tmp_path_factory.mktemp("trainer")),
        report_to="none",
        use_cpu=True,
        max_steps=20,
        per_device_train_batch_size=8,
        learning_rate=1e-2,
        warmup_steps=2,
        save_strategy="no",
        disable_tqdm=True,
    )
    return Trainer(
        model=tinytrain.HFClassifier(),
        args=args,
        data_collator=default_data_collator,
        train_dataset=tinytrain.records(tinytrain.blobs(seed=0)),
        eval_dataset=tinytrain.records(tinytrain.blobs(32, seed=1)),
    )
