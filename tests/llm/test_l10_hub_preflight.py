"""L10: push_to_hub has a token and a valid repo id, checked offline."""

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "train"))
import tiny_train as tt  # noqa: E402

ARGS = """
    import pytest
    from transformers import TrainingArguments

    @pytest.fixture(scope="session")
    def dlcheck_training_args(tmp_path_factory):
        out = tmp_path_factory.mktemp("runs") / {out!r}
        return TrainingArguments(output_dir=str(out), report_to="none", use_cpu=True, push_to_hub={push}, {hub})
"""


@pytest.fixture
def no_token(monkeypatch, tmp_path):
    from huggingface_hub import constants

    for var in ("HF_TOKEN", "HUGGING_FACE_HUB_TOKEN", "HF_OIDC_RESOURCE"):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setattr(constants, "HF_TOKEN_PATH", str(tmp_path / "no-token"))
    return monkeypatch


def test_push_to_hub_without_a_token(project, no_token):
    project.conftest(ARGS.format(out="sft", push=True, hub="hub_model_id='me/tiny-sft'"))
    run = project.run("--dlcheck=L10")
    run.assert_outcome("L10", "failed")
    text = tt.section(run, "L10")
    assert "push_to_hub=True, hub_model_id='me/tiny-sft'" in text
    assert "no token: hub_token is None, HF_TOKEN and HUGGING_FACE_HUB_TOKEN are unset, no token file at" in text
    assert "hf auth login" in text


def test_repo_named_after_an_output_dir_with_a_space(project, no_token):
    no_token.setenv("HF_TOKEN", "hf_" + "x" * 34)
    project.conftest(ARGS.format(out="my run", push=True, hub="hub_model_id=None"))
    run = project.run("--dlcheck=L10")
    run.assert_outcome("L10", "failed")
    text = tt.section(run, "L10")
    assert "hub_model_id unset, so the repo is named after output_dir: 'my run'" in text
    assert "the repo id 'my run' is invalid" in text and "hub_model_id='your-name/your-model'" in text


def test_token_in_the_environment_and_a_valid_id_pass(project, no_token):
    no_token.setenv("HF_TOKEN", "hf_" + "x" * 34)
    project.conftest(ARGS.format(out="sft", push=True, hub="hub_model_id='me/tiny-sft'"))
    run = project.run("--dlcheck=L10", "-rA")
    run.assert_outcome("L10", "passed")
    run.fnmatch(
        [
            "*::L10_hub_preflight PASSED (push_to_hub=True, hub_model_id='me/tiny-sft': a valid repo*",
            "push_to_hub=True, hub_model_id='me/tiny-sft': a valid repo id; the push finds a token in the HF_TOKEN "
            "environment variable",
        ]
    )


def test_no_push_skips(project, no_token):
    project.conftest(ARGS.format(out="sft", push=False, hub="hub_model_id=None"))
    run = project.run("--dlcheck=L10")
    run.assert_outcome("L10", "skipped")
    run.fnmatch(["SKIPPED * not applicable: push_to_hub is off: the training pushes nothing to the Hub"])


def test_hand_loop_without_training_arguments_is_not_applicable(project, no_token):
    project.conftest("""
    import pytest, tiny

    @pytest.fixture(scope="session")
    def dlcheck_tokenizer():
        return tiny.tokenizer()
    """)
    run = project.run("--dlcheck=L10")
    run.assert_outcome("L10", "skipped")
    run.fnmatch(
        [
            "SKIPPED * not applicable: no training arguments (dlcheck_training_args or dlcheck_trainer): nothing in "
            "the given fixtures configures a push to the Hub"
        ]
    )
    assert "missing role" not in run.text
