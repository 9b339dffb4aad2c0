"""T10 on (inputs, targets) token batches whose ignored targets are -1 (a loss with ignore_index=-1, nanochat's
chat_sft): a target below 0 is never a class id of a cross-entropy, so it is read as ignored and the full-batch
reference is the mean over the supervised targets of all k micro-batches. T10 had weighted these micro-batches by
their examples, so a per-micro-batch token mean divided by k passed as "the full-batch gradient" (found blind,
set 16)."""

import tiny_train as tt

# micro-batches of two sequences of 16 targets: supervised 2 per row in micro-batches 1 and 3, all 16 in 2 and 4
SFT = """
    import pytest, torch
    from torch import nn
    from torch.utils.data import DataLoader, TensorDataset

    ACCUM = 4
    V, T = 32, 16

    class TinyLM(nn.Module):
        def __init__(self):
            super().__init__()
            self.emb = nn.Embedding(V, 16)
            self.mix = nn.Linear(16, 16)
            self.head = nn.Linear(16, V)

        def forward(self, idx, targets=None, loss_reduction="mean"):
            logits = self.head(torch.tanh(self.mix(self.emb(idx))))
            if targets is None:
                return logits
            return nn.functional.cross_entropy(
                logits.view(-1, V), targets.view(-1), ignore_index=-1, reduction=loss_reduction)

    def data():
        g = torch.Generator().manual_seed(0)
        seq = torch.randint(0, V, (16, T + 1), generator=g)
        x, y = seq[:, :-1].clone(), seq[:, 1:].clone()
        for row in range(16):
            if (row // 2) % 2 == 0:
                y[row, : T - 2] = -1  # the prompt: only the last two targets trained
        return TensorDataset(x, y)

    @pytest.fixture(scope="session")
    def dlcheck_make_training():
        def make():
            model = TinyLM()
            return {"model": model, "optimizer": torch.optim.SGD(model.parameters(), lr=1e-2)}
        return make

    @pytest.fixture(scope="session")
    def dlcheck_dataloader():
        return DataLoader(data(), batch_size=2)

    @pytest.fixture(scope="session")
    def dlcheck_compute_loss():
        def compute_loss(model, batch):
            x, y = batch
            return model(x, y)
        return compute_loss

    @pytest.fixture(scope="session")
    def dlcheck_train_step():
{step}
        return step
"""

# each micro-batch's own mean over its supervised targets, divided by k
PER_MICRO_BATCH_MEAN = """
        def step(state, batch, i):
            model, opt = state["model"], state["optimizer"]
            x, y = batch
            loss = model(x, y) / ACCUM
            loss.backward()
            if (i + 1) % ACCUM == 0:
                opt.step()
                opt.zero_grad(set_to_none=True)
            return loss.detach()
"""

# the k micro-batches kept first; the sum over supervised targets divided by their count over the window
TOKEN_SUM = """
        def step(state, batch, i):
            model, opt = state["model"], state["optimizer"]
            micro = state.setdefault("micro", [])
            micro.append(batch)
            if (i + 1) % ACCUM:
                return None
            count = sum(int((y >= 0).sum()) for _, y in micro)
            for x, y in micro:
                (model(x, y, loss_reduction="sum") / count).backward()
            opt.step()
            opt.zero_grad(set_to_none=True)
            micro.clear()
"""


def test_a_per_micro_batch_mean_over_targets_ignored_at_minus_1_fails(project):
    project.conftest(SFT.replace("{step}", PER_MICRO_BATCH_MEAN))
    run = project.run("--dlcheck=T10")
    run.assert_outcome("T10", "failed")
    text = tt.section(run, "T10")
    assert "closes an accumulation of k=4 micro-batches" in text
    assert "supervised tokens per micro-batch: 4, 32, 4, 32 (72 in all)" in text, text
    assert "targets below 0 (-1) read as ignored" in text, text
    assert "the plain mean of the 4 micro-batch token-mean gradients" in text
    assert "the 4 tokens of micro-batch 1 weigh 1/4 of the step instead of 4/72" in text
    assert "(targets != -1).sum()" in text, text


def test_a_token_sum_over_the_window_with_targets_ignored_at_minus_1_passes(project):
    project.conftest(SFT.replace("{step}", TOKEN_SUM))
    run = project.run("--dlcheck=T10", "-rA")
    run.assert_outcome("T10", "passed")
    text = " ".join(run.text.split())
    assert "supervised tokens per micro-batch: 4, 32, 4, 32 (72 in all)" in text, text
    assert "matches the full-batch gradient (sum of token losses / 72 supervised tokens of the 4 micro-batches" in text
    assert "a per-micro-batch token mean by" in text
