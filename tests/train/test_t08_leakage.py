"""T8: no eval example is also a training example."""

import tiny_train as tt

SFT = """
    import pytest, tiny
    from datasets import Dataset
    from trl import SFTConfig, SFTTrainer

    @pytest.fixture(scope="session")
    def dlcheck_trainer(tmp_path_factory):
        tok = tiny.tokenizer()
        data = Dataset.from_dict({{"text": tiny.texts(12)[:6]}})
        held_out = Dataset.from_dict({{"text": ["a tiny model learned to stop", "the lazy dog jumps"]}})
        args = tiny.trainer_args(tmp_path_factory.mktemp("o"), SFTConfig)
        return SFTTrainer(model=tiny.llama(tok), args=args, processing_class=tok, train_dataset=data,
                          eval_dataset={eval})
"""


def test_eval_split_taken_from_the_training_data(project):
    project.conftest(SFT.format(eval="data.select(range(4))"))
    run = project.run("--dlcheck=T8")
    run.assert_outcome("T8", "failed")
    text = tt.section(run, "T8")
    assert "4 of 4 eval examples (100%) are also in the 6 training examples, by content: eval #0 = train #0" in text
    assert "'what is 2+2? The answer is 4." in text and "train_test_split" in text


def test_held_out_eval_split_passes(project):
    project.conftest(SFT.format(eval="held_out"))
    project.run("--dlcheck=T8").assert_outcome("T8", "passed")


def test_plain_loop_eval_loader_over_training_examples(project):
    project.conftest(
        tt.loop_project(
            extra="""
    @pytest.fixture(scope="session")
    def dlcheck_eval_dataloader():
        return torch.utils.data.DataLoader(torch.utils.data.Subset(tt.blobs(), range(8, 16)), batch_size=8)
    """
        )
    )
    run = project.run("--dlcheck=T8")
    run.assert_outcome("T8", "failed")
    assert "8 of 8 eval examples (100%) are also in the 64 training examples" in tt.section(run, "T8")


def test_plain_loop_disjoint_eval_passes(project):
    project.conftest(tt.loop_project())
    project.run("--dlcheck=T8").assert_outcome("T8", "passed")
