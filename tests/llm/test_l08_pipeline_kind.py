"""L8 decides applicability as its llm siblings do (checks.llm.common.pipeline_kind): with no raw examples to
read, a sequence classifier (no generative training reads its columns) is not applicable, like L2/L11 — not a
request for dlcheck_raw_dataset; a causal LM in the same layout still asks for the role that lets L8 run."""

import tiny  # noqa: F401 - the tiny tokenizer's BPE, trained once per process

PROJECT = """
    import pytest, tiny, torch
    from torch.utils.data import DataLoader
    from transformers import BertConfig, BertForSequenceClassification, DataCollatorWithPadding
    from transformers import DataCollatorForLanguageModeling

    @pytest.fixture(scope="session")
    def dlcheck_tokenizer():
        return tiny.tokenizer()

    @pytest.fixture(scope="session")
    def dlcheck_model(dlcheck_tokenizer):
        tok = dlcheck_tokenizer
        torch.manual_seed(0)
        if {classifier}:
            cfg = BertConfig(vocab_size=len(tok), hidden_size=32, num_hidden_layers=1, num_attention_heads=2,
                             intermediate_size=64, max_position_embeddings=128, pad_token_id=tok.pad_token_id,
                             num_labels=2)
            return BertForSequenceClassification(cfg)
        return tiny.llama(tok)

    @pytest.fixture(scope="session")
    def dlcheck_dataloader(dlcheck_tokenizer):
        tok = dlcheck_tokenizer
        if {classifier}:
            rows = [{{**tok(t), "labels": i % 2}} for i, t in enumerate(tiny.texts(12))]
            # a generator's rows: the loader's dataset cannot be read back as the raw examples
            return DataLoader(rows, batch_size=4, collate_fn=DataCollatorWithPadding(tok))
        return DataLoader(tiny.tokenized(tok), batch_size=4, collate_fn=DataCollatorForLanguageModeling(tok, mlm=False))
"""


def test_a_sequence_classifier_without_raw_examples_is_not_applicable(project):
    project.conftest(PROJECT.format(classifier=True))
    run = project.run("--dlcheck=L8,L11", "-rs")
    run.assert_outcome("L8", "skipped")
    run.fnmatch(
        [
            "*L8_schema: not applicable: the model (BertForSequenceClassification) is a sequence classifier; this "
            "check concerns the data schemas of generative training*"
        ]
    )
    assert "missing role" not in run.text


def test_a_causal_lm_without_raw_examples_misses_the_role(project):
    project.conftest(PROJECT.format(classifier=False))
    run = project.run("--dlcheck=L8", "-rs")
    run.assert_outcome("L8", "skipped")
    run.fnmatch(["*L8_schema: missing role: define fixture dlcheck_raw_dataset*"])
