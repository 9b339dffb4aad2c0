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
