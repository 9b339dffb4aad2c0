"""A Lightning user's Trainer callbacks run in every training the checks do (dlcheck_lightning_callbacks, or
the callbacks of the lightning Trainer given as dlcheck_trainer): a backbone frozen by a finetuning schedule
stays frozen in dlcheck's runs, and a callback's state that the checkpoint does not keep (a batch counter, an
EMA) makes C1 fail, naming the callback, while its twin that saves it passes."""

import sys
from pathlib import Path

import lightning.pytorch as pl
import pytest
import torch
from lightning.pytorch.callbacks import BackboneFinetuning

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "train"))
import lightning_callbacks as lc  # noqa: E402
import tiny_lightning as tl  # noqa: E402
import tiny_train as tt  # noqa: E402

from pytest_dlcheck.errors import MISSING  # noqa: E402
from pytest_dlcheck.training.lightning import LightningSetup  # noqa: E402

torch.set_num_threads(1)

MODULE = """
    import pytest, torch, lightning.pytorch as pl, tiny_lightning as tl, lightning_callbacks as lc
    from lightning.pytorch.callbacks import BackboneFinetuning, EMAWeightAveraging, LearningRateMonitor, ModelCheckpoint

    @pytest.fixture(scope="session")
    def dlcheck_lightning_module():
        torch.manual_seed(0)
        return {module}

    @pytest.fixture(scope="session")
    def dlcheck_datamodule():
        return tl.Blobs()
"""

ROLE = """
    @pytest.fixture(scope="session")
    def dlcheck_lightning_callbacks():
        return lambda: [{callback}]
"""

TRAINER = """
    @pytest.fixture(scope="session")
    def dlcheck_trainer(tmp_path_factory):
        # the user's own Trainer: its checkpoints and its learning-rate logging are not dlcheck's to run
        mine = tmp_path_factory.mktemp("users-checkpoints")
        return pl.Trainer(
            callbacks=[{callback}, ModelCheckpoint(dirpath=str(mine)), LearningRateMonitor()], logger=False
        )
"""


def conftest(module: str, callback: str, via: str = "role") -> str:
    return MODULE.format(module=module) + (ROLE if via == "role" else TRAINER).format(callback=callback)


# --------------------------------------------------------------------------------------------------
# the runs themselves


def test_the_smoke_run_trains_with_the_users_freeze_and_a_fresh_callback_per_run(tmp_path_factory):
    """BackboneFinetuning freezes the backbone until epoch 5: the smoke run's trained module keeps the backbone's
    initial weights and trains the head; every run gets callbacks of its own."""
    made = []

    def callbacks():
        made.append(BackboneFinetuning(unfreeze_backbone_at_epoch=5))
        return [made[-1]]

    torch.manual_seed(0)
    module = lc.Finetuner()
    setup = LightningSetup(module, tl.Blobs(), MISSING, tmp_path_factory, callbacks)
    traj, trained, _ = setup.smoke(3)
    assert traj.notes["opt_steps"] == 3
    after = dict(trained.model.named_parameters())
    for name, p in module.named_parameters():
        changed = not torch.equal(p, after[name])
        assert changed == name.startswith("head."), (name, changed)
    setup.smoke(1)
    assert len(made) == 2 and made[0] is not made[1]
    # the user's module is left as it was: the freeze happened on dlcheck's copies
    assert all(p.requires_grad for p in module.parameters())


def test_the_callbacks_of_the_users_trainer_are_copied_without_its_checkpoints_and_loggers(tmp_path_factory):
    from lightning.pytorch.callbacks import LearningRateMonitor, ModelCheckpoint

    mine = tmp_path_factory.mktemp("users-checkpoints")
    ema = lc.EMA()
    trainer = pl.Trainer(callbacks=[ema, ModelCheckpoint(dirpath=str(mine)), LearningRateMonitor()], logger=False)
    torch.manual_seed(0)
    setup = LightningSetup(tl.Classifier(), tl.Blobs(), trainer, tmp_path_factory)
    first, second = setup.user_callbacks(), setup.user_callbacks()
    assert [type(c).__name__ for c in first] == ["EMA"] and first[0] is not ema and second[0] is not first[0]
    assert {"ModelCheckpoint", "LearningRateMonitor"} <= set(setup.left_out)
    setup.smoke(2)
    assert ema.ema is None  # the user's own callback never ran
    assert not any(mine.iterdir())  # nothing written into the user's checkpoint folder


@pytest.mark.parametrize("given", ["list", "one", "class", "same objects"])
def test_every_run_gets_callbacks_of_its_own_however_they_are_given(tmp_path_factory, given):
    mine = lc.EMA()
    source = {"list": [mine], "one": mine, "class": lc.EMA, "same objects": lambda: [mine]}[given]
    torch.manual_seed(0)
    setup = LightningSetup(tl.Classifier(), tl.Blobs(), MISSING, tmp_path_factory, source)
    runs = [setup.user_callbacks() for _ in range(3)]
    assert all(len(r) == 1 and type(r[0]) is lc.EMA for r in runs)
    assert len({id(r[0]) for r in runs}) == 3
    # the user's objects are never trained, not even those a factory hands out twice
    assert not any(r[0] is mine for r in runs) and mine.ema is None


# --------------------------------------------------------------------------------------------------
# C1: a callback's state the checkpoint does not keep


def test_a_freeze_schedule_counting_unsaved_batches_fails_c1_naming_the_callback(project):
    """FreezeFor unfreezes the backbone after 2 batches, counted in an attribute nothing saves: the resumed fit
    counts from 0 and trains steps 3-4 with the backbone frozen again. Without the callback in dlcheck's runs
    both runs would train the whole model and C1 would pass."""
    project.conftest(conftest("lc.Finetuner()", "lc.FreezeFor(steps=2)"))
    run = project.run("--dlcheck=C1")
    run.assert_outcome("C1", "failed")
    text = tt.section(run, "C1")
    assert "from the uninterrupted run after the load makes the resumed run identical" in text, text
    assert "putting back callback FreezeFor" in text, text
    assert "the state of your callback FreezeFor (self.seen" in text, text
    assert "FreezeFor defines no state_dict()" in text, text
    assert "give your callback FreezeFor state_dict() returning self.seen" in text, text


@pytest.mark.parametrize("callback", ["lc.SavedFreezeFor(steps=2)", "BackboneFinetuning(unfreeze_backbone_at_epoch=1)"])
def test_a_freeze_schedule_that_saves_its_state_resumes_exactly(project, callback):
    """The twins: the counter saved through state_dict, and Lightning's BackboneFinetuning (frozen in epoch 0,
    unfrozen with a param group of its own in epoch 1, its optimizer metadata saved)."""
    project.conftest(conftest("lc.Finetuner()", callback))
    run = project.run("--dlcheck=C1", "-rA")
    run.assert_outcome("C1", "passed")
    run.fnmatch(
        [
            "*resumed on fresh objects: the losses, learning rates, weights of steps 3-4 equal*bitwise*",
            f"*your callbacks ran in every run: {callback.split('(')[0].removeprefix('lc.')}*",
        ]
    )


@pytest.mark.parametrize("via", ["role", "trainer"])
def test_an_ema_callback_without_state_dict_fails_c1_naming_the_ema(project, via):
    project.conftest(conftest("tl.Classifier()", "lc.EMA(decay=0.9)", via))
    run = project.run("--dlcheck=C1")
    run.assert_outcome("C1", "failed")
    text = tt.section(run, "C1")
    assert "the EMA self.ema of your callback EMA" in text and "differs from the uninterrupted run's at the end" in text
    assert "the losses and the model's weights of the resumed steps match" in text, text
    assert "putting back callback EMA from the uninterrupted run" in text, text
    assert "the resumed run's EMA starts over from a fresh one" in text and "EMA defines no state_dict()" in text
    assert "give your callback EMA state_dict() returning self.ema (the EMA module's state_dict()" in text, text


@pytest.mark.parametrize(
    "callback, via", [("lc.SavedEMA(decay=0.9)", "role"), ("EMAWeightAveraging(decay=0.9)", "trainer")]
)
def test_an_ema_callback_that_saves_its_weights_resumes_exactly(project, callback, via):
    project.conftest(conftest("tl.Classifier()", callback, via))
    run = project.run("--dlcheck=C1", "-rA")
    run.assert_outcome("C1", "passed")
    name = callback.split("(")[0].removeprefix("lc.")
    lines = [
        "*resumed on fresh objects: the losses, learning rates, weights, EMA of steps 3-4 equal*bitwise*",
        f"*the EMA self.* of your callback {name} * at the end of the resumed run equals the uninterrupted run's, "
        "bitwise*",
        f"*your callbacks ran in every run: {name}*",
    ]
    if via == "trainer":  # the user's Trainer's checkpointing and LR logging are not run by dlcheck
        lines[-1] += "(left out: LearningRateMonitor, ModelCheckpoint: they checkpoint, log or stop, none trains)"
    run.fnmatch(lines)


def test_the_callbacks_named_on_the_command_line_run_too(project):
    """No conftest.py: the module and datamodule by --dlcheck-lightning, the callbacks' factory by --dlcheck-role
    (the attribute without () is the role's value: called for every run)."""
    project.conftest("", path="proj/__init__.py")
    project.conftest(
        """
        import torch, tiny_lightning as tl, lightning_callbacks as lc

        def build():
            torch.manual_seed(0)
            return tl.Classifier(), tl.Blobs()

        def callbacks():
            return [lc.EMA(decay=0.9)]
        """,
        path="proj/lit.py",
    )
    run = project.run(
        "--dlcheck=C1", "--dlcheck-lightning=proj.lit:build", "--dlcheck-role=lightning_callbacks=proj.lit:callbacks"
    )
    run.assert_outcome("C1", "failed")
    text = tt.section(run, "C1")
    assert "the EMA self.ema of your callback EMA" in text and "EMA defines no state_dict()" in text, text
