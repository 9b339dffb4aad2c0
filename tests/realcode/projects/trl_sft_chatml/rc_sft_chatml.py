"""A re-creation of huggingface/trl trl/scripts/sft.py as shipped in trl 1.16.0 (the installed package; HEAD of
the repository, f2cd57710ae345ea6428ae95363267fcf38a3dc8, has the same main()), run as its docstring's "Full
training" command runs it, on a Qwen2-Instruct-style model:

    python trl/scripts/sft.py --model_name_or_path Qwen/Qwen2-0.5B --dataset_name trl-lib/Capybara \
        --learning_rate 2.0e-5 --num_train_epochs 1 --packing --per_device_train_batch_size 2 \
        --gradient_accumulation_steps 8 --eos_token '<|im_end|>' --eval_strategy steps --eval_steps 100 \
        --output_dir Qwen2-0.5B-SFT

Kept as the script has it: the model is handed to SFTTrainer as a *path* (model_name_or_path) with
training_args.model_init_kwargs = {revision, trust_remote_code, attn_implementation, dtype} from ModelConfig's
defaults ("main", False, None, "float32"); no processing_class (SFTTrainer loads the tokenizer from the same
path); train_dataset = dataset["train"], eval_dataset = dataset["test"] since eval_strategy != "no"; no
peft / quantization config; every other SFTConfig field at its TRL 1.16 default — in particular
assistant_only_loss=False and completion_only_loss=None, so a "messages" dataset is trained on the whole
rendered conversation (system and user turns included), max_length=1024, packing_strategy "bfd",
gradient checkpointing on.

Shrunk / changed: the checkpoint is a tiny Qwen2ForCausalLM (rc_text.tiny_qwen2: hidden 32, 2 layers) saved
with save_pretrained next to a tokenizer with Qwen2-Instruct's layout (eos <|im_end|>, pad <|endoftext|>,
ChatML template; generation_config.eos_token_id = [<|im_end|>, <|endoftext|>]) trained here instead of
Qwen/Qwen2-0.5B; the dataset is 48 + 8 generated chats in the messages format (rc_text.conversations)
instead of trl-lib/Capybara; CPU settings use_cpu=True, bf16=False (SFTConfig defaults to bf16=True),
report_to="none", disable_tqdm=True. Variant: PACKING=False (the command without --packing)."""

PACKING = False


def save_checkpoint(directory):
    """What Qwen/Qwen2-0.5B-Instruct holds, in small: config, weights, generation_config and tokenizer."""
    import rc_text

    tok = rc_text.qwen_chatml_tokenizer()
    model = rc_text.tiny_qwen2(tok)
    model.save_pretrained(str(directory))
    tok.save_pretrained(str(directory))
    return str(directory)


def dataset():
    import rc_text
    from datasets import Dataset, DatasetDict

    chats = rc_text.conversations(56, seed=3)
    return DatasetDict(
        {"train": Dataset.from_dict({"messages": chats[:48]}), "test": Dataset.from_dict({"messages": chats[48:]})}
    )


def build_trainer(tmp_dir):
    from trl import SFTConfig, SFTTrainer

    model_name_or_path = save_checkpoint(tmp_dir / "Qwen2-tiny-Instruct")
    training_args = SFTConfig(
        output_dir=str(tmp_dir / "Qwen2-0.5B-SFT"),
        learning_rate=2.0e-5,
        num_train_epochs=1,
        packing=PACKING,
        per_device_train_batch_size=2,
        gradient_accumulation_steps=8,
        eos_token="<|im_end|>",
        eval_strategy="steps",
        eval_steps=100,
        use_cpu=True,
        bf16=False,
        report_to="none",
        disable_tqdm=True,
    )
    # main(): ModelConfig defaults
    model_init_kwargs = dict(
        revision="main", trust_remote_code=training_args.trust_remote_code, attn_implementation=None, dtype="float32"
    )
    if training_args.model_init_kwargs is not None:
        model_init_kwargs.update(training_args.model_init_kwargs)
    training_args.model_init_kwargs = model_init_kwargs
    data = dataset()
    return SFTTrainer(
        model=model_name_or_path,
        args=training_args,
        train_dataset=data["train"],
        eval_dataset=data["test"] if training_args.eval_strategy != "no" else None,
        quantization_config=None,
        peft_config=None,
    )
