"""C1 compares the EMA: a plain loop whose checkpoint leaves the EMA out resumes with the same losses and
weights, but another EMA (torch AveragedModel, diffusers EMAModel)."""

import re
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "train"))
import tiny_train as tt  # noqa: E402

EMA_LOOP = """
    import pytest, torch, tiny_train as tt
    from torch import nn
    from torch.optim.swa_utils import AveragedModel, get_ema_multi_avg_fn
    from diffusers.training_utils import EMAModel

    @pytest.fixture(scope="session")
    def dlcheck_make_training():
        def make():
            model = tt.MLP()
            optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2)
            return {{"model": model, "optimizer": optimizer,
                     "lr_scheduler": torch.optim.lr_scheduler.LambdaLR(optimizer, tt.warmup(3)), "ema": {ema}}}
        return make

    @pytest.fixture(scope="session")
    def dlcheck_dataloader():
        return tt.loader()

    @pytest.fixture(scope="session")
    def dlcheck_train_step():
        def step(state, batch):
            model, opt, ema = state["model"], state["optimizer"], state["ema"]
            x, y = batch
            loss = nn.functional.cross_entropy(model(x), y)
            loss.backward()
            opt.step()
            state["lr_scheduler"].step()
            opt.zero_grad(set_to_none=True)
            {update}
            return loss.detach()
        return step

    @pytest.fixture(scope="session")
    def dlcheck_save_checkpoint():
        def save(state, path):
            ckpt = {{k: state[k].state_dict() for k in ("model", "optimizer", "lr_scheduler")}}
            ckpt["rng"] = torch.random.get_rng_state()
            {save_ema}
            torch.save(ckpt, path)
        return save

    @pytest.fixture(scope="session")
    def dlcheck_load_checkpoint():
        def load(state, path):
            ckpt = torch.load(path, weights_only=False)
            for k in ("model", "optimizer", "lr_scheduler"):
                state[k].load_state_dict(ckpt[k])
            torch.random.set_rng_state(ckpt["rng"])
            {load_ema}
        return load
"""

AVERAGED = dict(
    ema="AveragedModel(model, multi_avg_fn=get_ema_multi_avg_fn(0.999))", update="ema.update_parameters(model)"
)
EMAMODEL = dict(ema="EMAModel(model.parameters(), decay=0.999)", update="ema.step(model.parameters())")
SAVE = 'ckpt["ema"] = state["ema"].state_dict()'
LOAD = 'state["ema"].load_state_dict(ckpt["ema"])'


def project_with(kind, save_ema=SAVE, load_ema=LOAD):
    return EMA_LOOP.format(save_ema=save_ema, load_ema=load_ema, **kind)


def test_averaged_model_left_out_of_the_checkpoint_fails(project):
    project.conftest(project_with(AVERAGED, save_ema="pass  # the EMA is not saved", load_ema="pass"))
    run = project.run("--dlcheck=C1")
    run.assert_outcome("C1", "failed")
    text = tt.section(run, "C1")
    assert re.search(
        r"at step 4 the EMA state\['ema'\] \(AveragedModel of MLP, decay 0.999\) differs from the uninterrupted run's "
        r"at the end: \d+ of 5 tensors, first 'module.body.0.weight' \(max abs diff [0-9.e-]+; largest [0-9.e-]+\); "
        r"n_averaged 2 resumed vs 4 uninterrupted",
        text,
    ), text
    assert "the losses and the model's weights of the resumed steps match: the EMA does not feed the loss" in text
    assert "putting back ema from the uninterrupted run after the load makes the resumed run identical" in text
    assert "the checkpoint does not restore the EMA state['ema'] (AveragedModel of MLP, decay 0.999)" in text
    assert "(n_averaged 2 after the resume vs 4 uninterrupted)" in text
    assert "in dlcheck_save_checkpoint save state['ema'].state_dict(), and load_state_dict them" in text
    assert "an AveragedModel's state_dict holds its averaged weights and n_averaged" in text


def test_averaged_model_saved_and_loaded_passes(project):
    project.conftest(project_with(AVERAGED))
    run = project.run("--dlcheck=C1", "-rA")
    run.assert_outcome("C1", "passed")
    assert "the losses, learning rates, weights, EMA of steps 3-4 equal the uninterrupted run's, bitwise" in run.text, (
        run.text
    )
    assert (
        "the EMA state['ema'] (AveragedModel of MLP, decay 0.999) at the end of the resumed run equals the "
        "uninterrupted run's, bitwise (5 tensors, n_averaged 4 in both runs)" in run.text
    ), run.text


def test_ema_model_saved_but_not_loaded_fails(project):
    project.conftest(project_with(EMAMODEL, load_ema="pass  # saved, never loaded"))
    run = project.run("--dlcheck=C1")
    run.assert_outcome("C1", "failed")
    text = tt.section(run, "C1")
    assert re.search(
        r"the EMA state\['ema'\] \(diffusers EMAModel, decay 0.999\) differs from the uninterrupted run's at the end: "
        r"4 of 4 tensors, first 'shadow_params\[0\]' \(max abs diff [0-9.e-]+; largest [0-9.e-]+\); "
        r"optimization_step 2 resumed vs 4 uninterrupted",
        text,
    ), text
    assert "putting back ema from the uninterrupted run after the load makes the resumed run identical" in text
    assert "a diffusers EMAModel's its shadow_params and optimization_step" in text


def test_ema_model_saved_and_loaded_passes(project):
    project.conftest(project_with(EMAMODEL))
    run = project.run("--dlcheck=C1", "-rA")
    run.assert_outcome("C1", "passed")
    assert (
        "the EMA state['ema'] (diffusers EMAModel, decay 0.999) at the end of the resumed run equals the "
        "uninterrupted run's, bitwise (4 tensors, optimization_step 4 in both runs)" in run.text
    ), run.text


def test_no_ema_compares_what_it_did(project):
    project.conftest(
        tt.loop_project(
            extra="""
    @pytest.fixture(scope="session")
    def dlcheck_save_checkpoint():
        return tt.save_all

    @pytest.fixture(scope="session")
    def dlcheck_load_checkpoint():
        return tt.load_all
"""
        )
    )
    run = project.run("--dlcheck=C1", "-rA")
    run.assert_outcome("C1", "passed")
    assert "the losses, learning rates, weights of steps 3-4 equal the uninterrupted run's, bitwise" in run.text
    assert "the EMA" not in run.text
