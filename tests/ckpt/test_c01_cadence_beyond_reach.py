"""C1 at a checkpoint cadence beyond the steps dlcheck trains (dlcheck_checkpoint_every = 500: minGPT's callback,
diffusers' checkpointing_steps): what a resume loses (the optimizer's moments, the scheduler, the data position in
the epoch) does not depend on which mid-run step the save is at, so the resume is judged at a reachable optimizer
step, with the user's own save and load, and said to be judged there, not at the cadence. A weights-only checkpoint
and an epoch that starts again after the load fail; a full checkpoint whose load computes the position from its step
passes. With dlcheck_checkpoint_every = 'epoch', a training loader whose sampler has no length (a PK sampler) has
its epoch counted by iterating the sampler once (no data loaded)."""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "train"))
import tiny_train as tt  # noqa: E402

#: 12 examples, 2 a batch: an epoch of 6 micro-steps; the cadence (500 optimizer steps) lies past max(2 x 4, 64)
EVERY_500 = """
    import itertools
    import pytest, torch
    from torch import nn
    from torch.utils.data import DataLoader, TensorDataset

    torch.set_num_threads(1)
    DATA = TensorDataset(torch.randn(12, 4, generator=torch.Generator().manual_seed(0)), torch.arange(12) % 2)

    def loader():
        return DataLoader(DATA, batch_size=2, shuffle=True, generator=torch.Generator().manual_seed(1))

    def make():
        model = nn.Sequential(nn.Linear(4, 8), nn.Dropout(0.2), nn.Linear(8, 2))
        opt = torch.optim.AdamW(model.parameters(), lr=0.01)
        sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: 1 / (1 + s))
        return {{"model": model, "optimizer": opt, "lr_scheduler": sched, "dataloader": loader(), "step": 0}}

    def step(state, batch):
        x, y = batch
        loss = nn.functional.cross_entropy(state["model"](x), y)
        loss.backward()
        state["optimizer"].step()
        state["lr_scheduler"].step()
        state["optimizer"].zero_grad()
        state["step"] += 1
        return loss

    def save(state, path):
        {save}

    def load(state, path):
        ckpt = torch.load(path, weights_only=False)
        {load}

    @pytest.fixture(scope="session")
    def dlcheck_make_training():
        return make

    @pytest.fixture(scope="session")
    def dlcheck_dataloader():
        return loader()

    @pytest.fixture(scope="session")
    def dlcheck_train_step():
        return step

    @pytest.fixture(scope="session")
    def dlcheck_save_checkpoint():
        return save

    @pytest.fixture(scope="session")
    def dlcheck_load_checkpoint():
        return load

    @pytest.fixture(scope="session")
    def dlcheck_checkpoint_every():
        return 500
"""

FULL_SAVE = (
    'torch.save({"model": state["model"].state_dict(), "optimizer": state["optimizer"].state_dict(), '
    '"lr_scheduler": state["lr_scheduler"].state_dict(), "step": state["step"], "rng": torch.get_rng_state()}, path)'
)
FULL_LOAD = """state["model"].load_state_dict(ckpt["model"])
        state["optimizer"].load_state_dict(ckpt["optimizer"])
        state["lr_scheduler"].load_state_dict(ckpt["lr_scheduler"])
        state["step"] = ckpt["step"]
        torch.set_rng_state(ckpt["rng"])
        state["dataloader"] = itertools.islice(state["dataloader"], ckpt["step"] % 6, None)  # the epoch's rest"""

#: the epoch loop after the load: `for step, batch in enumerate(train_dataloader)`, from its first batch
RESTART = """
    @pytest.fixture(scope="session")
    def dlcheck_resume_dataloader():
        return lambda state, dataloader, resumed_step: dataloader
"""

JUDGED = "judged at optimizer step 2, not at your cadence (dlcheck_checkpoint_every = 500)"


def test_full_checkpoint_at_a_cadence_out_of_reach_is_judged_at_a_reachable_step_and_passes(project):
    project.conftest(EVERY_500.format(save=FULL_SAVE, load=FULL_LOAD))
    run = project.run("--dlcheck=C1,C3", "-rA")
    run.assert_outcome("C1", "passed")
    run.assert_outcome("C3", "passed")
    text = run.text
    assert "saved after step 2 (" + JUDGED in text, text
    assert "which lies past the 64 micro-steps" in text, text
    assert "none trained twice, none lost" in text, text


def test_weights_only_checkpoint_at_a_cadence_out_of_reach_fails(project):
    # minGPT's callback: torch.save(model.state_dict(), ...) every 500 iterations
    save = 'torch.save(state["model"].state_dict(), path)'
    project.conftest(EVERY_500.format(save=save, load='state["model"].load_state_dict(ckpt)'))
    run = project.run("--dlcheck=C1")
    run.assert_outcome("C1", "failed")
    text = tt.section(run, "C1")
    assert JUDGED in text, text
    assert "optimizer" in text, text


def test_epoch_started_again_after_a_resume_at_a_cadence_out_of_reach_fails(project):
    # the diffusers decoder script: load_state, then `for step, batch in enumerate(train_dataloader)` from the start
    load = FULL_LOAD.rsplit("\n", 1)[0]
    project.conftest(EVERY_500.format(save=FULL_SAVE, load=load) + RESTART)
    run = project.run("--dlcheck=C1", "-rA")
    run.assert_outcome("C1", "failed")
    text = tt.section(run, "C1")
    assert JUDGED in text, text
    assert "the resume does not restore the data position" in text, text
    assert "step 3 = step 1's batch" in text, text


def test_a_save_that_decides_by_the_step_counter_is_said_not_judged(project):
    # the save writes only at multiples of its own cadence: called at step 2 it writes nothing
    save = "if state['step'] % 500 == 0:\n            " + FULL_SAVE
    project.conftest(EVERY_500.format(save=save, load=FULL_LOAD))
    run = project.run("--dlcheck=C1", "-rA")
    run.assert_outcome("C1", "skipped")
    assert "wrote nothing" in run.text and "not at your cadence" in run.text, run.text


#: a sampler without __len__ (torchvision's references/similarity PKSampler): 12 examples, batches of 2, a fresh
#: permutation per epoch from the global RNG; the loop checkpoints at epoch ends with the weights only
UNSIZED = """
    import pytest, torch
    from torch import nn
    from torch.utils.data import DataLoader, Sampler, TensorDataset

    torch.set_num_threads(1)
    DATA = TensorDataset(torch.randn(12, 4, generator=torch.Generator().manual_seed(0)), torch.arange(12) % 2)

    class Unsized(Sampler):
        def __init__(self, n):
            self.n = n

        def __iter__(self):
            yield from torch.randperm(self.n).tolist()

    def loader():
        return DataLoader(DATA, batch_size=2, sampler=Unsized(12))

    def make():
        model = nn.Linear(4, 2)
        return {{"model": model, "optimizer": torch.optim.Adam(model.parameters(), lr=0.01)}}

    def step(state, batch, index):
        x, y = batch
        state["optimizer"].zero_grad()
        loss = nn.functional.cross_entropy(state["model"](x), y)
        loss.backward()
        state["optimizer"].step()
        return loss

    def save(state, path):
        {save}

    def load(state, path):
        {load}

    @pytest.fixture(scope="session")
    def dlcheck_make_training():
        return make

    @pytest.fixture(scope="session")
    def dlcheck_dataloader():
        return loader()

    @pytest.fixture(scope="session")
    def dlcheck_train_step():
        return step

    @pytest.fixture(scope="session")
    def dlcheck_save_checkpoint():
        return save

    @pytest.fixture(scope="session")
    def dlcheck_load_checkpoint():
        return load

    @pytest.fixture(scope="session")
    def dlcheck_checkpoint_every():
        return "epoch"
"""


def test_weights_only_resume_at_the_end_of_an_epoch_of_an_unsized_sampler_fails(project):
    save = 'torch.save(state["model"].state_dict(), path)'
    project.conftest(UNSIZED.format(save=save, load='state["model"].load_state_dict(torch.load(path))'))
    run = project.run("--dlcheck=C1")
    run.assert_outcome("C1", "failed")
    text = tt.section(run, "C1")
    assert "saved after step 6" in text, text
    assert "an epoch of 6 batches, counted by iterating its sampler once" in text, text


def test_full_resume_at_the_end_of_an_epoch_of_an_unsized_sampler_passes(project):
    save = 'torch.save({"model": state["model"].state_dict(), "optimizer": state["optimizer"].state_dict()}, path)'
    load = """ckpt = torch.load(path)
        state["model"].load_state_dict(ckpt["model"])
        state["optimizer"].load_state_dict(ckpt["optimizer"])"""
    project.conftest(UNSIZED.format(save=save, load=load))
    run = project.run("--dlcheck=C1", "-rA")
    run.assert_outcome("C1", "passed")
    assert "saved after step 6 (at an epoch's end" in run.text, run.text
    assert "counted by iterating its sampler once" in run.text, run.text
