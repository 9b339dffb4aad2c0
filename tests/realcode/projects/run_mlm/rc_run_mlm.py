"""A re-creation of huggingface/transformers examples/pytorch/language-modeling/run_mlm.py (commit
c21aadb314af7792ca67cc353287522e684d6347), fine-tuning a masked LM on raw text as the README shows
(there with roberta-base on wikitext-2-raw-v1), grouped into blocks (line_by_line False, the default):

    python run_mlm.py --model_name_or_path <bert checkpoint> --dataset_name wikitext \
        --dataset_config_name wikitext-2-raw-v1 --per_device_train_batch_size 8 \
        --per_device_eval_batch_size 8 --do_train --do_eval --max_seq_length 64 --output_dir /tmp/test-mlm

Kept as the script has it: a dataset without a validation split gets one from validation_split_percentage=5
(train[:5%] / train[5%:]); AutoConfig / AutoTokenizer / AutoModelForMaskedLM.from_pretrained, then
model.resize_token_embeddings(len(tokenizer)) unconditionally; max_seq_length = min(--max_seq_length,
tokenizer.model_max_length); tokenize_function = tokenizer(text, return_special_tokens_mask=True) (each text
gets its own [CLS] ... [SEP]) mapped batched with every column removed; group_texts concatenates every field
(special_tokens_mask too) of a 1000-example map batch, drops the remainder when at least one block is full,
and cuts max_seq_length chunks, with no labels (the collator makes them); DataCollatorForLanguageModeling(
tokenizer, mlm_probability=0.15, pad_to_multiple_of=None) for training and evaluation alike;
preprocess_logits_for_metrics (argmax) and compute_metrics (accuracy over the positions whose label is not
-100, as evaluate's "accuracy"); Trainer(model, args, datasets, tokenizer -> processing_class,
data_collator, compute_metrics, preprocess_logits_for_metrics); TrainingArguments defaults otherwise (lr
5e-5, 3 epochs, AdamW, linear decay, no warmup, seed 42).

Shrunk / changed: the checkpoint is a tiny BERT masked LM (hidden 32, 2 layers, 4 heads, intermediate 64,
max_position_embeddings 512) saved with random weights and loaded back through from_pretrained, with
rc_text.bert_like_tokenizer (bert-base-uncased's layout: [CLS]/[SEP]/[MASK], a 400-token WordPiece) instead
of roberta-base and its BPE; wikitext is replaced by 400 generated documents (rc_text.documents) in a single
train split; --max_seq_length 64 (the default would take the tokenizer's 512); evaluate.load("accuracy") (a
hub download) is the same accuracy in numpy; use_cpu=True, report_to="none"."""

from itertools import chain

import numpy as np
import rc_text

MAX_SEQ_LENGTH = 64
MLM_PROBABILITY = 0.15
VALIDATION_SPLIT_PERCENTAGE = 5
LINE_BY_LINE = False
TINY_BERT = dict(
    hidden_size=32,
    num_hidden_layers=2,
    num_attention_heads=4,
    intermediate_size=64,
    max_position_embeddings=512,
)


def raw_datasets():
    from datasets import Dataset, DatasetDict

    full = Dataset.from_dict({"text": rc_text.documents(400, seed=0)})
    cut = len(full) * VALIDATION_SPLIT_PERCENTAGE // 100
    return DatasetDict({"train": full.select(range(cut, len(full))), "validation": full.select(range(cut))})


def pretrained_checkpoint(path):
    """Stands in for the README's pretrained masked LM: a BERT MLM checkpoint with the tokenizer beside it."""
    from transformers import BertConfig, BertForMaskedLM

    tok = rc_text.bert_like_tokenizer(path)
    BertForMaskedLM(BertConfig(vocab_size=len(tok), pad_token_id=tok.pad_token_id, **TINY_BERT)).save_pretrained(
        str(path)
    )
    return str(path)


def build_trainer(tmp_dir):
    from transformers import (
        AutoConfig,
        AutoModelForMaskedLM,
        AutoTokenizer,
        DataCollatorForLanguageModeling,
        Trainer,
        TrainingArguments,
        set_seed,
    )

    model_name_or_path = pretrained_checkpoint(tmp_dir / "bert-mlm")
    training_args = TrainingArguments(
        output_dir=str(tmp_dir / "test-mlm"),
        do_train=True,
        do_eval=True,
        per_device_train_batch_size=8,
        per_device_eval_batch_size=8,
        use_cpu=True,
        report_to="none",
        disable_tqdm=True,
    )
    set_seed(training_args.seed)
    raw = raw_datasets()

    config = AutoConfig.from_pretrained(model_name_or_path)
    tokenizer = AutoTokenizer.from_pretrained(model_name_or_path, use_fast=True)
    model = AutoModelForMaskedLM.from_pretrained(model_name_or_path, config=config)
    model.resize_token_embeddings(len(tokenizer))

    column_names = raw["train"].column_names
    text_column_name = "text" if "text" in column_names else column_names[0]
    max_seq_length = min(MAX_SEQ_LENGTH, tokenizer.model_max_length)

    def tokenize_function(examples):
        return tokenizer(examples[text_column_name], return_special_tokens_mask=True)

    tokenized = raw.map(
        tokenize_function, batched=True, remove_columns=column_names, desc="Running tokenizer on every text in dataset"
    )

    def group_texts(examples):
        concatenated = {k: list(chain(*examples[k])) for k in examples}
        total_length = len(concatenated[list(examples.keys())[0]])
        if total_length >= max_seq_length:
            total_length = (total_length // max_seq_length) * max_seq_length
        return {
            k: [t[i : i + max_seq_length] for i in range(0, total_length, max_seq_length)]
            for k, t in concatenated.items()
        }

    tokenized = tokenized.map(group_texts, batched=True, desc=f"Grouping texts in chunks of {max_seq_length}")
    train_dataset, eval_dataset = tokenized["train"], tokenized["validation"]

    def preprocess_logits_for_metrics(logits, labels):
        if isinstance(logits, tuple):
            logits = logits[0]
        return logits.argmax(dim=-1)

    def compute_metrics(eval_preds):
        preds, labels = eval_preds
        labels = labels.reshape(-1)
        preds = preds.reshape(-1)
        mask = labels != -100
        return {"accuracy": float((np.asarray(preds[mask]) == np.asarray(labels[mask])).mean())}

    pad_to_multiple_of_8 = LINE_BY_LINE and training_args.fp16
    data_collator = DataCollatorForLanguageModeling(
        tokenizer=tokenizer,
        mlm_probability=MLM_PROBABILITY,
        pad_to_multiple_of=8 if pad_to_multiple_of_8 else None,
    )

    return Trainer(
        model=model,
        args=training_args,
        train_dataset=train_dataset,
        eval_dataset=eval_dataset,
        processing_class=tokenizer,
        data_collator=data_collator,
        compute_metrics=compute_metrics,
        preprocess_logits_for_metrics=preprocess_logits_for_metrics,
    )
