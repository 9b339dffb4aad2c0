"""V3 and V6 on an embedding network (found blind, set 13: torchvision's references/similarity).

A ResNet whose fc outputs a 128-d, L2-normalised embedding, trained with a batch-all triplet loss on (images, class
ids) batches: V3 passed judging the class ids against "num_classes 128 from the model's output channels", V6 asked
for dlcheck_loss_fn to read class weights from. The user's loss, replayed on outputs put in place of the model's, is
no cross-entropy of them: neither check concerns it. The same network under a cross-entropy is judged: 1-based labels
still fail V3 (the user's cross-entropy raises on them), a 95/5 split trained with an unweighted CrossEntropyLoss still fails V6."""

import tiny_vision  # noqa: F401  (torchvision, timm and the plugin's roles imported once, outside the runs)
from tiny_vision import section

PROJECT = """
    import pytest, torch, tiny_vision as tv
    from torch import nn
    import torch.nn.functional as F
    from torch.utils.data import DataLoader

    LABELS = {labels}

    class EmbeddingNet(nn.Module):
        def __init__(self):
            super().__init__()
            self.backbone = tv.resnet18(num_classes={width})

        def forward(self, x):
            return F.normalize(self.backbone(x), dim=1) if {normalise} else self.backbone(x)

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
    def dlcheck_model():
        return EmbeddingNet()

    @pytest.fixture(scope="session")
    def dlcheck_make_training():
        def make():
            model = EmbeddingNet()
            return {{"model": model, "optimizer": torch.optim.Adam(model.parameters(), lr=1e-4)}}
        return make

    @pytest.fixture(scope="session")
    def dlcheck_dataset():
        return tv.Shapes(LABELS, size=16, transform=tv.classification_tf(train=True, size=16),
                         target_transform={target_transform})

    @pytest.fixture(scope="session")
    def dlcheck_dataloader(dlcheck_dataset):
        return DataLoader(dlcheck_dataset, batch_size=16)

    {loss}
"""

TRIPLET = """
    @pytest.fixture(scope="session")
    def dlcheck_compute_loss():
        def compute(model, batch):
            images, targets = batch
            return batch_all_triplet_loss(model(images), targets)
        return compute
"""

CROSS_ENTROPY = """
    @pytest.fixture(scope="session")
    def dlcheck_compute_loss():
        def compute(model, batch):
            images, targets = batch
            return F.cross_entropy(model(images), targets)
        return compute
"""

LOSS_FN = """
    @pytest.fixture(scope="session")
    def dlcheck_loss_fn():
        return torch.nn.CrossEntropyLoss()
"""

PK = "[i // 4 % 4 for i in range(64)]"  # P x K: 4 classes, 4 images each per batch of 16
SPLIT = "[1 if i % 20 == 0 else 0 for i in range(200)]"  # 95 / 5


def conftest(loss, labels=PK, width=16, normalise=True, target_transform="None"):
    return PROJECT.format(loss=loss, labels=labels, width=width, normalise=normalise, target_transform=target_transform)


def test_an_embedding_under_a_triplet_loss_has_no_classes_for_v3_and_v6(project):
    project.conftest(conftest(TRIPLET, labels=SPLIT))
    run = project.run("--dlcheck=V3,V6", "-rs")
    run.assert_outcome("V3", "skipped")
    run.assert_outcome("V6", "skipped")
    text = " ".join(run.text.split())
    assert (
        "V3 judges class ids against the classes of the model's output; the training's loss is not a cross-entropy "
        "over classes: dlcheck_compute_loss replayed on 4 outputs put in place of the model's output (16x16)"
    ) in text, text
    assert (
        "V6 judges the class balance a classification loss trains on; the training's loss is not a cross-entropy"
        in (text)
    ), text
    assert "missing role" not in text, text


def test_one_based_labels_under_the_user_s_cross_entropy_still_fail_v3(project):
    project.conftest(conftest(CROSS_ENTROPY, width=4, normalise=False, target_transform="lambda y: y + 1"))
    run = project.run("--dlcheck=V3")
    run.assert_outcome("V3", "failed")
    # the user's own cross-entropy raises on label 4, before V3 reads the labels: the pipeline's error, named
    assert "IndexError: Target 4 is out of bounds" in " ".join(section(run, "V3").split())


def test_zero_based_labels_under_the_user_s_cross_entropy_pass_v3(project):
    project.conftest(conftest(CROSS_ENTROPY, width=4, normalise=False))
    run = project.run("--dlcheck=V3", "-rA")
    run.assert_outcome("V3", "passed")
    assert "whether the loss reads it so was not told" not in run.text, run.text


def test_a_95_5_split_under_an_unweighted_cross_entropy_still_fails_v6(project):
    project.conftest(conftest(LOSS_FN, labels=SPLIT, width=2, normalise=False))
    run = project.run("--dlcheck=V6")
    run.assert_outcome("V6", "failed")
    assert "class 0 outnumbers class 1 19:1" in section(run, "V6")


def test_without_a_training_v3_says_what_it_did_not_judge(project):
    source = conftest("", width=16).replace("def dlcheck_make_training", "def _no_training")
    project.conftest(source)
    run = project.run("--dlcheck=V3", "-rA")
    run.assert_outcome("V3", "passed")
    text = " ".join(run.text.split())
    assert "the model's output is taken for class scores; whether the loss reads it so was not told: no training" in (
        text
    ), text
