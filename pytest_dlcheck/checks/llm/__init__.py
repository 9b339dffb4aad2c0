"""Checks of causal-LM data and training (SFT, DPO, GRPO, pretraining)."""
