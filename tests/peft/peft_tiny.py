"""Tiny real PEFT set-ups for the tests in tests/peft (and the throwaway user projects they write): LoRA
configurations, tiny Llama / Qwen2 models from configs, tokenizers with tokens added after the model was
built, and a hand-written model that checkpoints its blocks itself."""

from __future__ import annotations

import tiny
import torch
from torch import nn
from torch.utils.checkpoint import checkpoint

NEW_TOKENS = ["<|tool|>", "<|/tool|>"]


def lora(**kw):
    from peft import LoraConfig

    base = dict(r=4, lora_alpha=8, target_modules=["q_proj", "v_proj"], task_type="CAUSAL_LM")
    base.update(kw)
    return LoraConfig(**base)


def qwen2(tok, seed: int = 0, tie: bool = False, layers: int = 2):
    """A tiny Qwen2 (untied lm_head by default, as Qwen2-7B ships)."""
    from transformers import AutoModelForCausalLM, Qwen2Config

    cfg = Qwen2Config(
        vocab_size=len(tok),
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=layers,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=256,
        tie_word_embeddings=tie,
        bos_token_id=tok.bos_token_id,
        eos_token_id=tok.eos_token_id,
        pad_token_id=tok.pad_token_id,
    )
    torch.manual_seed(seed)
    return AutoModelForCausalLM.from_config(cfg, attn_implementation="sdpa")


def bloom(tok, seed: int = 0):
    """A tiny BLOOM (ALiBi: it places tokens by the attention mask, with no position embeddings)."""
    from transformers import BloomConfig, BloomForCausalLM

    cfg = BloomConfig(
        vocab_size=len(tok),
        hidden_size=64,
        n_layer=2,
        n_head=4,
        bos_token_id=tok.bos_token_id,
        eos_token_id=tok.eos_token_id,
        pad_token_id=tok.pad_token_id,
    )
    torch.manual_seed(seed)
    return BloomForCausalLM(cfg)


def prompt_tuned(model, tokens: int = 8, seed: int = 0):
    """``get_peft_model`` with a PromptTuningConfig (random init): its forward prepends ``tokens`` learned virtual
    token embeddings, so its logits have ``tokens`` more positions than input_ids."""
    from peft import PromptTuningConfig, get_peft_model

    torch.manual_seed(seed)
    return get_peft_model(model, PromptTuningConfig(task_type="CAUSAL_LM", num_virtual_tokens=tokens))


def tool_tokenizer(tokens=NEW_TOKENS, pad: str | None = tiny.PAD):
    """The tiny tokenizer with special tokens added after the model was pretrained (ids 300, 301, …)."""
    tok = tiny.tokenizer(pad=pad)
    tok.add_special_tokens({"additional_special_tokens": list(tokens)}, replace_extra_special_tokens=False)
    return tok


def pretrained(tok, arch: str = "llama", **kw):
    """A tiny model "pretrained" on the base vocabulary (the tokenizer before tokens were added), then
    ``resize_token_embeddings(len(tok))`` as a fine-tuning script does: transformers sets the new rows to the mean
    of the old ones."""
    base_tok = tiny.tokenizer()
    model = tiny.llama(base_tok, **kw) if arch == "llama" else qwen2(base_tok, **kw)
    model.resize_token_embeddings(len(tok))
    return model


def tool_texts(n: int = 12) -> list[str]:
    """Training texts that use the added tokens (a tool call wrapped in <|tool|> … <|/tool|>)."""
    return [f"{t} {NEW_TOKENS[0]}calc(2+2){NEW_TOKENS[1]}" for t in tiny.texts(n)]


def tool_loader(tok, n: int = 12, batch_size: int = 4):
    from torch.utils.data import DataLoader
    from transformers import DataCollatorForLanguageModeling

    rows = [tok(t + tok.eos_token) for t in tool_texts(n)]
    return DataLoader(rows, batch_size=batch_size, collate_fn=DataCollatorForLanguageModeling(tok, mlm=False))


class Block(nn.Module):
    def __init__(self, width: int):
        super().__init__()
        self.proj = nn.Linear(width, width)
        self.out = nn.Linear(width, width)

    def forward(self, h):
        return h + self.out(torch.tanh(self.proj(h)))


class CheckpointedNet(nn.Module):
    """A hand-written classifier over token ids that checkpoints each block itself (``use_reentrant``
    as given); its embedding is frozen, as a LoRA fine-tune leaves it."""

    def __init__(self, reentrant: bool = True, vocab: int = 200, width: int = 16, classes: int = 4):
        super().__init__()
        self.reentrant = reentrant
        self.embed = nn.Embedding(vocab, width)
        self.blocks = nn.ModuleList(Block(width) for _ in range(2))
        self.head = nn.Linear(width, classes)

    def forward(self, ids):
        h = self.embed(ids)
        for block in self.blocks:
            h = checkpoint(block, h, use_reentrant=self.reentrant)
        return self.head(h.mean(1))
