"""S2 and S3: a learning rate that diverges in a few steps spikes the loss and explodes the gradients."""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "train"))
import tiny_train as tt  # noqa: E402


def project_with_lr(lr: str) -> str:
    return tt.loop_project(optimizer=f"torch.optim.SGD(model.parameters(), lr={lr})")


def test_a_diverging_learning_rate(project):
    project.conftest(project_with_lr("3.0"))
    run = project.run("--dlcheck=S1,S2,S3")
    run.assert_outcome("S2", "failed")
    run.assert_outcome("S3", "failed")
    spike = tt.section(run, "S2")
    assert "step 5 of 20: loss 1171 = 130.9 x the mean 8.951 of the 4 steps before it (limit 3.0 x)" in spike
    assert "lr 3 is too high" in spike and "lower the learning rate" in spike
    grads = tt.section(run, "S3")
    assert "step 5 of 20: gradient norm 155.5 = 12 x the median 12.92 of steps 1-3 (limit 10.0 x)" in grads
    assert "clip gradients" in grads


def test_a_sane_learning_rate(project):
    project.conftest(project_with_lr("0.05"))
    run = project.run("--dlcheck=S1,S2,S3")
    for cid in ("S1", "S2", "S3"):
        run.assert_outcome(cid, "passed")
