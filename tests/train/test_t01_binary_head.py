"""T1 on a binary classifier with one logit (BCEWithLogitsLoss): its near-uniform start costs ln 2, whatever the
targets' dtype (Lightning's fine-tuning example turns int labels into floats in its training_step; a plain loop
may carry float 0/1 targets in the batch). A head that starts far above ln 2 still fails."""

import tiny_lightning as tl  # noqa: F401 - imports Lightning once, before the in-process runs
import tiny_train as tt

LIGHTNING = """
    import pytest, torch, tiny_lightning as tl

    @pytest.fixture(scope="session")
    def dlcheck_lightning_module():
        torch.manual_seed(0)
        return tl.BinaryClassifier(bias={bias})

    @pytest.fixture(scope="session")
    def dlcheck_datamodule():
        return tl.TwoBlobs()
"""


def test_a_lightning_binary_head_starts_at_ln_2(project):
    project.conftest(LIGHTNING.format(bias=0.0))
    run = project.run("--dlcheck=T1", "-rA")
    run.assert_outcome("T1", "passed")
    run.fnmatch(
        [
            "*x ln(2) = 0.693 (fails above 1.5 x and 1.0 nats over ln(2)); a binary head: one logit per example (output (8, 1))*"
        ]
    )


def test_a_lightning_binary_head_with_a_large_bias_fails(project):
    project.conftest(LIGHTNING.format(bias=8.0))
    run = project.run("--dlcheck=T1")
    run.assert_outcome("T1", "failed")
    text = tt.section(run, "T1")
    assert "x ln(2) = 0.693" in text and "a binary head: one logit per example (output (8, 1))" in text


LOOP = """
    import pytest, torch
    from torch import nn
    from torch.utils.data import DataLoader, TensorDataset

    @pytest.fixture(scope="session")
    def dlcheck_make_training():
        def make():
            torch.manual_seed(0)
            model = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 1))
            with torch.no_grad():
                model[-1].bias.fill_({bias})
            return {{"model": model, "optimizer": torch.optim.SGD(model.parameters(), lr=0.1)}}
        return make

    @pytest.fixture(scope="session")
    def dlcheck_dataloader():
        g = torch.Generator().manual_seed(0)
        x = torch.randn(64, 8, generator=g)
        y = (x[:, 0] > 0).float()  # float 0/1 targets, one per example
        return DataLoader(TensorDataset(x, y), batch_size=8)

    @pytest.fixture(scope="session")
    def dlcheck_loss_fn():
        bce = nn.BCEWithLogitsLoss()
        return lambda out, y: bce(out.squeeze(-1), y)
"""


def test_float_zero_one_targets_with_one_logit_start_at_ln_2(project):
    project.conftest(LOOP.format(bias=0.0))
    run = project.run("--dlcheck=T1", "-rA")
    run.assert_outcome("T1", "passed")
    run.fnmatch(
        [
            "*x ln(2) = 0.693 (fails above 1.5 x and 1.0 nats over ln(2)); a binary head: one logit per example (output (8, 1))*"
        ]
    )


def test_float_zero_one_targets_with_a_large_bias_fail_naming_the_bias(project):
    project.conftest(LOOP.format(bias=-8.0))
    run = project.run("--dlcheck=T1")
    run.assert_outcome("T1", "failed")
    text = tt.section(run, "T1")
    assert "x ln(2) = 0.693" in text and "the binary head's logit starts far from 0" in text and "bias" in text
