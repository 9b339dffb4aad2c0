"""The wall-time split (pytest_dlcheck.cost.timing, pytest_dlcheck.walltime): per check the seconds in the
user's work (forward, backward, optimizer step, data) and in the plugin's own, adding up to at most the check's
duration; the shared smoke run reported once, with the check that made it, and waited for by the others."""

import json
import sys
from pathlib import Path

import jsonschema

sys.path.insert(0, str(Path(__file__).parent / "train"))

import tiny_train as tt  # noqa: E402

from pytest_dlcheck.report import schema_path  # noqa: E402


def test_each_check_reports_the_users_and_the_plugins_seconds(project, tmp_path):
    project.conftest(tt.loop_project())
    out, page = tmp_path / "r.json", tmp_path / "r.html"
    run = project.run("--dlcheck=T1,T2,S1,S2", f"--dlcheck-json={out}", f"--dlcheck-report={page}", "--durations=0")
    doc = json.loads(out.read_text())
    jsonschema.validate(doc, json.loads(schema_path().read_text()))
    results = {r["id"]: r for r in doc["results"]}
    assert set(results) == {"T1", "T2", "S1", "S2"}, results
    for r in results.values():
        t = r["time"]
        # a guarantee, not digits: the parts never exceed the whole
        assert t["user"] + t["plugin"] + t["shared"] <= r["duration"] + 1e-9, (r["id"], t, r["duration"])
        assert sum(t["user_by"].values()) <= t["user"] + 1e-9, t
    # T2 trains the model on one batch: forward, backward and optimizer steps, each timed
    t2 = results["T2"]["time"]["user_by"]
    assert t2.get("forward", 0) > 0 and t2.get("backward", 0) > 0 and t2.get("step", 0) > 0, t2
    # the smoke run: made once, by the first smoke check, timed apart; the other smoke check waited for it
    assert doc["shared"]["smoke run"]["made_by"] == "S1", doc["shared"]
    run_ = doc["shared"]["smoke run"]
    assert run_["seconds"] > 0 and run_["user"] + run_["plugin"] <= run_["seconds"] + 1e-9, run_
    assert results["S1"]["time"]["shared_made"] == ["smoke run"]
    assert results["S1"]["time"]["shared"] > 0
    assert "smoke run" in results["S2"]["time"]["shared_waited"], results["S2"]["time"]
    assert "smoke run" not in results["S2"]["time"]["shared_made"]
    total = doc["time"]
    assert 0 <= total["plugin_share"] <= 1 and total["user"] + total["plugin"] <= total["checks"] + 1e-6, total
    html = page.read_text()
    assert "made smoke run (" in html and "waited for " in html and ", plugin " in html and "user " in html
    run.fnmatch(
        [
            "time:      T2 * s: user * s (forward *, backward *, step *), plugin * s*",
            "time:      S2 * s: user * s*, plugin * s*, waited for smoke run (made by S1)*",
        ]
    )


def test_nested_user_time_counts_once_in_the_innermost_category():
    import time

    import torch

    from pytest_dlcheck.cost import counting, timing, user_time

    torch.set_num_threads(1)
    model = torch.nn.Linear(2, 1)
    with timing() as clock, counting():
        start = time.perf_counter()
        with user_time("calls"):
            time.sleep(0.02)
            model(torch.ones(1, 2)).sum().backward()
        loader = torch.utils.data.DataLoader(torch.ones(4, 2), batch_size=2)
        for _ in loader:
            pass
        users_wall = time.perf_counter() - start  # every user section, nested ones once
        time.sleep(0.02)  # the plugin's own
        clock.settled()
        user = dict(clock.user)
    assert user["calls"] >= 0.015 and user["forward"] > 0 and user["backward"] > 0 and user["data"] > 0, user
    # the union: the forward is not also counted as the callable's; bounded by the wall time of the user's sections
    # measured here (not one machine's speed): counted twice, the sum would exceed it by the forward and backward
    assert sum(user.values()) <= users_wall + 1e-3, (user, users_wall)


SLOW = """
    import time as _time

    def _slow_collate(rows):
        _time.sleep(0.1)  # the user's data loading, slow by construction
        return torch.utils.data.default_collate(rows)

    class SlowMLP(tt.MLP):
        def forward(self, x):
            _time.sleep(0.05)  # the user's forward, slow by construction
            return super().forward(x)
"""


def test_the_users_slow_work_is_charged_to_the_user_not_to_the_plugin(project, tmp_path):
    """A slow collate and a slow forward of the user's: their seconds are the user's data and forward time,
    and the plugin's share is what is left (a twin of the same checks on the fast pipeline has none of it)."""
    loader = "torch.utils.data.DataLoader(tt.blobs(16), batch_size=8, collate_fn=_slow_collate)"
    project.conftest(tt.loop_project(model="SlowMLP()", loader=loader, extra=SLOW))
    out = tmp_path / "r.json"
    project.run("--dlcheck=T1", f"--dlcheck-json={out}")
    t1 = next(r for r in json.loads(out.read_text())["results"] if r["id"] == "T1")
    assert t1["outcome"] == "passed", t1
    by, t = t1["time"]["user_by"], t1["time"]
    assert by.get("data", 0) >= 0.09 and by.get("forward", 0) >= 0.045, t
    assert t["plugin"] <= t1["duration"] - 0.135, t  # the user's 0.15 s are not the plugin's


def test_a_shared_run_made_inside_a_check_leaves_the_check_s_clock_running():
    """Clocks are told apart by identity: a shared run made before any user time was charged (both clocks
    still empty, equal by value) must close its own clock, not the check's (V3 ended in 'list.remove(x): x
    not in list' when the two compared equal)."""
    from pytest_dlcheck import cost

    with cost.timing() as check_clock:
        with cost.shared_run("probe", "V3"):
            pass
        assert cost._clocks == [check_clock] and cost._clocks[0] is check_clock
    assert "probe" in check_clock.made and not cost._clocks


GC_PROBE = """

    import gc, weakref

    #: what the run saw: how many objects the collector had frozen, and whether a cycle made during the run
    #: (a clone held by its own callbacks) was still collected
    SEEN = {}

    class Cycle:
        def __init__(self):
            self.me = self

    def test_the_collector_during_the_run():
        SEEN["frozen"] = gc.get_freeze_count()
        ref = weakref.ref(Cycle())
        gc.collect()
        SEEN["cycle_collected"] = ref() is None

    def test_report():
        print("GC_SEEN", SEEN)
"""


def test_the_objects_alive_at_collection_are_frozen_for_the_run_and_given_back(project):
    """gc.freeze over the run: the full collections the checks make between trainings walk only what the run made
    (0.2 s a collection on a transformers project before, ~0 after); a cycle made during the run is still
    collected, and after the run the collector has every object back."""
    import gc

    before = gc.get_freeze_count()
    project.conftest(tt.loop_project())
    project.pytester.makepyfile(test_gc_probe=GC_PROBE)
    run = project.run("--dlcheck=T1", "-s")
    assert run.result.ret == 0, run.text
    seen = eval(run.text.split("GC_SEEN ", 1)[1].splitlines()[0])  # noqa: S307 - our own probe's dict
    assert seen["frozen"] > 10_000 and seen["cycle_collected"], seen
    assert gc.get_freeze_count() == before


def test_seeding_a_check_sets_the_seeded_states_without_queueing_cuda_calls():
    # every check's setup and call start from seed 0: the same draws as random.seed / numpy / torch.manual_seed(0),
    # set from cached states; with CUDA not initialised nothing is queued for it (torch.manual_seed queues a lazy
    # call carrying a formatted stack: milliseconds per check under pytest's stack)
    import random

    import numpy as np
    import torch
    import torch.cuda

    from pytest_dlcheck.guard import seed_everything

    random.seed(0)
    np.random.seed(0)
    torch.manual_seed(0)
    want = (random.random(), np.random.rand(), torch.rand(3))
    for other in (1, 2):
        random.seed(other)
        np.random.seed(other)
        torch.manual_seed(other)
        seed_everything(0)
        got = (random.random(), np.random.rand(), torch.rand(3))
        assert got[0] == want[0] and got[1] == want[1] and torch.equal(got[2], want[2])
    if not torch.cuda.is_initialized():
        import traceback

        formatted = []
        real = traceback.format_stack
        traceback.format_stack = lambda *a, **k: formatted.append(1) or real(*a, **k)
        try:
            torch.manual_seed(0)  # the control: torch's own seeding formats the stack for CUDA's lazy call
            control = len(formatted)
            for _ in range(5):
                seed_everything(0)
        finally:
            traceback.format_stack = real
        assert control > 0 and len(formatted) == control
