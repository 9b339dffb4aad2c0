"""S5: after a short run, the eval loss stays near the train loss."""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "train"))
import tiny_train as tt  # noqa: E402


def with_train_data(data: str) -> str:
    return tt.loop_project(
        model="tt.MLP(hidden=128)",
        loader=f"torch.utils.data.DataLoader({data}, batch_size=8)",
        extra="""
    @pytest.fixture(scope="session")
    def dlcheck_eval_dataloader():
        return torch.utils.data.DataLoader(tt.blobs(32, seed=9), batch_size=8)
    """,
    )


def test_labels_misaligned_with_their_inputs_are_memorised(project):
    project.conftest(with_train_data("tt.misaligned(tt.blobs(16))"))
    run = project.run("--dlcheck=S5", "--dlcheck-set=S1.steps=40")
    run.assert_outcome("S5", "failed")
    text = tt.section(run, "S5")
    assert "after 40 steps: eval loss 1.416 vs train loss 0.1061 on the sampled batches = 13.35 x" in text
    assert "before training: eval 1.68, train 1.706" in text
    assert "the model memorises the training batches" in text and "each label belongs to its input" in text


def test_aligned_labels_generalise(project):
    project.conftest(with_train_data("tt.blobs(16)"))
    run = project.run("--dlcheck=S5", "--dlcheck-set=S1.steps=40", "-rA")
    run.fnmatch(["*::S5_train_eval_gap PASSED (after 40 steps: eval loss * vs train loss *"])
    run.fnmatch(
        [
            "after 40 steps: eval loss * vs train loss * on the sampled batches = * x, * nats apart (fails when above "
            "1.5 x and more than 0.3 nats apart)",
            "before training: eval *, train *",
        ]
    )


EXPLODING = """
    import pytest, torch
    from torch import nn

    def data(n):
        x = torch.tensor([1.0, -1.0] * (n // 2))[:, None]
        return torch.utils.data.TensorDataset(x, 2 * x)

    @pytest.fixture(scope="session")
    def dlcheck_make_training():
        def make():
            model = nn.Linear(1, 1, bias=False)
            return {"model": model, "optimizer": torch.optim.SGD(model.parameters(), lr=1.3)}
        return make

    @pytest.fixture(scope="session")
    def dlcheck_dataloader():
        return torch.utils.data.DataLoader(data(64), batch_size=8)

    @pytest.fixture(scope="session")
    def dlcheck_eval_dataloader():
        return torch.utils.data.DataLoader(data(32), batch_size=8)

    @pytest.fixture(scope="session")
    def dlcheck_loss_fn():
        return nn.MSELoss()
"""


def test_an_exploded_run_is_not_passed_as_generalising(project):
    """Least squares at lr 1.3, above the stability limit 1: the loss is (w - 2)^2 on every batch, train and
    eval alike, and grows 2.56x a step, to about 10^8. Its eval/train ratio is 1.0: the gap alone passed it.
    S2 owns the cause; S5 skips naming it."""
    project.conftest(EXPLODING)
    run = project.run("--dlcheck=S2,S5", "-rs")
    run.assert_outcome("S2", "failed")
    run.assert_outcome("S5", "skipped")
    run.fnmatch(
        [
            "*S5_train_eval_gap: not judged: the smoke run diverged (* S2 fails it): the eval/train gap of a diverged model is no sign "
            "of memorisation or of different eval data (see S2, and the learning rate)*"
        ]
    )
