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
    project.run("--dlcheck=S4", "--dlcheck-set=S1.steps=6").assert_outcome("S4", "passed")
