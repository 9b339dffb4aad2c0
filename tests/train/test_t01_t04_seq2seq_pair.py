"""T1 and T4 on a sequence-to-sequence loop whose batches are (source, target) pairs of int64 token tensors,
sequence-first, and whose loss builds the model's other inputs (masks) itself: pytorch/examples'
language_translation (Translator.forward(src, trg, src_mask, tgt_mask, ...), found blind, set 15). T1 skipped
saying the batch was 'not an (inputs, targets) pair' (it is one), and T4 said 'not applicable: ... the model is
called by your loss, not on the batch' where the loss does call it on the batch's source tensor and cross-example
leakage concerns the pipeline: it is not judged. Both texts now say what was seen. The twin: the same model handed
over without a loss of the user's (nothing to learn its inputs from) stays 'not applicable' for T4, as its page
says."""

SEQ2SEQ = """
    import pytest, torch
    from torch import nn
    from torch.nn import functional as F

    V, S, B = 12, 6, 8

    class Translator(nn.Module):
        def __init__(self):
            super().__init__()
            self.src_emb, self.tgt_emb = nn.Embedding(V, 16), nn.Embedding(V, 16)
            self.transformer = nn.Transformer(16, 2, 1, 1, 32, dropout=0.0)
            self.out = nn.Linear(16, V)

        def forward(self, src, trg, src_mask, tgt_mask):
            return self.out(self.transformer(self.src_emb(src), self.tgt_emb(trg), src_mask, tgt_mask))

    @pytest.fixture(scope="session")
    def dlcheck_make_training():
        def make():
            torch.manual_seed(0)
            model = Translator()
            return {{"model": model, "optimizer": torch.optim.Adam(model.parameters(), lr=1e-3)}}
        return make

    @pytest.fixture(scope="session")
    def dlcheck_dataloader():
        g = torch.Generator().manual_seed(0)
        pairs = [(torch.randint(0, V, (S,), generator=g), torch.randint(0, V, (S + 1,), generator=g)) for _ in range(32)]
        # sequence-first batches, as pad_sequence(batch_first=False) gives them
        collate = lambda rows: (torch.stack([r[0] for r in rows], 1), torch.stack([r[1] for r in rows], 1))
        return torch.utils.data.DataLoader(pairs, batch_size=B, collate_fn=collate)

    {loss}
"""

LOSS = """
    @pytest.fixture(scope="session")
    def dlcheck_compute_loss():
        def compute_loss(model, batch):
            src, tgt = batch
            tgt_in = tgt[:-1]
            src_mask = torch.zeros(src.shape[0], src.shape[0], dtype=torch.bool)
            tgt_mask = nn.Transformer.generate_square_subsequent_mask(tgt_in.shape[0])
            logits = model(src, tgt_in, src_mask, tgt_mask)
            return F.cross_entropy(logits.reshape(-1, V), tgt[1:].reshape(-1))
        return compute_loss
"""


def test_a_pair_whose_model_takes_more_inputs_says_so(project):
    project.conftest(SEQ2SEQ.format(loss=LOSS))
    run = project.run("--dlcheck=T1,T4", "-rA")
    run.assert_outcome("T1", "skipped")
    run.assert_outcome("T4", "skipped")
    text = " ".join(run.text.split())
    assert "not an (inputs, targets) pair" not in text, text[-4000:]
    assert "the batch is a pair (int64 (6, 8), int64 (7, 8)) and Translator.forward takes 4 inputs" in text, text[
        -4000:
    ]
    assert "not applicable" not in text, text[-4000:]
    assert "T4_batch_independence: not judged: Translator.forward takes 4 inputs and the batches hold 2 elements" in (
        text
    ), text[-4000:]


def test_without_a_loss_of_the_users_t4_is_not_applicable(project):
    project.conftest(SEQ2SEQ.format(loss=""))
    run = project.run("--dlcheck=T4", "-rA")
    run.assert_outcome("T4", "skipped")
    assert "T4_batch_independence: not applicable: Translator.forward takes 4 inputs" in " ".join(run.text.split())
