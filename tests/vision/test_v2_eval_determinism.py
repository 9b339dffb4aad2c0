"""V2: deterministic eval transform; the eval function puts the model in eval mode."""

import pytest
import tiny_vision  # noqa: F401  (torchvision, timm and the plugin's roles imported once, outside the runs)
from tiny_vision import section

EVAL_DATA = """
    import pytest, torch, tiny_vision as tv
    from torchvision.transforms import v2 as T

    @pytest.fixture(scope="session")
    def dlcheck_eval_dataset():
        return tv.Shapes([i % 4 for i in range(8)], transform=T.Compose([
            T.ToImage(), {crop}, T.ToDtype(torch.float32, scale=True), T.Normalize(list(tv.IMAGENET_MEAN), list(tv.IMAGENET_STD))]))
"""


@pytest.mark.parametrize(
    "crop, outcome", [("T.RandomResizedCrop(32)", "failed"), ("T.Resize(36), T.CenterCrop(32)", "passed")]
)
def test_random_resized_crop_in_the_eval_transform(project, crop, outcome):
    project.conftest(EVAL_DATA.format(crop=crop))
    run = project.run("--dlcheck=V2", "-rA")
    run.assert_outcome("V2", outcome)
    if outcome == "passed":
        run.fnmatch(["*::V2_eval_determinism PASSED (3 eval examples (dlcheck_eval_dataset*"])
        run.fnmatch(["*dlcheck evidence*", "model.eval() was not checked: define dlcheck_model and dlcheck_eval_fn"])
        assert (
            "3 eval examples (dlcheck_eval_dataset[0], dlcheck_eval_dataset[4], dlcheck_eval_dataset[7]) read "
            "twice under different seeds: identical (max |Δ| 0 ≤ 1e-06)\n" in run.text
        )
    if outcome == "failed":
        text = section(run, "V2")
        assert "dlcheck_eval_dataset[0] read twice: max |Δ|" in text
        assert "% of pixel values differ" in text
        assert "random transforms in the eval transform: RandomResizedCrop(size=(32, 32)" in text
        assert "the eval transform applies RandomResizedCrop" in text  # cause
        assert "T.Resize(size) + T.CenterCrop(crop) instead of RandomResizedCrop" in text  # fix


def test_random_split_shares_the_train_augmentation(project):
    project.conftest("""
        import pytest, torch, tiny_vision as tv
        from torch.utils.data import random_split

        @pytest.fixture(scope="session")
        def splits():
            full = tv.Shapes([i % 4 for i in range(24)], transform=tv.classification_tf(train=True))
            return random_split(full, [16, 8], generator=torch.Generator().manual_seed(0))

        @pytest.fixture(scope="session")
        def dlcheck_dataset(splits):
            return splits[0]

        @pytest.fixture(scope="session")
        def dlcheck_eval_dataset(splits):
            return splits[1]
    """)
    run = project.run("--dlcheck=V2")
    run.assert_outcome("V2", "failed")
    text = section(run, "V2")
    assert "Subsets of one dataset object, so they share its transform" in text
    assert "inherits its random augmentation" in text


EVAL_FN = """
    import pytest, torch, tiny_vision as tv

    @pytest.fixture(scope="session")
    def dlcheck_model():
        return tv.resnet18(4)

    @pytest.fixture(scope="session")
    def dlcheck_eval_dataset():
        return tv.Shapes([i % 4 for i in range(8)], transform=tv.classification_tf(train=False))

    @pytest.fixture(scope="session")
    def dlcheck_eval_fn():
        def evaluate(model, loader):
            {set_mode}
            correct = 0
            with torch.no_grad():
                for images, labels in loader:
                    correct += (model(images).argmax(1) == labels).sum().item()
            return correct
        return evaluate
"""


@pytest.mark.parametrize("set_mode, outcome", [("pass", "failed"), ("model.eval()", "passed")])
def test_eval_function_without_model_eval(project, set_mode, outcome):
    project.conftest(EVAL_FN.format(set_mode=set_mode))
    run = project.run("--dlcheck=V2", "-rA")
    run.assert_outcome("V2", outcome)
    if outcome == "passed":
        run.fnmatch(
            [
                "*dlcheck evidence*",
                "3 eval examples (*) read twice under different seeds: identical (max |Δ| 0 ≤ 1e-06)",
                "dlcheck_eval_fn called twice right after model.train(): 0 of 20 BatchNorm/Dropout/InstanceNorm "
                "modules ran in training mode, no BatchNorm running mean moved (20 tracked), two runs give identical "
                "outputs",
            ]
        )
    if outcome == "failed":
        text = section(run, "V2")
        assert "dlcheck_eval_fn ran 20 BatchNorm2d modules in training mode (e.g. bn1)" in text
        assert "it moved the BatchNorm running_mean of 20 of 20 layers" in text
        assert "runs the model in training mode" in text  # cause
        assert "call model.eval() at the start of the eval function" in text  # fix


def test_detection_eval_without_model_eval_raises_in_training_mode(project):
    project.conftest("""
        import pytest, torch, tiny_vision as tv

        @pytest.fixture(scope="session")
        def dlcheck_model():
            return tv.fasterrcnn(3)

        @pytest.fixture(scope="session")
        def dlcheck_eval_dataloader():
            ds = tv.ShapesDetection(4, transforms=tv.detection_tf(train=False))
            return torch.utils.data.DataLoader(ds, batch_size=2, collate_fn=tv.detection_collate)

        @pytest.fixture(scope="session")
        def dlcheck_eval_fn():
            def evaluate(model, loader):
                with torch.no_grad():
                    return [model(list(images)) for images, _ in loader]
            return evaluate
    """)
    run = project.run("--dlcheck=V2")
    run.assert_outcome("V2", "failed")
    text = section(run, "V2")
    assert "dlcheck_eval_fn raised AssertionError: targets should not be none when in training mode" in text


def test_nothing_to_judge_skips(project):
    project.conftest("""
        import pytest, tiny_vision as tv

        @pytest.fixture(scope="session")
        def dlcheck_model():
            return tv.resnet18(4)
    """)
    run = project.run("--dlcheck=V2")
    run.assert_outcome("V2", "skipped")
    assert "dlcheck_eval_dataloader or dlcheck_eval_dataset" in run.text


def test_language_model_data_is_not_applicable(project):
    """A causal LM's token batches hold no image: no vision check concerns them, none asks for a fixture
    (V2 no eval data, V4 and V7 no model)."""
    project.conftest("""
        import pytest, tiny
        from transformers import DataCollatorForLanguageModeling

        @pytest.fixture(scope="session")
        def dlcheck_tokenizer():
            return tiny.tokenizer()

        @pytest.fixture(scope="session")
        def dlcheck_collator(dlcheck_tokenizer):
            return DataCollatorForLanguageModeling(dlcheck_tokenizer, mlm=False)

        @pytest.fixture(scope="session")
        def dlcheck_dataset(dlcheck_tokenizer):
            return tiny.tokenized(dlcheck_tokenizer)
    """)
    run = project.run("--dlcheck=vision")
    for cid in ("V1", "V2", "V3", "V4", "V5", "V6", "V7", "V8"):
        run.assert_outcome(cid, "skipped")
    run.fnmatch(
        [
            "n/a:*not applicable: batch 0 of dlcheck_dataloader has no image field (keys: input_ids, attention_mask, "
            "labels): the data holds no images, so no vision check concerns it (8 checks)"
        ]
    )
    assert "missing role" not in run.text


PAIRS = """
    import random, pytest, torch

    class Pairs(torch.utils.data.Dataset):  # pytorch/examples siamese_network's APP_MATCHER: no transform
        def __init__(self, fixed):
            g = torch.Generator().manual_seed(0)
            self.images = torch.rand(8, 1, 8, 8, generator=g)
            rng = random.Random(0)
            self.pairs = [(rng.randrange(8), rng.randrange(8)) for _ in range(8)] if fixed else None

        def __len__(self):
            return 8

        def __getitem__(self, i):
            # a new pair of images on every read (the pair drawn once, in __init__, in the correct twin)
            a, b = self.pairs[i] if self.pairs is not None else (random.randrange(8), random.randrange(8))
            return self.images[a], self.images[b], torch.tensor(float(a % 2 == b % 2))

    @pytest.fixture(scope="session")
    def dlcheck_eval_dataset():
        return Pairs(fixed={fixed})
"""


@pytest.mark.parametrize("fixed, outcome", [(False, "failed"), (True, "passed")])
def test_an_eval_dataset_drawing_in_its_own_getitem(project, fixed, outcome):
    project.conftest(PAIRS.format(fixed=fixed))
    run = project.run("--dlcheck=V2", "-rA")
    run.assert_outcome("V2", outcome)
    if outcome == "failed":
        text = section(run, "V2")
        assert "the eval dataset (Pairs) has no transform: the draw is in the dataset itself" in text, text
        assert "the eval dataset draws at random on every read of an index" in text, text
        assert "RandomResizedCrop" not in text, text


MAE_EVAL = """
    import pytest, torch, tiny_vision as tv
    from torchvision import transforms as T1

    @pytest.fixture(scope="session")
    def dlcheck_eval_dataset():
        tf = T1.Compose([T1.{crop}, T1.ToTensor(), T1.Normalize([0.5] * 3, [0.5] * 3)])

        def preprocess(examples):  # run_mae's: the raw image column is kept beside pixel_values
            examples["pixel_values"] = [tf(image.convert("RGB")) for image in examples["image"]]
            return examples

        ds = tv.hf_images([i % 4 for i in range(8)], size=40)
        ds.set_transform(preprocess)
        return ds
"""


@pytest.mark.parametrize(
    "crop, outcome", [("RandomResizedCrop(32, scale=(0.2, 1.0))", "failed"), ("CenterCrop(32)", "passed")]
)
def test_the_transformed_pixel_values_are_judged_not_the_raw_image_column_beside_them(project, crop, outcome):
    """transformers' run_mae, found blind: its validation split gets the training crops through set_transform, which
    keeps the raw 'image' column beside 'pixel_values'; V2 compared the raw column (identical) and passed."""
    project.conftest(MAE_EVAL.format(crop=crop))
    run = project.run("--dlcheck=V2", "-rA")
    run.assert_outcome("V2", outcome)
    if outcome == "failed":
        assert "% of pixel values differ" in section(run, "V2")


def test_a_given_eval_loader_of_token_batches_is_not_a_missing_role(project):
    """llm.c and llama2.c, found blind: V2 asked for dlcheck_eval_dataloader, which was given (a list of (x, y) token
    batches): data without images is not V2's, said so."""
    project.conftest("""
        import pytest, torch
        from torch.utils.data import DataLoader, TensorDataset

        @pytest.fixture(scope="session")
        def dlcheck_eval_dataloader():
            g = torch.Generator().manual_seed(0)
            ids = torch.randint(0, 50, (16, 9), generator=g)
            return list(DataLoader(TensorDataset(ids[:, :-1], ids[:, 1:]), batch_size=4))
    """)
    run = project.run("--dlcheck=V2", "-rs")
    run.assert_outcome("V2", "skipped")
    assert "missing role" not in run.text
    assert "not applicable" in run.text and "holds no images" in run.text
