"""A re-creation of karpathy/nanoGPT train.py (commit 3adf61e154c3fe3fca428ad6bc3818b27a3b8291), run as the
README's CPU recipe runs it:

    python train.py config/train_shakespeare_char.py --device=cpu --compile=False --eval_iters=20 \
        --log_interval=1 --block_size=64 --batch_size=12 --n_layer=4 --n_head=4 --n_embd=128 \
        --max_iters=2000 --lr_decay_iters=2000 --dropout=0.0

What is kept as the script has it: get_batch's random-offset sampling (torch.randint over the token array,
y = x shifted by one), GPT.configure_optimizers' AdamW with decay / no-decay groups, get_lr's linear
warmup + cosine decay to min_lr written into every param group at the top of each iteration,
GradScaler(enabled=(dtype == 'float16')), gradient_accumulation_steps micro-steps with loss / accum,
scaler.unscale_ + clip_grad_norm_(grad_clip) before scaler.step, zero_grad(set_to_none=True), and the
checkpoint dict {'model', 'optimizer', 'model_args', 'iter_num', 'best_val_loss', 'config'} written with
torch.save to out_dir/ckpt.pt and resumed as init_from='resume' does (model_args forced from the
checkpoint, the '_orig_mod.' prefix stripped, optimizer state loaded, iter_num/best_val_loss restored).

Shrunk / changed: block_size 64 -> 32, n_layer 4 -> 2, n_embd 128 -> 32; gradient_accumulation_steps
1 -> 4 (the train.py default is 40; kept > 1 so the accumulation path runs); dtype 'float32' (what a CPU
run gets: the scaler is then a no-op, enabled=False); the data is a few KB of Shakespeare encoded like
prepare.py (rc_nanogpt_data.py) instead of the 1 MB tiny-shakespeare download; get_batch is wrapped as an
endless IterableDataset yielding (X, Y) so a DataLoader(batch_size=None) hands the batches over; no
wandb, no DDP, no MFU logging, no torch.manual_seed(1337) (dlcheck seeds each fresh run itself)."""

import math
import os

import numpy as np
import rc_nanogpt_data as data
import torch
from rc_nanogpt_model import GPT, GPTConfig
from torch.utils.data import DataLoader, IterableDataset

# -----------------------------------------------------------------------------
# train.py defaults, overridden by config/train_shakespeare_char.py and the README's CPU flags
out_dir = "out-shakespeare-char"
eval_interval = 250
log_interval = 1
eval_iters = 20
eval_only = False
always_save_checkpoint = False
init_from = "scratch"
dataset = "shakespeare_char"
gradient_accumulation_steps = 4
batch_size = 12
block_size = 32
n_layer = 2
n_head = 4
n_embd = 32
dropout = 0.0
bias = False
learning_rate = 1e-3
max_iters = 2000
weight_decay = 1e-1
beta1 = 0.9
beta2 = 0.99
grad_clip = 1.0
decay_lr = True
warmup_iters = 100
lr_decay_iters = 2000
min_lr = 1e-4
device = "cpu"
dtype = "float32"
compile = False
config = {k: v for k, v in dict(globals()).items() if not k.startswith("_") and isinstance(v, (int, float, bool, str))}
# -----------------------------------------------------------------------------
device_type = "cuda" if "cuda" in device else "cpu"
meta_vocab_size = data.meta["vocab_size"]


class GetBatch(IterableDataset):
    """get_batch(split), endlessly: batch_size random offsets into the split's token array."""

    def __init__(self, split):
        self.split = split

    def __iter__(self):
        arr = data.train_ids if self.split == "train" else data.val_ids  # np.memmap of train.bin / val.bin upstream
        while True:
            ix = torch.randint(len(arr) - block_size, (batch_size,))
            x = torch.stack([torch.from_numpy((arr[i : i + block_size]).astype(np.int64)) for i in ix])
            y = torch.stack([torch.from_numpy((arr[i + 1 : i + 1 + block_size]).astype(np.int64)) for i in ix])
            yield x.to(device), y.to(device)


def loader(split):
    return DataLoader(GetBatch(split), batch_size=None)


def get_lr(it):
    """Linear warmup for warmup_iters, cosine decay to min_lr at lr_decay_iters, min_lr after."""
    if it < warmup_iters:
        return learning_rate * (it + 1) / (warmup_iters + 1)
    if it > lr_decay_iters:
        return min_lr
    decay_ratio = (it - warmup_iters) / (lr_decay_iters - warmup_iters)
    assert 0 <= decay_ratio <= 1
    coeff = 0.5 * (1.0 + math.cos(math.pi * decay_ratio))
    return min_lr + coeff * (learning_rate - min_lr)


def make_training():
    """The objects train.py builds for init_from='scratch'."""
    model_args = dict(
        n_layer=n_layer,
        n_head=n_head,
        n_embd=n_embd,
        block_size=block_size,
        bias=bias,
        vocab_size=meta_vocab_size if meta_vocab_size is not None else 50304,
        dropout=dropout,
    )
    model = GPT(GPTConfig(**model_args)).to(device)
    scaler = torch.amp.GradScaler("cuda", enabled=(dtype == "float16"))
    optimizer = model.configure_optimizers(weight_decay, learning_rate, (beta1, beta2), device_type)
    return {
        "model": model,
        "optimizer": optimizer,
        "scaler": scaler,
        "iter_num": 0,
        "best_val_loss": 1e9,
        "model_args": model_args,
        "config": dict(config),
    }


def compute_loss(model, batch):
    X, Y = batch
    _, loss = model(X, Y)
    return loss


def train_step(state, batch, index):
    """One micro-step of the `while True` loop: the LR is set at the first micro-step of an iteration, the
    optimizer steps (after unscale + clip) at the last one, and iter_num counts iterations."""
    model, optimizer, scaler = state["model"], state["optimizer"], state["scaler"]
    micro_step = index % gradient_accumulation_steps
    if micro_step == 0:
        lr = get_lr(state["iter_num"]) if decay_lr else learning_rate
        for param_group in optimizer.param_groups:
            param_group["lr"] = lr
    X, Y = batch
    _, loss = model(X, Y)
    loss = loss / gradient_accumulation_steps
    scaler.scale(loss).backward()
    if micro_step == gradient_accumulation_steps - 1:
        if grad_clip != 0.0:
            scaler.unscale_(optimizer)
            torch.nn.utils.clip_grad_norm_(model.parameters(), grad_clip)
        scaler.step(optimizer)
        scaler.update()
        optimizer.zero_grad(set_to_none=True)
        state["iter_num"] += 1
    return loss.item() * gradient_accumulation_steps  # lossf, as logged


@torch.no_grad()
def estimate_loss(model):
    out = {}
    model.eval()
    for split in ["train", "val"]:
        losses = torch.zeros(eval_iters)
        it = iter(GetBatch(split))
        for k in range(eval_iters):
            X, Y = next(it)
            _, loss = model(X, Y)
            losses[k] = loss.item()
        out[split] = losses.mean()
    model.train()
    return out


def save_checkpoint(state, path):
    """What the loop does at an eval_interval when val improved: torch.save of the checkpoint dict onto
    out_dir/ckpt.pt (``path`` plays out_dir)."""
    raw_model = state["model"]  # model.module under DDP; the compiled model itself when compile=True
    checkpoint = {
        "model": raw_model.state_dict(),
        "optimizer": state["optimizer"].state_dict(),
        "model_args": state["model_args"],
        "iter_num": state["iter_num"],
        "best_val_loss": state["best_val_loss"],
        "config": state["config"],
    }
    os.makedirs(path, exist_ok=True)
    torch.save(checkpoint, os.path.join(path, "ckpt.pt"))


def load_checkpoint(state, path):
    """init_from='resume': the state's objects are the ones train.py builds before loading."""
    checkpoint = torch.load(os.path.join(path, "ckpt.pt"), map_location=device)
    checkpoint_model_args = checkpoint["model_args"]
    for k in ["n_layer", "n_head", "n_embd", "block_size", "bias", "vocab_size"]:
        state["model_args"][k] = checkpoint_model_args[k]
    assert GPTConfig(**state["model_args"]) == state["model"].config, "resume with other model args"
    state_dict = checkpoint["model"]
    unwanted_prefix = "_orig_mod."
    for k, v in list(state_dict.items()):  # noqa: B007 - as train.py writes it
        if k.startswith(unwanted_prefix):
            state_dict[k[len(unwanted_prefix) :]] = state_dict.pop(k)
    state["model"].load_state_dict(state_dict)
    state["iter_num"] = checkpoint["iter_num"]
    state["best_val_loss"] = checkpoint["best_val_loss"]
    state["optimizer"].load_state_dict(checkpoint["optimizer"])
