"""L9: the DPO reference is frozen and independent of the policy."""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "train"))
import tiny_train as tt  # noqa: E402

DPO = """
    import copy, pytest, tiny, tiny_train as tt
    from datasets import Dataset
    from trl import DPOConfig, DPOTrainer

    @pytest.fixture(scope="session")
    def dlcheck_trainer(tmp_path_factory):
        tok = tiny.tokenizer()
        model = tiny.llama(tok)
        data = Dataset.from_dict({{"prompt": tiny.PROMPTS, "chosen": tiny.COMPLETIONS,
                                   "rejected": tiny.COMPLETIONS[1:] + tiny.COMPLETIONS[:1]}})
        args = tiny.trainer_args(tmp_path_factory.mktemp("dpo"), DPOConfig, max_length=64, beta=0.1)
        tt.KEEP["dpo"] = DPOTrainer(model=model, ref_model={ref}, args=args, processing_class=tok, train_dataset=data)
        return tt.KEEP["dpo"]
"""


def test_shallow_copy_reference_shares_the_policys_weights(project):
    project.conftest(DPO.format(ref="copy.copy(model)"))
    run = project.run("--dlcheck=L9")
    run.assert_outcome("L9", "failed")
    text = tt.section(run, "L9")
    assert (
        "20 of 20 reference parameter tensors share storage with the policy's: ref model.embed_tokens.weight is policy model.embed_tokens.weight"
        in text
    )
    assert "moved the reference's log-probs of batch 0 by" in text and "a frozen one moves by 0" in text
    assert "0.69315 before the step, 0.69315 after (ln 2 = 0.69315)" in text
    assert "batch 0, row 0: 'what is 2+2? The answer is 4." in text
    assert "ref_model=copy.deepcopy(model)" in text


def test_deep_copy_reference_is_frozen_and_the_policy_is_restored(project):
    import tiny
    import torch

    project.conftest(DPO.format(ref="copy.deepcopy(model)"))
    run = project.run("--dlcheck=L9", "-rA")
    run.assert_outcome("L9", "passed")
    run.fnmatch(
        [
            "one SGD step on the policy (its chosen+rejected log-likelihood moved by * nats) left the reference's "
            "log-probs of batch 0 unchanged (max |Δ| 0)",
            "0 of 20 reference parameter tensors share storage with the policy's; no optimizer built yet",
            "DPO loss on batch 0 (beta 0.1): 0.69315 before the step, 0.68406 after (ln 2 = 0.69315)",
        ]
    )
    assert "0.69315 after" not in run.text
    trainer = tt.KEEP.pop("dpo")
    fresh = tiny.llama(tiny.tokenizer())
    for (name, p), q in zip(trainer.model.named_parameters(), fresh.parameters()):
        assert torch.equal(p, q), f"{name} was not restored"
        assert p.grad is None


def test_sft_trainer_skips(project):
    project.conftest("""
    import pytest, tiny
    from datasets import Dataset
    from trl import SFTConfig, SFTTrainer

    @pytest.fixture(scope="session")
    def dlcheck_trainer(tmp_path_factory):
        tok = tiny.tokenizer()
        return SFTTrainer(model=tiny.llama(tok), args=tiny.trainer_args(tmp_path_factory.mktemp("o"), SFTConfig),
                          processing_class=tok, train_dataset=Dataset.from_dict({"text": tiny.texts()}))
    """)
    run = project.run("--dlcheck=L9")
    run.assert_outcome("L9", "skipped")
    run.fnmatch(
        [
            "*::L9_dpo_reference SKIPPED (not applicable: *",
            "SKIPPED * not applicable: SFTTrainer is not a preference trainer with a reference model: L9 concerns TRL's "
            "DPOTrainer and KTOTrainer",
        ]
    )


def test_preference_data_without_its_trainer_asks_for_the_trainer(project):
    project.conftest("""
    import pytest, tiny

    @pytest.fixture(scope="session")
    def dlcheck_raw_dataset():
        return [{"prompt": p, "chosen": c, "rejected": r}
                for p, c, r in zip(tiny.PROMPTS, tiny.COMPLETIONS, tiny.COMPLETIONS[1:] + tiny.COMPLETIONS[:1])]
    """)
    run = project.run("--dlcheck=L9")
    run.assert_outcome("L9", "skipped")
    run.fnmatch(["SKIPPED * missing role: define fixture dlcheck_trainer*in conftest.py"])


def test_hand_lm_pipeline_without_a_trainer_is_not_applicable(project):
    # model, tokenizer and plain token data, no trainer: nothing of it is DPO, so no fixture is asked for
    project.conftest("""
    import pytest, tiny

    @pytest.fixture(scope="session")
    def dlcheck_tokenizer():
        return tiny.tokenizer()

    @pytest.fixture(scope="session")
    def dlcheck_model(dlcheck_tokenizer):
        return tiny.llama(dlcheck_tokenizer)

    @pytest.fixture(scope="session")
    def dlcheck_dataset(dlcheck_tokenizer):
        return tiny.tokenized(dlcheck_tokenizer)
    """)
    run = project.run("--dlcheck=L9")
    run.fnmatch(
        [
            "SKIPPED * not applicable: no DPO training in the given fixtures: no dlcheck_trainer, no DPO training "
            "arguments, no chosen/rejected examples"
        ]
    )
    assert "missing role" not in run.text
