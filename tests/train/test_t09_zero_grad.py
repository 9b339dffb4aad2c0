"""T9: gradients reset between optimizer steps, told apart from deliberate gradient accumulation."""

import tiny_train as tt

STEP = """
    @pytest.fixture(scope="session")
    def dlcheck_train_step():
        def step(state, batch, i):
            model, opt = state["model"], state["optimizer"]
            x, y = batch
            loss = nn.functional.cross_entropy(model(x), y) / {accum}
            loss.backward()
            if (i + 1) % {accum} == 0:
                opt.step()
                {zero}
            return loss.detach() * {accum}
        return step
"""


def test_a_step_without_zero_grad_fails(project):
    project.conftest(tt.loop_project(extra=STEP.format(accum=1, zero="pass  # zero_grad forgotten")))
    run = project.run("--dlcheck=T9")
    run.assert_outcome("T9", "failed")
    text = tt.section(run, "T9")
    # the verdict is in after the backward that follows the second step: no further step is spent
    assert (
        "3 calls of dlcheck_train_step made 3 optimizer step(s); after step 1, the next backward found .grad of "
        "'body.0.bias'" in text
    ), text
    assert "still holding exactly the gradient that step used" in text and "0 reset" in text
    assert "never zeroed between optimizer steps" in text and "zero_grad(set_to_none=True)" in text


def test_accumulation_that_forgets_to_zero_after_its_step_fails(project):
    project.conftest(tt.loop_project(extra=STEP.format(accum=2, zero="pass")))
    run = project.run("--dlcheck=T9")
    run.assert_outcome("T9", "failed")
    assert "5 calls of dlcheck_train_step made 2 optimizer step(s); after step 1" in tt.section(run, "T9")


def test_deliberate_accumulation_that_zeroes_after_each_step_passes(project):
    project.conftest(tt.loop_project(extra=STEP.format(accum=2, zero="opt.zero_grad(set_to_none=True)")))
    run = project.run("--dlcheck=T9", "-rA")
    run.assert_outcome("T9", "passed")
    run.fnmatch(
        [
            "*5 calls of dlcheck_train_step made 2 optimizer step(s); the backward after each of the first 2 found "
            "the watched gradients reset*"
        ]
    )


def test_a_reset_skipped_every_other_step_fails_at_the_second_step(project):
    """zero_grad under a condition that holds every other step: the first step's gradients are reset, the second's
    are not — the watch judges two steps before it stops."""
    project.conftest(tt.loop_project(extra=STEP.format(accum=1, zero="if i % 2 == 0: opt.zero_grad()")))
    run = project.run("--dlcheck=T9")
    run.assert_outcome("T9", "failed")
    text = tt.section(run, "T9")
    assert "3 calls of dlcheck_train_step made 3 optimizer step(s); after step 2, the next backward found" in text
    assert "still holding exactly the gradient that step used" in text


def test_zeroing_to_zeros_instead_of_none_passes(project):
    project.conftest(tt.loop_project(extra=STEP.format(accum=1, zero="opt.zero_grad(set_to_none=False)")))
    run = project.run("--dlcheck=T9")
    run.assert_outcome("T9", "passed")


def test_the_default_step_is_not_concerned(project):
    project.conftest(tt.loop_project())
    run = project.run("--dlcheck=T9", "-rs")
    run.assert_outcome("T9", "skipped")
    run.fnmatch(["*not applicable: no dlcheck_train_step: the default step zeroes the gradients itself*"])
