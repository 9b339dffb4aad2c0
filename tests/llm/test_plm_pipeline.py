"""L11 and L13 on a permutation-LM Trainer (transformers' run_plm.py, found blind, set 16): a tiny XLNetLMHeadModel,
DataCollatorForPermutationLanguageModeling over group_texts blocks whose texts each end with ``<sep><cls>``.

L11: the collator's objective never targets a special token (like a masked LM's), so the EOS is not a target to learn:
not applicable, decided from the collator although XLNetLMHeadModel also sits in the causal-LM mapping (it had failed
'no separator between documents'). The same model with a causal collator is still judged and fails without EOS.

L13: the collator's random spans leave some rows no target on one draw (spans that fall past the row or on special
tokens); collated again they get targets: not truncation (it had failed '1 of 256 ... no supervised token'). Rows that
truncation cut to their special tokens get no target on any draw and still fail."""

import json

PROJECT = """
    import pytest, tiny, tiny_plm
    from datasets import Dataset
    from transformers import DataCollatorForLanguageModeling, DataCollatorForPermutationLanguageModeling, Trainer

    COLLATOR, TRUNCATE = {collator!r}, {truncate}

    @pytest.fixture(scope="session")
    def dlcheck_trainer(tmp_path_factory):
        tok = tiny_plm.tokenizer()
        if TRUNCATE:  # max_length shorter than a text: truncation keeps only the <sep><cls> the tokenizer appends
            rows = [tok(t, truncation=True, max_length=TRUNCATE) for t in tiny_plm.texts(48)]
        else:
            rows = tiny_plm.blocks(tok, 48)
        if COLLATOR == "plm":
            collate = DataCollatorForPermutationLanguageModeling(tok, plm_probability=1 / 6, max_span_length=5)
        else:
            tok.pad_token = tok.eos_token
            collate = DataCollatorForLanguageModeling(tok, mlm=False)
        args = tiny.trainer_args(tmp_path_factory.mktemp("o"))
        return Trainer(model=tiny_plm.model(tok), args=args, train_dataset=Dataset.from_list(rows),
                       data_collator=collate, processing_class=tok)

    @pytest.fixture(scope="session")
    def dlcheck_documents():
        return [{{"text": t}} for t in tiny_plm.texts(48)]
"""


def _run(project, tmp_path, ids, collator="plm", truncate=0):
    project.conftest(PROJECT.format(collator=collator, truncate=truncate))
    out = tmp_path / "r.json"
    run = project.run(f"--dlcheck={ids}", f"--dlcheck-json={out}", "-rA")
    return run, {r["id"]: r for r in json.loads(out.read_text())["results"]}


def test_permutation_lm_is_judged_by_its_collator(project, tmp_path):
    run, res = _run(project, tmp_path, "L11,L13")
    assert res["L11"]["outcome"] == "not_applicable", run.text
    assert "permutation LM" in run.text, run.text
    assert res["L13"]["outcome"] == "passed", run.text
    text = " ".join(run.text.split())
    assert "get targets when the same rows are collated again" in text, text


def test_the_same_model_with_a_causal_collator_still_fails_l11(project, tmp_path):
    run, res = _run(project, tmp_path, "L11", collator="clm")
    assert res["L11"]["outcome"] == "failed", run.text


def test_rows_truncated_to_their_special_tokens_still_fail_l13(project, tmp_path):
    run, res = _run(project, tmp_path, "L13", truncate=2)
    assert res["L13"]["outcome"] == "failed", run.text
    assert "no supervised token" in run.text, run.text
