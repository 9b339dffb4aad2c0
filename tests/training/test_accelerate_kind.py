"""Accelerate users, the fourth kind (issue 18): a factory returning the ``Accelerator`` with what it prepared
and an EMA, the step as written (``accumulate``, ``backward``, ``sync_gradients``), checkpoints through
``save_state`` / ``load_state`` by default. C10 judges what that round trip leaves behind; C1, T6 and the
rest run through the same objects. Real Accelerate, real EMA (torch's AveragedModel), a tiny classifier."""

import json
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parents[1] / "train"))  # tiny_train, for the in-process projects

PROJECT = """
    import pytest, torch
    from torch import nn
    from torch.nn import functional as F
    from torch.optim.swa_utils import AveragedModel, get_ema_multi_avg_fn
    from torch.utils.data import DataLoader, TensorDataset
    from accelerate import Accelerator

    REGISTER_EMA = {register_ema}
    PREPARE_SCHEDULER = {prepare_scheduler}

    def data():
        g = torch.Generator().manual_seed(0)
        y = torch.randint(0, 3, (64,), generator=g)
        x = torch.tensor([[2.0, 0.0], [-2.0, 0.0], [0.0, 2.0]])[y] + 0.3 * torch.randn(64, 2, generator=g)
        return TensorDataset(x, y)

    @pytest.fixture(scope="session")
    def dlcheck_make_training():
        def make():
            acc = Accelerator(cpu=True, gradient_accumulation_steps=2)
            model = nn.Sequential(nn.Linear(2, 16), nn.Tanh(), nn.Linear(16, 3))
            ema = AveragedModel(model, multi_avg_fn=get_ema_multi_avg_fn(0.9))
            opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
            sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: min(1.0, (s + 1) / 3))
            loader = DataLoader(data(), batch_size=8, shuffle=True)
            model, opt, loader = acc.prepare(model, opt, loader)
            if PREPARE_SCHEDULER:
                sched = acc.prepare(sched)
            if REGISTER_EMA:
                acc.register_for_checkpointing(ema)
            return {{"model": model, "optimizer": opt, "lr_scheduler": sched, "ema": ema, "accelerator": acc}}
        return make

    @pytest.fixture(scope="session")
    def dlcheck_dataloader():
        return DataLoader(data(), batch_size=8, shuffle=True)

    @pytest.fixture(scope="session")
    def dlcheck_loss_fn():
        return nn.CrossEntropyLoss()

    @pytest.fixture(scope="session")
    def dlcheck_train_step():
        def step(state, batch):
            acc, model, opt, sched = state["accelerator"], state["model"], state["optimizer"], state["lr_scheduler"]
            x, y = batch
            with acc.accumulate(model):
                loss = F.cross_entropy(model(x), y)
                acc.backward(loss)
                if acc.sync_gradients:
                    acc.clip_grad_norm_(model.parameters(), 1.0)
                opt.step()
                sched.step()  # a prepared scheduler steps only when gradients sync; a bare one every call
                opt.zero_grad()
            if acc.sync_gradients:
                state["ema"].update_parameters(acc.unwrap_model(model))
            return loss
        return step
"""


def _run(project, tmp_path, selection, **flags):
    project.conftest(PROJECT.format(**{"register_ema": True, "prepare_scheduler": True, **flags}))
    out = tmp_path / "r.json"
    run = project.run(f"--dlcheck={selection}", f"--dlcheck-json={out}", "-rA")
    doc = json.loads(out.read_text())
    return run, {r["id"]: r for r in doc["results"]}, doc


def test_a_correct_accelerate_loop_passes_and_round_trips_every_piece(project, tmp_path):
    run, by, doc = _run(project, tmp_path, "train,ckpt,smoke")
    assert doc["summary"]["error"] == 0 and doc["summary"]["failed"] == 0, run.text
    c10 = by["C10"]
    assert c10["outcome"] == "passed", c10
    text = " ".join(c10["evidence"])
    for piece in ("state['model']", "state['optimizer']", "state['lr_scheduler']", "state['ema']"):
        assert piece in text, text
    assert "accelerator.save_state" in text and "skip_first_batches" in text
    assert by["C1"]["outcome"] == "passed", by["C1"]
    assert "accelerator.save_state / accelerator.load_state" in by["C1"]["evidence"][0]
    assert by["T6"]["outcome"] == "passed", by["T6"]
    # the training is described as the Accelerate kind it is (T11's evidence names the setup)
    assert "fresh Accelerator-prepared objects from dlcheck_make_training" in " ".join(by["T11"]["evidence"])


def test_an_ema_not_registered_for_checkpointing_is_named_by_c10(project, tmp_path):
    run, by, _ = _run(project, tmp_path, "C10,C1", register_ema=False)
    c10 = by["C10"]
    assert c10["outcome"] == "failed", c10
    text = " ".join(c10["evidence"])
    assert "state['ema'] (AveragedModel) does not come back" in text, text
    assert "neither prepared nor registered" in text
    assert "n_averaged" in text or "max |difference|" in text
    assert "register_for_checkpointing(state['ema'])" in c10["fix"]
    assert "state['model']" in text  # what did come back is listed too
    # the EMA does not feed the loss: C1's losses match, and it names the EMA from the ends of the two runs
    assert by["C1"]["outcome"] == "failed", by["C1"]
    assert "ema" in by["C1"]["cause"].lower(), by["C1"]


def test_a_scheduler_neither_prepared_nor_registered_fails_c10_t6_and_c1(project, tmp_path):
    run, by, _ = _run(project, tmp_path, "C10,C1,T6", prepare_scheduler=False)
    c10 = by["C10"]
    assert c10["outcome"] == "failed", c10
    assert "state['lr_scheduler'] (LambdaLR) does not come back" in " ".join(c10["evidence"])
    assert "accelerator.prepare(state['lr_scheduler'])" in c10["fix"]
    # stepped on every micro-batch of the accumulation instead of when gradients sync
    t6 = by["T6"]
    assert t6["outcome"] == "failed", t6
    assert "2.0 scheduler steps per optimizer step" in " ".join(t6["evidence"]), t6
    c1 = by["C1"]
    assert c1["outcome"] == "failed", c1
    assert "lr_scheduler" in c1["cause"] or "scheduler" in c1["cause"], c1
    assert "accelerator.prepare" in c1["fix"] or "register_for_checkpointing" in c1["fix"], c1["fix"]


@pytest.mark.parametrize("selection", ["C10"])
def test_c10_is_not_applicable_without_an_accelerator(project, tmp_path, selection):
    project.conftest(
        """
        import pytest, torch
        from torch import nn
        from torch.utils.data import DataLoader, TensorDataset

        @pytest.fixture(scope="session")
        def dlcheck_make_training():
            def make():
                model = nn.Linear(2, 3)
                return {"model": model, "optimizer": torch.optim.SGD(model.parameters(), lr=0.1)}
            return make

        @pytest.fixture(scope="session")
        def dlcheck_dataloader():
            return DataLoader(TensorDataset(torch.randn(16, 2), torch.randint(0, 3, (16,))), batch_size=4)

        @pytest.fixture(scope="session")
        def dlcheck_loss_fn():
            return nn.CrossEntropyLoss()
        """
    )
    out = tmp_path / "r.json"
    project.run(f"--dlcheck={selection}", f"--dlcheck-json={out}")
    (res,) = json.loads(out.read_text())["results"]
    assert res["outcome"] == "not_applicable", res
    assert "no Accelerator" in res["reason"]


LLM_PROJECT = """
    import pytest, tiny, torch
    import tiny_train as tt
    from accelerate import Accelerator
    from transformers import get_linear_schedule_with_warmup

    @pytest.fixture(scope="session")
    def dlcheck_tokenizer():
        return tiny.tokenizer()

    @pytest.fixture(scope="session")
    def dlcheck_dataloader(dlcheck_tokenizer):
        return tt.llm_loader(dlcheck_tokenizer)

    @pytest.fixture(scope="session")
    def dlcheck_make_training(dlcheck_tokenizer):
        def make():
            acc = Accelerator(cpu=True, gradient_accumulation_steps=2)
            model = tiny.llama(dlcheck_tokenizer)
            opt = torch.optim.AdamW(model.parameters(), lr=3e-3)
            sched = get_linear_schedule_with_warmup(opt, 2, 100)
            model, opt, sched = acc.prepare(model, opt, sched)
            return {"accelerator": acc, "model": model, "optimizer": opt, "lr_scheduler": sched}
        return make
"""


def test_an_llm_fine_tuning_loop_with_the_default_accelerate_step_passes(project, tmp_path):
    """No step, no save/load fixtures: the default Accelerate step (accumulate, backward) and save_state."""
    project.conftest(LLM_PROJECT)
    out = tmp_path / "r.json"
    run = project.run("--dlcheck=llm,train,ckpt,smoke", f"--dlcheck-json={out}", "-rA")
    doc = json.loads(out.read_text())
    by = {r["id"]: r for r in doc["results"]}
    assert doc["summary"]["error"] == 0 and doc["summary"]["failed"] == 0, run.text
    for cid in ("T3", "T6", "C1", "C10", "S1"):
        assert by[cid]["outcome"] == "passed", (cid, by[cid])
    assert "accelerator.save_state" in by["C1"]["evidence"][0]
    # no dlcheck_train_step: T10 does not judge dlcheck's own default step, it names the fixture
    assert by["T10"]["outcome"] == "missing_role" and "dlcheck_train_step" in by["T10"]["reason"], by["T10"]


OWN_SAVE = """

    @pytest.fixture(scope="session")
    def dlcheck_save_checkpoint():
        def save(state, path):  # a Trainer class of its own on Accelerate (lucidrains' denoising-diffusion): torch.save
            acc = state["accelerator"]
            torch.save({"model": acc.unwrap_model(state["model"]).state_dict(), "opt": state["optimizer"].state_dict(),
                        "ema": state["ema"].state_dict(), "sched": state["lr_scheduler"].state_dict()}, path)
        return save

    @pytest.fixture(scope="session")
    def dlcheck_load_checkpoint():
        def load(state, path):
            data = torch.load(path, weights_only=True)
            state["accelerator"].unwrap_model(state["model"]).load_state_dict(data["model"])
            state["optimizer"].load_state_dict(data["opt"])
            state["ema"].load_state_dict(data["ema"])
            state["lr_scheduler"].load_state_dict(data["sched"])
        return load
"""


def test_c10_is_not_applicable_to_a_checkpoint_written_without_save_state(project, tmp_path):
    """An Accelerate loop whose save is its own torch.save dict (found blind, set 14: lucidrains' Trainer): C10's
    question (what save_state / load_state leave behind) does not concern it, and its data-position finding is C1's;
    C10 had failed with C1's evidence under its save_state title."""
    project.conftest(PROJECT.format(register_ema=True, prepare_scheduler=True) + OWN_SAVE)
    out = tmp_path / "r.json"
    run = project.run("--dlcheck=C10", f"--dlcheck-json={out}", "-rA")
    by = {r["id"]: r for r in json.loads(out.read_text())["results"]}
    assert by["C10"]["outcome"] == "not_applicable", by["C10"]
    assert "without accelerator.save_state" in run.text and "C1 judges this training's resume" in run.text
