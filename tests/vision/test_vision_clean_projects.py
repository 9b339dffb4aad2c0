"""Clean classification (timm and torchvision ResNet), detection (Faster R-CNN) and segmentation
(LR-ASPP) projects pass the whole vision domain, and the checks leave their models untouched."""

import pytest
import tiny_vision  # noqa: F401  (torchvision, timm and the plugin's roles imported once, outside the runs)

COMMON = """
    import pathlib, pytest, torch, tiny_vision as tv
    from torch.utils.data import DataLoader

    @pytest.fixture(scope="session")
    def dlcheck_model():
        model = {model}
        snapshot = tv.state_snapshot(model)
        yield model
        (pathlib.Path(__file__).parent / "trace.txt").write_text(tv.same_state(model, snapshot) or "untouched")

    @pytest.fixture(scope="session")
    def dlcheck_dataloader():
        return DataLoader({train}, batch_size=8, shuffle=True{collate})

    @pytest.fixture(scope="session")
    def dlcheck_eval_dataloader():
        return DataLoader({eval}, batch_size=8{collate})

    @pytest.fixture(scope="session")
    def dlcheck_eval_fn():
        def evaluate(model, loader):
            model.eval()
            with torch.no_grad():
                outputs = [model({batch}) for images, _ in loader]
            model.train()
            return outputs
        return evaluate
"""

CLASSIFICATION = dict(
    train="tv.Shapes([i % 4 for i in range(32)], transform=tv.classification_tf(train=True))",
    eval="tv.Shapes([i % 4 for i in range(16)], transform=tv.classification_tf(train=False))",
    collate="",
    batch="images",
)
LOSS = """
    @pytest.fixture(scope="session")
    def dlcheck_loss_fn():
        return {loss}
"""

#: what every classification project's passes show beside PASSED (-v), and why V6 skips there: 32 labels are
#: below V6.min_labels, even as the whole dataset (no pass without a ratio worth judging)
CLASSIFICATION_SEEN = {
    "V1": "8 train + 8 eval images: |values| ≤ 2.6",
    "V2": "3 eval examples (dlcheck_eval_dataloader.dataset",
    "V3": "32 labels (Shapes.targets) take 4 values 0–3, all in 0..3",
    "V7": "dlcheck_dataloader batch_size=8: each BatchNorm step normalises over",
}
V6_TOO_FEW = "only 32 labels (Shapes.targets, the whole dataset), below V6.min_labels = 40"

PROJECTS = {
    "timm resnet18": (
        dict(CLASSIFICATION, model="tv.timm_resnet(4)"),
        LOSS.format(loss="torch.nn.CrossEntropyLoss()"),
        {"V1", "V2", "V3", "V7"},
    ),
    "torchvision resnet18": (
        dict(CLASSIFICATION, model="tv.resnet18(4)"),
        LOSS.format(loss="torch.nn.CrossEntropyLoss()")
        + """
    @pytest.fixture(scope="session")
    def dlcheck_weights():
        from torchvision.models import ResNet18_Weights
        return ResNet18_Weights.IMAGENET1K_V1   # read offline: only its transforms() are used
    """,
        {"V1", "V2", "V3", "V7"},
    ),
    "fasterrcnn_mobilenet_v3_large_320_fpn": (
        dict(
            model="tv.fasterrcnn(3)",
            train="tv.ShapesDetection(16, transforms=tv.detection_tf(train=True))",
            eval="tv.ShapesDetection(8, transforms=tv.detection_tf(train=False))",
            collate=", collate_fn=tv.detection_collate",
            batch="list(images)",
        ),
        "",
        {"V1", "V2", "V3", "V4", "V7", "V8"},
    ),
    "lraspp_mobilenet_v3_large": (
        dict(
            model="tv.lraspp(3)",
            train="tv.ShapesSegmentation(16, transforms=tv.segmentation_tf(train=True))",
            eval="tv.ShapesSegmentation(8, transforms=tv.segmentation_tf(train=False))",
            collate="",
            batch="images",
        ),
        LOSS.format(loss="torch.nn.CrossEntropyLoss(ignore_index=255)"),
        {"V1", "V2", "V5", "V7", "V8"},
    ),
}


@pytest.mark.parametrize("name", list(PROJECTS))
def test_clean_project_passes_the_vision_domain(project, name):
    fields, extra, must_pass = PROJECTS[name]
    project.conftest(COMMON.format(**fields) + extra)
    run = project.run("--dlcheck=vision", "-rA")
    outcomes = {cid: run.outcome(cid) for cid in ("V1", "V2", "V3", "V4", "V5", "V6", "V7", "V8")}
    assert not {c: o for c, o in outcomes.items() if o not in ("passed", "skipped")}, run.text
    assert {c for c, o in outcomes.items() if o == "passed"} == must_pass, run.text
    assert (project.pytester.path / "trace.txt").read_text() == "untouched"
    # every pass says what it measured, beside PASSED and under -rA
    for cid in must_pass:
        run.fnmatch([f"*::{cid}_* PASSED (*"])
    assert run.text.count("dlcheck evidence") == len(must_pass), run.text
    if "resnet" in name:
        for cid, seen in CLASSIFICATION_SEEN.items():
            assert seen in run.text, (cid, run.text)
        assert V6_TOO_FEW in run.text
        assert "not applicable: V4 inspects torchvision detection models; dlcheck_model is a ResNet" in run.text
    elif name.startswith("fasterrcnn"):
        run.fnmatch(
            [
                "*::V3_boxes_labels PASSED (* boxes of 8 sampled images are valid read as xyxy*",
                "*::V4_detections PASSED (4 of 4 sampled images keep detections after post-processing*",
                "*::V8_geometric_target PASSED (8 of 8 seeded passes of a synthetic 128×96 image with a matching box*",
            ]
        )
        assert "the sampled targets (8 examples from batches of dlcheck_dataloader) are boxes (detection)" in run.text
    else:
        run.fnmatch(
            [
                "*::V5_segmentation_ignore PASSED (4 mask values over 8 sampled masks: 3 classes within 0–2, 255 ignored*",
                "*::V8_geometric_target PASSED (8 of 8 seeded passes of a synthetic 128×96 image with a matching mask*",
            ]
        )
        assert "not applicable: V4 inspects torchvision detection models; dlcheck_model is a LRASPP" in run.text


def test_vision_roles_are_listed(project):
    run = project.run("--dlcheck-list")
    for fixture in (
        "dlcheck_train_transform",
        "dlcheck_eval_transform",
        "dlcheck_loss_fn",
        "dlcheck_num_classes",
        "dlcheck_box_format",
        "dlcheck_ignore_index",
        "dlcheck_eval_fn",
        "dlcheck_weights",
    ):
        assert fixture in run.text
    for cid in ("V1", "V2", "V3", "V4", "V5", "V6", "V7", "V8"):
        assert f"\n{cid} " in run.text
    run = project.run("--dlcheck-list", "V3")
    assert "What it does" in run.text and "V3.edge_tolerance = 0.02" in run.text
