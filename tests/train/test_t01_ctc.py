"""T1 on a CTC loss (transformers' examples/pytorch/speech-recognition/run_speech_recognition_ctc.py, found
blind in set 13): Wav2Vec2ForCTC's loss sums over the alignments of a (batch, label length) transcript with
(batch, frames, vocabulary) logits; the labels do not sit one per output position, so it is no cross-entropy
over classes and ln(vocabulary) is no reference for it (T1 had failed it: "initial loss 24.07 is 7.2 x
ln 28"). A per-position cross-entropy that starts confidently wrong still fails (test_t01_initial_loss.py)."""

import pytest

CTC = """
    import pytest, torch
    from transformers import Wav2Vec2Config, Wav2Vec2ForCTC

    VOCAB = 10  # pad (the CTC blank) 0, letters 1..9

    def batches(n=4, bsz=4, samples=400, label_len=6):
        g = torch.Generator().manual_seed(0)
        out = []
        for _ in range(n):
            labels = torch.randint(1, VOCAB, (bsz, label_len), generator=g)
            labels[1:, -2:] = -100  # padded transcripts, as DataCollatorCTCWithPadding makes them
            out.append({{
                "input_values": torch.randn(bsz, samples, generator=g),
                "attention_mask": torch.ones(bsz, samples, dtype=torch.long),
                "labels": labels,
            }})
        return out

    @pytest.fixture(scope="session")
    def dlcheck_model():
        torch.manual_seed(0)
        cfg = Wav2Vec2Config(
            vocab_size=VOCAB, hidden_size=16, num_hidden_layers=1, num_attention_heads=2, intermediate_size=32,
            conv_dim=(16, 16), conv_stride=(5, 2), conv_kernel=(10, 3), num_conv_pos_embeddings=16,
            num_conv_pos_embedding_groups=2, pad_token_id=0, ctc_loss_reduction="{reduction}",
            mask_time_prob=0.0, do_stable_layer_norm=True, feat_extract_norm="layer",
        )
        return Wav2Vec2ForCTC(cfg)

    @pytest.fixture(scope="session")
    def dlcheck_dataloader():
        return batches()
"""


@pytest.mark.parametrize("reduction", ["sum", "mean"])
def test_a_ctc_loss_is_not_a_cross_entropy_over_classes(project, reduction):
    project.conftest(CTC.format(reduction=reduction))
    run = project.run("--dlcheck=T1", "-rA")
    run.assert_outcome("T1", "skipped")
    text = " ".join(run.text.split())
    assert "not applicable" in text, run.text
    assert "labels (int64 (4, 6)) do not sit one per position of the output (4, 39, 10)" in text, run.text
    assert "a sequence loss over alignments (CTC)" in text and "ln(C) does not apply" in text, run.text
