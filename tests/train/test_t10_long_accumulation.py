"""T9 and T10 under an accumulation longer than their default watch (8 calls): the watch is lengthened, as C1's and
C10's runs are (doubled up to 64 micro-steps), until the optimizer step comes, and says so."""

import tiny_train as tt
from test_t09_zero_grad import STEP as T9_STEP
from test_t10_grad_accumulation import PER_MICRO_BATCH_MEAN, TOKEN_SUM, lm_project

# sixteen micro-batches of one example each per optimizer step (global batch 16, micro-batch 1): every example's
# own token mean divided by 16 weighs each example alike whatever its length (examples of 1 to ~45 tokens)
LONG = {"ACCUM = 2": "ACCUM = 16", "batch_size=2": "batch_size=1"}


def long_project(step: str) -> str:
    source = lm_project(step)
    for old, new in LONG.items():
        assert old in source
        source = source.replace(old, new)
    return source


def test_a_per_example_token_mean_over_an_accumulation_of_16_fails(project):
    project.conftest(long_project(PER_MICRO_BATCH_MEAN))
    run = project.run("--dlcheck=T10")
    run.assert_outcome("T10", "failed")
    text = tt.section(run, "T10")
    assert "the optimizer step at call 16 of dlcheck_train_step closes an accumulation of k=16 micro-batches" in text
    assert "T10.micro_steps=8 calls held no optimizer step: the watch was lengthened to 16 calls" in text, text
    assert "the plain mean of the 16 micro-batch token-mean gradients" in text


def test_a_token_sum_over_an_accumulation_of_16_passes(project):
    project.conftest(long_project(TOKEN_SUM))
    run = project.run("--dlcheck=T10", "-rA")
    run.assert_outcome("T10", "passed")
    text = " ".join(run.text.split())
    assert "closes an accumulation of k=16 micro-batches" in text
    assert "the watch was lengthened to 16 calls" in text
    assert "matches the full-batch gradient (sum of token losses" in text


def test_an_accumulation_past_the_bound_is_not_judged_and_says_how_far_it_went(project):
    project.conftest(long_project(PER_MICRO_BATCH_MEAN).replace("ACCUM = 16", "ACCUM = 100"))
    run = project.run("--dlcheck=T10", "-rs")
    run.assert_outcome("T10", "skipped")
    run.fnmatch(["*64 calls of dlcheck_train_step took no optimizer step (T10.micro_steps=8 doubled to 64 calls*"])


def test_t9_watches_past_an_accumulation_of_16(project):
    forgotten = tt.loop_project(extra=T9_STEP.format(accum=16, zero="pass"))
    project.conftest(forgotten)
    run = project.run("--dlcheck=T9")
    run.assert_outcome("T9", "failed")
    text = tt.section(run, "T9")
    assert "made 2 optimizer step(s); after step 1" in text, text
    assert "the watch was lengthened to 32 calls" in text, text
    project.conftest(tt.loop_project(extra=T9_STEP.format(accum=16, zero="opt.zero_grad(set_to_none=True)")))
    run = project.run("--dlcheck=T9", "-rA")
    run.assert_outcome("T9", "passed")
    text = " ".join(run.text.split())
    assert "made 2 optimizer step(s)" in text and "found the watched gradients reset" in text, text
    assert "the watch was lengthened to 32 calls" in text, text
