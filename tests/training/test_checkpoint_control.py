"""C2 judges an interrupted save only when the user's load works on an uninterrupted checkpoint. The
torchvision classification reference saves ``args`` (an argparse.Namespace) in its checkpoint and resumes
with ``torch.load(..., weights_only=True)``: under torch >= 2.6 that load fails whether or not a save was
interrupted — the resume is broken (C1's finding), not the save's atomicity."""

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
    project.conftest(PROJECT.format(weights_only=True))
    run = project.run("--dlcheck=C2", "-rs")
    run.assert_outcome("C2", "skipped")
    run.fnmatch(["*cannot judge an interrupted save: dlcheck_load_checkpoint fails on the checkpoint*UnpicklingError*"])
    assert "previous checkpoint's path" not in run.text


def test_the_same_save_with_a_load_that_works_is_judged(project):
    project.conftest(PROJECT.format(weights_only=False))
    run = project.run("--dlcheck=C2")
    run.assert_outcome("C2", "failed")  # torch.save straight onto the previous checkpoint
