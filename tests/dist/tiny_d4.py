"""Tiny real parts for D4's random streams in a DDP loop: images that torchvision's RandomHorizontalFlip (p = 0.5,
from torch's global generator) flips in the dataset, a denoiser whose loss draws its noise and timesteps as a
diffusion step does (``torch.randn_like``, ``torch.randint``), and a model whose forward draws a LayerDrop number
that changes nothing (BART's ``torch.rand([])`` against a layerdrop of 0). Every rank seeded alike (Accelerate's
``set_seed(seed)``, as diffusers' scripts do) or with its rank. Imported by the throwaway user projects (and, in
their rank processes, through the fork)."""

from __future__ import annotations

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.data import DataLoader, Dataset, DistributedSampler
from torchvision.transforms import v2

N, SIZE, STEPS = 16, 6, 1000


class Images(Dataset):
    """Small images, none symmetric left-right, flipped at random (p = 0.5) on every fetch when ``flip``."""

    def __init__(self, flip: bool = True):
        self.flip = v2.RandomHorizontalFlip(p=0.5) if flip else nn.Identity()

    def __len__(self):
        return N

    def __getitem__(self, i):
        g = torch.Generator().manual_seed(i)
        image = torch.rand(3, SIZE, SIZE, generator=g)
        image[:, :, 0] = 1.0  # a bright left edge: the flip moves it
        return {"pixel_values": self.flip(image)}


class Denoiser(nn.Module):
    def __init__(self, layerdrop_draw: bool = False):
        super().__init__()
        self.conv = nn.Conv2d(3, 3, 3, padding=1)
        self.time = nn.Linear(1, 3)
        self.drop = nn.Dropout(0.1)
        self.layerdrop = 0.0
        self.layerdrop_draw = layerdrop_draw

    def forward(self, x, t):
        if self.training and self.layerdrop_draw:
            # BART's encoder layer loop: a number drawn for every layer, the layer dropped when it is below layerdrop
            if torch.rand([]) < self.layerdrop:
                return x
        return self.drop(self.conv(x)) + self.time(t[:, None].float() / STEPS)[:, :, None, None]


def noise_loss(model, batch):
    """A diffusion step's loss: noise and timesteps drawn from torch's global generator."""
    x = batch["pixel_values"]
    noise = torch.randn_like(x)
    t = torch.randint(0, STEPS, (x.shape[0],))
    alpha = 1 - t.float()[:, None, None, None] / STEPS
    return F.mse_loss(model(alpha.sqrt() * x + (1 - alpha).sqrt() * noise, t), noise)


def noise_loss_logging(model, batch):
    """noise_loss, and a NumPy draw that decides nothing the loss reads (whether to log this step)."""
    import numpy as np

    np.random.rand()
    return noise_loss(model, batch)


def plain_loss(model, batch):
    """A deterministic loss (a fixed timestep, no noise): nothing drawn but what the model draws."""
    x = batch["pixel_values"]
    t = torch.full((x.shape[0],), STEPS // 2)
    return F.mse_loss(model(x, t), x)


def make_training():
    model = Denoiser()
    return {"model": model, "optimizer": torch.optim.AdamW(model.parameters(), lr=1e-2)}


def make_training_layerdrop():
    model = Denoiser(layerdrop_draw=True)
    return {"model": model, "optimizer": torch.optim.AdamW(model.parameters(), lr=1e-2)}


class OwnFlipImages(Images):
    """The same images flipped at random (p = 0.5) with a generator of the dataset's own: a ``torch.Generator`` or a
    NumPy ``Generator`` (as albumentations 2.x's ``A.Compose`` holds), which no global seeding reaches."""

    def __init__(self, gen):
        super().__init__(flip=False)
        self.gen = gen

    def __getitem__(self, i):
        image = super().__getitem__(i)["pixel_values"]
        if isinstance(self.gen, torch.Generator):
            flip = bool(torch.rand((), generator=self.gen) < 0.5)
        else:
            flip = bool(self.gen.random() < 0.5)
        return {"pixel_values": image.flip(-1) if flip else image}


#: built at import, in the pytest process, from the OS: each process of a real launch builds its own (different on
#: every rank); the forked ranks inherit this one
INHERITED = OwnFlipImages(np.random.default_rng())


def wrap_ddp(state):
    model = nn.parallel.DistributedDataParallel(state["model"])
    return {"model": model, "optimizer": torch.optim.AdamW(model.parameters(), lr=1e-2)}


def seed_alike(rank, world_size):
    """Buggy: diffusers' set_seed(args.seed) in every process (not device_specific)."""
    from accelerate.utils import set_seed

    set_seed(42)


def seed_with_rank(rank, world_size):
    """Correct: the seed differs per process (DDP broadcasts rank 0's initial weights)."""
    from accelerate.utils import set_seed

    set_seed(42 + rank)


def seed_numpy_alike_torch_apart(rank, world_size):
    """Python's and NumPy's generators seeded alike, torch's with the rank: only torch's draws reach the loss."""
    import random

    import numpy as np

    random.seed(42)
    np.random.seed(42)
    torch.manual_seed(42 + rank)


def flip_loader():
    data = Images()
    return DataLoader(data, batch_size=2, sampler=DistributedSampler(data, shuffle=True, seed=0))


def own_seeded_loader():
    """Buggy: every rank builds its dataset with a generator seeded 0: the same flips on every rank."""
    data = OwnFlipImages(torch.Generator().manual_seed(0))
    return DataLoader(data, batch_size=2, sampler=DistributedSampler(data, shuffle=True, seed=0))


def inherited_loader():
    """The module-level dataset (its generator seeded from the OS at import), not built by the rank."""
    return DataLoader(INHERITED, batch_size=2, sampler=DistributedSampler(INHERITED, shuffle=True, seed=0))


def plain_loader():
    data = Images(flip=False)
    return DataLoader(data, batch_size=2, sampler=DistributedSampler(data, shuffle=True, seed=0))


def set_epoch(state, loader, epoch):
    loader.sampler.set_epoch(epoch)


def _step(loss_of):
    def step(state, batch, index):
        model, opt = state["model"], state["optimizer"]
        model.train()
        loss = loss_of(model, batch)
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        return loss.detach()

    return step


noise_step = _step(noise_loss)
noise_step_logging = _step(noise_loss_logging)
plain_step = _step(plain_loss)


def project(setup="seed_alike", loader="flip_loader", step="noise_step", loss="noise_loss", training="make_training"):
    parts = {
        "dist_setup": setup,
        "dist_wrap": "wrap_ddp",
        "make_dataloader": loader,
        "start_epoch": "set_epoch",
        "train_step": step,
        "compute_loss": loss,
        "make_training": training,
    }
    src = ["import pytest", "import tiny_d4 as t4", ""]
    for role, fn in parts.items():
        src += ["@pytest.fixture(scope='session')", f"def dlcheck_{role}():", f"    return t4.{fn}", ""]
    return "\n".join(src)
