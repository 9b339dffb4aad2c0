"""A tiny but real classification project, trained in a second on CPU: Gaussian blobs, an MLP, AdamW
with a warmup, gradient accumulation, checkpoints. Stands in for your own training code."""

import os

import torch
from torch import nn
from torch.nn import functional as F
from torch.utils.data import DataLoader, Subset, TensorDataset

ACCUMULATION = 2


def blobs(n: int = 96, seed: int = 0) -> TensorDataset:
    centres = torch.randn(4, 8, generator=torch.Generator().manual_seed(123)) * 3
    g = torch.Generator().manual_seed(seed)
    y = torch.randint(0, 4, (n,), generator=g)
    return TensorDataset(centres[y] + torch.randn(n, 8, generator=g), y)


class MLP(nn.Module):
    def __init__(self, classes: int = 4):
        super().__init__()
        self.body = nn.Sequential(nn.Linear(8, 32), nn.ReLU())
        self.head = nn.Linear(32, classes)

    def forward(self, x):
        return self.head(self.body(x))


def warmup(steps: int):
    return lambda step: min(1.0, (step + 1) / steps)


def train_loader(data: TensorDataset) -> DataLoader:
    return DataLoader(data, batch_size=8, shuffle=True, generator=torch.Generator().manual_seed(0))


def eval_loader(data: TensorDataset) -> DataLoader:
    return DataLoader(data, batch_size=16)


def save_checkpoint(state, path):
    """Everything a resume needs, written to a temporary file and renamed (atomic)."""
    tmp = f"{path}.tmp"
    torch.save(
        {
            "model": state["model"].state_dict(),
            "optimizer": state["optimizer"].state_dict(),
            "lr_scheduler": state["lr_scheduler"].state_dict(),
            "rng": torch.random.get_rng_state(),
        },
        tmp,
    )
    os.replace(tmp, path)


def load_checkpoint(state, path):
    ckpt = torch.load(path, weights_only=False)
    state["model"].load_state_dict(ckpt["model"])
    state["optimizer"].load_state_dict(ckpt["optimizer"])
    state["lr_scheduler"].load_state_dict(ckpt["lr_scheduler"])
    torch.random.set_rng_state(ckpt["rng"])


def train_step(state, batch, index):
    """One micro-batch of the loop: accumulate, then step the optimizer and the scheduler together."""
    x, y = batch
    loss = F.cross_entropy(state["model"](x), y)
    (loss / ACCUMULATION).backward()
    if (index + 1) % ACCUMULATION == 0:
        state["optimizer"].step()
        state["lr_scheduler"].step()
        state["optimizer"].zero_grad()
    return loss


class HFClassifier(nn.Module):
    """The MLP as a transformers Trainer takes a custom model: keyword inputs, a dict with the loss."""

    def __init__(self):
        super().__init__()
        self.mlp = MLP()

    def forward(self, x, labels=None):
        logits = self.mlp(x)
        return {"loss": F.cross_entropy(logits, labels), "logits": logits} if labels is not None else {"logits": logits}


def records(data: TensorDataset) -> list[dict]:
    return [{"x": x, "labels": int(y)} for x, y in zip(*data.tensors)]


def held_out(data: TensorDataset, n: int) -> Subset:
    return Subset(data, range(n))
