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


def test_metric_without_ignore_index_scores_the_void(project):
    # the Example: MulticlassJaccardIndex(num_classes=3) while the loss ignores 255 (V5 feeds it the void pixels)
    project.conftest(
        PROJECT.format(mask="tv", loss="torch.nn.CrossEntropyLoss(ignore_index=255)")
        + """
    @pytest.fixture(scope="session")
    def dlcheck_metric():
        from torchmetrics.classification import MulticlassJaccardIndex
        return MulticlassJaccardIndex(num_classes=3)
    """
    )
    run = project.run("--dlcheck=V5")
    run.assert_outcome("V5", "failed")
    text = section(run, "V5")
    assert "dlcheck_metric MulticlassJaccardIndex fed " in text and " of them 255: update(preds, target) raises" in text
    assert "void value 255 (ignored by the loss)" in text
    assert "the metric scores the void pixels that the loss ignores" in text
    assert "MulticlassJaccardIndex(..., ignore_index=255)" in text


# torchvision references/segmentation/utils.py's ConfusionMatrix (as the reference writes it): no ignore_index
# attribute, but update(target, prediction) keeps only 0 <= target < num_classes, so 255 is never scored
CONFUSION = """
    class ConfusionMatrix:
        def __init__(self, num_classes):
            self.num_classes = num_classes
            self.mat = None

        def update(self, a, b):
            n = self.num_classes
            if self.mat is None:
                self.mat = torch.zeros((n, n), dtype=torch.int64, device=a.device)
            with torch.inference_mode():
                k = {keep}
                inds = n * a[k].to(torch.int64) + b[k]
                self.mat += torch.bincount(inds, minlength=n**2).reshape(n, n)

        def compute(self):
            h = self.mat.float()
            acc_global = torch.diag(h).sum() / h.sum()
            acc = torch.diag(h) / h.sum(1)
            iu = torch.diag(h) / (h.sum(1) + h.sum(0) - torch.diag(h))
            return acc_global, acc, iu

    @pytest.fixture(scope="session")
    def dlcheck_metric():
        return ConfusionMatrix(3)
"""


def test_reference_confusion_matrix_keeps_only_classes_passes(project):
    project.conftest(
        PROJECT.format(mask="tv", loss="torch.nn.CrossEntropyLoss(ignore_index=255)")
        + CONFUSION.format(keep="(a >= 0) & (a < n)")
    )
    run = project.run("--dlcheck=V5", "-rA")
    run.assert_outcome("V5", "passed")
    run.fnmatch(
        [
            "dlcheck_metric ConfusionMatrix ignores 255 too: fed * pixels of a sampled mask, * of them 255: "
            "update(target, preds): compute() gives * with or without the 255 pixels"
        ]
    )


def test_confusion_matrix_that_scores_void_as_a_class_fails(project):
    # the same matrix sized for 256 classes (every value a class) and keeping every target: void is scored
    project.conftest(
        PROJECT.format(mask="tv", loss="torch.nn.CrossEntropyLoss(ignore_index=255)")
        + CONFUSION.format(keep="a >= 0").replace("return ConfusionMatrix(3)", "return ConfusionMatrix(256)")
    )
    run = project.run("--dlcheck=V5")
    run.assert_outcome("V5", "failed")
    text = section(run, "V5")
    assert "dlcheck_metric ConfusionMatrix fed " in text and "without the 255 pixels, " in text
    assert "leave out the target pixels equal to 255 in ConfusionMatrix.update" in text


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
            "dlcheck_metric MulticlassJaccardIndex ignores 255 too: fed * pixels of a sampled mask, * of them 255: "
            "update(preds, target): compute() gives * with or without the 255 pixels",
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
