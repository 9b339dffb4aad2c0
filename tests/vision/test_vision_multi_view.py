"""Multi-view (multi-crop) batches of a self-supervised pipeline (SimCLR, BYOL, DINO, SwAV): each example is a list of
augmented crops of one image (two global crops and several smaller local ones, DINO's DataAugmentationDINO), so the
default collate yields [list of (B, 3, H, W) crop batches of two sizes, labels]. Found blind (set 14, DINO's
main_dino.py): the vision checks had said "the data holds no images" and T5 "no float field" — the crops sit one
level down, in a list."""

import tiny_vision  # noqa: F401  (torchvision, timm and the plugin's roles imported once, outside the runs)
from tiny_vision import section

MULTI_CROP = """
    import pytest, torch, tiny_vision as tv
    from torchvision.transforms import v2 as T

    class MultiCrop:
        # DINO's DataAugmentationDINO: 2 global crops + 4 local crops, each a tensor
        def __init__(self, scale):
            tail = [T.ToDtype(torch.float32, scale=scale), T.Normalize(list(tv.IMAGENET_MEAN), list(tv.IMAGENET_STD))]
            self.big = T.Compose([T.ToImage(), T.RandomResizedCrop(32, scale=(0.4, 1.0)), T.RandomHorizontalFlip(), *tail])
            self.small = T.Compose([T.ToImage(), T.RandomResizedCrop(16, scale=(0.05, 0.4)), *tail])

        def __call__(self, img):
            crops = [self.big(img), self.big(img)] + [self.small(img) for _ in range(4)]
            if {nan}:
                crops[2] = torch.full_like(crops[2], float("nan"))  # a broken local crop
            return crops

    @pytest.fixture(scope="session")
    def dlcheck_dataloader():
        ds = tv.Shapes([i % 4 for i in range(16)], transform=MultiCrop(scale={scale}))
        return torch.utils.data.DataLoader(ds, batch_size=4, shuffle=True, drop_last=True)
"""

STEP = """
    @pytest.fixture(scope="session")
    def dlcheck_make_training():
        def make():
            torch.manual_seed(0)
            model = torch.nn.Sequential(
                torch.nn.Conv2d(3, 4, 3), torch.nn.AdaptiveAvgPool2d(1), torch.nn.Flatten(), torch.nn.Linear(4, 8)
            )
            return {"model": model, "optimizer": torch.optim.SGD(model.parameters(), lr=0.01)}

        return make

    @pytest.fixture(scope="session")
    def dlcheck_train_step():
        def step(state, batch, index=None):
            crops, _ = batch  # self-supervised: the labels are not used
            out = [state["model"](c).softmax(-1) for c in crops]
            loss = sum(-(out[0].detach() * (o + 1e-6).log()).sum(-1).mean() for o in out[1:])
            state["optimizer"].zero_grad()
            loss.backward()
            state["optimizer"].step()
            return loss

        return step
"""


def test_unnormalised_crops_fail_v1(project):
    """Buggy twin: ToDtype without scale=True leaves every crop in 0-255."""
    project.conftest(MULTI_CROP.format(scale=False, nan=False))
    run = project.run("--dlcheck=V1")
    run.assert_outcome("V1", "failed")
    text = " ".join(section(run, "V1").split())
    assert "6 augmented views each (a multi-view batch: 48 views of 2 sizes)" in text, text
    assert "views of 32×32: dtype float32" in text and "views of 16×16: dtype float32" in text, text
    assert "raw 0–255 pixel values" in text and "scale=True" in text
    assert "holds no images" not in run.text


def test_normalised_crops_pass_v1_and_say_what_else_does_not_apply(project):
    """Correct twin: normalised crops pass V1; the other vision checks say why they do not concern these views."""
    project.conftest(MULTI_CROP.format(scale=True, nan=False))
    run = project.run("--dlcheck=vision", "-rA")
    run.assert_outcome("V1", "passed")
    text = " ".join(run.text.split())
    assert "V1_normalization PASSED (48 train images (every view of the multi-view examples): |values|" in text, text
    assert "48 views of 2 sizes" in text and "16 views of 32×32" in text and "32 views of 16×16" in text, text
    assert "holds no images" not in text, text
    assert "error" not in run.outcomes.values(), run.outcomes


def test_t5_scans_the_crops_for_nan(project):
    """T5's data scan descends into the list of crops: a NaN in one local crop is found, not 'no float field'; the
    finite crops are counted as the float fields judged."""
    project.conftest(MULTI_CROP.format(scale=True, nan=True) + STEP)
    run = project.run("--dlcheck=T5")
    run.assert_outcome("T5", "failed")
    text = " ".join(section(run, "T5").split())
    assert "field batch[0][2] (" in text and "non-finite values" in text, text

    project.conftest(MULTI_CROP.format(scale=True, nan=False) + STEP)
    run = project.run("--dlcheck=T5", "-rA")
    run.assert_outcome("T5", "passed")
    text = " ".join(run.text.split())
    assert "12 float field(s) finite" in text and "no float field" not in text, text


def test_a_dataset_of_crop_lists_is_read_view_by_view(project):
    """The same crops read from the dataset role (each example a list of crops and a label): every view is judged."""
    project.conftest(
        MULTI_CROP.format(scale=False, nan=False)
        + """
    @pytest.fixture(scope="session")
    def dlcheck_dataset(dlcheck_dataloader):
        return dlcheck_dataloader.dataset
"""
    )
    run = project.run("--dlcheck=V1")
    run.assert_outcome("V1", "failed")
    text = " ".join(section(run, "V1").split())
    assert "8 examples of dlcheck_dataset, 6 augmented views each" in text, text
    assert "16 views of 32×32" in text and "32 views of 16×16" in text, text
