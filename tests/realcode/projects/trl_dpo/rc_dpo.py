"""A re-creation of huggingface/trl trl/scripts/dpo.py as shipped in trl 1.16.0 (the installed package), run as
its docstring's "Full training" command runs it:

    python trl/scripts/dpo.py --dataset_name trl-lib/ultrafeedback_binarized \
        --model_name_or_path Qwen/Qwen2-0.5B-Instruct --learning_rate 5.0e-7 --num_train_epochs 1 \
        --per_device_train_batch_size 2 --max_steps 1000 --gradient_accumulation_steps 8 \
        --eval_strategy steps --eval_steps 50 --output_dir Qwen2-0.5B-DPO --no_remove_unused_columns

Kept as the script has it: the policy is handed to DPOTrainer as a *path* (model_name_or_path) with
training_args.model_init_kwargs = {revision, trust_remote_code, attn_implementation, dtype} from ModelConfig's
defaults; no ref_model and no peft_config, so DPOTrainer builds the reference itself, as TRL does, by
loading a second copy from the same path (get_config_model_id(model.config)); no processing_class (loaded
from the path); train = dataset["train"], eval = dataset["test"]; every other DPOConfig field at its TRL
1.16 default (beta 0.1, loss_type sigmoid, max_length 1024, disable_dropout, ...).

Shrunk / changed: the checkpoint is the same tiny Qwen2-Instruct stand-in as the SFT projects (rc_text.tiny_qwen2,
Qwen2-Instruct's tokenizer layout and ChatML template) saved with save_pretrained; the data is 64 + 8
generated preference rows with an explicit conversational prompt (rc_text.preferences) instead of
trl-lib/ultrafeedback_binarized; CPU settings use_cpu=True, bf16=False, report_to="none", disable_tqdm=True."""


def save_checkpoint(directory):
    import rc_text

    tok = rc_text.qwen_chatml_tokenizer()
    model = rc_text.tiny_qwen2(tok)
    model.save_pretrained(str(directory))
    tok.save_pretrained(str(directory))
    return str(directory)


def dataset():
    import rc_text
    from datasets import Dataset, DatasetDict

    return DatasetDict(
        {
            "train": Dataset.from_list(rc_text.preferences(64, seed=5)),
            "test": Dataset.from_list(rc_text.preferences(8, seed=6, start=64)),
        }
    )


def build_trainer(tmp_dir):
    from trl import DPOConfig, DPOTrainer

    model_name_or_path = save_checkpoint(tmp_dir / "Qwen2-tiny-Instruct")
    training_args = DPOConfig(
        output_dir=str(tmp_dir / "Qwen2-0.5B-DPO"),
        learning_rate=5.0e-7,
        num_train_epochs=1,
        per_device_train_batch_size=2,
        max_steps=1000,
        gradient_accumulation_steps=8,
        eval_strategy="steps",
        eval_steps=50,
        remove_unused_columns=False,
        use_cpu=True,
        bf16=False,
        report_to="none",
        disable_tqdm=True,
    )
    model_init_kwargs = dict(
        revision="main", trust_remote_code=training_args.trust_remote_code, attn_implementation=None, dtype="float32"
    )
    if training_args.model_init_kwargs is not None:
        model_init_kwargs.update(training_args.model_init_kwargs)
    training_args.model_init_kwargs = model_init_kwargs
    data = dataset()
    return DPOTrainer(
        model=model_name_or_path,
        args=training_args,
        train_dataset=data["train"],
        eval_dataset=data["test"] if training_args.eval_strategy != "no" else None,
        quantization_config=None,
        peft_config=None,
    )
