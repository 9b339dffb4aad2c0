"""Lightning's domain_templates/imagenet.py in small (found blind, set 13): a LightningModule holding a torchvision
ResNet as ``self.model``, its training_step calling ``self.model(images)`` then updating torchmetrics' Accuracy, given
with its lightning.Trainer, the ResNet as dlcheck_model and the train / eval loaders.

- T1 read no class count ("missing role dlcheck_num_classes"): the step's output is read from the child it calls.
- L5 skipped "ResNet has no config to read positions from": the Lightning Trainer was taken for a language model's
  Trainer; a ResNet on image batches is no language model (not applicable).
- V2 asked to "define dlcheck_model and dlcheck_eval_fn" while dlcheck_model was given: it names dlcheck_eval_fn."""

import sys
from pathlib import Path

import tiny_vision  # noqa: F401  (torchvision, timm and the plugin's roles imported once, outside the runs)
import torchmetrics  # noqa: F401

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "train"))
import tiny_lightning  # noqa: E402,F401
import tiny_train as tt  # noqa: E402

PROJECT = """
    import pytest, torch, tiny_vision as tv
    import lightning.pytorch as pl
    import torch.nn.functional as F
    from torch.utils.data import DataLoader
    from torchmetrics import Accuracy

    class ImageNetLightningModel(pl.LightningModule):
        def __init__(self, scale=1.0):
            super().__init__()
            self.model = tv.resnet18(num_classes=4)
            with torch.no_grad():
                self.model.fc.weight.mul_(scale)
            self.train_acc1 = Accuracy(task="multiclass", num_classes=4, top_k=1)
            self.eval_acc1 = Accuracy(task="multiclass", num_classes=4, top_k=1)

        def forward(self, x):
            return self.model(x)

        def training_step(self, batch, batch_idx):
            images, target = batch
            output = self.model(images)
            loss_train = F.cross_entropy(output, target)
            self.log("train_loss", loss_train)
            self.train_acc1(output, target)
            self.log("train_acc1", self.train_acc1, prog_bar=True)
            return loss_train

        def validation_step(self, batch, batch_idx):
            images, target = batch
            output = self.model(images)
            self.log("val_loss", F.cross_entropy(output, target))

        def configure_optimizers(self):
            return torch.optim.SGD(self.parameters(), lr=0.00625, momentum=0.9, weight_decay=1e-4)

    def data(train):
        tf = tv.classification_tf(train=train, size=16)
        return tv.Shapes([i % 4 for i in range(32 if train else 8)], size=16, transform=tf)

    @pytest.fixture(scope="session")
    def dlcheck_lightning_module():
        torch.manual_seed(0)
        return ImageNetLightningModel({scale})

    @pytest.fixture(scope="session")
    def dlcheck_trainer(tmp_path_factory):
        return pl.Trainer(max_epochs=1, logger=False, enable_checkpointing=False, enable_progress_bar=False,
                          default_root_dir=str(tmp_path_factory.mktemp("out")))

    @pytest.fixture(scope="session")
    def dlcheck_model(dlcheck_lightning_module):
        return dlcheck_lightning_module.model

    @pytest.fixture(scope="session")
    def dlcheck_dataloader():
        return DataLoader(data(True), batch_size=8, shuffle=True)

    @pytest.fixture(scope="session")
    def dlcheck_eval_dataloader():
        return DataLoader(data(False), batch_size=8)
"""


def test_t1_reads_the_classes_from_the_model_the_training_step_calls(project):
    project.conftest(PROJECT.format(scale=1.0))
    run = project.run("--dlcheck=T1", "-rA")
    run.assert_outcome("T1", "passed")
    text = " ".join(run.text.split())
    assert "x ln(4) = 1.386" in text and "missing role" not in text, text


def test_t1_fails_the_same_module_with_a_huge_head(project):
    project.conftest(PROJECT.format(scale=300.0))
    run = project.run("--dlcheck=T1")
    run.assert_outcome("T1", "failed")
    assert "ln(4) = 1.386" in tt.section(run, "T1")


def test_l5_and_v2_say_what_is_true_of_an_image_classifier(project):
    project.conftest(PROJECT.format(scale=1.0))
    run = project.run("--dlcheck=L5,V2", "-rA")
    run.assert_outcome("L5", "skipped")
    text = " ".join(run.text.split())
    assert "L5_positions: not applicable: ResNet has no config and its training batches' inputs are floats" in text, (
        text
    )
    run.assert_outcome("V2", "passed")
    assert "model.eval() was not checked: define dlcheck_eval_fn" in text, text
    assert "define dlcheck_model" not in text, text
