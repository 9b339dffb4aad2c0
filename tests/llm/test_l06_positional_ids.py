"""L6 on a hand-written GPT whose forward takes the token ids positionally (``forward(idx, input_pos=None)``, called
``model(idx)`` by its loss) and names no ``input_ids``: the llm checks' shared forward had called it
``model(input_ids=...)``, a call its pipeline never makes, and blamed the TypeError on dlcheck_model (found blind,
set 16: a LoRA fine-tuning script on Lightning Fabric). The shared forward now calls such a model as its pipeline
does, positionally; L6 reports log Z, bare and wrapped by Fabric, before and after the smoke run."""

import re

GPT = """
import pytest, torch
import torch.nn as nn
import torch.nn.functional as F

torch.set_num_threads(1)
VOCAB = 40


class GPT(nn.Module):
    def __init__(self):
        super().__init__()
        self.wte = nn.Embedding(VOCAB, 16)
        self.mix = nn.Linear(16, 16)
        self.lm_head = nn.Linear(16, VOCAB, bias=False)

    def forward(self, idx, input_pos=None):
        h = self.wte(idx)
        h = h + torch.tanh(self.mix(torch.cumsum(h, dim=1) / torch.arange(1, idx.shape[1] + 1)[:, None]))
        return self.lm_head(h)


def rows(n=16, length=12, seed=0):
    g = torch.Generator().manual_seed(seed)
    out = []
    for _ in range(n):
        ids = torch.randint(1, VOCAB, (length,), generator=g)
        labels = ids.clone()
        labels[:4] = -100  # the prompt is not supervised
        out.append({"input_ids": ids, "labels": labels})
    return out


def collate(samples):
    return {k: torch.stack([s[k] for s in samples]) for k in ("input_ids", "labels")}


def loss_of(model, batch):
    logits = model(batch["input_ids"])
    return F.cross_entropy(logits[:, :-1].reshape(-1, VOCAB).float(), batch["labels"][:, 1:].reshape(-1))
"""

ALONE = (
    GPT
    + """

@pytest.fixture(scope="session")
def dlcheck_model():
    torch.manual_seed(0)
    return GPT()


@pytest.fixture(scope="session")
def dlcheck_dataset():
    return rows()


@pytest.fixture(scope="session")
def dlcheck_collator():
    return collate
"""
)

FABRIC = (
    GPT
    + """
from lightning.fabric import Fabric
from torch.utils.data import DataLoader

FABRIC = Fabric(accelerator="cpu", devices=1, precision="bf16-mixed")


@pytest.fixture(scope="session")
def dlcheck_make_training():
    def make():
        FABRIC.seed_everything(1)
        model = GPT()
        optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2)
        model, optimizer = FABRIC.setup(model, optimizer)
        return {"model": model, "optimizer": optimizer, "fabric": FABRIC}
    return make


@pytest.fixture(scope="session")
def dlcheck_dataloader():
    return FABRIC.setup_dataloaders(DataLoader(rows(), batch_size=4, shuffle=True, collate_fn=collate))


@pytest.fixture(scope="session")
def dlcheck_train_step():
    def step(state, batch, index):
        loss = loss_of(state["model"], batch)
        state["fabric"].backward(loss)
        state["optimizer"].step()
        state["optimizer"].zero_grad()
        return loss
    return step


@pytest.fixture(scope="session")
def dlcheck_compute_loss():
    return loss_of
"""
)


def _no_blame(run):
    assert "your role raised" not in run.text and "internal error" not in run.text, run.text
    assert "unexpected keyword argument" not in run.text, run.text


def test_a_model_taking_its_ids_positionally_reports_log_z(project):
    project.conftest(ALONE)
    run = project.run("--dlcheck=L6", "-rA")
    _no_blame(run)
    run.assert_outcome("L6", "skipped")
    text = " ".join(run.text.split())
    assert re.search(r"info: mean log Z [\d.]+ \(range [\d.]+ to [\d.]+, \d+ positions\)", text), text


def test_a_fabric_wrapped_model_taking_its_ids_positionally_reports_the_drift(project):
    project.conftest(FABRIC)
    run = project.run("--dlcheck=L6,S1", "-rA")
    _no_blame(run)
    run.assert_outcome("L6", "skipped")
    text = " ".join(run.text.split())
    assert re.search(r"info: mean log Z [\d.]+ \(range .*?\) at initialisation, [\d.]+ \(range .*?\) after", text), text
