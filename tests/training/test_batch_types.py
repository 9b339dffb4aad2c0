"""A batch keeps its type on its way to the user's step, loss or model: a transformers ``BatchEncoding`` and a
custom batch class reach ``dlcheck_train_step`` / ``dlcheck_compute_loss`` as what the user's dataloader
yields (a step that reads ``batch.x`` or checks ``isinstance(batch, BatchEncoding)`` works on them), moved to
the model's device by their own ``.to()``."""

from __future__ import annotations

import dataclasses
import sys
from pathlib import Path

import pytest
import torch
from transformers import BatchEncoding

from pytest_dlcheck.training.runs import to_device

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "train"))
import tiny_train  # noqa: E402,F401  (the throwaway projects import it)

LOOP = """
    import pytest, torch, tiny_train as tt
    from torch.utils.data import DataLoader
    from transformers import BatchEncoding

    class Batch:
        '''The user's own batch class: attributes, moved by its own .to()'''

        def __init__(self, x, y):
            self.x, self.y = x, y

        def to(self, device):
            return Batch(self.x.to(device), self.y.to(device))

    KIND = {kind!r}
    EXPECTED = Batch if KIND == "custom" else BatchEncoding

    def collate(rows):
        x, y = torch.stack([r[0] for r in rows]), torch.stack([r[1] for r in rows])
        return Batch(x, y) if KIND == "custom" else BatchEncoding({{"x": x, "labels": y}})

    def parts(batch):
        assert type(batch) is EXPECTED, f"got a {{type(batch).__name__}}, not the {{EXPECTED.__name__}} the loader yields"
        return (batch.x, batch.y) if KIND == "custom" else (batch["x"], batch["labels"])

    @pytest.fixture(scope="session")
    def dlcheck_make_training():
        def make():
            model = tt.MLP()
            return {{"model": model, "optimizer": torch.optim.AdamW(model.parameters(), lr=1e-2)}}
        return make

    @pytest.fixture(scope="session")
    def dlcheck_dataloader():
        return DataLoader(tt.blobs(), batch_size=8, collate_fn=collate)

    @pytest.fixture(scope="session")
    def dlcheck_compute_loss():
        def loss(model, batch):
            x, y = parts(batch)
            return torch.nn.functional.cross_entropy(model(x), y)
        return loss

    @pytest.fixture(scope="session")
    def dlcheck_train_step():
        def step(state, batch):
            x, y = parts(batch)
            loss = torch.nn.functional.cross_entropy(state["model"](x), y)
            loss.backward()
            state["optimizer"].step()
            state["optimizer"].zero_grad()
            return loss.item()
        return step
"""


@pytest.mark.parametrize("kind", ["custom", "batch_encoding"])
def test_the_users_step_and_loss_get_the_batch_type_the_loader_yields(project, kind):
    project.conftest(LOOP.format(kind=kind))
    run = project.run("--dlcheck=T3,T5,S1")
    assert "got a " not in run.text, run.text
    for cid in ("T3", "T5", "S1"):
        run.assert_outcome(cid, "passed")


class Batch:
    def __init__(self, x: torch.Tensor):
        self.x = x
        self.moved_by_own_to = False

    def to(self, device):
        out = Batch(self.x.to(device))
        out.moved_by_own_to = True
        return out


@dataclasses.dataclass(frozen=True)
class Frozen:
    x: torch.Tensor
    n: int = 3


def test_a_moved_batch_keeps_its_type_and_the_shared_one_stays_put():
    """The 'meta' device stands for another device than the batch's (no accelerator needed)."""
    enc = BatchEncoding({"input_ids": torch.ones(2, 3, dtype=torch.long)})
    moved = to_device(enc, "meta")
    assert type(moved) is BatchEncoding and moved["input_ids"].is_meta
    assert enc["input_ids"].device.type == "cpu"  # BatchEncoding.to moves in place: a copy was moved
    assert to_device(enc, "cpu") is enc  # nothing to move: the same object

    own = to_device(Batch(torch.ones(2)), "meta")
    assert type(own) is Batch and own.moved_by_own_to and own.x.is_meta

    frozen = to_device(Frozen(torch.ones(2)), "meta")
    assert type(frozen) is Frozen and frozen.x.is_meta and frozen.n == 3

    Pair = __import__("collections").namedtuple("Pair", "inputs targets")
    pair = to_device(Pair(torch.ones(2), torch.zeros(2)), "meta")
    assert type(pair) is Pair and pair.targets.is_meta

    nested = to_device({"enc": enc, "extra": [torch.ones(1)]}, "meta")
    assert type(nested["enc"]) is BatchEncoding and nested["enc"]["input_ids"].is_meta and nested["extra"][0].is_meta


def test_a_sampled_batch_keeps_its_type_and_is_the_checks_own_copy():
    """The shared sample keeps the collator's batch type (the diffusion domain hands sampled batches to the
    user's dlcheck_training_inputs); a field a check sets does not reach the user's object."""
    from pytest_dlcheck.sampling import as_batch_dict

    enc = BatchEncoding({"input_ids": torch.ones(2, 3, dtype=torch.long)})
    got = as_batch_dict(enc, "collator")
    assert type(got) is BatchEncoding and got is not enc
    got["labels"] = torch.zeros(2, 3)
    assert "labels" not in enc
    plain = {"input_ids": torch.ones(1)}
    again = as_batch_dict(plain, "dataloader")
    assert type(again) is dict and again is not plain
