"""A re-creation of huggingface/transformers examples/pytorch/summarization/run_summarization.py (commit
00e6a185ca977b0ac2c7333f5bce8e4fdf0ccb71) as its README's T5 command runs it:

    python examples/pytorch/summarization/run_summarization.py --model_name_or_path google-t5/t5-small \
        --do_train --do_eval --dataset_name cnn_dailymail --dataset_config "3.0.0" \
        --source_prefix "summarize: " --output_dir /tmp/tst-summarization \
        --per_device_train_batch_size=4 --per_device_eval_batch_size=4 \
        --overwrite_output_dir --predict_with_generate

Kept as the script has it: AutoConfig / AutoTokenizer / AutoModelForSeq2SeqLM.from_pretrained of one checkpoint;
resize_token_embeddings only when the tokenizer outgrew the table; decoder_start_token_id checked;
prefix "summarize: " on every source; preprocess_function drops rows with an empty side, tokenizes the
sources with max_length=max_source_length (1024), the targets through text_target with max_length=
max_target_length (128 for train, val_max_target_length = 128 for validation), truncation=True, no padding
(pad_to_max_length defaults to False), mapped batched with the raw columns removed;
DataCollatorForSeq2Seq(tokenizer, model=model, label_pad_token_id=-100 (ignore_pad_token_for_loss defaults to
True), pad_to_multiple_of=None (no fp16)); compute_metrics as the script's (the -100s put back to pad, batch
decode with skip_special_tokens, postprocess_text's strip and one sentence a line, ROUGE x 100, gen_len);
generation_max_length = val_max_target_length and generation_num_beams = num_beams (1);
Seq2SeqTrainer(model, args, train/eval datasets, processing_class=tokenizer, data_collator, compute_metrics
because predict_with_generate); Seq2SeqTrainingArguments defaults otherwise (AdamW at 5e-5, linear decay, 3
epochs, eval_strategy "no": the README's --do_eval evaluates once after training).

Shrunk / changed: google-t5/t5-small is a tiny T5 (d_model 32, d_kv 8, d_ff 64, 2 + 2 layers, 4 heads, ReLU
feed-forward, 32 relative-attention buckets, dropout 0.1, tied embeddings: t5-small's layout) saved with random
weights and loaded back through from_pretrained; its tokenizer is a T5Tokenizer on a Unigram trained here with
t5-small's special-token layout (<pad> 0 = decoder_start_token_id, </s> 1 appended to every sequence, <unk> 2,
a few <extra_id_*>, no BOS, model_max_length 512); cnn_dailymail 3.0.0 is 192 train / 32 validation articles
made in code (3-5 sentences, and one article in eight 13-16 sentences, 520-700 tokens: past t5-small's 512
as most cnn_dailymail articles are, fewer and shorter here to keep the run short; the highlight is the first
sentence's gist, as news highlights restate the lead);
evaluate.load("rouge") (a hub download) is a numpy ROUGE-1/2/L/Lsum F-measure stand-in without stemming and
nltk.sent_tokenize (punkt is a download) a split on ". "; send_example_telemetry, logging, the
last-checkpoint detection, --overwrite_output_dir (gone from transformers 5's arguments) and do_predict are
left out; use_cpu=True, report_to="none", disable_tqdm=True."""

import json
import random

import numpy as np
import rc_text

MAX_SOURCE_LENGTH = 1024
MAX_TARGET_LENGTH = 128
VAL_MAX_TARGET_LENGTH = 128
SOURCE_PREFIX = "summarize: "
NUM_BEAMS = 1
TINY_T5 = dict(
    d_model=32,
    d_kv=8,
    d_ff=64,
    num_layers=2,
    num_decoder_layers=2,
    num_heads=4,
    relative_attention_num_buckets=32,
    relative_attention_max_distance=128,
    dropout_rate=0.1,
    feed_forward_proj="relu",
    tie_word_embeddings=True,
    n_positions=512,
)


def _article(rng):
    subject, verb, obj = rng.choice(rc_text.SUBJECTS), rng.choice(rc_text.VERBS), rng.choice(rc_text.OBJECTS)
    lead = f"{subject} {verb} {obj} {rng.choice(rc_text.PLACES)} {rng.choice(rc_text.ENDINGS)}"
    sentences = [lead[0].upper() + lead[1:]]
    for _ in range(rng.randint(12, 15) if rng.random() < 0.125 else rng.randint(2, 4)):
        s = (
            f"{rng.choice(rc_text.SUBJECTS)} {rng.choice(rc_text.VERBS)} {rng.choice(rc_text.OBJECTS)} "
            f"{rng.choice(rc_text.PLACES)} {rng.choice(rc_text.ENDINGS)}"
        )
        sentences.append(s[0].upper() + s[1:])
    highlight = f"{subject} {verb} {obj}."
    return " ".join(sentences), highlight[0].upper() + highlight[1:]


def articles(n, seed, seen):
    rng = random.Random(seed)
    rows = {"article": [], "highlights": [], "id": []}
    while len(rows["id"]) < n:
        article, highlight = _article(rng)
        if article in seen:
            continue
        seen.add(article)
        rows["article"].append(article)
        rows["highlights"].append(highlight)
        rows["id"].append(f"{seed}-{len(rows['id'])}")
    return rows


def save_checkpoint(directory):
    """t5-small's layout, tiny: a T5Tokenizer on a Unigram trained here, and a T5ForConditionalGeneration."""
    from tokenizers import Tokenizer, models, normalizers, pre_tokenizers, trainers
    from transformers import T5Config, T5ForConditionalGeneration, T5Tokenizer

    raw = Tokenizer(models.Unigram())
    raw.normalizer = normalizers.Replace(" {2,}", " ")
    raw.pre_tokenizer = pre_tokenizers.Metaspace(replacement="\u2581", prepend_scheme="always")
    corpus = rc_text.documents(400, seed=7) + [SOURCE_PREFIX + d for d in rc_text.documents(50, seed=8)]
    raw.train_from_iterator(
        corpus,
        trainers.UnigramTrainer(
            vocab_size=500, special_tokens=["<pad>", "</s>", "<unk>"], unk_token="<unk>", show_progress=False
        ),
    )
    vocab = [tuple(v) for v in json.loads(raw.to_str())["model"]["vocab"]]
    tokenizer = T5Tokenizer(vocab=vocab, extra_ids=8, model_max_length=512)
    config = T5Config(
        vocab_size=len(tokenizer),
        pad_token_id=tokenizer.pad_token_id,
        eos_token_id=tokenizer.eos_token_id,
        decoder_start_token_id=tokenizer.pad_token_id,
        **TINY_T5,
    )
    T5ForConditionalGeneration(config).save_pretrained(str(directory))
    tokenizer.save_pretrained(str(directory))
    return str(directory)


def raw_datasets():
    from datasets import Dataset, DatasetDict

    seen = set()
    return DatasetDict(
        {
            "train": Dataset.from_dict(articles(192, seed=1, seen=seen)),
            "validation": Dataset.from_dict(articles(32, seed=2, seen=seen)),
        }
    )


def _ngrams(tokens, n):
    return [tuple(tokens[i : i + n]) for i in range(len(tokens) - n + 1)]


def _f1(overlap, pred_total, ref_total):
    if overlap == 0 or pred_total == 0 or ref_total == 0:
        return 0.0
    p, r = overlap / pred_total, overlap / ref_total
    return 2 * p * r / (p + r)


def _rouge_n(pred, ref, n):
    from collections import Counter

    p, r = Counter(_ngrams(pred, n)), Counter(_ngrams(ref, n))
    return _f1(sum((p & r).values()), sum(p.values()), sum(r.values()))


def _lcs(a, b):
    table = np.zeros((len(a) + 1, len(b) + 1), dtype=np.int64)
    for i, x in enumerate(a):
        for j, y in enumerate(b):
            table[i + 1, j + 1] = table[i, j] + 1 if x == y else max(table[i, j + 1], table[i + 1, j])
    return int(table[-1, -1])


def rouge(predictions, references):
    """The keys and F-measures evaluate's "rouge" returns (rouge1, rouge2, rougeL, rougeLsum), averaged."""
    scores = {"rouge1": [], "rouge2": [], "rougeL": [], "rougeLsum": []}
    for pred, ref in zip(predictions, references):
        pt, rt = pred.lower().split(), ref.lower().split()
        scores["rouge1"].append(_rouge_n(pt, rt, 1))
        scores["rouge2"].append(_rouge_n(pt, rt, 2))
        scores["rougeL"].append(_f1(_lcs(pt, rt), len(pt), len(rt)))
        p_lines, r_lines = [s.lower().split() for s in pred.split("\n")], [s.lower().split() for s in ref.split("\n")]
        union = sum(max((_lcs(p, r) for p in p_lines), default=0) for r in r_lines)
        scores["rougeLsum"].append(_f1(union, len(pt), len(rt)))
    return {k: float(np.mean(v)) if v else 0.0 for k, v in scores.items()}


def build_trainer(tmp_dir):
    from transformers import (
        AutoConfig,
        AutoModelForSeq2SeqLM,
        AutoTokenizer,
        DataCollatorForSeq2Seq,
        Seq2SeqTrainer,
        Seq2SeqTrainingArguments,
        set_seed,
    )

    model_name_or_path = save_checkpoint(tmp_dir / "t5-tiny")
    training_args = Seq2SeqTrainingArguments(
        output_dir=str(tmp_dir / "tst-summarization"),
        do_train=True,
        do_eval=True,
        per_device_train_batch_size=4,
        per_device_eval_batch_size=4,
        predict_with_generate=True,
        use_cpu=True,
        report_to="none",
        disable_tqdm=True,
    )
    set_seed(training_args.seed)
    raw = raw_datasets()

    config = AutoConfig.from_pretrained(model_name_or_path, revision="main")
    tokenizer = AutoTokenizer.from_pretrained(model_name_or_path, use_fast=True, revision="main")
    model = AutoModelForSeq2SeqLM.from_pretrained(model_name_or_path, config=config, revision="main")
    embedding_size = model.get_input_embeddings().weight.shape[0]
    if len(tokenizer) > embedding_size:
        model.resize_token_embeddings(len(tokenizer))
    if model.config.decoder_start_token_id is None:
        raise ValueError("Make sure that `config.decoder_start_token_id` is correctly defined")
    if (
        getattr(model.config, "max_position_embeddings", None)
        and model.config.max_position_embeddings < MAX_SOURCE_LENGTH
    ):
        model.resize_position_embeddings(MAX_SOURCE_LENGTH)

    prefix = SOURCE_PREFIX
    column_names = raw["train"].column_names
    text_column, summary_column = "article", "highlights"  # summarization_name_mapping["cnn_dailymail"]
    padding = False  # pad_to_max_length defaults to False
    max_target_length = MAX_TARGET_LENGTH

    def preprocess_function(examples):
        inputs, targets = [], []
        for i in range(len(examples[text_column])):
            if examples[text_column][i] and examples[summary_column][i]:
                inputs.append(examples[text_column][i])
                targets.append(examples[summary_column][i])
        inputs = [prefix + inp for inp in inputs]
        model_inputs = tokenizer(inputs, max_length=MAX_SOURCE_LENGTH, padding=padding, truncation=True)
        labels = tokenizer(text_target=targets, max_length=max_target_length, padding=padding, truncation=True)
        if padding == "max_length":  # and ignore_pad_token_for_loss
            labels["input_ids"] = [
                [(t if t != tokenizer.pad_token_id else -100) for t in lab] for lab in labels["input_ids"]
            ]
        model_inputs["labels"] = labels["input_ids"]
        return model_inputs

    train_dataset = raw["train"].map(preprocess_function, batched=True, remove_columns=column_names)
    max_target_length = VAL_MAX_TARGET_LENGTH
    eval_dataset = raw["validation"].map(preprocess_function, batched=True, remove_columns=column_names)

    label_pad_token_id = -100  # ignore_pad_token_for_loss
    data_collator = DataCollatorForSeq2Seq(
        tokenizer,
        model=model,
        label_pad_token_id=label_pad_token_id,
        pad_to_multiple_of=8 if training_args.fp16 else None,
    )

    def postprocess_text(preds, labels):
        preds = [pred.strip() for pred in preds]
        labels = [label.strip() for label in labels]
        preds = ["\n".join(s for s in pred.split(". ")) for pred in preds]  # nltk.sent_tokenize stand-in
        labels = ["\n".join(s for s in label.split(". ")) for label in labels]
        return preds, labels

    def compute_metrics(eval_preds):
        preds, labels = eval_preds
        if isinstance(preds, tuple):
            preds = preds[0]
        preds = np.where(preds != -100, preds, tokenizer.pad_token_id)
        decoded_preds = tokenizer.batch_decode(preds, skip_special_tokens=True)
        labels = np.where(labels != -100, labels, tokenizer.pad_token_id)
        decoded_labels = tokenizer.batch_decode(labels, skip_special_tokens=True)
        decoded_preds, decoded_labels = postprocess_text(decoded_preds, decoded_labels)
        result = rouge(decoded_preds, decoded_labels)
        result = {k: round(v * 100, 4) for k, v in result.items()}
        result["gen_len"] = np.mean([np.count_nonzero(pred != tokenizer.pad_token_id) for pred in preds])
        return result

    training_args.generation_max_length = (
        training_args.generation_max_length
        if training_args.generation_max_length is not None
        else VAL_MAX_TARGET_LENGTH
    )
    training_args.generation_num_beams = NUM_BEAMS if NUM_BEAMS is not None else training_args.generation_num_beams

    return Seq2SeqTrainer(
        model=model,
        args=training_args,
        train_dataset=train_dataset if training_args.do_train else None,
        eval_dataset=eval_dataset if training_args.do_eval else None,
        processing_class=tokenizer,
        data_collator=data_collator,
        compute_metrics=compute_metrics if training_args.predict_with_generate else None,
    )
