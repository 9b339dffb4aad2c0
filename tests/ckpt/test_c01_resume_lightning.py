"""C1 for a Lightning user: ModelCheckpoint's .ckpt and fit(ckpt_path=...)."""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "train"))
import tiny_lightning as tl  # noqa: E402
import tiny_train as tt  # noqa: E402


def test_deterministic_lightning_project_resumes_exactly(project):
    project.conftest(tl.project())
    run = project.run("--dlcheck=C1", "-rA")
    run.assert_outcome("C1", "passed")
    run.fnmatch(
        [
            "4 steps, saved after step 2 through ModelCheckpoint's epoch=0-step=2.ckpt and fit(ckpt_path=...), "
            "resumed on fresh objects: the losses, learning rates, weights of steps 3-4 equal the uninterrupted "
            "run's, bitwise"
        ]
    )


def test_dropout_and_shuffling_without_saved_rng(project):
    project.conftest(tl.project(module="dropout=0.3", data="shuffle=True"))
    run = project.run("--dlcheck=C1")
    run.assert_outcome("C1", "failed")
    text = tt.section(run, "C1")
    assert "ModelCheckpoint's epoch=0-step=2.ckpt and fit(ckpt_path=...)" in text
    assert "putting back rng from the uninterrupted run" in text
    assert "Lightning checkpoints hold no RNG state" in text and "C1.check_rng=false" in text
    # accepted when the user says an exact resume but for random draws is enough: the evidence says so
    run = project.run("--dlcheck=C1", "--dlcheck-set=C1.check_rng=false", "-rA")
    run.assert_outcome("C1", "passed")
    run.fnmatch(
        [
            "4 steps, saved after step 2 through ModelCheckpoint's epoch=0-step=2.ckpt and fit(ckpt_path=...), "
            "resumed on fresh objects: the resumed run differs at step * only by the RNG state, which "
            "C1.check_rng=false accepts",
            "putting back rng from the uninterrupted run after the load makes the resumed run identical (* "
            "diagnostic resumes)",
        ]
    )
