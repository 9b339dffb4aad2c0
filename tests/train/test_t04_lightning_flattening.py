"""T4 on a Lightning module whose forward takes what its training_step makes of the batch (Lightning's autoencoder
example flattens the images first): the forward is called on those inputs, never on the loader's batch."""

import tiny_lightning as tl
import tiny_train as tt


def test_a_forward_that_mixes_the_batch_fails_on_the_flattened_inputs(project):
    project.conftest(tl.flat_project(module="mix=True"))
    run = project.run("--dlcheck=T4")
    run.assert_outcome("T4", "failed")
    text = tt.section(run, "T4")
    assert "the output of example 0 depends on the input of example" in text
    assert "forward's input as FlatAutoEncoder.training_step gives it: float32 (8, 144)" in text
    assert "a view/reshape that moves data across dim 0" in text


def test_the_autoencoder_example_passes(project):
    project.conftest(tl.flat_project())
    run = project.run("--dlcheck=T4", "-rA")
    run.assert_outcome("T4", "passed")
    run.fnmatch(["*forward's input as FlatAutoEncoder.training_step gives it: float32 (8, 144)*"])


def test_a_step_that_calls_its_submodules_is_judged_on_the_first_one_only(project):
    project.conftest(tl.flat_project(module="direct=True"))
    run = project.run("--dlcheck=T4", "-rA")
    run.assert_outcome("T4", "passed")
    run.fnmatch(["*T4_batch_independence PASSED (*; partly judged: the rest of the step not judged)*"])
    run.fnmatch(["*the input of encoder (Sequential) as FlatAutoEncoder.training_step gives it: float32 (8, 144)*"])


def test_a_submodule_the_step_calls_that_mixes_the_batch_fails(project):
    project.conftest(tl.flat_project(module="mix='encoder', direct=True"))
    run = project.run("--dlcheck=T4")
    run.assert_outcome("T4", "failed")
    text = tt.section(run, "T4")
    assert "the input of encoder (Sequential) as FlatAutoEncoder.training_step gives it: float32 (8, 144)" in text
    assert "the first module whose output mixes the examples: encoder.3 (Centre)" in text
