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
    run = project.run("--dlcheck=S1,S2,S3", "-rA")
    for cid in ("S1", "S2", "S3"):
        run.assert_outcome(cid, "passed")
    run.fnmatch(
        [
            "20-step smoke run: losses * -> *; the highest loss against the mean of the 5 steps before it is * x "
            "(step *; a spike is 3.0 x)"
        ]
    )
    run.fnmatch(
        [
            "20-step smoke run: gradient norms * -> *, at most * = * x the median * of steps 1-3 (step *; an "
            "explosion is 10.0 x)"
        ]
    )


REINFORCE = """
    @pytest.fixture(scope="session")
    def dlcheck_compute_loss():
        def loss(model, batch):
            # REINFORCE on the blobs: sample a class, reward 1 when it is right, baseline the batch mean
            x, y = batch
            logp = torch.log_softmax(model(x), -1)
            action = torch.multinomial(logp.exp().detach(), 1, generator=torch.Generator().manual_seed(0)).squeeze(1)
            reward = (action == y).float()
            return -(logp.gather(1, action[:, None]).squeeze(1) * (reward - reward.mean())).mean()
        return loss
"""


def test_a_policy_gradient_loss_is_not_judged_by_spikes(project):
    """A REINFORCE loss is centred on 0 and negative half the time: a spike as a multiple of its running mean
    means nothing, and S2 says so instead of passing or failing."""
    project.conftest(project_with_lr("0.05") + REINFORCE)
    run = project.run("--dlcheck=S2")
    run.assert_outcome("S2", "skipped")
    run.fnmatch(
        [
            "*not applicable: the loss takes negative values (step *: -*; a policy-gradient objective such as "
            "GRPO's): a spike as a multiple of its running mean means nothing*"
        ]
    )
