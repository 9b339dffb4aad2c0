"""T7: a new order every epoch, distinct random streams per worker."""

import re

import pytest
import tiny_train as tt


def with_loader(loader: str) -> str:
    return tt.loop_project(loader=loader)


def test_sampler_reseeded_identically_every_epoch(project):
    project.conftest(
        with_loader("torch.utils.data.DataLoader(tt.blobs(), batch_size=8, sampler=tt.FixedSeedSampler(64))")
    )
    run = project.run("--dlcheck=T7")
    run.assert_outcome("T7", "failed")
    text = tt.section(run, "T7")
    assert (
        "dlcheck_dataloader: its FixedSeedSampler gives the same order in epochs 0 to 2 (first 8 batches compared"
        in text
    )
    assert "a correct shuffle does that with probability ≤ 6.2e-10" in text
    assert "FixedSeedSampler has no set_epoch" in text and "seed + epoch" in text


def test_sampler_seeded_with_the_epoch(project):
    project.conftest(
        with_loader("torch.utils.data.DataLoader(tt.blobs(), batch_size=8, sampler=tt.EpochSeedSampler(64))")
    )
    run = project.run("--dlcheck=T7", "-rA")
    run.fnmatch(["*::T7_epoch_order PASSED (dlcheck_dataloader: its EpochSeedSampler gives epoch 1 an order other*"])
    run.fnmatch(
        [
            "dlcheck_dataloader: its EpochSeedSampler gives epoch 1 an order other than epoch 0's (first 8 batches compared)"
        ]
    )


def test_workers_seeded_with_a_constant(project):
    project.conftest(
        with_loader(
            "torch.utils.data.DataLoader(tt.blobs(), batch_size=8, shuffle=True, num_workers=2, "
            "worker_init_fn=tt.seed_workers_constant)"
        )
    )
    run = project.run("--dlcheck=T7")
    run.assert_outcome("T7", "failed")
    text = tt.section(run, "T7")
    assert "num_workers=2; its worker_init_fn (seed_workers_constant) leaves the same python/numpy random state" in text
    assert "torch.initial_seed() % 2**32" in text


def test_workers_seeded_from_torch(project):
    project.conftest(
        with_loader(
            "torch.utils.data.DataLoader(tt.blobs(), batch_size=8, shuffle=True, num_workers=2, "
            "worker_init_fn=tt.seed_workers_from_torch)"
        )
    )
    run = project.run("--dlcheck=T7", "-rA")
    run.assert_outcome("T7", "passed")
    run.fnmatch(
        [
            "dlcheck_dataloader: its RandomSampler gives epoch 1 an order other than epoch 0's (first 8 batches compared)",
            "num_workers=2: worker_init_fn (seed_workers_from_torch) leaves 3 distinct python/numpy random states in "
            "workers 0, 1 and the next epoch's worker 0",
        ]
    )


def test_a_loop_whose_loader_does_not_shuffle_is_said_not_judged(project):
    # the loop's epochs live in its own code: the same order every epoch matters only past one epoch
    project.conftest(with_loader("tt.loader(shuffle=False)"))
    run = project.run("--dlcheck=T7", "-rs")
    run.assert_outcome("T7", "skipped")
    run.fnmatch(
        ["*dlcheck_dataloader does not shuffle (SequentialSampler): every epoch visits the examples in the same*"]
    )
    assert "not applicable" not in run.text
    assert "define fixture dlcheck_num_epochs returning it, and T7 judges it" in " ".join(run.text.split())


@pytest.mark.parametrize("epochs, outcome", [(2, "failed"), (1, "skipped")])
def test_a_loop_that_says_its_epochs_is_judged_on_a_loader_that_does_not_shuffle(project, epochs, outcome):
    """pytorch/examples fast_neural_style: DataLoader(train_dataset, batch_size) without shuffle, --epochs 2: with
    dlcheck_num_epochs the plain loop's plan is read as a Trainer's is; one epoch repeats no order (not applicable)."""
    extra = f"""
    @pytest.fixture(scope="session")
    def dlcheck_num_epochs():
        return {epochs}
"""
    project.conftest(with_loader("tt.loader(shuffle=False)") + extra)
    run = project.run("--dlcheck=T7", "-rA")
    run.assert_outcome("T7", outcome)
    text = " ".join(run.text.split())
    if outcome == "failed":
        assert "does not shuffle: its SequentialSampler gives every epoch the same order" in text
        assert "the run trains 2 epochs (dlcheck_num_epochs=2)" in text
    else:
        assert (
            "not applicable: dlcheck_dataloader does not shuffle (SequentialSampler), and the run trains one epoch"
            in text
        )


#: pytorch-lightning's examples/pytorch/basics/autoencoder.py: DataLoader(mnist_train, batch_size=...) without
#: shuffle, trained for max_epochs epochs by the Lightning Trainer handed over
LIGHTNING = """
    import lightning as L
    import pytest, torch
    import tiny_lightning as tl


    @pytest.fixture(scope="session")
    def dlcheck_lightning_module():
        return tl.Classifier()

    @pytest.fixture(scope="session")
    def dlcheck_datamodule():
        return tl.Blobs(shuffle={shuffle})

    @pytest.fixture(scope="session")
    def dlcheck_trainer():
        return L.Trainer(max_epochs={epochs}, logger=False, enable_checkpointing=False, enable_progress_bar=False)
"""


def test_a_lightning_run_of_several_epochs_on_a_loader_that_does_not_shuffle_fails(project):
    project.conftest(LIGHTNING.format(shuffle=False, epochs=10))
    run = project.run("--dlcheck=T7")
    run.assert_outcome("T7", "failed")
    text = tt.section(run, "T7")
    assert "does not shuffle: its SequentialSampler gives every epoch the same order" in text, text
    assert "the run trains 10 epochs (max_epochs=10)" in text, text
    assert "shuffle=True" in text, text


def test_a_lightning_run_of_one_epoch_on_a_loader_that_does_not_shuffle_is_not_applicable(project):
    project.conftest(LIGHTNING.format(shuffle=False, epochs=1))
    run = project.run("--dlcheck=T7", "-rs")
    run.assert_outcome("T7", "skipped")
    run.fnmatch(
        ["*not applicable: * does not shuffle (SequentialSampler), and the run trains one epoch (max_epochs=1)*"]
    )


def test_a_lightning_run_of_several_epochs_on_a_shuffling_loader_passes(project):
    project.conftest(LIGHTNING.format(shuffle=True, epochs=10))
    run = project.run("--dlcheck=T7")
    run.assert_outcome("T7", "passed")


def test_a_sampler_without_a_length_is_read_not_tested_for_truth(project):
    """A PK sampler with no ``__len__`` (torchvision's references/similarity): ``sampler or ...`` called its
    len() and T7 ended in an internal error (found blind). It is read as any sampler: a new draw every epoch
    passes; the same sampler re-seeded identically each epoch still fails."""
    project.conftest(
        with_loader(
            "torch.utils.data.DataLoader(tt.blobs(), batch_size=8, sampler=tt.UnsizedPKSampler(tt.blobs().tensors[1]))"
        )
    )
    run = project.run("--dlcheck=T7", "-rA")
    run.assert_outcome("T7", "passed")
    assert "its UnsizedPKSampler gives epoch 1 an order other than epoch 0's" in run.text
    project.conftest(
        with_loader(
            "torch.utils.data.DataLoader(tt.blobs(), batch_size=8, "
            "sampler=tt.UnsizedPKSampler(tt.blobs().tensors[1], seed=0))"
        )
    )
    run = project.run("--dlcheck=T7")
    run.assert_outcome("T7", "failed")


def test_an_iterable_dataset_is_not_read_as_a_repeated_order(project):
    """The placeholder sampler of an IterableDataset loader yields None every time: that is no repeated shuffle
    (it used to fail). Its order is the dataset's own: T7 draws the first batches of two epochs of the loader when
    the run trains more than one epoch, which a loop says with dlcheck_num_epochs (the verdicts with it:
    test_iterable_dataset_with_a_length.py); without it, not judged."""
    project.conftest(with_loader("torch.utils.data.DataLoader(tt.Stream(tt.blobs()), batch_size=8)"))
    run = project.run("--dlcheck=T7")
    run.assert_outcome("T7", "skipped")
    run.fnmatch(
        [
            "*dlcheck_dataloader reads Stream, an IterableDataset: its order is its own, which T7 reads by drawing the "
            "first batches of two epochs of it when the run trains more than one epoch*define fixture "
            "dlcheck_num_epochs*"
        ]
    )


def test_trainer_shuffles_every_epoch(project):
    project.conftest("""
    import pytest, tiny
    from datasets import Dataset
    from trl import SFTConfig, SFTTrainer

    @pytest.fixture(scope="session")
    def dlcheck_trainer(tmp_path_factory):
        tok = tiny.tokenizer()
        return SFTTrainer(model=tiny.llama(tok), args=tiny.trainer_args(tmp_path_factory.mktemp("o"), SFTConfig),
                          processing_class=tok, train_dataset=Dataset.from_dict({"text": tiny.texts()}))
    """)
    project.run("--dlcheck=T7").assert_outcome("T7", "passed")


def test_the_users_sampler_epoch_is_left_where_it_was(project):
    """T7 calls set_epoch on the user's own loader; the epoch counters are put back afterwards (a
    DistributedSampler resumed at epoch 3 stays at 3; a class-level default is not shadowed)."""
    project.conftest(
        with_loader(
            "tt.__dict__.setdefault('SEEN', {}).setdefault('loader', torch.utils.data.DataLoader(tt.blobs(), batch_size=8, "
            "sampler=(lambda s: (s.set_epoch(3), s)[1])(torch.utils.data.DistributedSampler(tt.blobs(), num_replicas=1, "
            "rank=0, shuffle=True))))"
        )
    )
    tt.__dict__.pop("SEEN", None)
    run = project.run("--dlcheck=T7")
    run.assert_outcome("T7", "passed")
    sampler = tt.SEEN["loader"].sampler
    assert sampler.epoch == 3, "T7 left the user's DistributedSampler at another epoch"

    project.conftest(
        with_loader(
            "tt.__dict__.setdefault('SEEN2', torch.utils.data.DataLoader(tt.blobs(), batch_size=8, "
            "sampler=tt.EpochSeedSampler(64)))"
        )
    )
    tt.__dict__.pop("SEEN2", None)
    project.run("--dlcheck=T7").assert_outcome("T7", "passed")
    assert "epoch" not in vars(tt.SEEN2.sampler), "T7 left an epoch on the user's sampler"


#: a Trainer whose train sampler is sequential (an override of _get_train_sampler, as curriculum scripts write),
#: its plan read from its args: max_steps over the batches of an epoch
SEQUENTIAL_TRAINER = """
    import pytest, tiny
    from datasets import Dataset
    from torch.utils.data import SequentialSampler
    from trl import SFTConfig, SFTTrainer

    class InOrder(SFTTrainer):
        def _get_train_sampler(self, *args, **kwargs):
            return SequentialSampler(self.train_dataset)

    @pytest.fixture(scope="session")
    def dlcheck_trainer(tmp_path_factory):
        tok = tiny.tokenizer()
        args = tiny.trainer_args(tmp_path_factory.mktemp("o"), SFTConfig, max_steps={steps})
        return InOrder(model=tiny.llama(tok), args=args, processing_class=tok,
                       train_dataset=Dataset.from_dict({{"text": tiny.texts()}}))
"""


def test_a_trainer_of_several_epochs_whose_sampler_does_not_shuffle_fails(project):
    project.conftest(SEQUENTIAL_TRAINER.format(steps=400))
    run = project.run("--dlcheck=T7")
    run.assert_outcome("T7", "failed")
    text = tt.section(run, "T7")
    assert "does not shuffle: its SequentialSampler gives every epoch the same order" in text, text
    assert re.search(r"the run trains [\d.]+ epochs \(max_steps=400 of \d+ batches an epoch\)", text), text


def test_a_trainer_of_less_than_an_epoch_whose_sampler_does_not_shuffle_is_not_applicable(project):
    project.conftest(SEQUENTIAL_TRAINER.format(steps=1))
    run = project.run("--dlcheck=T7", "-rs")
    run.assert_outcome("T7", "skipped")
    run.fnmatch(["*not applicable: * does not shuffle (SequentialSampler), and the run trains one epoch (max_steps=1*"])


@pytest.mark.parametrize(
    "top, outcome",
    [
        ("if distributed: dataloader.sampler.set_epoch(epoch)", "failed"),
        ("dataloader.sampler.set_epoch(epoch)", "passed"),
    ],
)
def test_a_loop_that_hands_over_its_epoch_start_is_judged_by_it(project, top, outcome):
    """facebookresearch/mae main_pretrain, found blind: a DistributedSampler in one process, set_epoch called only
    `if args.distributed`: every epoch repeats its order. T7 called set_epoch itself and passed; with the top of the
    user's epoch loop handed over (dlcheck_start_epoch), that loop is what sets the epoch."""
    loader = (
        "torch.utils.data.DataLoader(tt.blobs(), batch_size=8, "
        "sampler=torch.utils.data.DistributedSampler(tt.blobs(), num_replicas=1, rank=0, shuffle=True))"
    )
    extra = f"""
    @pytest.fixture(scope="session")
    def dlcheck_start_epoch():
        distributed = False
        def top(state, dataloader, epoch):
            {top}
        return top
"""
    project.conftest(with_loader(loader) + extra)
    run = project.run("--dlcheck=T7", "-rA")
    run.assert_outcome("T7", outcome)
    if outcome == "failed":
        text = tt.section(run, "T7")
        assert "your dlcheck_start_epoch (the top of your epoch loop) ran before each epoch" in text
        assert "your epoch loop does not call DistributedSampler.set_epoch(epoch)" in text


def augmented(source: str, **kw: str) -> str:
    extra = "".join(f", {k}={v}" for k, v in kw.items())
    return with_loader(f"torch.utils.data.DataLoader(tt.AugmentedBlobs({source!r}), batch_size=8, shuffle=True{extra})")


@pytest.mark.parametrize(
    ("workers", "persistent", "replays"),
    [
        ("2", "False", ["worker 0 and worker 1 give the same 24 results", "epoch 1's fresh worker 0 gives them again"]),
        ("2", "True", ["worker 0 and worker 1 give the same 24 results"]),
        ("1", "False", ["epoch 1's fresh worker 0 gives them again"]),
    ],
)
def test_workers_that_copy_the_datasets_own_generator_replay_one_stream(project, workers, persistent, replays):
    # an augmentation drawn from a generator the dataset owns (an albumentations Compose's): every worker gets
    # the main process's copy, and each epoch's fresh workers get it again
    project.conftest(augmented("private", num_workers=workers, persistent_workers=persistent))
    run = project.run("--dlcheck=T7")
    run.assert_outcome("T7", "failed")
    text = tt.section(run, "T7")
    for replay in replays:
        assert replay in text
    if persistent == "True":
        assert "gives them again" not in text
    if workers == "1":
        assert "worker 1" not in text
    assert "the dataset holds its own random generator(s): dataset.rng (numpy.random._generator.Generator)" in text
    assert "info.dataset.<generator> = numpy.random.default_rng(info.seed)" in text


@pytest.mark.parametrize(
    ("source", "init"),
    [("torch", None), ("private", "tt.reseed_dataset_rng")],
    ids=["torch-global-generator", "own-generator-reseeded-per-worker"],
)
def test_workers_whose_augmentation_draws_differ_pass(project, source, init):
    # the correct twins: torch seeds its global generator in every worker; the fix the failure gives reseeds the
    # dataset's own generator from the worker's seed
    kw = {"num_workers": "2"} | ({"worker_init_fn": init} if init else {})
    project.conftest(augmented(source, **kw))
    run = project.run("--dlcheck=T7", "-rA")
    run.assert_outcome("T7", "passed")
    run.fnmatch(
        [
            "*num_workers=2: example * fetched 24 times in each of 2 worker(s), in two epochs: * distinct results, "
            "and the workers' streams differ, and epoch 1's workers draw anew*"
        ]
    )
    assert "needs a real worker" not in run.text


def test_workers_of_a_dataset_without_random_augmentation_are_measured_as_such(project):
    project.conftest(with_loader("torch.utils.data.DataLoader(tt.blobs(), batch_size=8, shuffle=True, num_workers=2)"))
    run = project.run("--dlcheck=T7", "-rA")
    run.assert_outcome("T7", "passed")
    run.fnmatch(["*is the same every time: the examples draw no random augmentation that workers could repeat*"])


def test_a_loader_of_one_full_batch_repeats_no_order(project):
    # full-batch training (time_sequence_prediction: all rows in one batch, LBFGS): the epochs train on the same batch
    # whatever its order; the same loader in batches of 8 still fails (the test above)
    extra = """
    @pytest.fixture(scope="session")
    def dlcheck_num_epochs():
        return 15
"""
    project.conftest(with_loader("tt.loader(batch_size=64, shuffle=False)") + extra)
    run = project.run("--dlcheck=T7", "-rA")
    run.assert_outcome("T7", "skipped")
    assert "yields one batch holding all 64 examples per epoch" in " ".join(run.text.split())
