"""Issue 20: at most one extra copy of the training state in memory. What the checks keep for each other
(the probe model, the smoke run's trained objects, a saved state read back) is a spare: let go before a
check builds a training state, rebuilt the same by the next check that needs it; the smoke run's trained
tensors wait on disk and are read back into new objects."""

import json
import os
import sys
import threading
from pathlib import Path

import pytest
import torch
from torch import nn
from torch.optim.swa_utils import AveragedModel, get_ema_multi_avg_fn

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "train"))
import tiny_train as tt  # noqa: E402

from pytest_dlcheck.errors import MISSING  # noqa: E402
from pytest_dlcheck.session import DlcheckState  # noqa: E402
from pytest_dlcheck.training.loop import LoopSetup  # noqa: E402
from pytest_dlcheck.training.runs import offload_tensors, release_training_memory  # noqa: E402


def trained_state() -> dict:
    """A plain loop's state after three steps: model, AdamW, a warmup schedule, an EMA, and entries that are
    no training objects (a lock, a step counter)."""
    torch.manual_seed(0)
    model = tt.MLP()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, tt.warmup(5))
    ema = AveragedModel(model, multi_avg_fn=get_ema_multi_avg_fn(0.9))
    for x, y in list(tt.loader())[:3]:
        nn.functional.cross_entropy(model(x), y).backward()
        opt.step()
        sched.step()
        opt.zero_grad(set_to_none=True)
        ema.update_parameters(model)
    return {"model": model, "optimizer": opt, "lr_scheduler": sched, "ema": ema, "lock": threading.Lock(), "step": 3}


def values(state: dict) -> dict:
    return {
        k: v.detach().clone()
        for key in ("model", "ema")
        for k, v in state[key].state_dict().items()
        for k in [f"{key}.{k}"]
    }


def test_a_trained_state_kept_on_disk_is_read_back_whole_into_new_objects(tmp_path):
    state = trained_state()
    release_training_memory(state)
    before, lr, epoch = values(state), state["optimizer"].param_groups[0]["lr"], state["lr_scheduler"].last_epoch
    read_back = offload_tensors(state, tmp_path / "trained.pt")
    assert read_back is not None
    # in memory: the emptied objects, their dtypes and settings kept
    assert all(p.numel() == 0 for p in [*state["model"].parameters(), *state["ema"].parameters()])
    assert {p.dtype for p in state["optimizer"].param_groups[0]["params"]} == {torch.float32}
    assert state["optimizer"].param_groups[0]["lr"] == lr and state["ema"].n_averaged.numel() == 0

    got = read_back()
    after = values(got)
    assert after.keys() == before.keys() and all(torch.equal(after[k], before[k]) for k in before)
    assert int(got["ema"].n_averaged) == 3
    # the copy's optimizer and schedule are its own, over its own parameters; other entries are shared
    assert list(got["optimizer"].param_groups[0]["params"]) == list(got["model"].parameters())
    assert got["lr_scheduler"].optimizer is got["optimizer"] and got["lr_scheduler"].last_epoch == epoch
    assert got["optimizer"].param_groups[0]["lr"] == lr
    assert got["lock"] is state["lock"] and got["step"] == 3
    # each read gives new objects, the same numbers
    again = read_back()
    assert again["model"] is not got["model"]
    assert again["model"].head.weight.data_ptr() != got["model"].head.weight.data_ptr()
    assert torch.equal(again["model"].head.weight, got["model"].head.weight)


def test_a_state_that_cannot_be_copied_stays_in_memory_as_it_was(tmp_path):
    state = trained_state()
    state["model"].lock = threading.Lock()  # deepcopy cannot copy a lock held by a module
    before = values(state)
    assert offload_tensors(state, tmp_path / "trained.pt") is None
    after = values(state)
    assert all(torch.equal(after[k], before[k]) for k in before)


def test_spares_are_let_go_by_make_room_and_made_again():
    state = DlcheckState(selected=[], spec="", spec_source="", samples=8, batch_size=4, overrides={})
    source, made = object(), []

    def make(name):
        made.append(name)
        return [name]

    kept = state.memo(source, "kept", lambda: make("kept"))
    spare = state.memo(source, "spare", lambda: make("spare"), spare=True)
    assert state.memo(source, "spare", lambda: make("again"), spare=True) is spare  # shared until room is made
    state.make_room()
    assert state.memo(source, "kept", lambda: make("kept again")) is kept
    assert state.memo(source, "spare", lambda: make("spare again"), spare=True) == ["spare again"]
    assert made == ["kept", "spare", "spare again"]


def test_a_training_state_makes_room_and_the_probe_does_not(tmp_path):
    def make():
        model = tt.MLP()
        return {"model": model, "optimizer": torch.optim.AdamW(model.parameters())}

    setup = LoopSetup(make, MISSING, MISSING, nn.CrossEntropyLoss(), tt.loader(), MISSING, MISSING, tmp_path)
    calls = []
    setup.make_room = lambda: calls.append(1)
    probe = setup.fresh()
    probe.make_optimizer()  # an optimizer for the probe itself (T2, T3 train it)
    assert calls == []
    setup.state()  # a run's own state
    assert calls == [1]


# ---- end to end: nothing kept for other checks is alive beside a check's training run -------------------

TRACKED = """
    import gc, json, os, weakref
    import pytest, torch, tiny_train as tt
    from torch import nn

    LIVE = weakref.WeakSet()
    RECORD = {record!r}


    class Tracked(tt.MLP):
        # every model of this class, built by the factory or copied by pytest-dlcheck
        def __init__(self):
            super().__init__()
            LIVE.add(self)

        def __setstate__(self, state):
            super().__setstate__(state)
            LIVE.add(self)


    @pytest.fixture(scope="session")
    def dlcheck_make_training():
        def make():
            model = Tracked()
            optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2)
            return {{"model": model, "optimizer": optimizer,
                     "lr_scheduler": torch.optim.lr_scheduler.LambdaLR(optimizer, tt.warmup(3))}}
        return make

    @pytest.fixture(scope="session")
    def dlcheck_dataloader():
        return tt.loader()

    @pytest.fixture(scope="session")
    def dlcheck_eval_dataloader():
        return tt.loader(32, seed=1)

    @pytest.fixture(scope="session")
    def dlcheck_loss_fn():
        return nn.CrossEntropyLoss()

    @pytest.fixture(scope="session")
    def dlcheck_train_step():
        def step(state, batch):
            model, opt = state["model"], state["optimizer"]
            x, y = batch
            loss = nn.functional.cross_entropy(model(x), y)
            loss.backward()
            opt.step()
            state["lr_scheduler"].step()
            opt.zero_grad(set_to_none=True)
            # how many models with weights are alive while this one trains
            alive = sum(1 for m in list(LIVE) if any(p.numel() for p in m.parameters()))
            test = os.environ.get("PYTEST_CURRENT_TEST", "").split("::")[-1].split(" ")[0]
            with open(RECORD, "a") as fh:
                fh.write(json.dumps([test, alive]) + "\\n")
            return loss.detach()
        return step

    @pytest.fixture(scope="session")
    def dlcheck_save_checkpoint():
        return tt.save_atomic

    @pytest.fixture(scope="session")
    def dlcheck_load_checkpoint():
        return tt.load_all
"""


@pytest.mark.slow
def test_no_model_kept_for_other_checks_lives_beside_a_training_run(project, tmp_path, monkeypatch):
    record = tmp_path / "alive.jsonl"
    project.conftest(TRACKED.format(record=str(record)))
    # in a process of its own: an in-process run's hook recorder keeps every call's frames (the models a
    # check held among their locals) alive
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join([str(Path(tt.__file__).parent), os.environ.get("PYTHONPATH", "")]))
    result = project.pytester.runpytest_subprocess("-p", "no:cacheprovider", "-v", "--dlcheck=train,ckpt,smoke")
    names = ("T1_initial_loss", "T3_gradients", "T6_lr_schedule", "C1_resume", "C2_atomic_save", "S5_train_eval_gap")
    result.stdout.fnmatch_lines([f"*::{name} PASSED*" for name in names])
    steps = [json.loads(line) for line in record.read_text().splitlines()]
    by_check: dict[str, int] = {}
    for test, alive in steps:
        by_check[test] = max(by_check.get(test, 0), alive)
    # the shared smoke run (T6 needs it first), C1's runs and C2's: the run's own model alone, neither the
    # probe T1-T5 shared nor the smoke run's trained model (which waits on disk for S5)
    assert {"T6_lr_schedule", "C1_resume", "C2_atomic_save"} <= set(by_check), by_check
    assert all(n == 1 for n in by_check.values()), by_check


TRAINER_TRACKED = """
    import gc, json, os
    import pytest, torch, tiny
    from datasets import Dataset
    from transformers import TrainerCallback
    from trl import SFTConfig, SFTTrainer

    RECORD = {record!r}


    class Alive(TrainerCallback):
        # before each optimizer step of any run: the optimizers alive holding moments (training states)
        def on_pre_optimizer_step(self, args, state, control, **kw):
            gc.collect()
            # (an AcceleratedOptimizer is an Optimizer too, sharing the state of the one it wraps)
            states = len({{id(o.state) for o in gc.get_objects() if isinstance(o, torch.optim.Optimizer) and o.state}})
            test = os.environ.get("PYTEST_CURRENT_TEST", "").split("::")[-1].split(" ")[0]
            with open(RECORD, "a") as fh:
                fh.write(json.dumps([test, states]) + "\\n")


    @pytest.fixture(scope="session")
    def dlcheck_trainer(tmp_path_factory):
        tok = tiny.tokenizer()
        return SFTTrainer(model=tiny.llama(tok), args=tiny.trainer_args(tmp_path_factory.mktemp("o"), SFTConfig),
                          processing_class=tok, train_dataset=Dataset.from_dict({{"text": tiny.texts()}}),
                          callbacks=[Alive()])
"""


@pytest.mark.slow
def test_a_trainer_run_never_trains_beside_another_clone_s_training_state(project, tmp_path, monkeypatch):
    """C2 trains a clone two steps with an interrupted save, then a second clone resumes: the first clone's
    gradients and moments go before the second builds its own (was: two training states at once)."""
    record = tmp_path / "alive.jsonl"
    project.conftest(TRAINER_TRACKED.format(record=str(record)))
    tests = Path(__file__).resolve().parents[1]
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join([str(tests), os.environ.get("PYTHONPATH", "")]))
    result = project.pytester.runpytest_subprocess("-p", "no:cacheprovider", "-v", "--dlcheck=C1,C2")
    result.stdout.fnmatch_lines(["*::C1_resume PASSED*", "*::C2_atomic_save PASSED*"])
    by_check: dict[str, int] = {}
    for test, states in (json.loads(line) for line in record.read_text().splitlines()):
        by_check[test] = max(by_check.get(test, 0), states)
    assert set(by_check) == {"C1_resume", "C2_atomic_save"}, by_check
    assert all(n == 1 for n in by_check.values()), by_check
