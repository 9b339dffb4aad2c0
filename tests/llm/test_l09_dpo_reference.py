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
    project.run("--dlcheck=L9").assert_outcome("L9", "passed")
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
    project.run("--dlcheck=L9").assert_outcome("L9", "skipped")
