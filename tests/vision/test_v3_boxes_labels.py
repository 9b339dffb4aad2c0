"""V3: boxes obey their declared format and lie in the image; class ids fit the head."""

import pytest
import tiny_vision  # noqa: F401  (torchvision, timm and the plugin's roles imported once, outside the runs)
from tiny_vision import section

DETECTION = """
    import pytest, torch, tiny_vision as tv
    from torchvision.transforms import v2 as T

    @pytest.fixture(scope="session")
    def dlcheck_model():
        return tv.fasterrcnn(3)

    @pytest.fixture(scope="session")
    def dlcheck_dataset():
        return tv.ShapesDetection(16, boxes={boxes!r}, label_offset={offset}, transforms=T.Compose([
            T.ToImage(), T.ToDtype(torch.float32, scale=True), {convert}]))
"""


def test_coco_xywh_boxes_declared_xyxy(project):
    # the COCO [x, y, w, h] values wrapped as BoundingBoxes(format="XYXY"): the data contradicts its format
    project.conftest(DETECTION.format(boxes="coco_as_xyxy", offset=0, convert="T.Identity()"))
    run = project.run("--dlcheck=V3")
    run.assert_outcome("V3", "failed")
    text = section(run, "V3")
    assert "sampled boxes are invalid read as xyxy (declared by tv_tensors.BoundingBoxes(format=XYXY)):" in text
    assert "on a 80×64 image: x2 <= x1" in text
    assert "these look like xywh: all" in text
    assert "the boxes are [x, y, w, h] but are read as xyxy" in text  # cause
    assert "box_convert(boxes, 'xywh', 'xyxy')" in text and "format='XYWH'" in text  # fix


def test_coco_xywh_plain_tensors_fed_to_fasterrcnn(project):
    project.conftest(DETECTION.format(boxes="coco_plain", offset=0, convert="T.Identity()"))
    run = project.run("--dlcheck=V3")
    run.assert_outcome("V3", "failed")
    text = section(run, "V3")
    assert "(declared by FasterRCNN, which reads target['boxes'] as xyxy)" in text
    assert "these look like xywh" in text


def test_xywh_boxes_converted_for_the_detector_pass(project):
    project.conftest(DETECTION.format(boxes="coco_xywh", offset=0, convert="T.ConvertBoundingBoxFormat('XYXY')"))
    run = project.run("--dlcheck=V3", "-rA")
    run.assert_outcome("V3", "passed")
    run.fnmatch(
        [
            "*::V3_boxes_labels PASSED (14 boxes of 8 sampled images are valid read as xyxy*",
            "*dlcheck evidence*",
            "14 boxes of 8 sampled images are valid read as xyxy (declared by tv_tensors.BoundingBoxes(format=XYXY)): "
            "x2 > x1, y2 > y1, inside the image ± 0.02",
            "14 box labels (1–2) lie in 1..2 (num_classes 3 from model head roi_heads.box_predictor.cls_score."
            "out_features (background included); 0 is a torchvision detector's background)",
        ]
    )


def test_xywh_bounding_boxes_reaching_fasterrcnn(project):
    project.conftest(DETECTION.format(boxes="coco_xywh", offset=0, convert="T.Identity()"))
    run = project.run("--dlcheck=V3")
    run.assert_outcome("V3", "failed")
    text = section(run, "V3")
    assert (
        "carry boxes as tv_tensors.BoundingBoxes(format=XYWH); FasterRCNN reads target['boxes'] as absolute xyxy"
        in text
    )
    assert "T.ConvertBoundingBoxFormat('XYXY')" in text


def test_zero_based_labels_for_a_torchvision_detector(project):
    project.conftest(DETECTION.format(boxes="tv", offset=-1, convert="T.Identity()"))
    run = project.run("--dlcheck=V3")
    run.assert_outcome("V3", "failed")
    text = section(run, "V3")
    assert "labels found: 0, 1; num_classes 3 (model head roi_heads.box_predictor.cls_score.out_features" in text
    assert "torchvision detectors reserve 0 for background" in text


CLASSIFIER = """
    import pytest, tiny_vision as tv

    @pytest.fixture(scope="session")
    def dlcheck_model():
        return tv.resnet18(num_classes=4)

    @pytest.fixture(scope="session")
    def dlcheck_dataset():
        return tv.Shapes([i % 4 for i in range(16)], transform=tv.classification_tf(train=True),
                         target_transform={target_transform})
"""


@pytest.mark.parametrize("target_transform, outcome", [("lambda y: y + 1", "failed"), ("None", "passed")])
def test_one_based_labels_with_a_zero_based_head(project, target_transform, outcome):
    project.conftest(CLASSIFIER.format(target_transform=target_transform))
    run = project.run("--dlcheck=V3", "-rA")
    run.assert_outcome("V3", outcome)
    if outcome == "passed":
        run.fnmatch(
            [
                "*dlcheck evidence*",
                "16 labels (Shapes.targets) take 4 values 0–3, all in 0..3 (num_classes 4 from model head fc "
                "out_features)",
            ]
        )
    if outcome == "failed":
        text = section(run, "V3")
        assert "labels found: 1, 2, 3, 4; num_classes 4 (model head fc out_features)" in text
        assert "label 0 never occurs and label 4 is past the head" in text
        assert "4 of 16 labels (16 examples read from dlcheck_dataset) are outside 0..3" in text
        assert "the labels are 1-based but the model's head is 0-based" in text
        assert "subtract 1 from every label" in text


def test_plain_boxes_without_a_declared_format_skip(project):
    project.conftest("""
        import pytest, torch, tiny_vision as tv
        from torchvision.transforms import v2 as T

        @pytest.fixture(scope="session")
        def dlcheck_dataset():
            return tv.ShapesDetection(8, boxes="plain", transforms=T.Compose([T.ToImage(), T.ToDtype(torch.float32, scale=True)]))
    """)
    run = project.run("--dlcheck=V3")
    run.assert_outcome("V3", "skipped")
    assert (
        "missing role: define fixture dlcheck_box_format ('xyxy', 'xywh' or 'cxcywh') in conftest.py: the boxes are "
        "plain tensors and nothing declares their format"
    ) in run.text


def test_segmentation_masks_are_not_applicable(project):
    project.conftest("""
        import pytest, tiny_vision as tv

        @pytest.fixture(scope="session")
        def dlcheck_dataset():
            return tv.ShapesSegmentation(8, transforms=tv.segmentation_tf(train=True))
    """)
    run = project.run("--dlcheck=V3")
    run.assert_outcome("V3", "skipped")
    assert (
        "not applicable: V3 judges boxes and class ids; the sampled targets (8 examples of dlcheck_dataset) are "
        "segmentation masks"
    ) in run.text


BINARY = """
    import pytest, tiny_vision as tv

    @pytest.fixture(scope="session")
    def dlcheck_model():
        return tv.resnet18(num_classes=1)  # one logit: a binary head (BCEWithLogitsLoss)

    @pytest.fixture(scope="session")
    def dlcheck_dataset():
        return tv.Shapes([i % 2 for i in range(16)], transform=tv.classification_tf(train=True),
                         target_transform={target_transform})
"""


@pytest.mark.parametrize("target_transform, outcome", [("None", "passed"), ("lambda y: y + 1", "failed")])
def test_a_one_logit_head_takes_labels_0_and_1(project, target_transform, outcome):
    # a one-logit head counts as classes 0..1 (not one class): 0/1 labels pass, 1/2 labels still fail
    project.conftest(BINARY.format(target_transform=target_transform))
    run = project.run("--dlcheck=V3", "-rA")
    run.assert_outcome("V3", outcome)
    text = " ".join(run.text.split())
    assert "one logit, a binary head (classes 0 and 1)" in text, run.text
    if outcome == "passed":
        assert "all in 0..1" in text, run.text
    else:
        assert "labels found: 1, 2; num_classes 2" in text and "label 2 is past the head" in text, run.text
        assert "8 of 16 labels (16 examples read from dlcheck_dataset) are outside 0..1" in text, run.text
        assert "subtract 1 from every label" in text, run.text
        # BCEWithLogitsLoss takes a target of 2 silently: no index past the logits, no error on CPU
        assert "the one-logit head takes 0/1 targets (BCEWithLogitsLoss)" in text, run.text
        assert "indexes past the logits" not in text, run.text
