"""T7: a new order every epoch, distinct random streams per worker."""

import tiny_train as tt


def with_loader(loader: str) -> str:
    return tt.loop_project(loader=loader)


def test_sampler_reseeded_identically_every_epoch(project):
    project.conftest(with_loader("torch.utils.data.DataLoader(tt.blobs(), batch_size=8, sampler=tt.FixedSeedSampler(64))"))
    run = project.run("--dlcheck=T7")
    run.assert_outcome("T7", "failed")
    text = tt.section(run, "T7")
    assert ("dlcheck_dataloader: its FixedSeedSampler gives the same order in epochs 0 to 2 (first 8 batches compared"
            in text)
    assert "a correct shuffle does that with probability ≤ 6.2e-10" in text
    assert "FixedSeedSampler has no set_epoch" in text and "seed + epoch" in text


def test_sampler_seeded_with_the_epoch(project):
    project.conftest(with_loader("torch.utils.data.DataLoader(tt.blobs(), batch_size=8, sampler=tt.EpochSeedSampler(64))"))
    project.run("--dlcheck=T7").assert_outcome("T7", "passed")


def test_workers_seeded_with_a_constant(project):
    project.conftest(with_loader("torch.utils.data.DataLoader(tt.blobs(), batch_size=8, shuffle=True, num_workers=2, "
                                 "worker_init_fn=tt.seed_workers_constant)"))
    run = project.run("--dlcheck=T7")
    run.assert_outcome("T7", "failed")
    text = tt.section(run, "T7")
    assert "num_workers=2; its worker_init_fn (seed_workers_constant) leaves the same python/numpy random state" in text
    assert "torch.initial_seed() % 2**32" in text


def test_workers_seeded_from_torch(project):
    project.conftest(with_loader("torch.utils.data.DataLoader(tt.blobs(), batch_size=8, shuffle=True, num_workers=2, "
                                 "worker_init_fn=tt.seed_workers_from_torch)"))
    project.run("--dlcheck=T7").assert_outcome("T7", "passed")


def test_trainer_shuffles_every_epoch(project):
    project.conftest('''
    import pytest, tiny
    from datasets import Dataset
    from trl import SFTConfig, SFTTrainer

    @pytest.fixture(scope="session")
    def dlcheck_trainer(tmp_path_factory):
        tok = tiny.tokenizer()
        return SFTTrainer(model=tiny.llama(tok), args=tiny.trainer_args(tmp_path_factory.mktemp("o"), SFTConfig),
                          processing_class=tok, train_dataset=Dataset.from_dict({"text": tiny.texts()}))
    ''')
    project.run("--dlcheck=T7").assert_outcome("T7", "passed")
