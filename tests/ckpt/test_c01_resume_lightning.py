"""C1 for a Lightning user: ModelCheckpoint's .ckpt and fit(ckpt_path=...)."""

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "train"))
import tiny_lightning as tl  # noqa: E402
import tiny_train as tt  # noqa: E402


def test_deterministic_lightning_project_resumes_exactly(project):
    project.conftest(tl.project())
    run = project.run("--dlcheck=C1", "-rA")
    run.assert_outcome("C1", "passed")
    run.fnmatch(
        [
            "4 steps, saved after step 2 through ModelCheckpoint's epoch=0-step=2.ckpt and fit(ckpt_path=...), "
            "resumed on fresh objects: the losses, learning rates, weights of steps 3-4 equal the uninterrupted "
            "run's, bitwise"
        ]
    )


def test_dropout_and_shuffling_without_saved_rng_pass_c1(project):
    """Lightning's .ckpt holds no RNG state: the resumed fit draws other dropout masks and another order, which
    is C3's finding (tests/ckpt/test_c03_resume_rng.py). C1 puts the RNG states back and judges the rest: the
    optimizer, the scheduler and the weights resume exactly."""
    project.conftest(tl.project(module="dropout=0.3", data="shuffle=True"))
    run = project.run("--dlcheck=C1", "-rA")
    run.assert_outcome("C1", "passed")
    run.fnmatch(
        [
            "4 steps, saved after step 2 through ModelCheckpoint's epoch=0-step=2.ckpt and fit(ckpt_path=...), "
            "resumed on fresh objects: the losses, learning rates, weights of steps 3-4 equal the uninterrupted "
            "run's, bitwise",
            "the RNG states are put back from the uninterrupted run at the save in every resumed run of C1 (whether "
            "your resume restores them is C3's finding)",
        ]
    )


def test_a_dataloader_generator_seeded_at_every_fit_replays_the_first_epoch(project):
    """DataLoader(shuffle=True, generator=torch.Generator().manual_seed(7)): the uninterrupted fit's second
    epoch draws the next permutation, a resumed fit builds the loader anew and draws the first one again.
    Putting every piece back cannot help (the generator is in none of them): the batches prove it."""
    project.conftest(tl.project(data="generator_seed=7"))
    run = project.run("--dlcheck=C1")
    run.assert_outcome("C1", "failed")
    text = tt.section(run, "C1")
    assert "from step 3 the resumed run trains on other batches than the uninterrupted run" in text
    assert "step 3 = step 1's batch, step 4 = step 2's batch" in text
    assert "the resumed epoch replays the first epoch's order" in text and "set_epoch" in text


def test_an_epoch_seeded_sampler_resumes_in_order(project):
    project.conftest(tl.project(data="epoch_seed=7"))
    run = project.run("--dlcheck=C1", "-rA")
    run.assert_outcome("C1", "passed")


def test_gradient_accumulation_resumes_from_the_first_epochs_checkpoint(project):
    """accumulate_grad_batches=2: global_step counts optimizer steps, so the first epoch's checkpoint is
    named step=1 and the run is recorded by batch; the deterministic project resumes exactly."""
    project.conftest(
        tl.project()
        + """
    @pytest.fixture(scope="session")
    def dlcheck_trainer():
        import lightning.pytorch as pl
        return pl.Trainer(accumulate_grad_batches=2, logger=False, enable_checkpointing=False)
"""
    )
    run = project.run("--dlcheck=C1", "-rA")
    run.assert_outcome("C1", "passed")
    run.fnmatch(["4 steps, saved after step 2 through ModelCheckpoint's epoch=0-step=1.ckpt and fit(ckpt_path=...)*"])


@pytest.mark.parametrize(
    "where, lrs",
    [
        # stepped in on_train_batch_end: step t trains at lr 0.01 * t / 3, the resumed step 3 at step 1's
        ("on_train_start", "step 3: 0.00333333 vs 0.01, step 4: 0.00666667 vs 0.01"),
        # stepped in training_step, before the optimizer: step t at 0.01 * (t + 1) / 3, the resumed 3 at 2's
        ("init", "step 3: 0.00666667 vs 0.01, step 4: 0.01 vs 0.01"),
    ],
)
def test_a_scheduler_stepped_by_hand_is_lost_by_the_resume(project, where, lrs):
    """A warmup LambdaLR created in on_train_start (or __init__) and stepped by hand: Lightning's .ckpt does
    not hold it, the resumed fit builds it anew and its warmup restarts. Every piece Lightning knows put back
    does not help; the scheduler found among the module's attributes does."""
    project.conftest(tl.project(module=f"where={where!r}", cls="HandScheduled"))
    run = project.run("--dlcheck=C1")
    run.assert_outcome("C1", "failed")
    text = " ".join(tt.section(run, "C1").split())
    # the warmup of 3 steps at lr 0.01: the uninterrupted run is further in it at step 3, the resumed one restarts
    first = lrs.split(", ")[0].removeprefix("step 3: ").split(" vs ")
    assert f"at step 3 learning rate {first[0]} resumed vs {first[1]} uninterrupted" in text, text
    assert f"learning rates resumed vs uninterrupted: {lrs}" in text, text
    assert (
        "putting back hand-stepped scheduler from the uninterrupted run after the load makes the resumed run " in text
    )
    assert "the LR scheduler self.sched (LambdaLR) that the module creates and steps by hand" in text, text
    assert "not in the checkpoint" in text and "warmup/decay restarts" in text
    assert '{"optimizer": opt, "lr_scheduler": {"scheduler": sched, "interval": "step"}}' in text
    assert "on_save_checkpoint" in text and "on_load_checkpoint" in text
    assert "not reproducible" not in run.text


@pytest.mark.parametrize("where", ["configured", "saved"])
def test_a_scheduler_lightning_or_the_user_saves_resumes_exactly(project, where):
    """The twins: the scheduler returned from configure_optimizers, or saved in on_save_checkpoint and loaded
    once it exists; the learning rates of the resumed steps are compared and equal."""
    project.conftest(tl.project(module=f"where={where!r}", cls="HandScheduled"))
    run = project.run("--dlcheck=C1", "-rA")
    run.assert_outcome("C1", "passed")
    run.fnmatch(["*resumed on fresh objects: the losses, learning rates, weights of steps 3-4 equal*bitwise"])
