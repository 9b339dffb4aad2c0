"""An IterableDataset that also defines ``__len__`` (torchtext datapipes, pytorch/examples language_translation's
Multi30k): it has a length and torch's unimplemented ``Dataset.__getitem__``, yet it can only be iterated. T8 and V2
indexed it (an internal error; V2's was blamed on dlcheck_eval_dataloader), and T7 skipped a loader that never
shuffles although dlcheck_num_epochs said 30 epochs (found blind, set 15)."""

import pytest
import tiny_train as tt

PROJECT = """
    import pytest, torch
    from torch import nn
    from torch.nn.utils.rnn import pad_sequence

    WORDS = "a an the small big red blue green dog cat bird fish runs sleeps eats sings over under near far".split()


    def pairs(n, start=0):
        # (source, target) line pairs: distinct sentences of varying length
        out = []
        for i in range(start, start + n):
            src = " ".join(WORDS[(i * k + k) % len(WORDS)] for k in range(1, 4 + i % 5))
            out.append((f"{{src}} {{i}}", f"{{src[::-1]}} {{i}}"))
        return out


    VOCAB = {{w: k + 3 for k, w in enumerate(sorted({{w for s, t in pairs(80) for w in (s + " " + t).split()}}))}}


    def encode(text):
        return torch.tensor([1] + [VOCAB.get(w, 0) for w in text.split()] + [2])


    def collate(batch):  # sequence first, padded with 0, as the translation example's collate_fn
        return (pad_sequence([encode(s) for s, _ in batch], padding_value=0),
                pad_sequence([encode(t) for _, t in batch], padding_value=0))


    class Lines(torch.utils.data.IterableDataset):
        \"\"\"(source, target) line pairs in file order, with a length, as torchtext's datapipes give them.\"\"\"

        def __init__(self, items):
            self.items = list(items)

        def __iter__(self):
            return iter(self.items)

        def __len__(self):
            return len(self.items)


    class DrawnOrder(Lines):
        \"\"\"Shuffles itself at every iteration, from the global torch generator (torchdata's Shuffler draws its seed
        so).\"\"\"

        def __iter__(self):
            return (self.items[i] for i in torch.randperm(len(self.items)).tolist())


    class CountedEpochs(Lines):
        \"\"\"A shuffle buffer seeded with seed + the number of iterations so far, counted by the dataset itself.\"\"\"

        def __init__(self, items, seed=0):
            super().__init__(items)
            self.seed, self.epoch = seed, 0

        def __iter__(self):
            g = torch.Generator().manual_seed(self.seed + self.epoch)
            self.epoch += 1
            return (self.items[i] for i in torch.randperm(len(self.items), generator=g).tolist())


    class SetEpoch(Lines):
        \"\"\"Shuffled with seed + epoch, the epoch handed over by set_epoch (as a datasets IterableDataset).\"\"\"

        def __init__(self, items, seed=0):
            super().__init__(items)
            self.seed, self.epoch = seed, 0

        def set_epoch(self, epoch):
            self.epoch = epoch

        def __iter__(self):
            g = torch.Generator().manual_seed(self.seed + self.epoch)
            return (self.items[i] for i in torch.randperm(len(self.items), generator=g).tolist())


    class Translator(nn.Module):
        def __init__(self):
            super().__init__()
            self.src = nn.Embedding(len(VOCAB) + 3, 16)
            self.tgt = nn.Embedding(len(VOCAB) + 3, 16)
            self.drop = nn.Dropout(0.3)
            self.out = nn.Linear(16, len(VOCAB) + 3)

        def forward(self, src, tgt_in):  # (S, N), (T, N) -> (T, N, vocab)
            memory = self.src(src).mean(0, keepdim=True)
            return self.out(self.drop(self.tgt(tgt_in) + memory))


    def loss(model, batch):
        src, tgt = batch
        logits = model(src, tgt[:-1])
        return nn.functional.cross_entropy(logits.reshape(-1, logits.shape[-1]), tgt[1:].reshape(-1), ignore_index=0)


    TRAIN = {train}
    EVAL = {eval}


    @pytest.fixture(scope="session")
    def dlcheck_model():
        return Translator()


    @pytest.fixture(scope="session")
    def dlcheck_make_training():
        def make():
            model = Translator()
            return {{"model": model, "optimizer": torch.optim.Adam(model.parameters(), lr=1e-3)}}
        return make


    @pytest.fixture(scope="session")
    def dlcheck_compute_loss():
        return loss


    @pytest.fixture(scope="session")
    def dlcheck_dataloader():
        return TRAIN


    @pytest.fixture(scope="session")
    def dlcheck_eval_dataloader():
        return EVAL


    @pytest.fixture(scope="session")
    def dlcheck_eval_fn():
        def evaluate(model, loader):
            {eval_mode}
            with torch.no_grad():
                return sum(float(loss(model, b)) for b in loader) / len(list(loader))
        return evaluate
"""

LOADER = "torch.utils.data.DataLoader({}, batch_size=4, collate_fn=collate)"
EPOCHS = """
    @pytest.fixture(scope="session")
    def dlcheck_num_epochs():
        return {}
"""


def conftest(
    train: str = "Lines(pairs(48))",
    eval: str = "Lines(pairs(16, start=48))",
    eval_mode: str = "model.eval()",
    epochs: int | None = None,
) -> str:
    text = PROJECT.format(train=LOADER.format(train), eval=LOADER.format(eval), eval_mode=eval_mode)
    return text + (EPOCHS.format(epochs) if epochs is not None else "")


def test_t8_reads_the_iterable_splits_by_iterating_them(project):
    """No internal error: the splits are read by iterating them. A held-out eval split passes; an eval split of
    training lines still fails."""
    project.conftest(conftest())
    run = project.run("--dlcheck=T8", "-rA")
    run.assert_outcome("T8", "passed")
    assert "internal error" not in run.text
    text = " ".join(run.text.split())
    assert "0 of 16 eval examples" in text and "among the 48 training examples" in text, text
    project.conftest(conftest(eval="Lines(pairs(8, start=4))"))
    run = project.run("--dlcheck=T8")
    run.assert_outcome("T8", "failed")
    assert "8 of 8 eval examples (100%) are also in the 48 training examples" in tt.section(run, "T8")


def test_v2_reads_an_iterable_eval_split_without_indexing_it(project):
    """V2 no longer indexes the eval dataset (an error it blamed on dlcheck_eval_dataloader): the eval-mode half runs
    on the loader's first batch; an eval function that forgets model.eval() still fails."""
    project.conftest(conftest())
    run = project.run("--dlcheck=V2", "-rA")
    assert "dlcheck_eval_dataloader (the fixture" not in run.text
    run.assert_outcome("V2", "passed")
    project.conftest(conftest(eval_mode="pass"))
    run = project.run("--dlcheck=V2")
    run.assert_outcome("V2", "failed")
    text = tt.section(run, "V2")
    assert "Dropout" in text and "model.eval()" in text, text


def test_t7_fails_an_iterable_loader_that_gives_every_epoch_the_same_batches(project):
    project.conftest(conftest(epochs=30))
    run = project.run("--dlcheck=T7")
    run.assert_outcome("T7", "failed")
    text = tt.section(run, "T7")
    assert "dlcheck_dataloader reads Lines, an IterableDataset" in text, text
    assert (
        "two iterations of it (epochs 0 and 1 as your loop sees them; neither the loader nor its dataset has a "
        "set_epoch) give the same first 8 batches, identical in content and order (8 batches of each compared)" in text
    ), text
    assert "the run trains 30 epochs (dlcheck_num_epochs=30)" in text, text
    assert "shuffle" in text


def test_t7_without_the_number_of_epochs_says_the_repeated_order_not_judged(project):
    project.conftest(conftest())
    run = project.run("--dlcheck=T7", "-rs")
    run.assert_outcome("T7", "skipped")
    text = " ".join(run.text.split())
    assert "dlcheck_dataloader reads Lines, an IterableDataset: its order is its own" in text, text
    assert "define fixture dlcheck_num_epochs returning it, and T7 judges it" in text, text
    assert "not applicable" not in text


def test_t7_one_epoch_of_an_iterable_loader_repeats_no_order(project):
    project.conftest(conftest(epochs=1))
    run = project.run("--dlcheck=T7", "-rs")
    run.assert_outcome("T7", "skipped")
    assert "not applicable" in run.text and "trains one epoch" in run.text


@pytest.mark.parametrize("dataset", ["DrawnOrder", "CountedEpochs", "SetEpoch"])
def test_t7_passes_an_iterable_dataset_that_shuffles_itself_every_epoch(project, dataset):
    project.conftest(conftest(train=f"{dataset}(pairs(48))", epochs=30))
    project.conftest(
        """
    def test_no_trace(dlcheck_dataloader):
        # the dataset's own epoch counter is where the check found it
        assert getattr(dlcheck_dataloader.dataset, "epoch", 0) == 0
""",
        path="test_trace.py",
    )
    run = project.run("--dlcheck=T7", "-rA")
    run.assert_outcome("T7", "passed")
    text = " ".join(run.text.split())
    assert f"dlcheck_dataloader reads {dataset}, an IterableDataset: two iterations of it" in text, text
    assert "give other batches or another order" in text, text
    assert "test_no_trace PASSED" in text, text


def test_t7_reads_a_hand_written_loader_without_a_sampler_the_same_way(project):
    """A loader of the user's own (a generator of batches, no sampler): its order is its own as well, read from two
    iterations when the run trains more than one epoch. Fixed order: fails; a loader that shuffles: passes."""
    extra = EPOCHS.format(3)
    project.conftest(tt.loop_project(loader="tt.GeneratorLoader(tt.blobs())") + extra)
    run = project.run("--dlcheck=T7")
    run.assert_outcome("T7", "failed")
    text = tt.section(run, "T7")
    assert "dlcheck_dataloader is a GeneratorLoader without a sampler: two iterations of it" in text, text
    assert "the run trains 3 epochs (dlcheck_num_epochs=3)" in text, text
    shuffled = "tt.GeneratorLoader(torch.utils.data.Subset(tt.blobs(), torch.randperm(64).tolist()))"
    project.conftest(
        tt.loop_project(loader="Reshuffled()")
        + extra
        + f"""
    class Reshuffled:
        def __iter__(self):
            return iter({shuffled})
"""
    )
    run = project.run("--dlcheck=T7", "-rA")
    run.assert_outcome("T7", "passed")
    assert "give other batches or another order" in run.text
