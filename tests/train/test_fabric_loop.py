"""A plain loop written with Lightning Fabric (examples/fabric/image_classifier/train_fabric.py): the model and the
optimizer come out of ``fabric.setup`` as ``_FabricModule`` / ``_FabricOptimizer``, which forward attribute reads
and writes to what they wrap. The checks' stand-in for the model's forward (T1, T2, the shared step probe) landed on
the wrapped module and recursed through the wrapper (a RecursionError blamed on the user's loss), and the copy of the
optimizer T2 trains with recursed in the wrapper's ``__getattr__`` (an internal error)."""

PROJECT = """
import pytest, torch
import torch.nn as nn
import torch.nn.functional as F
from lightning.fabric import Fabric
from torch.utils.data import DataLoader, TensorDataset

FABRIC = Fabric(accelerator="cpu", devices=1)


def data(n=64, seed=0):
    g = torch.Generator().manual_seed(seed)
    y = torch.randint(0, 10, (n,), generator=g)
    return TensorDataset(torch.randn(n, 1, 12, 12, generator=g) + y[:, None, None, None] / 3.0, y)


@pytest.fixture(scope="session")
def dlcheck_make_training():
    def make():
        FABRIC.seed_everything(1)
        model = nn.Sequential(nn.Conv2d(1, 4, 3), nn.ReLU(), nn.Flatten(), nn.Dropout(0.25), nn.Linear(400, 10),
                              nn.LogSoftmax(dim=1))
        optimizer = torch.optim.Adadelta(model.parameters(), lr=1.0)
        model, optimizer = FABRIC.setup(model, optimizer)
        sched = torch.optim.lr_scheduler.StepLR(optimizer, step_size=1, gamma=0.7)
        return {"model": model, "optimizer": optimizer, "lr_scheduler": sched, "fabric": FABRIC}
    return make


@pytest.fixture(scope="session")
def dlcheck_dataloader():
    return FABRIC.setup_dataloaders(DataLoader(data(), batch_size=16, shuffle=True))


@pytest.fixture(scope="session")
def dlcheck_train_step():
    def step(state, batch, index):
        x, y = batch
        state["optimizer"].zero_grad()
        loss = F.nll_loss(state["model"](x), y)
        state["fabric"].backward(loss)
        state["optimizer"].step()
        return loss
    return step


@pytest.fixture(scope="session")
def dlcheck_compute_loss():
    def loss(model, batch):
        x, y = batch
        return F.nll_loss(model(x), y)
    return loss
"""


def test_a_fabric_loop_is_judged_without_recursing_through_its_wrappers(project):
    project.conftest(PROJECT)
    run = project.run("--dlcheck=T1,T2,T3,T5", "-rA")
    assert "RecursionError" not in run.text and "internal error" not in run.text, run.text
    for cid in ("T1", "T3", "T5"):
        run.assert_outcome(cid, "passed")
    assert run.outcome("T2") in ("passed", "skipped"), run.text
