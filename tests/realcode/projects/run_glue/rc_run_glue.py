"""A re-creation of huggingface/transformers examples/pytorch/text-classification/run_glue.py (commit
242e7fc66cfcb271496bf5a6d207db90c9b96817), fine-tuning on a GLUE pair task as the README shows:

    python run_glue.py --model_name_or_path google-bert/bert-base-cased --task_name mrpc \
        --do_train --do_eval --max_seq_length 128 --per_device_train_batch_size 32 \
        --learning_rate 2e-5 --num_train_epochs 3 --output_dir /tmp/mrpc/

Kept as the script has it: task_to_keys["mrpc"] = (sentence1, sentence2); the labels a ClassLabel whose names
give num_labels; AutoConfig.from_pretrained(num_labels, finetuning_task); AutoTokenizer and
AutoModelForSequenceClassification.from_pretrained (the pretrained encoder has no classification head: the
head is newly initialised, as from bert-base-cased); the label2id branch for a GLUE task whose model has no
labels of its own; max_seq_length = min(128, tokenizer.model_max_length); preprocess_function tokenizes the
pair with padding="max_length" (pad_to_max_length defaults to True), truncation=True, mapped batched over
every split without removing columns (the Trainer drops the unused sentence1/sentence2/idx columns);
data_collator = default_data_collator because pad_to_max_length; compute_metrics = argmax then the GLUE mrpc
metric (accuracy and f1) with combined_score; Trainer(model, args, train/eval datasets, compute_metrics,
tokenizer -> processing_class, data_collator); TrainingArguments defaults otherwise (AdamW, linear decay,
no warmup, seed 42).

Shrunk / changed: the "pretrained" model is a tiny BERT (hidden 32, 2 layers, 4 heads, intermediate 64,
max_position_embeddings 512 as bert-base) saved with random weights and loaded back through from_pretrained;
the tokenizer is rc_text.bert_like_tokenizer (bert-base's special-token layout on a 400-token WordPiece)
instead of bert-base-cased's; glue/mrpc is replaced by 320 train / 64 validation sentence pairs made in
code (label 1 "equivalent" for a reworded copy of sentence1, 0 for another sentence on the same subject;
about 2/3 equivalent as in MRPC); evaluate.load("glue", "mrpc") (a hub download) is the same accuracy/f1 in
numpy; the test split and do_predict are left out; use_cpu=True, report_to="none"."""

import random

import numpy as np
import rc_text

TASK_NAME = "mrpc"
TASK_TO_KEYS = {"mrpc": ("sentence1", "sentence2"), "sst2": ("sentence", None), "stsb": ("sentence1", "sentence2")}
MAX_SEQ_LENGTH = 128
PAD_TO_MAX_LENGTH = True
TINY_BERT = dict(
    hidden_size=32,
    num_hidden_layers=2,
    num_attention_heads=4,
    intermediate_size=64,
    max_position_embeddings=512,
)


def _sentence(rng):
    subject, verb = rng.choice(rc_text.SUBJECTS), rng.choice(rc_text.VERBS)
    obj, place = rng.choice(rc_text.OBJECTS), rng.choice(rc_text.PLACES)
    return subject, verb, obj, place


def _pairs(n, rng, seen):
    rows = {"sentence1": [], "sentence2": [], "label": []}
    while len(rows["label"]) < n:
        subject, verb, obj, place = _sentence(rng)
        s1 = f"{subject} {verb} {obj} {place}."
        if rng.random() < 0.68:  # MRPC: 68% of the pairs are paraphrases
            s2, label = f"{place.capitalize()}, {obj} was {verb} by {subject}.", 1
        else:
            _, verb2, obj2, place2 = _sentence(rng)
            if (verb2, obj2) == (verb, obj):
                continue
            s2, label = f"{place2.capitalize()}, {obj2} was {verb2} by {subject}.", 0
        s1 = s1[0].upper() + s1[1:]
        if s1 in seen:  # GLUE's splits hold distinct pairs: each first sentence once over all splits
            continue
        seen.add(s1)
        rows["sentence1"].append(s1)
        rows["sentence2"].append(s2)
        rows["label"].append(label)
    rows["idx"] = list(range(n))
    return rows


def raw_datasets():
    """glue/mrpc's layout: sentence1, sentence2, label (ClassLabel), idx."""
    from datasets import ClassLabel, Dataset, DatasetDict, Features, Value

    features = Features(
        {
            "sentence1": Value("string"),
            "sentence2": Value("string"),
            "label": ClassLabel(names=["not_equivalent", "equivalent"]),
            "idx": Value("int32"),
        }
    )
    rng, seen = random.Random(0), set()
    train = Dataset.from_dict(_pairs(320, rng, seen), features=features)
    validation = Dataset.from_dict(_pairs(64, rng, seen), features=features)
    return DatasetDict({"train": train, "validation": validation})


def pretrained_checkpoint(path):
    """Stands in for google-bert/bert-base-cased: a pretraining checkpoint (no classification head)."""
    from transformers import BertConfig, BertForPreTraining

    tok = rc_text.bert_like_tokenizer(path)
    BertForPreTraining(BertConfig(vocab_size=len(tok), pad_token_id=tok.pad_token_id, **TINY_BERT)).save_pretrained(
        str(path)
    )
    return str(path)


def build_trainer(tmp_dir):
    from transformers import (
        AutoConfig,
        AutoModelForSequenceClassification,
        AutoTokenizer,
        PretrainedConfig,
        Trainer,
        TrainingArguments,
        default_data_collator,
        set_seed,
    )

    model_name_or_path = pretrained_checkpoint(tmp_dir / "bert-base-cased")
    training_args = TrainingArguments(
        output_dir=str(tmp_dir / TASK_NAME),
        do_train=True,
        do_eval=True,
        per_device_train_batch_size=32,
        learning_rate=2e-5,
        num_train_epochs=3,
        use_cpu=True,
        report_to="none",
        disable_tqdm=True,
    )
    set_seed(training_args.seed)
    raw = raw_datasets()

    is_regression = TASK_NAME == "stsb"
    label_list = raw["train"].features["label"].names
    num_labels = len(label_list)

    config = AutoConfig.from_pretrained(model_name_or_path, num_labels=num_labels, finetuning_task=TASK_NAME)
    tokenizer = AutoTokenizer.from_pretrained(model_name_or_path, use_fast=True)
    model = AutoModelForSequenceClassification.from_pretrained(model_name_or_path, config=config)

    sentence1_key, sentence2_key = TASK_TO_KEYS[TASK_NAME]
    padding = "max_length" if PAD_TO_MAX_LENGTH else False

    label_to_id = None
    if model.config.label2id != PretrainedConfig(num_labels=num_labels).label2id and not is_regression:
        label_name_to_id = {k.lower(): v for k, v in model.config.label2id.items()}
        if sorted(label_name_to_id) == sorted(label_list):
            label_to_id = {i: int(label_name_to_id[label_list[i]]) for i in range(num_labels)}
    if label_to_id is not None:
        model.config.label2id = label_to_id
        model.config.id2label = {i: label for label, i in config.label2id.items()}
    elif not is_regression:
        model.config.label2id = {name: i for i, name in enumerate(label_list)}
        model.config.id2label = {i: label for label, i in config.label2id.items()}

    max_seq_length = min(MAX_SEQ_LENGTH, tokenizer.model_max_length)

    def preprocess_function(examples):
        args = (
            (examples[sentence1_key],) if sentence2_key is None else (examples[sentence1_key], examples[sentence2_key])
        )
        result = tokenizer(*args, padding=padding, max_length=max_seq_length, truncation=True)
        if label_to_id is not None and "label" in examples:
            result["label"] = [(label_to_id[lab] if lab != -1 else -1) for lab in examples["label"]]
        return result

    raw = raw.map(preprocess_function, batched=True, desc="Running tokenizer on dataset")
    train_dataset, eval_dataset = raw["train"], raw["validation"]

    def glue_mrpc(predictions, references):  # evaluate.load("glue", "mrpc"): accuracy and binary f1
        tp = float(((predictions == 1) & (references == 1)).sum())
        fp = float(((predictions == 1) & (references == 0)).sum())
        fn = float(((predictions == 0) & (references == 1)).sum())
        f1 = 2 * tp / (2 * tp + fp + fn) if tp else 0.0
        return {"accuracy": float((predictions == references).mean()), "f1": f1}

    def compute_metrics(p):
        preds = p.predictions[0] if isinstance(p.predictions, tuple) else p.predictions
        preds = np.squeeze(preds) if is_regression else np.argmax(preds, axis=1)
        result = glue_mrpc(preds, p.label_ids)
        if len(result) > 1:
            result["combined_score"] = np.mean(list(result.values())).item()
        return result

    data_collator = default_data_collator if PAD_TO_MAX_LENGTH else None

    return Trainer(
        model=model,
        args=training_args,
        train_dataset=train_dataset,
        eval_dataset=eval_dataset,
        compute_metrics=compute_metrics,
        processing_class=tokenizer,
        data_collator=data_collator,
    )
