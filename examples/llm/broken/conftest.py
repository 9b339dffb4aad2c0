"""The classic first fine-tuning script, with two silent bugs pytest-dlcheck catches:
- pad_token = eos_token with DataCollatorForLanguageModeling: the real EOS is masked, so the model
  never learns to stop (L11);
- prompt and completion tokenized together with labels = input_ids: the model is trained on the
  prompts too, not only on the answers (L2)."""

import pytest
import tinyllm


@pytest.fixture(scope="session")
def dlcheck_tokenizer():
    tok = tinyllm.build_tokenizer()
    tok.pad_token = tok.eos_token  # the usual "fix" for a tokenizer without a pad token
    return tok


@pytest.fixture(scope="session")
def dlcheck_dataset(dlcheck_tokenizer):
    data = tinyllm.prompt_completion_dataset()

    def tokenize(row):
        return dlcheck_tokenizer(row["prompt"] + row["completion"] + dlcheck_tokenizer.eos_token)

    return data.map(tokenize)


@pytest.fixture(scope="session")
def dlcheck_model(dlcheck_tokenizer):
    return tinyllm.build_model(dlcheck_tokenizer)


@pytest.fixture(scope="session")
def dlcheck_collator(dlcheck_tokenizer):
    from transformers import DataCollatorForLanguageModeling

    collate = DataCollatorForLanguageModeling(dlcheck_tokenizer, mlm=False)
    # like Trainer(remove_unused_columns=True): only the token columns reach the collator
    return lambda rows: collate([{"input_ids": r["input_ids"], "attention_mask": r["attention_mask"]} for r in rows])
