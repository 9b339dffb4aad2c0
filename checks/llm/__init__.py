"""Checks of causal-LM data and training (SFT, DPO, GRPO, pretraining)."""

from ...roles import role

role(
    "generation_prompts",
    "prompts your pipeline generates from in batches, for L1's generation half: a list of prompt strings "
    "(tokenized with dlcheck_tokenizer as configured, its padding_side included) or the padded batch your code "
    "feeds to generate (a dict/BatchEncoding with input_ids and attention_mask)",
    "a TRL GRPOTrainer/RLOOTrainer as dlcheck_trainer",
)
