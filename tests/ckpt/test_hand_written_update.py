"""A plain loop with no optimizer object: the step updates the weights itself, as pytorch/examples'
word_language_model does (``p.data.add_(p.grad, alpha=-lr)``) with an LR annealed by the loop. Every micro-step
is an update, so C1 saves after one and resumes: a checkpoint of the weights alone loses the annealed LR (C1 fails),
one that keeps the LR resumes exactly (C1 passes). Before, C1 skipped such a loop saying no optimizer step happened
"above your gradient accumulation", which it does not have."""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "train"))
import tiny_train as tt  # noqa: E402
from helpers import role_fixtures  # noqa: E402

CONFTEST = """
    import pytest, torch
    from torch import nn
    from torch.utils.data import DataLoader, TensorDataset

    torch.set_num_threads(1)
    DATA = TensorDataset(torch.randn(32, 4, generator=torch.Generator().manual_seed(0)), torch.arange(32) % 2)

    def make():
        torch.manual_seed(0)
        return {{"model": nn.Linear(4, 2), "lr": 0.5, "step": 0}}

    def step(state, batch):
        x, y = batch
        model = state["model"]
        model.zero_grad()
        loss = nn.functional.cross_entropy(model(x), y)
        loss.backward()
        for p in model.parameters():
            p.data.add_(p.grad, alpha=-state["lr"])
        state["step"] += 1
        if state["step"] % 2 == 0:
            state["lr"] /= 4.0  # the loop anneals the LR
        return loss.detach()

    def save(state, path):
        torch.save({{"model": state["model"].state_dict(), {saved}}}, path)

    def load(state, path):
        ckpt = torch.load(path)
        state["model"].load_state_dict(ckpt["model"])
        {loaded}

{fixtures}
"""


CONFTEST = CONFTEST.replace(
    "{fixtures}",
    role_fixtures(
        make_training="make",
        dataloader="DataLoader(DATA, batch_size=4, shuffle=False)",
        train_step="step",
        save_checkpoint="save",
        load_checkpoint="load",
    ),
)


def test_a_checkpoint_of_the_weights_alone_loses_the_annealed_lr(project):
    project.conftest(CONFTEST.format(saved='"step": state["step"]', loaded='state["step"] = ckpt["step"]'))
    run = project.run("--dlcheck=C1")
    run.assert_outcome("C1", "failed")
    text = tt.section(run, "C1")
    assert "no optimizer step happened" not in text, text
    assert "saved after step" in text, text


def test_a_checkpoint_that_keeps_the_lr_resumes_exactly(project):
    project.conftest(
        CONFTEST.format(
            saved='"step": state["step"], "lr": state["lr"]',
            loaded='state["step"], state["lr"] = ckpt["step"], ckpt["lr"]',
        )
    )
    run = project.run("--dlcheck=C1", "-rA")
    run.assert_outcome("C1", "passed")
