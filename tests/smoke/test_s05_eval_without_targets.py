"""S5 on an eval set that carries no targets by the pipeline's design: transformers' run_qa.py builds its eval
features without start/end positions (prepare_validation_features; the answers are scored from the
post-processed predictions), so the model computes no eval loss. S5 says it is not judged (no eval loss), not an
internal error from Trainer.compute_loss ("The model did not return a loss ... start_logits,end_logits"), found
blind on run_qa. The same pipeline with the positions in its eval features is judged, and passes."""

import tiny  # noqa: F401 - the tiny tokenizer's BPE, trained once per process

QA = """
    import pytest, tiny, torch
    from datasets import Dataset
    from transformers import AutoModelForQuestionAnswering, BertConfig, DataCollatorWithPadding, Trainer

    def features(tok, n, positions, seed=0):
        rows = []
        for i, t in enumerate(tiny.texts(n)):
            enc = tok(t)
            if positions:
                enc["start_positions"] = 1 + (i + seed) % 3
                enc["end_positions"] = 3 + (i + seed) % 3
            rows.append(dict(enc))
        return Dataset.from_list(rows)

    @pytest.fixture(scope="session")
    def dlcheck_trainer(tmp_path_factory):
        tok = tiny.tokenizer()
        cfg = BertConfig(vocab_size=len(tok), hidden_size=32, num_hidden_layers=1, num_attention_heads=2,
                         intermediate_size=64, max_position_embeddings=64, pad_token_id=tok.pad_token_id)
        torch.manual_seed(0)
        model = AutoModelForQuestionAnswering.from_config(cfg)
        args = tiny.trainer_args(tmp_path_factory.mktemp("o"), learning_rate=1e-3, per_device_eval_batch_size=4)
        return Trainer(model=model, args=args, train_dataset=features(tok, 16, True),
                       eval_dataset=features(tok, 8, {eval_positions}, seed=1),
                       data_collator=DataCollatorWithPadding(tok), processing_class=tok)
"""


def test_qa_eval_features_without_answer_positions_are_not_judged(project):
    project.conftest(QA.format(eval_positions=False))
    run = project.run("--dlcheck=S5", "-rA")
    run.assert_outcome("S5", "skipped")
    text = " ".join(run.text.split())
    assert "internal error" not in text and "your role raised" not in text, text[-3000:]
    assert (
        "not judged: no eval loss: the eval batches hold no targets the model computes a loss from (the training "
        "batches carry end_positions, start_positions; the eval batches do not" in text
    ), text[-3000:]


def test_qa_eval_features_with_answer_positions_are_judged(project):
    project.conftest(QA.format(eval_positions=True))
    run = project.run("--dlcheck=S5", "-rA")
    run.assert_outcome("S5", "passed")
    assert "after " in run.text and "eval loss" in run.text, run.text[-3000:]
