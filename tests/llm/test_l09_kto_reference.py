"""TRL's KTOTrainer is a preference trainer with a reference model: L9 judges its reference (frozen, independent of
the policy), T1 does not compare KTO's loss (0.5 at the start) with ln(vocabulary), and S4 (DPO's ln 2) and a
RewardTrainer's S4 are not applicable with a true reason."""

import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "train"))
import tiny_train as tt  # noqa: E402

KTO = """
    import copy, pytest, tiny
    from datasets import Dataset
    from trl import KTOConfig, KTOTrainer

    @pytest.fixture(scope="session")
    def dlcheck_trainer(tmp_path_factory):
        tok = tiny.tokenizer()
        model = tiny.llama(tok)
        n = len(tiny.PROMPTS)
        data = Dataset.from_dict({{"prompt": tiny.PROMPTS, "completion": tiny.COMPLETIONS[:n],
                                   "label": [i % 2 == 0 for i in range(n)]}})
        args = tiny.trainer_args(tmp_path_factory.mktemp("kto"), KTOConfig, max_length=64, beta=0.1)
        return KTOTrainer(model=model, ref_model={ref}, args=args, processing_class=tok, train_dataset=data)
"""

REWARD = """
    import pytest, tiny
    from datasets import Dataset
    from transformers import AutoModelForSequenceClassification, LlamaConfig
    from trl import RewardConfig, RewardTrainer

    @pytest.fixture(scope="session")
    def dlcheck_trainer(tmp_path_factory):
        tok = tiny.tokenizer()
        cfg = tiny.llama(tok).config
        cfg.num_labels = 1
        model = AutoModelForSequenceClassification.from_config(cfg)
        data = Dataset.from_dict({"chosen": [p + c for p, c in zip(tiny.PROMPTS, tiny.COMPLETIONS)],
                                  "rejected": [p + c for p, c in zip(tiny.PROMPTS, tiny.COMPLETIONS[1:] + tiny.COMPLETIONS[:1])]})
        args = tiny.trainer_args(tmp_path_factory.mktemp("rm"), RewardConfig, max_length=64)
        return RewardTrainer(model=model, args=args, processing_class=tok, train_dataset=data)
"""


def _results(out: Path) -> dict:
    return {r["id"]: r for r in json.loads(out.read_text())["results"]}


def test_kto_reference_sharing_the_policys_weights_fails_l9(project):
    project.conftest(KTO.format(ref="copy.copy(model)"))
    run = project.run("--dlcheck=L9")
    run.assert_outcome("L9", "failed")
    text = tt.section(run, "L9")
    assert "reference parameter tensors share storage with the policy's" in text
    assert "moved the reference's log-probs of batch 0 by" in text and "a frozen one moves by 0" in text
    assert "KTO loss stays 0.5" in text and "DPO loss on batch 0" not in text
    assert "ref_model=copy.deepcopy(model)" in text


def test_kto_independent_reference_passes_l9_and_t1_s4_are_not_applicable(project, tmp_path):
    project.conftest(KTO.format(ref="copy.deepcopy(model)"))
    out = tmp_path / "r.json"
    run = project.run("--dlcheck=L9,T1,S4", f"--dlcheck-json={out}", "-rA")
    results = _results(out)
    assert results["L9"]["outcome"] == "passed", results["L9"]
    run.fnmatch(
        [
            "one SGD step on the policy (its completions log-likelihood moved by * nats) left the reference's "
            "log-probs of batch 0 unchanged (max |Δ| 0)",
        ]
    )
    assert "DPO loss" not in run.text
    assert results["T1"]["outcome"] == "not_applicable", results["T1"]
    assert "KTO: 0.5 at the start" in results["T1"]["reason"]
    assert results["S4"]["outcome"] == "not_applicable", results["S4"]
    assert "KTO's loss" in results["S4"]["reason"] and "starts at 0.5" in results["S4"]["reason"]


def test_reward_trainer_s4_not_applicable_with_its_own_reason(project, tmp_path):
    project.conftest(REWARD)
    out = tmp_path / "r.json"
    project.run("--dlcheck=S4,L9", f"--dlcheck-json={out}")
    results = _results(out)
    s4 = results["S4"]
    assert s4["outcome"] == "not_applicable", s4
    assert "-log σ(r_chosen - r_rejected) starts near ln 2" in s4["reason"] and "no reason" not in s4["reason"]
    assert results["L9"]["outcome"] == "not_applicable", results["L9"]
