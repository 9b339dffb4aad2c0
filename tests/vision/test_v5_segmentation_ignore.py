"""V5: mask values are classes or the ignore index; loss, data and metric agree on it."""

import pytest
import tiny_vision  # noqa: F401  (torchvision, timm and the plugin's roles imported once, outside the runs)
from tiny_vision import section

PROJECT = """
    import pytest, torch, tiny_vision as tv

    @pytest.fixture(scope="session")
    def dlcheck_model():
        return tv.lraspp(num_classes=3)

    @pytest.fixture(scope="session")
    def dlcheck_dataset():
        return tv.ShapesSegmentation(8, classes=3, mask={mask!r}, transforms=tv.segmentation_tf(train=True))

    @pytest.fixture(scope="session")
    def dlcheck_loss_fn():
        return {loss}
"""


@pytest.mark.parametrize(
    "loss, outcome",
    [("torch.nn.CrossEntropyLoss()", "failed"), ("torch.nn.CrossEntropyLoss(ignore_index=255)", "passed")],
)
def test_cross_entropy_default_ignore_index_on_void_255(project, loss, outcome):
    project.conftest(PROJECT.format(mask="tv", loss=loss))
    run = project.run("--dlcheck=V5")
    run.assert_outcome("V5", outcome)
    if outcome == "failed":
        text = section(run, "V5")
        assert "mask values found in 8 sampled masks (8 examples of dlcheck_dataset): 0, 1, 2, 255" in text
        assert (
            "allowed: classes 0–2 (num_classes 3 from the model's output channels on a sampled image) and "
            "CrossEntropyLoss(ignore_index=-100)"
        ) in text
        assert "255: " in text and "% of pixels, in 8 of 8 masks" in text
        assert "void pixels are 255 but CrossEntropyLoss ignores -100 (its default)" in text
        assert "fix CrossEntropyLoss(ignore_index=255)" in text


def test_pil_masks_through_transforms_v2_become_images(project):
    # VOCSegmentation gives PIL masks; transforms v2 treat a PIL mask as a second image
    project.conftest(PROJECT.format(mask="pil", loss="torch.nn.CrossEntropyLoss(ignore_index=255)"))
    run = project.run("--dlcheck=V5")
    run.assert_outcome("V5", "failed")
    text = section(run, "V5")
    assert (
        "8 of 8 sampled targets are images, not masks: dlcheck_dataset[0] target is a tv_tensors.Image float32 3×48×48"
        in text
    )
    assert "treated as a second image" in text
    assert "tv_tensors.Mask(" in text


def test_metric_ignore_index_differs_from_the_loss(project):
    project.conftest(
        PROJECT.format(mask="tv", loss="torch.nn.CrossEntropyLoss(ignore_index=255)")
        + """
    class Jaccard:  # any metric object with an ignore_index attribute (torchmetrics' are read the same way)
        ignore_index = None

    @pytest.fixture(scope="session")
    def dlcheck_metric():
        return Jaccard()
    """
    )
    run = project.run("--dlcheck=V5")
    run.assert_outcome("V5", "failed")
    text = section(run, "V5")
    assert "dlcheck_metric Jaccard ignore_index=None; void value 255 (ignored by the loss)" in text
    assert "Jaccard(..., ignore_index=255)" in text


def test_void_without_loss_or_declared_ignore_index_skips(project):
    project.conftest(
        PROJECT.format(mask="tv", loss="None").replace(
            '@pytest.fixture(scope="session")\n    def dlcheck_loss_fn', "def _unused"
        )
    )
    run = project.run("--dlcheck=V5")
    run.assert_outcome("V5", "skipped")
    assert "dlcheck_loss_fn (or dlcheck_ignore_index)" in run.text
