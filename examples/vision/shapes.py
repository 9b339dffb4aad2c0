"""A tiny but real image-classification project: a torchvision dataset of drawn shapes (circle, square,
triangle), a ResNet-18 and an evaluation loop. Stands in for your own project; builds offline in a second."""

import numpy as np
import torch
from PIL import Image, ImageDraw
from torchvision.datasets import VisionDataset

CLASSES = ("circle", "square", "triangle")
MEAN, STD = [0.485, 0.456, 0.406], [0.229, 0.224, 0.225]  # ImageNet statistics


class Shapes(VisionDataset):
    """One coloured shape per 72×72 image on a noisy background; the label is the shape (0, 1, 2)."""

    def __init__(self, split="train", size=48, transform=None, target_transform=None):
        super().__init__(None, transform=transform, target_transform=target_transform)
        self.offset = 0 if split == "train" else 10_000
        self.targets = [i % len(CLASSES) for i in range(size)]

    def __len__(self):
        return len(self.targets)

    def __getitem__(self, index):
        rng = np.random.default_rng(self.offset + index)
        img = Image.fromarray(rng.integers(0, 60, size=(72, 72, 3), dtype=np.uint8), "RGB")
        x, y = (int(v) for v in rng.integers(18, 54, size=2))
        r = int(rng.integers(10, 18))
        colour = tuple(int(c) for c in rng.integers(120, 256, size=3))
        draw = ImageDraw.Draw(img)
        label = self.targets[index]
        if label == 0:
            draw.ellipse((x - r, y - r, x + r, y + r), fill=colour)
        elif label == 1:
            draw.rectangle((x - r, y - r, x + r, y + r), fill=colour)
        else:
            draw.polygon([(x, y - r), (x - r, y + r), (x + r, y + r)], fill=colour)
        if self.transform is not None:
            img = self.transform(img)
        if self.target_transform is not None:
            label = self.target_transform(label)
        return img, label


def accuracy(model, loader):
    """The evaluation loop: accuracy over a loader."""
    model.eval()
    correct = total = 0
    with torch.no_grad():
        for images, labels in loader:
            correct += (model(images).argmax(1) == labels).sum().item()
            total += len(labels)
    model.train()
    return correct / max(total, 1)
