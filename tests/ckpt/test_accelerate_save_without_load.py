"""An Accelerate user who hands over their own save and no load (transformers' speech-pretraining no_trainer
script: ``accelerator.unwrap_model(model).save_pretrained(dir)``, weights only, and no resume at all). dlcheck
had paired that save with its own ``accelerator.load_state`` and called the FileNotFoundError it raised on
``optimizer.bin`` "your load" (C1 failed), blamed it on ``dlcheck_make_training`` (C10 errored, C2 and C3
skipped). A save without a load is a missing role (dlcheck_load_checkpoint) for C1, C2 and C3; C10 is not
applicable to a save that does not go through ``accelerator.save_state``, and pairs a save that does with
Accelerate's own ``load_state``, said so. A save and a load that lose the optimizer state still fail C1.
Real Accelerate, a tiny classifier."""

import json

PROJECT = """
    import os
    import pytest, torch
    from torch import nn
    from torch.nn import functional as F
    from torch.utils.data import DataLoader, TensorDataset
    from accelerate import Accelerator
    from safetensors.torch import load_file, save_file

    torch.set_num_threads(1)

    def data():
        g = torch.Generator().manual_seed(0)
        y = torch.randint(0, 3, (32,), generator=g)
        x = torch.tensor([[2.0, 0.0], [-2.0, 0.0], [0.0, 2.0]])[y] + 0.3 * torch.randn(32, 2, generator=g)
        return TensorDataset(x, y)

    @pytest.fixture(scope="session")
    def dlcheck_make_training():
        def make():
            acc = Accelerator(cpu=True)
            model = nn.Sequential(nn.Linear(2, 8), nn.Tanh(), nn.Linear(8, 3))
            opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
            loader = DataLoader(data(), batch_size=8, shuffle=True)
            model, opt, loader = acc.prepare(model, opt, loader)
            return {{"accelerator": acc, "model": model, "optimizer": opt, "train_dataloader": loader}}
        return make

    @pytest.fixture(scope="session")
    def dlcheck_dataloader():
        return DataLoader(data(), batch_size=8, shuffle=True)

    @pytest.fixture(scope="session")
    def dlcheck_train_step():
        def step(state, batch):
            acc, model, opt = state["accelerator"], state["model"], state["optimizer"]
            x, y = batch
            loss = F.cross_entropy(model(x), y)
            acc.backward(loss)
            opt.step()
            opt.zero_grad()
            return loss
        return step
{extra}
"""

#: the script's own save: the unwrapped model's weights into the directory, nothing else
WEIGHTS_SAVE = """
    @pytest.fixture(scope="session")
    def dlcheck_save_checkpoint():
        def save(state, path):
            os.makedirs(path, exist_ok=True)
            model = state["accelerator"].unwrap_model(state["model"])
            save_file({k: v.contiguous() for k, v in model.state_dict().items()}, os.path.join(path, "model.safetensors"))
        return save
"""

#: the buggy twin: a resume that reads back the weights only (the optimizer's moments restart at zero)
WEIGHTS_LOAD = """
    @pytest.fixture(scope="session")
    def dlcheck_load_checkpoint():
        def load(state, path):
            model = state["accelerator"].unwrap_model(state["model"])
            model.load_state_dict(load_file(os.path.join(path, "model.safetensors")))
        return load
"""

#: a save through Accelerate's own save_state, and no load handed over
SAVE_STATE_SAVE = """
    @pytest.fixture(scope="session")
    def dlcheck_save_checkpoint():
        def save(state, path):
            state["accelerator"].save_state(path)
        return save
"""


def _run(project, tmp_path, extra, selection):
    project.conftest(PROJECT.format(extra=extra))
    out = tmp_path / "r.json"
    run = project.run(f"--dlcheck={selection}", f"--dlcheck-json={out}", "-rA")
    return run, {r["id"]: r for r in json.loads(out.read_text())["results"]}


def _said(result):
    return " ".join(str(result.get(k) or "") for k in ("reason", "evidence", "cause", "fix"))


def test_a_save_without_a_load_is_a_missing_role_and_c10_is_not_applicable(project, tmp_path):
    run, by = _run(project, tmp_path, WEIGHTS_SAVE, "C1,C2,C3,C10")
    for cid in ("C1", "C2", "C3"):
        res = by[cid]
        assert res["outcome"] == "missing_role", (cid, res)
        assert "dlcheck_load_checkpoint" in res["reason"], (cid, res)
        assert "never resumes" in res["reason"], (cid, res)
    c10 = by["C10"]
    assert c10["outcome"] == "not_applicable", c10
    assert "without accelerator.save_state" in c10["reason"], c10
    # dlcheck's own load_state never ran on what the user's save wrote, nor is anything blamed on a role
    for cid in ("C1", "C2", "C3", "C10"):
        text = _said(by[cid])
        assert "FileNotFoundError" not in text and "optimizer.bin" not in text, (cid, text)
        assert "your load" not in text, (cid, text)
    assert "FileNotFoundError" not in run.text


def test_a_save_through_save_state_without_a_load_is_judged_by_c10_with_load_state_said_so(project, tmp_path):
    run, by = _run(project, tmp_path, SAVE_STATE_SAVE, "C1,C10")
    assert by["C1"]["outcome"] == "missing_role" and "dlcheck_load_checkpoint" in by["C1"]["reason"], by["C1"]
    c10 = by["C10"]
    assert c10["outcome"] == "passed", c10
    text = " ".join(c10["evidence"])
    assert "dlcheck_save_checkpoint / accelerator.load_state" in text, text
    assert "no dlcheck_load_checkpoint" in text, text


def test_a_save_and_load_that_lose_the_optimizer_state_still_fail_c1(project, tmp_path):
    run, by = _run(project, tmp_path, WEIGHTS_SAVE + WEIGHTS_LOAD, "C1,C10")
    c1 = by["C1"]
    assert c1["outcome"] == "failed", c1
    assert "optimizer" in c1["cause"], c1
    assert "FileNotFoundError" not in _said(c1)
    # a save of its own, not through save_state: C10's question does not concern it
    assert by["C10"]["outcome"] == "not_applicable", by["C10"]


#: save_state into a folder of its own under the path: load_state(path) finds no checkpoint there
SAVE_STATE_ELSEWHERE = """
    @pytest.fixture(scope="session")
    def dlcheck_save_checkpoint():
        def save(state, path):
            state["accelerator"].save_state(os.path.join(path, "step_1"))
        return save
"""


def test_c10_names_the_missing_load_when_load_state_cannot_read_the_users_save(project, tmp_path):
    """dlcheck's own load_state failing on a save of the user's is its pairing's failure: a missing role, not an
    error of dlcheck_make_training."""
    run, by = _run(project, tmp_path, SAVE_STATE_ELSEWHERE, "C10")
    c10 = by["C10"]
    assert c10["outcome"] == "missing_role", c10
    assert "dlcheck_load_checkpoint" in c10["reason"] and "stand-in accelerator.load_state" in c10["reason"], c10
    assert "dlcheck_make_training" not in c10["reason"], c10
