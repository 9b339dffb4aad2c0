"""A plain loop written with Lightning Fabric, launched as `fabric run --strategy=ddp --devices=2` runs it: the
factory's Fabric() reads the LT_* variables `fabric run` exports and joins the launch's process group, and
fabric.setup wraps the model in DistributedDataParallel inside a _FabricModule. D2's single-process reference builds
the same factory in one process (a _FabricModule without DDP): its parameters are named as the ranks name them
(the module inside the wrapper), not '_forward_module.…' (D2 had skipped 'the gradients are zero or not finite',
found blind on Lightning's examples/fabric/image_classifier/train_fabric.py)."""

import multiprocessing
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))

PROJECT = """
import os, pytest, torch
import torch.nn as nn
import torch.nn.functional as F
from lightning.fabric import Fabric
from torch.utils.data import DataLoader, TensorDataset


def data():
    g = torch.Generator().manual_seed(0)
    y = torch.randint(0, 4, (16,), generator=g)
    return TensorDataset(torch.randn(16, 6, generator=g) + y[:, None], y)


def make():
    fabric = Fabric(accelerator="cpu")
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(6, 8), nn.ReLU(), nn.Linear(8, 4))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    model, optimizer = fabric.setup(model, optimizer)
    return {"model": model, "optimizer": optimizer, "fabric": fabric}


def step(state, batch, index):
    x, y = batch
    state["optimizer"].zero_grad()
    loss = F.cross_entropy(state["model"](x), y)
    state["fabric"].backward(loss)
    state["optimizer"].step()
    return loss


@pytest.fixture(scope="session")
def dlcheck_make_training():
    return make


@pytest.fixture(scope="session")
def dlcheck_train_step():
    return step


@pytest.fixture(scope="session")
def dlcheck_compute_loss():
    return lambda model, batch: F.cross_entropy(model(batch[0]), batch[1])


@pytest.fixture(scope="session")
def dlcheck_dataloader():
    return DataLoader(data(), batch_size=4)


@pytest.fixture(scope="session")
def dlcheck_dist_setup():
    def setup(rank, world_size):  # what `fabric run --accelerator=cpu --strategy=ddp --devices=N` exports
        os.environ.update(LT_CLI_USED="1", LT_ACCELERATOR="cpu", LT_STRATEGY="ddp", LT_DEVICES=str(world_size),
                          LT_NUM_NODES="1")
    return setup


@pytest.fixture(scope="session")
def dlcheck_dist_wrap():
    return lambda state: state  # fabric.setup in the factory wraps the model in DDP


@pytest.fixture(scope="session")
def dlcheck_make_dataloader():
    return lambda: Fabric(accelerator="cpu").setup_dataloaders(DataLoader(data(), batch_size=4, shuffle=True))
"""


def test_a_fabric_ddp_loop_has_its_step_compared_with_one_process(project):
    project.conftest(PROJECT)
    run = project.run("--dlcheck=D1,D2", "-rA")
    assert "internal error" not in run.text, run.text
    run.assert_outcome("D1", "passed")
    run.assert_outcome("D2", "passed")
    assert multiprocessing.active_children() == [], multiprocessing.active_children()
