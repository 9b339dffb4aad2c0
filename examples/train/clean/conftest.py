"""A clean plain PyTorch loop: a factory of fresh training objects, the step, the data, and the
checkpoint functions. pytest-dlcheck trains only fresh objects from the factory."""

import pytest
import tinytrain
import torch


@pytest.fixture(scope="session")
def dlcheck_make_training():
    def make():
        model = tinytrain.MLP()
        optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2)
        scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, tinytrain.warmup(3))
        return {"model": model, "optimizer": optimizer, "lr_scheduler": scheduler}

    return make


@pytest.fixture(scope="session")
def dlcheck_train_step():
    return tinytrain.train_step


@pytest.fixture(scope="session")
def dlcheck_loss_fn():
    return torch.nn.CrossEntropyLoss()


@pytest.fixture(scope="session")
def dlcheck_dataloader():
    return tinytrain.train_loader(tinytrain.blobs(seed=0))


@pytest.fixture(scope="session")
def dlcheck_eval_dataloader():
    return tinytrain.eval_loader(tinytrain.blobs(32, seed=1))


@pytest.fixture(scope="session")
def dlcheck_save_checkpoint():
    return tinytrain.save_checkpoint


@pytest.fixture(scope="session")
def dlcheck_load_checkpoint():
    return tinytrain.load_checkpoint
