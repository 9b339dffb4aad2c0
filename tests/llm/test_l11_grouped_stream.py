"""L11 on run_clm-style pretraining data: texts tokenized, concatenated and cut into fixed-size blocks
(group_texts). Without an EOS appended to each text, the blocks hold no document boundary at all: with the
texts before grouping (dlcheck_documents) that fails, without them it skips naming the fixture (a single
continuous text needs no separator). With EOS appended, the EOS inside the blocks are judged: supervised
passes; masked by DataCollatorForLanguageModeling with pad == eos fails."""

import json

import pytest

PROJECT = """
    import pytest, tiny
    from itertools import chain
    from torch.utils.data import DataLoader
    from transformers import DataCollatorForLanguageModeling, default_data_collator

    ADD_EOS, PAD_IS_EOS, DOCUMENTS = {add_eos}, {pad_is_eos}, {documents}
    BLOCK = 16

    @pytest.fixture(scope="session")
    def dlcheck_tokenizer():
        return tiny.tokenizer(pad=tiny.EOS if PAD_IS_EOS else tiny.PAD)

    def grouped(tok):
        ids = [tok(t)["input_ids"] + ([tok.eos_token_id] if ADD_EOS else []) for t in tiny.texts(24)]
        stream = list(chain(*ids))
        n = len(stream) // BLOCK * BLOCK
        return [{{"input_ids": stream[i : i + BLOCK], "attention_mask": [1] * BLOCK, "labels": stream[i : i + BLOCK]}}
                for i in range(0, n, BLOCK)]

    @pytest.fixture(scope="session")
    def dlcheck_dataloader(dlcheck_tokenizer):
        rows = grouped(dlcheck_tokenizer)
        if PAD_IS_EOS:  # the classic: the LM collator masks every pad id, here every EOS
            collate = DataCollatorForLanguageModeling(dlcheck_tokenizer, mlm=False)
            rows = [{{k: v for k, v in r.items() if k != "labels"}} for r in rows]
        else:
            collate = default_data_collator
        return DataLoader(rows, batch_size=4, collate_fn=collate)

    if DOCUMENTS:
        @pytest.fixture(scope="session")
        def dlcheck_documents():
            return [{{"text": t}} for t in tiny.texts(24)]
"""


def _l11(project, tmp_path, **flags):
    project.conftest(PROJECT.format(**{"add_eos": False, "pad_is_eos": False, "documents": True, **flags}))
    out = tmp_path / "r.json"
    run = project.run("--dlcheck=L11", f"--dlcheck-json={out}", "--dlcheck-samples=16")
    (res,) = json.loads(out.read_text())["results"]
    return run, res


def test_blocks_without_any_separator_fail_when_the_texts_are_separate_documents(project, tmp_path):
    run, res = _l11(project, tmp_path)
    assert res["outcome"] == "failed", run.text
    text = " ".join(res["evidence"])
    assert "full 16-token blocks of one token stream" in text and "hold no stop token" in text
    assert "dlcheck_documents holds 24 separate texts" in text
    assert "group_texts" in res["cause"] and "tokenizer.eos_token" in res["fix"]


def test_without_the_documents_it_skips_naming_the_fixture(project, tmp_path):
    run, res = _l11(project, tmp_path, documents=False)
    assert res["outcome"] == "skipped", res
    assert "without a document separator" in res["reason"] and "dlcheck_documents" in res["reason"]


def test_blocks_with_eos_appended_pass_with_the_separators_counted(project, tmp_path):
    run, res = _l11(project, tmp_path, add_eos=True)
    assert res["outcome"] == "passed", run.text
    assert "stop tokens close documents inside" in res["evidence"][0] and "supervised" in res["evidence"][0]


@pytest.mark.parametrize("documents", [True, False])
def test_every_separator_masked_by_a_pad_eq_eos_collator_fails(project, tmp_path, documents):
    run, res = _l11(project, tmp_path, add_eos=True, pad_is_eos=True, documents=documents)
    assert res["outcome"] == "failed", run.text
    assert "stop tokens that close documents inside the sampled rows have label -100" in res["evidence"][0]
    assert "pad_token == eos_token" in res["cause"]
