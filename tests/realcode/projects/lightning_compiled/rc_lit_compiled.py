"""Re-creation of Lightning's "Apply torch.compile in configure_model" guide
(docs/source-pytorch/advanced/compile.rst, pytorch-lightning commit 7f0c3436): a LightningModule whose
``configure_model`` builds ``lightning.pytorch.demos.Transformer`` and stores ``self.model =
torch.compile(model)`` (returning early when the model already exists), ``training_step(batch)`` computing
``F.nll_loss(self.model(input, target), target.view(-1))``, logging ``train_loss`` and returning the loss,
``configure_optimizers`` returning ``torch.optim.Adam(self.parameters(), lr=1e-4)``.

Shrunk / changed: no ModelParallelStrategy / fully_shard and no meta-device init (single CPU device);
Transformer(vocab_size=32, nlayers=1, nhid=32, ninp=16, nhead=2) instead of 16 layers of 4096; data: token
sequences of a repeating pattern made in code (batch 8, length 8) in a LightningDataModule.
torch.compile uses the default backend (inductor), which compiles here on CPU (gcc present; the first
forward+backward takes ~15 s). Experiments only: RC_LIT_COMPILE_BACKEND=eager switches to backend="eager";
RC_LIT_STEP_IDX=1 declares ``training_step(self, batch, batch_idx)`` instead of the guide's
``training_step(self, batch)``."""

import os

import lightning as L
import torch
import torch.nn.functional as F
from lightning.pytorch.demos import Transformer
from torch.utils.data import DataLoader, TensorDataset

VOCAB = 32
BACKEND = os.environ.get("RC_LIT_COMPILE_BACKEND", "inductor")


def sequences(split: str) -> TensorDataset:
    """Arithmetic token sequences (start, start+k, start+2k, ... mod VOCAB): the 32 x 7 (start, k) pairs are
    shuffled once and split, so no eval sequence is a training sequence."""
    pairs = torch.cartesian_prod(torch.arange(VOCAB), torch.arange(1, 8))
    pairs = pairs[torch.randperm(len(pairs), generator=torch.Generator().manual_seed(0))]
    chosen = pairs[:160] if split == "train" else pairs[160:192]
    tokens = (chosen[:, :1] + chosen[:, 1:] * torch.arange(9)) % VOCAB
    return TensorDataset(tokens[:, :-1], tokens[:, 1:])


class LanguageModel(L.LightningModule):
    def __init__(self, vocab_size=VOCAB):
        super().__init__()
        self.vocab_size = vocab_size
        self.model = None

    def configure_model(self):
        if self.model is not None:
            return
        model = Transformer(vocab_size=self.vocab_size, nlayers=1, nhid=32, ninp=16, nhead=2)
        self.model = torch.compile(model, backend=BACKEND)

    def training_step(self, batch):
        input, target = batch
        output = self.model(input, target)
        loss = F.nll_loss(output, target.view(-1))
        self.log("train_loss", loss)
        return loss

    def validation_step(self, batch):
        input, target = batch
        self.log("val_loss", F.nll_loss(self.model(input, target), target.view(-1)))

    def configure_optimizers(self):
        return torch.optim.Adam(self.parameters(), lr=1e-4)


class LanguageModelWithIdx(LanguageModel):
    def training_step(self, batch, batch_idx):
        return super().training_step(batch)


class PatternData(L.LightningDataModule):
    def setup(self, stage=None):
        self.train_set = sequences("train")
        self.val_set = sequences("val")

    def train_dataloader(self):
        return DataLoader(self.train_set, batch_size=8, shuffle=True)

    def val_dataloader(self):
        return DataLoader(self.val_set, batch_size=8)
