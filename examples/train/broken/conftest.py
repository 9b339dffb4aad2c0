"""The same loop with five silent bugs pytest-dlcheck catches:
- the head is replaced after the optimizer was built: the optimizer never updates it (T3);
- the LR scheduler is stepped every micro-batch under gradient accumulation: warmup and decay run 2x
  too fast (T6);
- the eval data is a slice of the training data (T8);
- the checkpoint holds no scheduler state: a resumed run restarts the warmup (C1);
- torch.save writes straight onto the previous checkpoint: a crash mid-save loses both (C2)."""

import pytest
import tinytrain
import torch
from torch.nn import functional as F


@pytest.fixture(scope="session")
def dlcheck_make_training():
    def make():
        model = tinytrain.MLP(classes=10)
        optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2)
        model.head = torch.nn.Linear(32, 4)  # the task has 4 classes: a new head, after the optimizer
        scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, tinytrain.warmup(3))
        return {"model": model, "optimizer": optimizer, "lr_scheduler": scheduler}

    return make


@pytest.fixture(scope="session")
def dlcheck_train_step():
    def step(state, batch, index):
        x, y = batch
        loss = F.cross_entropy(state["model"](x), y)
        (loss / tinytrain.ACCUMULATION).backward()
        if (index + 1) % tinytrain.ACCUMULATION == 0:
            state["optimizer"].step()
            state["optimizer"].zero_grad()
        state["lr_scheduler"].step()
        return loss

    return step


@pytest.fixture(scope="session")
def dlcheck_loss_fn():
    return torch.nn.CrossEntropyLoss()


@pytest.fixture(scope="session")
def train_data():
    return tinytrain.blobs(seed=0)


@pytest.fixture(scope="session")
def dlcheck_dataloader(train_data):
    return tinytrain.train_loader(train_data)


@pytest.fixture(scope="session")
def dlcheck_eval_dataloader(train_data):
    return tinytrain.eval_loader(tinytrain.held_out(train_data, 16))


@pytest.fixture(scope="session")
def dlcheck_save_checkpoint():
    def save(state, path):
        torch.save(
            {
                "model": state["model"].state_dict(),
                "optimizer": state["optimizer"].state_dict(),
                "rng": torch.random.get_rng_state(),
            },
            path,
        )

    return save


@pytest.fixture(scope="session")
def dlcheck_load_checkpoint():
    def load(state, path):
        ckpt = torch.load(path, weights_only=False)
        state["model"].load_state_dict(ckpt["model"])
        state["optimizer"].load_state_dict(ckpt["optimizer"])
        torch.random.set_rng_state(ckpt["rng"])

    return load
