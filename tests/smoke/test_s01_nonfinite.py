"""S1: a short real run keeps loss, gradients and weights finite."""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "train"))
import tiny_train as tt  # noqa: E402

TEXT = """
    import pytest, torch, tiny_train as tt
    from torch import nn

    @pytest.fixture(scope="session")
    def dlcheck_make_training():
        def make():
            model = tt.BagOfWords().to(torch.{dtype})
            return {{"model": model, "optimizer": torch.optim.AdamW(model.parameters(), lr=1e-3{eps})}}
        return make

    @pytest.fixture(scope="session")
    def dlcheck_dataloader():
        return torch.utils.data.DataLoader(tt.token_classes(), batch_size=8)

    @pytest.fixture(scope="session")
    def dlcheck_compute_loss():
        return lambda model, batch: nn.functional.cross_entropy(model(batch[0]).float(), batch[1])
"""


def test_float16_weights_with_adam_eps_1e8(project):
    project.conftest(TEXT.format(dtype="float16", eps=""))
    run = project.run("--dlcheck=S1")
    run.assert_outcome("S1", "failed")
    text = tt.section(run, "S1")
    assert "step 1 of 20" in text and "after the optimizer update the weights hold NaN/Inf: embed.weight" in text
    assert "AdamW(eps=1e-08) on float16 weights: eps rounds to 0 in float16" in text and "eps=1e-4" in text


def test_float16_weights_with_a_representable_eps_pass(project):
    project.conftest(TEXT.format(dtype="float16", eps=", eps=1e-4"))
    run = project.run("--dlcheck=S1", "-rA")
    run.fnmatch(["*::S1_nonfinite_run PASSED (20-step smoke run: losses * -> * (20 logged), all finite;*"])
    run.fnmatch(
        [
            "20-step smoke run: losses * -> * (20 logged), all finite; gradient norm ≤ * at 20 steps, all finite; "
            "weights finite after 20 optimizer steps"
        ]
    )
