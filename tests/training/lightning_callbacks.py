"""Lightning users whose Trainer callbacks change the training: a backbone frozen then unfrozen (Lightning's
``BackboneFinetuning``, or a hand-written schedule counting its own batches) and an EMA kept in a callback
(a hand-written one, or Lightning's ``EMAWeightAveraging``). Each buggy callback keeps state it does not save
(no ``state_dict``); its twin saves it."""

from __future__ import annotations

import copy

import lightning.pytorch as pl
import torch
from torch import nn
from torch.nn import functional as F


class Finetuner(pl.LightningModule):
    """A backbone and a head; the optimizer holds what requires grad when it is built (Lightning's finetuning
    guide: the callback adds the backbone's param group when it unfreezes it)."""

    def __init__(self, lr: float = 1e-2):
        super().__init__()
        self.lr = lr
        self.backbone = nn.Sequential(nn.Linear(8, 16), nn.Tanh())
        self.head = nn.Linear(16, 4)

    def forward(self, x):
        return self.head(self.backbone(x))

    def training_step(self, batch, batch_idx):
        x, y = batch
        return F.cross_entropy(self(x), y)

    def configure_optimizers(self):
        return torch.optim.AdamW([p for p in self.parameters() if p.requires_grad], lr=self.lr)


class FreezeFor(pl.Callback):
    """The backbone frozen for the first ``steps`` batches, then unfrozen and added to the optimizer; the
    batches are counted in ``self.seen``, which nothing saves: a resumed fit counts from 0 and freezes the
    backbone again (the bug)."""

    def __init__(self, steps: int = 2):
        self.steps = steps
        self.seen = 0
        self.unfrozen = False

    def setup(self, trainer, pl_module, stage):
        if stage == "fit":
            pl_module.backbone.requires_grad_(False)

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx):
        if not self.unfrozen and self.seen >= self.steps:
            self.unfrozen = True
            pl_module.backbone.requires_grad_(True)
            trainer.optimizers[0].add_param_group({"params": list(pl_module.backbone.parameters())})

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
        self.seen += 1


class SavedFreezeFor(FreezeFor):
    """The twin: the count saved in the checkpoint and restored on resume."""

    def state_dict(self):
        return {"seen": self.seen}

    def load_state_dict(self, state_dict):
        self.seen = state_dict["seen"]


class EMA(pl.Callback):
    """An EMA of the module's ``net`` kept in the callback (``self.ema``), updated after every batch; nothing
    saves it: a resumed fit starts a fresh EMA from the resumed weights (the bug)."""

    def __init__(self, decay: float = 0.9):
        self.decay = decay
        self.ema = None

    def on_fit_start(self, trainer, pl_module):
        if self.ema is None:
            self.ema = copy.deepcopy(pl_module.net).requires_grad_(False)

    @torch.no_grad()
    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
        for e, p in zip(self.ema.parameters(), pl_module.net.parameters()):
            e.lerp_(p, 1 - self.decay)


class SavedEMA(EMA):
    """The twin: the EMA's weights saved through the callback's state_dict and loaded once the EMA exists."""

    def state_dict(self):
        return {"ema": self.ema.state_dict()} if self.ema is not None else {}

    def load_state_dict(self, state_dict):
        self._loaded = state_dict.get("ema")

    def on_fit_start(self, trainer, pl_module):
        super().on_fit_start(trainer, pl_module)
        loaded = getattr(self, "_loaded", None)
        if loaded is not None:
            self.ema.load_state_dict(loaded)
            self._loaded = None
