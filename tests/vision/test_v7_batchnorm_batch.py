"""V7: BatchNorm in training mode with a per-device batch of 2."""

import pytest
import tiny_vision  # noqa: F401  (torchvision, timm and the plugin's roles imported once, outside the runs)
from tiny_vision import section

PROJECT = """
    import pytest, torch, tiny_vision as tv
    from torch.utils.data import DataLoader

    @pytest.fixture(scope="session")
    def dlcheck_model():
        model = tv.resnet18(num_classes=4)
        {freeze}
        return model

    @pytest.fixture(scope="session")
    def dlcheck_dataloader():
        ds = tv.Shapes([i % 4 for i in range(32)], transform=tv.classification_tf(train=True))
        return DataLoader(ds, batch_size={bs}, shuffle=True)
"""

FREEZE = """for m in model.modules():
            if isinstance(m, torch.nn.BatchNorm2d):
                m.eval(); m.requires_grad_(False)"""


@pytest.mark.parametrize("bs, freeze, outcome", [(2, "", "failed"), (16, "", "passed"), (2, FREEZE, "passed")])
def test_batch_size_2_resnet_fine_tune(project, bs, freeze, outcome):
    project.conftest(PROJECT.format(bs=bs, freeze=freeze))
    run = project.run("--dlcheck=V7", "-rA")
    run.assert_outcome("V7", outcome)
    if outcome == "passed" and not freeze:
        run.fnmatch(
            [
                "*::V7_batchnorm_batch PASSED (dlcheck_dataloader batch_size=16: each BatchNorm step normalises*",
                "*dlcheck evidence*",
                "dlcheck_dataloader batch_size=16: each BatchNorm step normalises over 16 images, at least 8; 20 of 20 "
                "BatchNorm2d layers are in training mode",
            ]
        )
    if outcome == "passed" and freeze:
        run.fnmatch(
            [
                "*dlcheck evidence*",
                "none of the 20 BatchNorm layers of ResNet normalises with per-device batch statistics: 20 in eval "
                "mode (frozen)",
            ]
        )
    if outcome == "failed":
        text = section(run, "V7")
        assert "dlcheck_dataloader batch_size=2: each BatchNorm step normalises over 2 images (limit 8)" in text
        assert (
            "20 of 20 BatchNorm2d layers are in training mode (20 with trainable affine parameters), e.g. bn1" in text
        )
        assert "normalises with the statistics of 2 images" in text
        assert "timm.layers.freeze_batch_norm_2d(model)" in text and "SyncBatchNorm" in text


def test_torchvision_detector_without_frozen_batchnorm(project):
    project.conftest("""
        import pytest, torch, tiny_vision as tv

        @pytest.fixture(scope="session")
        def dlcheck_model():
            return tv.fasterrcnn(3)   # weights_backbone=None: plain BatchNorm2d, not FrozenBatchNorm2d

        @pytest.fixture(scope="session")
        def dlcheck_dataloader():
            ds = tv.ShapesDetection(8, transforms=tv.detection_tf(train=True))
            return torch.utils.data.DataLoader(ds, batch_size=2, collate_fn=tv.detection_collate)
    """)
    run = project.run("--dlcheck=V7")
    run.assert_outcome("V7", "failed")
    text = section(run, "V7")
    assert "BatchNorm2d layers are in training mode" in text
    assert "pass weights_backbone (torchvision then uses FrozenBatchNorm2d)" in text


MODEL_ONLY = """
    import pytest, torch, tiny_vision as tv
    from torch.utils.data import DataLoader

    @pytest.fixture(scope="session")
    def dlcheck_model():
        {build}

    @pytest.fixture(scope="session")
    def dlcheck_dataloader():
        ds = tv.Shapes([i % 4 for i in range(32)], transform=tv.classification_tf(train=True))
        return DataLoader(ds, batch_size=2, shuffle=True)
"""


def test_a_vision_transformer_without_batchnorm_is_not_applicable(project):
    """timm's ViT normalises with LayerNorm: the batch of 2 does not matter, and V7 says so instead of passing."""
    project.conftest(
        MODEL_ONLY.format(
            build="torch.manual_seed(0); return tv.timm.create_model('vit_tiny_patch16_224', pretrained=False, "
            "img_size=32, patch_size=8, num_classes=4)"
        )
    )
    run = project.run("--dlcheck=V7")
    run.assert_outcome("V7", "skipped")
    run.fnmatch(
        [
            "*n/a:*not applicable: VisionTransformer has no BatchNorm layer (it normalises with LayerNorm): the "
            "per-device batch size does not affect its normalisation (1 check)"
        ]
    )
    assert "PASSED" not in run.text


def test_frozen_batchnorm_resnet_passes_whatever_the_batch(project):
    """torchvision's ResNet built with norm_layer=FrozenBatchNorm2d (what detection backbones use)."""
    project.conftest(
        MODEL_ONLY.format(
            build="from torchvision.models import resnet18; from torchvision.ops.misc import FrozenBatchNorm2d; "
            "return resnet18(weights=None, num_classes=4, norm_layer=FrozenBatchNorm2d)"
        )
    )
    run = project.run("--dlcheck=V7", "-rA")
    run.assert_outcome("V7", "passed")
    run.fnmatch(
        [
            "*dlcheck evidence*",
            "all 20 BatchNorm layers of ResNet are frozen (FrozenBatchNorm2d: fixed statistics, whatever the batch size)",
        ]
    )
