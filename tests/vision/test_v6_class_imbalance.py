"""V6: a 95/5 class split needs class weights or a balanced sampler."""

import pytest
import tiny_vision  # noqa: F401  (torchvision, timm and the plugin's roles imported once, outside the runs)
from tiny_vision import section

PROJECT = """
    import pytest, torch, tiny_vision as tv
    from torch.utils.data import DataLoader, WeightedRandomSampler

    LABELS = [1 if i % 20 == 0 else 0 for i in range(200)]   # 95 / 5

    @pytest.fixture(scope="session")
    def dlcheck_model():
        return tv.resnet18(num_classes=2)

    @pytest.fixture(scope="session")
    def dlcheck_dataset():
        return tv.Shapes(LABELS, size=16, transform=tv.classification_tf(train=True, size=16))

    @pytest.fixture(scope="session")
    def dlcheck_dataloader(dlcheck_dataset):
        return DataLoader(dlcheck_dataset, batch_size=16, {sampling})

    @pytest.fixture(scope="session")
    def dlcheck_loss_fn():
        return {loss}
"""


@pytest.mark.parametrize(
    "loss, sampling, outcome",
    [
        ("torch.nn.CrossEntropyLoss()", "shuffle=True", "failed"),
        ("torch.nn.CrossEntropyLoss(weight=torch.tensor([0.53, 10.0]))", "shuffle=True", "passed"),
        (
            "torch.nn.CrossEntropyLoss()",
            "sampler=WeightedRandomSampler([19.0 if y else 1.0 for y in LABELS], 200)",
            "passed",
        ),
    ],
)
def test_95_5_split_with_an_unweighted_loss(project, loss, sampling, outcome):
    project.conftest(PROJECT.format(loss=loss, sampling=sampling))
    run = project.run("--dlcheck=V6")
    run.assert_outcome("V6", outcome)
    if outcome == "failed":
        text = section(run, "V6")
        assert "label histogram over Shapes.targets: class 0: 190 (95.0%), class 1: 10 (5.0%)" in text
        assert "class 0 outnumbers class 1 19:1 (limit 10:1)" in text
        assert "dlcheck_loss_fn is CrossEntropyLoss with weight=None; sampler: RandomSampler" in text
        assert "the majority class dominates the gradient" in text
        assert "CrossEntropyLoss(weight=torch.tensor([0.526, 10.0]))" in text
        assert "WeightedRandomSampler" in text


def test_labels_read_through_a_target_transform(project):
    # no cheap .targets when a target_transform rewrites them: the labels are read from the examples
    project.conftest(
        PROJECT.format(loss="torch.nn.CrossEntropyLoss()", sampling="shuffle=True").replace(
            "transform=tv.classification_tf(train=True, size=16))",
            "transform=tv.classification_tf(train=True, size=16), target_transform=int)",
        )
    )
    run = project.run("--dlcheck=V6")
    run.assert_outcome("V6", "failed")
    assert "label histogram over 200 examples read from dlcheck_dataset" in section(run, "V6")
