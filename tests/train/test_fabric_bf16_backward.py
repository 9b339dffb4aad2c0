"""A plain loop written with Lightning Fabric under ``precision="bf16-mixed"`` (a mixed-precision plugin, the default
of some fine-tuning scripts without a GPU): the ``_FabricModule`` hooks every output that requires a gradient, and a
backward not run through ``fabric.backward(loss)`` raises "requires you to call `fabric.backward(loss)`". T2, T3 and T5
(and T4, on the inputs) backpropagate the user's loss themselves and had raised that as an internal error (found blind, set 16: a LoRA
fine-tuning loop on Fabric). They backpropagate as ``fabric.backward`` does on one device: true outcomes, and a layer
cut from the graph still fails T3."""

PROJECT = """
import pytest, torch
import torch.nn as nn
import torch.nn.functional as F
from lightning.fabric import Fabric
from torch.utils.data import DataLoader, TensorDataset

torch.set_num_threads(1)
FABRIC = Fabric(accelerator="cpu", devices=1, precision="bf16-mixed")
DETACH = {detach}


class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.a = nn.Linear(12, 16)
        self.b = nn.Linear(16, 4)

    def forward(self, x):
        h = torch.relu(self.a(x))
        return self.b(h.detach() if DETACH else h)


def data(n=64, seed=0):
    g = torch.Generator().manual_seed(seed)
    y = torch.randint(0, 4, (n,), generator=g)
    return TensorDataset(torch.randn(n, 12, generator=g) + y[:, None] / 2.0, y)


@pytest.fixture(scope="session")
def dlcheck_make_training():
    def make():
        FABRIC.seed_everything(1)
        model = Net()
        optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2)
        model, optimizer = FABRIC.setup(model, optimizer)
        return {{"model": model, "optimizer": optimizer, "fabric": FABRIC}}
    return make


@pytest.fixture(scope="session")
def dlcheck_dataloader():
    return FABRIC.setup_dataloaders(DataLoader(data(), batch_size=16, shuffle=True))


@pytest.fixture(scope="session")
def dlcheck_train_step():
    def step(state, batch, index):
        x, y = batch
        loss = F.cross_entropy(state["model"](x), y)
        state["fabric"].backward(loss)
        state["optimizer"].step()
        state["optimizer"].zero_grad()
        return loss
    return step


@pytest.fixture(scope="session")
def dlcheck_compute_loss():
    def loss(model, batch):
        x, y = batch
        return F.cross_entropy(model(x).float(), y)
    return loss
"""


def test_a_bf16_mixed_fabric_loop_is_judged_by_the_checks_that_backpropagate(project):
    project.conftest(PROJECT.format(detach=False))
    run = project.run("--dlcheck=T2,T3,T4,T5", "-rA")
    assert "internal error" not in run.text and "fabric.backward(loss)" not in run.text, run.text
    for cid in ("T3", "T4", "T5"):
        run.assert_outcome(cid, "passed")
    assert run.outcome("T2") in ("passed", "skipped"), run.text


def test_a_layer_cut_from_the_graph_under_bf16_mixed_fabric_still_fails_t3(project):
    project.conftest(PROJECT.format(detach=True))
    run = project.run("--dlcheck=T3", "-rA")
    assert "internal error" not in run.text, run.text
    run.assert_outcome("T3", "failed")
    assert "a.weight" in run.text, run.text
