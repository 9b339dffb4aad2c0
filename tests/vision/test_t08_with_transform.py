"""T8 on datasets.Dataset splits read through a with_transform function (transformers' vision examples): the stored
columns are compared, never one column handed alone to the user's transform (which reads the others)."""

import pytest
import tiny_vision  # noqa: F401  (torchvision and the vision roles imported once, outside the runs)

PROJECT = """
    import pytest, tiny_vision as tv
    from torchvision import transforms as T1

    TF = T1.Compose([T1.RandomHorizontalFlip(), T1.ToTensor()])
    TRAIN = tv.hf_images([i % 2 for i in range(12)])

    def split(ds):  # run_semantic_segmentation_no_trainer's shape: the transform needs the image column
        return tv.with_pixel_values(ds, TF)

    @pytest.fixture(scope="session")
    def dlcheck_dataset():
        return split(TRAIN)

    @pytest.fixture(scope="session")
    def dlcheck_eval_dataset():
        return split({eval})
"""


@pytest.mark.parametrize(
    "eval_split, outcome",
    [("TRAIN.select(range(4))", "failed"), ("tv.hf_images([0, 1, 0, 1], size=24)", "passed")],
)
def test_splits_behind_a_with_transform_function_are_compared_by_their_stored_columns(project, eval_split, outcome):
    project.conftest(PROJECT.format(eval=eval_split))
    run = project.run("--dlcheck=T8", "-rA")
    run.assert_outcome("T8", outcome)
    text = " ".join(run.text.split())
    assert "KeyError" not in text and "your role raised" not in text, text
    if outcome == "failed":
        assert "4 of 4 eval examples (100%) are also in the 12 training examples" in text, text
