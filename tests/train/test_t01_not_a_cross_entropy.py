"""T1 on the hard integer-target path reads what the user's loss is (found blind, set 13).

torchvision's references/similarity trains an embedding network (a 128-d, L2-normalised output) with a batch-all
triplet margin loss on (images, class ids) batches: T1 took the embedding width for 128 classes and passed
"0.1391 = 0.03 x ln(128)". The user's loss is replayed on outputs put in place of the model's: a triplet loss is no
cross-entropy of the output, so ln(C) does not apply; the same network trained with a cross-entropy is judged, and
one started far too large still fails.

Lightning's domain_templates/imagenet.py calls ``self.model(images)`` in its training_step (not ``self(x)``), then
updates torchmetrics' Accuracy: T1 asked for dlcheck_num_classes. The step's output is read from the child it
calls."""

import lightning.pytorch  # noqa: F401  (imported once, outside the in-process runs)
import tiny_lightning  # noqa: F401
import tiny_train as tt
import torch
import torchmetrics  # noqa: F401

torch.set_num_threads(1)

EMBEDDING = """
    import pytest, torch
    from torch import nn
    import torch.nn.functional as F
    from torch.utils.data import DataLoader, TensorDataset

    class EmbeddingNet(nn.Module):
        def __init__(self, dim=16, scale=1.0):
            super().__init__()
            self.body = nn.Sequential(nn.Conv2d(1, 8, 3, padding=1), nn.BatchNorm2d(8), nn.ReLU(),
                                      nn.AdaptiveAvgPool2d(2), nn.Flatten())
            self.fc = nn.Linear(32, dim)
            with torch.no_grad():
                self.fc.weight.mul_(scale)
            self.normalise = {normalise}

        def forward(self, x):
            x = self.fc(self.body(x))
            return F.normalize(x, dim=1) if self.normalise else x

    def batch_all_triplet_loss(embeddings, labels, margin=0.2):
        d = torch.cdist(embeddings, embeddings)
        loss = d.unsqueeze(2) - d.unsqueeze(1) + margin
        eye = torch.eye(labels.size(0), dtype=torch.bool)
        distinct = ~eye.unsqueeze(2) & ~eye.unsqueeze(1) & ~eye.unsqueeze(0)
        same = labels.unsqueeze(0) == labels.unsqueeze(1)
        mask = distinct & same.unsqueeze(2) & ~same.unsqueeze(1)
        loss = (mask.float() * loss).clamp_min(0)
        return loss.sum() / ((loss > 1e-16).sum() + 1e-16)

    @pytest.fixture(scope="session")
    def dlcheck_make_training():
        def make():
            torch.manual_seed(0)
            model = EmbeddingNet({args})
            return {{"model": model, "optimizer": torch.optim.Adam(model.parameters(), lr=1e-4)}}
        return make

    @pytest.fixture(scope="session")
    def dlcheck_dataloader():  # P x K batches: 4 classes, 4 images each
        g = torch.Generator().manual_seed(0)
        y = torch.arange(64) % 4
        x = torch.rand(64, 1, 12, 12, generator=g) + y.view(-1, 1, 1, 1) * 0.3
        return DataLoader(TensorDataset(x, y), batch_size=16)

    @pytest.fixture(scope="session")
    def dlcheck_compute_loss():
        def compute(model, batch):
            x, y = batch
            {loss}
        return compute
"""

TRIPLET = "return batch_all_triplet_loss(model(x), y)"


def conftest(loss: str, args: str = "", normalise: bool = True) -> str:
    return EMBEDDING.format(loss=loss, args=args, normalise=normalise)


def test_a_triplet_loss_on_embeddings_is_not_a_cross_entropy(project):
    project.conftest(conftest(TRIPLET))
    run = project.run("--dlcheck=T1", "-rs")
    run.assert_outcome("T1", "skipped")
    text = " ".join(run.text.split())
    assert "not applicable: not a cross-entropy over classes: ln(C) does not apply: dlcheck_compute_loss replayed" in (
        text
    ), text
    assert "outputs put in place of the model's output (16x16)" in text, text
    assert "neither its values nor its gradients are those of a cross-entropy" in text, text


def test_the_same_network_under_a_cross_entropy_is_judged(project):
    project.conftest(conftest("return F.cross_entropy(model(x), y)", args="dim=4", normalise=False))
    run = project.run("--dlcheck=T1", "-rA")
    run.assert_outcome("T1", "passed")
    text = " ".join(run.text.split())
    assert "x ln(4) = 1.386" in text, text
    assert "its values and gradients are those of a cross-entropy of the output read as logits" in text, text


def test_a_cross_entropy_started_far_too_large_still_fails(project):
    # the buggy twin: the head's weights x 300, read by the user's own cross-entropy
    project.conftest(conftest("return F.cross_entropy(model(x), y)", args="dim=4, scale=300.0", normalise=False))
    run = project.run("--dlcheck=T1")
    run.assert_outcome("T1", "failed")
    text = tt.section(run, "T1")
    assert "x ln(4) = 1.386" in text and "logits are far too large" in text, text


def test_a_summed_cross_entropy_in_the_user_s_loss_still_fails(project):
    project.conftest(conftest("return F.cross_entropy(model(x), y, reduction='sum')", args="dim=4", normalise=False))
    run = project.run("--dlcheck=T1")
    run.assert_outcome("T1", "failed")
    text = tt.section(run, "T1")
    assert "summed over the batch" in text and "16 x a cross-entropy" in text, text


def test_weighted_smoothed_and_log_probability_cross_entropies_are_cross_entropies(project):
    for loss in (
        "return F.cross_entropy(model(x), y, weight=torch.tensor([1.0, 2.0, 3.0, 4.0]), label_smoothing=0.1)",
        "return F.nll_loss(F.log_softmax(model(x), -1), y)",
    ):
        project.conftest(conftest(loss, args="dim=4", normalise=False))
        run = project.run("--dlcheck=T1", "-rA")
        run.assert_outcome("T1", "passed")
        assert "are those of a cross-entropy of the output" in " ".join(run.text.split()), run.text


LIGHTNING = """
    import pytest, torch, tiny_lightning as tl, tiny_train as tt
    import lightning.pytorch as pl
    import torch.nn.functional as F
    from torchmetrics import Accuracy

    class ImageNetStyle(pl.LightningModule):
        # Lightning's domain_templates/imagenet.py: training_step calls self.model, then updates its metrics
        def __init__(self, scale):
            super().__init__()
            self.model = tt.MLP()
            with torch.no_grad():
                self.model.head.weight.mul_(scale)
            self.train_acc1 = Accuracy(task="multiclass", num_classes=4, top_k=1)
            self.train_acc5 = Accuracy(task="multiclass", num_classes=4, top_k=2)

        def forward(self, x):
            return self.model(x)

        def training_step(self, batch, batch_idx):
            images, target = batch
            output = self.model(images)
            loss_train = {loss}
            self.log("train_loss", loss_train)
            self.train_acc1(output, target)
            self.train_acc5(output, target)
            self.log("train_acc1", self.train_acc1, prog_bar=True)
            return loss_train

        def configure_optimizers(self):
            return torch.optim.SGD(self.parameters(), lr=0.1, momentum=0.9)

    @pytest.fixture(scope="session")
    def dlcheck_lightning_module():
        torch.manual_seed(0)
        return ImageNetStyle({scale})

    @pytest.fixture(scope="session")
    def dlcheck_datamodule():
        return tl.Blobs()
"""


def test_a_training_step_calling_its_model_then_its_metrics_tells_the_classes(project):
    project.conftest(LIGHTNING.format(scale=1.0, loss="F.cross_entropy(output, target)"))
    run = project.run("--dlcheck=T1", "-rA")
    run.assert_outcome("T1", "passed")
    text = " ".join(run.text.split())
    assert "x ln(4) = 1.386" in text, text
    assert "ImageNetStyle.training_step replayed on 4 outputs put in place of the output of ImageNetStyle.model" in (
        text
    ), text


def test_its_huge_init_twin_fails(project):
    project.conftest(LIGHTNING.format(scale=200.0, loss="F.cross_entropy(output, target)"))
    run = project.run("--dlcheck=T1")
    run.assert_outcome("T1", "failed")
    assert "ln(4) = 1.386" in tt.section(run, "T1")


def test_its_triplet_twin_is_not_a_cross_entropy(project):
    project.conftest(
        LIGHTNING.format(
            scale=1.0,
            # a contrastive loss on the 4-d output: pulls same-class pairs together, pushes others a margin apart
            loss="((target[:, None] == target[None]).float() * torch.cdist(output, output) ** 2 + "
            "(target[:, None] != target[None]).float() * F.relu(1 - torch.cdist(output, output)) ** 2).mean()",
        )
    )
    run = project.run("--dlcheck=T1", "-rs")
    run.assert_outcome("T1", "skipped")
    assert "not a cross-entropy over classes: ln(C) does not apply" in " ".join(run.text.split()), run.text
