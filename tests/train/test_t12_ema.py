"""T12: an EMA kept in the training state that the loop never updates (torch AveragedModel, diffusers EMAModel)."""

import re

import tiny_train as tt

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
            return {{"model": model, "optimizer": optimizer, "{key}": {ema}}}
        return make

    @pytest.fixture(scope="session")
    def dlcheck_dataloader():
        return tt.loader()

    @pytest.fixture(scope="session")
    def dlcheck_train_step():
        def step(state, batch):
            model, opt, ema = state["model"], state["optimizer"], state["{key}"]
            x, y = batch
            loss = nn.functional.cross_entropy(model(x), y)
            loss.backward()
            opt.step()
            opt.zero_grad(set_to_none=True)
            {update}
            return loss.detach()
        return step
"""

TIMM_V1 = "__import__('timm.utils', fromlist=['ModelEma']).ModelEma(model, decay=0.99)"
AVERAGED = "AveragedModel(model, multi_avg_fn=get_ema_multi_avg_fn(0.999))"
EMAMODEL = "EMAModel(model.parameters(), decay=0.999)"


def project_with(key="ema", ema=AVERAGED, update="pass"):
    return EMA_LOOP.format(key=key, ema=ema, update=update)


def test_averaged_model_never_updated_fails(project):
    project.conftest(project_with(update="pass  # ema.update_parameters(model) forgotten"))
    run = project.run("--dlcheck=T12")
    run.assert_outcome("T12", "failed")
    text = tt.section(run, "T12")
    assert "smoke run made 20 optimizer steps; the model's weights moved (4 of 4 parameter tensors changed" in text
    assert (
        "the EMA state['ema'] (AveragedModel of MLP, decay 0.999) still holds exactly its initial weights: all 4 "
        "tensors equal the fresh state's, bit for bit" in text
    )
    assert "its counter: n_averaged 0 after 20 optimizer steps (never updated)" in text
    assert "the training loop never updates the EMA" in text
    assert "call ema.update_parameters(model) right after each optimizer.step()" in text
    assert "if accelerator.sync_gradients" in text


def test_averaged_model_updated_after_each_step_passes(project):
    project.conftest(project_with(update="ema.update_parameters(model)"))
    run = project.run("--dlcheck=T12", "-rA")
    run.assert_outcome("T12", "passed")
    assert (
        "the 20-step smoke run made 20 optimizer steps; the model's weights moved (4 of 4 parameter tensors" in run.text
    )
    assert re.search(
        r"the EMA state\['ema'\] \(AveragedModel of MLP, decay 0.999\) moved with it: 4 of 4 tensors changed, by up "
        r"to [0-9.e-]+; n_averaged 20\n",
        run.text,
    )


def test_diffusers_ema_model_never_stepped_fails(project):
    project.conftest(project_with(key="model_ema", ema=EMAMODEL, update="pass"))
    run = project.run("--dlcheck=T12")
    run.assert_outcome("T12", "failed")
    text = tt.section(run, "T12")
    assert (
        "the EMA state['model_ema'] (diffusers EMAModel, decay 0.999) still holds exactly its initial weights" in text
    )
    assert "its counter: optimization_step 0 after 20 optimizer steps (never updated)" in text
    assert "call ema.step(model.parameters()) right after each optimizer.step()" in text


def test_diffusers_ema_model_stepped_passes(project):
    project.conftest(project_with(key="model_ema", ema=EMAMODEL, update="ema.step(model.parameters())"))
    run = project.run("--dlcheck=T12", "-rA")
    run.assert_outcome("T12", "passed")
    assert re.search(
        r"the EMA state\['model_ema'\] \(diffusers EMAModel, decay 0.999\) moved with it: 4 of 4 tensors changed, "
        r"by up to [0-9.e-]+; optimization_step 20\n",
        run.text,
    )


def test_a_module_copy_named_ema_that_is_never_updated_fails(project):
    project.conftest(project_with(key="ema_model", ema="tt.MLP().requires_grad_(False)", update="pass"))
    run = project.run("--dlcheck=T12")
    run.assert_outcome("T12", "failed")
    text = tt.section(run, "T12")
    assert "the EMA state['ema_model'] (MLP module) still holds exactly its initial weights" in text
    assert "its counter: no update counter after 20 optimizer steps" in text


def test_no_ema_is_not_applicable(project):
    project.conftest(tt.loop_project())
    run = project.run("--dlcheck=T12", "-rs")
    run.assert_outcome("T12", "skipped")
    run.fnmatch(["*not applicable: no EMA in the training state (dlcheck_make_training's dict holds: model, optim*"])


LIGHTNING = """
    import pytest, torch, tiny_lightning as tl
    from torch.optim.swa_utils import AveragedModel, get_ema_multi_avg_fn

    class WithEma(tl.Classifier):
        def __init__(self):
            super().__init__()
            self.ema = AveragedModel(self.net, multi_avg_fn=get_ema_multi_avg_fn(0.99))

        def on_train_batch_end(self, outputs, batch, batch_idx):
            {update}

    @pytest.fixture(scope="session")
    def dlcheck_lightning_module():
        torch.manual_seed(0)
        return WithEma()

    @pytest.fixture(scope="session")
    def dlcheck_datamodule():
        return tl.Blobs()
"""


def test_lightning_module_whose_ema_is_never_updated_fails(project):
    import tiny_lightning  # noqa: F401 - Lightning imported once, before the in-process run

    project.conftest(LIGHTNING.format(update="pass"))
    run = project.run("--dlcheck=T12")
    run.assert_outcome("T12", "failed")
    text = tt.section(run, "T12")
    assert "the model's weights moved (4 of 4 parameter tensors changed" in text  # the EMA's own left out
    assert "the EMA self.ema of the LightningModule (AveragedModel of MLP, decay 0.99) still holds exactly" in text
    assert "n_averaged 0" in text


def test_lightning_module_updating_its_ema_passes(project):
    import tiny_lightning  # noqa: F401

    project.conftest(LIGHTNING.format(update="self.ema.update_parameters(self.net)"))
    run = project.run("--dlcheck=T12", "-rA")
    run.assert_outcome("T12", "passed")
    assert "(AveragedModel of MLP, decay 0.99) moved with it: 4 of 4 tensors changed" in run.text, run.text


def test_timm_model_ema_never_updated_fails(project):
    """timm's ModelEma (v1: a plain object keeping the averaged copy as .ema, as facebookresearch/deit uses it; found
    blind, set 15): T12 had skipped, 'holds no tensors T12 can read'."""
    project.conftest(project_with(key="model_ema", ema=TIMM_V1, update="pass"))
    run = project.run("--dlcheck=T12")
    run.assert_outcome("T12", "failed")
    text = tt.section(run, "T12")
    assert "the EMA state['model_ema'] (ModelEma" in text and "still holds exactly its initial weights" in text


def test_timm_model_ema_updated_passes(project):
    project.conftest(project_with(key="model_ema", ema=TIMM_V1, update="ema.update(model)"))
    run = project.run("--dlcheck=T12", "-rA")
    run.assert_outcome("T12", "passed")
    assert re.search(r"the EMA state\['model_ema'\] \(ModelEma[^)]*\) moved with it: 4 of 4 tensors changed", run.text)
