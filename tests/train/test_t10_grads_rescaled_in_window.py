"""T10: a step that rescales the accumulated .grad inside the accumulation window (transformers'
run_wav2vec2_pretraining_no_trainer: ``multiply_grads(model.parameters(), 1 / num_losses)`` after every micro-step's
backward) shrinks what the earlier micro-batches added at every later micro-step: the optimizer steps on (almost)
the last micro-batch's gradient alone. No known candidate (full batch, sum, plain mean) matches it; T10 measures each
micro-batch's share of the stepped gradient and the rescaling itself."""

import pytest
import tiny_train as tt

# the summed loss divided by k, then .grad divided by the micro-batch's count: at every call (buggy), or once, at
# the optimizer step (correct: equal micro-batches, so the full batch's gradient)
STEP = """
    def multiply_grads(params, c):
        for p in params:
            if p.grad is not None:
                p.grad.data.mul_(c)

    @pytest.fixture(scope="session")
    def dlcheck_train_step():
        def step(state, batch, i):
            model, opt = state["model"], state["optimizer"]
            x, y = batch
            {draw}
            loss = nn.functional.cross_entropy(model(x), y, reduction="sum") / 4
            loss.backward()
            {every}
            if (i + 1) % 4 == 0:
                {at_step}
                opt.step()
                opt.zero_grad()
            return loss.detach()
        return step
"""

EVERY = "multiply_grads(model.parameters(), 1 / len(y))"


def project_source(every: bool, model: str = "tt.MLP()", draw: str = "pass") -> str:
    return tt.loop_project(
        model=model,
        extra=STEP.format(every=EVERY if every else "pass", at_step="pass" if every else EVERY, draw=draw),
    )


def test_grads_rescaled_at_every_micro_step_fail(project):
    project.conftest(project_source(every=True))
    run = project.run("--dlcheck=T10")
    run.assert_outcome("T10", "failed")
    text = tt.section(run, "T10")
    assert "closes an accumulation of k=4 micro-batches" in text
    assert "relative error to the full-batch gradient" in text
    assert "norm ratio" in text and "cosine" in text
    # each micro-batch's share of the stepped gradient, measured (the last: its whole share; the earlier: shrunk)
    assert "each micro-batch's share of the stepped gradient" in text
    assert "micro-batch 4 counts 1x" in text
    # the rescaling itself, seen on the objects between the backward and the next micro-batch
    assert "multiplied .grad of every parameter by 0.125 (1/8) after the backward" in text
    assert "the same batches in both runs" in text
    assert "rescales the accumulated .grad inside the accumulation window" in text
    assert "once, at the optimizer step" in text


@pytest.mark.parametrize(
    "twin",
    [
        pytest.param(project_source(every=False), id="rescaled-once-at-the-step"),
        pytest.param(
            project_source(every=True)
            .replace('reduction="sum") / 4', 'reduction="sum") / len(y) / 4')
            .replace(EVERY + "\n", "pass\n"),
            id="loss-divided-before-backward",
        ),
    ],
)
def test_the_correct_twins_pass(project, twin):
    assert twin.count(EVERY) <= 1
    project.conftest(twin)
    run = project.run("--dlcheck=T10", "-rA")
    run.assert_outcome("T10", "passed")
    assert "matches the full-batch gradient" in " ".join(run.text.split())


def test_only_the_last_micro_batch_counts_when_grads_are_zeroed_inside_the_window(project):
    source = project_source(every=False).replace("loss.backward()", "opt.zero_grad()\n            loss.backward()", 1)
    project.conftest(source)
    run = project.run("--dlcheck=T10")
    run.assert_outcome("T10", "failed")
    text = tt.section(run, "T10")
    assert "micro-batch 4 counts 1x" in text
    assert "zeroed .grad of every parameter before the backward" in text
    assert "zeroes the accumulated .grad inside the accumulation window" in text


def test_a_loss_drawing_its_own_numbers_out_of_step_is_not_conclusive(project):
    """The model adds noise in its forward (not dropout) and the step draws once more before it: the step and
    dlcheck's reference do not see the same draws, so an unmatched gradient proves nothing: skipped, saying so."""
    model = "NoisyMLP()"
    source = project_source(every=True, model=model, draw="torch.rand(1)")
    source = source.replace(
        "from torch import nn",
        "from torch import nn\n\n    class NoisyMLP(tt.MLP):\n        def forward(self, x):\n"
        "            return super().forward(x + torch.randn_like(x))\n",
        1,
    )
    project.conftest(source)
    run = project.run("--dlcheck=T10", "-rs")
    run.assert_outcome("T10", "skipped")
    text = " ".join(run.text.split())
    assert "not conclusive" in text
    assert "between two seeds" in text


W2V2 = """
    import pytest, torch, numpy as np
    from accelerate import Accelerator
    from torch.utils.data import DataLoader
    from transformers import Wav2Vec2Config, Wav2Vec2ForPreTraining
    from transformers.models.wav2vec2.modeling_wav2vec2 import _compute_mask_indices, _sample_negative_indices

    K = 4
    CFG = Wav2Vec2Config(
        hidden_size=16, num_hidden_layers=1, num_attention_heads=2, intermediate_size=32, conv_dim=(8, 8),
        conv_stride=(5, 4), conv_kernel=(10, 4), num_feat_extract_layers=2, num_conv_pos_embeddings=8,
        num_conv_pos_embedding_groups=2, do_stable_layer_norm=True, feat_extract_norm="layer",
        num_codevector_groups=2, num_codevectors_per_group=8, codevector_dim=8, proj_codevector_dim=8,
        mask_time_prob=0.65, mask_time_length=4, num_negatives=10, layerdrop=0.0)

    def collate(rows):
        # the script's collator: random masked time steps and negatives drawn per batch (numpy)
        x = torch.stack(rows)
        shape = (x.shape[0], int(MODEL._get_feat_extract_output_lengths(x.shape[-1])))
        mask = _compute_mask_indices(shape, CFG.mask_time_prob, CFG.mask_time_length)
        neg = _sample_negative_indices(shape, CFG.num_negatives, mask_time_indices=mask)
        return {"input_values": x, "mask_time_indices": torch.tensor(mask, dtype=torch.long),
                "sampled_negative_indices": torch.tensor(neg, dtype=torch.long)}

    torch.manual_seed(0)
    MODEL = Wav2Vec2ForPreTraining(CFG)
    DATA = [torch.randn(400) for _ in range(32)]

    def multiply_grads(params, c):
        for p in params:
            if p.grad is not None:
                p.grad.data.mul_(c)

    @pytest.fixture(scope="session")
    def dlcheck_make_training():
        def make():
            torch.manual_seed(0)
            acc = Accelerator(cpu=True)
            model = Wav2Vec2ForPreTraining(CFG)
            model, opt = acc.prepare(model, torch.optim.AdamW(model.parameters(), lr=1e-3))
            return {"accelerator": acc, "model": model, "optimizer": opt}
        return make

    @pytest.fixture(scope="session")
    def dlcheck_dataloader():
        np.random.seed(0)
        return DataLoader(DATA, batch_size=2, collate_fn=collate)

    @pytest.fixture(scope="session")
    def dlcheck_compute_loss():
        def compute_loss(model, batch):
            return model(**batch).loss / batch["mask_time_indices"].sum()
        return compute_loss

    @pytest.fixture(scope="session")
    def dlcheck_train_step():
        def step(state, batch, i):
            acc, model, opt = state["accelerator"], state["model"], state["optimizer"]
            num_losses = batch["mask_time_indices"].sum()
            loss = model(**batch).loss / K
            acc.backward(loss)
            {rescale}
            if (i + 1) % K == 0:
                {at_step}
                opt.step()
                opt.zero_grad()
            return loss.detach()
        return step
"""


def test_the_wav2vec2_pretraining_pattern_fails_and_its_twin_passes(project):
    """The script's own step on a tiny Wav2Vec2ForPreTraining (gumbel quantizer, collator masks drawn with numpy)."""
    every = "multiply_grads(model.parameters(), 1 / num_losses)"
    project.conftest(W2V2.replace("{rescale}", every).replace("{at_step}", "pass"))
    run = project.run("--dlcheck=T10")
    run.assert_outcome("T10", "failed")
    text = tt.section(run, "T10")
    assert "micro-batch 4 counts 1x" in text
    assert "rescales the accumulated .grad inside the accumulation window" in text
    # the twin: the loss divided by its own count before the backward, .grad left alone inside the window
    project.conftest(
        W2V2.replace("{rescale}", "pass").replace("{at_step}", "pass").replace("loss / K", "loss / num_losses / K")
    )
    run = project.run("--dlcheck=T10", "-rA")
    run.assert_outcome("T10", "passed")
