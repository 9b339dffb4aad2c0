"""V1: inputs scaled and normalised as the backbone expects, the same in train and eval."""

import pytest
import tiny_vision  # noqa: F401  (torchvision, timm and the plugin's roles imported once, outside the runs)
from tiny_vision import section

CLASSIFIER = """
    import pytest, torch, tiny_vision as tv
    from torchvision.transforms import v2 as T

    @pytest.fixture(scope="session")
    def dlcheck_model():
        return {model}

    @pytest.fixture(scope="session")
    def dlcheck_dataset():
        return tv.Shapes([i % 4 for i in range(16)], transform={train_tf})

    @pytest.fixture(scope="session")
    def dlcheck_eval_dataset():
        return tv.Shapes([i % 4 for i in range(8)], transform={eval_tf})
"""

TRAIN_UNSCALED = (
    "T.Compose([T.ToImage(), T.RandomResizedCrop(32), T.ToDtype(torch.float32), "
    "T.Normalize(list(tv.IMAGENET_MEAN), list(tv.IMAGENET_STD))])"
)
TRAIN_SCALED = TRAIN_UNSCALED.replace("T.ToDtype(torch.float32)", "T.ToDtype(torch.float32, scale=True)")
EVAL_OK = "tv.classification_tf(train=False)"


def test_todtype_without_scale_keeps_0_255_pixels(project):
    project.conftest(CLASSIFIER.format(model="tv.resnet18(4)", train_tf=TRAIN_UNSCALED, eval_tf=EVAL_OK))
    run = project.run("--dlcheck=V1")
    run.assert_outcome("V1", "failed")
    text = section(run, "V1")
    assert "train: 8 examples of dlcheck_dataset: dtype float32, per-channel mean (" in text
    assert "undoing its Normalize gives pixel values" in text
    assert "ToDtype(float32, scale=False)" in text
    assert "without scale=True" in text  # cause
    assert "ToDtype(torch.float32, scale=True)" in text  # fix
    assert "Traceback" not in run.text


def test_todtype_with_scale_passes(project):
    project.conftest(CLASSIFIER.format(model="tv.resnet18(4)", train_tf=TRAIN_SCALED, eval_tf=EVAL_OK))
    run = project.run("--dlcheck=V1", "-rA")
    run.assert_outcome("V1", "passed")
    run.fnmatch(["*::V1_normalization PASSED (8 train + 8 eval images: |values| ≤ 2.6* (0–255 pixels exceed 20*"])
    run.fnmatch(
        [
            "*dlcheck evidence*",
            "8 train + 8 eval images: |values| ≤ 2.6* (0–255 pixels exceed 20); train per-channel mean (*) std (*)",
            "train: 8 examples of dlcheck_dataset: dtype float32, per-channel mean (*), range -2.* to 2.6*",
            "eval: 8 examples of dlcheck_eval_dataset: dtype float32, *",
            "train and eval transforms apply the same Normalize (within 0.02)",
            "the model declares no normalisation (no timm pretrained_cfg, image processor or dlcheck_weights): only "
            "the scale and the train/eval agreement were judged",
        ]
    )


def test_toimage_alone_gives_uint8(project):
    project.conftest(
        CLASSIFIER.format(
            model="tv.resnet18(4)",
            train_tf="T.Compose([T.ToImage(), T.RandomResizedCrop(32)])",
            eval_tf="T.Compose([T.ToImage(), T.CenterCrop(32)])",
        )
    )
    run = project.run("--dlcheck=V1")
    run.assert_outcome("V1", "failed")
    text = section(run, "V1")
    assert "dtype uint8" in text and "range 0 to 255" in text
    assert "ToImage()/PILToTensor() give uint8" in text


@pytest.mark.parametrize("eval_mean, outcome", [("(0.5, 0.5, 0.5)", "failed"), ("tv.IMAGENET_MEAN", "passed")])
def test_eval_normalised_with_other_stats_than_train(project, eval_mean, outcome):
    eval_tf = f"tv.classification_tf(train=False, mean={eval_mean}, std={eval_mean.replace('MEAN', 'STD')})"
    project.conftest(
        CLASSIFIER.format(model="tv.resnet18(4)", train_tf="tv.classification_tf(train=True)", eval_tf=eval_tf)
    )
    run = project.run("--dlcheck=V1", "-rA")
    run.assert_outcome("V1", outcome)
    if outcome == "passed":
        run.fnmatch(["*dlcheck evidence*", "train and eval transforms apply the same Normalize (within 0.02)"])
    if outcome == "failed":
        text = section(run, "V1")
        assert "train transform Normalize(mean=(0.485, 0.456, 0.406), std=(0.229, 0.224, 0.225))" in text
        assert "eval transform Normalize(mean=(0.5, 0.5, 0.5), std=(0.5, 0.5, 0.5))" in text
        assert "eval: 8 examples of dlcheck_eval_dataset" in text
        assert "other statistics than the train transform" in text
        assert "T.Normalize(mean=[0.485, 0.456, 0.406], std=[0.229, 0.224, 0.225]) in the eval transform" in text


def test_timm_pretrained_cfg_declares_other_stats(project):
    # timm's resnet18 declares ImageNet stats in pretrained_cfg (no download): (0.5, 0.5, 0.5) contradicts it
    tf = "tv.classification_tf(train={}, mean=(0.5,) * 3, std=(0.5,) * 3)"
    project.conftest(CLASSIFIER.format(model="tv.timm_resnet(4)", train_tf=tf.format(True), eval_tf=tf.format(False)))
    run = project.run("--dlcheck=V1")
    run.assert_outcome("V1", "failed")
    text = section(run, "V1")
    assert "train transform Normalize(mean=(0.5, 0.5, 0.5), std=(0.5, 0.5, 0.5))" in text
    assert (
        "the model expects mean=(0.485, 0.456, 0.406) std=(0.229, 0.224, 0.225) (timm pretrained_cfg of resnet18"
        in text
    )
    # the user may train from scratch with their own stats: the documented knob turns the comparison off
    run = project.run("--dlcheck=V1", "--dlcheck-set", "V1.compare_declared=false", "-rA")
    run.assert_outcome("V1", "passed")
    run.fnmatch(
        [
            "*dlcheck evidence*",
            "train: the comparison with timm pretrained_cfg of resnet18.a1_in1k is off (V1.compare_declared=false)",
            "eval: the comparison with timm pretrained_cfg of resnet18.a1_in1k is off (V1.compare_declared=false)",
            "train and eval transforms apply the same Normalize (within 0.02)",
        ]
    )


def test_timm_pretrained_cfg_stats_match(project):
    tf = "tv.classification_tf(train={})"
    project.conftest(CLASSIFIER.format(model="tv.timm_resnet(4)", train_tf=tf.format(True), eval_tf=tf.format(False)))
    run = project.run("--dlcheck=V1", "-rA")
    run.assert_outcome("V1", "passed")
    run.fnmatch(
        [
            "*dlcheck evidence*",
            "train transform Normalize(mean=(0.485, 0.456, 0.406), std=(0.229, 0.224, 0.225)) matches the model's "
            "(timm pretrained_cfg of resnet18.a1_in1k) within 0.02",
            "eval transform Normalize(mean=(0.485, 0.456, 0.406), std=(0.229, 0.224, 0.225)) matches the model's "
            "(timm pretrained_cfg of resnet18.a1_in1k) within 0.02",
        ]
    )


def test_detector_gets_normalised_inputs_twice(project):
    project.conftest("""
        import pytest, torch, tiny_vision as tv
        from torchvision.transforms import v2 as T

        @pytest.fixture(scope="session")
        def dlcheck_model():
            return tv.fasterrcnn(3)

        @pytest.fixture(scope="session")
        def dlcheck_dataset():
            return tv.ShapesDetection(8, transforms=T.Compose([tv.detection_tf(True),
                                                               T.Normalize(list(tv.IMAGENET_MEAN), list(tv.IMAGENET_STD))]))
    """)
    run = project.run("--dlcheck=V1")
    run.assert_outcome("V1", "failed")
    text = section(run, "V1")
    assert "FasterRCNN.transform (GeneralizedRCNNTransform) normalises inputs itself" in text
    assert "normalised twice" in text
    assert "remove Normalize from the data transform" in text


def test_transform_only_without_data(project):
    project.conftest("""
        import pytest, torch
        from torchvision.transforms import v2 as T

        @pytest.fixture(scope="session")
        def dlcheck_train_transform():
            return T.Compose([T.ToImage(), T.ToDtype(torch.float32), T.Normalize([0.5] * 3, [0.5] * 3)])
    """)
    run = project.run("--dlcheck=V1")
    run.assert_outcome("V1", "failed")
    assert "3 synthetic noise images through dlcheck_train_transform" in section(run, "V1")


def test_no_data_skips_naming_the_roles(project):
    project.conftest("""
        import pytest, tiny_vision as tv

        @pytest.fixture(scope="session")
        def dlcheck_model():
            return tv.resnet18(4)
    """)
    run = project.run("--dlcheck=V1")
    run.assert_outcome("V1", "skipped")
    assert "dlcheck_dataloader or dlcheck_dataset" in run.text


@pytest.mark.parametrize("fixture", ["dlcheck_image_processor", "dlcheck_tokenizer"])
def test_transformers_image_processor_declares_other_stats(project, fixture):
    # a ViT image processor normalises with 0.5/0.5; the data uses ImageNet statistics
    project.conftest(f"""
        import pytest, tiny_vision as tv
        from transformers import ViTImageProcessor

        @pytest.fixture(scope="session")
        def {fixture}():
            return ViTImageProcessor(image_mean=[0.5, 0.5, 0.5], image_std=[0.5, 0.5, 0.5])

        @pytest.fixture(scope="session")
        def dlcheck_dataset():
            return tv.Shapes([i % 4 for i in range(8)], transform=tv.classification_tf(train=True))
    """)
    run = project.run("--dlcheck=V1")
    run.assert_outcome("V1", "failed")
    text = section(run, "V1")
    assert "the model expects mean=(0.5, 0.5, 0.5) std=(0.5, 0.5, 0.5) (ViTImageProcessor.image_mean/image_std)" in text
    assert "T.Normalize(mean=[0.5, 0.5, 0.5], std=[0.5, 0.5, 0.5])" in text
