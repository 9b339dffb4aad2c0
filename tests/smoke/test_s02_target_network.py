"""S2 on a TD loss: a model keeping a target network (a copy of the trained network, in no optimizer, updated by
copying its weights) has a loss against moving targets, which jumps at each sync: S2's spike and rise rules do not
apply (Lightning's reinforce_learn_Qnet failed S2 at the step after its target sync while S1 and S3 saw the loss and
the gradient norm fall)."""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "train"))
from test_t03_gradients import TARGET_NET  # noqa: E402

WITH_COPY = TARGET_NET.format(
    params="model.net.parameters()",
    target="with torch.no_grad():\n                t = model.target_net(s2).max(1).values",
)


def test_a_model_with_a_target_network_is_not_judged_for_spikes(project):
    project.conftest(WITH_COPY)
    run = project.run("--dlcheck=S2", "-rA")
    run.assert_outcome("S2", "skipped")
    text = " ".join(run.text.split())
    assert "not applicable: the model keeps a target network: target_net has the very parameters of net" in text, text


def test_the_same_towers_both_in_the_optimizer_are_judged(project):
    # no copy outside the optimizer: two trained towers, whose loss S2 judges as any other
    project.conftest(
        TARGET_NET.format(params="model.parameters()", target="t = model.target_net(s2).max(1).values.detach()")
    )
    run = project.run("--dlcheck=S2", "-rA")
    assert run.outcome("S2") in ("passed", "failed"), run.text
    assert "target network" not in run.text
