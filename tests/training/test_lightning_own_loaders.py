"""A LightningModule that defines its own train_dataloader() and no datamodule (Lightning's classic style, e.g.
reinforce_learn_Qnet.py): the checks train it as Lightning does, ``trainer.fit(module)`` on fresh copies, and
derive the training dataloader from the module's own train_dataloader()."""

import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "train"))
import tiny_lightning as tl  # noqa: E402
import tiny_train as tt  # noqa: E402


def _results(run_json: Path) -> dict:
    return {r["id"]: r for r in json.loads(run_json.read_text())["results"]}


def test_the_module_s_own_loaders_are_the_data_of_the_smoke_run_c1_and_the_train_checks(project, tmp_path):
    project.conftest(tl.own_loaders_project("shuffle=True"))
    out = tmp_path / "r.json"
    run = project.run("--dlcheck=C1,S1,S3,T1,T3,T7", "-rA", f"--dlcheck-json={out}")
    assert "no datamodule" not in run.text and "no training dataloader could be derived" not in run.text, run.text
    assert "internal error" not in run.text, run.text
    for cid in ("C1", "S1", "S3", "T1", "T3", "T7"):
        run.assert_outcome(cid, "passed")
    run.fnmatch(
        [
            "4 steps, saved after step 2 through ModelCheckpoint's epoch=0-step=2.ckpt and fit(ckpt_path=...), "
            "resumed on fresh objects: the losses, learning rates, weights of steps 3-4 equal the uninterrupted "
            "run's, bitwise",
            "20-step smoke run: losses * (20 logged), all finite*",
        ]
    )
    by = _results(out)
    assert by["T7"]["evidence"][0].startswith(
        "dlcheck_lightning_module's train_dataloader(): its RandomSampler gives epoch 1 an order other than"
    ), by["T7"]


def test_python_random_drawn_in_training_step_without_saved_rng_fails_c3(project, tmp_path):
    """The DQN's way: training_step draws from python's random (epsilon-greedy there, an input scale here) and the
    .ckpt holds no RNG state. C1 (the RNG states put back) passes; C3 fails and says how a LightningModule saves
    them."""
    project.conftest(tl.own_loaders_project("jitter=True"))
    out = tmp_path / "r.json"
    run = project.run("--dlcheck=C1,C3", "-rA", f"--dlcheck-json={out}")
    run.assert_outcome("C1", "passed")
    run.assert_outcome("C3", "failed")
    text = tt.section(run, "C3")
    assert "ModelCheckpoint's epoch=0-step=2.ckpt and fit(ckpt_path=...)" in text
    assert "at step 3 loss" in text and "with the RNG states as your resume leaves them vs" in text
    assert "with them put back, the resumed run equals the uninterrupted run bitwise" in text
    c3 = _results(out)["C3"]
    assert "does not restore the random number generators" in c3["cause"]
    assert "on_save_checkpoint" in c3["fix"] and "on_load_checkpoint" in c3["fix"]


def test_the_twin_that_saves_its_rng_states_passes_c3(project, tmp_path):
    project.conftest(tl.own_loaders_project("jitter=True, keep_rng=True"))
    out = tmp_path / "r.json"
    run = project.run("--dlcheck=C1,C3", f"--dlcheck-json={out}")
    run.assert_outcome("C1", "passed")
    run.assert_outcome("C3", "passed")
    assert "the resumed steps draw the uninterrupted run's random numbers" in _results(out)["C3"]["evidence"][0]


def test_a_module_without_loaders_and_no_datamodule_still_names_what_to_add(project):
    """The module trains on nothing Lightning could fit (no train_dataloader(), no datamodule): the training
    checks skip naming the datamodule, or the module's own train_dataloader()."""
    project.conftest(
        """
    import pytest, torch, tiny_lightning as tl

    @pytest.fixture(scope="session")
    def dlcheck_lightning_module():
        torch.manual_seed(0)
        return tl.Classifier()
"""
    )
    run = project.run("--dlcheck=C1,S1", "-rA")
    run.assert_outcome("C1", "skipped")
    run.assert_outcome("S1", "skipped")
    assert "no datamodule: define fixture dlcheck_datamodule (or a train_dataloader() in your LightningModule)" in (
        run.text
    ), run.text


REPLAY = """
    import pytest, torch, tiny_lightning as tl

    @pytest.fixture(scope="session")
    def dlcheck_lightning_module():
        torch.manual_seed(0)
        return tl.ReplayClassifier({module})
"""


def test_a_replay_buffer_outside_the_checkpoint_fails_c1_naming_it(project, tmp_path):
    """reinforce_learn_Qnet.py's data path: training_step fills the replay buffer train_dataloader() reads, and the
    .ckpt holds the module's state_dict only. The resumed fit trains on a new module's buffer; putting the module's
    own attributes back from the uninterrupted run makes it identical, and C1 names them."""
    project.conftest(REPLAY.format(module=""))
    out = tmp_path / "r.json"
    run = project.run("--dlcheck=C1", f"--dlcheck-json={out}")
    run.assert_outcome("C1", "failed")
    text = tt.section(run, "C1")
    assert "putting back module attributes from the uninterrupted run after the load makes the resumed run" in text
    c1 = _results(out)["C1"]
    assert c1["cause"].startswith(
        "the checkpoint does not restore the LightningModule's own attributes self.buffer, self.filled, which "
        "training changed"
    ), c1["cause"]
    assert "on_save_checkpoint" in c1["fix"] and "on_load_checkpoint" in c1["fix"] and "self.buffer" in c1["fix"]


def test_the_twin_that_saves_its_replay_buffer_resumes_exactly(project):
    project.conftest(REPLAY.format(module="keep=True"))
    run = project.run("--dlcheck=C1", "-rA")
    run.assert_outcome("C1", "passed")
    run.fnmatch(["*resumed on fresh objects: the losses, learning rates, weights of steps 3-4 equal*bitwise"])


def test_a_setup_that_reads_the_trainer_gets_one_and_an_image_module_gets_no_tokenizer_request(project):
    # Lightning's imagenet template: setup() reads self.trainer; the loaders were derived from a bare copy and every
    # check that read them failed blaming dlcheck_dataloader. With a Lightning Trainer handed over and image batches,
    # the llm checks are not applicable (they asked for a tokenizer: a Lightning Trainer holds none)
    project.conftest(
        tl.own_loaders_project(cls="SetupReadsTrainer")
        + """
    import lightning.pytorch as pl

    @pytest.fixture(scope="session")
    def dlcheck_trainer():
        return pl.Trainer(accelerator="cpu", max_epochs=1, logger=False, enable_checkpointing=False)
"""
    )
    run = project.run("--dlcheck=T3,T7,L2,L11", "-rA")
    assert "not attached to a `Trainer`" not in run.text and "internal error" not in run.text, run.text
    run.assert_outcome("T3", "passed")
    run.assert_outcome("T7", "skipped")  # read from the derived loader: unshuffled, one epoch
    assert "dlcheck_lightning_module's train_dataloader() does not shuffle" in run.text, run.text
    for cid in ("L2", "L11"):
        run.assert_outcome(cid, "skipped")
    assert "define fixture dlcheck_tokenizer" not in run.text, run.text


GIVEN_LOADERS = """
    import pytest, torch, tiny_lightning as tl, tiny_train as tt
    from torch.utils.data import DataLoader

    # Lightning's examples/pytorch/basics: trainer.fit(model, train_dataloader, val_dataloader), no datamodule and
    # no loader of the module's own: the user hands the loaders over
    @pytest.fixture(scope="session")
    def dlcheck_lightning_module():
        torch.manual_seed(0)
        return tl.Classifier()

    @pytest.fixture(scope="session")
    def dlcheck_dataloader():
        return DataLoader(tt.blobs(64), batch_size=8, shuffle=True, generator=torch.Generator().manual_seed(7))

    @pytest.fixture(scope="session")
    def dlcheck_eval_dataloader():
        return DataLoader(tt.blobs(32, seed=1), batch_size=8)

    def pytest_sessionfinish(session):
        # the user's loader's generator is where the fixture left it: no run of a check advanced it
        loader = session.config._dlcheck_loader
        fresh = torch.Generator().manual_seed(7).get_state()
        session.config._dlcheck_untouched = bool(torch.equal(loader.generator.get_state(), fresh))
        print("UNTOUCHED", session.config._dlcheck_untouched)

    @pytest.fixture(scope="session", autouse=True)
    def _keep(request, dlcheck_dataloader):
        request.config._dlcheck_loader = dlcheck_dataloader
"""


def test_loaders_handed_over_without_a_datamodule_are_the_data_of_every_run(project, tmp_path):
    """Blind set 10 (Lightning's basics examples): nine checks had skipped with "no datamodule" although
    dlcheck_dataloader was given. Every run now fits on the user's loaders, as fit(module, loaders) does, and puts
    back what the fits advanced in them."""
    project.conftest(GIVEN_LOADERS)
    run = project.run("--dlcheck=C1,S1,T6,T7", "-rA", "-s")
    assert "no datamodule" not in run.text, run.text
    for cid in ("S1", "T6", "T7"):
        run.assert_outcome(cid, "passed")
    assert "dlcheck_dataloader: its RandomSampler gives epoch 1 an order other than epoch 0's" in run.text
    # C1 judges the resume on those loaders: a generator seeded when the loader is built gives a resumed process the
    # first epoch's order again (Lightning restarts the epoch's loader), which C1 sees
    run.assert_outcome("C1", "failed")
    assert "the resumed run's batches are the ones already trained before the save" in " ".join(run.text.split())
    assert "UNTOUCHED True" in run.text
