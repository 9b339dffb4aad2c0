"""T1 on a binary classifier with one logit (BCEWithLogitsLoss): its near-uniform start costs ln 2, whatever the
targets' dtype (Lightning's fine-tuning example turns int labels into floats in its training_step; a plain loop
may carry float 0/1 targets in the batch). A head that starts far above ln 2 still fails."""

import pytest
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
        loss = {loss}
        return lambda out, y: loss(out.squeeze(-1), y)
"""

BCE = "nn.BCEWithLogitsLoss()"


def test_float_zero_one_targets_with_one_logit_start_at_ln_2(project):
    project.conftest(LOOP.format(bias=0.0, loss=BCE))
    run = project.run("--dlcheck=T1", "-rA")
    run.assert_outcome("T1", "passed")
    run.fnmatch(
        [
            "*x ln(2) = 0.693 (fails above 1.5 x and 1.0 nats over ln(2)); a binary head: one logit per example (output (8, 1))*"
        ]
    )


def test_float_zero_one_targets_with_a_large_bias_fail_naming_the_bias(project):
    project.conftest(LOOP.format(bias=-8.0, loss=BCE))
    run = project.run("--dlcheck=T1")
    run.assert_outcome("T1", "failed")
    text = tt.section(run, "T1")
    assert "x ln(2) = 0.693" in text and "the binary head's logit starts far from 0" in text and "bias" in text


def test_a_binary_cross_entropy_with_a_bias_of_3_fails(project):
    # the buggy twin of the loss replay below: the same head and bias under BCEWithLogitsLoss is confidently wrong
    project.conftest(LOOP.format(bias=3.0, loss=BCE))
    run = project.run("--dlcheck=T1")
    run.assert_outcome("T1", "failed")
    text = " ".join(tt.section(run, "T1").split())
    assert "x ln(2) = 0.693" in text and "the model predicts p = 0.9" in text, text
    assert (
        "the loss is a binary cross-entropy (replayed on 6 outputs put in place of the model's, read as logits" in text
    )


def test_a_summed_binary_cross_entropy_still_fails_as_summed(project):
    # a summed BCE costs 8 x ln 2 at logit 0: the replay reads it as a cross-entropy x 8, not as another loss
    project.conftest(LOOP.format(bias=0.0, loss='nn.BCEWithLogitsLoss(reduction="sum")'))
    run = project.run("--dlcheck=T1")
    run.assert_outcome("T1", "failed")
    text = " ".join(tt.section(run, "T1").split())
    assert "8 x a cross-entropy's value" in text and "summed over the batch instead of averaged" in text, text


def test_an_mse_on_a_zero_one_score_is_not_judged_against_ln_2(project):
    # one output per example against float 0/1 targets, but an MSE: a bias of 3 costs 9.12 x ln 2, and the story
    # of a binary head predicting p = 0.95 is untrue: the replay of the loss shows it is no cross-entropy
    project.conftest(LOOP.format(bias=3.0, loss="nn.MSELoss()"))
    run = project.run("--dlcheck=T1", "-rA")
    run.assert_outcome("T1", "skipped")
    text = " ".join(run.text.split())
    assert "confidently wrong" not in text and "the model predicts p =" not in text, text
    assert (
        "not applicable: one output per example against 0/1 targets (float32 (8,)), but the loss is not a binary "
        "cross-entropy of the model's output" in text
    ), text


def test_a_label_smoothed_binary_cross_entropy_is_judged(project):
    # label smoothing mixes each example's two cross-entropies; the loss is still a binary cross-entropy
    smoothed = "lambda out, y: nn.functional.binary_cross_entropy_with_logits(out, y * 0.9 + 0.05)"
    project.conftest(LOOP.format(bias=0.0, loss=smoothed))
    run = project.run("--dlcheck=T1", "-rA")
    run.assert_outcome("T1", "passed")
    run.fnmatch(["*x ln(2) = 0.693*the loss is a binary cross-entropy (replayed on 6 outputs*"])


def test_a_probability_head_under_bce_loss_is_judged(project):
    # a sigmoid inside the model and nn.BCELoss: the loss reads the output as a probability, still a binary
    # cross-entropy; a bias of 3 is confidently wrong there too
    sigmoid = (
        LOOP.format(bias=3.0, loss="nn.BCELoss()")
        .replace("nn.Linear(16, 1))", "nn.Linear(16, 1), nn.Sigmoid())")
        .replace("model[-1].bias", "model[-2].bias")
    )
    project.conftest(sigmoid)
    run = project.run("--dlcheck=T1")
    run.assert_outcome("T1", "failed")
    text = " ".join(tt.section(run, "T1").split())
    assert "read as probabilities" in text and "x ln(2) = 0.693" in text, text


WEIGHTED = "nn.BCEWithLogitsLoss(pos_weight=torch.tensor(4.0))"


def test_a_class_weighted_binary_cross_entropy_starting_confidently_wrong_fails(project):
    # pos_weight: the near-uniform cost is the loss's own value at logit 0 on the batch (replayed), not ln 2
    project.conftest(LOOP.format(bias=-3.0, loss=WEIGHTED))  # p = 0.05 on the positives pos_weight amplifies
    run = project.run("--dlcheck=T1")
    run.assert_outcome("T1", "failed")
    text = " ".join(run.text.split())
    assert "x its cost at logit 0 on this batch (pos_weight weighs the classes)" in text, text
    assert "the binary head's logit starts far from 0" in text, text


def test_a_class_weighted_binary_cross_entropy_starting_near_uniform_passes(project):
    project.conftest(LOOP.format(bias=0.0, loss=WEIGHTED))
    run = project.run("--dlcheck=T1", "-rA")
    run.assert_outcome("T1", "passed")
    text = " ".join(run.text.split())
    assert "x its cost at logit 0 on this batch (pos_weight weighs the classes)" in text, text


def test_a_loss_that_cannot_be_replayed_says_what_it_did_not_judge(project):
    # the loss reads the model twice (a consistency term): it cannot be replayed on one output put in place of
    # the model's, so whether it is a binary cross-entropy is not told; the bias-3 BCE twin above still fails
    conftest = (
        LOOP.format(bias=3.0, loss=BCE)
        + """
    @pytest.fixture(scope="session")
    def dlcheck_compute_loss():
        bce = nn.BCEWithLogitsLoss()
        def loss(model, batch):
            x, y = batch
            return bce(model(x).squeeze(-1), y) + 0.0 * model(x + 1).mean()
        return loss
"""
    )
    project.conftest(conftest.replace("def dlcheck_loss_fn", "def _unused_loss_fn"))
    run = project.run("--dlcheck=T1", "-rA")
    run.assert_outcome("T1", "skipped")
    text = " ".join(run.text.split())
    assert "not judged: one output per example against 0/1 targets (float32 (8,))" in text, text
    assert "the loss does not read the model's output tensor as returned" in text, text


MULTI_LABEL = """
    import pytest, torch, tiny_train as tt
    from torch import nn
    from torch.utils.data import DataLoader, TensorDataset

    # run_classification's multi-label path: one logit per label, multi-hot float targets, BCE with logits
    @pytest.fixture(scope="session")
    def dlcheck_make_training():
        def make():
            torch.manual_seed(0)
            model = tt.MLP(classes=6)
            with torch.no_grad():
                model.head.bias.fill_({bias})
            return {{"model": model, "optimizer": torch.optim.AdamW(model.parameters(), lr=1e-2)}}
        return make

    @pytest.fixture(scope="session")
    def dlcheck_dataloader():
        g = torch.Generator().manual_seed(0)
        x = torch.randn(32, 8, generator=g)
        y = (torch.rand(32, 6, generator=g) < 0.3).float()
        return DataLoader(TensorDataset(x, y), batch_size=8)

    @pytest.fixture(scope="session")
    def dlcheck_loss_fn():
        return nn.BCEWithLogitsLoss()
"""


@pytest.mark.parametrize(("bias", "outcome"), [(0.0, "passed"), (8.0, "failed")])
def test_a_multi_label_head_starts_at_ln_2_per_label(project, bias, outcome):
    # T1 had said the output (8, 6) 'is not one logit per target' against (8, 6) multi-hot targets (blind set 11)
    project.conftest(MULTI_LABEL.format(bias=bias))
    run = project.run("--dlcheck=T1", "-rA")
    run.assert_outcome("T1", outcome)
    text = " ".join(run.text.split())
    assert "ln(2) = 0.693" in text
    if outcome == "passed":
        assert "a binary head: one logit per label of each example (output (8, 6))" in text
