"""S4: a DPO run leaves ln 2; a reference that shares the policy's parameters pins it there."""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "train"))
import tiny_train as tt  # noqa: E402

DPO = """
    import copy, pytest, tiny
    from datasets import Dataset
    from trl import DPOConfig, DPOTrainer

    @pytest.fixture(scope="session")
    def dlcheck_trainer(tmp_path_factory):
        tok = tiny.tokenizer()
        model = tiny.llama(tok)
        data = Dataset.from_dict({{"prompt": tiny.PROMPTS, "chosen": tiny.COMPLETIONS,
                                   "rejected": tiny.COMPLETIONS[1:] + tiny.COMPLETIONS[:1]}})
        args = tiny.trainer_args(tmp_path_factory.mktemp("dpo"), DPOConfig, max_length=64, beta=0.1, learning_rate=1e-3)
        return DPOTrainer(model=model, ref_model=copy.{copy}(model), args=args, processing_class=tok, train_dataset=data)
"""


def test_reference_sharing_the_policys_parameters(project):
    project.conftest(DPO.format(copy="copy"))
    run = project.run("--dlcheck=S4", "--dlcheck-set=S1.steps=6")
    run.assert_outcome("S4", "failed")
    text = tt.section(run, "S4")
    assert "all 6 steps of the smoke run: loss within 0.001 of ln 2 = 0.6931 (1: 0.69315" in text
    assert "rewards/accuracies: max 0.00" in text
    assert "reference parameters share storage with the policy's (e.g. model.embed_tokens.weight)" in text
    assert "ref_model=copy.deepcopy(model)" in text


def test_independent_reference_leaves_ln2(project):
    project.conftest(DPO.format(copy="deepcopy"))
    run = project.run("--dlcheck=S4", "--dlcheck-set=S1.steps=6", "-rA")
    run.fnmatch(["*::S4_preference_pinned PASSED (6-step DPO smoke run: loss 0.69315 -> *"])
    run.fnmatch(
        [
            "6-step DPO smoke run: loss 0.69315 -> *; it leaves ln 2 = 0.6931 by more than 0.001 at step 2 (*), and "
            "at * of 6 steps"
        ]
    )


SFT = """
    import pytest, tiny
    from datasets import Dataset
    from trl import SFTConfig, SFTTrainer

    @pytest.fixture(scope="session")
    def dlcheck_trainer(tmp_path_factory):
        tok = tiny.tokenizer()
        data = Dataset.from_dict({"prompt": tiny.PROMPTS, "completion": tiny.COMPLETIONS})
        return SFTTrainer(model=tiny.llama(tok), args=tiny.trainer_args(tmp_path_factory.mktemp("o"), SFTConfig),
                          processing_class=tok, train_dataset=data)
"""


def test_other_kinds_of_training_are_not_applicable(project):
    """S4 concerns the DPO loss: an SFTTrainer or a plain loop says so, with no smoke run spent on it."""
    project.conftest(SFT)
    run = project.run("--dlcheck=S4")
    run.assert_outcome("S4", "skipped")
    run.fnmatch(
        [
            "*not applicable: dlcheck_trainer is a SFTTrainer, not a preference trainer (DPOTrainer): its loss has no "
            "reason to start at ln 2*"
        ]
    )
    project.conftest(tt.loop_project())
    run = project.run("--dlcheck=S4")
    run.assert_outcome("S4", "skipped")
    run.fnmatch(["*not applicable: the training is given as dlcheck_make_training: S4 judges TRL's preference*"])
