"""L7: the eval perplexity / loss must average the NLL over label != -100 positions only."""

import math

import pytest
import tiny
import torch

# imported here, before pytester snapshots sys.modules, so the in-process runs share them (a lazy
# transformers attribute first imported inside a run is dropped from sys.modules when the run ends)
import transformers.trainer  # noqa: F401,E402
import transformers.trainer_pt_utils  # noqa: F401,E402
from datasets import Dataset  # noqa: F401,E402
from helpers import flat
from transformers import DataCollatorForLanguageModeling, EvalPrediction, Trainer  # noqa: F401,E402
from trl import SFTConfig, SFTTrainer  # noqa: F401,E402

# the plugin's lazily imported modules, kept alive across the in-process runs: otherwise run 2 re-imports
# pytest_dlcheck.roles (a new MISSING) while `from . import fixtures` returns run 1's stale module
import pytest_dlcheck.checks.llm.eval_metric  # noqa: F401,E402

METRICS = '''
import math
import numpy as np
import torch
import torch.nn.functional as F


def numpy_every_position(p):
    """np.take_along_axis with label -100 wraps to vocabulary id V-100: every position is averaged."""
    logits, labels = p.predictions[:, :-1], p.label_ids[:, 1:]
    m = logits.max(-1, keepdims=True)
    logp = logits - m - np.log(np.exp(logits - m).sum(-1, keepdims=True))
    nll = -np.take_along_axis(logp, labels[..., None], -1)
    return {{"perplexity": float(np.exp(nll.mean()))}}


def pad_filled(p, pad_id={pad}):
    """-100 replaced by the pad id so that cross_entropy accepts it: pad and prompt averaged in."""
    logits = torch.from_numpy(p.predictions[:, :-1])
    labels = torch.from_numpy(p.label_ids[:, 1:]).masked_fill(torch.from_numpy(p.label_ids[:, 1:]) == -100, pad_id)
    nll = F.cross_entropy(logits.flatten(0, 1), labels.flatten())
    return {{"eval_nll": float(nll), "perplexity": math.exp(nll)}}


def unshifted(p):
    """masks -100 but scores logits[t] against labels[t]."""
    logits, labels = torch.from_numpy(p.predictions), torch.from_numpy(p.label_ids)
    nll = F.cross_entropy(logits.flatten(0, 1), labels.flatten(), ignore_index=-100)
    return {{"perplexity": math.exp(nll)}}


def masked_shifted(p):
    logits, labels = torch.from_numpy(p.predictions[:, :-1]), torch.from_numpy(p.label_ids[:, 1:])
    nll = F.cross_entropy(logits.flatten(0, 1), labels.flatten(), ignore_index=-100)
    return {{"perplexity": math.exp(nll), "accuracy": 0.5}}


def per_example_mean(p):
    """another correct reduction: mean of per-example NLLs over supervised tokens."""
    logits, labels = torch.from_numpy(p.predictions[:, :-1]), torch.from_numpy(p.label_ids[:, 1:])
    nll = F.cross_entropy(logits.transpose(1, 2), labels, ignore_index=-100, reduction="none")
    mask = labels != -100
    per_example = (nll * mask).sum(1) / mask.sum(1)
    return {{"loss": float(per_example.mean())}}


def accuracy_only(p):
    return {{"accuracy": 0.5}}
'''

TRAINER = """
import pytest, tiny
from transformers import DataCollatorForLanguageModeling, Trainer
from l7_metrics import *

@pytest.fixture(scope="session")
def dlcheck_trainer(tmp_path_factory):
    tok = tiny.tokenizer()
    data = tiny.tokenized(tok)
    return Trainer(model=tiny.llama(tok), args=tiny.trainer_args(tmp_path_factory.mktemp("out"), {args}),
                   data_collator=DataCollatorForLanguageModeling(tok, mlm=False), processing_class=tok,
                   train_dataset=data, eval_dataset={eval}, compute_metrics={metrics})
"""

SFT = """
import pytest, tiny
from datasets import Dataset
from trl import SFTConfig, SFTTrainer
from l7_metrics import *

@pytest.fixture(scope="session")
def dlcheck_trainer(tmp_path_factory):
    tok = tiny.tokenizer()
    data = Dataset.from_dict({{"prompt": tiny.PROMPTS, "completion": tiny.COMPLETIONS}})
    return SFTTrainer(model=tiny.llama(tok), processing_class=tok, train_dataset=data, eval_dataset=data,
                      args=tiny.trainer_args(tmp_path_factory.mktemp("out"), SFTConfig, max_length=64),
                      compute_metrics={metrics})
"""

FIXTURES = """
import pytest, tiny
from transformers import DataCollatorForLanguageModeling
from l7_metrics import *

@pytest.fixture(scope="session")
def dlcheck_tokenizer():
    return tiny.tokenizer()

@pytest.fixture(scope="session")
def dlcheck_model(dlcheck_tokenizer):
    return tiny.gpt2(dlcheck_tokenizer)

@pytest.fixture(scope="session")
def dlcheck_collator(dlcheck_tokenizer):
    return DataCollatorForLanguageModeling(dlcheck_tokenizer, mlm=False)

@pytest.fixture(scope="session")
def dlcheck_eval_dataset(dlcheck_tokenizer):
    return tiny.tokenized(dlcheck_tokenizer)

@pytest.fixture(scope="session")
def dlcheck_compute_metrics():
    return {metrics}
"""


def _project(project, template: str, metrics: str, **kw) -> None:
    pad = tiny.tokenizer().pad_token_id
    project.conftest(METRICS.format(pad=pad), "l7_metrics.py")
    project.conftest(template.format(metrics=metrics, **kw))


def test_numpy_metric_reads_every_position(project):
    _project(project, TRAINER, "numpy_every_position", args="", eval="data")
    run = project.run("--dlcheck=L7")
    run.assert_outcome("L7", "failed")
    text = flat(run.section("L7"))
    assert "compute_metrics()['perplexity'] =" in text
    assert "supervised (label != -100) positions = 0.0101 (perplexity 1.01)" in text  # the contrast probe
    assert "numpy index -100 wraps around" in text
    assert "averages the token NLL over every position" in text
    assert "[padding, label -100] '<|pad|>' x" in text  # the example, decoded with its masked run
    assert "ignore_index=-100" in text
    assert "Traceback" not in run.text


def test_masked_shifted_metric_passes(project):
    _project(project, TRAINER, "masked_shifted", args="", eval="data")
    run = project.run("--dlcheck=L7", "-rA")
    run.assert_outcome("L7", "passed")
    run.fnmatch(["*::L7_eval_metric PASSED (compute_metrics()[[]'perplexity'], eval_loss each average the NLL*"])
    run.fnmatch(
        [
            "compute_metrics()[[]'perplexity'], eval_loss each average the NLL over the 128 supervised (label != -100) "
            "of 184 positions, on the model's logits and on the contrast probe (tolerance 0.05 nats + 2%); source: "
            "dlcheck_collator on 8 examples of dlcheck_eval_dataset",
            "compute_metrics()[[]'perplexity'] = 309.9 (NLL 5.7364) on the model's logits, 1.01 (NLL 0.0101) on the "
            "contrast probe; NLL over the supervised positions 5.7364 and 0.0101",
            "the model's own loss (model.loss_function: the Trainer's eval_loss) equals the supervised-token NLL batch "
            "by batch (4 batch-probe pairs, largest |Δ| *)",
        ]
    )


def test_per_example_mean_is_a_valid_reduction(project):
    _project(project, TRAINER, "per_example_mean", args="", eval="data")
    run = project.run("--dlcheck=L7", "-rA")
    run.assert_outcome("L7", "passed")
    run.fnmatch(["compute_metrics()[[]'loss'] = 5.73 on the model's logits, 0.01005 on the contrast probe*"])


def test_batch_eval_metrics_and_losses_are_fed_like_the_trainer(project):
    # include_for_metrics=["loss"]: the metric may read eval_pred.losses; the numpy bug still shows
    _project(project, TRAINER, "numpy_every_position", args='include_for_metrics=["loss"]', eval="data")
    run = project.run("--dlcheck=L7")
    run.assert_outcome("L7", "failed")


def test_sft_completion_only_metric_fills_prompt_with_pad(project):
    _project(project, SFT, "pad_filled")
    run = project.run("--dlcheck=L7")
    run.assert_outcome("L7", "failed")
    text = flat(run.section("L7"))
    assert "compute_metrics()['eval_nll']" in text or "compute_metrics()['perplexity']" in text
    assert "read as the pad id 1" in text
    assert "[label -100] 'what is 2+2?'" in text  # the masked prompt, decoded
    assert "[supervised] ' The answer is 4.<|endoftext|>'" in text


def test_sft_completion_only_clean_metric_passes(project):
    _project(project, SFT, "masked_shifted")
    run = project.run("--dlcheck=L7", "-rA")
    run.assert_outcome("L7", "passed")
    run.fnmatch(
        [
            "compute_metrics()[[]'perplexity'], eval_loss each average the NLL over the 79 supervised (label != -100) "
            "of 154 positions*"
        ]
    )


def test_sft_trainer_without_compute_metrics_judges_its_eval_loss(project):
    # an SFTTrainer evaluates eval_loss alone: that is judged, no dlcheck_compute_metrics is asked for
    _project(project, SFT, "None")
    run = project.run("--dlcheck=L7", "-rA")
    run.assert_outcome("L7", "passed")
    run.fnmatch(
        [
            "eval_loss averages the NLL over the 79 supervised (label != -100) of 154 positions, on the model's "
            "logits and on the contrast probe (tolerance 0.05 nats + 2%); source: dlcheck_collator on 6 examples of "
            "dlcheck_eval_dataset",
            "the model's own loss (model.loss_function: the Trainer's eval_loss) equals the supervised-token NLL batch "
            "by batch (4 batch-probe pairs, largest |Δ| *)",
        ]
    )
    assert "dlcheck_compute_metrics" not in run.text


DPO = """
import copy, pytest, tiny
from datasets import Dataset
from trl import DPOConfig, DPOTrainer

@pytest.fixture(scope="session")
def dlcheck_trainer(tmp_path_factory):
    tok = tiny.tokenizer()
    model = tiny.llama(tok)
    data = Dataset.from_dict({"prompt": tiny.PROMPTS, "chosen": tiny.COMPLETIONS,
                              "rejected": tiny.COMPLETIONS[1:] + tiny.COMPLETIONS[:1]})
    return DPOTrainer(model=model, ref_model=copy.deepcopy(model), processing_class=tok, train_dataset=data,
                      eval_dataset=data, args=tiny.trainer_args(tmp_path_factory.mktemp("out"), DPOConfig, max_length=64))
"""


def test_dpo_trainer_is_not_applicable(project):
    # DPO evaluates its preference loss: there is no perplexity over supervised tokens to ask a metric for
    project.conftest(DPO)
    run = project.run("--dlcheck=L7")
    run.fnmatch(
        [
            "*::L7_eval_metric SKIPPED (not applicable: *",
            "SKIPPED * not applicable: DPOTrainer evaluates its own objective (a preference loss (DPO) of the policy "
            "against a reference model), not a "
            "next-token NLL: its eval loss and metrics are no perplexity over supervised tokens",
        ]
    )
    assert "dlcheck_compute_metrics" not in run.text


def test_unshifted_metric_from_plain_fixtures(project):
    _project(project, FIXTURES, "unshifted")
    run = project.run("--dlcheck=L7")
    run.assert_outcome("L7", "failed")
    text = flat(run.section("L7"))
    assert "scores logits[t] against labels[t]" in text
    assert "labels not shifted" in text
    assert "dlcheck_collator on 8 examples of dlcheck_eval_dataset" in text


def test_no_perplexity_key_skips(project):
    _project(project, FIXTURES, "accuracy_only")
    run = project.run("--dlcheck=L7")
    run.assert_outcome("L7", "skipped")
    assert "reports no perplexity or loss (keys: accuracy)" in run.text


def test_trainer_without_compute_metrics_judges_its_eval_loss(project):
    project.conftest(TRAINER.format(metrics="None", args="", eval="data").replace("from l7_metrics import *", ""))
    run = project.run("--dlcheck=L7", "-rA")
    run.assert_outcome("L7", "passed")
    run.fnmatch(["eval_loss averages the NLL over the 128 supervised (label != -100) of 184 positions*"])
    assert "dlcheck_compute_metrics" not in run.text


def test_hand_pipeline_without_a_metric_asks_for_it(project):
    # no Trainer: the user's own eval metric is only reachable through the fixture
    project.conftest(FIXTURES.replace("{metrics}", "None").replace("from l7_metrics import *", ""))
    run = project.run("--dlcheck=L7")
    run.assert_outcome("L7", "skipped")
    run.fnmatch(
        [
            "SKIPPED * missing role: define fixture dlcheck_compute_metrics (or dlcheck_trainer with "
            "compute_metrics) in conftest.py"
        ]
    )


def test_train_sample_stands_in_without_eval_data(project):
    _project(project, TRAINER, "numpy_every_position", args="", eval="None")
    run = project.run("--dlcheck=L7")
    run.assert_outcome("L7", "failed")
    assert "the training sample stands in" in flat(run.section("L7"))


LOSS_FUNC = """
import pytest, tiny, torch
import torch.nn.functional as F
from transformers import DataCollatorForLanguageModeling, Trainer

def every_position_loss(outputs, labels, num_items_in_batch=None):
    logits = outputs.logits[:, :-1]
    return F.cross_entropy(logits.flatten(0, 1), labels[:, 1:].clamp(min=0).flatten())

def masked_loss(outputs, labels, num_items_in_batch=None):
    logits = outputs.logits[:, :-1]
    total = F.cross_entropy(logits.flatten(0, 1), labels[:, 1:].flatten(), ignore_index=-100, reduction="sum")
    return total / num_items_in_batch

@pytest.fixture(scope="session")
def dlcheck_trainer(tmp_path_factory):
    tok = tiny.tokenizer()
    data = tiny.tokenized(tok)
    return Trainer(model=tiny.llama(tok), args=tiny.trainer_args(tmp_path_factory.mktemp("out")),
                   data_collator=DataCollatorForLanguageModeling(tok, mlm=False), processing_class=tok,
                   train_dataset=data, eval_dataset=data, compute_loss_func={fn})
"""


def test_compute_loss_func_over_every_position(project):
    project.conftest(LOSS_FUNC.format(fn="every_position_loss"))
    run = project.run("--dlcheck=L7")
    run.assert_outcome("L7", "failed")
    text = flat(run.section("L7"))
    assert "the Trainer's compute_loss_func gives" in text
    assert "read as token id 0" in text
    assert "num_items_in_batch" in text


def test_compute_loss_func_masked_passes(project):
    project.conftest(LOSS_FUNC.format(fn="masked_loss"))
    run = project.run("--dlcheck=L7", "-rA")
    run.assert_outcome("L7", "passed")
    run.fnmatch(
        [
            "compute_loss_func averages the NLL over the 128 supervised (label != -100) of 184 positions*",
            "the Trainer's compute_loss_func equals the supervised-token NLL batch by batch (4 batch-probe pairs*",
        ]
    )


# ---- unit tests of the probe ----------------------------------------------------------------------


def test_contrast_probe_puts_every_supervised_target_at_p():
    from pytest_dlcheck.checks.llm.eval_metric import contrast, supervised_nll

    torch.manual_seed(0)
    logits = torch.randn(2, 6, 50) * 3
    labels = torch.tensor([[-100, -100, 5, 7, 9, -100], [-100, 1, 2, 3, -100, -100]])
    nll, mask = supervised_nll(contrast(logits, labels), labels)
    assert torch.allclose(nll[mask], torch.full_like(nll[mask], -math.log(0.99)), atol=1e-5)
    # masked positions keep the model's logits
    keep = ~torch.nn.functional.pad(mask, (0, 1))
    assert torch.equal(contrast(logits, labels)[keep], logits[keep])


def test_candidates_name_the_wrapping_numpy_bug():
    import numpy as np

    from pytest_dlcheck.checks.llm.eval_metric import candidates

    torch.manual_seed(0)
    logits = torch.randn(1, 5, 120)
    labels = torch.tensor([[-100, 4, 5, -100, -100]])
    lp = torch.log_softmax(logits[:, :-1], -1).numpy()
    wrapped = -np.take_along_axis(lp, labels[:, 1:, None].numpy(), -1).mean()
    cand = candidates(logits.numpy(), labels.numpy(), {"wrap": 20})
    assert cand["every position, label -100 read as wrap"][0] == pytest.approx(float(wrapped), abs=1e-5)
    assert cand["every position, label -100 read as wrap"][1] == 4


DORA = """
import pytest, tiny
from peft import LoraConfig, get_peft_model
from transformers import DataCollatorForLanguageModeling, Trainer


# peft's DoRA example: a PEFT-wrapped causal LM under a Trainer built without processing_class (the collator holds
# the tokenizer); the wrapper's forward takes **kwargs
@pytest.fixture(scope="session")
def dlcheck_trainer(tmp_path_factory):
    tok = tiny.tokenizer()
    model = get_peft_model(tiny.llama(tok), LoraConfig(r=4, target_modules=["q_proj", "v_proj"], use_dora=True))
    data = tiny.tokenized(tok)
    return Trainer(model=model, args=tiny.trainer_args(tmp_path_factory.mktemp("out")),
                   data_collator=DataCollatorForLanguageModeling(tok, mlm=False), train_dataset=data,
                   eval_dataset=data)
"""


def test_a_peft_model_under_a_trainer_without_processing_class_is_judged(project):
    # blind set 11's DoRA recipe: the tokenizer is read off the collator (nine llm checks had asked for it, hiding
    # L11), and the wrapper's **kwargs forward gets the batch's inputs (L7 had called it with none: "your role raised")
    project.conftest(DORA)
    run = project.run("--dlcheck=L7,L14", "-rA")
    assert "raised" not in run.text and "missing role" not in run.text, run.text
    run.assert_outcome("L7", "passed")
    run.assert_outcome("L14", "passed")


def test_forward_names_read_through_a_peft_wrapper():
    from peft import LoraConfig, get_peft_model

    from pytest_dlcheck.checks.shared import lm

    tok = tiny.tokenizer()
    model = get_peft_model(tiny.llama(tok), LoraConfig(r=4, target_modules=["q_proj"]))
    assert {"input_ids", "attention_mask", "labels"} <= lm.forward_names(model)
