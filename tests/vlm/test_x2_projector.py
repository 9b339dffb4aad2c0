"""X2: the projector's output width equals the LM hidden size; its scale is comparable to the embeddings."""

import tinyvlm  # noqa: F401  (imports the libraries before the in-process runs)
from helpers import flat

PROJECT = """
    import pytest, torch, tinyvlm

    @pytest.fixture(scope="session")
    def dlcheck_tokenizer():
        return tinyvlm.processor()

    @pytest.fixture(scope="session")
    def dlcheck_model(dlcheck_tokenizer):
        model = tinyvlm.llava(dlcheck_tokenizer.tokenizer)
        {change}
        return model

    @pytest.fixture(scope="session")
    def dlcheck_dataset():
        return tinyvlm.rows(8)

    @pytest.fixture(scope="session")
    def dlcheck_collator(dlcheck_tokenizer):
        return tinyvlm.collator(dlcheck_tokenizer)
"""

#: a projector written by hand for another LM size: 48 wide, while the LM is 64 wide
HAND_PROJECTOR = (
    "model.model.multi_modal_projector = torch.nn.Sequential(torch.nn.Linear(32, 48), torch.nn.GELU(), "
    "torch.nn.Linear(48, 48))"
)


def test_projector_built_for_another_lm_width(project):
    project.conftest(PROJECT.format(change=HAND_PROJECTOR))
    run = project.run("--dlcheck=X2,X4,X5")
    run.assert_outcome("X2", "failed")
    text = flat(run.section("X2"))
    assert (
        "the projector model.model.multi_modal_projector outputs image tokens of width 48 (on a sampled batch)" in text
    )
    assert "model.model.language_model.embed_tokens are Embedding(301, 64): hidden size 64" in text
    assert (
        "the forward pass raises ValueError: Image features and image tokens do not match, tokens: 64, features: 3072"
        in text
    )
    assert "reads like truncation" in text
    assert "out_features=64 (model.config.text_config.hidden_size = 64)" in text
    # the counts are right (X4 passes); the forward cannot run, so X5 names the owners
    run.assert_outcome("X4", "passed")
    run.assert_outcome("X5", "skipped")


def test_projector_width_without_data_is_read_from_its_last_linear(project):
    project.conftest(
        PROJECT.format(change=HAND_PROJECTOR)
        .split('@pytest.fixture(scope="session")\ndef dlcheck_dataset')[0]
        .replace("def dlcheck_dataset", "def _unused_dataset")
        .replace("def dlcheck_collator", "def _unused_collator")
    )
    run = project.run("--dlcheck=X2")
    run.assert_outcome("X2", "failed")
    text = flat(run.section("X2"))
    assert "ends in Linear(in_features=48, out_features=48, bias=True) (out_features=48)" in text


def test_projector_initialised_at_std_1_drowns_the_text(project):
    project.conftest(
        PROJECT.format(change="[torch.nn.init.normal_(p) for p in model.model.multi_modal_projector.parameters()]")
    )
    run = project.run("--dlcheck=X2")
    run.assert_outcome("X2", "failed")
    text = flat(run.section("X2"))
    assert "image tokens from model.model.multi_modal_projector: mean norm" in text
    assert "(allowed 1/100 to 100×)" in text
    assert "the scale of the text embeddings" in text


def test_llava_projector_fits(project):
    project.conftest(PROJECT.format(change=""))
    project.run("--dlcheck=X2").assert_outcome("X2", "passed")


def test_default_initialised_hand_projector_of_the_right_width_fits(project):
    """PyTorch's default Linear init gives image tokens ~10-15× the text embeddings' norm: inside the bound."""
    project.conftest(PROJECT.format(change=HAND_PROJECTOR.replace("48", "64")))
    project.run("--dlcheck=X2,X5").assert_outcome("X2", "passed")
