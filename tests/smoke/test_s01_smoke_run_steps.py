"""The shared smoke run (S1-S5) counts optimizer steps: under gradient accumulation it runs S1.steps optimizer
steps, S1.steps x the accumulation micro-batches (at most S1.max_micro_steps), and says how many of each ran.
Counting micro-batches, an accumulation of 4 gave the smoke checks 5 optimizer steps, all inside a warmup."""

import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "train"))
import tiny_train as tt  # noqa: E402

ACCUMULATING = """
    @pytest.fixture(scope="session")
    def dlcheck_train_step():
        def step(state, batch, index):
            x, y = batch
            loss = nn.functional.cross_entropy(state["model"](x), y) / 4
            loss.backward()
            if (index + 1) % 4 == 0:
                state["optimizer"].step()
                state["lr_scheduler"].step()
                state["optimizer"].zero_grad()
            return loss * 4
        return step
"""


def results(out: Path) -> dict:
    return {r["id"]: r for r in json.loads(out.read_text())["results"]}


def test_an_accumulating_loop_gets_twenty_optimizer_steps(project, tmp_path):
    project.conftest(tt.loop_project(extra=ACCUMULATING))
    out = tmp_path / "r.json"
    run = project.run("--dlcheck=S1,S2,S3", "-rA", f"--dlcheck-json={out}")
    for cid in ("S1", "S2", "S3"):
        run.assert_outcome(cid, "passed")
    run.fnmatch(["smoke run of 20 optimizer steps (80 micro-steps): losses * -> * (80 logged), all finite;*"])
    run.fnmatch(["*weights finite after 20 optimizer steps"])
    run.fnmatch(["smoke run of 20 optimizer steps (80 micro-steps): gradient norms * -> * (before clipping)*"])
    got = results(out)
    assert got["S1"]["data"]["optimizer_steps"] == 20 and got["S1"]["data"]["micro_steps"] == 80
    assert got["S3"]["data"]["norms"] == 20  # one gradient norm per optimizer step, not 5


def test_an_accumulation_longer_than_the_run_still_gets_its_optimizer_steps(project):
    """S1.steps=3 with an accumulation of 4: counting micro-batches, the run ended before its first update."""
    project.conftest(tt.loop_project(extra=ACCUMULATING))
    run = project.run("--dlcheck=S1", "-rA", "--dlcheck-set=S1.steps=3")
    run.assert_outcome("S1", "passed")
    run.fnmatch(["smoke run of 3 optimizer steps (12 micro-steps): losses *; weights finite after 3 optimizer steps"])


def test_max_micro_steps_bounds_a_long_accumulation_and_says_so(project):
    project.conftest(tt.loop_project(extra=ACCUMULATING))
    run = project.run("--dlcheck=S1", "-rA", "--dlcheck-set=S1.max_micro_steps=40")
    run.assert_outcome("S1", "passed")
    run.fnmatch(
        [
            "smoke run of 10 optimizer steps (40 micro-steps), cut from 20 optimizer steps by S1.max_micro_steps: "
            "losses *"
        ]
    )


ACCELERATE = """
    import pytest, torch
    from torch import nn
    from torch.nn import functional as F
    from torch.utils.data import DataLoader, TensorDataset
    from accelerate import Accelerator

    def data():
        g = torch.Generator().manual_seed(0)
        y = torch.randint(0, 3, (64,), generator=g)
        x = torch.tensor([[2.0, 0.0], [-2.0, 0.0], [0.0, 2.0]])[y] + 0.3 * torch.randn(64, 2, generator=g)
        return TensorDataset(x, y)

    @pytest.fixture(scope="session")
    def dlcheck_make_training():
        # a fresh process, as a user's script starts: this in-process run shares the test process with earlier
        # in-process runs, and Accelerate keeps its GradientState (the active dataloaders whose end decides
        # accumulate()'s sync) in process-wide singletons
        from accelerate.state import AcceleratorState, GradientState
        AcceleratorState._reset_state(reset_partial_state=True)
        GradientState._reset_state()

        def make():
            acc = Accelerator(cpu=True, gradient_accumulation_steps=4)
            model = nn.Sequential(nn.Linear(2, 16), nn.Tanh(), nn.Linear(16, 3))
            opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
            model, opt = acc.prepare(model, opt)
            return {"model": model, "optimizer": opt, "accelerator": acc}
        return make

    @pytest.fixture(scope="session")
    def dlcheck_dataloader():
        return DataLoader(data(), batch_size=8, shuffle=True, generator=torch.Generator().manual_seed(0))

    @pytest.fixture(scope="session")
    def dlcheck_train_step():
        def step(state, batch):
            acc, model, opt = state["accelerator"], state["model"], state["optimizer"]
            x, y = batch
            with acc.accumulate(model):
                loss = F.cross_entropy(model(x), y)
                acc.backward(loss)
                if acc.sync_gradients:
                    acc.clip_grad_norm_(model.parameters(), {clip})
                opt.step()
                opt.zero_grad()
            return loss
        return step
"""


def test_an_accelerate_accumulation_is_counted_in_optimizer_steps_and_read_before_its_clip(project, tmp_path):
    """gradient_accumulation_steps=4 and accelerator.clip_grad_norm_ at 0.01 (every step clipped): 80
    micro-batches, 20 optimizer steps, and S3 reads each accumulated gradient's norm before the clip."""
    project.conftest(ACCELERATE.replace("{clip}", "0.01"))
    out = tmp_path / "r.json"
    run = project.run("--dlcheck=S1,S3", "-rA", f"--dlcheck-json={out}")
    run.assert_outcome("S1", "passed")
    run.assert_outcome("S3", "passed")
    run.fnmatch(["smoke run of 20 optimizer steps (80 micro-steps): losses *"])
    run.fnmatch(["20 of 20 steps clipped: at optimizer.step() the norm was at most 0.01"])
    data = results(out)["S3"]["data"]
    assert data["norms"] == 20 and data["reference"] > 0.01 * 10  # before the clip: far above what it leaves


# A user's LR schedule planned for a shorter run than the smoke run's 20 steps: torchvision's segmentation
# reference builds LambdaLR(lambda x: (1 - x / total) ** 0.9) with total = len(loader) * epochs (a Python complex
# past ``total``), OneCycleLR raises past total_steps. The user's own run never steps past the plan; the smoke
# run used to, and ended every smoke check in an internal error (float() of a complex LR) or the user's error.
PLANNED = """
    @pytest.fixture(scope="session")
    def dlcheck_make_training():
        def make():
            model = tt.MLP()
            optimizer = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
            {schedule}
            return {{"model": model, "optimizer": optimizer, "lr_scheduler": scheduler}}
        return make
"""
POLY = "scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda x: (1 - x / {total}) ** 0.9)"
ONE_CYCLE = "scheduler = torch.optim.lr_scheduler.OneCycleLR(optimizer, max_lr=0.05, total_steps={total})"


def test_the_smoke_run_stops_where_a_poly_schedule_ends(project, tmp_path):
    project.conftest(tt.loop_project(extra=PLANNED.format(schedule=POLY.format(total=12))))
    out = tmp_path / "r.json"
    run = project.run("--dlcheck=S1,S2,S3,T6", "-rA", f"--dlcheck-json={out}")
    for cid in ("S1", "S2", "S3", "T6"):
        run.assert_outcome(cid, "passed")
    run.fnmatch(
        [
            "12-step smoke run (stopped after 12 micro-steps, where the user's LR schedule ends: "
            "state?'lr_scheduler'? (LambdaLR): stepped 13 times, its LR is *j, not a real number; the user's own run "
            "never steps past its plan): losses * (12 logged), all finite;*"
        ]
    )
    run.fnmatch(["the smoke run stopped after 12 micro-steps, where the user's LR schedule ends: *"])  # T6 says so
    assert results(out)["S1"]["data"]["optimizer_steps"] == 12


def test_the_smoke_run_stops_where_one_cycle_ends(project):
    project.conftest(tt.loop_project(extra=PLANNED.format(schedule=ONE_CYCLE.format(total=10))))
    run = project.run("--dlcheck=S1", "-rA")
    run.assert_outcome("S1", "passed")
    run.fnmatch(
        [
            "10-step smoke run (stopped after 10 micro-steps, where the user's LR schedule ends: "
            "state?'lr_scheduler'? (OneCycleLR): its step 11 raises ValueError: Tried to step * times. The specified number of total steps is 10;*"
        ]
    )


def test_a_schedule_planned_in_optimizer_steps_but_stepped_per_micro_batch_still_fails_t6(project):
    """The bug of the family still shows: under an accumulation of 4 the scheduler is stepped every micro-batch,
    so it runs through its 12-step plan in 3 optimizer steps (the user's own run would break past it too)."""
    poly = PLANNED.format(schedule=POLY.format(total=12))
    outside = ACCUMULATING.replace(
        'state["lr_scheduler"].step()\n                state["optimizer"].zero_grad()',
        'state["optimizer"].zero_grad()\n            state["lr_scheduler"].step()',
    )
    assert outside != ACCUMULATING
    project.conftest(tt.loop_project(extra=poly + outside))
    run = project.run("--dlcheck=T6")
    run.assert_outcome("T6", "failed")
    text = tt.section(run, "T6")
    assert "in 12 micro-batches of your step: optimizer.step() ran 3 times, lr_scheduler.step() 12 times" in text
    # the correct twin: stepped with the optimizer, the run trains the plan's 12 optimizer steps
    project.conftest(tt.loop_project(extra=poly + ACCUMULATING))
    run = project.run("--dlcheck=T6", "-rA")
    run.assert_outcome("T6", "passed")
    run.fnmatch(["in 48 micro-batches of your step: optimizer.step() ran 12 times, lr_scheduler.step() 12 times*"])
