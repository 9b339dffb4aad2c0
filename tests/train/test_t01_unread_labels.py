"""T1 on Lightning's autoencoder example in small: its batches carry int labels, but its MSE reconstruction loss
never reads them: there are no classes, ln(C) does not apply (not a request for dlcheck_num_classes)."""

import tiny_lightning as tl


def test_an_autoencoder_whose_loss_ignores_the_labels_is_not_applicable(project):
    project.conftest(tl.flat_project())
    run = project.run("--dlcheck=T1", "-rs")
    run.assert_outcome("T1", "skipped")
    run.fnmatch(
        [
            "*T1_*: not applicable: the training's loss (*) does not read the batch's labels (int64 (8,)): it is * with "
            "them and the same, to the bit, with them shuffled among the batch's examples (both from the same seeded random "
            "state): not a cross-entropy over classes*"
        ]
    )


def test_a_classifier_with_the_same_flattening_step_is_judged(project):
    project.conftest(tl.flat_project(cls="FlatClassifier"))
    run = project.run("--dlcheck=T1", "-rA")
    run.assert_outcome("T1", "passed")
    run.fnmatch(["*ln(10)*"])
