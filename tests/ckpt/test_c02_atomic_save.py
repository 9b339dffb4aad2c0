"""C2: an interrupted save leaves the previous checkpoint loadable."""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "train"))
import tiny_train as tt  # noqa: E402

SAVE = """
    @pytest.fixture(scope="session")
    def dlcheck_save_checkpoint():
        return tt.{save}

    @pytest.fixture(scope="session")
    def dlcheck_load_checkpoint():
        return tt.load_all
"""


def test_torch_save_onto_the_previous_checkpoint(project):
    project.conftest(tt.loop_project(extra=SAVE.format(save="save_all")))
    run = project.run("--dlcheck=C2")
    run.assert_outcome("C2", "failed")
    text = tt.section(run, "C2")
    assert (
        "a save through dlcheck_save_checkpoint was interrupted half way while writing dlcheck-atomic0/checkpoint"
        in text
    )
    # the first half of the bytes torch.save writes to that path
    assert "file sizes before and after the interrupted save: checkpoint: 10106 -> 7809 bytes" in text
    assert "loading dlcheck-atomic0/checkpoint afterwards raises" in text
    assert "os.replace(tmp, path)" in text


def test_save_to_a_temporary_file_then_rename(project):
    project.conftest(tt.loop_project(extra=SAVE.format(save="save_atomic")))
    run = project.run("--dlcheck=C2", "-rA")
    run.fnmatch(["*::C2_atomic_save PASSED (a save through dlcheck_save_checkpoint was interrupted half way*"])
    run.fnmatch(
        [
            "a save through dlcheck_save_checkpoint was interrupted half way while writing "
            "dlcheck-atomic0/checkpoint.tmp: the previous checkpoint dlcheck-atomic0/checkpoint still loads "
            "afterwards, with the previous weights",
            "file sizes before and after the interrupted save: checkpoint: 10106 -> 10106 bytes",
        ]
    )


def test_trainer_checkpoint_directories_keep_the_previous_one(project):
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
    run = project.run("--dlcheck=C2", "-rA")
    run.assert_outcome("C2", "passed")
    run.fnmatch(
        [
            "a save through the Trainer's checkpoint-* directories was interrupted half way while writing "
            "checkpoint-2/*: the previous checkpoint dlcheck-atomic0/checkpoint-1 still loads afterwards",
            # the automatic resume the Trainer offers takes the half-written newest one: said, not judged
            "*automatic resume not judged: the Trainer's automatic resume (resume_from_checkpoint=True, "
            "get_last_checkpoint(output_dir)*takes dlcheck-atomic0/checkpoint-2, which the interrupted save left "
            "without trainer_state.json*",
        ]
    )


#: pytest/examples' word_language_model: ``with open(args.save, 'wb') as f: torch.save(model, f)``
SAVE_THROUGH_FILE = """
    def save_through_file(state, path):
        with open(path, "wb") as f:
            tt.torch.save({"model": state["model"].state_dict()}, f)

    def load_model(state, path):
        state["model"].load_state_dict(tt.torch.load(path)["model"])

    @pytest.fixture(scope="session")
    def dlcheck_save_checkpoint():
        return save_through_file

    @pytest.fixture(scope="session")
    def dlcheck_load_checkpoint():
        return load_model
"""


def test_torch_save_into_a_file_opened_on_the_previous_checkpoint(project):
    # the interrupted write goes through a file object: it is still the previous checkpoint's file, overwritten
    project.conftest(tt.loop_project(extra=SAVE_THROUGH_FILE))
    run = project.run("--dlcheck=C2")
    run.assert_outcome("C2", "failed")
    text = tt.section(run, "C2")
    assert "while writing dlcheck-atomic0/checkpoint" in text, text
    assert "the interrupted file is new" not in text, text
    assert "the save writes straight onto the previous checkpoint's path" in text, text
    assert "is given the same path at both saves" in text, text
    assert "if your script versions its checkpoints instead" in text, text
