"""S3 and a zero-initialised factor (LoRA's B = 0): the partner factor's gradient is exactly 0 at the start and grows
from 0 as B grows, so the total gradient norm rises many-fold in a healthy run. S3 compares the norm over the tensors
that had a gradient at the first step with its start; an explosion still fails."""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "train"))
import tiny_train as tt  # noqa: E402

LORA = """

    class LoraMLP(nn.Module):
        # a frozen base with a low-rank adapter: delta = B @ A, B initialised to 0 (A's gradient is 0 until B moves)
        def __init__(self):
            super().__init__()
            torch.manual_seed(0)
            self.base = tt.MLP()
            self.base.requires_grad_(False)
            self.lora_A = nn.Parameter(torch.randn(2, 32) * 0.18)
            self.lora_B = nn.Parameter(torch.zeros(4, 2))

        def forward(self, x):
            h = self.base.body(x)
            return self.base.head(h) + 0.1 * (h @ self.lora_A.t()) @ self.lora_B.t()
"""


LORA_PLUS = 'torch.optim.AdamW([{"params": [model.lora_A], "lr": 1e-3}, {"params": [model.lora_B], "lr": 0.1}])'


def lora_project(optimizer: str) -> str:
    return tt.loop_project(model="LoraMLP()", optimizer=optimizer, extra=LORA)


def test_a_zero_initialised_factor_growing_is_no_explosion(project):
    # B learns faster than A (LoRA+'s way): A's gradient, 0 at the start, grows past B's many-fold
    project.conftest(lora_project(LORA_PLUS))
    run = project.run("--dlcheck=S3", "-rA")
    run.assert_outcome("S3", "passed")
    run.fnmatch(
        [
            "*gradient norms * -> * (before clipping, over the 1 of the 2 tensors with a gradient that was not 0 at the first step*"
        ]
    )
    run.fnmatch(["*the gradients of the 1 tensor whose gradient was 0 at the first step not judged*"])


def test_an_exploding_run_with_a_zero_initialised_factor_still_fails(project):
    project.conftest(lora_project("torch.optim.SGD([p for p in model.parameters() if p.requires_grad], lr=30.0)"))
    run = project.run("--dlcheck=S3")
    run.assert_outcome("S3", "failed")
    assert "with a gradient that was not 0 at the first step" in tt.section(run, "S3")


def test_an_exploding_learning_rate_still_fails(project):
    project.conftest(tt.loop_project(optimizer="torch.optim.SGD(model.parameters(), lr=5.0)"))
    run = project.run("--dlcheck=S3")
    run.assert_outcome("S3", "failed")
