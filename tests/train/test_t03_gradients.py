"""T3: every trainable parameter gets a gradient, and the optimizer holds it."""

import tiny_train as tt


def test_detached_body_is_frozen_by_accident(project):
    project.conftest(tt.loop_project(model="tt.DetachedBodyMLP()"))
    run = project.run("--dlcheck=T3")
    run.assert_outcome("T3", "failed")
    text = tt.section(run, "T3")
    assert "2 of 4 trainable parameter tensors get no gradient" in text
    assert "body.0.weight [32x8]" in text and "module(s) that run but pass no gradient back: body.0" in text
    assert "the last of them to run is body.0: the graph is cut at its output" in text
    assert "detach" in text


def swap_head(where: str) -> str:
    """Transfer learning: a new head for the task's classes, swapped in before or after the optimizer."""
    build = "tt.MLP()"
    swap = "model.head = nn.Linear(32, 4)"
    return tt.loop_project(
        model=build + (f"; {swap}" if where == "before" else ""),
        optimizer="torch.optim.AdamW(model.parameters(), lr=1e-2)" + (f"; {swap}" if where == "after" else ""),
    )


def test_head_swapped_after_building_the_optimizer(project):
    project.conftest(swap_head("after"))
    run = project.run("--dlcheck=T3")
    run.assert_outcome("T3", "failed")
    text = tt.section(run, "T3")
    assert (
        "2 of 4 parameter tensors that get a gradient are in no param group of the AdamW: head.weight [4x32], head.bias [4]"
        in text
    )
    assert "no longer parameters of the model: [4x32], [4]" in text
    assert "build the optimizer after every change to the model" in text


def test_head_swapped_before_building_the_optimizer_passes(project):
    project.conftest(swap_head("before"))
    run = project.run("--dlcheck=T3", "-rA")
    run.assert_outcome("T3", "passed")
    run.fnmatch(["the AdamW holds all 4 of them in 1 param group(s) with lr 0.01"])


def test_clean_mlp_passes(project):
    project.conftest(tt.loop_project())
    run = project.run("--dlcheck=T3", "-rA")
    run.fnmatch(["*::T3_gradients PASSED (all 4 trainable parameter tensors get a gradient from the loss on*"])
    run.fnmatch(
        [
            "all 4 trainable parameter tensors get a gradient from the loss on batch 0 (loss 1.493)",
            "the AdamW holds all 4 of them in 1 param group(s) with lr 0.01",
        ]
    )


def test_a_frozen_body_is_reported_as_not_judged(project):
    project.conftest(
        tt.loop_project(
            model="tt.MLP(); model.body.requires_grad_(False)",
            optimizer="torch.optim.AdamW(model.head.parameters(), lr=1e-2)",
        )
    )
    run = project.run("--dlcheck=T3", "-rA")
    run.assert_outcome("T3", "passed")
    run.fnmatch(
        [
            "all 2 trainable parameter tensors get a gradient from the loss on batch 0 (loss 1.493); 2 parameter "
            "tensors are frozen (requires_grad=False) and not judged",
            "the AdamW holds all 2 of them in 1 param group(s) with lr 0.01",
        ]
    )


METRIC_MODEL = """

    import torchmetrics

    class MetricMLP(tt.MLP):
        # a torchmetrics Metric inside the model, updated in forward: its hash follows its state
        def __init__(self):
            super().__init__()
            self.acc = torchmetrics.classification.MulticlassAccuracy(num_classes=4)

        def forward(self, x):
            out = super().forward(x)
            self.acc(out.detach().argmax(-1), torch.zeros(len(out), dtype=torch.long))
            return out
"""


def test_a_metric_module_whose_hash_follows_its_state_is_no_crash(project):
    # modules are told apart by identity: a Metric's hash changes as its forward updates it (was KeyError in T3)
    project.conftest(tt.loop_project(model="MetricMLP()", extra=METRIC_MODEL))
    run = project.run("--dlcheck=T3,T4,T5", "-rA")
    for cid in ("T3", "T4", "T5"):
        run.assert_outcome(cid, "passed")
    assert "KeyError" not in run.text
