"""V1 on a timm model built by hand that carries timm's legacy ``default_cfg`` (set after construction, as
facebookresearch/deit's model factories do: ``model.default_cfg = _cfg()``) and no ``pretrained_cfg``. V1 passed
on deit saying 'the model declares no normalisation (no timm pretrained_cfg ...)', untrue, in a pass recorded as fully
judged (found blind, set 15). Such a cfg describes the checkpoint timm's factory would load, set by the user's code
on a model built by hand, so whether those weights were loaded cannot be told: V1 now names the cfg and its
statistics and records the comparison with them as not judged (a partly judged pass). The same Normalize on a model
built by timm's factory (pretrained_cfg) is still compared, and fails when it differs
(tests/vision/test_v1_normalization.py::test_timm_pretrained_cfg_declares_other_stats)."""

import tiny_vision  # noqa: F401  (torchvision, timm and the plugin's roles imported once, outside the runs)

DEIT_LIKE = """
    import pytest, torch, tiny_vision as tv
    from timm.models.vision_transformer import VisionTransformer, _cfg

    @pytest.fixture(scope="session")
    def dlcheck_model():
        torch.manual_seed(0)
        model = VisionTransformer(img_size=32, patch_size=8, embed_dim=32, depth=1, num_heads=2, num_classes=4)
        {cfg}
        return model

    @pytest.fixture(scope="session")
    def dlcheck_dataset():
        return tv.Shapes([i % 4 for i in range(16)], transform=tv.classification_tf(train=True))

    @pytest.fixture(scope="session")
    def dlcheck_eval_dataset():
        return tv.Shapes([i % 4 for i in range(8)], transform=tv.classification_tf(train=False))
"""


def test_a_legacy_default_cfg_is_named_and_not_judged(project):
    project.conftest(DEIT_LIKE.format(cfg="model.default_cfg = _cfg()"))
    run = project.run("--dlcheck=V1", "-rA")
    run.assert_outcome("V1", "passed")
    text = " ".join(run.text.split())
    assert "declares no normalisation" not in text, text[-3000:]
    assert "partly judged" in text, text[-3000:]
    assert (
        "timm default_cfg of VisionTransformer (mean=(0.5, 0.5, 0.5) std=(0.5, 0.5, 0.5)), with no pretrained_cfg"
        in text
    ), text[-3000:]


def test_a_model_that_declares_nothing_says_so(project):
    project.conftest(DEIT_LIKE.format(cfg="model.pretrained_cfg = model.default_cfg = None"))
    run = project.run("--dlcheck=V1", "-rA")
    run.assert_outcome("V1", "passed")
    text = " ".join(run.text.split())
    assert "the model declares no normalisation (no timm pretrained_cfg or default_cfg" in text, text[-3000:]
    assert "partly judged" not in text, text[-3000:]
