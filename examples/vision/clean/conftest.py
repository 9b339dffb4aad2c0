"""A ResNet-18 trained on the shapes dataset, configured correctly: pixels scaled to [0, 1] and normalised
with the same ImageNet statistics in train and eval, a deterministic eval transform, 0-based labels,
a batch of 16, and an evaluation loop that switches the model to eval mode.

    pytest --dlcheck=vision examples/vision        # every vision check passes here (or skips: no boxes/masks)
"""

import pytest
import shapes
import torch
from torch.utils.data import DataLoader
from torchvision.models import resnet18
from torchvision.transforms import v2 as T

train_tf = T.Compose(
    [
        T.ToImage(),
        T.RandomResizedCrop(64, scale=(0.6, 1.0)),
        T.RandomHorizontalFlip(),
        T.ToDtype(torch.float32, scale=True),
        T.Normalize(shapes.MEAN, shapes.STD),
    ]
)
eval_tf = T.Compose(
    [
        T.ToImage(),
        T.Resize(72),
        T.CenterCrop(64),
        T.ToDtype(torch.float32, scale=True),
        T.Normalize(shapes.MEAN, shapes.STD),
    ]
)


@pytest.fixture(scope="session")
def dlcheck_model():
    return resnet18(weights=None, num_classes=len(shapes.CLASSES))


@pytest.fixture(scope="session")
def dlcheck_dataloader():
    return DataLoader(shapes.Shapes("train", transform=train_tf), batch_size=16, shuffle=True)


@pytest.fixture(scope="session")
def dlcheck_eval_dataloader():
    return DataLoader(shapes.Shapes("val", size=24, transform=eval_tf), batch_size=16)


@pytest.fixture(scope="session")
def dlcheck_loss_fn():
    return torch.nn.CrossEntropyLoss()


@pytest.fixture(scope="session")
def dlcheck_eval_fn():
    return shapes.accuracy
