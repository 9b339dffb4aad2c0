"""The work a check causes, counted (pytest_dlcheck.cost): model forward passes, backward passes and
optimizer steps per check in the JSON report and the terminal; a data-only check costs no pass."""

import json

import jsonschema
import tiny_train as tt

from pytest_dlcheck.report import schema_path


def test_each_check_reports_the_passes_it_caused(project, tmp_path):
    project.conftest(tt.loop_project())
    out = tmp_path / "r.json"
    run = project.run("--dlcheck=T1,T2,T3", f"--dlcheck-json={out}")
    doc = json.loads(out.read_text())
    jsonschema.validate(doc, json.loads(schema_path().read_text()))
    cost = {r["id"]: r["cost"] for r in doc["results"]}
    # T2 trains on one batch until the loss is halved: the steps its evidence names, each one backward pass
    t2 = next(r for r in doc["results"] if r["id"] == "T2")
    assert cost["T2"]["optimizer_steps"] == t2["data"]["steps"] == cost["T2"]["backward"], (cost, t2["data"])
    assert 1 <= cost["T2"]["optimizer_steps"] < 30
    assert cost["T2"]["forward"] > cost["T2"]["optimizer_steps"] and set(cost["T2"]["models"]) == {"MLP"}, cost
    # T1 is one forward pass of the initial model, no training
    assert cost["T1"]["optimizer_steps"] == 0 and cost["T1"]["backward"] == 0 and 1 <= cost["T1"]["forward"] <= 4
    shared = [run["cost"] for run in doc["shared"].values()]  # the shared runs' work: each run's, once
    for key in ("forward", "optimizer_steps"):
        assert doc["cost"][key] == sum(c.get(key, 0) for c in cost.values()) + sum(c[key] for c in shared), key
    run.fnmatch(["cost:      * forward passes, * backward passes, * optimizer steps (per check and per shared run *"])


def test_counting_leaves_torch_as_it_was():
    import torch

    from pytest_dlcheck.cost import counting

    backward, grad = torch.autograd.backward, torch.autograd.grad
    model = torch.nn.Sequential(torch.nn.Linear(2, 2), torch.nn.ReLU(), torch.nn.Linear(2, 1))
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    with counting() as cost:
        for _ in range(3):
            model(torch.ones(4, 2)).sum().backward()
            opt.step()
        try:
            model(torch.ones(4, 3))  # a forward that raises still closes its pass
        except RuntimeError:
            pass
        model(torch.ones(1, 2))
    assert (cost.forward, cost.backward, cost.optimizer_steps) == (5, 3, 3)
    assert dict(cost.models) == {"Sequential": 5}
    assert torch.autograd.backward is backward and torch.autograd.grad is grad
    model(torch.ones(1, 2))
    assert cost.forward == 5  # nothing counted afterwards


def test_training_runs_are_drawn_in_the_report(project, tmp_path):
    """The report's curves: C1's resumed run over the uninterrupted one with the save marked; the shared
    smoke run (loss, gradient norm, LR) drawn once for every smoke check that read it."""
    import tiny_lightning as tl

    project.conftest(tl.project())
    out, page = tmp_path / "r.json", tmp_path / "r.html"
    project.run("--dlcheck=C1,S1,S2,S3", f"--dlcheck-json={out}", f"--dlcheck-report={page}")
    doc = json.loads(out.read_text())
    arts = {r["id"]: [a for a in r["artifacts"] if a["kind"] == "series"] for r in doc["results"]}
    (c1,) = arts["C1"]
    assert set(c1["series"]) == {"uninterrupted", "resumed"} and c1["marks"][0]["label"] == "saved"
    assert c1["series"]["resumed"][0] is None and c1["series"]["resumed"][-1] is not None
    smoke = [arts[c][0] for c in ("S1", "S2", "S3")]
    assert smoke[0] == smoke[1] == smoke[2] and "gradient norm" in smoke[0]["series"]
    assert len(smoke[0]["series"]["loss"]) == 20
    html = page.read_text()
    assert html.count('data-ref="pic-') == 2  # the smoke run drawn once, referenced twice
    assert html.count("<svg") == 2  # C1's curves and the smoke run's


def test_the_users_own_fixture_work_is_not_counted():
    """A role fixture built during a check's call (getfixturevalue) runs inside ``users_work``: its passes and
    steps are the user's, as when pytest builds it in the setup; the check's own passes around it count."""
    import torch

    from pytest_dlcheck.cost import counting, users_work

    model = torch.nn.Linear(2, 1)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    with counting() as cost:
        with users_work():
            for _ in range(4):
                model(torch.ones(3, 2)).sum().backward()
                opt.step()
        model(torch.ones(1, 2))
    assert (cost.forward, cost.backward, cost.optimizer_steps) == (1, 0, 0)


def test_gradient_checkpointing_recomputation_is_part_of_the_backward_pass():
    """A checkpointed block runs its forward again inside the backward pass (and reentrant checkpointing starts
    a backward of its own there): one training step is still one forward and one backward pass, not one more
    "forward pass" per recomputed block (the corpus's SFT recipe, gradient checkpointing on, was charged 640
    Qwen2RMSNorm "forward passes" for 20 steps)."""
    import torch
    from torch.utils.checkpoint import checkpoint

    from pytest_dlcheck.cost import counting

    class Blocks(torch.nn.Module):
        def __init__(self, reentrant: bool):
            super().__init__()
            self.reentrant = reentrant
            self.blocks = torch.nn.ModuleList(torch.nn.Linear(4, 4) for _ in range(3))

        def forward(self, x):
            for block in self.blocks:
                x = checkpoint(block, x, use_reentrant=self.reentrant)
            return x

    for reentrant in (True, False):
        model = Blocks(reentrant)
        with counting() as cost:
            for _ in range(2):
                model(torch.ones(2, 4, requires_grad=True)).sum().backward()
        assert (cost.forward, cost.backward) == (2, 2), (reentrant, cost)
        assert dict(cost.models) == {"Blocks": 2}, (reentrant, cost)


def test_a_shared_runs_passes_are_the_runs_not_the_check_that_made_it():
    """The passes made inside a shared run (the smoke run) are recorded with the run and taken off the check
    that happened to make it first; a run made inside another is its own."""
    import torch

    from pytest_dlcheck.cost import counting, shared_run, timing

    model = torch.nn.Linear(2, 1)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)

    def step():
        model(torch.ones(3, 2)).sum().backward()
        opt.step()

    with counting() as cost, timing() as clock:
        step()  # the check's own
        with shared_run("smoke run", "L6"):
            for _ in range(3):
                step()
            with shared_run("fresh probe", "L6"):
                model(torch.ones(1, 2))
        model(torch.ones(1, 2))  # the check's own again
    assert (cost.forward, cost.backward, cost.optimizer_steps) == (2, 1, 1), cost
    smoke, probe = clock.made["smoke run"]["cost"], clock.made["fresh probe"]["cost"]
    assert (smoke["forward"], smoke["backward"], smoke["optimizer_steps"]) == (3, 3, 3), smoke
    assert (probe["forward"], probe["backward"], probe["optimizer_steps"]) == (1, 0, 0), probe
    assert smoke["models"] == {"Linear": 3} and probe["models"] == {"Linear": 1}
