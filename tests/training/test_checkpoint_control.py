"""C2 judges an interrupted save only when the user's load works on an uninterrupted checkpoint. The
torchvision classification reference saves ``args`` (an argparse.Namespace) in its checkpoint and resumes
with ``torch.load(..., weights_only=True)``: under torch >= 2.6 that load fails whether or not a save was
interrupted — the resume is broken (C1's finding), not the save's atomicity."""

import pytest

PROJECT = """
    import argparse, pytest, torch
    from torch import nn
    from torch.nn import functional as F
    from torch.utils.data import DataLoader, TensorDataset

    ARGS = argparse.Namespace(lr=0.1, epochs=2)

    def data():
        g = torch.Generator().manual_seed(0)
        y = torch.randint(0, 3, (64,), generator=g)
        return TensorDataset(torch.randn(64, 4, generator=g) + y[:, None].float(), y)

    @pytest.fixture(scope="session")
    def dlcheck_make_training():
        def make():
            model = nn.Sequential(nn.Linear(4, 16), nn.ReLU(), nn.Linear(16, 3))
            return {{"model": model, "optimizer": torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)}}
        return make

    @pytest.fixture(scope="session")
    def dlcheck_dataloader():
        return DataLoader(data(), batch_size=8)

    @pytest.fixture(scope="session")
    def dlcheck_loss_fn():
        return nn.CrossEntropyLoss()

    @pytest.fixture(scope="session")
    def dlcheck_save_checkpoint():
        def save(state, path):
            torch.save({{"model": state["model"].state_dict(), "optimizer": state["optimizer"].state_dict(),
                         "args": ARGS}}, path)
        return save

    @pytest.fixture(scope="session")
    def dlcheck_load_checkpoint():
        def load(state, path):
            ckpt = torch.load(path, map_location="cpu", weights_only={weights_only})
            state["model"].load_state_dict(ckpt["model"])
            state["optimizer"].load_state_dict(ckpt["optimizer"])
        return load
"""


def test_a_load_that_fails_without_interruption_is_not_blamed_on_the_save(project):
    """The load fails on any checkpoint (weights_only refusing what the save pickles: C1's finding). The save goes
    straight onto the previous checkpoint's path, which the interrupted save cut: judged on the file's bytes, saying
    the load was not made and why (369a2e7); the load's own failure is not what C2 reports."""
    project.conftest(PROJECT.format(weights_only=True))
    run = project.run("--dlcheck=C2", "-rs")
    run.assert_outcome("C2", "failed")
    text = " ".join(run.text.split())
    assert (
        "(not loaded: dlcheck_load_checkpoint fails on the checkpoint dlcheck_save_checkpoint has just written" in text
    )
    assert "UnpicklingError" in text and "(C1 reports the failing resume)" in text
    assert "the file of the previous checkpoint now holds the first half of the new save's bytes" in text


def test_the_same_save_with_a_load_that_works_is_judged(project):
    project.conftest(PROJECT.format(weights_only=False))
    run = project.run("--dlcheck=C2")
    run.assert_outcome("C2", "failed")  # torch.save straight onto the previous checkpoint


VERSIONED = """
    import os, pytest, torch
    from torch import nn
    from torch.utils.data import DataLoader, TensorDataset

    @pytest.fixture(scope="session")
    def dlcheck_make_training():
        def make():
            model = nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 3))
            return {"model": model, "optimizer": torch.optim.SGD(model.parameters(), lr=0.1), "step": [0]}
        return make

    @pytest.fixture(scope="session")
    def dlcheck_dataloader():
        g = torch.Generator().manual_seed(0)
        return DataLoader(TensorDataset(torch.randn(32, 4, generator=g), torch.randint(0, 3, (32,), generator=g)),
                          batch_size=8)

    @pytest.fixture(scope="session")
    def dlcheck_loss_fn():
        return nn.CrossEntropyLoss()

    @pytest.fixture(scope="session")
    def dlcheck_save_checkpoint():
        def save(state, path):
            # a new file per save, as save_state's checkpoint-N directories
            os.makedirs(path, exist_ok=True)
            n = len(os.listdir(path))
            torch.save({"model": state["model"].state_dict()}, os.path.join(path, f"ckpt-{n:04d}.pt"))
        return save

    @pytest.fixture(scope="session")
    def dlcheck_load_checkpoint():
        def load(state, path):
            newest = sorted(os.listdir(path))[-1]  # "resume from the latest"
            state["model"].load_state_dict(torch.load(os.path.join(path, newest))["model"])
        return load
"""


def test_versioned_saves_whose_resume_picks_the_newest_half_written_one(project):
    # the previous checkpoint is intact beside the half-written one, but the load takes the newest: a resume
    # 'latest' (an automatic restart after preemption) loads the half-written one and fails until it is deleted
    project.conftest(VERSIONED)
    run = project.run("--dlcheck=C2")
    run.assert_outcome("C2", "failed")
    text = " ".join(run.section("C2").split())
    assert "the interrupted file is new (the previous checkpoint was not touched)" in text, text
    assert "your dlcheck_load_checkpoint restores the previous weights: the previous checkpoint is intact" in text
    assert "the load picks the newest" in text and "writes straight onto" not in text, text


EPOCH_NAMED = """
    import os, pytest, torch
    from torch import nn
    from torch.utils.data import DataLoader, TensorDataset

    @pytest.fixture(scope="session")
    def dlcheck_make_training():
        def make():
            model = nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 3))
            return {{"model": model, "optimizer": torch.optim.SGD(model.parameters(), lr=0.1), "epoch": 0}}
        return make

    @pytest.fixture(scope="session")
    def dlcheck_dataloader():
        g = torch.Generator().manual_seed(0)
        return DataLoader(TensorDataset(torch.randn(32, 4, generator=g), torch.randint(0, 3, (32,), generator=g)),
                          batch_size=8)

    @pytest.fixture(scope="session")
    def dlcheck_loss_fn():
        return nn.CrossEntropyLoss()

    @pytest.fixture(scope="session")
    def dlcheck_save_checkpoint():
        def save(state, path):  # once per epoch, at the epoch's end (the epoch loop advances state["epoch"])
            target = os.path.join(path, {name!r}.format(epoch=state["epoch"]))
            os.makedirs(os.path.dirname(target), exist_ok=True)
            torch.save(state["model"].state_dict(), target)
        return save

    @pytest.fixture(scope="session")
    def dlcheck_load_checkpoint():
{load}
        return load
"""


NEWEST = """
        def load(state, path):  # --resume with the newest file (or the newest directory's file)
            newest = os.path.join(path, sorted(os.listdir(path))[-1])
            if os.path.isdir(newest):
                newest = os.path.join(newest, "net.pth")
            state["model"].load_state_dict(torch.load(newest))"""

NEWEST_COMPLETE = """
        def load(state, path):  # by hand: the newest checkpoint that loads
            for name in sorted(os.listdir(path), reverse=True):
                try:
                    weights = torch.load(os.path.join(path, name))
                except Exception:
                    continue
                state["model"].load_state_dict(weights)
                return"""


@pytest.mark.parametrize("name", ["net_epoch_{epoch}.pth", "ep{epoch}/net.pth"])
def test_a_save_named_after_the_epoch_is_saved_again_at_the_next_epoch(project, name):
    # dcgan's netG_epoch_%d.pth: one file per epoch, never overwritten; the second save comes an epoch later, so
    # the interrupted file is a new one (not the previous checkpoint truncated). The load here takes the newest
    # (resume 'latest'): that is what fails; a directory per epoch is put aside whole to show the previous intact
    project.conftest(EPOCH_NAMED.format(name=name, load=NEWEST))
    run = project.run("--dlcheck=C2")
    run.assert_outcome("C2", "failed")
    text = " ".join(run.section("C2").split())
    first = "checkpoint/" + name.format(epoch=0)
    assert f"epoch 0 -> 1 (your save names its files after them: {first} -> " in text, text
    assert "the interrupted file is new" in text and "the previous checkpoint is intact" in text, text
    assert "writes straight onto" not in text, text


def test_a_resume_from_the_newest_complete_checkpoint_passes(project):
    # a person resuming by hand picks the newest checkpoint that loads: written so, the load passes C2
    project.conftest(EPOCH_NAMED.format(name="net_epoch_{epoch}.pth", load=NEWEST_COMPLETE))
    run = project.run("--dlcheck=C2", "-rA")
    run.assert_outcome("C2", "passed")
    assert "the previous checkpoint" in run.text and "still loads afterwards" in run.text, run.text


def test_the_same_loop_saving_under_one_name_every_epoch_still_fails(project):
    project.conftest(EPOCH_NAMED.format(name="net_last.pth", load=NEWEST))
    run = project.run("--dlcheck=C2")
    run.assert_outcome("C2", "failed")
    text = " ".join(run.section("C2").split())
    assert "writes straight onto the previous checkpoint's path" in text and "epoch 0 -> 1" not in text, text


TRAINER_UNLOADABLE = """
    import argparse, pytest, tiny, torch
    from transformers import DataCollatorForSeq2Seq, Trainer

    @pytest.fixture(scope="session")
    def dlcheck_trainer(tmp_path_factory):
        tok = tiny.tokenizer()
        model = tiny.llama(tok)
        opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
        # run settings kept in the optimizer's param group: optimizer.pt saves them, and the Trainer's
        # resume loads it with torch.load(weights_only=True), which refuses an argparse.Namespace
        opt.param_groups[0]["run"] = argparse.Namespace(name="exp1")
        args = tiny.trainer_args(tmp_path_factory.mktemp("o"))
        rows = [dict(r, labels=r["input_ids"]) for r in tiny.tokenized(tok)]
        collate = DataCollatorForSeq2Seq(tok, padding=True)
        return Trainer(model=model, args=args, train_dataset=rows, data_collator=collate, optimizers=(opt, None))
"""


def test_a_trainer_resume_that_fails_without_interruption_is_not_blamed_on_the_save(project):
    project.conftest(TRAINER_UNLOADABLE)
    run = project.run("--dlcheck=C2", "-rs")
    run.assert_outcome("C2", "skipped")
    run.fnmatch(["*cannot judge an interrupted save: resuming from checkpoint-1 fails with no interruption at all*"])


ACCUMULATED = """
    import os, pytest, torch
    from torch import nn
    from torch.utils.data import DataLoader, TensorDataset

    def optimizer_steps(opt):  # as run_clm_no_trainer's completed_steps: one per synced optimizer step
        return int(next(iter(opt.state.values()))["step"]) if opt.state else 0

    @pytest.fixture(scope="session")
    def dlcheck_make_training():
        def make():
            model = nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 3))
            return {"model": model, "optimizer": torch.optim.Adam(model.parameters(), lr=1e-2)}
        return make

    @pytest.fixture(scope="session")
    def dlcheck_dataloader():
        g = torch.Generator().manual_seed(0)
        return DataLoader(TensorDataset(torch.randn(32, 4, generator=g), torch.randint(0, 3, (32,), generator=g)),
                          batch_size=4)

    @pytest.fixture(scope="session")
    def dlcheck_train_step():
        def step(state, batch, i):  # gradient accumulation over 2 micro-batches
            x, y = batch
            loss = nn.functional.cross_entropy(state["model"](x), y) / 2
            loss.backward()
            if (i + 1) % 2 == 0:
                state["optimizer"].step()
                state["optimizer"].zero_grad()
            return loss.detach()
        return step

    @pytest.fixture(scope="session")
    def dlcheck_save_checkpoint():
        def save(state, path):  # accelerator.save_state(f"step_{completed_steps}"), after an optimizer step
            target = os.path.join(path, f"step_{optimizer_steps(state['optimizer'])}")
            os.makedirs(target, exist_ok=True)
            torch.save({"model": state["model"].state_dict(), "optimizer": state["optimizer"].state_dict()},
                       os.path.join(target, "state.pt"))
        return save

    @pytest.fixture(scope="session")
    def dlcheck_load_checkpoint():
        def load(state, path):
            newest = max(os.listdir(path), key=lambda d: int(d.split("_")[1]))
            ckpt = torch.load(os.path.join(path, newest, "state.pt"))
            state["model"].load_state_dict(ckpt["model"])
            state["optimizer"].load_state_dict(ckpt["optimizer"])
        return load
"""


def test_under_gradient_accumulation_the_second_save_comes_after_an_optimizer_step(project):
    # the save is named after the optimizer steps taken: one micro-step of an accumulation leaves it at step_0, so
    # saving again there would overwrite the first save, which the script never does
    project.conftest(ACCUMULATED)
    run = project.run("--dlcheck=C2")
    run.assert_outcome("C2", "failed")  # the load takes the newest (a resume 'latest'): see the versioned test
    text = " ".join(run.section("C2").split())
    assert "interrupted half way while writing step_1/state.pt" in text, text
    assert "the interrupted file is new" in text and "writes straight onto" not in text, text
