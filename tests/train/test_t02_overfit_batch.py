"""T2: repeated steps on one batch memorise it."""

import tiny_train as tt


def test_softmax_before_cross_entropy_cannot_overfit(project):
    project.conftest(tt.loop_project(model="tt.SoftmaxMLP()"))
    run = project.run("--dlcheck=T2")
    run.assert_outcome("T2", "failed")
    text = tt.section(run, "T2")
    assert "after 30 steps on that batch alone: lr 0.01 (1x)" in text and "(100x)" in text
    assert "outputs are probabilities" in text and "drop the final softmax" in text


def test_logits_model_overfits(project):
    project.conftest(tt.loop_project())
    project.run("--dlcheck=T2").assert_outcome("T2", "passed")


SFT = """
    import pytest, tiny
    from datasets import Dataset
    from trl import SFTConfig, SFTTrainer

    @pytest.fixture(scope="session")
    def dlcheck_trainer(tmp_path_factory):
        tok = tiny.tokenizer()
        data = Dataset.from_dict({"prompt": tiny.PROMPTS, "completion": tiny.COMPLETIONS})
        args = tiny.trainer_args(tmp_path_factory.mktemp("o"), SFTConfig, learning_rate=1e-3)
        return SFTTrainer(model=tiny.llama(tok), args=args, processing_class=tok, train_dataset=data)
"""


def test_sft_trainer_overfits_and_leaves_the_users_model_alone(project):
    project.conftest(SFT)
    run = project.run("--dlcheck=T1,T2,T3")
    for cid in ("T1", "T2", "T3"):
        run.assert_outcome(cid, "passed")
