"""A tiny but real SFT project, built offline in a second: a byte-level BPE tokenizer trained in-process,
a 2-layer Llama from a config, and prompt/completion data. Stands in for your own project."""

import os

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
os.environ.setdefault("HF_DATASETS_DISABLE_PROGRESS_BARS", "1")

PAIRS = [
    ("What is 2+2?", " The answer is 4."),
    ("Name a colour.", " Blue is a colour."),
    ("Say hello.", " Hello, world!"),
    ("What do cats say?", " Cats say meow."),
    ("Count to three.", " One, two, three."),
    ("What is the capital of France?", " Paris is the capital of France."),
    ("Spell dog.", " D, O, G."),
    ("Is ice cold?", " Yes, ice is cold."),
]


def build_tokenizer(pad_token="<|pad|>"):
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers
    from transformers import PreTrainedTokenizerFast

    bpe = Tokenizer(models.BPE())
    bpe.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    bpe.decoder = decoders.ByteLevel()
    bpe.post_processor = processors.ByteLevel(trim_offsets=False)
    corpus = [p + c for p, c in PAIRS] * 10
    bpe.train_from_iterator(
        corpus,
        trainers.BpeTrainer(
            vocab_size=320,
            special_tokens=["<|endoftext|>", "<|pad|>"],
            initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
            show_progress=False,
        ),
    )
    tok = PreTrainedTokenizerFast(tokenizer_object=bpe, eos_token="<|endoftext|>")
    tok.pad_token = pad_token
    return tok


def build_model(tok):
    import torch
    from transformers import AutoModelForCausalLM, LlamaConfig

    torch.manual_seed(0)
    config = LlamaConfig(
        vocab_size=len(tok),
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=128,
        eos_token_id=tok.eos_token_id,
        pad_token_id=tok.pad_token_id,
    )
    return AutoModelForCausalLM.from_config(config)


def prompt_completion_dataset():
    from datasets import Dataset

    return Dataset.from_dict({"prompt": [p for p, _ in PAIRS], "completion": [c for _, c in PAIRS]})


def common_args(output_dir):
    return dict(
        output_dir=str(output_dir),
        report_to="none",
        use_cpu=True,
        bf16=False,
        fp16=False,
        max_steps=10,
        per_device_train_batch_size=4,
        save_strategy="no",
        disable_tqdm=True,
    )
