"""T11: a freeze that does not take effect (`module.requires_grad = False` is an attribute on a Module)."""

import tiny_train as tt


class Frozen:
    """Model expressions for tt.loop_project: the body frozen by attribute (no effect) or by the method."""

    ATTRIBUTE = "tt.frozen_body(tt.MLP(), by_attribute=True)"
    METHOD = "tt.frozen_body(tt.MLP(), by_attribute=False)"


def test_requires_grad_attribute_on_a_module_freezes_nothing(project):
    project.conftest(tt.loop_project(model=Frozen.ATTRIBUTE))
    run = project.run("--dlcheck=T11")
    run.assert_outcome("T11", "failed")
    text = tt.section(run, "T11")
    assert "body.requires_grad = False is a plain attribute: 2 of its parameter tensors (288 values) still" in text
    assert "body.requires_grad_(False)" in text


def test_requires_grad_method_freezes_and_passes(project):
    project.conftest(tt.loop_project(model=Frozen.METHOD))
    run = project.run("--dlcheck=T11", "-rA")
    run.assert_outcome("T11", "passed")
    run.fnmatch(["*no module of the model of * carries a requires_grad attribute; 2 of 4 parameter tensors require*"])


EVAL_PART = """
import pytest, torch
from torch import nn


class Agent(nn.Module):  # SB3's way: the optimizer kept on the module, a target network left in eval mode
    def __init__(self, target_trains):
        super().__init__()
        self.q = nn.Linear(4, 2)
        self.q_target = nn.Linear(4, 2)
        self.q_target.load_state_dict(self.q.state_dict())
        self.q_target.train(False)
        held = [*self.q.parameters(), *self.q_target.parameters()] if target_trains else self.q.parameters()
        self.optimizer = torch.optim.Adam(held, lr=1e-3)


@pytest.fixture(scope="session")
def dlcheck_model():
    return Agent({target_trains})
"""


def test_a_module_in_eval_mode_is_named_only_when_an_optimizer_trains_it(project):
    # a target network in eval mode that no optimizer holds is not trained: saying "eval() does not freeze it"
    # pointed at a bug TD3 does not have (blind set 10); a module in eval mode that the optimizer steps is named
    project.conftest(EVAL_PART.format(target_trains=False))
    run = project.run("--dlcheck=T11", "-rA")
    run.assert_outcome("T11", "passed")
    assert "eval() does not freeze" not in run.text
    project.conftest(EVAL_PART.format(target_trains=True))
    run = project.run("--dlcheck=T11", "-rA")
    run.assert_outcome("T11", "passed")
    assert "1 submodules in eval mode still have trainable parameters (e.g. q_target): eval() does not freeze them" in (
        " ".join(run.text.split())
    )


BESIDE_THE_MODEL = """
import pytest, torch, tiny_train as tt
from torch import nn
import torch.nn.functional as F


@pytest.fixture(scope="session")
def dlcheck_make_training():
    def make():
        model = tt.MLP()
        perceptual = nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 8))  # a feature net for the loss only
        {freeze}
        return {{"model": model, "perceptual": perceptual,
                 "optimizer": torch.optim.AdamW(model.parameters(), lr=1e-2)}}
    return make


@pytest.fixture(scope="session")
def dlcheck_train_step():
    def step(state, batch):
        x, y = batch
        out = state["model"](x)
        loss = F.cross_entropy(out, y) + 0.1 * state["perceptual"](x).pow(2).mean()
        loss.backward()
        state["optimizer"].step()
        state["optimizer"].zero_grad()
        return loss.detach()
    return step


@pytest.fixture(scope="session")
def dlcheck_dataloader():
    return tt.loader()
"""


def test_a_network_beside_the_model_frozen_by_attribute_fails(project):
    """Found blind (diffusers' train_vqgan.py, set 15): ``timm_model.requires_grad = False`` on the perceptual network
    of the training dict, not on state['model']: T11 had walked the model only and passed."""
    project.conftest(BESIDE_THE_MODEL.format(freeze="perceptual.requires_grad = False"))
    run = project.run("--dlcheck=T11")
    run.assert_outcome("T11", "failed")
    text = tt.section(run, "T11")
    assert "state['perceptual'].requires_grad = False is a plain attribute: 4 of its parameter tensors" in text
    assert "state['perceptual'].requires_grad_(False)" in text


def test_a_network_beside_the_model_frozen_by_the_method_passes(project):
    project.conftest(BESIDE_THE_MODEL.format(freeze="perceptual.requires_grad_(False)"))
    run = project.run("--dlcheck=T11", "-rA")
    run.assert_outcome("T11", "passed")
    text = " ".join(run.text.split())
    assert "requires_grad attribute (nor of the other modules of the training dict: state['perceptual'])" in text
