"""A re-creation of huggingface/transformers examples/pytorch/token-classification/run_ner.py (commit
0a8c149f1e2f5dfc13e505d040efb488723e88a2), fine-tuning on CoNLL-2003 as the README shows:

    python run_ner.py --model_name_or_path google-bert/bert-base-uncased --dataset_name conll2003 \
        --output_dir /tmp/test-ner --do_train --do_eval

Kept as the script has it: text_column_name "tokens" and label_column_name "ner_tags" (task_name "ner"); the
labels a Sequence(ClassLabel) so label_list = its names and label_to_id the identity; AutoConfig(num_labels,
finetuning_task="ner"); AutoTokenizer(use_fast=True) (the script requires a fast tokenizer) and
AutoModelForTokenClassification.from_pretrained (a new token-classification head on the pretrained encoder);
model.config.label2id / id2label set from label_list; the b_to_i_label map; tokenize_and_align_labels with
padding=False (pad_to_max_length False), truncation=True, max_length=None (max_seq_length default),
is_split_into_words=True, -100 on special tokens, the word's label on its first sub-token and -100 on the
others (label_all_tokens False); train and validation mapped batched without removing columns (the Trainer
drops tokens/ner_tags/pos_tags/chunk_tags/id); DataCollatorForTokenClassification(tokenizer,
pad_to_multiple_of=None) (fp16 off); compute_metrics: argmax over the labels, -100 positions dropped, then
seqeval's overall precision / recall / f1 / accuracy; Trainer(model, args, datasets, tokenizer ->
processing_class, data_collator, compute_metrics); TrainingArguments defaults (batch 8, lr 5e-5, 3 epochs,
AdamW, linear decay, no warmup, seed 42).

Shrunk / changed: the "pretrained" model is a tiny BERT (hidden 32, 2 layers, 4 heads, intermediate 64,
max_position_embeddings 512) saved with random weights and loaded back through from_pretrained; the
tokenizer is rc_text.bert_like_tokenizer (bert-base-uncased's layout on a 500-token WordPiece trained on other
English text, so the names split into ##pieces as rare words do in the real vocabulary); conll2003 is replaced by 200 train / 40 validation
sentences made in code with its nine IOB2 tags (PER, ORG, LOC, MISC) and its columns; evaluate.load("seqeval")
(a hub download) is replaced by a small re-implementation of seqeval's default IOB2 entity matching in plain
Python; use_cpu=True, report_to="none"."""

import random

import numpy as np
import rc_text

LABEL_NAMES = ["O", "B-PER", "I-PER", "B-ORG", "I-ORG", "B-LOC", "I-LOC", "B-MISC", "I-MISC"]
FIRST = ["john", "maria", "peter", "anna", "kowalski", "yamamoto", "okonkwo", "svensson", "ibrahim", "delacroix"]
LAST = ["smith", "nakamura", "fitzgerald", "oyelaran", "brzezinski", "haverkamp", "mbeki", "lindqvist"]
ORGS = [["reuters"], ["united", "nations"], ["bayern", "munich"], ["european", "commission"], ["fifa"], ["nasdaq"]]
LOCS = [["paris"], ["new", "york"], ["zagreb"], ["buenos", "aires"], ["ouagadougou"], ["kyiv"], ["reykjavik"]]
MISC = [["german"], ["olympic"], ["english"], ["world", "cup"], ["brazilian"]]
VERBS = ["visited", "joined", "criticised", "praised", "left", "met officials of", "spoke about"]
TAILS = ["on monday", "last week", "after the match", "in a statement", "during the talks", "before the vote"]
TASK_NAME = "ner"
LABEL_ALL_TOKENS = False
PAD_TO_MAX_LENGTH = False
MAX_SEQ_LENGTH = None
TINY_BERT = dict(
    hidden_size=32,
    num_hidden_layers=2,
    num_attention_heads=4,
    intermediate_size=64,
    max_position_embeddings=512,
)


def _span(words, kind):
    return [(w, ("B-" if i == 0 else "I-") + kind) for i, w in enumerate(words)]


def _sentence(rng):
    person = [rng.choice(FIRST)] + ([rng.choice(LAST)] if rng.random() < 0.6 else [])
    spans = _span(person, "PER") + [(w, "O") for w in rng.choice(VERBS).split()]
    kind, words = rng.choice([("ORG", rng.choice(ORGS)), ("LOC", rng.choice(LOCS))])
    spans += [("the", "O")] if kind == "ORG" and rng.random() < 0.5 else []
    spans += _span(words, kind)
    if rng.random() < 0.4:
        spans += [("with", "O"), ("the", "O")] + _span(rng.choice(MISC), "MISC") + [("team", "O")]
    spans += [(w, "O") for w in rng.choice(TAILS).split()] + [(".", "O")]
    return [w for w, _ in spans], [LABEL_NAMES.index(t) for _, t in spans]


def raw_datasets():
    """conll2003's layout: id, tokens, pos_tags, chunk_tags, ner_tags (Sequence(ClassLabel))."""
    from datasets import ClassLabel, Dataset, DatasetDict, Features, Sequence, Value

    features = Features(
        {
            "id": Value("string"),
            "tokens": Sequence(Value("string")),
            "pos_tags": Sequence(Value("int32")),
            "chunk_tags": Sequence(Value("int32")),
            "ner_tags": Sequence(ClassLabel(names=LABEL_NAMES)),
        }
    )
    rng, seen, splits = random.Random(0), set(), {}
    for split, n in (("train", 200), ("validation", 40)):
        rows = {k: [] for k in features}
        while len(rows["id"]) < n:
            tokens, tags = _sentence(rng)
            if tuple(tokens) in seen:  # CoNLL's splits hold distinct sentences
                continue
            seen.add(tuple(tokens))
            rows["id"].append(str(len(rows["id"])))
            rows["tokens"].append(tokens)
            rows["pos_tags"].append([0] * len(tokens))
            rows["chunk_tags"].append([0] * len(tokens))
            rows["ner_tags"].append(tags)
        splits[split] = Dataset.from_dict(rows, features=features)
    return DatasetDict(splits)


def pretrained_checkpoint(path):
    """Stands in for google-bert/bert-base-uncased: a pretraining checkpoint (no token-classification head)."""
    from transformers import BertConfig, BertForPreTraining

    names = FIRST + LAST + [w for span in ORGS + LOCS + MISC for w in span]
    corpus = rc_text.documents(300, seed=7) + [" ".join(VERBS + TAILS + ["with the team"])] * 20 + names * 2
    tok = rc_text.bert_like_tokenizer(path, corpus=corpus, vocab_size=500)
    BertForPreTraining(BertConfig(vocab_size=len(tok), pad_token_id=tok.pad_token_id, **TINY_BERT)).save_pretrained(
        str(path)
    )
    return str(path)


def _entities(tags):
    """seqeval's default (IOB2, not strict) chunks: (type, start, end); an I- after O or another type starts one."""
    out, start, kind = set(), None, None
    for i, tag in enumerate(list(tags) + ["O"]):
        prefix, _, typ = tag.partition("-")
        if kind is not None and (prefix != "I" or typ != kind):
            out.add((kind, start, i))
            kind = None
        if prefix == "B" or (prefix == "I" and kind is None):
            start, kind = i, typ
    return out


def seqeval(predictions, references):
    pred = set().union(*[{(s,) + e for e in _entities(p)} for s, p in enumerate(predictions)])
    true = set().union(*[{(s,) + e for e in _entities(r)} for s, r in enumerate(references)])
    hit = len(pred & true)
    precision = hit / len(pred) if pred else 0.0
    recall = hit / len(true) if true else 0.0
    f1 = 2 * precision * recall / (precision + recall) if hit else 0.0
    flat_p = [t for p in predictions for t in p]
    flat_r = [t for r in references for t in r]
    accuracy = sum(a == b for a, b in zip(flat_p, flat_r)) / max(len(flat_r), 1)
    return {"overall_precision": precision, "overall_recall": recall, "overall_f1": f1, "overall_accuracy": accuracy}


def build_trainer(tmp_dir):
    from datasets import ClassLabel
    from transformers import (
        AutoConfig,
        AutoModelForTokenClassification,
        AutoTokenizer,
        DataCollatorForTokenClassification,
        PretrainedConfig,
        PreTrainedTokenizerFast,
        Trainer,
        TrainingArguments,
        set_seed,
    )

    model_name_or_path = pretrained_checkpoint(tmp_dir / "bert-base-uncased")
    training_args = TrainingArguments(
        output_dir=str(tmp_dir / "test-ner"),
        do_train=True,
        do_eval=True,
        use_cpu=True,
        report_to="none",
        disable_tqdm=True,
    )
    set_seed(training_args.seed)
    raw = raw_datasets()
    column_names, features = raw["train"].column_names, raw["train"].features
    text_column_name = "tokens" if "tokens" in column_names else column_names[0]
    label_column_name = f"{TASK_NAME}_tags" if f"{TASK_NAME}_tags" in column_names else column_names[1]

    labels_are_int = isinstance(features[label_column_name].feature, ClassLabel)
    if labels_are_int:
        label_list = features[label_column_name].feature.names
        label_to_id = {i: i for i in range(len(label_list))}
    else:
        label_list = sorted(set().union(*map(set, raw["train"][label_column_name])))
        label_to_id = {lab: i for i, lab in enumerate(label_list)}
    num_labels = len(label_list)

    config = AutoConfig.from_pretrained(model_name_or_path, num_labels=num_labels, finetuning_task=TASK_NAME)
    tokenizer = AutoTokenizer.from_pretrained(model_name_or_path, use_fast=True)  # bert: no add_prefix_space
    model = AutoModelForTokenClassification.from_pretrained(model_name_or_path, config=config)
    if not isinstance(tokenizer, PreTrainedTokenizerFast):
        raise ValueError("This example script only works for models that have a fast tokenizer.")

    if model.config.label2id != PretrainedConfig(num_labels=num_labels).label2id:
        if sorted(model.config.label2id) == sorted(label_list):
            if labels_are_int:
                label_to_id = {i: int(model.config.label2id[lab]) for i, lab in enumerate(label_list)}
                label_list = [model.config.id2label[i] for i in range(num_labels)]
            else:
                label_list = [model.config.id2label[i] for i in range(num_labels)]
                label_to_id = {lab: i for i, lab in enumerate(label_list)}
    model.config.label2id = {lab: i for i, lab in enumerate(label_list)}
    model.config.id2label = dict(enumerate(label_list))

    b_to_i_label = []
    for idx, label in enumerate(label_list):
        if label.startswith("B-") and label.replace("B-", "I-") in label_list:
            b_to_i_label.append(label_list.index(label.replace("B-", "I-")))
        else:
            b_to_i_label.append(idx)

    padding = "max_length" if PAD_TO_MAX_LENGTH else False

    def tokenize_and_align_labels(examples):
        tokenized_inputs = tokenizer(
            examples[text_column_name],
            padding=padding,
            truncation=True,
            max_length=MAX_SEQ_LENGTH,
            is_split_into_words=True,
        )
        labels = []
        for i, label in enumerate(examples[label_column_name]):
            previous_word_idx, label_ids = None, []
            for word_idx in tokenized_inputs.word_ids(batch_index=i):
                if word_idx is None:  # special tokens
                    label_ids.append(-100)
                elif word_idx != previous_word_idx:  # the first sub-token of a word
                    label_ids.append(label_to_id[label[word_idx]])
                elif LABEL_ALL_TOKENS:
                    label_ids.append(b_to_i_label[label_to_id[label[word_idx]]])
                else:
                    label_ids.append(-100)
                previous_word_idx = word_idx
            labels.append(label_ids)
        tokenized_inputs["labels"] = labels
        return tokenized_inputs

    train_dataset = raw["train"].map(tokenize_and_align_labels, batched=True, desc="Running tokenizer on train dataset")
    eval_dataset = raw["validation"].map(
        tokenize_and_align_labels, batched=True, desc="Running tokenizer on validation dataset"
    )

    data_collator = DataCollatorForTokenClassification(tokenizer, pad_to_multiple_of=8 if training_args.fp16 else None)

    def compute_metrics(p):
        predictions, labels = p
        predictions = np.argmax(predictions, axis=2)
        true_predictions = [
            [label_list[p] for (p, lab) in zip(prediction, label) if lab != -100]
            for prediction, label in zip(predictions, labels)
        ]
        true_labels = [
            [label_list[lab] for (p, lab) in zip(prediction, label) if lab != -100]
            for prediction, label in zip(predictions, labels)
        ]
        results = seqeval(true_predictions, true_labels)
        return {
            "precision": results["overall_precision"],
            "recall": results["overall_recall"],
            "f1": results["overall_f1"],
            "accuracy": results["overall_accuracy"],
        }

    return Trainer(
        model=model,
        args=training_args,
        train_dataset=train_dataset,
        eval_dataset=eval_dataset,
        processing_class=tokenizer,
        data_collator=data_collator,
        compute_metrics=compute_metrics,
    )
