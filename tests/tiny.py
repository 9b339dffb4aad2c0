"""Hermetic tiny real objects for the test suite: a byte-level BPE trained in-process, tiny causal LMs
built from configs, real collators and trainers. Nothing touches a hub. Imported by the tests and by
the throwaway user projects they write (pytester), which run in the same process."""

from __future__ import annotations

import functools
import os

os.environ.update(
    HF_HUB_OFFLINE="1",
    TRANSFORMERS_OFFLINE="1",
    HF_DATASETS_OFFLINE="1",
    HF_DATASETS_DISABLE_PROGRESS_BARS="1",
    TOKENIZERS_PARALLELISM="false",
    TRANSFORMERS_VERBOSITY="error",
)

EOS, PAD, BOS = "<|endoftext|>", "<|pad|>", "<|bos|>"
USER, ASSISTANT, SYSTEM, END = "<|user|>", "<|assistant|>", "<|system|>", "<|end|>"

CORPUS = [
    "the quick brown fox jumps over the lazy dog",
    "hello world, how are you today?",
    "what is 2+2? The answer is 4.",
    "Name a colour. Blue is a colour.",
    "once upon a time there was a tiny model that learned to stop",
    "a b c d e f g h i j k l m n o p q r s t u v w x y z 0 1 2 3 4 5 6 7 8 9",
] * 20

CHAT_TEMPLATE = (
    "{% for m in messages %}"
    "{% if m['role'] == 'user' %}<|user|>{{ m['content'] }}<|end|>"
    "{% elif m['role'] == 'system' %}<|system|>{{ m['content'] }}<|end|>"
    "{% else %}<|assistant|>{% generation %}{{ m['content'] }}<|end|>{% endgeneration %}{% endif %}"
    "{% endfor %}"
    "{% if add_generation_prompt %}<|assistant|>{% endif %}"
)

PROMPTS = ["what is 2+2?", "hello", "Name a colour.", "once upon a time", "the quick brown fox", "a b c"]
COMPLETIONS = [
    " The answer is 4.",
    " world, how are you today?",
    " Blue is a colour.",
    " there was a tiny model",
    " jumps over the lazy dog",
    " d e f g h",
]


@functools.cache
def _bpe():
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers

    tok = Tokenizer(models.BPE(unk_token=None))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    tok.post_processor = processors.ByteLevel(trim_offsets=False)
    tok.train_from_iterator(
        CORPUS,
        trainers.BpeTrainer(
            vocab_size=300,
            special_tokens=[EOS, PAD, BOS, USER, ASSISTANT, SYSTEM, END],
            initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
            show_progress=False,
        ),
    )
    return tok.to_str()


def tokenizer(pad: str | None = PAD, padding_side: str = "right", chat_template: str | None = CHAT_TEMPLATE):
    """A fresh real ``PreTrainedTokenizerFast`` (cheap: the BPE is trained once per process).
    ``pad=EOS`` gives the pad == eos configuration; ``pad=None`` none at all."""
    from tokenizers import Tokenizer
    from transformers import PreTrainedTokenizerFast

    tok = PreTrainedTokenizerFast(tokenizer_object=Tokenizer.from_str(_bpe()), eos_token=EOS, bos_token=BOS)
    tok.add_special_tokens({"additional_special_tokens": [USER, ASSISTANT, SYSTEM, END]})
    if pad is not None:
        tok.pad_token = pad
    tok.padding_side = padding_side
    tok.chat_template = chat_template
    return tok


def llama(tok, seed: int = 0, max_positions: int = 256, attn: str = "sdpa", **overrides):
    import torch
    from transformers import AutoModelForCausalLM, LlamaConfig

    cfg = LlamaConfig(
        vocab_size=len(tok),
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=max_positions,
        tie_word_embeddings=True,
        bos_token_id=tok.bos_token_id,
        eos_token_id=tok.eos_token_id,
        pad_token_id=tok.pad_token_id,
        **overrides,
    )
    torch.manual_seed(seed)
    return AutoModelForCausalLM.from_config(cfg, attn_implementation=attn)


def gpt2(tok, seed: int = 0, n_positions: int = 256, attn: str = "sdpa"):
    import torch
    from transformers import AutoModelForCausalLM, GPT2Config

    cfg = GPT2Config(
        vocab_size=len(tok),
        n_embd=64,
        n_layer=2,
        n_head=4,
        n_positions=n_positions,
        bos_token_id=tok.bos_token_id,
        eos_token_id=tok.eos_token_id,
        pad_token_id=tok.pad_token_id,
    )
    torch.manual_seed(seed)
    return AutoModelForCausalLM.from_config(cfg, attn_implementation=attn)


def texts(n: int = 12) -> list[str]:
    return [p + c for p, c in zip(PROMPTS * (n // len(PROMPTS) + 1), COMPLETIONS * (n // len(PROMPTS) + 1))][:n]


def tokenized(tok, n: int = 12, eos: bool = True) -> list[dict]:
    """Pre-tokenized examples ({input_ids, attention_mask}) with EOS appended, as ``Dataset.map`` makes."""
    return [tok(t + (tok.eos_token if eos else "")) for t in texts(n)]


def trainer_args(tmp_path, cls=None, **kw):
    """Common CPU-only, quiet, no-save arguments for transformers/TRL trainers."""
    from transformers import TrainingArguments

    cls = cls or TrainingArguments
    base = dict(
        output_dir=str(tmp_path),
        report_to="none",
        use_cpu=True,
        bf16=False,
        fp16=False,
        max_steps=2,
        per_device_train_batch_size=2,
        save_strategy="no",
        disable_tqdm=True,
        logging_steps=1,
    )
    if cls is not TrainingArguments:
        base["activation_checkpointing"] = False
    base.update(kw)
    return cls(**base)
