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
    run = project.run("--dlcheck=T2", "-rA")
    run.fnmatch(["*::T2_overfit_batch PASSED (batch 0 loss 1.493 -> *"])
    run.fnmatch(
        [
            "batch 0 loss 1.493 -> 0.001883 after 30 steps on that batch alone at lr 0.01 (1x your base LR): 100% less, "
            "50% needed"
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
        args = tiny.trainer_args(tmp_path_factory.mktemp("o"), SFTConfig, learning_rate=1e-3)
        return SFTTrainer(model=tiny.llama(tok), args=args, processing_class=tok, train_dataset=data)
"""


def test_sft_trainer_overfits_and_leaves_the_users_model_alone(project):
    project.conftest(SFT)
    run = project.run("--dlcheck=T1,T2,T3", "-rA")
    for cid in ("T1", "T2", "T3"):
        run.assert_outcome(cid, "passed")
    run.fnmatch(
        ["batch 0 loss * -> * after 30 steps on that batch alone at lr * (*x your base LR): *% less, 50% needed*"]
    )
    run.fnmatch(["all 20 trainable parameter tensors get a gradient from the loss on batch 0 (loss *)"])


GRPO = """
    import pytest, tiny
    from datasets import Dataset
    from trl import GRPOConfig, GRPOTrainer

    def reward(completions, **kw):
        return [float(len(c)) for c in completions]

    @pytest.fixture(scope="session")
    def dlcheck_trainer(tmp_path_factory):
        tok = tiny.tokenizer()
        args = tiny.trainer_args(tmp_path_factory.mktemp("grpo"), GRPOConfig, num_generations=2, max_completion_length=8,
                                 per_device_train_batch_size=4)
        return GRPOTrainer(model=tiny.llama(tok), reward_funcs=reward, args=args, processing_class=tok,
                           train_dataset=Dataset.from_dict({"prompt": tiny.PROMPTS}))
"""


def test_grpo_has_no_batch_to_memorise_nor_classes(project):
    project.conftest(GRPO)
    run = project.run("--dlcheck=T1,T2")
    run.assert_outcome("T1", "skipped")
    run.assert_outcome("T2", "skipped")
    run.fnmatch(
        [
            "*not applicable: GRPOTrainer's loss is computed on completions it generates inside each step: there is "
            "no fixed batch to memorise*"
        ]
    )
    run.fnmatch(
        [
            "*not applicable: GRPOTrainer's loss is a policy-gradient objective on generated completions, not a "
            "cross-entropy over classes*"
        ]
    )
