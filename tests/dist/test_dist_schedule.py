"""D8 end to end: an Accelerate user's LR schedule in two real processes against the single-process plan of the same
factory. A cosine schedule sized in a rank's optimizer steps and passed to ``accelerator.prepare`` (stepped twice per
optimizer step on two ranks) reaches 0 half way through the run and climbs back: D8 fails naming the
AcceleratedScheduler; sized times ``num_processes`` (Accelerate's examples), or left unprepared, it passes."""

import multiprocessing
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import tiny_sched as ts  # noqa: E402


def _flat(text):
    return " ".join(text.split())


def _no_leftover_process():
    assert not multiprocessing.active_children(), multiprocessing.active_children()


def test_a_prepared_schedule_sized_in_a_ranks_steps_ends_half_way(project):
    project.conftest(ts.project("make_training_sized_per_rank"))
    run = project.run("--dlcheck=D8", "-rA")
    run.assert_outcome("D8", "failed")
    d8 = _flat(run.section("D8"))
    # 42 examples in batches of 4: 11 batches in one process, 6 per rank on two (even_batches)
    assert "AcceleratedScheduler around LambdaLR, 2 scheduler step(s) per optimizer step (measured: 6 in 3" in d8, d8
    assert "the single-process plan ends after 33 optimizer steps (3 epoch(s) of 11 batches)" in d8
    assert "a rank's epoch is 6 batches, so the same data takes 18 optimizer steps on 2 processes" in d8
    assert "on 2 processes the LR reaches 0 (its end) after optimizer step 9 of the 18 the run takes there" in d8
    assert "the single-process plan, at the same point of the data (its step 16 of 33), says" in d8
    assert "then it climbs back to" in d8 and "(the schedule restarts)" in d8
    assert "accelerator.prepare(lr_scheduler) steps the scheduler num_processes=2 times per optimizer step" in d8
    assert "the schedule ends after 50% of the run" in d8
    assert "len(train_dataloader) * num_epochs * accelerator.num_processes" in d8
    _no_leftover_process()


def test_a_prepared_schedule_sized_times_num_processes_passes(project):
    project.conftest(ts.project("make_training_sized_times_processes"))
    run = project.run("--dlcheck=D8", "-rA")
    run.assert_outcome("D8", "passed")
    run.fnmatch(
        [
            "*on 2 processes the LR reaches its end (0) after 18 optimizer steps, within the run there: the "
            "single-process plan ends after 33 optimizer steps (3 epoch(s) of 11 batches); a rank's epoch is 6 "
            "batches, so the same data takes 18 optimizer steps on 2 processes (33 counted in optimizer steps)*",
        ]
    )
    assert "AcceleratedScheduler around LambdaLR, 2 scheduler step(s) per optimizer step" in _flat(run.text)
    _no_leftover_process()


def test_an_unprepared_schedule_sized_in_a_ranks_steps_passes(project):
    project.conftest(ts.project("make_training_unprepared_scheduler"))
    run = project.run("--dlcheck=D8", "-rA")
    run.assert_outcome("D8", "passed")
    text = _flat(run.text)
    assert "on 2 processes the LR reaches its end (0) after 18 optimizer steps" in text
    assert "the scheduler: LambdaLR, 1 scheduler step(s) per optimizer step (measured: 3 in 3" in text
    _no_leftover_process()


def test_an_unprepared_schedule_sized_for_a_prepared_one_has_not_decayed_when_the_run_ends(project):
    project.conftest(ts.project("make_training_unprepared_sized_twice"))
    run = project.run("--dlcheck=D8", "-rA")
    run.assert_outcome("D8", "failed")
    d8 = _flat(run.section("D8"))
    # sized 11 batches x 3 epochs x 2 processes = 66 scheduler steps, stepped once per optimizer step
    assert "the scheduler is LambdaLR, 1 scheduler step(s) per optimizer step" in d8
    assert "on 2 processes the schedule ends after 66 optimizer steps" in d8
    assert "the single-process plan ends after 33 optimizer steps" in d8
    assert "at optimizer step 33 the LR is still" in d8
    assert "sized with num_processes while the scheduler steps once per optimizer step" in d8
    _no_leftover_process()


def test_a_constant_schedule_passes_with_nothing_to_shift(project):
    project.conftest(ts.project("make_training_constant"))
    run = project.run("--dlcheck=D8", "-rA")
    run.assert_outcome("D8", "passed")
    assert (
        "a constant LR of 0.01 on 2 processes and in the single-process plan: nothing for the number of processes to "
        "shift (AcceleratedScheduler around LambdaLR, 2 scheduler step(s) per optimizer step" in _flat(run.text)
    )
    _no_leftover_process()


def test_a_scheduler_stepped_per_micro_batch_is_left_to_t6(project):
    project.conftest(ts.project("make_training_accumulating", train_step="step_every_micro_batch"))
    run = project.run("--dlcheck=D8", "-rA")
    run.assert_outcome("D8", "skipped")
    text = _flat(run.text)
    # 3 micro-steps, the optimizer stepping on the second only, the scheduler on all three
    assert "the scheduler (LambdaLR) makes 3 scheduler steps per optimizer step on 2 processes (3 in 1" in text
    assert "a schedule stepped per micro-batch is T6's, judged in one process" in text
    _no_leftover_process()


def test_the_scheduler_stepped_per_micro_batch_that_d8_leaves_fails_t6(project):
    # the buggy twin of D8's skip above: in one process T6 fails the same factory and step (T6 draws its batches
    # from dlcheck_dataloader, the same data as the factory's loader)
    project.conftest(
        ts.project("make_training_accumulating", train_step="step_every_micro_batch")
        + "\n@pytest.fixture(scope='session')\ndef dlcheck_dataloader():\n    return ta.plain_loader()\n"
    )
    run = project.run("--dlcheck=T6")
    run.assert_outcome("T6", "failed")
    text = _flat(run.section("T6"))
    assert "2.0 scheduler steps per optimizer step" in text, text


def test_the_epochs_of_an_accumulating_plan_count_its_micro_batches(project):
    """run_ner_no_trainer, found blind: with 2 micro-batches per optimizer step, 9 optimizer steps of 6-batch epochs
    were said to be 1.5 epochs (they are 3). The same data on 2 processes is the same whatever the accumulation."""
    project.conftest(ts.project("make_training_accumulating", train_step="step_when_synced"))
    run = project.run("--dlcheck=D8", "-rA")
    run.assert_outcome("D8", "passed")
    text = _flat(run.text)
    assert (
        "the single-process plan ends after 16 optimizer steps (2.91 epoch(s) of 11 batches, 2 per optimizer step)"
        in text
    ), text
    _no_leftover_process()


def test_a_loop_accumulating_over_more_than_the_launch_is_trained_to_its_optimizer_step(project):
    """Blind set 12's accel_ga_autoregressive: with 4 micro-batches per optimizer step the launch's 3 micro-steps held
    no optimizer step, so D2 and D8 skipped and D1 passed saying nothing of it. The launch now trains on to the first
    optimizer step (and the window after it, so that D6's injected micro-step closes one)."""
    project.conftest(ts.project("make_training_accumulating_4"))
    run = project.run("--dlcheck=D1,D2,D8", "-rA")
    for check in ("D1", "D2", "D8"):
        run.assert_outcome(check, "passed")
    text = _flat(run.text)
    assert "identical on the 2 ranks after each of 7 micro-steps" in text, text
    assert "through 1 optimizer step (after micro-step 4)" in text, text
    assert "a constant LR of 0.01 on 2 processes" in text, text
    assert "partly judged" not in text, text
    _no_leftover_process()


def test_a_schedule_sized_per_rank_fails_under_accumulation_over_more_than_the_launch(project):
    project.conftest(ts.project("make_training_accumulating_4_sized_per_rank"))
    run = project.run("--dlcheck=D8")
    run.assert_outcome("D8", "failed")
    d8 = _flat(run.section("D8"))
    assert "accelerator.prepare(lr_scheduler) steps the scheduler num_processes=2 times per optimizer step" in d8, d8
    _no_leftover_process()


def test_no_optimizer_step_within_the_bound_leaves_the_replicas_after_an_update_not_judged(project):
    # 32 micro-batches per optimizer step: the launch stops at its bound (16 micro-steps), and D1 does not claim the
    # replicas stayed identical through an update that never happened
    project.conftest(ts.project("make_training_accumulating_32"))
    run = project.run("--dlcheck=D1,D8", "-rA")
    run.assert_outcome("D1", "passed")
    run.assert_outcome("D8", "skipped")
    text = _flat(run.text)
    assert "after each of 16 micro-steps" in text and "before any optimizer step (none in them)" in text, text
    assert "the replicas after an optimizer step not judged" in text, text
    assert "comes later than 16 micro-steps, the most the launch trains to reach it" in text, text
    assert "16 micro-steps made 0 optimizer steps" in text, text
    _no_leftover_process()
