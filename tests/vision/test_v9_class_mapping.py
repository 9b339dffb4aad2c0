"""V9: the train and eval splits number their classes alike (torchvision ImageFolder on real folders)."""

from helpers import flat

PROJECT = """
    import pytest
    from PIL import Image
    from torchvision import transforms
    from torchvision.datasets import ImageFolder

    def split(root, classes):
        for i, name in enumerate(classes):
            folder = root / name
            folder.mkdir(parents=True)
            for j in range(2):
                Image.new("RGB", (8, 8), (40 * i, 10 * j, 90)).save(folder / f"{{j}}.png")
        return ImageFolder(str(root), transform=transforms.ToTensor())

    @pytest.fixture(scope="session")
    def dlcheck_dataset(tmp_path_factory):
        return split(tmp_path_factory.mktemp("data") / "train", ["cat", "dog", "fox"])

    @pytest.fixture(scope="session")
    def dlcheck_eval_dataset(tmp_path_factory):
        return split(tmp_path_factory.mktemp("data") / "val", {val})
"""


def test_a_class_folder_missing_from_the_eval_split_shifts_every_label(project):
    project.conftest(PROJECT.format(val='["dog", "fox"]'))  # no cat images collected for validation yet
    run = project.run("--dlcheck=V9")
    run.assert_outcome("V9", "failed")
    text = flat(run.section("V9"))
    assert "only in the training data: cat" in text
    assert "2 classes have another index: 'dog' train 1 / eval 0, 'fox' train 2 / eval 1" in text
    assert "ImageFolder sorts each split's own folder names" in text and "find_classes" in text


def test_the_same_class_folders_are_numbered_alike(project):
    project.conftest(PROJECT.format(val='["cat", "dog", "fox"]'))
    run = project.run("--dlcheck=V9", "-rA")
    run.assert_outcome("V9", "passed")
    run.fnmatch(["*3 classes numbered alike in the training (dlcheck_dataset, ImageFolder.class_to_idx)*"])


def test_data_without_class_names_is_not_concerned(project):
    project.conftest(
        """
    import pytest, torch
    from torch.utils.data import TensorDataset

    @pytest.fixture(scope="session")
    def dlcheck_dataset():
        return TensorDataset(torch.randn(8, 3, 8, 8), torch.randint(0, 3, (8,)))
    """
    )
    run = project.run("--dlcheck=V9", "-rs")
    run.assert_outcome("V9", "skipped")
    run.fnmatch(["*not applicable: dlcheck_dataset names no classes*"])
