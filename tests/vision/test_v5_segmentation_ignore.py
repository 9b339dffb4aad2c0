"""V5: mask values are classes or the ignore index; loss, data and metric agree on it."""

import pytest
import tiny_vision  # noqa: F401  (torchvision, timm and the plugin's roles imported once, outside the runs)
import torchmetrics.classification  # noqa: F401  (imported once, outside the in-process runs)
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
    run = project.run("--dlcheck=V5", "-rA")
    run.assert_outcome("V5", outcome)
    if outcome == "passed":
        run.fnmatch(
            [
                "*::V5_segmentation_ignore PASSED (4 mask values over 8 sampled masks: 3 classes within 0–2, 255 ignored*",
                "*dlcheck evidence*",
                "4 mask values over 8 sampled masks: 3 classes within 0–2, 255 ignored (num_classes 3 from the model's "
                "output channels on a sampled image)",
                "mask values found in 8 sampled masks (8 examples of dlcheck_dataset): 0, 1, 2, 255",
                "allowed: classes 0–2 (num_classes 3 from the model's output channels on a sampled image) and "
                "CrossEntropyLoss(ignore_index=255)",
                "  255: *% of pixels, in 8 of 8 masks",
                "no dlcheck_metric: the metric's ignore_index was not compared",
            ]
        )
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


def test_metric_ignoring_the_same_void_passes(project):
    project.conftest(
        PROJECT.format(mask="tv", loss="torch.nn.CrossEntropyLoss(ignore_index=255)")
        + """
    @pytest.fixture(scope="session")
    def dlcheck_metric():
        from torchmetrics.classification import MulticlassJaccardIndex
        return MulticlassJaccardIndex(num_classes=3, ignore_index=255)

    @pytest.fixture(scope="session")
    def dlcheck_ignore_index():
        return 255
    """
    )
    run = project.run("--dlcheck=V5", "-rA")
    run.assert_outcome("V5", "passed")
    run.fnmatch(
        [
            "*dlcheck evidence*",
            "allowed: classes 0–2 (num_classes 3 from the model's output channels on a sampled image) and "
            "CrossEntropyLoss(ignore_index=255); dlcheck_ignore_index=255",
            "  255: *% of pixels, in 8 of 8 masks",
            "the data's void value 255 is the loss's ignore_index",
            "dlcheck_metric MulticlassJaccardIndex ignores 255 too",
        ]
    )


def test_void_without_loss_or_declared_ignore_index_skips(project):
    project.conftest(
        PROJECT.format(mask="tv", loss="None").replace(
            '@pytest.fixture(scope="session")\n    def dlcheck_loss_fn', "def _unused"
        )
    )
    run = project.run("--dlcheck=V5")
    run.assert_outcome("V5", "skipped")
    assert (
        "missing role: define fixture dlcheck_loss_fn (or dlcheck_ignore_index) in conftest.py: the masks contain "
        "255, outside classes 0–2, and V5 cannot tell whether the loss ignores it"
    ) in run.text


def test_classification_data_is_not_applicable(project):
    project.conftest("""
        import pytest, tiny_vision as tv

        @pytest.fixture(scope="session")
        def dlcheck_dataset():
            return tv.Shapes([i % 4 for i in range(16)], transform=tv.classification_tf(train=True))
    """)
    run = project.run("--dlcheck=V5")
    run.assert_outcome("V5", "skipped")
    assert (
        "not applicable: V5 judges segmentation masks; the sampled targets (8 examples of dlcheck_dataset) are class "
        "labels (classification)"
    ) in run.text
