"""The runs of a plain loop and of an Accelerate loop call the user's step with the trained modules in train
mode, as the user's epoch loop sets it (``model.train()`` at the top of each epoch, outside the step): a model
that comes in eval mode (a transformers ``from_pretrained`` model does) trains with its dropout on. A module
nothing optimizes (an EMA, a frozen teacher) keeps its mode. Real objects: torch modules, torch's
AveragedModel, a real Accelerator."""

import pytest
import torch
from torch import nn
from torch.optim.swa_utils import AveragedModel, get_ema_multi_avg_fn
from torch.utils.data import DataLoader, TensorDataset

from pytest_dlcheck.errors import MISSING
from pytest_dlcheck.training.accelerate import AccelerateSetup
from pytest_dlcheck.training.loop import LoopSetup
from pytest_dlcheck.training.runs import Trajectory

torch.set_num_threads(1)


def _make(accelerate: bool):
    def make():
        model = nn.Sequential(nn.Linear(2, 8), nn.Dropout(0.5), nn.Linear(8, 3)).eval()
        critic = nn.Sequential(nn.Linear(3, 1)).eval()  # a second network its own optimizer steps
        teacher = nn.Linear(2, 3).eval().requires_grad_(False)  # frozen, optimized by nothing
        ema = AveragedModel(model, multi_avg_fn=get_ema_multi_avg_fn(0.9)).eval()
        opt = torch.optim.SGD(model.parameters(), lr=0.1)
        critic_opt = torch.optim.SGD(critic.parameters(), lr=0.1)
        state = {"model": model, "optimizer": opt, "critic": critic, "critic_optimizer": critic_opt}
        if accelerate:
            from accelerate import Accelerator

            acc = Accelerator(cpu=True)
            model, opt = acc.prepare(model, opt)
            state.update(model=model, optimizer=opt, accelerator=acc)
        return state | {"teacher": teacher, "ema": ema}

    return make


@pytest.mark.parametrize("kind", [LoopSetup, AccelerateSetup], ids=["loop", "accelerate"])
def test_the_step_runs_with_the_trained_modules_in_train_mode(kind):
    seen = []

    def step(state, batch):
        x, y = batch
        seen.append({k: state[k].training for k in ("model", "critic", "teacher", "ema")})
        seen[-1]["dropout"] = state["model"].get_submodule("1").training
        out = state["model"](x)
        loss = nn.functional.cross_entropy(out, y) + state["critic"](out).mean()
        loss.backward()
        state["optimizer"].step()
        state["critic_optimizer"].step()
        state["optimizer"].zero_grad()
        state["critic_optimizer"].zero_grad()
        return loss

    g = torch.Generator().manual_seed(0)
    loader = DataLoader(TensorDataset(torch.randn(16, 2, generator=g), torch.randint(0, 3, (16,), generator=g)), 8)
    setup = kind(_make(kind is AccelerateSetup), step, MISSING, MISSING, loader, MISSING, MISSING, None)
    state = setup.state()
    assert not state["model"].training  # the factory's model comes in eval mode
    setup.run(state, setup.batches(2), 0, Trajectory())
    assert len(seen) == 2
    for modes in seen:
        assert modes == {"model": True, "critic": True, "teacher": False, "ema": False, "dropout": True}, modes
