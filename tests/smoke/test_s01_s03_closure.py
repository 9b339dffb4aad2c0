"""S1 and S3 read a loop's gradients where its optimizer applies them: a step that calls ``optimizer.step(closure)``
(the closure computes the loss and its gradients inside the step, as Lightning Fabric's loops do) and then
``optimizer.zero_grad()`` is judged on real norms (blind set 12's bl12_fabric_byot: S1 passed claiming a gradient
norm <= 0 it never measured, S3 skipped 'the first gradient norms are 0')."""

import re
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "train"))
import tiny_train as tt  # noqa: E402

STEP = """
    @pytest.fixture(scope="session")
    def dlcheck_train_step():
        def step(state, batch):
            x, y = batch
            model, optimizer = state["model"], state["optimizer"]

            def closure():
                loss = nn.functional.cross_entropy(model(x), y)
                {backward}
                return loss

            loss = {call}
            optimizer.zero_grad()  # after the step: no gradient is left once the step returns
            if state.get("lr_scheduler") is not None:
                state["lr_scheduler"].step()
            return loss.detach()
        return step
"""

PLAIN = STEP.format(backward="loss.backward()", call="optimizer.step(closure)")
FABRIC = (
    STEP.format(backward='state["fabric"].backward(loss)', call="optimizer.step(closure)")
    + """
    from lightning.fabric import Fabric

    FABRIC = Fabric(accelerator="cpu", devices=1)

    @pytest.fixture(scope="session")
    def dlcheck_make_training():
        def make():
            model = tt.MLP()
            model, optimizer = FABRIC.setup(model, torch.optim.SGD(model.parameters(), lr=0.05))
            return {"model": model, "optimizer": optimizer, "fabric": FABRIC}
        return make
"""
)


def closure_project(lr: str, step: str) -> str:
    return tt.loop_project(optimizer=f"torch.optim.SGD(model.parameters(), lr={lr})", extra=step)


@pytest.mark.parametrize("kind", ["plain", "fabric"])
def test_a_step_that_zeroes_after_stepping_with_a_closure_is_judged(project, kind):
    source = closure_project("0.05", PLAIN if kind == "plain" else FABRIC)
    project.conftest(source)
    run = project.run("--dlcheck=S1,S3", "-rA")
    run.assert_outcome("S1", "passed")
    run.assert_outcome("S3", "passed")
    text = " ".join(run.text.split())
    norm = re.search(r"gradient norm ≤ ([0-9.e+-]+) at 20 steps, all finite", text)
    assert norm and float(norm.group(1)) > 0, text
    assert "first gradient norms are 0" not in text and "no parameter had a gradient" not in text, text
    assert "20-step smoke run: gradient norms" in text, text


def test_an_exploding_twin_with_a_closure_fails_s3(project):
    project.conftest(closure_project("3.0", PLAIN))
    run = project.run("--dlcheck=S1,S3")
    run.assert_outcome("S3", "failed")
    text = tt.section(run, "S3")
    assert "gradient norm" in text and "x the median" in text and "clip gradients" in text, text


def test_a_step_whose_optimizer_never_sees_a_gradient_claims_no_norm(project):
    """The loss computed under torch.no_grad(): no parameter has a gradient at any step. S1 says so and leaves the
    gradients not judged, instead of a 'gradient norm <= 0' it never measured; S3 has no norm to compare."""
    step = STEP.format(backward="", call="optimizer.step(closure)").replace(
        "loss = nn.functional.cross_entropy(model(x), y)",
        "with torch.no_grad():\n                    loss = nn.functional.cross_entropy(model(x), y)",
    )
    project.conftest(closure_project("0.05", step))
    run = project.run("--dlcheck=S1,S3", "-rA")
    text = " ".join(run.text.split())
    assert run.outcome("S1") == "passed", text
    assert "gradient norm ≤" not in text, text
    assert "no parameter had a gradient at 20 optimizer step(s)" in text, text
    assert "gradients not judged" in text or "partly judged" in text, text
    run.assert_outcome("S3", "skipped")
    assert "first gradient norms are 0" not in text, text
