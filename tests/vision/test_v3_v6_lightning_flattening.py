"""V3 / V6 on a Lightning module whose training_step flattens the images before its forward (Lightning's autoencoder
example): the class count is read from the forward's output inside the step, never from a forward on an image the
check hands it; labels the loss never reads (the autoencoder's) are not class ids of the training."""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "train"))
import tiny_lightning as tl  # noqa: E402
import tiny_train as tt  # noqa: E402


def test_labels_the_autoencoders_loss_never_reads_are_not_judged_as_classes(project):
    project.conftest(tl.flat_project())
    run = project.run("--dlcheck=V3,V6", "-rs")
    for cid in ("V3", "V6"):
        run.assert_outcome(cid, "skipped")
    run.fnmatch(
        [
            "*V3_*: not applicable: V3 judges class ids against the model's head; the training's loss (*) does not "
            "read the batch's labels (int64 (8,)): it is * with them and the same, to the bit, with them shuffled among the "
            "batch's examples*"
        ]
    )
    run.fnmatch(["*V6_*: not applicable: V6 judges the class balance the loss trains on; the training's loss*"])


def test_one_based_labels_for_a_flattening_classifier_fail(project):
    project.conftest(tl.flat_project(cls="FlatClassifier", data="offset=1"))
    run = project.run("--dlcheck=V3")
    run.assert_outcome("V3", "failed")
    text = tt.section(run, "V3")
    assert "the model's output in its training_step" in text
    assert "10" in text and "1-based" in text


def test_zero_based_labels_for_a_flattening_classifier_pass(project):
    project.conftest(tl.flat_project(cls="FlatClassifier"))
    run = project.run("--dlcheck=V3", "-rA")
    run.assert_outcome("V3", "passed")
    run.fnmatch(["*all in 0..9 (num_classes 10 from the model's output in its training_step)*"])
