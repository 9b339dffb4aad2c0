"""L11 on an encoder trained for extractive question answering: BERT's tokenizer has no EOS by design and the
model never generates, so L11 (an EOS the model must learn to stop on) is not applicable, decided from the model's
head in transformers' task mappings (BertForQuestionAnswering is a question-answering model). Before, the head was
in no mapping, the pipeline was taken for a causal LM, and L11 skipped with "the tokenizer has no eos_token_id; L3
owns a missing special token", blaming a token BERT rightly lacks (found blind on run_qa). A causal LM whose
tokenizer has no EOS keeps that outcome: it generates, and its missing EOS is L3's to report."""

import tiny  # noqa: F401 - the tiny tokenizer's BPE, trained once per process

PROJECT = """
    import pytest, tiny, torch
    from datasets import Dataset
    from transformers import (AutoModelForQuestionAnswering, BertConfig, DataCollatorForLanguageModeling,
                              DataCollatorWithPadding, Trainer)

    def no_eos_tokenizer():
        tok = tiny.tokenizer()
        tok.eos_token = None  # BERT's [CLS]/[SEP]/[PAD]/[MASK]: no end-of-sequence token
        assert tok.eos_token_id is None
        return tok

    @pytest.fixture(scope="session")
    def dlcheck_trainer(tmp_path_factory):
        tok = no_eos_tokenizer()
        args = tiny.trainer_args(tmp_path_factory.mktemp("o"))
        if {qa}:
            cfg = BertConfig(vocab_size=len(tok), hidden_size=32, num_hidden_layers=1, num_attention_heads=2,
                             intermediate_size=64, max_position_embeddings=64, pad_token_id=tok.pad_token_id)
            torch.manual_seed(0)
            model = AutoModelForQuestionAnswering.from_config(cfg)
            rows = [dict(tok(t), start_positions=1 + i % 3, end_positions=3 + i % 3)
                    for i, t in enumerate(tiny.texts(12))]
            collator = DataCollatorWithPadding(tok)
        else:
            model, rows = tiny.llama(tok), [dict(tok(t)) for t in tiny.texts(12)]
            collator = DataCollatorForLanguageModeling(tok, mlm=False)
        return Trainer(model=model, args=args, train_dataset=Dataset.from_list(rows), data_collator=collator,
                       processing_class=tok)
"""


def test_a_question_answering_encoder_without_eos_is_not_applicable(project):
    project.conftest(PROJECT.format(qa=True))
    run = project.run("--dlcheck=L11,L2,L13", "-rs")
    for cid in ("L11", "L2", "L13"):
        run.assert_outcome(cid, "skipped")
    text = " ".join(run.text.split())
    assert (
        "L11_eos_supervised: not applicable: the model (BertForQuestionAnswering) is a question-answering model (it "
        "predicts the start and end positions of an answer span); this check concerns models that generate" in text
    ), text[-3000:]
    assert "L3 owns a missing special token" not in text, text[-3000:]
    # L2/L13: the targets are start/end positions, not labels the model or trainer derives
    assert "L2_labels_masked: not applicable: the model (BertForQuestionAnswering)" in text, text[-3000:]
    assert "carry no labels" not in text, text[-3000:]


def test_a_causal_lm_whose_tokenizer_has_no_eos_still_sends_it_to_l3(project):
    project.conftest(PROJECT.format(qa=False))
    run = project.run("--dlcheck=L11", "-rs")
    run.assert_outcome("L11", "skipped")
    run.fnmatch(["*L11_eos_supervised: the tokenizer has no eos_token_id; L3 owns a missing special token*"])
