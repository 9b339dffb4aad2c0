"""A re-creation of huggingface/trl examples/scripts/reward_modeling.py (commit
f2cd57710ae345ea6428ae95363267fcf38a3dc8), run with trl 1.16.0's RewardTrainer (the installed package; its
trl/scripts/reward.py hands the same trainer a model path instead) as the script's "Full training" command runs it:

    python examples/scripts/reward_modeling.py --model_name_or_path Qwen/Qwen2-0.5B-Instruct \
        --dataset_name trl-lib/ultrafeedback_binarized --output_dir Qwen2-0.5B-Reward \
        --per_device_train_batch_size 8 --num_train_epochs 1 --learning_rate 1.0e-5 \
        --eval_strategy steps --eval_steps 50 --max_length 2048

Kept as the script has it: the model is AutoModelForSequenceClassification.from_pretrained(model_name_or_path,
num_labels=1, revision="main", use_cache=True (no gradient checkpointing), dtype=ModelConfig's default
float32) from a causal-LM checkpoint, so the one-output score head is newly initialised; no processing_class
(RewardTrainer loads the tokenizer from the model's path and sets the model's pad_token_id from it); no peft
config; train = dataset["train"], eval = dataset["test"]; every other RewardConfig field at its TRL 1.16
default (disable_dropout, center_rewards_coefficient None, DataCollatorForPreference padding right).

Shrunk / changed: Qwen2-0.5B-Instruct is the tiny Qwen2-Instruct stand-in of the other TRL projects
(rc_text.tiny_qwen2: Qwen2-Instruct's tokenizer layout and ChatML template, pad <|endoftext|> != eos
<|im_end|>), saved with save_pretrained; trl-lib/ultrafeedback_binarized is replaced by 64 + 16 generated
conversational preference rows in its implicit-prompt layout (chosen / rejected are whole conversations that
share the user turn; the correct answer is chosen, a wrong one rejected), distinct questions in the two
splits; CPU settings use_cpu=True, bf16=False, report_to="none", disable_tqdm=True."""


def save_checkpoint(directory):
    import rc_text

    tok = rc_text.qwen_chatml_tokenizer()
    model = rc_text.tiny_qwen2(tok)
    model.save_pretrained(str(directory))
    tok.save_pretrained(str(directory))
    return str(directory)


def implicit_preferences(n, seed, start):
    """ultrafeedback_binarized's layout: chosen / rejected as full conversations with the same user turn."""
    import rc_text

    rows = []
    for row in rc_text.preferences(n, seed=seed, start=start):
        rows.append({"chosen": row["prompt"] + row["chosen"], "rejected": row["prompt"] + row["rejected"]})
    return rows


def dataset():
    from datasets import Dataset, DatasetDict

    return DatasetDict(
        {
            "train": Dataset.from_list(implicit_preferences(64, seed=5, start=0)),
            "test": Dataset.from_list(implicit_preferences(16, seed=6, start=64)),
        }
    )


def build_trainer(tmp_dir):
    from transformers import AutoModelForSequenceClassification
    from trl import RewardConfig, RewardTrainer

    model_name_or_path = save_checkpoint(tmp_dir / "Qwen2-tiny-Instruct")
    training_args = RewardConfig(
        output_dir=str(tmp_dir / "Qwen2-0.5B-Reward"),
        per_device_train_batch_size=8,
        num_train_epochs=1,
        learning_rate=1.0e-5,
        eval_strategy="steps",
        eval_steps=50,
        max_length=2048,
        use_cpu=True,
        bf16=False,
        report_to="none",
        disable_tqdm=True,
    )
    model_kwargs = dict(revision="main", use_cache=False if training_args.gradient_checkpointing else True)
    import torch

    model_kwargs["dtype"] = torch.float32  # ModelConfig.dtype defaults to "float32"; the script getattr()s it
    model = AutoModelForSequenceClassification.from_pretrained(model_name_or_path, num_labels=1, **model_kwargs)
    data = dataset()
    return RewardTrainer(
        model=model,
        args=training_args,
        train_dataset=data["train"],
        eval_dataset=data["test"] if training_args.eval_strategy != "no" else None,
        peft_config=None,
    )
