"""A prompt-tuned model (PEFT prompt learning) prepends its virtual tokens to the input: its logits have
num_virtual_tokens more positions than input_ids. The llm checks that read per-position logits line them up
with the input's own tokens (the virtual positions dropped): L1 judges its padding, L6 reads log Z at the
supervised positions."""

import re
from pathlib import Path

import pytest
from helpers import flat

# imported here, outside pytester's in-process runs (a run unloads the modules first imported inside it)
from peft import PromptTuningConfig, get_peft_model  # noqa: F401
from transformers import BloomConfig, BloomForCausalLM  # noqa: F401

PROJECT = """
    import pytest, torch, tiny, peft_tiny
    from transformers import DataCollatorForLanguageModeling

    @pytest.fixture(scope="session")
    def dlcheck_tokenizer():
        return tiny.tokenizer(padding_side={side!r})

    @pytest.fixture(scope="session")
    def dlcheck_model(dlcheck_tokenizer):
        return peft_tiny.prompt_tuned(peft_tiny.{arch}(dlcheck_tokenizer) if {peft_arch} else tiny.{arch}(dlcheck_tokenizer))

    @pytest.fixture(scope="session")
    def dlcheck_collator(dlcheck_tokenizer):
        return DataCollatorForLanguageModeling(dlcheck_tokenizer, mlm=False)

    @pytest.fixture(scope="session")
    def dlcheck_dataset(dlcheck_tokenizer):
        return tiny.tokenized(dlcheck_tokenizer)
"""


def project_source(side: str, arch: str) -> str:
    return PROJECT.format(side=side, arch=arch, peft_arch=arch == "bloom")


@pytest.fixture(autouse=True)
def _paths(monkeypatch):
    monkeypatch.syspath_prepend(str(Path(__file__).parent))


def supervised_positions(rows: int = 4) -> int:
    """The next-token positions that the first ``rows`` sampled rows (8 examples spread over the 12 of the
    dataset, in batches of 4) supervise: what L6 reads log Z at."""
    import tiny
    from transformers import DataCollatorForLanguageModeling

    from pytest_dlcheck.sampling import spread_positions

    tok = tiny.tokenizer(padding_side="left")
    examples = tiny.tokenized(tok)
    batch = DataCollatorForLanguageModeling(tok, mlm=False)([examples[i] for i in spread_positions(12, 8)[:rows]])
    return int((batch["labels"][:, 1:] != -100).sum())


def test_left_padded_prompt_tuned_bloom_passes_l1_and_l6_reads_the_input_positions(project):
    # BLOOM places tokens by the attention mask (ALiBi): left padding is correct; its logits have 8 positions more
    project.conftest(project_source("left", "bloom"))
    run = project.run("--dlcheck=L1,L6", "-rA")
    run.assert_outcome("L1", "passed")
    text = flat(run.text)
    worst = re.search(r"lose as alone: max \|Δ\| (\S+) <= atol 0\.001 nats", text)
    assert worst and float(worst[1]) <= 0.001, text
    assert "6 left-padded" in text, text
    assert "8 virtual-token positions the model prepends" in text, text
    assert "internal error" not in run.text and "Traceback" not in run.text
    # L6 reads log Z at the supervised positions of the input, not at every position of the longer logits
    info = re.search(r"info: mean log Z \S+ \(range \S+ to \S+, (\d+) positions\)", run.text)
    assert info and int(info[1]) == supervised_positions(), run.text


def test_left_padded_prompt_tuned_gpt2_fails_l1(project):
    # learned absolute positions, numbered from the row start: the pads shift every real token, as without PEFT
    project.conftest(project_source("left", "gpt2"))
    run = project.run("--dlcheck=L1")
    run.assert_outcome("L1", "failed")
    text = flat(run.section("L1"))
    assert "left-padded sampled examples have another loss in the batch than alone" in text, text
    assert "pad tokens on the left): loss in batch" in text, text
    assert "8 virtual-token positions the model prepends" in text, text
    # the same batches with position_ids from the mask change nothing (PEFT drops them): no rounding excuse
    assert "bitwise the same losses for 6 of 6 examples: the model's forward ignores position_ids" in text, text
    assert "tokenizer.padding_side = 'right'" in text, text
    assert "internal error" not in run.text


def test_right_padded_prompt_tuned_gpt2_passes_l1(project):
    project.conftest(project_source("right", "gpt2"))
    run = project.run("--dlcheck=L1", "-rA")
    run.assert_outcome("L1", "passed")
    text = flat(run.text)
    assert "6 right-padded" in text, text
    worst = re.search(r"lose as alone: max \|Δ\| (\S+) <= atol 0\.001 nats", text)
    assert worst and float(worst[1]) <= 0.001, text


# ---- L7: what a Trainer hands a prompt-tuned model's metric: logits 8 positions longer than the labels ------

L7_TRAINER = """
    import math, pytest, torch, tiny, peft_tiny
    import torch.nn.functional as F
    from transformers import DataCollatorForLanguageModeling, Trainer

    VIRTUAL = 8

    def own_positions(p):
        # the virtual tokens' logits dropped, then shifted and masked like the model's loss
        logits, labels = torch.from_numpy(p.predictions[:, VIRTUAL:]), torch.from_numpy(p.label_ids)
        nll = F.cross_entropy(logits[:, :-1].flatten(0, 1), labels[:, 1:].flatten(), ignore_index=-100)
        return {{"perplexity": math.exp(nll)}}

    def own_positions_pad_filled(p, pad_id={pad}):
        # the virtual tokens' logits dropped, but -100 read as the pad id: padding averaged in
        logits, labels = torch.from_numpy(p.predictions[:, VIRTUAL:]), torch.from_numpy(p.label_ids)
        target = labels[:, 1:].masked_fill(labels[:, 1:] == -100, pad_id)
        nll = F.cross_entropy(logits[:, :-1].flatten(0, 1), target.flatten())
        return {{"perplexity": math.exp(nll)}}

    @pytest.fixture(scope="session")
    def dlcheck_trainer(tmp_path_factory):
        tok = tiny.tokenizer()
        data = tiny.tokenized(tok)
        model = peft_tiny.prompt_tuned(tiny.llama(tok), tokens=VIRTUAL)
        return Trainer(model=model, args=tiny.trainer_args(tmp_path_factory.mktemp("out")),
                       data_collator=DataCollatorForLanguageModeling(tok, mlm=False), processing_class=tok,
                       train_dataset=data, eval_dataset=data, compute_metrics={metrics})
"""


def l7_project(metrics: str) -> str:
    import tiny

    return L7_TRAINER.format(metrics=metrics, pad=tiny.tokenizer().pad_token_id)


def test_prompt_tuned_trainer_eval_loss_and_a_metric_over_its_own_positions_pass_l7(project):
    project.conftest(l7_project("own_positions"))
    run = project.run("--dlcheck=L7", "-rA")
    run.assert_outcome("L7", "passed")
    text = flat(run.text)
    assert "compute_metrics()['perplexity']" in text and "eval_loss" in text, text
    assert "the model's own loss (model.loss_function: the Trainer's eval_loss) equals the supervised-token NLL" in text
    assert "the model's logits have 8 positions more than the labels (the virtual tokens it prepends" in text, text


def test_prompt_tuned_trainer_metric_over_padding_fails_l7(project):
    project.conftest(l7_project("own_positions_pad_filled"))
    run = project.run("--dlcheck=L7")
    run.assert_outcome("L7", "failed")
    text = flat(run.section("L7"))
    assert "compute_metrics()['perplexity']" in text and "on contrast probe" in text, text
    assert "internal error" not in run.text


def test_input_logits_drops_only_the_declared_virtual_positions():
    import peft_tiny
    import tiny
    import torch

    from pytest_dlcheck.checks.shared import lm

    tok = tiny.tokenizer()
    model = peft_tiny.prompt_tuned(tiny.llama(tok), tokens=8)
    assert lm.prepended_positions(model) == 8
    logits = torch.randn(2, 13, 5)
    assert torch.equal(lm.input_logits(model, logits, 5), logits[:, 8:])
    assert lm.input_logits(model, logits, 13) is logits  # logits of the input's length are read as they are
    # a length no declared prefix explains is not lined up by guess: the check skips, saying so
    with pytest.raises(pytest.skip.Exception, match="logits at 13 positions for 7 input tokens"):
        lm.input_logits(model, logits, 7)
    assert lm.prepended_positions(tiny.llama(tok)) == 0
