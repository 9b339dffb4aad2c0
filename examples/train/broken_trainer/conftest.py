"""A transformers Trainer with three silent bugs pytest-dlcheck catches:
- save_only_model=True: checkpoints hold the weights only, resume_from_checkpoint restarts Adam and the
  schedule (C1);
- a warmup counted in micro-batches and samples, longer than the whole run: the LR never peaks (T6);
- the eval split is the first examples of the training data (T8)."""

import pytest
import tinytrain


@pytest.fixture(scope="session")
def dlcheck_trainer(tmp_path_factory):
    import torch
    from transformers import Trainer, TrainingArguments, default_data_collator

    torch.manual_seed(0)
    train = tinytrain.records(tinytrain.blobs(seed=0))
    args = TrainingArguments(
        output_dir=str(tmp_path_factory.mktemp("trainer")),
        report_to="none",
        use_cpu=True,
        max_steps=20,
        per_device_train_batch_size=8,
        learning_rate=1e-2,
        warmup_steps=len(train),  # in samples, not optimizer steps
        save_only_model=True,
        save_strategy="no",
        disable_tqdm=True,
    )
    return Trainer(
        model=tinytrain.HFClassifier(),
        args=args,
        data_collator=default_data_collator,
        train_dataset=train,
        eval_dataset=train[:16],
    )
