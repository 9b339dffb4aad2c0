"""T5: finite data, activations, loss and gradients."""

import tiny_train as tt

POINTS = """
    import pytest, torch, tiny_train as tt
    import torch.nn.functional as F

    @pytest.fixture(scope="session")
    def dlcheck_make_training():
        def make():
            model = tt.DeepSets().to(torch.{dtype})
            return {{"model": model, "optimizer": torch.optim.AdamW(model.parameters(), lr=1e-3)}}
        return make

    @pytest.fixture(scope="session")
    def dlcheck_dataloader():
        return torch.utils.data.DataLoader(tt.point_clouds(), batch_size=4)

    @pytest.fixture(scope="session")
    def dlcheck_compute_loss():
        return lambda model, batch: F.cross_entropy(model(batch[0].to(torch.{dtype})).float(), batch[1])
"""


def test_float16_sum_pooling_overflows(project):
    project.conftest(POINTS.format(dtype="float16"))
    run = project.run("--dlcheck=T5")
    run.assert_outcome("T5", "failed")
    text = tt.section(run, "T5")
    assert "the first module with a non-finite output is rho (Linear, float16)" in text
    assert "its input already holds" in text and "after phi overflowed" in text
    assert "float16 overflow" in text and "bfloat16" in text


def test_bfloat16_has_the_range(project):
    project.conftest(POINTS.format(dtype="bfloat16"))
    run = project.run("--dlcheck=T5", "-rA")
    run.assert_outcome("T5", "passed")
    run.fnmatch(
        [
            "2 sampled batch(es): 2 float field(s) finite; on 2 batch(es) in train mode, every module output finite "
            "(5 outputs), loss *, *, the gradients of 4 parameter tensors finite"
        ]
    )


def test_nan_in_the_data(project):
    project.conftest(tt.loop_project(loader="torch.utils.data.DataLoader(tt.with_nan(tt.blobs()), batch_size=8)"))
    run = project.run("--dlcheck=T5")
    run.assert_outcome("T5", "failed")
    text = tt.section(run, "T5")
    assert "batch 0: field batch[0] (float32 (8, 8)) holds 1 non-finite values (1 NaN, 0 Inf)" in text
    assert "the data itself contains NaN" in text


def test_clean_mlp_passes(project):
    project.conftest(tt.loop_project())
    run = project.run("--dlcheck=T5", "-rA")
    run.fnmatch(["*::T5_finite PASSED (2 sampled batch(es): 2 float field(s) finite; on 2 batch(es) in train*"])
    run.fnmatch(
        [
            "2 sampled batch(es): 2 float field(s) finite; on 2 batch(es) in train mode, every module output finite "
            "(6 outputs), loss 1.493, 1.51, the gradients of 4 parameter tensors finite"
        ]
    )


def test_a_loss_inside_the_step_is_watched_through_the_step(project):
    """A loop whose model does not take the batch and whose loss lives inside its step: T5 watches the step's
    modules, loss and gradients (it used to ask for dlcheck_compute_loss)."""
    from test_t03_gradients import DICT_STEP

    project.conftest(DICT_STEP.format(model="tt.MLP()"))
    run = project.run("--dlcheck=T5", "-rA")
    run.assert_outcome("T5", "passed")
    text = " ".join(run.text.split())
    assert (
        "call(s) of dlcheck_train_step on fresh objects from dlcheck_make_training (its loss is computed inside" in text
    )
    assert "every module output finite (" in text and "the gradients of 4 parameter tensors finite" in text, text


def test_a_step_whose_log_overflows_fails_through_the_step(project):
    from test_t03_gradients import DICT_STEP

    # a log of a softmax taken by hand on logits scaled up to overflow: Inf -> NaN in the loss the step returns
    project.conftest(
        DICT_STEP.format(model="tt.MLP()").replace(
            'loss = nn.functional.cross_entropy(state["model"](batch["image"]), batch["label"])',
            'p = torch.softmax(state["model"](batch["image"]) * 1e4, -1)\n'
            '            loss = -torch.log(p[torch.arange(len(p)), batch["label"]]).mean()',
        )
    )
    run = project.run("--dlcheck=T5")
    run.assert_outcome("T5", "failed")
    text = " ".join(run.section("T5").split())
    assert "call(s) of dlcheck_train_step on fresh objects" in text, text
    # the first thing to go wrong is named, not its consequence (the NaN weights of the next call)
    assert "at call 1 the step returned the loss inf while every module output was finite" in text, text
