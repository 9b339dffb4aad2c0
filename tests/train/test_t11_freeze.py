"""T11: a freeze that does not take effect (`module.requires_grad = False` is an attribute on a Module)."""

import tiny_train as tt


class Frozen:
    """Model expressions for tt.loop_project: the body frozen by attribute (no effect) or by the method."""

    ATTRIBUTE = "tt.frozen_body(tt.MLP(), by_attribute=True)"
    METHOD = "tt.frozen_body(tt.MLP(), by_attribute=False)"


def test_requires_grad_attribute_on_a_module_freezes_nothing(project):
    project.conftest(tt.loop_project(model=Frozen.ATTRIBUTE))
    run = project.run("--dlcheck=T11")
    run.assert_outcome("T11", "failed")
    text = tt.section(run, "T11")
    assert "body.requires_grad = False is a plain attribute: 2 of its parameter tensors (288 values) still" in text
    assert "body.requires_grad_(False)" in text


def test_requires_grad_method_freezes_and_passes(project):
    project.conftest(tt.loop_project(model=Frozen.METHOD))
    run = project.run("--dlcheck=T11", "-rA")
    run.assert_outcome("T11", "passed")
    run.fnmatch(["*no module of the model of * carries a requires_grad attribute; 2 of 4 parameter tensors require*"])
