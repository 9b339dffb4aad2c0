"""Tiny real training set-ups for the train / ckpt / smoke tests: an MLP classifier on a learnable
synthetic task, plain-loop save/load functions, and the conftest.py sources of the three kinds of
users. Imported by the tests and by the throwaway user projects they write (same process)."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

HERE = Path(__file__).resolve().parent
if str(HERE) not in sys.path:
    sys.path.insert(0, str(HERE))


def blobs(n: int = 64, dim: int = 8, classes: int = 4, seed: int = 0, scale: float = 1.0) -> TensorDataset:
    """Gaussian blobs around fixed centres: a classifier learns it in a few steps."""
    g = torch.Generator().manual_seed(seed)
    centres = torch.randn(classes, dim, generator=torch.Generator().manual_seed(123)) * 3
    y = torch.randint(0, classes, (n,), generator=g)
    x = (centres[y] + torch.randn(n, dim, generator=g)) * scale
    return TensorDataset(x, y)


def loader(n: int = 64, batch_size: int = 8, seed: int = 0, shuffle: bool = False, **kw) -> DataLoader:
    return DataLoader(
        blobs(n, seed=seed, **kw),
        batch_size=batch_size,
        shuffle=shuffle,
        generator=torch.Generator().manual_seed(seed) if shuffle else None,
    )


class MLP(nn.Module):
    def __init__(self, dim: int = 8, hidden: int = 32, classes: int = 4, dropout: float = 0.0):
        super().__init__()
        self.body = nn.Sequential(nn.Linear(dim, hidden), nn.ReLU(), nn.Dropout(dropout))
        self.head = nn.Linear(hidden, classes)

    def forward(self, x):
        return self.head(self.body(x))


def frozen_body(model: MLP, by_attribute: bool) -> MLP:
    """The body frozen the way people write it: ``module.requires_grad = False`` (an attribute: no effect)
    or ``module.requires_grad_(False)``."""
    if by_attribute:
        model.body.requires_grad = False
    else:
        model.body.requires_grad_(False)
    return model


def warmup(steps: int):
    return lambda step: min(1.0, (step + 1) / steps)


def save_all(state, path):
    """A complete checkpoint: model, optimizer, scheduler, RNG."""
    torch.save(
        {
            "model": state["model"].state_dict(),
            "optimizer": state["optimizer"].state_dict(),
            "lr_scheduler": state["lr_scheduler"].state_dict(),
            "rng": torch.random.get_rng_state(),
        },
        path,
    )


def load_all(state, path):
    ckpt = torch.load(path, weights_only=False)
    state["model"].load_state_dict(ckpt["model"])
    state["optimizer"].load_state_dict(ckpt["optimizer"])
    state["lr_scheduler"].load_state_dict(ckpt["lr_scheduler"])
    torch.random.set_rng_state(ckpt["rng"])


def save_no_scheduler(state, path):
    torch.save(
        {
            "model": state["model"].state_dict(),
            "optimizer": state["optimizer"].state_dict(),
            "rng": torch.random.get_rng_state(),
        },
        path,
    )


def load_no_scheduler(state, path):
    ckpt = torch.load(path, weights_only=False)
    state["model"].load_state_dict(ckpt["model"])
    state["optimizer"].load_state_dict(ckpt["optimizer"])
    torch.random.set_rng_state(ckpt["rng"])


def save_atomic(state, path):
    tmp = f"{path}.tmp"
    save_all(state, tmp)
    os.replace(tmp, path)


LOOP = """
    import pytest, torch, tiny_train as tt
    from torch import nn

    @pytest.fixture(scope="session")
    def dlcheck_make_training():
        def make():
            model = {model}
            optimizer = {optimizer}
            return {{"model": model, "optimizer": optimizer,
                     "lr_scheduler": torch.optim.lr_scheduler.LambdaLR(optimizer, tt.warmup(3))}}
        return make

    @pytest.fixture(scope="session")
    def dlcheck_dataloader():
        return {loader}

    @pytest.fixture(scope="session")
    def dlcheck_eval_dataloader():
        return tt.loader(32, seed=1)

    @pytest.fixture(scope="session")
    def dlcheck_loss_fn():
        return nn.CrossEntropyLoss()
"""


def loop_project(
    model: str = "tt.MLP()",
    optimizer: str = "torch.optim.AdamW(model.parameters(), lr=1e-2)",
    loader: str = "tt.loader()",
    extra: str = "",
) -> str:
    return LOOP.format(model=model, optimizer=optimizer, loader=loader) + extra


def section(run, cid: str) -> str:
    """A check's failure text with the report's line wrapping undone, for substring assertions."""
    text = ""
    for line in run.section(cid).splitlines():
        piece = line[12:] if line.startswith("  ") else line
        text += piece if text.endswith("-") else (" " + piece if text else piece)
    return text.replace("  ", " ")


class SoftmaxMLP(MLP):
    """Returns probabilities, then trained with CrossEntropyLoss: the double softmax."""

    def forward(self, x):
        return torch.softmax(super().forward(x), dim=-1)


class DetachedBodyMLP(MLP):
    """The body's features are detached: the body is frozen by accident."""

    def forward(self, x):
        return self.head(self.body(x).detach())


def llm_loader(tok, batch_size: int = 4):
    """Token batches of the tiny corpus, as a hand-written causal-LM pipeline makes them."""
    import tiny
    from transformers import DataCollatorForLanguageModeling

    return DataLoader(
        tiny.tokenized(tok), batch_size=batch_size, collate_fn=DataCollatorForLanguageModeling(tok, mlm=False)
    )


def sequences(n: int = 32, length: int = 6, dim: int = 8, classes: int = 4, seed: int = 0) -> TensorDataset:
    """Sequences whose class is the blob their mean lies in."""
    base = blobs(n, dim, classes, seed)
    g = torch.Generator().manual_seed(seed + 7)
    x = base.tensors[0][:, None, :] + torch.randn(n, length, dim, generator=g)
    return TensorDataset(x, base.tensors[1])


class SeqClassifier(nn.Module):
    """A small Transformer encoder over (batch, seq, dim) inputs, mean-pooled."""

    def __init__(self, batch_first: bool = True, dim: int = 8, width: int = 16, classes: int = 4):
        super().__init__()
        self.proj = nn.Linear(dim, width)
        layer = nn.TransformerEncoderLayer(width, nhead=2, dim_feedforward=32, dropout=0.0, batch_first=batch_first)
        self.encoder = nn.TransformerEncoder(layer, num_layers=1, enable_nested_tensor=False)
        self.head = nn.Linear(width, classes)

    def forward(self, x):
        return self.head(self.encoder(self.proj(x)).mean(dim=1))


class TokenGPT(nn.Module):
    """A nanoGPT-style causal LM without get_input_embeddings: forward(idx, targets) -> (logits, loss), token and
    position embeddings of its own; ``pool_batch`` mixes the examples (a mean over dim 0 added to every row)."""

    def __init__(self, pool_batch: bool = False, vocab: int = 16, width: int = 16, length: int = 8):
        super().__init__()
        self.pool_batch = pool_batch
        self.wte = nn.Embedding(vocab, width)
        self.wpe = nn.Embedding(length, width)
        self.mix = nn.Linear(width, width)
        self.lm_head = nn.Linear(width, vocab)

    def forward(self, idx, targets=None):
        h = self.wte(idx) + self.wpe(torch.arange(idx.shape[1], device=idx.device))
        h = torch.tanh(self.mix(h))
        if self.pool_batch:
            h = h + h.mean(dim=0, keepdim=True)
        logits = self.lm_head(h)
        loss = None if targets is None else F.cross_entropy(logits.flatten(0, 1), targets.flatten())
        return logits, loss


def token_pairs(n: int = 32, length: int = 8, vocab: int = 16) -> TensorDataset:
    """(x, y) next-token pairs cut from one random token stream, as nanoGPT's get_batch makes them."""
    g = torch.Generator().manual_seed(0)
    stream = torch.randint(0, vocab, (n * length + 1,), generator=g)
    x = torch.stack([stream[i * length : (i + 1) * length] for i in range(n)])
    y = torch.stack([stream[i * length + 1 : (i + 1) * length + 1] for i in range(n)])
    return TensorDataset(x, y)


class SeqPooler(nn.Module):
    """Per-position features, then the (batch, seq) -> (seq, batch) move written as a view (the bug) or as a
    transpose (correct), pooled over the sequence."""

    def __init__(self, use_view: bool, dim: int = 8, width: int = 16, classes: int = 4):
        super().__init__()
        self.use_view = use_view
        self.feat = nn.Linear(dim, width)
        self.head = nn.Linear(width, classes)

    def forward(self, x):
        h = torch.relu(self.feat(x))  # (B, T, W)
        h = h.view(h.size(1), h.size(0), -1) if self.use_view else h.transpose(0, 1)  # (T, B, W)
        return self.head(h.mean(dim=0))


def point_clouds(n: int = 16, points: int = 2048, classes: int = 4, seed: int = 0) -> TensorDataset:
    """Point clouds in raw units (coordinates 0-255): the class is which octant holds the most points."""
    g = torch.Generator().manual_seed(seed)
    x = torch.rand(n, points, 3, generator=g) * 255
    return TensorDataset(x, torch.randint(0, classes, (n,), generator=g))


class DeepSets(nn.Module):
    """phi per point, a sum over the set, rho on the sum."""

    def __init__(self, classes: int = 4):
        super().__init__()
        self.phi = nn.Sequential(nn.Linear(3, 32), nn.ReLU())
        self.rho = nn.Linear(32, classes)

    def forward(self, points):
        return self.rho(self.phi(points).sum(dim=1))


def with_nan(ds: TensorDataset) -> TensorDataset:
    """A missing value in the first example's features, as a raw CSV gives it."""
    x = ds.tensors[0].clone()
    x[0, 3] = float("nan")
    return TensorDataset(x, ds.tensors[1])


def token_classes(n: int = 32, vocab: int = 200, length: int = 12, classes: int = 4, seed: int = 0) -> TensorDataset:
    """Token-id sequences whose class is set by which quarter of the vocabulary they draw from."""
    g = torch.Generator().manual_seed(seed)
    y = torch.randint(0, classes, (n,), generator=g)
    span = vocab // (2 * classes)
    x = y[:, None] * span + torch.randint(0, span, (n, length), generator=g)
    return TensorDataset(x, y)


class BagOfWords(nn.Module):
    def __init__(self, vocab: int = 200, dim: int = 16, classes: int = 4):
        super().__init__()
        self.embed = nn.Embedding(vocab, dim)
        self.head = nn.Linear(dim, classes)

    def forward(self, ids):
        return self.head(self.embed(ids).mean(dim=1))


def misaligned(ds: TensorDataset, seed: int = 5) -> TensorDataset:
    """The labels shuffled against their inputs, as a join on the wrong key leaves them."""
    perm = torch.randperm(len(ds), generator=torch.Generator().manual_seed(seed))
    return TensorDataset(ds.tensors[0], ds.tensors[1][perm])


def unwrapped(module):
    """The module inside a torch.compile / DDP wrapper."""
    return getattr(module, "_orig_mod", getattr(module, "module", module))


def save_unwrapped(state, path):
    torch.save({"model": unwrapped(state["model"]).state_dict(), "optimizer": state["optimizer"].state_dict()}, path)


def save_model_and_optimizer(state, path):
    torch.save({"model": state["model"].state_dict(), "optimizer": state["optimizer"].state_dict()}, path)


#: objects a throwaway project hands back to the test that wrote it (same process)
KEEP: dict = {}


class FixedSeedSampler(torch.utils.data.Sampler):
    """A hand-written shuffling sampler that re-seeds identically every epoch."""

    def __init__(self, n: int, seed: int = 0):
        self.n, self.seed = n, seed

    def __iter__(self):
        g = torch.Generator().manual_seed(self.seed)
        return iter(torch.randperm(self.n, generator=g).tolist())

    def __len__(self):
        return self.n


class UnsizedPKSampler(torch.utils.data.Sampler):
    """A class-balanced P x K sampler as torchvision's references/similarity writes it: no ``__len__``, so
    ``bool()`` of it (or of the BatchSampler a DataLoader wraps it in) raises TypeError. Each epoch draws its
    classes and examples from the global ``random`` module; 64 blobs of 4 classes, p classes x k examples."""

    def __init__(self, labels, p: int = 2, k: int = 4, seed: int | None = None):
        self.labels, self.p, self.k, self.seed = [int(y) for y in labels], p, k, seed

    def __iter__(self):
        import random

        if self.seed is not None:  # the bug: the same draw every epoch
            random = random.Random(self.seed)  # noqa: PLW2901
        by_class: dict[int, list[int]] = {}
        for i, y in enumerate(self.labels):
            by_class.setdefault(y, []).append(i)
        for _ in range(len(self.labels) // (self.p * self.k)):
            for c in random.sample(sorted(by_class), self.p):
                yield from random.sample(by_class[c], self.k)


class EpochSeedSampler(FixedSeedSampler):
    """The same, seeded with seed + epoch, with set_epoch."""

    epoch = 0

    def set_epoch(self, epoch: int) -> None:
        self.epoch = epoch

    def __iter__(self):
        g = torch.Generator().manual_seed(self.seed + self.epoch)
        return iter(torch.randperm(self.n, generator=g).tolist())


def seed_workers_constant(worker_id: int) -> None:
    import numpy as np

    np.random.seed(42)


def seed_workers_from_torch(worker_id: int) -> None:
    import random

    import numpy as np

    np.random.seed(torch.initial_seed() % 2**32)
    random.seed(torch.initial_seed())


class Stream(torch.utils.data.IterableDataset):
    """The examples of a dataset streamed in order, with no length (as a webdataset or a streaming
    ``datasets`` split gives them)."""

    def __init__(self, ds):
        self.ds = ds

    def __iter__(self):
        return (self.ds[i] for i in range(len(self.ds)))


class GeneratorLoader:
    """A hand-written loader, as custom loops iterate their data: a generator of collated batches, re-started
    by every ``iter()``, with no ``.dataset`` and no sampler."""

    def __init__(self, ds, batch_size: int = 8, collate=None):
        self.ds, self.batch_size = ds, batch_size
        self.collate = collate or (lambda rows: tuple(torch.stack(col) for col in zip(*rows)))

    def __iter__(self):
        for start in range(0, len(self.ds), self.batch_size):
            yield self.collate([self.ds[i] for i in range(start, min(start + self.batch_size, len(self.ds)))])


class AugmentedBlobs(torch.utils.data.Dataset):
    """blobs with a random augmentation (noise on the features) drawn from ``source``: "private", a numpy
    Generator the dataset owns (as an albumentations Compose holds one), or "torch", torch's global generator
    (which torch seeds in every DataLoader worker)."""

    def __init__(self, source: str = "private", n: int = 64) -> None:
        import numpy as np

        self.base = blobs(n)
        self.rng = np.random.default_rng(0) if source == "private" else None

    def __len__(self) -> int:
        return len(self.base)

    def __getitem__(self, i: int):
        x, y = self.base[i]
        if self.rng is not None:
            noise = torch.from_numpy(self.rng.normal(size=x.shape[0]).astype("float32"))
        else:
            noise = torch.randn(x.shape[0])
        return x + 0.1 * noise, y


def reseed_dataset_rng(worker_id: int) -> None:
    """The fix: each worker reseeds the dataset's own generator from the seed torch gives it."""
    import numpy as np

    info = torch.utils.data.get_worker_info()
    info.dataset.rng = np.random.default_rng(info.seed)
