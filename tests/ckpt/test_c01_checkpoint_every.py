"""C1 at the user's checkpoint cadence (dlcheck_checkpoint_every): a plain loop that saves only at epoch ends and
resumes at the next epoch is saved there, not in the middle of an epoch (mae's main_pretrain.py, the DDP tutorial's
save_every epochs: a mid-epoch save made C1 report a data position the user's run never loses). The same loop
resuming the saved epoch again (start_epoch = checkpoint['epoch'] instead of + 1) fails; a loop saving every N
optimizer steps is saved after a multiple of N; an epoch out of reach is said not judged at the cadence."""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "train"))
import tiny_train as tt  # noqa: E402

#: 12 examples, 2 a batch: an epoch of 6 micro-steps; C1.steps = 4, so the epoch-end save is after step 6 and the
#: resumed run trains steps 7-8. The loop's own counters (epoch, it) set the LR per epoch; a DistributedSampler of
#: one replica reshuffles by set_epoch, at the top of the epoch loop and after a resume at the epoch it resumes at
EPOCH_LOOP = """
    import pytest, torch
    from torch import nn
    from torch.utils.data import DataLoader, DistributedSampler, TensorDataset

    torch.set_num_threads(1)
    DATA = TensorDataset(torch.randn(12, 4, generator=torch.Generator().manual_seed(0)), torch.arange(12) % 2)

    def loader():
        return DataLoader(DATA, batch_size=2, sampler=DistributedSampler(DATA, num_replicas=1, rank=0, seed=0))

    def make():
        model = nn.Linear(4, 2)
        dl = loader()
        return {{"model": model, "optimizer": torch.optim.SGD(model.parameters(), lr=0.1), "dataloader": dl,
                "epoch": 0, "it": 0, "len": len(dl)}}

    def step(state, batch):
        if state["it"] == state["len"]:  # the next epoch of the loop
            state["epoch"] += 1
            state["it"] = 0
        for group in state["optimizer"].param_groups:
            group["lr"] = 0.1 * 0.5 ** state["epoch"]
        x, y = batch
        loss = nn.functional.cross_entropy(state["model"](x), y)
        loss.backward()
        state["optimizer"].step()
        state["optimizer"].zero_grad()
        state["it"] += 1
        return loss

    def save(state, path):  # at the end of an epoch: the epoch just finished
        torch.save({{"model": state["model"].state_dict(), "optimizer": state["optimizer"].state_dict(),
                    "epoch": state["epoch"]}}, path)

    def load(state, path):
        ckpt = torch.load(path)
        state["model"].load_state_dict(ckpt["model"])
        state["optimizer"].load_state_dict(ckpt["optimizer"])
        state["epoch"] = ckpt["epoch"]{plus}  # for epoch in range(start_epoch, epochs)
        state["it"] = 0

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
    def dlcheck_start_epoch():  # the top of the epoch loop
        return lambda state, dataloader, epoch: dataloader.sampler.set_epoch(epoch)

    @pytest.fixture(scope="session")
    def dlcheck_resume_dataloader():  # after the load, the loop starts the epoch its counter names
        def resume(state, dataloader, resumed_step):
            dataloader.sampler.set_epoch(state["epoch"])
            return dataloader
        return resume

    @pytest.fixture(scope="session")
    def dlcheck_checkpoint_every():
        return {every!r}
"""


def test_epoch_end_saver_resuming_at_the_next_epoch_passes(project):
    project.conftest(EPOCH_LOOP.format(plus=" + 1", every="epoch"))
    run = project.run("--dlcheck=C1,C3", "-rA")
    run.assert_outcome("C1", "passed")
    text = run.text
    assert (
        "saved after step 6 (at an epoch's end, where your loop checkpoints: dlcheck_checkpoint_every = 'epoch')"
        in text
    ), text
    assert "of steps 7-8 equal the uninterrupted run's, bitwise" in text, text
    assert (
        "saves after step 6 (the end of epoch 1, where your loop checkpoints: dlcheck_checkpoint_every = 'epoch')"
        in text
    ), text
    assert "draw steps 7-8 from what your dlcheck_resume_dataloader makes of their state['dataloader']" in text, text
    assert "the uninterrupted run's batches, step by step (over steps 1-8: 16 examples, none trained twice" in text


def test_epoch_end_saver_resuming_the_saved_epoch_again_fails(project):
    # the DDP tutorial's off-by-one: the checkpoint names the finished epoch and the resume starts it again
    project.conftest(EPOCH_LOOP.format(plus="", every="epoch"))
    run = project.run("--dlcheck=C1")
    run.assert_outcome("C1", "failed")
    text = tt.section(run, "C1")
    assert "saves after step 6 (the end of epoch 1, where your loop checkpoints" in text, text
    assert "step 7 = step 1's batch, step 8 = step 2's batch" in text, text
    assert "the resume does not start the epoch after the saved one" in text, text
    assert "the saved epoch again, in its order" in text, text
    assert "checkpoint['epoch'] + 1" in text, text


def test_the_same_loop_without_the_role_is_saved_mid_epoch_and_the_failure_names_the_role(project):
    # no dlcheck_checkpoint_every: saved half way through the epoch, as before, and the failure says how to say
    # that the loop checkpoints at epoch ends only
    source = EPOCH_LOOP.format(plus=" + 1", every="epoch").split(
        '    @pytest.fixture(scope="session")\n    def dlcheck_checkpoint_every'
    )[0]
    project.conftest(source)
    run = project.run("--dlcheck=C1")
    run.assert_outcome("C1", "failed")
    text = tt.section(run, "C1")
    assert "dlcheck_checkpoint_every" not in source
    assert "and saves after step 2 through" in text, text
    assert "if your loop checkpoints only at epoch ends, say so with dlcheck_checkpoint_every = 'epoch'" in text, text


def test_epoch_longer_than_the_bound_is_not_judged_at_the_cadence(project):
    # an epoch of 100 micro-steps: its end lies past max(2 x C1.steps, 64); no mid-epoch judgement instead
    source = EPOCH_LOOP.format(plus=" + 1", every="epoch").replace("torch.randn(12, 4", "torch.randn(200, 4")
    project.conftest(source.replace("torch.arange(12)", "torch.arange(200)"))
    run = project.run("--dlcheck=C1", "-rA")
    run.assert_outcome("C1", "skipped")
    assert "the resume is not judged at your checkpoint cadence (dlcheck_checkpoint_every = 'epoch')" in run.text
    assert "an epoch of your training loader is 100 micro-steps" in run.text, run.text


#: a loop saving every 3 optimizer steps; its load restores the step and skips the epoch's trained batches of the
#: same shuffle (a generator seeded in the factory)
EVERY_N = """
    import itertools
    import pytest, torch
    from torch import nn
    from torch.utils.data import DataLoader, TensorDataset

    torch.set_num_threads(1)
    DATA = TensorDataset(torch.randn(12, 4, generator=torch.Generator().manual_seed(0)), torch.arange(12) % 2)

    def loader():
        return DataLoader(DATA, batch_size=2, shuffle=True, generator=torch.Generator().manual_seed(1))

    def make():
        model = nn.Linear(4, 2)
        opt = torch.optim.SGD(model.parameters(), lr=0.1)
        sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: 1 / (1 + s))
        return {"model": model, "optimizer": opt, "lr_scheduler": sched, "dataloader": loader(), "step": 0}

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
        torch.save({"model": state["model"].state_dict(), "optimizer": state["optimizer"].state_dict(),
                    "lr_scheduler": state["lr_scheduler"].state_dict(), "step": state["step"]}, path)

    def load(state, path):
        ckpt = torch.load(path)
        state["model"].load_state_dict(ckpt["model"])
        state["optimizer"].load_state_dict(ckpt["optimizer"])
        state["lr_scheduler"].load_state_dict(ckpt["lr_scheduler"])
        state["step"] = ckpt["step"]
        state["dataloader"] = itertools.islice(state["dataloader"], ckpt["step"] % 6, None)

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
        return 3
"""


def test_every_n_saver_whose_load_restores_the_step_passes(project):
    project.conftest(EVERY_N)
    run = project.run("--dlcheck=C1", "-rA")
    run.assert_outcome("C1", "passed")
    text = run.text
    assert (
        "saved after step 3 (after an optimizer step that is a multiple of 3, where your loop checkpoints: "
        "dlcheck_checkpoint_every = 3)" in text
    ), text
    assert "of steps 4-5 equal the uninterrupted run's, bitwise" in text, text
    assert "saves after step 3 (optimizer step 3, where your loop checkpoints" in text, text
    assert "none trained twice, none lost" in text, text
