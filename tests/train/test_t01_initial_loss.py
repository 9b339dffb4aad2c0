"""T1: the loss before any step is near ln(classes) or below."""

import tiny_train as tt

SFT = """
    import pytest, tiny
    from datasets import Dataset
    from trl import SFTConfig, SFTTrainer

    @pytest.fixture(scope="session")
    def dlcheck_trainer(tmp_path_factory):
        tok = tiny.tokenizer()
        model = tiny.llama(tok{init})
        data = Dataset.from_dict({{"prompt": tiny.PROMPTS, "completion": tiny.COMPLETIONS}})
        args = tiny.trainer_args(tmp_path_factory.mktemp("o"), SFTConfig)
        return SFTTrainer(model=model, args=args, processing_class=tok, train_dataset=data)
"""


def test_huge_initializer_range_starts_confidently_wrong(project):
    project.conftest(SFT.format(init=", initializer_range=1.0"))
    run = project.run("--dlcheck=T1")
    run.assert_outcome("T1", "failed")
    text = tt.section(run, "T1")
    assert "x ln(300) = 5.704" in text and "logits are far too large" in text and "initializer_range" in text


def test_default_initialisation_passes(project):
    project.conftest(SFT.format(init=""))
    run = project.run("--dlcheck=T1")
    run.assert_outcome("T1", "passed")


def test_summed_loss_in_a_plain_loop(project):
    project.conftest(
        tt.loop_project(
            extra="""
    @pytest.fixture(scope="session")
    def dlcheck_loss_fn():
        return nn.CrossEntropyLoss(reduction="sum")
    """
        )
    )
    run = project.run("--dlcheck=T1")
    run.assert_outcome("T1", "failed")
    text = tt.section(run, "T1")
    assert "summed over the batch" in text and "reduction='mean'" in text


def test_plain_loop_mean_loss_passes(project):
    project.conftest(tt.loop_project())
    project.run("--dlcheck=T1").assert_outcome("T1", "passed")
