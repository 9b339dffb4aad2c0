"""The vlm checks on a pipeline that has no vision-language side at all (blind set 12's graph network: a plain loop
whose batches are node features and an adjacency matrix, no tokenizer, no images): not applicable, saying so,
never "missing role: dlcheck_towers / dlcheck_tokenizer"; a custom vision-language model whose towers are not found
by name still asks for dlcheck_towers."""

import re

import torch  # noqa: F401  (imported outside the in-process run)

GRAPH = """
import pytest, torch
from torch import nn
from torch.utils.data import DataLoader

class GraphConv(nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = nn.Linear(8, 3)

    def forward(self, input_tensor, adj_mat):
        return torch.log_softmax(adj_mat @ self.lin(input_tensor), dim=-1)

g = torch.Generator().manual_seed(0)
GRAPH = {"features": torch.randn(10, 8, generator=g), "adj_mat": (torch.rand(10, 10, generator=g) > 0.5).float(),
         "labels": torch.randint(0, 3, (10,), generator=g), "mask": torch.arange(6)}

@pytest.fixture(scope="session")
def dlcheck_model():
    return GraphConv()

@pytest.fixture(scope="session")
def dlcheck_dataloader():
    return DataLoader([GRAPH], batch_size=None)  # the whole graph, once per epoch
"""

CUSTOM_VLM = """
import pytest, torch
from torch import nn
from torch.utils.data import DataLoader

class Captioner(nn.Module):  # a vision-language model whose towers have names no rule knows
    def __init__(self):
        super().__init__()
        self.eye = nn.Conv2d(3, 8, 4, stride=4)
        self.bridge = nn.Linear(8, 16)
        self.words = nn.Embedding(50, 16)
        self.head = nn.Linear(16, 50)

    def forward(self, pixel_values, input_ids):
        img = self.bridge(self.eye(pixel_values).flatten(2).transpose(1, 2))
        return self.head(torch.cat([img, self.words(input_ids)], dim=1))

g = torch.Generator().manual_seed(0)
ROWS = [{"pixel_values": torch.randn(3, 8, 8, generator=g), "input_ids": torch.randint(0, 50, (6,), generator=g)}
        for _ in range(8)]

@pytest.fixture(scope="session")
def dlcheck_model():
    return Captioner()

@pytest.fixture(scope="session")
def dlcheck_dataloader():
    return DataLoader(ROWS, batch_size=4)
"""


def test_a_graph_network_is_no_vision_language_pipeline(project):
    project.conftest(GRAPH, path="graph/conftest.py")
    project.conftest(CUSTOM_VLM, path="vlm/conftest.py")
    run = project.run("--dlcheck=X1,X2,X3,X4,X5", "-rs")
    skips = re.findall(r"^SKIPPED \[\d+\] (\w+)/conftest\.py::(X\d)_\w+: (.*)$", run.text, re.M)
    graph = {cid: reason for d, cid, reason in skips if d == "graph"}
    assert set(graph) == {"X1", "X2", "X3", "X4", "X5"}, run.text
    for reason in graph.values():
        assert reason.startswith(
            "not applicable: the sampled batches (1 batches of dlcheck_dataloader) carry neither token ids nor "
            "images, and no processor is given: their tensors are float features of fewer than 4 dimensions and "
            "1-d integer fields ({features: float32 (10, 8), adj_mat: float32 (10, 10), labels: int64 (10,), "
            "mask: int64 (6,)}): no text for image features to join and no image for a vision tower"
        ), run.text
    custom = {cid: reason for d, cid, reason in skips if d == "vlm"}
    assert custom["X1"].startswith("missing role: define fixture dlcheck_towers"), run.text
    assert custom["X4"].startswith("missing role: define fixture dlcheck_tokenizer"), run.text
    assert not any(r.startswith("not applicable") for r in custom.values()), run.text
