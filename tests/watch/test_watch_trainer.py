"""The watch in a real transformers/TRL Trainer run: a learning rate that diverges stops the run with S2's
message and a postmortem; a clean run is untouched (the same losses and weights with and without it); a
DPO reference that is the policy pins the loss at ln 2 and S4 says so."""

from __future__ import annotations

import copy
import json
import logging
import os
import re
import warnings

import pytest
import tiny
import torch
from datasets import Dataset
from transformers import DataCollatorForLanguageModeling, Trainer, TrainerCallback

from pytest_dlcheck.watch import TrainerWatch, WatchWarning


@pytest.fixture(scope="module")
def tok():
    return tiny.tokenizer()


def lm_trainer(tok, tmp_path, optimizer=None, steps=60, **kw):
    model = tiny.llama(tok)
    kw = {"per_device_train_batch_size": 4, "logging_steps": 5, "seed": 0, **kw}
    args = tiny.trainer_args(tmp_path, max_steps=steps, **kw)
    opt = optimizer(model) if optimizer else (None, None)
    return Trainer(
        model=model,
        args=args,
        train_dataset=Dataset.from_list(tiny.tokenized(tok, 24)),
        data_collator=DataCollatorForLanguageModeling(tok, mlm=False),
        optimizers=opt,
    )


def exploding_lr(model):
    """AdamW at 1e-3 whose scheduler multiplies the LR by 1.6 every step (an ExponentialLR whose gamma was meant as 0.6)."""
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    return opt, torch.optim.lr_scheduler.ExponentialLR(opt, gamma=1.6)


def train(trainer):
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        trainer.train()
    return [str(w.message) for w in caught if issubclass(w.category, WatchWarning)]


def flat(text: str) -> str:
    """The message without its line wrapping and column padding."""
    return " ".join(text.split())


class Tracker(TrainerCallback):
    """What a report_to integration receives: every on_log's logs."""

    def __init__(self):
        self.seen = []

    def on_log(self, args, state, control, logs=None, **kwargs):
        self.seen.append(dict(logs or {}))


def test_a_diverging_learning_rate_stops_the_run_with_a_postmortem(tok, tmp_path, caplog):
    trainer = lm_trainer(tok, tmp_path, exploding_lr, steps=80)
    watch = TrainerWatch(every=5)
    trainer.add_callback(watch)
    tracker = Tracker()  # a report_to integration sees what reaches the callbacks' on_log
    trainer.add_callback(tracker)
    with caplog.at_level(logging.INFO, logger="pytest_dlcheck.watch"):
        messages = train(trainer)
    assert trainer.state.global_step == 20  # stopped cleanly at the check after the spike, not at 80
    assert len(messages) == 1
    text = flat(messages[0])
    assert text.startswith("S2 loss spike during the run (step 18)")
    # a diverging run amplifies the last bits of float rounding: the numbers differ between CPUs, the shape does not
    spike = re.search(
        r"step 18: loss ([\d.]+) = ([\d.]+) x the mean ([\d.]+) of the 5 steps before it \(limit 3.0 x\)", text
    )
    assert spike, text
    loss, ratio, mean = map(float, spike.groups())
    assert ratio > 3.0 and loss == pytest.approx(ratio * mean, rel=0.02)
    assert "lr 2.95 is too high for this model" in text and "lower the learning rate (by 10x to start)" in text
    assert "policy stop: training stops cleanly after step 20" in text
    path = tmp_path / "dlcheck-postmortem-S2-step18.json"
    assert f"postmortem {path}" in text
    doc = json.loads(path.read_text())
    assert doc["kind"] == "postmortem" and doc["run"]["framework"] == "transformers"
    assert doc["versions"]["torch"] == torch.__version__ and "transformers" in doc["versions"]
    (result,) = doc["results"]
    assert result["id"] == "S2" and result["outcome"] == "failed" and result["cause"].startswith("the run diverges")
    assert result["data"]["ratio"] == pytest.approx(loss / mean, rel=0.01)
    history = doc["history"]
    assert history["step"] == list(range(1, 21))  # every step's loss, read at the checks only
    assert history["lr"][0] == pytest.approx(1e-3) and history["lr"][-1] == pytest.approx(1e-3 * 1.6**19)
    assert [s for s, g in zip(history["step"], history["grad_norm"]) if g is not None] == [5, 10, 15, 20]
    # a logging record with the whole message, whatever the warning filters
    (record,) = [r for r in caplog.records if r.name == "pytest_dlcheck.watch"]
    assert record.levelno == logging.ERROR and record.getMessage() == messages[0]
    assert record.dlcheck_finding.id == "S2" and record.dlcheck_postmortem == path
    # the Trainer's own log: log_history (and so every report_to tracker) carries the finding
    (logged,) = [h for h in trainer.state.log_history if "dlcheck/S2" in h]
    assert logged["dlcheck/S2"] == 18.0 and logged["step"] == 20
    assert [e for e in tracker.seen if "dlcheck/S2" in e] == [{k: v for k, v in logged.items() if k != "step"}]
    assert logged["dlcheck/finding"].startswith("pytest-dlcheck watch: S2 loss spike during the run (step 18): ")
    assert (
        f"policy stop: training stops cleanly after step 20 (the check that saw it); postmortem {path}"
        in (logged["dlcheck/finding"])
    )


SILENCED = """
import json, sys
sys.path.insert(0, {tests!r})
import torch
torch.set_num_threads(1)
import tiny
from datasets import Dataset
from transformers import DataCollatorForLanguageModeling, Trainer
from pytest_dlcheck.watch import TrainerWatch

tok = tiny.tokenizer()
model = tiny.llama(tok)
opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
sched = torch.optim.lr_scheduler.ExponentialLR(opt, gamma=1.6)  # gamma meant as 0.6: the LR explodes
args = tiny.trainer_args({out!r}, max_steps=80, per_device_train_batch_size=4, logging_steps=5, seed=0,
                         disable_tqdm=False)  # the progress bar on, as a user has it
trainer = Trainer(model=model, args=args, train_dataset=Dataset.from_list(tiny.tokenized(tok, 24)),
                  data_collator=DataCollatorForLanguageModeling(tok, mlm=False), optimizers=(opt, sched),
                  callbacks=[TrainerWatch(every=5)])
trainer.train()
print(json.dumps({{"step": trainer.state.global_step,
                  "logged": [h for h in trainer.state.log_history if "dlcheck/S2" in h]}}))
"""


def test_a_run_under_w_ignore_still_says_it_and_stops(tmp_path):
    """python -W ignore train.py: the warning is filtered, the run still stops and says why on stderr, on a
    line of its own (not glued to the tqdm bar), and the Trainer's log_history carries it."""
    import subprocess
    import sys
    from pathlib import Path

    script = tmp_path / "train.py"
    script.write_text(SILENCED.format(tests=str(Path(tiny.__file__).parent), out=str(tmp_path / "out")))
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1"}
    done = subprocess.run(
        [sys.executable, "-W", "ignore", str(script)], capture_output=True, text=True, env=env, timeout=300
    )
    assert done.returncode == 0, done.stderr
    result = json.loads(done.stdout.strip().splitlines()[-1])
    assert result["step"] == 20  # stopped at the check after the spike, not at 80
    path = tmp_path / "out" / "dlcheck-postmortem-S2-step18.json"
    line = re.search(r"(?:^|\n)(pytest-dlcheck watch: S2 loss spike during the run \(step 18\): .*)\n", done.stderr)
    assert line, done.stderr
    assert "\npytest-dlcheck watch: S2" in done.stderr  # it starts a line of its own, after the bar's
    assert line[1].endswith(
        f"policy stop: training stops cleanly after step 20 (the check that saw it); postmortem {path}"
    )
    assert "WatchWarning" not in done.stderr  # the warning itself is filtered
    (logged,) = result["logged"]
    assert logged["dlcheck/S2"] == 18.0 and logged["dlcheck/finding"] == line[1]


def test_a_run_that_diverges_at_its_second_step_and_stays_there_is_stopped(tok, tmp_path):
    """AdamW at learning_rate=1.0 moves every weight of the tiny LM (initialised at std 0.02) by about 1 in its
    first step: the loss leaps from its start (ln of the vocabulary, ~5.7) to several times that at step 2 and
    stays there. The running mean starts judging at step 4, when every step it averages is already diverged,
    so it never sees a jump (the run went its 40 steps without a finding); against the run's start it is a
    divergence, caught at the first check."""
    trainer = lm_trainer(tok, tmp_path / "watched", steps=40, learning_rate=1.0, logging_steps=1)
    watch = TrainerWatch()  # the defaults: a check every 25 steps
    trainer.add_callback(watch)
    messages = train(trainer)
    assert trainer.state.global_step == 25  # stopped at the first check, not after 40 steps
    assert [f.id for f in watch.watch.findings] == ["S2"] and len(messages) == 1
    text = flat(messages[0])
    found = re.search(
        r"step (\d+): the median loss of the last 5 steps, ([\d.]+), is ([\d.]+) x where the run began \(([\d.]+) "
        r"at step 1, the lowest of the first 3; limit 3.0 x\)",
        text,
    )
    assert found, text
    assert float(found[3]) > 3.0 and float(found[2]) == pytest.approx(float(found[3]) * float(found[4]), rel=0.02)
    assert "is too high for this model" in text and "policy stop: training stops cleanly after step 25" in text
    losses = [h["loss"] for h in trainer.state.log_history if "loss" in h]
    # it did leap at step 2 (by construction: lr 1.0 moves every weight by ~1); what follows the leap is one
    # machine's trajectory (the logged median of the last 5 steps was 16.2 against a start of 5.7 on another run):
    # only what S2 measured is asserted, above
    assert losses[1] > 3 * losses[0], losses

    # the same run judged against its running mean only (the start comparison moved out of reach)
    alone = lm_trainer(tok, tmp_path / "mean-only", steps=40, learning_rate=1.0, logging_steps=1)
    mean_only = TrainerWatch(overrides={"S2.rise": 1e9}, checks=("S2",))
    alone.add_callback(mean_only)
    assert train(alone) == [] and alone.state.global_step == 40 and mean_only.watch.findings == []


def test_a_clean_run_is_untouched(tok, tmp_path):
    """The same Trainer with and without the watch logs the same loss at every step and ends with the same
    weights; nothing fires and no postmortem is written."""
    runs = []
    for with_watch in (False, True):
        trainer = lm_trainer(tok, tmp_path / str(with_watch), steps=30, learning_rate=1e-3, logging_steps=1)
        if with_watch:
            watch = TrainerWatch(every=5)
            trainer.add_callback(watch)
        assert train(trainer) == []
        losses = [h["loss"] for h in trainer.state.log_history if "loss" in h]
        runs.append((losses, {k: v.clone() for k, v in trainer.model.state_dict().items()}))
    assert len(runs[0][0]) == 30 and runs[0][0] == runs[1][0]
    assert all(torch.equal(runs[0][1][k], runs[1][1][k]) for k in runs[0][1])
    assert watch.watch.findings == [] and not list((tmp_path / "True").glob("dlcheck-postmortem-*"))
    assert len(watch.watch.history) == 30 and watch._hooked  # every step's loss came from the model's output


DPO_STEPS = 6


def dpo_trainer(tok, tmp_path, reference):
    from trl import DPOConfig, DPOTrainer

    model = tiny.llama(tok)
    data = Dataset.from_dict(
        {"prompt": tiny.PROMPTS, "chosen": tiny.COMPLETIONS, "rejected": tiny.COMPLETIONS[1:] + tiny.COMPLETIONS[:1]}
    )
    args = tiny.trainer_args(
        tmp_path, DPOConfig, max_length=64, beta=0.1, learning_rate=1e-3, max_steps=DPO_STEPS + 2, seed=0
    )
    return DPOTrainer(model=model, ref_model=reference(model), args=args, processing_class=tok, train_dataset=data)


def test_a_dpo_reference_that_is_the_policy_is_pinned_at_ln2(tok, tmp_path):
    trainer = dpo_trainer(tok, tmp_path, copy.copy)  # a shallow copy: the same parameter tensors
    watch = TrainerWatch(trainer, every=2, overrides={"S1.steps": DPO_STEPS})
    trainer.add_callback(watch)
    messages = train(trainer)
    assert trainer.state.global_step == DPO_STEPS
    text = flat(messages[0])
    assert text.startswith(
        f"S4 DPO loss pinned at ln 2 / preference accuracy at chance during the run (step {DPO_STEPS})"
    )
    assert (
        f"the first {DPO_STEPS} logged steps (to step {DPO_STEPS}): loss within 0.001 of ln 2 = 0.6931 (1: 0.69315"
        in text
    )
    assert "rewards/accuracies: max 0.00 (chance is 0.5)" in text
    assert "reference parameters share storage with the policy's (e.g. model.embed_tokens.weight)" in text
    assert "ref_model=copy.deepcopy(model)" in text
    doc = json.loads((tmp_path / f"dlcheck-postmortem-S4-step{DPO_STEPS}.json").read_text())
    assert (
        doc["results"][0]["id"] == "S4"
        and doc["history"]["metrics"]["rewards/accuracies"][:DPO_STEPS] == [0.0] * DPO_STEPS
    )


def test_an_independent_dpo_reference_runs_on(tok, tmp_path):
    trainer = dpo_trainer(tok, tmp_path, copy.deepcopy)
    watch = TrainerWatch(trainer, every=2, overrides={"S1.steps": DPO_STEPS})
    trainer.add_callback(watch)
    assert train(trainer) == []
    assert trainer.state.global_step == DPO_STEPS + 2 and watch.watch.findings == []
    assert "S4" not in watch.watch.active  # judged on the first S1.steps logged losses, and passed


def example_trainer(tmp_path, callbacks):
    """examples/train/clean_trainer's Trainer (a custom nn.Module returning a dict with the loss), evaluated
    every 5 steps."""
    import sys
    from pathlib import Path

    sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "examples" / "train"))
    import tinytrain
    from transformers import TrainingArguments, default_data_collator

    torch.manual_seed(0)
    args = TrainingArguments(
        output_dir=str(tmp_path),
        report_to="none",
        use_cpu=True,
        max_steps=20,
        per_device_train_batch_size=8,
        learning_rate=1e-2,
        warmup_steps=2,
        save_strategy="no",
        disable_tqdm=True,
        logging_steps=1,
        eval_strategy="steps",
        eval_steps=5,
    )
    return Trainer(
        model=tinytrain.HFClassifier(),
        args=args,
        data_collator=default_data_collator,
        train_dataset=tinytrain.records(tinytrain.blobs(seed=0)),
        eval_dataset=tinytrain.records(tinytrain.blobs(32, seed=1)),
        callbacks=callbacks,
    )


def test_the_examples_clean_trainer_is_untouched(tmp_path):
    plain = example_trainer(tmp_path / "plain", [])
    watch = TrainerWatch(every=5)
    watched = example_trainer(tmp_path / "watched", [watch])
    assert train(plain) == [] and train(watched) == []
    logs = [
        [(h["step"], h.get("loss"), h.get("eval_loss")) for h in t.state.log_history[:-1]] for t in (plain, watched)
    ]
    assert logs[0] == logs[1] and len(logs[0]) == 24  # 20 training logs and 4 evaluations, the same values
    evals = [h["eval_loss"] for h in watch.watch.history if h.get("eval_loss") is not None]
    assert len(evals) == 4 and watch.watch.findings == [] and "S5" in watch.watch.active  # judged, and passed


def test_policy_raise_ends_train_with_the_alarm_and_leaves_no_hook(tok, tmp_path):
    from pytest_dlcheck.watch import WatchAlarm

    trainer = lm_trainer(tok, tmp_path, exploding_lr, steps=80)
    trainer.add_callback(TrainerWatch(policy="raise", every=5))
    with pytest.raises(WatchAlarm, match=r"^S2 loss spike during the run \(step 18\)"):
        trainer.train()
    assert trainer.state.global_step == 20 and not trainer.model._forward_hooks
    assert (tmp_path / "dlcheck-postmortem-S2-step18.json").exists()
