"""Re-creation of Lightning's examples/pytorch/basics/autoencoder.py (pytorch-lightning commit 7f0c3436cd3f):
``LitAutoEncoder(hidden_dim=64, learning_rate=10e-3)`` with ``save_hyperparameters()``, an encoder
Linear(784, 64) -> ReLU -> Linear(64, 3) and a decoder Linear(3, 64) -> ReLU -> Linear(64, 784);
``training_step(batch, batch_idx)`` / validation / test through ``_common_step``: the batch ``(x, _)`` flattened
to (B, 784), ``F.mse_loss(x, self(x))`` logged as ``{stage}_loss`` with ``on_step=True``, the loss returned;
``configure_optimizers`` -> ``torch.optim.Adam(self.parameters(), lr=self.hparams.learning_rate)``.
``MyDataModule(batch_size=32)`` builds its datasets in ``__init__``: the training set split by ``random_split``
(55000 / 5000, ``torch.Generator().manual_seed(42)``) into ``mnist_train`` / ``mnist_val`` plus a test set, and
returns ``DataLoader(dataset, batch_size=self.batch_size)`` for train / val / test / predict (no ``shuffle``,
as upstream). The ``ImageSampler`` callback (a grid of reconstructions of ``trainer.datamodule.mnist_val`` at
each epoch end, in eval mode under no_grad) is kept for fidelity; the README has no role for Trainer callbacks,
so it is not handed over (it writes PNGs and changes no training state).

Shrunk / changed: MNIST (downloaded by lightning.pytorch.demos.mnist_datamodule.MNIST with ToTensor) is replaced
by synthetic 28x28 "digits" made in code: ten stroke templates, shifted by up to 2 px, brightness-jittered, in
[0, 1] like ToTensor's output, 1 x 28 x 28 float tensors with an int label; 660 training images split 605 / 55
(the same 11 : 1 ratio and split seed) and 110 test images. LightningCLI (seed_everything 1234, max_epochs 10)
is not run: the module and datamodule are handed over as the README's Lightning section says."""

import torch
import torch.nn.functional as F
from lightning.pytorch import LightningDataModule, LightningModule, Trainer, callbacks
from torch import nn
from torch.utils.data import DataLoader, TensorDataset, random_split

# ten digit-like stroke templates: rectangles (row0, row1, col0, col1) on a 28 x 28 canvas
_STROKES = {
    0: [(6, 8, 9, 19), (20, 22, 9, 19), (6, 22, 8, 10), (6, 22, 18, 20)],
    1: [(5, 23, 13, 15)],
    2: [(6, 8, 9, 19), (6, 14, 18, 20), (13, 15, 9, 19), (13, 22, 8, 10), (20, 22, 9, 19)],
    3: [(6, 8, 9, 19), (13, 15, 11, 19), (20, 22, 9, 19), (6, 22, 18, 20)],
    4: [(5, 15, 8, 10), (13, 15, 8, 20), (5, 23, 17, 19)],
    5: [(6, 8, 9, 20), (6, 14, 8, 10), (13, 15, 9, 19), (13, 22, 18, 20), (20, 22, 8, 19)],
    6: [(6, 22, 8, 10), (6, 8, 9, 19), (13, 15, 9, 19), (13, 22, 18, 20), (20, 22, 9, 19)],
    7: [(6, 8, 8, 20), (6, 23, 17, 19)],
    8: [(6, 8, 9, 19), (13, 15, 9, 19), (20, 22, 9, 19), (6, 22, 8, 10), (6, 22, 18, 20)],
    9: [(6, 8, 9, 19), (6, 15, 8, 10), (13, 15, 9, 19), (6, 23, 18, 20)],
}


def synthetic_digits(n: int, seed: int) -> TensorDataset:
    """n images (1, 28, 28) in [0, 1] and their labels, drawn from a seeded generator."""
    g = torch.Generator().manual_seed(seed)
    labels = torch.randint(0, 10, (n,), generator=g)
    shifts = torch.randint(-2, 3, (n, 2), generator=g)
    brightness = 0.7 + 0.3 * torch.rand(n, generator=g)
    images = torch.zeros(n, 1, 28, 28)
    for i in range(n):
        dy, dx = int(shifts[i, 0]), int(shifts[i, 1])
        for r0, r1, c0, c1 in _STROKES[int(labels[i])]:
            images[i, 0, r0 + dy : r1 + dy, c0 + dx : c1 + dx] = brightness[i]
    images = (images + 0.05 * torch.rand(images.shape, generator=g)).clamp(0, 1)
    return TensorDataset(images, labels)


class ImageSampler(callbacks.Callback):
    def __init__(
        self,
        num_samples: int = 3,
        nrow: int = 8,
        padding: int = 2,
        normalize: bool = True,
        value_range: tuple[int, int] | None = None,
        scale_each: bool = False,
        pad_value: int = 0,
    ) -> None:
        super().__init__()
        self.num_samples, self.nrow, self.padding, self.normalize = num_samples, nrow, padding, normalize
        self.value_range, self.scale_each, self.pad_value = value_range, scale_each, pad_value

    def _to_grid(self, images):
        import torchvision

        return torchvision.utils.make_grid(
            tensor=images,
            nrow=self.nrow,
            padding=self.padding,
            normalize=self.normalize,
            value_range=self.value_range,
            scale_each=self.scale_each,
            pad_value=self.pad_value,
        )

    def on_train_epoch_end(self, trainer: Trainer, pl_module: LightningModule) -> None:
        from torchvision.utils import save_image

        images, _ = next(iter(DataLoader(trainer.datamodule.mnist_val, batch_size=self.num_samples)))
        with torch.no_grad():
            pl_module.eval()
            generated = pl_module(images.view(images.size(0), -1).to(pl_module.device))
            pl_module.train()
        if trainer.current_epoch == 0:
            save_image(self._to_grid(images), f"grid_ori_{trainer.current_epoch}.png")
        save_image(self._to_grid(generated.reshape(images.shape)), f"grid_generated_{trainer.current_epoch}.png")


class LitAutoEncoder(LightningModule):
    def __init__(self, hidden_dim: int = 64, learning_rate=10e-3):
        super().__init__()
        self.save_hyperparameters()
        self.encoder = nn.Sequential(nn.Linear(28 * 28, hidden_dim), nn.ReLU(), nn.Linear(hidden_dim, 3))
        self.decoder = nn.Sequential(nn.Linear(3, hidden_dim), nn.ReLU(), nn.Linear(hidden_dim, 28 * 28))

    def forward(self, x):
        return self.decoder(self.encoder(x))

    def training_step(self, batch, batch_idx):
        return self._common_step(batch, batch_idx, "train")

    def validation_step(self, batch, batch_idx):
        self._common_step(batch, batch_idx, "val")

    def test_step(self, batch, batch_idx):
        self._common_step(batch, batch_idx, "test")

    def predict_step(self, batch, batch_idx, dataloader_idx=None):
        return self(self._prepare_batch(batch))

    def configure_optimizers(self):
        return torch.optim.Adam(self.parameters(), lr=self.hparams.learning_rate)

    def _prepare_batch(self, batch):
        x, _ = batch
        return x.view(x.size(0), -1)

    def _common_step(self, batch, batch_idx, stage: str):
        x = self._prepare_batch(batch)
        loss = F.mse_loss(x, self(x))
        self.log(f"{stage}_loss", loss, on_step=True)
        return loss


class MyDataModule(LightningDataModule):
    def __init__(self, batch_size: int = 32):
        super().__init__()
        dataset = synthetic_digits(660, seed=0)  # MNIST(train=True, transform=ToTensor())
        self.mnist_test = synthetic_digits(110, seed=1)  # MNIST(train=False, transform=ToTensor())
        self.mnist_train, self.mnist_val = random_split(dataset, [605, 55], generator=torch.Generator().manual_seed(42))
        self.batch_size = batch_size

    def train_dataloader(self):
        return DataLoader(self.mnist_train, batch_size=self.batch_size)

    def val_dataloader(self):
        return DataLoader(self.mnist_val, batch_size=self.batch_size)

    def test_dataloader(self):
        return DataLoader(self.mnist_test, batch_size=self.batch_size)

    def predict_dataloader(self):
        return DataLoader(self.mnist_test, batch_size=self.batch_size)
