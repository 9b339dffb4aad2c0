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
    assert "(allowed 1/40 to 40×)" in text
    assert "the scale of the text embeddings" in text


def test_llava_projector_fits(project):
    project.conftest(PROJECT.format(change=""))
    run = project.run("--dlcheck=X2", "-rA")
    run.assert_outcome("X2", "passed")
    run.fnmatch(
        [
            "*::X2_projector PASSED (projector output width 64 = the LM's hidden size 64; image tokens*",
            "*dlcheck evidence*",
            "projector output width 64 = the LM's hidden size 64; image tokens' mean norm 0.0839 is 0.522× the text "
            "embeddings' 0.161 (allowed 1/40 to 40×)",
            "the projector model.model.multi_modal_projector outputs image tokens of width 64 (on a sampled batch); the "
            "language model's token embeddings model.model.language_model.embed_tokens are Embedding(301, 64): hidden "
            "size 64, equal",
            "image tokens from model.model.multi_modal_projector: mean norm 0.0839 over 64 tokens; text token "
            "embeddings (model.model.language_model.embed_tokens) of the same batch: mean norm 0.161 over 75 tokens",
        ]
    )


def test_projector_width_without_data_passes_on_the_width_alone(project):
    project.conftest(
        PROJECT.format(change="")
        .replace("def dlcheck_dataset", "def _unused_dataset")
        .replace("def dlcheck_collator", "def _unused_collator")
    )
    run = project.run("--dlcheck=X2", "-rA")
    run.assert_outcome("X2", "passed")
    run.fnmatch(
        [
            "*dlcheck evidence*",
            "projector output width 64 = the LM's hidden size 64",
            "the projector model.model.multi_modal_projector ends in Linear(in_features=64, out_features=64, bias=True) "
            "(out_features=64); * hidden size 64, equal",
            "the scale was not compared: no data (define dlcheck_dataloader)",
        ]
    )


def test_declared_towers_without_a_projector_are_not_applicable(project):
    """A cross-attention style declaration (no projector tower): X2 has nothing to judge and says so."""
    project.conftest(
        PROJECT.format(change="")
        + """
    @pytest.fixture(scope="session")
    def dlcheck_towers():
        return {"vision": "model.vision_tower", "language_model": ["model.language_model", "lm_head"]}
    """
    )
    run = project.run("--dlcheck=X2")
    run.assert_outcome("X2", "skipped")
    assert (
        "not applicable: dlcheck_towers declares no projector (vision, language_model): X2 judges a projector whose "
        "output takes the place of token embeddings"
    ) in run.text


def test_default_initialised_hand_projector_of_the_right_width_fits(project):
    """PyTorch's default Linear init gives image tokens ~10-15× the text embeddings' norm: inside the bound."""
    project.conftest(PROJECT.format(change=HAND_PROJECTOR.replace("48", "64")))
    project.run("--dlcheck=X2,X5").assert_outcome("X2", "passed")


def test_stray_sqrt_hidden_factor_on_a_hand_projector_drowns_the_text(project):
    """LLaVA's Linear-GELU-Linear builder (10.5-13.6× the text embeddings) with its output multiplied by
    sqrt(64) = 8: 86-109× on 5 seeds, some of which the former bound of 100 let pass."""
    project.conftest(
        PROJECT.format(
            change="model.model.multi_modal_projector = tinyvlm.ScaledProjector(tinyvlm.hand_projector(), 64)"
        )
    )
    run = project.run("--dlcheck=X2")
    run.assert_outcome("X2", "failed")
    text = flat(run.section("X2"))
    assert "image tokens from model.model.multi_modal_projector: mean norm" in text
    ratio = float(text.split("ratio ")[1].split("×")[0])
    assert 80 < ratio < 110, text
    assert "(allowed 1/40 to 40×)" in text
    assert "the image tokens dominate every attention and norm in the LM's first layers" in text


def test_stray_sqrt_hidden_factor_on_transformers_projector_in_a_1024_wide_lm(project):
    """transformers' LlavaMultiModalProjector (1.9-2.2× at width 1024) times sqrt(1024) = 32: 62-70×."""
    project.conftest(
        PROJECT.format(
            change="model.model.multi_modal_projector = tinyvlm.ScaledProjector(model.model.multi_modal_projector, 1024)"
        ).replace(
            "tinyvlm.llava(dlcheck_tokenizer.tokenizer)", "tinyvlm.llava(dlcheck_tokenizer.tokenizer, hidden=1024)"
        )
    )
    run = project.run("--dlcheck=X2")
    run.assert_outcome("X2", "failed")
    ratio = float(flat(run.section("X2")).split("ratio ")[1].split("×")[0])
    assert 55 < ratio < 75


def test_transformers_projector_in_a_1024_wide_lm_fits(project):
    project.conftest(
        PROJECT.format(change="").replace(
            "tinyvlm.llava(dlcheck_tokenizer.tokenizer)", "tinyvlm.llava(dlcheck_tokenizer.tokenizer, hidden=1024)"
        )
    )
    run = project.run("--dlcheck=X2", "-rA")
    run.assert_outcome("X2", "passed")
    assert "(allowed 1/40 to 40×)" in run.text
