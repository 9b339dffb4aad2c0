"""The same ResNet-18 project with four silent bugs that train without an error message:
- ToDtype(torch.float32) without scale=True: the pixels stay in 0-255 and Normalize makes them ~1000 (V1);
- the eval transform was copied from the train one, RandomResizedCrop included, and the evaluation loop
  never calls model.eval(), so BatchNorm updates its statistics on the eval data (V2);
- labels shifted to 1..3 ("class ids start at 1") for a 3-way head (V3);
- a batch of 2 per device with BatchNorm in training mode (V7).

    pytest --dlcheck=vision examples/vision        # V1, V2, V3 and V7 fail here, with evidence and the fix
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
        T.ToDtype(torch.float32),
        T.Normalize(shapes.MEAN, shapes.STD),
    ]
)
eval_tf = train_tf


def accuracy(model, loader):
    correct = total = 0
    with torch.no_grad():
        for images, labels in loader:
            correct += (model(images).argmax(1) == labels).sum().item()
            total += len(labels)
    return correct / max(total, 1)


@pytest.fixture(scope="session")
def dlcheck_model():
    return resnet18(weights=None, num_classes=len(shapes.CLASSES))


@pytest.fixture(scope="session")
def dlcheck_dataloader():
    data = shapes.Shapes("train", transform=train_tf, target_transform=lambda y: y + 1)
    return DataLoader(data, batch_size=2, shuffle=True)


@pytest.fixture(scope="session")
def dlcheck_eval_dataloader():
    return DataLoader(shapes.Shapes("val", size=24, transform=eval_tf, target_transform=lambda y: y + 1), batch_size=2)


@pytest.fixture(scope="session")
def dlcheck_loss_fn():
    return torch.nn.CrossEntropyLoss()


@pytest.fixture(scope="session")
def dlcheck_eval_fn():
    return accuracy
