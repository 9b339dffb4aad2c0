"""The llm checks on pipelines that are not causal LMs: a sequence classifier, a token classifier, a masked LM.
What the pipeline trains is decided once from its objects (checks.llm.common.pipeline_kind: the model's head in
transformers' task mappings, else the collator, else the labels' shape); each check concerns the kinds it names.
Their causal-LM twins, buggy, still fail."""

import json

import pytest
import tiny
import torch

# imported here, before pytester snapshots sys.modules, so the in-process runs share them
import transformers.trainer  # noqa: F401,E402
import transformers.trainer_pt_utils  # noqa: F401,E402
from helpers import flat
from transformers import (  # noqa: F401,E402
    BertForMaskedLM,
    BertForSequenceClassification,
    BertForTokenClassification,
    DataCollatorForLanguageModeling,
    DataCollatorForTokenClassification,
    DataCollatorWithPadding,
    Trainer,
)

import pytest_dlcheck.checks.llm.common  # noqa: F401,E402
import pytest_dlcheck.checks.llm.eval_metric  # noqa: F401,E402

BERT = """
import pytest, tiny, torch
from transformers import (BertConfig, BertForMaskedLM, BertForSequenceClassification, BertForTokenClassification,
                          DataCollatorForLanguageModeling, DataCollatorForTokenClassification, DataCollatorWithPadding,
                          Trainer)


def bert(cls, tok, **kw):
    cfg = BertConfig(vocab_size=len(tok), hidden_size=32, num_hidden_layers=2, num_attention_heads=2,
                     intermediate_size=64, max_position_embeddings=128, pad_token_id=tok.pad_token_id,
                     initializer_range=0.2, **kw)  # weights large enough that reading a pad moves the logits
    torch.manual_seed(0)
    return cls(cfg)


def pairs(tok, n=12):
    return [{{**tok(t), "label": i % 2}} for i, t in enumerate(tiny.texts(n))]


def tagged(tok, n=12):
    out = []
    for i, t in enumerate(tiny.texts(n)):
        enc = tok(t)
        out.append({{**enc, "labels": [(i + j) % 3 for j in range(len(enc["input_ids"]))]}})
    return out


def masked_metric(p):
    import numpy as np
    logits, labels = p.predictions, p.label_ids
    m = logits.max(-1, keepdims=True)
    logp = logits - m - np.log(np.exp(logits - m).sum(-1, keepdims=True))
    {metric}
    nll = -np.take_along_axis(logp, np.maximum(labels, 0)[..., None], -1)[..., 0]
    keep = labels != -100
    return {{"loss": float(nll[keep].mean())}}


@pytest.fixture(scope="session")
def dlcheck_trainer(tmp_path_factory):
    tok = tiny.tokenizer(padding_side="{side}")
    tok.mask_token = tiny.END  # a mask token for the masked LM, none added
    args = tiny.trainer_args(tmp_path_factory.mktemp("out"), per_device_eval_batch_size=4)
    {build}
"""

SEQUENCE = """model, collator, data = bert(BertForSequenceClassification, tok, num_labels=2), DataCollatorWithPadding(tok), pairs(tok)
    return Trainer(model=model, args=args, data_collator=collator, train_dataset=data, eval_dataset=data,
                   processing_class=tok)"""

TOKENS = """model, collator, data = bert(BertForTokenClassification, tok, num_labels=3), DataCollatorForTokenClassification(tok), tagged(tok)
    return Trainer(model=model, args=args, data_collator=collator, train_dataset=data, eval_dataset=data,
                   processing_class=tok)"""

MASKED = """model, data = bert(BertForMaskedLM, tok), tiny.tokenized(tok)
    collator = DataCollatorForLanguageModeling(tok, mlm=True, mlm_probability=0.3)
    return Trainer(model=model, args=args, data_collator=collator, train_dataset=data, eval_dataset=data,
                   processing_class=tok, compute_metrics=masked_metric)"""

#: run_swag's pipeline: BertForMultipleChoice, each example's 4 (context, ending) pairs tokenized and kept as 4
#: lists of ids (ragged before collation), a collator that flattens them, pads and unflattens to (batch, 4, L)
CHOICES = """from transformers import BertForMultipleChoice
    def choices(n=12):
        texts = tiny.texts(n + 3)
        return [{**{k: [tok(texts[i], texts[i + j])[k] for j in range(4)] for k in ("input_ids", "attention_mask")},
                  "label": i % 4} for i in range(n)]
    def collate(features):
        labels = torch.tensor([f["label"] for f in features])
        flat = [{k: v[j] for k, v in f.items() if k != "label"} for f in features for j in range(4)]
        batch = tok.pad(flat, return_tensors="pt")
        batch = {k: v.view(len(features), 4, -1) for k, v in batch.items()}
        batch["labels"] = labels
        return batch
    data = choices()
    return Trainer(model=bert(BertForMultipleChoice, tok), args=args, data_collator=collate, train_dataset=data,
                   eval_dataset=data, processing_class=tok)"""

# what a masked LM's metric must do: each position against its own label (no shift)
ALIGNED = "pass"
# the causal-LM habit on a masked LM: logits[t] scored against labels[t+1]
SHIFTED = "logp, labels = logp[:, :-1], labels[:, 1:]"


def _project(project, build: str, side: str = "right", metric: str = ALIGNED) -> None:
    project.conftest(BERT.format(build=build, side=side, metric=metric))


def _report(project, run_args: list[str]) -> tuple[object, dict[str, dict]]:
    path = project.pytester.path / "report.json"
    run = project.run(*run_args, f"--dlcheck-json={path}")
    results = {r["id"]: r for r in json.loads(path.read_text())["results"]}
    return run, results


NOT_FOR_CLASSIFIERS = ("L2", "L4", "L6", "L7", "L8", "L11", "L12", "L13")


def test_sequence_classifier_llm_checks_judge_the_token_side_and_leave_the_rest(project):
    # BertForSequenceClassification with DataCollatorWithPadding: labels are one class id per sequence, shape (batch,)
    _project(project, SEQUENCE)
    run, results = _report(project, ["--dlcheck=llm", "-rA"])
    assert "internal error" not in run.text and "fields of different shapes" not in run.text
    assert not [cid for cid, r in results.items() if r["outcome"] in ("error", "failed")], run.text
    for cid in NOT_FOR_CLASSIFIERS:
        run.assert_outcome(cid, "skipped")
        assert (
            "not applicable: the model (BertForSequenceClassification) is a sequence classifier"
            in (results[cid]["reason"])
        ), results[cid]
    for cid in ("L1", "L3", "L5", "L14"):
        run.assert_outcome(cid, "passed")
        assert not results[cid].get("not_judged"), results[cid]
    run.fnmatch(["*training: * padded examples (* right-padded) lose as alone*loss against the sequence's own label*"])


def test_left_padded_sequence_classifier_with_absolute_positions_fails_l1(project):
    # BertForSequenceClassification pools the row's first position ([CLS]): left-padded, that is a pad, and
    # position_ids from the mask do not help
    _project(project, SEQUENCE, side="left")
    run = project.run("--dlcheck=L1")
    run.assert_outcome("L1", "failed")
    text = flat(run.section("L1"))
    assert (
        "left-padded sampled examples have another loss in the batch than alone (loss against the sequence's own"
        in text
    )
    assert "the model reads a fixed position of the row (BERT-style pooling of the first token, [CLS]" in text
    assert "tokenizer.padding_side = 'right'" in text


def test_token_classifier_no_internal_error_and_no_prompt_parts(project):
    # BertForTokenClassification: L7 called its loss_function with causal-LM arguments (TypeError); L2/L13 left a
    # prompt / completion part "not judged" that token classification does not have
    _project(project, TOKENS)
    run, results = _report(project, ["--dlcheck=llm", "-rA"])
    assert "internal error" not in run.text
    assert not [cid for cid, r in results.items() if r["outcome"] in ("error", "failed")], run.text
    for cid in ("L6", "L7", "L8", "L11", "L12", "L4"):
        run.assert_outcome(cid, "skipped")
        assert "not applicable: the model (BertForTokenClassification) is a token classifier" in results[cid]["reason"]
    for cid in ("L2", "L13", "L1", "L14", "L5"):
        run.assert_outcome(cid, "passed")
        assert not results[cid].get("not_judged"), results[cid]
    run.fnmatch(["*padding: 0 of * sampled rows supervise any of their * padding positions*"])


@pytest.mark.parametrize("metric, outcome", [(ALIGNED, "passed"), (SHIFTED, "failed")])
def test_masked_lm_eval_loss_lines_each_position_up_with_its_own_label(project, metric, outcome):
    # BertForMaskedLM's loss (ForMaskedLMLoss) scores logits[t] against labels[t]: L7 shifted as for a causal LM
    # and failed the correct eval_loss; a metric that shifts is the slip on a masked LM
    _project(project, MASKED, metric=metric)
    run = project.run("--dlcheck=L7", "-rA")
    run.assert_outcome("L7", outcome)
    if outcome == "passed":
        assert "compute_metrics()['loss'] = " in run.text
        assert (
            "the model's own loss (model.loss_function: the Trainer's eval_loss) equals the supervised-token NLL"
            in (run.text)
        )
        return
    text = flat(run.section("L7"))
    assert "compute_metrics()['loss'] =" in text
    assert "supervised positions (the model (BertForMaskedLM) is a masked LM)" in text
    assert "scores logits[t] against labels[t+1] as for a causal LM" in text
    assert "logits[t] against labels[t] (no shift for a masked LM)" in text


def test_masked_lm_is_not_concerned_by_generation_checks(project):
    # examples of different lengths, padded by DataCollatorForLanguageModeling: L2 judges the padding, L13 the
    # supervision kept; neither has a prompt or completion part left unjudged
    _project(project, MASKED)
    run, results = _report(project, ["--dlcheck=L2,L4,L8,L11,L12,L13"])
    for cid in ("L4", "L8", "L11", "L12"):
        run.assert_outcome(cid, "skipped")
        assert "not applicable: the model (BertForMaskedLM) is a masked LM" in results[cid]["reason"], results[cid]
    for cid in ("L2", "L13"):
        run.assert_outcome(cid, "passed")
        assert not results[cid].get("not_judged"), results[cid]
    assert (
        "prompt: none to judge, the model (BertForMaskedLM) is a masked LM (no prompt in its labels)"
        in results["L2"]["evidence"]
    )


GROUPED = """model, data = bert(BertForMaskedLM, tok), [{"input_ids": list(range(10, 26))} for _ in range(12)]
    collator = DataCollatorForLanguageModeling(tok, mlm=True, mlm_probability=0.3)
    return Trainer(model=model, args=args, data_collator=collator, train_dataset=data, processing_class=tok)"""


def test_masked_lm_blocks_without_padding_leave_l2_nothing_to_judge(project):
    # run_mlm's group_texts blocks: no padding, no prompt: L2 passed on 0 padding positions before
    _project(project, GROUPED)
    run, results = _report(project, ["--dlcheck=L2"])
    run.assert_outcome("L2", "skipped")
    assert (
        "not applicable: the model (BertForMaskedLM) is a masked LM, whose labels hold no prompt, and the 8 sampled rows"
        in (results["L2"]["reason"])
    ), results["L2"]


CAUSAL_UNMASKED = """
import pytest, tiny, torch


def copy_ids(features):
    # pads on the right and copies input_ids into labels: the padding is supervised (pad != eos)
    tok = tiny.tokenizer()
    batch = tok.pad([{"input_ids": f["input_ids"]} for f in features], return_tensors="pt")
    batch["labels"] = batch["input_ids"].clone()
    return batch


@pytest.fixture(scope="session")
def dlcheck_tokenizer():
    return tiny.tokenizer()


@pytest.fixture(scope="session")
def dlcheck_model(dlcheck_tokenizer):
    return tiny.llama(dlcheck_tokenizer)


@pytest.fixture(scope="session")
def dlcheck_collator():
    return copy_ids


@pytest.fixture(scope="session")
def dlcheck_dataset(dlcheck_tokenizer):
    return tiny.tokenized(dlcheck_tokenizer)
"""


def test_causal_twin_that_supervises_padding_still_fails(project):
    # the same decision on a causal LM: its checks concern it, and L2 fails on the supervised padding
    project.conftest(CAUSAL_UNMASKED)
    run = project.run("--dlcheck=L2")
    run.assert_outcome("L2", "failed")
    text = flat(run.section("L2"))
    assert "padding" in text and "not applicable" not in text


def test_kind_from_objects_without_a_model(project):
    # no model: a bare dataloader whose labels are one per sequence is a sequence classifier's
    project.conftest(
        """
import pytest, tiny, torch
from transformers import DataCollatorWithPadding

@pytest.fixture(scope="session")
def dlcheck_tokenizer():
    return tiny.tokenizer()

@pytest.fixture(scope="session")
def dlcheck_dataloader(dlcheck_tokenizer):
    data = [{**dlcheck_tokenizer(t), "label": i % 2} for i, t in enumerate(tiny.texts(8))]
    return torch.utils.data.DataLoader(data, batch_size=4, collate_fn=DataCollatorWithPadding(dlcheck_tokenizer))
"""
    )
    run, results = _report(project, ["--dlcheck=L2,L11,L13,L14"])
    for cid in ("L2", "L11", "L13"):
        assert (
            "not applicable: the batches' labels are one per sequence (shape (4,) beside input_ids (4,"
            in (results[cid]["reason"])
        ), results[cid]
    run.assert_outcome("L14", "passed")


def test_pipeline_kind_from_the_model_head():
    from pytest_dlcheck.checks.shared import lm

    tok = tiny.tokenizer()
    assert lm.model_task(tiny.llama(tok)) == (lm.CAUSAL, "LlamaForCausalLM")
    assert lm.model_task(tiny.gpt2(tok)) == (lm.CAUSAL, "GPT2LMHeadModel")
    assert lm.model_task(torch.nn.Linear(2, 2)) is None


def test_sequence_classifier_l6_not_applicable_beside_the_smoke_checks(project):
    # with a smoke check selected L6 reads the shared smoke run first: the model's head decides before that
    _project(project, SEQUENCE)
    run, results = _report(project, ["--dlcheck=L6,S1"])
    assert (
        "not applicable: the model (BertForSequenceClassification) is a sequence classifier"
        in (results["L6"]["reason"])
    ), results["L6"]


SEQ2SEQ = """
import pytest, tiny, torch
from transformers import DataCollatorForSeq2Seq, T5Config, T5ForConditionalGeneration, Trainer


@pytest.fixture(scope="session")
def dlcheck_trainer(tmp_path_factory):
    tok = tiny.tokenizer()
    cfg = T5Config(vocab_size=len(tok), d_model=32, d_kv=8, d_ff=64, num_layers=1, num_heads=2,
                   pad_token_id=tok.pad_token_id, eos_token_id=tok.eos_token_id, decoder_start_token_id=tok.pad_token_id)
    torch.manual_seed(0)
    model = T5ForConditionalGeneration(cfg)
    data = [{"input_ids": tok(p)["input_ids"], "labels": tok(c + tok.eos_token)["input_ids"]}
            for p, c in zip(tiny.PROMPTS * 2, tiny.COMPLETIONS * 2)]
    return Trainer(model=model, args=tiny.trainer_args(tmp_path_factory.mktemp("out")), train_dataset=data,
                   eval_dataset=data, data_collator=DataCollatorForSeq2Seq(tok, model=model), processing_class=tok)
"""


def test_encoder_decoder_checks_that_cannot_feed_the_decoder_skip_instead_of_crashing(project):
    # T5 with DataCollatorForSeq2Seq: labels are the decoder's (another length than input_ids); L1/L6/L7 forwarded
    # input_ids alone (T5 raised, blamed on dlcheck_model) and L11 indexed the labels by input positions
    project.conftest(SEQ2SEQ)
    run, results = _report(project, ["--dlcheck=L1,L6,L7,L11"])
    assert "internal error" not in run.text and "raised" not in run.text, run.text
    for cid in ("L1", "L6", "L7", "L11"):
        run.assert_outcome(cid, "skipped")
        assert (
            "not measured for an encoder-decoder yet (the model (T5ForConditionalGeneration) is a "
            "sequence-to-sequence LM)" in results[cid]["reason"]
        ), results[cid]


def test_a_multiple_choice_model_is_not_a_language_model_and_blames_no_role(project):
    """run_swag: token ids (batch, choices, positions), one label per example. The llm checks read batches of one
    sequence per row: not applicable, decided from the model's head; none crashes on the nested choices nor blames
    the collator for the examples' per-choice lists (ragged before collation, as every example before padding)."""
    _project(project, CHOICES)
    run, results = _report(project, ["--dlcheck=llm,T4", "-rA"])
    assert "internal error" not in run.text and "gave data whose" not in run.text, run.text
    llm = {cid: r for cid, r in results.items() if r["domain"] == "llm"}
    assert llm and all(r["outcome"] == "not_applicable" for r in llm.values()), {
        cid: (r["outcome"], r.get("reason")) for cid, r in llm.items()
    }
    assert "the model (BertForMultipleChoice) is a multiple-choice model" in llm["L1"]["reason"], llm["L1"]
    # T4 reads the batch x choices embedded rows as each example's own: example 0 owns rows 0-3
    assert results["T4"]["outcome"] == "passed", results["T4"]


def test_encoder_decoder_targets_are_not_read_against_the_encoders_tokens(project):
    """run_translation_no_trainer, found blind: targets of another length than the sources (DataCollatorForSeq2Seq
    pads them to the batch's longest target): L2 and L13 indexed the labels by input positions and raised an
    IndexError reported as 'your role raised'. The decoder's targets are no labels of input_ids' positions."""
    project.conftest(SEQ2SEQ)
    run, results = _report(project, ["--dlcheck=L2,L13"])
    assert "internal error" not in run.text and "raised" not in run.text, run.text
    assert "IndexError" not in run.text


def test_encoder_decoder_targets_of_the_inputs_length_are_not_read_against_the_encoder(project):
    """Targets as long as the sources (a copy / denoising task): the batch carries the decoder's own inputs
    (DataCollatorForSeq2Seq(model=...) adds decoder_input_ids), so the labels are the decoder's targets all the same
    and L2 / L13 do not read them against the encoder's tokens and attention mask."""
    project.conftest(SEQ2SEQ.replace('tok(c + tok.eos_token)["input_ids"]', 'tok(p)["input_ids"]'))
    run, results = _report(project, ["--dlcheck=L2,L13"])
    assert "internal error" not in run.text, run.text
    for cid in ("L2", "L13"):
        assert results[cid]["outcome"] == "skipped", results[cid]
        assert "encoder-decoder's targets" in results[cid]["reason"], results[cid]


#: run_clip's pipeline: a CLIP dual encoder trained contrastively under the Trainer, a collate_fn that stacks the
#: images and pads the captions, return_loss=True; no labels anywhere
DUAL = """from transformers import CLIPConfig, CLIPModel
    torch.manual_seed(0)
    cfg = CLIPConfig(
        text_config=dict(vocab_size=len(tok), hidden_size=32, intermediate_size=64, num_hidden_layers=1,
                         num_attention_heads=2, max_position_embeddings=64, pad_token_id=tok.pad_token_id,
                         eos_token_id=tok.eos_token_id, bos_token_id=tok.bos_token_id),
        vision_config=dict(hidden_size=32, intermediate_size=64, num_hidden_layers=1, num_attention_heads=2,
                           image_size=16, patch_size=8), projection_dim=16)
    model = CLIPModel(cfg)
    data = [{**tok(t), "pixel_values": torch.randn(3, 16, 16)} for t in tiny.texts(12)]
    def collate(features):
        batch = tok.pad([{k: f[k] for k in ("input_ids", "attention_mask")} for f in features], return_tensors="pt")
        return {**batch, "pixel_values": torch.stack([f["pixel_values"] for f in features]), "return_loss": True}
    args.remove_unused_columns = False
    return Trainer(model=model, args=args, data_collator=collate, train_dataset=data, eval_dataset=data,
                   processing_class=tok)"""


def test_a_dual_encoder_predicts_no_tokens_and_its_forward_is_never_fed_text_alone(project):
    """A CLIP-style model (no text task mapping lists it, no language-model head): the llm checks about what a model
    learns from tokens are not applicable (L1 had fed it the tokens without the images: "your role raised"); the
    checks of the tokens themselves (the mask against the padding) still judge its caption batches; T4 and L5 read
    no get_input_embeddings() that transformers does not implement for it."""
    _project(project, DUAL)
    run, results = _report(project, ["--dlcheck=llm,vlm,T4", "-rA"])
    assert "raised" not in run.text and "internal error" not in run.text, run.text
    for cid in ("L1", "L2", "L4", "L6", "L11", "L13"):
        assert results[cid]["outcome"] == "not_applicable", (cid, results[cid])
        assert (
            "the model (CLIPModel) is in none of transformers' text task mappings and has no language-model head"
            in (results[cid]["reason"])
        )
    assert results["L14"]["outcome"] == "passed", results["L14"]
    assert results["T4"]["outcome"] in ("passed", "skipped"), results["T4"]
    # nor is it a vision-language model: no language model reads its image features (X1-X3 had asked for towers)
    for cid in ("X1", "X2", "X3", "X4", "X5"):
        assert results[cid]["outcome"] == "not_applicable", (cid, results[cid])
        assert "a vision tower beside a text encoder (a dual encoder)" in results[cid]["reason"]


def test_a_model_predicts_no_tokens_only_without_a_task_head_and_a_language_model_head():
    from transformers import CLIPConfig, CLIPModel

    from pytest_dlcheck.checks.shared import lm

    tok = tiny.tokenizer()
    assert lm.predicts_no_tokens(tiny.llama(tok)) is None
    assert lm.predicts_no_tokens(torch.nn.Linear(2, 2)) is None  # a custom module: not decided here
    clip = CLIPModel(CLIPConfig(text_config=dict(vocab_size=64), vision_config=dict(image_size=16, patch_size=8)))
    assert "CLIPModel" in lm.predicts_no_tokens(clip)
