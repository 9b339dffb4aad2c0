"""L5: training rows within the model's positions; inference rope settings equal the training ones."""

from helpers import flat

# imported here, outside pytester's in-process runs (a run unloads the modules first imported inside it)
from transformers import BloomConfig, BloomForCausalLM  # noqa: F401

LONG_ROWS = """
    import copy, pytest, tiny
    from transformers import DataCollatorForLanguageModeling, LlamaConfig

    @pytest.fixture(scope="session")
    def dlcheck_tokenizer():
        return tiny.tokenizer()

    @pytest.fixture(scope="session")
    def dlcheck_model(dlcheck_tokenizer):
        return tiny.{arch}(dlcheck_tokenizer, {size}, **{overrides})

    @pytest.fixture(scope="session")
    def dlcheck_collator(dlcheck_tokenizer):
        return DataCollatorForLanguageModeling(dlcheck_tokenizer, mlm=False)

    @pytest.fixture(scope="session")
    def dlcheck_dataset(dlcheck_tokenizer):
        text = " ".join(tiny.texts(12))
        return [dlcheck_tokenizer(text[i:], truncation=True, max_length=128) for i in range(4)]
"""

LINEAR2 = {"rope_parameters": {"rope_type": "linear", "factor": 2.0}}


def long_rows(arch="llama", positions=64, overrides=None):
    size = f"max_positions={positions}" if arch == "llama" else f"n_positions={positions}"
    return LONG_ROWS.format(arch=arch, size=size, overrides=overrides or {})


def test_128_token_rows_on_64_positions_fail(project):
    project.conftest(long_rows())
    run = project.run("--dlcheck=L5")
    run.assert_outcome("L5", "failed")
    text = flat(run.section("L5"))
    assert (
        "longest sampled training sequence: 128 positions (tokens) > 64 = max_position_embeddings 64 "
        "(rope_type 'default', no scaling)"
    ) in text
    assert "example 0.0: 'what is 2+2?" in text
    assert "rotary positions beyond them were never trained" in text
    assert "max_length=64" in text and "'rope_type': 'yarn', 'factor': 2" in text
    assert "Traceback" not in run.text


def test_gpt2_rows_past_its_position_table_fail(project):
    project.conftest(long_rows("gpt2"))
    run = project.run("--dlcheck=L5")
    run.assert_outcome("L5", "failed")
    text = flat(run.section("L5"))
    assert (
        "> 64 = max_position_embeddings 64 (learned absolute position embeddings: transformer.wpe has 64 rows)" in text
    )
    assert "positions beyond the table do not exist" in text


def test_enough_positions_pass(project):
    project.conftest(long_rows(positions=256))
    run = project.run("--dlcheck=L5", "-rA")
    run.assert_outcome("L5", "passed")
    run.fnmatch(["*::L5_positions PASSED (longest sampled training sequence: 128 positions (tokens) <= 256 =*"])
    run.fnmatch(
        [
            "longest sampled training sequence: 128 positions (tokens) <= 256 = max_position_embeddings 256 "
            "(rope_type 'default', no scaling); source: dlcheck_collator on 4 examples of dlcheck_dataset",
            "not checked: no dlcheck_inference_config to compare rope settings with",
        ]
    )


def test_linear_rope_scaling_covers_the_rows(project):
    project.conftest(long_rows(positions=64, overrides=LINEAR2))
    run = project.run("--dlcheck=L5", "-rA")
    run.assert_outcome("L5", "passed")
    run.fnmatch(
        [
            "longest sampled training sequence: 128 positions (tokens) <= 128 = max_position_embeddings 64 x rope "
            "factor 2 (linear)*"
        ]
    )


INFERENCE = """
    import copy, pytest, tiny
    from transformers import LlamaConfig

    @pytest.fixture(scope="session")
    def dlcheck_model():
        return tiny.llama(tiny.tokenizer(), max_positions=64, **{train})

    @pytest.fixture(scope="session")
    def dlcheck_inference_config(dlcheck_model):
        {infer}
"""


def test_inference_without_the_training_rope_scaling_fails(project):
    project.conftest(INFERENCE.format(train=LINEAR2, infer="return LlamaConfig(max_position_embeddings=64)"))
    run = project.run("--dlcheck=L5")
    run.assert_outcome("L5", "failed")
    text = flat(run.section("L5"))
    assert "rope settings differ between the training model's config and dlcheck_inference_config (2 fields)" in text
    assert "factor: training 2.0, inference '(unset)'" in text
    assert "rope_type: training 'linear', inference 'default'" in text
    assert "model.config.save_pretrained" in text


def test_inference_with_another_rope_theta_fails(project):
    project.conftest(
        INFERENCE.format(train={}, infer="return LlamaConfig(max_position_embeddings=64, rope_theta=500000.0)")
    )
    run = project.run("--dlcheck=L5")
    run.assert_outcome("L5", "failed")
    assert "rope_theta: training 10000.0, inference 500000.0" in flat(run.section("L5"))


def test_inference_with_the_training_config_passes(project):
    project.conftest(INFERENCE.format(train=LINEAR2, infer="return copy.deepcopy(dlcheck_model.config)"))
    run = project.run("--dlcheck=L5", "-rA")
    run.assert_outcome("L5", "passed")
    run.fnmatch(
        [
            "rope settings and max_position_embeddings of dlcheck_inference_config equal the training model's "
            "(factor=2.0, rope_theta=10000.0, rope_type='linear', max_position_embeddings 64)",
            "not checked: training data: missing role: define fixture dlcheck_dataloader*",
        ]
    )


def test_inference_config_json_in_transformers_4_layout_passes(project, tmp_path):
    # the same settings written the transformers 4 way: rope_scaling {"type": ...} + a top-level rope_theta
    (tmp_path / "config.json").write_text(
        '{"model_type": "llama", "max_position_embeddings": 64, "rope_theta": 10000, '
        '"rope_scaling": {"type": "linear", "factor": 2}}'
    )
    project.conftest(INFERENCE.format(train=LINEAR2, infer=f"return {str(tmp_path)!r}"))
    run = project.run("--dlcheck=L5")
    run.assert_outcome("L5", "passed")


def test_training_free_yarn_at_inference_passes(project):
    infer = (
        "return LlamaConfig(max_position_embeddings=64, rope_parameters={'rope_type': 'yarn', 'factor': 4.0, "
        "'original_max_position_embeddings': 64})"
    )
    project.conftest(INFERENCE.format(train={}, infer=infer))
    run = project.run("--dlcheck=L5", "-rA")
    run.assert_outcome("L5", "passed")
    run.fnmatch(
        [
            "rope settings of dlcheck_inference_config differ acceptably, the inference config adds a training-free "
            "context extension (dynamic NTK / YaRN): factor: training '(unset)', inference 4.0*"
        ]
    )


def test_nothing_to_compare_skips(project):
    project.conftest(
        INFERENCE.format(train={}, infer="return None").replace(
            '@pytest.fixture(scope="session")\n    def dlcheck_inference_config(dlcheck_model):\n        return None',
            "",
        )
    )
    run = project.run("--dlcheck=L5")
    run.assert_outcome("L5", "skipped")
    assert "no dlcheck_inference_config to compare rope settings with" in run.text
    assert "not applicable" not in run.text


def test_alibi_model_without_inference_config_is_not_applicable(project):
    # BLOOM places tokens with ALiBi: its config declares no position limit, and it has no rope
    project.conftest(
        LONG_ROWS.format(arch="llama", size="", overrides={}).replace(
            "return tiny.llama(dlcheck_tokenizer, , **{})",
            "from transformers import BloomConfig, BloomForCausalLM\n"
            "        return BloomForCausalLM(BloomConfig(vocab_size=len(dlcheck_tokenizer), hidden_size=64, n_layer=2, "
            "n_head=4))",
        )
    )
    run = project.run("--dlcheck=L5")
    run.fnmatch(
        [
            "*::L5_positions SKIPPED (not applicable: *",
            "SKIPPED * not applicable: bloom config declares no max_position_embeddings (ALiBi or relative "
            "positions): no position limit to exceed and no rope settings to compare",
        ]
    )


SFT = """
    import pytest, tiny
    from datasets import Dataset
    from trl import SFTConfig, SFTTrainer

    @pytest.fixture(scope="session")
    def dlcheck_trainer(tmp_path_factory):
        tok = tiny.tokenizer()
        args = tiny.trainer_args(tmp_path_factory.mktemp("sft"), SFTConfig{max_length})
        return SFTTrainer(model=tiny.llama(tok, max_positions=256), args=args,
                          train_dataset=Dataset.from_dict({{"text": tiny.texts(8)}}), processing_class=tok)
"""


def test_explicit_max_length_beyond_the_positions_fails(project):
    project.conftest(SFT.format(max_length=", max_length=512"))
    run = project.run("--dlcheck=L5")
    run.assert_outcome("L5", "failed")
    text = flat(run.section("L5"))
    assert "SFTConfig.max_length = 512 > 256 = max_position_embeddings 256" in text
    assert "SFTConfig(max_length=256)" in text


def test_trl_default_max_length_is_not_judged(project):
    # SFTConfig's default max_length (1024) is larger than the tiny model's 256 positions, but not a choice
    project.conftest(SFT.format(max_length=""))
    run = project.run("--dlcheck=L5", "-rA")
    run.assert_outcome("L5", "passed")
    run.fnmatch(
        [
            "longest sampled training sequence: 31 positions (tokens) <= 256 = max_position_embeddings 256 "
            "(rope_type 'default', no scaling); source: dlcheck_collator on 8 examples of dlcheck_dataset"
        ]
    )
    assert "SFTConfig.max_length" not in run.text


def test_rope_settings_normalize_across_layouts():
    from transformers import LlamaConfig

    from pytest_dlcheck.checks.llm.positions import (
        _as_dict,
        compare_rope,
        position_limit,
        rope_settings,
    )

    v5 = _as_dict(LlamaConfig(max_position_embeddings=64, rope_parameters={"rope_type": "linear", "factor": 2.0}))
    v4 = {"max_position_embeddings": 64, "rope_theta": 10000, "rope_scaling": {"type": "linear", "factor": 2}}
    assert rope_settings(v5) == rope_settings(v4) == {"rope_type": "linear", "factor": 2.0, "rope_theta": 10000.0}
    assert compare_rope(v5, v4) == ([], None)
    assert position_limit(v5).positions == 128
    yarn = {
        "max_position_embeddings": 32768,
        "rope_parameters": {"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 32768},
    }
    assert position_limit(yarn).positions == 131072
    llama3 = {
        "max_position_embeddings": 131072,
        "rope_parameters": {
            "rope_type": "llama3",
            "factor": 8.0,
            "original_max_position_embeddings": 8192,
            "rope_theta": 500000.0,
        },
    }
    assert position_limit(llama3).positions == 131072
    per_layer = {
        "max_position_embeddings": 64,
        "rope_parameters": {
            "full_attention": {"rope_type": "linear", "factor": 2.0, "rope_theta": 1e6},
            "sliding_attention": {"rope_type": "default", "rope_theta": 1e4},
        },
    }
    assert rope_settings(per_layer)["full_attention.factor"] == 2.0
    assert position_limit(per_layer).positions == 128


def test_t5_legacy_n_positions_binds_nothing(project):
    # t5-small's config.json carries a legacy n_positions 512, but T5 places tokens with relative-attention
    # buckets: no table to index past, so 128-token rows on "64 positions" are no finding (run_summarization)
    project.conftest(
        LONG_ROWS.format(arch="llama", size="", overrides={}).replace(
            "return tiny.llama(dlcheck_tokenizer, , **{})",
            "from transformers import T5Config, T5ForConditionalGeneration\n"
            "        return T5ForConditionalGeneration(T5Config(vocab_size=len(dlcheck_tokenizer), d_model=32, d_ff=64, "
            "d_kv=8, num_layers=1, num_heads=4, n_positions=64, decoder_start_token_id=0))",
        )
    )
    run = project.run("--dlcheck=L5")
    run.fnmatch(
        [
            "*::L5_positions SKIPPED (not applicable: *",
            "SKIPPED * not applicable: the config declares 64 positions, but T5ForConditionalGeneration has no "
            "position table of that size and no rotary embedding (relative positions)*",
        ]
    )
