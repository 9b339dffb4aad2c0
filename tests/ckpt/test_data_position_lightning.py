"""C1 for a Lightning user: the data position across a mid-epoch checkpoint and fit(ckpt_path=...) (issue 31 item 2).

When the user's Trainer writes checkpoints in the middle of an epoch (ModelCheckpoint(every_n_train_steps=...),
saves at every validation with val_check_interval < 1, a SLURM requeue), fresh copies fit one epoch of C1.steps
batches of the datamodule's train_dataloader(), trainer.save_checkpoint after batch 2, and other fresh copies resume
from it with Lightning's own fit(ckpt_path=...). A plain DataLoader is not resumable: Lightning iterates it anew
while its batch counter goes on, so the resumed epoch trains its first batches again and never reaches its last
ones. A torchdata StatefulDataLoader is: Lightning saves its state_dict() in the .ckpt and loads it on resume. A
Trainer that checkpoints at epoch ends only is not concerned, and where the checkpointing is not visible the data
position is said not judged."""

import re
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "train"))
import tiny_lightning as tl  # noqa: E402
import tiny_train as tt  # noqa: E402

#: the user's Trainer, whose checkpoint callbacks say when their runs checkpoint
TRAINER = """
    @pytest.fixture(scope="session")
    def dlcheck_trainer():
        import lightning.pytorch as pl
        from lightning.pytorch.callbacks import ModelCheckpoint
        return pl.Trainer(logger=False, {settings})
"""
EVERY_100 = TRAINER.format(settings="callbacks=[ModelCheckpoint(every_n_train_steps=100)]")

COUNTS = re.compile(r"(\d+) examples trained twice, (\d+) never seen in (the resumed epoch|batches 3-4)")


@pytest.mark.parametrize(
    "data, span, where",
    [
        # 64 examples, 8 a batch: C1's 4 batches are half the epoch
        ("shuffle=True", "batches 1-4 (4 of the epoch's 8 batches)", "batches 3-4"),
        ("shuffle=False", "batches 1-4 (4 of the epoch's 8 batches)", "batches 3-4"),
        # 16 a batch: the whole epoch
        ("shuffle=True, batch_size=16", "batches 1-4 (the whole first epoch)", "the resumed epoch"),
    ],
)
def test_a_plain_dataloader_restarts_its_epoch_after_a_mid_epoch_checkpoint(project, data, span, where):
    project.conftest(tl.project(data=data) + EVERY_100)
    run = project.run("--dlcheck=C1")
    run.assert_outcome("C1", "failed")
    text = " ".join(tt.section(run, "C1").split())
    assert (
        f"the uninterrupted fit trains {span} of your datamodule's train_dataloader() (DataLoader) and saves a "
        "mid-epoch checkpoint after batch 2 (trainer.save_checkpoint" in text
    ), text
    assert "fit(ckpt_path=...) on fresh copies trains batches 3-4 from it" in text, text
    # batches 3-4 of the resumed fit are the epoch's batches 1-2 again: their examples twice, those of 3-4 never
    per_batch = 16 if "16" in data else 8
    found = COUNTS.search(text)
    assert found and found.group(3) == where, text
    assert (int(found.group(1)), int(found.group(2))) == (2 * per_batch, 2 * per_batch), text
    assert "batch 3 = batch 1's examples, batch 4 = batch 2's examples" in text, text
    assert "the .ckpt holds no dataloader state" in text and "DataLoader defines no state_dict()" in text, text
    assert "your Trainer writes checkpoints in the middle of an epoch: ModelCheckpoint(every_n_train_steps=100)" in text
    assert (
        "Lightning restarts a non-resumable loader's epoch from its first batch after a mid-epoch checkpoint (yours: "
        "ModelCheckpoint(every_n_train_steps=100))" in text
    ), text
    assert "torchdata.stateful_dataloader.StatefulDataLoader" in text and "checkpoint only at epoch ends" in text


def test_a_stateful_dataloader_continues_the_epoch(project):
    """The twin: torchdata's StatefulDataLoader, whose state_dict() Lightning saves in the mid-epoch .ckpt and
    loads on fit(ckpt_path=...): the resumed fit trains the epoch's batches 3-4. (Shuffling, it fails C1's resume
    at the epoch boundary instead, a true finding of Lightning 2.6 with torchdata 0.11: resumed from an epoch-end
    .ckpt, the next epoch replays the first epoch's order.)"""
    project.conftest(tl.project(data="stateful=True") + EVERY_100)
    run = project.run("--dlcheck=C1", "-rA")
    run.assert_outcome("C1", "passed")
    run.fnmatch(
        [
            "data position: the uninterrupted fit trains batches 1-4 (4 of the epoch's 8 batches) of your "
            "datamodule's train_dataloader() (StatefulDataLoader) and saves a mid-epoch checkpoint after batch 2 "
            "(trainer.save_checkpoint, as ModelCheckpoint(every_n_train_steps=...) or a SLURM requeue does); "
            "fit(ckpt_path=...) on fresh copies trains batches 3-4 from it: the uninterrupted fit's batches, batch by "
            "batch (over batches 1-4: 32 examples, none trained twice, none lost)",
        ]
    )
    assert "not judged" not in run.text


LISTS = (
    """
    import pytest, torch, tiny_lightning as tl
    from torch.nn import functional as F
    from torch.utils.data import DataLoader

    class FromLists(tl.Classifier):
        # the batch arrives as python lists (a collate that leaves tensors to the step)
        def training_step(self, batch, batch_idx):
            x, y = torch.as_tensor(batch[0]), torch.as_tensor(batch[1])
            return F.cross_entropy(self(x), y)

    def lists(rows):
        return [r[0].tolist() for r in rows], [int(r[1]) for r in rows]

    def tensors(rows):
        return torch.stack([r[0] for r in rows]), torch.tensor([int(r[1]) for r in rows])

    class Data(tl.Blobs):
        def train_dataloader(self):
            return DataLoader(self.train_set, batch_size=8, shuffle=True, collate_fn={collate})

    @pytest.fixture(scope="session")
    def dlcheck_lightning_module():
        torch.manual_seed(0)
        return FromLists()

    @pytest.fixture(scope="session")
    def dlcheck_datamodule():
        return Data()
"""
    + EVERY_100
)


def test_batches_of_python_lists_are_not_judged_and_said_so(project):
    """No tensor with a batch dimension: the examples cannot be told apart, the data position is not judged and
    the pass says so (partly judged), never a failure, never a silent pass."""
    project.conftest(LISTS.format(collate="lists"))
    run = project.run("--dlcheck=C1", "-rA", "-v")
    run.assert_outcome("C1", "passed")
    run.fnmatch(
        [
            "*PASSED (*partly judged: data position not judged)*",
            "data position: not judged, your train_dataloader() (DataLoader): a batch holds no tensor with a batch "
            "dimension to tell its examples apart",
        ]
    )


def test_the_same_module_on_tensor_batches_fails(project):
    """The twin of the unjudged pipeline: the same module and plain shuffling DataLoader, the collate stacking
    tensors (the step's torch.as_tensor takes them as they are): the replayed batches are counted and C1 fails."""
    project.conftest(LISTS.format(collate="tensors"))
    run = project.run("--dlcheck=C1")
    run.assert_outcome("C1", "failed")
    text = " ".join(tt.section(run, "C1").split())
    assert "over batches 1-4: 16 examples trained twice, 16 never seen in batches 3-4" in text, text
    assert "Lightning restarts a non-resumable loader's epoch from its first batch" in text


@pytest.mark.parametrize(
    "given, saves",
    [
        # Lightning's default ModelCheckpoint saves at validation ends: twice an epoch here
        (
            TRAINER.format(settings="val_check_interval=0.5"),
            "ModelCheckpoint at every validation (val_check_interval=0.5)",
        ),
        (
            """
    @pytest.fixture(scope="session")
    def dlcheck_lightning_callbacks():
        from lightning.pytorch.callbacks import ModelCheckpoint
        return [ModelCheckpoint(every_n_train_steps=2)]
""",
            "ModelCheckpoint(every_n_train_steps=2)",
        ),
    ],
)
def test_other_mid_epoch_checkpoints_are_found(project, given, saves):
    project.conftest(tl.project(data="shuffle=True") + given)
    run = project.run("--dlcheck=C1")
    run.assert_outcome("C1", "failed")
    text = " ".join(tt.section(run, "C1").split())
    assert f"your Trainer writes checkpoints in the middle of an epoch: {saves}" in text, text
    assert "over batches 1-4: 16 examples trained twice, 16 never seen in batches 3-4" in text, text


def test_checkpoints_at_epoch_ends_only_leave_a_plain_dataloader_alone(project):
    """The other fix: Lightning's default ModelCheckpoint, no validation inside the epoch: every resume starts at an
    epoch end, where Lightning starts the loader's epoch anew; no extra fit is run."""
    project.conftest(tl.project(data="shuffle=True") + TRAINER.format(settings="callbacks=[ModelCheckpoint()]"))
    run = project.run("--dlcheck=C1", "-rA")
    run.assert_outcome("C1", "passed")
    run.fnmatch(
        [
            "data position: your Trainer writes no checkpoint in the middle of an epoch (ModelCheckpoint("
            "every_n_epochs=1)): at an epoch end Lightning starts every loader's epoch anew*",
        ]
    )


def test_without_the_trainer_the_data_position_is_not_judged(project):
    project.conftest(tl.project(data="shuffle=True"))
    run = project.run("--dlcheck=C1", "-rA")
    run.assert_outcome("C1", "passed")
    run.fnmatch(["data position: not judged: how your runs checkpoint is not visible (hand over your Lightning*"])


STREAM = (
    """
    import pytest, torch, tiny_lightning as tl, tiny_train as tt
    from torch.utils.data import DataLoader, IterableDataset
    from torchdata.stateful_dataloader import StatefulDataLoader

    class Stream(IterableDataset):  # no __len__: Lightning cannot tell where the epoch ends
        def __iter__(self):
            data = tt.blobs(64, seed=0)
            for i in range(64):
                yield data[i]

    class Data(tl.Blobs):
        def train_dataloader(self):
            return {loader}(Stream(), batch_size=8)

    @pytest.fixture(scope="session")
    def dlcheck_lightning_module():
        torch.manual_seed(0)
        return tl.Classifier()

    @pytest.fixture(scope="session")
    def dlcheck_datamodule():
        return Data()
"""
    + EVERY_100
)


@pytest.mark.parametrize("loader, outcome", [("DataLoader", "failed"), ("StatefulDataLoader", "passed")])
def test_an_iterable_dataset_without_a_length_is_judged_on_the_batches_it_yields(project, loader, outcome):
    """A stream without a length: Lightning starts it again after the mid-epoch checkpoint (the same first batches
    again), unless the StatefulDataLoader fast-forwards it; "never seen" then means not trained in batches 3-4."""
    project.conftest(STREAM.format(loader=loader))
    run = project.run("--dlcheck=C1", "-rA")
    run.assert_outcome("C1", outcome)
    text = " ".join((tt.section(run, "C1") if outcome == "failed" else run.text).split())
    assert "the uninterrupted fit trains batches 1-4 (of an epoch whose length the loader does not tell)" in text, text
    if outcome == "failed":
        assert "over batches 1-4: 16 examples trained twice, 16 never seen in batches 3-4" in text, text
    else:
        assert "none trained twice, none lost" in text, text
