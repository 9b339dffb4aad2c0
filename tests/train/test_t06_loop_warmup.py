"""T6 on a plain or Accelerate loop: the warmup of the loop's own scheduler is judged against the run's optimizer
steps (found blind on accelerate's automatic_gradient_accumulation example: a warmup of 100 optimizer steps for a
run of 45, the whole run inside the warmup)."""

import pytest
import tiny_train as tt

# 120 examples in batches of {batch}: 15 micro-batches an epoch at batch 8, 30 at batch 4; 3 epochs
ACCELERATE = """
    import pytest, torch
    from torch import nn
    from torch.nn import functional as F
    from torch.utils.data import DataLoader
    from accelerate import Accelerator
    from transformers import (get_constant_schedule, get_cosine_schedule_with_warmup,
                              get_linear_schedule_with_warmup)
    import tiny_train as tt

    EPOCHS, ACCUM = 3, {accum}

    def loader():
        return DataLoader(tt.blobs(120), batch_size={batch}, shuffle=True,
                          generator=torch.Generator().manual_seed(0))

    @pytest.fixture(scope="session")
    def dlcheck_make_training():
        def make():
            acc = Accelerator(cpu=True, gradient_accumulation_steps=ACCUM)
            torch.manual_seed(0)
            model = tt.MLP()
            optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2)
            train_dataloader = loader()
            lr_scheduler = {schedule}
            model, optimizer, train_dataloader, lr_scheduler = acc.prepare(model, optimizer, train_dataloader,
                                                                           lr_scheduler)
            return {{"accelerator": acc, "model": model, "optimizer": optimizer, "lr_scheduler": lr_scheduler,
                    "dataloader": train_dataloader}}
        return make

    @pytest.fixture(scope="session")
    def dlcheck_dataloader():
        return loader()

    {epochs}

    @pytest.fixture(scope="session")
    def dlcheck_train_step():
        def step(state, batch):
            acc, model = state["accelerator"], state["model"]
            with acc.accumulate(model):
                x, y = batch
                loss = F.cross_entropy(model(x), y)
                acc.backward(loss)
                state["optimizer"].step()
                state["lr_scheduler"].step()
                state["optimizer"].zero_grad()
            return loss.detach()
        return step
"""

EPOCHS = """
    @pytest.fixture(scope="session")
    def dlcheck_num_epochs():
        return EPOCHS
"""

#: the example's schedule: a warmup of 100 optimizer steps, sized len(train_dataloader) * epochs
EXAMPLE = (
    "get_linear_schedule_with_warmup(optimizer, num_warmup_steps=100, "
    "num_training_steps=len(train_dataloader) * EPOCHS)"
)


def _project(project, schedule, accum=1, batch=8, epochs=True):
    project.conftest(ACCELERATE.format(accum=accum, batch=batch, schedule=schedule, epochs=EPOCHS if epochs else ""))


def test_a_run_inside_its_warmup_fails_without_accumulation(project):
    """k = 1: the schedule is sized for the run's 45 optimizer steps, but its warmup is 100: the LR never
    reaches its peak. The old check passed it (it compared a loop's warmup with nothing)."""
    _project(project, EXAMPLE)
    run = project.run("--dlcheck=T6")
    run.assert_outcome("T6", "failed")
    text = tt.section(run, "T6")
    assert "the run takes 45 optimizer steps (15 batches an epoch x dlcheck_num_epochs=3)" in text, text
    assert "warmup of 100 optimizer steps (num_warmup_steps=100)" in text, text
    assert "still rising at the run's last optimizer step (45)" in text, text
    assert "the whole run of 45 optimizer steps sits inside the warmup" in text, text
    assert "never reaches its peak (it ends at 44% of it) and never decays" in text, text


def test_the_example_with_accumulation_fails_and_says_the_run_ends_inside_the_warmup(project):
    """k = 2: the schedule is sized in micro-batches (90 for a run of 45 optimizer steps), and the run ends
    inside its warmup of 100: the cause says so, not '50% of the way through its warmup and decay'."""
    _project(project, EXAMPLE, accum=2, batch=4)
    run = project.run("--dlcheck=T6")
    run.assert_outcome("T6", "failed")
    text = tt.section(run, "T6")
    assert "the scheduler is sized for 90 optimizer steps" in text, text
    assert "the run takes 45 (30 batches an epoch x dlcheck_num_epochs=3, one optimizer step every 2" in text, text
    assert "warmup and decay" not in text, text
    assert "the whole run of 45 optimizer steps sits inside the warmup of 100" in text, text


def test_a_schedule_sized_in_micro_batches_says_where_the_run_ends_in_its_decay(project):
    """The same units finding with a warmup of 4: the run ends in the decay, and the cause says how far."""
    schedule = "get_linear_schedule_with_warmup(optimizer, num_warmup_steps=4, num_training_steps=90)"
    _project(project, schedule, accum=2, batch=4)
    run = project.run("--dlcheck=T6")
    run.assert_outcome("T6", "failed")
    text = tt.section(run, "T6")
    # (45 - 4) / (90 - 4) of the decay
    assert "the run ends 48% of the way through the decay that follows its warmup of 4 optimizer steps" in text, text
    assert "sits inside the warmup" not in text, text


def test_a_torch_warmup_longer_than_the_run_fails(project):
    """The same finding on a torch scheduler (no lambda to read): a copy of it is stepped over the run."""
    _project(project, "torch.optim.lr_scheduler.LinearLR(optimizer, start_factor=0.01, total_iters=100)")
    run = project.run("--dlcheck=T6")
    run.assert_outcome("T6", "failed")
    text = tt.section(run, "T6")
    assert "still rising at the run's last optimizer step (45)" in text, text
    assert "the whole run of 45 optimizer steps sits inside the warmup of 100" in text, text


def test_a_schedule_whose_own_length_ends_inside_its_warmup_fails_without_epochs(project):
    """Without dlcheck_num_epochs the run's length is the schedule's own (num_training_steps=45): a warmup of 100
    does not fit in it either."""
    _project(project, EXAMPLE, epochs=False)
    run = project.run("--dlcheck=T6")
    run.assert_outcome("T6", "failed")
    text = tt.section(run, "T6")
    assert "the schedule's own run of 45 optimizer steps (num_training_steps=45" in text, text


@pytest.mark.parametrize(
    ("schedule", "said"),
    [
        (
            "get_linear_schedule_with_warmup(optimizer, num_warmup_steps=int(0.1 * len(train_dataloader) * EPOCHS), "
            "num_training_steps=len(train_dataloader) * EPOCHS)",
            "the LR peaks at 0.01 after a warmup of 4 optimizer steps (num_warmup_steps=4), within the run's 45 optimizer steps (15 batches an epoch",
        ),
        (
            "get_cosine_schedule_with_warmup(optimizer, num_warmup_steps=4, num_training_steps=45)",
            "after a warmup of 4 optimizer steps (num_warmup_steps=4), within the run's 45 optimizer steps (15 batches an epoch",
        ),
        (
            "get_constant_schedule(optimizer)",
            "no warmup: the LR does not rise from the first of the run's 45 optimizer steps",
        ),
        (
            "get_linear_schedule_with_warmup(optimizer, num_warmup_steps=0, num_training_steps=45)",
            "no warmup: the LR does not rise from the first of the run's 45 optimizer steps",
        ),
        (
            "torch.optim.lr_scheduler.CosineAnnealingLR(optimizer, T_max=45)",
            "no warmup: the LR does not rise from the first of the run's 45 optimizer steps",
        ),
    ],
    ids=["warmup-10pct", "cosine-warmup", "constant", "linear-no-warmup", "torch-cosine"],
)
def test_a_warmup_within_the_run_or_none_passes(project, schedule, said):
    _project(project, schedule)
    run = project.run("--dlcheck=T6", "-rA")
    run.assert_outcome("T6", "passed")
    text = " ".join(run.text.split())
    assert said in text, text
