"""T4 on a model Lightning Fabric wrapped (a _FabricModule, whose forward takes *args, **kwargs) around a forward of
two required inputs, called by the loss as model(input, target) (Lightning's examples/fabric/language_model, found
blind, set 16): T4 had read the wrapper's forward as taking one input, called model(x) and raised an internal error
(missing 'target'). The wrapped module's forward is read now: the batch's two elements are its two inputs, T4 says
what it judged or why it did not, and never raises; a model that mixes the batch is still failed."""

import pytest

CONFTEST = """
import pytest, torch
import torch.nn as nn
import torch.nn.functional as F
from lightning.fabric import Fabric
from torch.utils.data import DataLoader, TensorDataset

V, T = 17, 6


class LM(nn.Module):
    def __init__(self, mix):
        super().__init__()
        self.mix = mix
        self.embed = nn.Embedding(V, 8)
        self.out = nn.Linear(8, V)

    def forward(self, input, target):  # the target decides the output length, as a seq2seq decoder's does
        h = self.embed(input)
        if self.mix:
            h = h + h.mean(dim=0, keepdim=True)  # examples see each other
        return self.out(h[:, : target.shape[1]])


def make():
    fabric = Fabric(accelerator="cpu", devices=1)
    torch.manual_seed(0)
    model = LM({mix})
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    model, optimizer = fabric.setup(model, optimizer)
    return {{"model": model, "optimizer": optimizer, "fabric": fabric}}


def loss(model, batch):
    x, y = batch
    return F.cross_entropy(model(x, y).flatten(0, 1), y.flatten())


@pytest.fixture(scope="session")
def dlcheck_make_training():
    return make


@pytest.fixture(scope="session")
def dlcheck_compute_loss():
    return loss


@pytest.fixture(scope="session")
def dlcheck_dataloader():
    g = torch.Generator().manual_seed(0)
    x = torch.randint(0, V, (16, T), generator=g)
    return DataLoader(TensorDataset(x, x.roll(-1, dims=1)), batch_size=4)
"""


@pytest.mark.parametrize("mix", [False, True], ids=["independent", "mixed"])
def test_a_fabric_wrapped_two_input_forward(project, mix):
    project.conftest(CONFTEST.format(mix=mix))
    run = project.run("--dlcheck=T4", "-rA")
    assert "internal error" not in run.text and "missing 1 required positional argument" not in run.text
    run.assert_outcome("T4", "failed" if mix else "passed")
