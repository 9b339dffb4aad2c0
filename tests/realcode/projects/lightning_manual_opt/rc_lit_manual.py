"""Re-creation of Lightning's "Manual Optimization" guide (docs/source-pytorch/model/manual_optimization.rst,
pytorch-lightning commit 7f0c3436): ``self.automatic_optimization = False`` in ``__init__``; in
``training_step`` ``opt = self.optimizers()``, the loss scaled by 1/N, ``self.manual_backward(loss)``,
and every N batches ``opt.step()``, ``opt.zero_grad()`` and the scheduler from ``self.lr_schedulers()``
stepped ("step every N batches"); ``configure_optimizers`` returns ``[optimizer], [scheduler]`` (Adam
1e-3, StepLR(step_size=10, gamma=0.1)) exactly as the guide's scheduler example. Like the guide's
examples, training_step returns nothing (it logs the loss).

Shrunk: the guide's ``self.compute_loss(batch)`` is a cross-entropy of a small MLP on Gaussian blobs
(4 classes, 8 features) made in code; N = 2; a LightningDataModule with train/val loaders (batch 16)."""

import lightning as L
import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

N = 2  # gradient accumulation: batches per optimizer step


def blobs(n: int, seed: int) -> TensorDataset:
    centres = torch.randn(4, 8, generator=torch.Generator().manual_seed(123)) * 3
    g = torch.Generator().manual_seed(seed)
    y = torch.randint(0, 4, (n,), generator=g)
    return TensorDataset(centres[y] + torch.randn(n, 8, generator=g), y)


class ManualModel(L.LightningModule):
    def __init__(self):
        super().__init__()
        # Important: This property activates manual optimization.
        self.automatic_optimization = False
        self.net = nn.Sequential(nn.Linear(8, 32), nn.ReLU(), nn.Linear(32, 4))

    def forward(self, x):
        return self.net(x)

    def compute_loss(self, batch):
        x, y = batch
        return F.cross_entropy(self(x), y)

    def training_step(self, batch, batch_idx):
        opt = self.optimizers()
        # scale losses by 1/N (for N batches of gradient accumulation)
        loss = self.compute_loss(batch) / N
        self.manual_backward(loss)
        # accumulate gradients of N batches
        if (batch_idx + 1) % N == 0:
            opt.step()
            opt.zero_grad()
            sch = self.lr_schedulers()
            sch.step()
        self.log("train_loss", loss)

    def validation_step(self, batch, batch_idx):
        self.log("val_loss", self.compute_loss(batch))

    def configure_optimizers(self):
        optimizer = torch.optim.Adam(self.parameters(), lr=1e-3)
        scheduler = torch.optim.lr_scheduler.StepLR(optimizer, step_size=10, gamma=0.1)
        return [optimizer], [scheduler]


class BlobsData(L.LightningDataModule):
    def setup(self, stage=None):
        self.train_set = blobs(256, seed=0)
        self.val_set = blobs(64, seed=1)

    def train_dataloader(self):
        return DataLoader(self.train_set, batch_size=16, shuffle=True)

    def val_dataloader(self):
        return DataLoader(self.val_set, batch_size=16)
