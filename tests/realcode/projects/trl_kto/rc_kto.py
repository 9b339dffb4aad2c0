"""A re-creation of huggingface/trl examples/scripts/kto.py (commit f2cd57710ae345ea6428ae95363267fcf38a3dc8), run
with trl 1.16.0's KTOTrainer (the installed package) as the script's first ("full training") command runs it:

    python trl/scripts/kto.py --dataset_name trl-lib/kto-mix-14k \
        --model_name_or_path trl-lib/qwen1.5-1.8b-sft --per_device_train_batch_size 16 \
        --num_train_epochs 1 --learning_rate 5e-7 --lr_scheduler_type cosine \
        --gradient_accumulation_steps 1 --eval_steps 500 --output_dir kto-aligned-model \
        --warmup_steps 0.1 --logging_first_step

Kept as the script has it: the policy and the reference model are two AutoModelForCausalLM.from_pretrained
loads of the same checkpoint (the reference handed to KTOTrainer as ref_model); the tokenizer is
AutoTokenizer.from_pretrained with the "pad_token = eos_token when there is none" fallback; no peft config;
train = dataset["train"]; no eval_strategy on the command line, so eval_strategy="no" and eval_dataset=None
(--eval_steps alone schedules nothing); every other KTOConfig field at its TRL 1.16 default (beta 0.1,
loss_type "kto", desirable/undesirable weights 1.0, max_length 1024, sequential sampling for the KL term).

Shrunk / changed: trl-lib/qwen1.5-1.8b-sft (a ChatML SFT model) is the tiny Qwen2-Instruct stand-in of the other
TRL projects (rc_text.tiny_qwen2: ChatML template, pad <|endoftext|> != eos <|im_end|>, so the pad fallback is
not taken), saved with save_pretrained; trl-lib/kto-mix-14k is replaced by 96 generated conversational
unpaired-preference rows in its layout (prompt = [user turn], completion = [assistant turn], label True for
the correct answer, False for a wrong one; half of each, shuffled, each question once); CPU settings
use_cpu=True, bf16=False, report_to="none", disable_tqdm=True."""

import random


def save_checkpoint(directory):
    import rc_text

    tok = rc_text.qwen_chatml_tokenizer()
    model = rc_text.tiny_qwen2(tok)
    model.save_pretrained(str(directory))
    tok.save_pretrained(str(directory))
    return str(directory)


def unpaired_preferences(n, seed):
    """kto-mix-14k's layout: conversational prompt / completion and a boolean label."""
    import rc_text

    rng = random.Random(seed)
    rows = []
    for i in range(n):
        q, a = rc_text.question(i)
        desirable = i % 2 == 0
        answer = a if desirable else rng.choice(rc_text.WRONG)
        rows.append(
            {
                "prompt": [{"role": "user", "content": q}],
                "completion": [{"role": "assistant", "content": answer}],
                "label": desirable,
            }
        )
    rng.shuffle(rows)
    return rows


def dataset():
    from datasets import Dataset, DatasetDict

    return DatasetDict(
        {
            "train": Dataset.from_list(unpaired_preferences(96, seed=3)),
            "test": Dataset.from_list(unpaired_preferences(16, seed=4)),
        }
    )


def build_trainer(tmp_dir):
    from transformers import AutoModelForCausalLM, AutoTokenizer
    from trl import KTOConfig, KTOTrainer

    model_name_or_path = save_checkpoint(tmp_dir / "qwen-tiny-sft")
    training_args = KTOConfig(
        output_dir=str(tmp_dir / "kto-aligned-model"),
        per_device_train_batch_size=16,
        num_train_epochs=1,
        learning_rate=5e-7,
        lr_scheduler_type="cosine",
        gradient_accumulation_steps=1,
        eval_steps=500,
        warmup_steps=0.1,
        logging_first_step=True,
        use_cpu=True,
        bf16=False,
        report_to="none",
        disable_tqdm=True,
    )
    model = AutoModelForCausalLM.from_pretrained(model_name_or_path)
    ref_model = AutoModelForCausalLM.from_pretrained(model_name_or_path)
    tokenizer = AutoTokenizer.from_pretrained(model_name_or_path)
    if tokenizer.pad_token is None:
        tokenizer.pad_token = tokenizer.eos_token
    data = dataset()
    return KTOTrainer(
        model,
        ref_model,
        args=training_args,
        train_dataset=data["train"],
        eval_dataset=data["test"] if training_args.eval_strategy != "no" else None,
        processing_class=tokenizer,
        peft_config=None,
    )
