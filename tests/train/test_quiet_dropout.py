"""checks/shared/dropout.py: what the comparisons of two gradient computations turn off (T10, D2's reference, the
dist launch's step probe of D4). Stochastic depth draws like dropout: left on, D4 read a torchvision StochasticDepth
(on by default in ConvNeXt, EfficientNet, Swin) as the step's noise drawn alike on every rank (found in review)."""

import torch
from timm.layers import DropPath
from torchvision.ops import StochasticDepth

from pytest_dlcheck.checks.shared.dropout import quiet_dropout, restore_dropout


class Block(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = torch.nn.Linear(4, 4)
        self.drop = torch.nn.Dropout(0.1)
        self.depth = StochasticDepth(0.2, "row")
        self.path = DropPath(0.3)
        self.attention_dropout = 0.25
        self.layerdrop = 0.5
        self.drop_last = True  # not a probability: left alone

    def forward(self, x):
        return x + self.path(self.depth(self.drop(self.fc(x))))


def test_dropout_and_stochastic_depth_are_turned_off_and_put_back():
    model = Block().train()
    x = torch.randn(8, 4)
    changed = quiet_dropout(model)
    assert {(type(o).__name__, a) for o, a, _ in changed} == {
        ("Dropout", "p"),
        ("StochasticDepth", "p"),
        ("DropPath", "drop_prob"),
        ("Block", "attention_dropout"),
        ("Block", "layerdrop"),
    }
    torch.manual_seed(0)
    a = model(x)
    torch.manual_seed(1)
    assert torch.equal(a, model(x))  # nothing random left in the forward
    restore_dropout(changed)
    assert (model.drop.p, model.depth.p, model.path.drop_prob, model.layerdrop) == (0.1, 0.2, 0.3, 0.5)
    assert model.drop_last is True
