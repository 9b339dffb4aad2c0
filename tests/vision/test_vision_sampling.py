"""Unit tests of the vision measurement (pytest_dlcheck.checks.vision.measure): reading (image, target) examples whatever their shape, box
formats, transform introspection."""

import pytest
import tiny_vision as tv
import torch
from torchvision import tv_tensors

from pytest_dlcheck.checks.vision import measure as V


def test_tuple_with_bounding_boxes_dict():
    img, target = tv.ShapesDetection(4, transforms=tv.detection_tf(train=False))[1]
    item = V.make_item((img, target), "ds[1]", 1)
    assert item.kind == "detection"
    assert item.box_format == "xyxy" and item.canvas == (64, 80)
    assert item.format_source == "tv_tensors.BoundingBoxes(format=XYXY)"
    assert item.boxes.shape == (2, 4) and item.labels.tolist() == target["labels"].tolist()


def test_coco_annotation_list_is_xywh():
    anns = [{"bbox": [10, 20, 5, 6], "category_id": 3}]
    item = V.make_item((torch.zeros(3, 40, 40), anns), "coco[0]")
    assert item.kind == "detection" and item.box_format == "xywh" and item.labels.tolist() == [3]


@pytest.mark.parametrize(
    "target, kind",
    [
        (3, "classification"),
        (torch.tensor(2), "classification"),
        (torch.tensor([0.1, 0.9]), "classification"),
        (tv_tensors.Mask(torch.zeros(8, 8, dtype=torch.uint8)), "segmentation"),
        (torch.zeros(8, 8, dtype=torch.long), "segmentation"),
        (tv_tensors.BoundingBoxes([[1, 1, 4, 4]], format="CXCYWH", canvas_size=(8, 8)), "detection"),
    ],
)
def test_target_kinds(target, kind):
    assert V.make_item((torch.zeros(3, 8, 8), target), "x").kind == kind


def test_hf_style_dict_example_and_batch():
    item = V.make_item({"pixel_values": torch.zeros(3, 8, 8), "labels": 4}, "hf")
    assert item.label == 4
    pairs = V.unbatch({"pixel_values": torch.zeros(2, 3, 8, 8), "labels": torch.tensor([1, 0])}, "b")
    assert [V.make_item(p, "b").label for p in pairs] == [1, 0]


def test_unbatch_detection_tuple_of_lists_and_list_of_examples():
    ds = tv.ShapesDetection(4, transforms=tv.detection_tf(train=False))
    zipped = tv.detection_collate([ds[0], ds[1]])
    assert len(V.unbatch(zipped, "b")) == 2
    as_list = [ds[0], ds[1]]
    pairs = V.unbatch(as_list, "b")
    assert [V.make_item(p, "b").kind for p in pairs] == ["detection", "detection"]


def test_unbatch_stacked_classification():
    pairs = V.unbatch([torch.zeros(4, 3, 8, 8), torch.tensor([0, 1, 2, 3])], "b")
    assert [V.make_item(p, "b").label for p in pairs] == [0, 1, 2, 3]


def test_not_an_example_raises_a_sample_error():
    with pytest.raises(V.VisionSampleError):
        V.make_item("just a string", "ds[0]")


def test_box_validity_and_formats():
    xywh = torch.tensor([[30.0, 20.0, 10.0, 15.0]])
    assert V.box_problems(V.to_xyxy(xywh, "xyxy"), (64, 64), 0.02) == ["x2 <= x1, y2 <= y1"]
    assert V.box_problems(V.to_xyxy(xywh, "xywh"), (64, 64), 0.02) == [""]
    assert "ends outside" in V.box_problems(torch.tensor([[0.0, 0.0, 90.0, 10.0]]), (64, 64), 0.02)[0]
    assert V.to_xyxy(torch.tensor([[0.5, 0.5, 0.5, 0.5]]), "cxcywh", (10, 20), normalized=True).tolist() == [
        [5.0, 2.5, 15.0, 7.5]
    ]


@pytest.mark.parametrize(
    "text, parsed",
    [("xyxy", ("xyxy", False)), ("XYWH", ("xywh", False)), ("cxcywh-normalized", ("cxcywh", True)), (None, None)],
)
def test_parse_box_format(text, parsed):
    assert V.parse_box_format(text) == parsed


def test_transform_introspection():
    tf = tv.classification_tf(train=True, mean=(0.5,) * 3, std=(0.25,) * 3)
    mean, std, _ = V.find_normalize(tf)
    assert mean == [0.5] * 3 and std == [0.25] * 3
    assert [type(t).__name__ for t in V.random_transforms(tf)] == ["RandomResizedCrop", "RandomHorizontalFlip"]
    assert V.pipeline(tf).startswith(
        "ToImage → RandomResizedCrop → RandomHorizontalFlip → ToDtype(float32, scale=True)"
    )
    ds = tv.Shapes([0], transform=tf, target_transform=int)
    assert V.find_normalize(ds.transforms) is not None  # through StandardTransform


def test_channel_stats():
    s = V.channel_stats([torch.full((3, 2, 2), 255, dtype=torch.uint8), torch.zeros(3, 2, 2, dtype=torch.uint8)])
    assert s.dtype == "uint8" and s.mean == [127.5] * 3 and s.max == 255 and s.min == 0


def test_head_classes():
    assert V.head_classes(tv.resnet18(7))[0] == 7
    assert V.head_classes(tv.timm_resnet(5))[0] == 5
    n, where = V.head_classes(tv.fasterrcnn(4))
    assert n == 4 and "background included" in where
