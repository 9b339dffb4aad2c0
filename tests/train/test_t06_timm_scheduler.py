"""T6 on a timm scheduler (timm.scheduler.CosineLRScheduler) stepped by the user's own step: timm's schedulers keep
no step counter of their own (the loop tells them its epoch, step(epoch), or its update count,
step_update(num_updates)), and T6 counted torch LR schedulers' steps only. On facebookresearch/deit (step(epoch) at
each epoch's end inside the step) T6 passed saying 'lr_scheduler.step() 0 times' while the scheduler had been
stepped every epoch, and said its warmup was not judged in a pass recorded as fully judged (found blind, set 15).
T6 now counts a timm scheduler's step(epoch) / step_update(num_updates) calls and the positions the loop passed,
and records the schedule's units and warmup as not judged (a partly judged pass). The buggy twin: the same loop
whose step never steps the warmup scheduler keeps the LR at 0 and still fails."""

import tiny_train as tt

# 64 blobs in batches of 8: 8 micro-batches an epoch; the step calls step(epoch) after an epoch's last batch
TIMM = """
    import pytest, torch
    from torch.nn import functional as F
    from timm.scheduler import CosineLRScheduler
    import tiny_train as tt

    @pytest.fixture(scope="session")
    def dlcheck_make_training():
        def make():
            torch.manual_seed(0)
            model = tt.MLP()
            optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2)
            sched = CosineLRScheduler(optimizer, t_initial=10, warmup_t={warmup_t}, warmup_lr_init={warmup_lr_init},
                                      lr_min=1e-5)
            return {{"model": model, "optimizer": optimizer, "lr_scheduler": sched, "epoch": 0, "it": 0}}
        return make

    @pytest.fixture(scope="session")
    def dlcheck_dataloader():
        return tt.loader()

    @pytest.fixture(scope="session")
    def dlcheck_train_step():
        def step(state, batch):
            x, y = batch
            loss = F.cross_entropy(state["model"](x), y)
            loss.backward()
            state["optimizer"].step()
            state["optimizer"].zero_grad()
            state["it"] += 1
            if state["it"] == 8:  # the epoch's end: the loop tells the scheduler the next epoch
                state["epoch"] += 1
                {stepped}
                state["it"] = 0
            return loss.detach()
        return step
"""


def test_a_timm_scheduler_stepped_per_epoch_is_counted(project):
    project.conftest(TIMM.format(warmup_t=5, warmup_lr_init=1e-6, stepped='state["lr_scheduler"].step(state["epoch"])'))
    run = project.run("--dlcheck=T6", "-rA")
    run.assert_outcome("T6", "passed")
    text = " ".join(run.text.split())
    assert "lr_scheduler.step() 0 times" not in text, text[-3000:]
    assert "CosineLRScheduler (told its position by your loop): step(epoch) 2 times (epochs 1, 2), " in text, text[
        -3000:
    ]
    assert "step_update(num_updates) 0 times" in text, text[-3000:]
    assert "partly judged" in text and "the schedule's units and warmup not judged" in text, text[-3000:]


def test_a_timm_warmup_never_stepped_fails(project):
    """The twin: warmup from 0 and the step never tells the scheduler its epoch: the LR stays 0."""
    project.conftest(TIMM.format(warmup_t=5, warmup_lr_init=0.0, stepped="pass"))
    run = project.run("--dlcheck=T6")
    run.assert_outcome("T6", "failed")
    text = tt.section(run, "T6")
    assert "the learning rate is 0 at all" in text, text
    assert "CosineLRScheduler (told its position by your loop): step(epoch) 0 times" in text, text


def test_counting_leaves_the_scheduler_class_as_it_was():
    """Nothing set on the instance (its state_dict is its __dict__) and the class put back."""
    import torch
    from timm.scheduler import CosineLRScheduler
    from timm.scheduler.scheduler import Scheduler

    from pytest_dlcheck.training.told import ToldCalls

    opt = torch.optim.SGD([torch.nn.Parameter(torch.zeros(1))], lr=0.1)
    sched, other = CosineLRScheduler(opt, t_initial=4), CosineLRScheduler(opt, t_initial=4)
    before = (dict(vars(CosineLRScheduler)), sorted(sched.state_dict()))
    told = ToldCalls(sched)
    sched.step(1)
    other.step(3)
    sched.step_update(num_updates=5)
    told.stop()
    assert told.calls == {"step": [1], "step_update": [5]}
    assert (dict(vars(CosineLRScheduler)), sorted(sched.state_dict())) == before
    assert CosineLRScheduler.step is Scheduler.step
    assert not ToldCalls(torch.optim.lr_scheduler.StepLR(opt, 2)).active
