"""Two Lightning users the train/ckpt/smoke checks must run as they are written: manual optimization
(Lightning's docs: ``automatic_optimization = False``, ``self.optimizers()``, ``manual_backward``,
gradient accumulation by hand, the scheduler stepped on the accumulation boundary; its buggy twin
``ManualSchedEveryBatch`` steps it every batch) and a module holding a
``torch.compile``'d submodule (Lightning's torch.compile guide; the eager backend keeps it fast on CPU)."""

from __future__ import annotations

import lightning.pytorch as pl
import torch
from torch import nn
from torch.nn import functional as F
from torch.utils.data import DataLoader, TensorDataset


def blobs(n: int, seed: int) -> TensorDataset:
    g = torch.Generator().manual_seed(seed)
    y = torch.randint(0, 3, (n,), generator=g)
    centres = torch.tensor([[2.0, 0.0], [-2.0, 0.0], [0.0, 2.0]])
    return TensorDataset(centres[y] + 0.3 * torch.randn(n, 2, generator=g), y)


def mlp() -> nn.Module:
    return nn.Sequential(nn.Linear(2, 16), nn.Tanh(), nn.Linear(16, 3))


class ManualClassifier(pl.LightningModule):
    #: the bug T6 finds: the scheduler stepped every batch while the optimizer steps every `accumulate`
    sched_every_batch = False

    def __init__(self, lr: float = 1e-2, accumulate: int = 2):
        super().__init__()
        self.automatic_optimization = False
        self.accumulate = accumulate
        self.lr = lr
        self.net = mlp()

    def forward(self, x):
        return self.net(x)

    def training_step(self, batch, batch_idx):
        opt = self.optimizers()
        sched = self.lr_schedulers()
        x, y = batch
        loss = F.cross_entropy(self(x), y)
        self.manual_backward(loss / self.accumulate)
        if (batch_idx + 1) % self.accumulate == 0:
            opt.step()
            opt.zero_grad()
            if not self.sched_every_batch:
                sched.step()
        if self.sched_every_batch:
            sched.step()
        self.log("train_loss", loss)

    def configure_optimizers(self):
        opt = torch.optim.AdamW(self.parameters(), lr=self.lr)
        sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda step: min(1.0, (step + 1) / 3))
        return [opt], [sched]


class ManualSchedEveryBatch(ManualClassifier):
    sched_every_batch = True


class CompiledClassifier(pl.LightningModule):
    def __init__(self, lr: float = 1e-2):
        super().__init__()
        self.lr = lr
        self.net = torch.compile(mlp(), backend="eager")

    def forward(self, x):
        return self.net(x)

    def training_step(self, batch, batch_idx):
        x, y = batch
        loss = F.cross_entropy(self(x), y)
        self.log("train_loss", loss)
        return loss

    def validation_step(self, batch, batch_idx):
        x, y = batch
        self.log("val_loss", F.cross_entropy(self(x), y))

    def configure_optimizers(self):
        return torch.optim.AdamW(self.parameters(), lr=self.lr)


class GAN(pl.LightningModule):
    """Lightning's basic GAN under manual optimization: two optimizers, ``self.optimizers()`` unpacked into
    them, each loss handed to ``manual_backward`` between ``toggle_optimizer`` / ``untoggle_optimizer``."""

    def __init__(self, lr: float = 2e-4, latent: int = 4):
        super().__init__()
        self.automatic_optimization = False
        self.lr, self.latent = lr, latent
        self.generator = nn.Sequential(nn.Linear(latent, 16), nn.ReLU(), nn.Linear(16, 2))
        self.discriminator = nn.Sequential(nn.Linear(2, 16), nn.LeakyReLU(0.2), nn.Linear(16, 1))

    def forward(self, z):
        return self.generator(z)

    def training_step(self, batch, batch_idx):
        x, _ = batch
        opt_g, opt_d = self.optimizers()
        z = torch.randn(len(x), self.latent)
        real, fake = torch.ones(len(x), 1), torch.zeros(len(x), 1)
        self.toggle_optimizer(opt_g)
        g_loss = F.binary_cross_entropy_with_logits(self.discriminator(self(z)), real)
        self.manual_backward(g_loss)
        opt_g.step()
        opt_g.zero_grad()
        self.untoggle_optimizer(opt_g)
        self.toggle_optimizer(opt_d)
        d_real = F.binary_cross_entropy_with_logits(self.discriminator(x), real)
        d_fake = F.binary_cross_entropy_with_logits(self.discriminator(self(z).detach()), fake)
        self.manual_backward((d_real + d_fake) / 2)
        opt_d.step()
        opt_d.zero_grad()
        self.untoggle_optimizer(opt_d)
        self.log_dict({"g_loss": g_loss, "d_loss": (d_real + d_fake) / 2})

    def configure_optimizers(self):
        betas = (0.5, 0.999)
        return [
            torch.optim.Adam(self.generator.parameters(), lr=self.lr, betas=betas),
            torch.optim.Adam(self.discriminator.parameters(), lr=self.lr, betas=betas),
        ], []


class Blobs(pl.LightningDataModule):
    def setup(self, stage=None):
        self.train_set, self.val_set = blobs(64, seed=0), blobs(32, seed=1)

    def train_dataloader(self):
        return DataLoader(self.train_set, batch_size=8)

    def val_dataloader(self):
        return DataLoader(self.val_set, batch_size=8)


PROJECT = """
    import pytest, torch, lightning_kinds as lk

    @pytest.fixture(scope="session")
    def dlcheck_lightning_module():
        torch.manual_seed(0)
        return lk.{module}()

    @pytest.fixture(scope="session")
    def dlcheck_datamodule():
        return lk.Blobs()
"""
