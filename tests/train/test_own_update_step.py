"""A plain loop with no optimizer object: the step updates the weights itself, as pytorch/examples'
word_language_model does (``model.zero_grad()``, ``loss.backward()``, ``clip_grad_norm_``, then
``p.data.add_(p.grad, alpha=-lr)``). Found blind (set 13): S3 skipped saying the run "recorded 0 finite gradient
norms" (they were finite: there was no optimizer step to read them at), S1 passed on "20 optimizer steps" the cost
line did not see, and T2 / T9 skipped for "no optimizer". An update is now a call of the step after which the
weights changed, its gradients read as the backward leaves them: S1/S3 judge real norms, T9 judges whether .grad is
reset between updates (a loop that never zeroes fails), T2 runs the user's step on one batch (a step that climbs
the loss or has a learning rate of 0 fails), and T6/T10 say why they do not judge."""

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent))
import tiny_train as tt  # noqa: E402
from helpers import role_fixtures  # noqa: E402

CONFTEST = """
    import pytest, torch
    from torch import nn

    torch.set_num_threads(1)
    VOCAB, NHID, BPTT, BSZ = 20, 8, 5, 4

    class RNNModel(nn.Module):
        def __init__(self):
            super().__init__()
            self.encoder = nn.Embedding(VOCAB, NHID)
            self.rnn = nn.LSTM(NHID, NHID)
            self.decoder = nn.Linear(NHID, VOCAB)

        def forward(self, input, hidden):
            output, hidden = self.rnn(self.encoder(input), hidden)
            return torch.log_softmax(self.decoder(output), dim=-1).view(-1, VOCAB), hidden

        def init_hidden(self, bsz):
            weight = next(self.parameters())
            return (weight.new_zeros(1, bsz, NHID), weight.new_zeros(1, bsz, NHID))

    def batchify(data, bsz):
        nbatch = data.size(0) // bsz
        return data[: nbatch * bsz].view(bsz, -1).t().contiguous()

    STREAM = torch.randint(0, VOCAB, (400,), generator=torch.Generator().manual_seed(0))
    TRAIN = batchify(STREAM, BSZ)
    BATCHES = [(TRAIN[i : i + BPTT], TRAIN[i + 1 : i + 1 + BPTT].reshape(-1)) for i in range(0, TRAIN.size(0) - 1 - BPTT, BPTT)]
    criterion = nn.NLLLoss()

    def repackage_hidden(h):
        return h.detach() if isinstance(h, torch.Tensor) else tuple(repackage_hidden(v) for v in h)

    def make():
        return {{"model": RNNModel(), "lr": {lr}}}

    def step(state, batch, index):
        data, targets = batch
        model = state["model"]
        if state.get("hidden") is None or index == 0:
            state["hidden"] = model.init_hidden(data.size(1))
        hidden = repackage_hidden(state["hidden"])
        {zero}
        output, state["hidden"] = model(data, hidden)
        loss = criterion(output, targets)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 0.25)
        for p in model.parameters():
            p.data.add_(p.grad, alpha={sign}state["lr"])
        return loss.item()

    def compute_loss(model, batch):
        data, targets = batch
        output, _ = model(data, model.init_hidden(data.size(1)))
        return criterion(output, targets)

{fixtures}
"""

CONFTEST = CONFTEST.replace(
    "{fixtures}",
    role_fixtures(
        make_training="make",
        dataloader="BATCHES",
        train_step="step",
        compute_loss="compute_loss",
    ),
)


def word_lm(lr: str = "20.0", zero: bool = True, sign: str = "-") -> str:
    return CONFTEST.format(lr=lr, zero="model.zero_grad()" if zero else "", sign=sign)


def flat(run) -> str:
    return " ".join(run.text.split())


def summary(run, cid: str) -> str:
    """The check's short-summary line (pass or skip text, with -rA)."""
    lines = [line for line in run.text.splitlines() if f"::{cid}_" in line and line.startswith(("PASSED", "SKIPPED"))]
    return " ".join(" ".join(lines).split())


def test_a_hand_written_sgd_step_is_judged_by_s1_s3_t9_and_t2(project):
    project.conftest(word_lm())
    run = project.run("--dlcheck=S1,S3,T9,T2,T6,T10", "-rA")
    text = flat(run)
    for cid in ("S1", "S3", "T9", "T2"):
        run.assert_outcome(cid, "passed")
    assert "finite gradient norms" not in text, text
    assert "no optimizer" not in text.replace("no optimizer object", ""), text
    # T6 and T10 say why they do not judge: no schedule object, no accumulation (every call updated the weights)
    run.assert_outcome("T6", "skipped")
    run.assert_outcome("T10", "skipped")
    assert "updates the weights itself" in text, text
    assert "every call of dlcheck_train_step changed the weights" in text, text


def test_s1_says_how_many_updates_the_step_made(project):
    project.conftest(word_lm())
    run = project.run("--dlcheck=S1", "-rA")
    text = flat(run)
    run.assert_outcome("S1", "passed")
    assert "gradient norm ≤" in text and "weights finite after 20 updates made by dlcheck_train_step itself" in text, (
        text
    )
    assert "after 20 optimizer steps" not in text, text


def test_a_hand_written_step_that_never_zeroes_fails_t9(project):
    project.conftest(word_lm(zero=False))
    run = project.run("--dlcheck=T9")
    run.assert_outcome("T9", "failed")
    text = tt.section(run, "T9")
    assert "still holding exactly the gradient" in text and "update" in text, text
    assert "zero_grad" in text, text


@pytest.mark.parametrize(("lr", "sign", "says"), [("0.0", "-", "does not move at all"), ("20.0", "+", "climbs")])
def test_a_hand_written_step_that_cannot_descend_fails_t2(project, lr, sign, says):
    project.conftest(word_lm(lr=lr, sign=sign))
    run = project.run("--dlcheck=T2")
    run.assert_outcome("T2", "failed")
    text = tt.section(run, "T2")
    assert says in text, text
    assert "no optimizer" not in text, text
