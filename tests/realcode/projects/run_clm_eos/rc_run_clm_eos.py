"""A re-creation of huggingface/transformers examples/pytorch/language-modeling/run_clm.py (commit
00d481d18f914b55e65faa31e82321629691eadb), training a GPT-2 from scratch as its README shows:

    python run_clm.py --model_type gpt2 --tokenizer_name openai-community/gpt2 \
        --config_overrides="n_embd=1024,n_head=16,n_layer=48,n_positions=102" \
        --dataset_name ... --per_device_train_batch_size 8 --per_device_eval_batch_size 8 \
        --do_train --do_eval --output_dir /tmp/test-clm

Kept as the script has it: a dataset without a validation split gets one from validation_split_percentage=5
(train[:5%] / train[5%:]); config = CONFIG_MAPPING["gpt2"]() + update_from_string(config_overrides);
AutoModelForCausalLM.from_config; resize_token_embeddings only when len(tokenizer) > the embedding size;
tokenize_function = tokenizer(examples["text"]) mapped batched with the text column removed; block_size =
min(--block_size, tokenizer.model_max_length); group_texts concatenates every field of a 1000-example map
batch, drops the remainder, cuts block_size chunks and sets labels = input_ids.copy(); Trainer with
default_data_collator, processing_class=tokenizer, preprocess_logits_for_metrics (argmax) and
compute_metrics (token accuracy on labels[:, 1:] vs preds[:, :-1]); TrainingArguments defaults (lr 5e-5,
3 epochs, AdamW, linear decay, no warmup).

Shrunk / changed: the tokenizer is rc_text.gpt2_like_tokenizer (GPT-2's special-token layout, a 400-token
BPE trained here, saved and loaded back through AutoTokenizer as --tokenizer_name would) instead of
openai-community/gpt2; config_overrides "n_embd=32,n_layer=2,n_head=4,n_positions=128,vocab_size=400"
(vocab_size set to the stand-in tokenizer's size, as GPT-2's 50257 matches GPT-2's tokenizer);
--block_size 32; the data is 200 generated documents (rc_text.documents) instead of a hub dataset;
evaluate.load("accuracy") (a hub download) is replaced by the same accuracy in numpy; use_cpu=True,
report_to="none". Variant: ADD_EOS=True — tokenize_function appends tokenizer.eos_token_id (and a 1 in the attention
mask) to every document before group_texts, the usual fix for the missing document separator."""

from itertools import chain

import numpy as np
import rc_text

ADD_EOS = True
BLOCK_SIZE = 32
CONFIG_OVERRIDES = "n_embd=32,n_layer=2,n_head=4,n_positions=128,vocab_size=400"
VALIDATION_SPLIT_PERCENTAGE = 5


def raw_datasets():
    from datasets import Dataset, DatasetDict

    full = Dataset.from_dict({"text": rc_text.documents(200, seed=0)})
    cut = len(full) * VALIDATION_SPLIT_PERCENTAGE // 100
    return DatasetDict({"train": full.select(range(cut, len(full))), "validation": full.select(range(cut))})


def build_trainer(tmp_dir):
    from transformers import (
        CONFIG_MAPPING,
        AutoModelForCausalLM,
        Trainer,
        TrainingArguments,
        default_data_collator,
        set_seed,
    )

    training_args = TrainingArguments(
        output_dir=str(tmp_dir / "test-clm"),
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

    config = CONFIG_MAPPING["gpt2"]()
    config.update_from_string(CONFIG_OVERRIDES)
    tokenizer = rc_text.gpt2_like_tokenizer(tmp_dir / "tokenizer")  # --tokenizer_name
    model = AutoModelForCausalLM.from_config(config)
    embedding_size = model.get_input_embeddings().weight.shape[0]
    if len(tokenizer) > embedding_size:
        model.resize_token_embeddings(len(tokenizer))

    column_names = list(raw["train"].features)
    text_column_name = "text" if "text" in column_names else column_names[0]

    def tokenize_function(examples):
        output = tokenizer(examples[text_column_name])
        if ADD_EOS:  # run_clm_eos only: every document closed by the tokenizer's eos before grouping
            output["input_ids"] = [ids + [tokenizer.eos_token_id] for ids in output["input_ids"]]
            output["attention_mask"] = [m + [1] for m in output["attention_mask"]]
        return output

    tokenized = raw.map(
        tokenize_function, batched=True, remove_columns=column_names, desc="Running tokenizer on dataset"
    )
    block_size = min(BLOCK_SIZE, tokenizer.model_max_length)  # --block_size 32

    def group_texts(examples):
        concatenated = {k: list(chain(*examples[k])) for k in examples}
        total_length = len(concatenated[list(examples.keys())[0]])
        if total_length < block_size:
            raise ValueError(f"block_size of {block_size} is too big - use a value <={total_length}")
        total_length = (total_length // block_size) * block_size
        result = {
            k: [t[i : i + block_size] for i in range(0, total_length, block_size)] for k, t in concatenated.items()
        }
        result["labels"] = result["input_ids"].copy()
        return result

    lm = tokenized.map(group_texts, batched=True, desc=f"Grouping texts in chunks of {block_size}")
    train_dataset, eval_dataset = lm["train"], lm["validation"]

    def preprocess_logits_for_metrics(logits, labels):
        if isinstance(logits, tuple):
            logits = logits[0]
        return logits.argmax(dim=-1)

    def compute_metrics(eval_preds):
        preds, labels = eval_preds
        labels = labels[:, 1:].reshape(-1)
        preds = preds[:, :-1].reshape(-1)
        return {"accuracy": float((np.asarray(preds) == np.asarray(labels)).mean())}  # evaluate's "accuracy"

    return Trainer(
        model=model,
        args=training_args,
        train_dataset=train_dataset,
        eval_dataset=eval_dataset,
        processing_class=tokenizer,
        data_collator=default_data_collator,
        compute_metrics=compute_metrics,
        preprocess_logits_for_metrics=preprocess_logits_for_metrics,
    )
