"""V4: detections survive post-processing; anchors can reach the objects."""

import pytest
import tiny_vision  # noqa: F401  (torchvision, timm and the plugin's roles imported once, outside the runs)
from tiny_vision import section

PROJECT = """
    import pytest, torch, tiny_vision as tv
    from torchvision.models.detection import FasterRCNN
    from torchvision.models.detection.anchor_utils import AnchorGenerator
    from torchvision.models.detection.backbone_utils import mobilenet_backbone

    @pytest.fixture(scope="session")
    def dlcheck_model():
        {model}

    @pytest.fixture(scope="session")
    def dlcheck_dataset():
        return tv.ShapesDetection(8, transforms=tv.detection_tf(train=True))
"""

WITH_ANCHORS = """torch.manual_seed(0)
        backbone = mobilenet_backbone(backbone_name="mobilenet_v3_large", weights=None, fpn=True, trainable_layers=6)
        anchors = AnchorGenerator(({sizes},) * 3, ((0.5, 1.0, 2.0),) * 3)
        return FasterRCNN(backbone, num_classes=3, rpn_anchor_generator=anchors, min_size=64, max_size=96)"""


@pytest.mark.parametrize("thresh, outcome", [(0.99, "failed"), (0.05, "passed")])
def test_box_score_thresh_removes_every_detection(project, thresh, outcome):
    project.conftest(PROJECT.format(model=f"return tv.fasterrcnn(3, box_score_thresh={thresh})"))
    run = project.run("--dlcheck=V4", "-rA")
    run.assert_outcome("V4", outcome)
    if outcome == "passed":
        run.fnmatch(
            [
                "*::V4_detections PASSED (4 of 4 sampled images keep detections after post-processing*",
                "*dlcheck evidence*",
                "4 of 4 sampled images keep detections after post-processing (* in all; score_thresh=0.05, "
                "detections_per_img=100)",
                "*% of * ground-truth boxes have a best anchor IoU ≥ 0.2 (median 0.*; at most 50% may fall below); "
                "AnchorGenerator sizes [[]32, 64, 128, 256, 512], aspect ratios [[]0.5, 1.0, 2.0]",
            ]
        )
    if outcome == "failed":
        text = section(run, "V4")
        assert "0 of 4 sampled images keep a detection after post-processing" in text
        assert "proposals × 2 foreground classes" in text and "0 above box_score_thresh=0.99" in text
        assert "box_score_thresh=0.99 removes every candidate before NMS (the best score is 0." in text
        assert "box_score_thresh=0.05 (torchvision's default)" in text


@pytest.mark.parametrize("sizes, outcome", [("(256, 512)", "failed"), ("(16, 32, 64)", "passed")])
def test_anchor_sizes_far_from_the_objects(project, sizes, outcome):
    project.conftest(PROJECT.format(model=WITH_ANCHORS.format(sizes=sizes)))
    run = project.run("--dlcheck=V4", "-rA")
    run.assert_outcome("V4", outcome)
    if outcome == "passed":
        run.fnmatch(
            [
                "*dlcheck evidence*",
                # how many of the sampled boxes an anchor reaches depends on the random crops drawn: the pass
                # guarantees at most 50% below, not one draw's share
                "*% of * ground-truth boxes have a best anchor IoU ≥ 0.2 (median 0.*; at most 50% may fall below); "
                "AnchorGenerator sizes [[]16, 32, 64], aspect ratios [[]0.5, 1.0, 2.0]",
            ]
        )
    if outcome == "failed":
        text = section(run, "V4")
        assert "100% of" in text and "sampled ground-truth boxes have best anchor IoU < 0.2" in text
        assert "after the model's resize" in text and "best anchor [" in text
        assert "model anchors: AnchorGenerator sizes [256, 512], aspect ratios [0.5, 1.0, 2.0]" in text
        assert "images resized to min_size=(64,), max_size=96" in text
        assert "anchor sizes are far from the object sizes" in text
        assert "rpn_anchor_generator=AnchorGenerator(((" in text


def test_not_a_detector_skips(project):
    project.conftest("""
        import pytest, tiny_vision as tv

        @pytest.fixture(scope="session")
        def dlcheck_model():
            return tv.resnet18(4)
    """)
    run = project.run("--dlcheck=V4")
    run.assert_outcome("V4", "skipped")
    assert "not applicable: V4 inspects torchvision detection models; dlcheck_model is a ResNet" in run.text


def test_classification_data_without_a_model_is_not_applicable(project):
    """No dlcheck_model asked for: the data says it is not a detection pipeline."""
    project.conftest("""
        import pytest, tiny_vision as tv

        @pytest.fixture(scope="session")
        def dlcheck_dataset():
            return tv.Shapes([i % 4 for i in range(16)], transform=tv.classification_tf(train=True))
    """)
    run = project.run("--dlcheck=V4")
    run.assert_outcome("V4", "skipped")
    assert (
        "not applicable: V4 judges a detector's outputs; the sampled targets (8 examples of dlcheck_dataset) are class "
        "labels (classification)"
    ) in run.text
    assert "missing role" not in run.text


NORMALISED = """
    import pytest, torch, tiny_vision as tv

    class Normalised(torch.utils.data.Dataset):
        # the boxes divided by the image size, as YOLO/albumentations keep them, handed to a torchvision detector
        def __init__(self, base):
            self.base = base

        def __len__(self):
            return len(self.base)

        def __getitem__(self, i):
            img, target = self.base[i]
            h, w = img.shape[-2:]
            boxes = target["boxes"].as_subclass(torch.Tensor) / torch.tensor([w, h, w, h])
            return img, {{"boxes": boxes, "labels": target["labels"]}}

    @pytest.fixture(scope="session")
    def dlcheck_model():
        return tv.fasterrcnn(3)

    @pytest.fixture(scope="session")
    def dlcheck_dataset():
        return {dataset}
"""


@pytest.mark.parametrize(
    "dataset, outcome",
    [
        ("Normalised(tv.ShapesDetection(8, transforms=tv.detection_tf(train=False)))", "skipped"),
        ("tv.ShapesDetection(8, transforms=tv.detection_tf(train=False))", "passed"),
    ],
)
def test_boxes_v3_finds_invalid_leave_v4_quiet(project, dataset, outcome):
    """Normalised boxes read as pixels are specks: V3 names that root cause, and V4 does not advise anchors of
    size 0 for them; the same boxes in pixels are judged."""
    project.conftest(NORMALISED.format(dataset=dataset))
    run = project.run("--dlcheck=V3,V4", "-rA")
    run.assert_outcome("V4", outcome)
    if outcome == "skipped":
        run.assert_outcome("V3", "failed")
        assert "the boxes are normalised to [0, 1] but read as xyxy in pixels" in section(run, "V3")
        assert (
            "V3 names the root cause on the same boxes: the boxes are normalised to [0, 1] but read as xyxy in "
            "pixels" in " ".join(run.text.split())
        )
        assert "AnchorGenerator(((0, 1, 2)" not in run.text
    else:
        run.assert_outcome("V3", "passed")
        run.fnmatch(["*::V4_detections PASSED (* of 4 sampled images keep detections after post-processing*"])
