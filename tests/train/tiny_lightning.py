"""A tiny real Lightning project: a classifier LightningModule on the blobs task and its datamodule.
Lightning is imported here, once, before the in-process pytest runs of the tests that use it."""

from __future__ import annotations

from collections import deque

import lightning.pytorch as pl
import tiny_train as tt
import torch
from torch.nn import functional as F
from torch.utils.data import DataLoader


class Classifier(pl.LightningModule):
    def __init__(self, lr: float = 1e-2, dropout: float = 0.0, warmup: int = 3):
        super().__init__()
        self.save_hyperparameters()
        self.net = tt.MLP(dropout=dropout)

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
        opt = torch.optim.AdamW(self.parameters(), lr=self.hparams.lr)
        sched = torch.optim.lr_scheduler.LambdaLR(opt, tt.warmup(self.hparams.warmup))
        return {"optimizer": opt, "lr_scheduler": {"scheduler": sched, "interval": "step"}}


class HandScheduled(Classifier):
    """A warmup scheduler kept outside what Lightning knows, ``where``:

    - ``"on_train_start"``: created in ``on_train_start`` on ``self.optimizers()``, stepped in
      ``on_train_batch_end`` (a bug: Lightning neither saves nor restores it);
    - ``"init"``: the optimizer and the scheduler created in ``__init__``, the scheduler stepped in
      ``training_step`` (the same bug);
    - ``"saved"``: as ``"on_train_start"``, saved in ``on_save_checkpoint`` and restored once it exists;
    - ``"configured"``: returned from ``configure_optimizers`` with ``interval="step"`` (Lightning's way)."""

    def __init__(self, where: str = "on_train_start", **kw):
        super().__init__(**kw)
        self.where = where
        self.sched = None
        self._sched_state = None
        if where == "init":
            self.opt = torch.optim.AdamW(self.parameters(), lr=self.hparams.lr)
            self.sched = torch.optim.lr_scheduler.LambdaLR(self.opt, tt.warmup(self.hparams.warmup))

    def on_train_start(self):
        if self.where in ("on_train_start", "saved"):
            opt = self.optimizers().optimizer
            self.sched = torch.optim.lr_scheduler.LambdaLR(opt, tt.warmup(self.hparams.warmup))
            if self._sched_state is not None:
                self.sched.load_state_dict(self._sched_state)
                for group, lr in zip(opt.param_groups, self.sched.get_last_lr()):
                    group["lr"] = lr

    def training_step(self, batch, batch_idx):
        loss = super().training_step(batch, batch_idx)
        if self.where == "init":
            self.sched.step()
        return loss

    def on_train_batch_end(self, outputs, batch, batch_idx):
        if self.where in ("on_train_start", "saved"):
            self.sched.step()

    def on_save_checkpoint(self, checkpoint):
        if self.where == "saved":
            checkpoint["hand_lr_scheduler"] = self.sched.state_dict()

    def on_load_checkpoint(self, checkpoint):
        if self.where == "saved":  # the scheduler does not exist yet: on_train_start loads it
            self._sched_state = checkpoint["hand_lr_scheduler"]

    def configure_optimizers(self):
        if self.where == "configured":
            return super().configure_optimizers()
        return self.opt if self.where == "init" else torch.optim.AdamW(self.parameters(), lr=self.hparams.lr)


class EpochShuffle(torch.utils.data.Sampler):
    """A shuffle whose order is a function of (seed, epoch): Lightning calls set_epoch before every epoch,
    a resumed fit included, so a resume sees the order the uninterrupted run saw."""

    def __init__(self, n: int, seed: int):
        self.n, self.seed, self.epoch = n, seed, 0

    def set_epoch(self, epoch: int) -> None:
        self.epoch = epoch

    def __iter__(self):
        g = torch.Generator().manual_seed(self.seed + self.epoch)
        return iter(torch.randperm(self.n, generator=g).tolist())

    def __len__(self) -> int:
        return self.n


class Blobs(pl.LightningDataModule):
    def __init__(
        self, shuffle: bool = False, batch_size: int = 8, generator_seed=None, epoch_seed=None, stateful: bool = False
    ):
        super().__init__()
        self.shuffle = shuffle
        self.batch_size = batch_size
        self.generator_seed = generator_seed  # DataLoader(generator=Generator().manual_seed(s)): seeded per fit
        self.epoch_seed = epoch_seed  # EpochShuffle: seeded per epoch
        #: torchdata's StatefulDataLoader instead of DataLoader: a mid-epoch checkpoint holds its position
        self.stateful = stateful

    def setup(self, stage=None):
        self.train_set = tt.blobs(64, seed=0)
        self.val_set = tt.blobs(32, seed=1)

    def train_dataloader(self):
        loader = DataLoader
        if self.stateful:
            from torchdata.stateful_dataloader import StatefulDataLoader as loader
        if self.generator_seed is not None:
            g = torch.Generator().manual_seed(self.generator_seed)
            return loader(self.train_set, batch_size=self.batch_size, shuffle=True, generator=g)
        if self.epoch_seed is not None:
            sampler = EpochShuffle(len(self.train_set), self.epoch_seed)
            return loader(self.train_set, batch_size=self.batch_size, sampler=sampler)
        return loader(self.train_set, batch_size=self.batch_size, shuffle=self.shuffle)

    def val_dataloader(self):
        return DataLoader(self.val_set, batch_size=self.batch_size)


PROJECT = """
    import pytest, torch, tiny_lightning as tl

    @pytest.fixture(scope="session")
    def dlcheck_lightning_module():
        torch.manual_seed(0)
        return tl.{cls}({module})

    @pytest.fixture(scope="session")
    def dlcheck_datamodule():
        return tl.Blobs({data})
"""


def project(module: str = "", data: str = "", cls: str = "Classifier") -> str:
    return PROJECT.format(module=module, data=data, cls=cls)


# --------------------------------------------------------------------------------------------------
# Lightning's autoencoder example in small: images (1, 12, 12) with int labels; the forward takes flat vectors and
# only training_step flattens the images (the pipeline never calls forward on the loader's batch)


class Centre(torch.nn.Module):
    """Subtracts the batch mean: every example's output depends on the others (T4's bug)."""

    def forward(self, x):
        return x - x.mean(0, keepdim=True)


class FlatAutoEncoder(pl.LightningModule):
    """``F.mse_loss(x, self(x))`` on the flattened images, the labels ignored (as upstream). ``mix``: the forward
    centres the codes over the batch (each example's reconstruction depends on the others: T4's bug);
    ``mix="encoder"`` puts that centring inside the encoder (a :class:`Centre` layer).
    ``direct``: training_step calls the encoder and decoder itself, never the module's forward."""

    def __init__(self, mix: bool | str = False, direct: bool = False):
        super().__init__()
        self.mix, self.direct = mix, direct
        layers = [torch.nn.Linear(144, 16), torch.nn.ReLU(), torch.nn.Linear(16, 3)]
        self.encoder = torch.nn.Sequential(*layers, *([Centre()] if mix == "encoder" else []))
        self.decoder = torch.nn.Sequential(torch.nn.Linear(3, 16), torch.nn.ReLU(), torch.nn.Linear(16, 144))

    def forward(self, x):
        z = self.encoder(x)
        if self.mix is True:
            z = z - z.mean(0, keepdim=True)
        return self.decoder(z)

    def training_step(self, batch, batch_idx):
        x, _ = batch
        x = x.view(x.size(0), -1)
        loss = F.mse_loss(x, self.decoder(self.encoder(x)) if self.direct else self(x))
        self.log("train_loss", loss)
        return loss

    def configure_optimizers(self):
        return torch.optim.Adam(self.parameters(), lr=1e-3)


class FlatClassifier(FlatAutoEncoder):
    """The same flattening training_step, trained with cross-entropy on the labels by a ``classes``-way head."""

    def __init__(self, classes: int = 10):
        super().__init__()
        self.encoder = torch.nn.Sequential(torch.nn.Linear(144, 16), torch.nn.ReLU(), torch.nn.Linear(16, classes))

    def forward(self, x):
        return self.encoder(x)

    def training_step(self, batch, batch_idx):
        x, y = batch
        loss = F.cross_entropy(self(x.view(x.size(0), -1)), y)
        self.log("train_loss", loss)
        return loss


class Digits(pl.LightningDataModule):
    """64 images (1, 12, 12) in [0, 1] with labels ``offset``..``offset`` + 9 (1-based when offset=1)."""

    def __init__(self, offset: int = 0):
        super().__init__()
        self.offset = offset

    def setup(self, stage=None):
        g = torch.Generator().manual_seed(0)
        labels = torch.arange(64) % 10 + self.offset
        self.train_set = torch.utils.data.TensorDataset(torch.rand(64, 1, 12, 12, generator=g), labels)

    def train_dataloader(self):
        return DataLoader(self.train_set, batch_size=8)


FLAT = """
    import pytest, torch, tiny_lightning as tl

    @pytest.fixture(scope="session")
    def dlcheck_lightning_module():
        torch.manual_seed(0)
        return tl.{cls}({module})

    @pytest.fixture(scope="session")
    def dlcheck_datamodule():
        return tl.Digits({data})
"""


def flat_project(cls: str = "FlatAutoEncoder", module: str = "", data: str = "") -> str:
    return FLAT.format(cls=cls, module=module, data=data)


class BinaryClassifier(pl.LightningModule):
    """Lightning's fine-tuning example in small: one logit per image, ``F.binary_cross_entropy_with_logits``
    on ``y.view(-1, 1)`` of the int 0/1 labels, the head called as ``self.forward(x)`` (no forward hook runs).
    ``bias``: the output layer's bias at start (a large one is confidently wrong on the other class)."""

    def __init__(self, bias: float = 0.0):
        super().__init__()
        self.fc = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 1))
        with torch.no_grad():
            self.fc[-1].bias.fill_(bias)

    def forward(self, x):
        return self.fc(x)

    def training_step(self, batch, batch_idx):
        x, y = batch
        loss = F.binary_cross_entropy_with_logits(self.forward(x), y.view(-1, 1).type_as(x))
        self.log("train_loss", loss)
        return loss

    def configure_optimizers(self):
        return torch.optim.Adam(self.parameters(), lr=1e-3)


class TwoBlobs(Blobs):
    """The blobs task with two classes (int labels 0/1)."""

    def setup(self, stage=None):
        self.train_set = tt.blobs(64, classes=2, seed=0, scale=0.3)
        self.val_set = tt.blobs(32, classes=2, seed=1, scale=0.3)


class OwnLoaders(Classifier):
    """Lightning's classic style, without a datamodule: the module builds its data in ``__init__`` and defines its
    own ``train_dataloader()`` / ``val_dataloader()``, trained as ``trainer.fit(module)`` (Lightning's
    reinforce_learn_Qnet.py feeds its replay buffer this way). ``jitter``: training_step scales the inputs by a
    draw of python's ``random`` (as the DQN's epsilon-greedy draws); ``keep_rng``: the torch and python RNG states
    are saved in the .ckpt and set back on load (C3's fix)."""

    def __init__(self, shuffle: bool = False, jitter: bool = False, keep_rng: bool = False, **kw):
        super().__init__(**kw)
        self.shuffle, self.jitter, self.keep_rng = shuffle, jitter, keep_rng
        self.train_set = tt.blobs(64, seed=0)
        self.val_set = tt.blobs(32, seed=1)

    def training_step(self, batch, batch_idx):
        if self.jitter:
            import random

            x, y = batch
            batch = (x * (1.0 + 0.1 * random.random()), y)
        return super().training_step(batch, batch_idx)

    def train_dataloader(self):
        return DataLoader(self.train_set, batch_size=8, shuffle=self.shuffle)

    def val_dataloader(self):
        return DataLoader(self.val_set, batch_size=8)

    def on_save_checkpoint(self, checkpoint):
        if self.keep_rng:
            import random

            checkpoint["rng"] = {"torch": torch.get_rng_state(), "python": random.getstate()}

    def on_load_checkpoint(self, checkpoint):
        if self.keep_rng:
            import random

            torch.set_rng_state(checkpoint["rng"]["torch"])
            random.setstate(checkpoint["rng"]["python"])


class SetupReadsTrainer(OwnLoaders):
    """Lightning's imagenet template: ``setup()`` builds the datasets and reads the Trainer fit() attaches
    (``self.trainer.world_size``); its own loaders read what setup built."""

    def setup(self, stage=None):
        self.shards = self.trainer.world_size  # raises "not attached to a Trainer" on a bare copy
        self.train_set = tt.blobs(64, seed=0)


OWN_LOADERS = """
    import pytest, torch, tiny_lightning as tl

    @pytest.fixture(scope="session")
    def dlcheck_lightning_module():
        torch.manual_seed(0)
        return tl.{cls}({module})
"""


def own_loaders_project(module: str = "", cls: str = "OwnLoaders") -> str:
    return OWN_LOADERS.format(module=module, cls=cls)


class _Replay(torch.utils.data.IterableDataset):
    """The newest ``n`` entries of a replay buffer, newest last (RLDataset's way: built over the module's buffer)."""

    def __init__(self, buffer, n: int = 16):
        self.buffer, self.n = buffer, n

    def __iter__(self):
        yield from list(self.buffer)[-self.n :]


class ReplayClassifier(Classifier):
    """reinforce_learn_Qnet.py's data path in small: a replay buffer (a deque) filled in ``__init__``, a
    train_dataloader() over it, and every training_step appending a new experience (here the next example of a
    fixed pool). ``keep``: on_save_checkpoint saves the buffer and the pool position, on_load_checkpoint sets them
    back (C1's fix); else Lightning's .ckpt holds neither and a resumed fit trains on the buffer of a new module."""

    def __init__(self, keep: bool = False, **kw):
        super().__init__(**kw)
        self.keep = keep
        pool = tt.blobs(128, seed=2)
        self.pool = list(zip(*pool.tensors))
        self.buffer = deque(self.pool[:32], maxlen=32)
        self.filled = 32

    def training_step(self, batch, batch_idx):
        loss = super().training_step(batch, batch_idx)
        self.buffer.append(self.pool[self.filled % len(self.pool)])
        self.filled += 1
        return loss

    def train_dataloader(self):
        return DataLoader(_Replay(self.buffer), batch_size=8)

    def on_save_checkpoint(self, checkpoint):
        if self.keep:
            checkpoint["replay"] = {"buffer": list(self.buffer), "filled": self.filled}

    def on_load_checkpoint(self, checkpoint):
        if self.keep:
            self.buffer = deque(checkpoint["replay"]["buffer"], maxlen=32)
            self.filled = checkpoint["replay"]["filled"]
