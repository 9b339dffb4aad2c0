"""L1: padded batches must behave like their examples alone (training), and batched generation like
single-prompt generation."""

import re

import pytest
from helpers import flat

TRAIN = """
    import pytest, torch, tiny
    from transformers import DataCollatorForLanguageModeling

    @pytest.fixture(scope="session")
    def dlcheck_tokenizer():
        return tiny.tokenizer(padding_side={side!r})

    @pytest.fixture(scope="session")
    def dlcheck_model(dlcheck_tokenizer):
        return tiny.{arch}(dlcheck_tokenizer)

    @pytest.fixture(scope="session")
    def dlcheck_collator(dlcheck_tokenizer):
        base = DataCollatorForLanguageModeling(dlcheck_tokenizer, mlm=False)
        if not {positions}:
            return base

        def collate(rows):
            batch = base(rows)
            batch["position_ids"] = (batch["attention_mask"].cumsum(-1) - 1).clamp(min=0)
            return batch
        return collate

    @pytest.fixture(scope="session")
    def dlcheck_dataset(dlcheck_tokenizer):
        return tiny.tokenized(dlcheck_tokenizer)
"""


def train_project(side="left", arch="gpt2", positions=False):
    return TRAIN.format(side=side, arch=arch, positions=positions)


def assert_lose_as_alone(text: str, atol: float = 0.001) -> None:
    """What a pass guarantees: every padded example loses in its batch as alone, within atol. The difference
    itself is float rounding, bitwise 0 on one machine and ~1e-7 on another: not asserted digit for digit."""
    worst = re.search(r"lose as alone: max \|Δ\| (\S+) <= atol 0\.001 nats", text)
    assert worst and float(worst[1]) <= atol, text
    pairs = re.findall(r"loss in batch ([\d.]+), alone ([\d.]+)", text)
    assert pairs and all(abs(float(a) - float(b)) <= atol for a, b in pairs), text


def test_gpt2_trained_on_left_padding_fails(project):
    project.conftest(train_project("left", "gpt2"))
    run = project.run("--dlcheck=L1")
    run.assert_outcome("L1", "failed")
    text = flat(run.section("L1"))
    assert "left-padded sampled examples have another loss in the batch than alone" in text
    assert "pad tokens on the left): loss in batch" in text and "alone" in text
    assert "'what is 2+2? The answer is 4.<|endoftext|>'" in text or "'hello world" in text
    assert "position_ids = attention_mask.cumsum(-1) - 1: Δ at most" in text
    assert "gpt2 numbers positions from the first pad token (learned absolute position embeddings)" in text
    assert "tokenizer.padding_side = 'right'" in text
    assert "Traceback" not in run.text


def test_gpt2_right_padding_passes(project):
    project.conftest(train_project("right", "gpt2"))
    run = project.run("--dlcheck=L1", "-rA")
    run.assert_outcome("L1", "passed")
    run.fnmatch(["*::L1_padding_side PASSED (training: 6 padded examples (6 right-padded) lose as alone*"])
    run.fnmatch(
        [
            "training: 6 padded examples (6 right-padded) lose as alone: max |Δ| * <= atol 0.001 nats (mean NLL "
            "over the same supervised tokens in the batch and alone); source: dlcheck_collator on 8 examples of "
            "dlcheck_dataset",
            "  example 0.0 (4 pad tokens on the right): loss in batch *, alone *",
            "generation: not checked, the pipeline does not generate in batches (no TRL GRPO, RLOO or distillation trainer)*",
        ]
    )
    assert_lose_as_alone(run.text)


def test_gpt2_left_padding_with_position_ids_passes(project):
    project.conftest(train_project("left", "gpt2", positions=True))
    run = project.run("--dlcheck=L1", "-rA")
    run.assert_outcome("L1", "passed")
    # rows of equal length are forwarded alone together (one pass per length): equal up to float rounding
    run.fnmatch(["training: 6 padded examples (6 left-padded) lose as alone: max |Δ| * <= atol 0.001 nats*"])
    assert_lose_as_alone(run.text)


def test_llama_left_padding_is_position_invariant(project):
    # rotary positions: a constant shift changes nothing; measured equal (to rounding), so no false alarm
    project.conftest(train_project("left", "llama"))
    run = project.run("--dlcheck=L1", "-rA")
    run.assert_outcome("L1", "passed")
    run.fnmatch(
        [
            "training: 6 padded examples (6 left-padded) lose as alone: max |Δ| * <= atol 0.001 nats*",
            "  example 0.0 (4 pad tokens on the left): loss in batch *, alone *",
        ]
    )
    assert_lose_as_alone(run.text)


def test_unpadded_batches_without_a_mask_skip(project):
    project.conftest("""
        import pytest, tiny

        @pytest.fixture(scope="session")
        def dlcheck_tokenizer():
            return tiny.tokenizer()

        @pytest.fixture(scope="session")
        def dlcheck_model(dlcheck_tokenizer):
            return tiny.gpt2(dlcheck_tokenizer)

        @pytest.fixture(scope="session")
        def dlcheck_collator():
            import torch
            return lambda rows: {"input_ids": torch.tensor([r["input_ids"][:5] for r in rows])}

        @pytest.fixture(scope="session")
        def dlcheck_dataset(dlcheck_tokenizer):
            return tiny.tokenized(dlcheck_tokenizer)
    """)
    run = project.run("--dlcheck=L1")
    run.assert_outcome("L1", "skipped")
    # without an attention_mask padding cannot be told from content: unsure, not "not applicable"
    run.fnmatch(
        [
            "SKIPPED * training: no padded, unpacked row with an attention_mask among the 8 sampled rows of "
            "dlcheck_collator on 8 examples of dlcheck_dataset (2 batches carry no attention_mask, so their padding "
            "cannot be told); generation: the pipeline does not generate in batches*define "
            "dlcheck_generation_prompts*"
        ]
    )
    assert "not applicable" not in run.text


def test_packed_batches_and_no_generation_are_not_applicable(project):
    # DataCollatorWithFlattening: no padding at all, and nothing generates in batches
    project.conftest(
        train_project("right", "llama").replace(
            "base = DataCollatorForLanguageModeling(dlcheck_tokenizer, mlm=False)",
            "from transformers import DataCollatorWithFlattening\n        base = DataCollatorWithFlattening()",
        )
    )
    run = project.run("--dlcheck=L1")
    run.fnmatch(
        [
            "*::L1_padding_side SKIPPED (not applicable: *",
            "SKIPPED * not applicable: training: no padded, unpacked row with an attention_mask among the 2 sampled "
            "rows of dlcheck_collator on 8 examples of dlcheck_dataset; generation: the pipeline does not generate "
            "in batches*",
        ]
    )


GENERATE = """
    import pytest, tiny

    @pytest.fixture(scope="session")
    def dlcheck_tokenizer():
        return tiny.tokenizer(padding_side={side!r})

    @pytest.fixture(scope="session")
    def dlcheck_model(dlcheck_tokenizer):
        return tiny.{arch}(dlcheck_tokenizer)

    @pytest.fixture
    def dlcheck_generation_prompts():
        return tiny.PROMPTS[:4]
"""


@pytest.mark.parametrize("arch", ["gpt2", "llama"])
def test_batched_generation_with_right_padding_fails(project, arch):
    project.conftest(GENERATE.format(side="right", arch=arch))
    run = project.run("--dlcheck=L1")
    run.assert_outcome("L1", "failed")
    text = flat(run.section("L1"))
    assert "greedy generate of 4 prompts padded together (padding side: right" in text
    assert "alone →" in text and "in batch →" in text
    assert "'hello' (" in text  # the shortest prompt, decoded, with its pad count
    assert "first new token: max |Δ log-prob|" in text
    assert "reads the" in text and "pad position" in text
    assert "tokenizer.padding_side = 'left'" in text


def test_batched_generation_with_left_padding_passes(project):
    project.conftest(GENERATE.format(side="left", arch="gpt2"))
    run = project.run("--dlcheck=L1", "-rA")
    run.assert_outcome("L1", "passed")
    run.fnmatch(
        [
            "generation: greedy generate of 4 prompts padded together (padding side: left; dlcheck_generation_prompts "
            "tokenized with tokenizer.padding_side='left') gives every prompt the continuation it gets alone (8 new "
            "tokens, 11 pads in the batch)",
            "training: not checked, missing role: define fixture dlcheck_dataloader*",
        ]
    )


def test_user_batch_for_generate_is_used_as_given(project):
    # a right-padding training tokenizer, but the inference code pads prompts on the left itself
    project.conftest(
        GENERATE.format(side="right", arch="gpt2")
        .replace(
            "return tiny.PROMPTS[:4]",
            "return dlcheck_tokenizer(tiny.PROMPTS[:4], padding=True, padding_side='left', return_tensors='pt')",
        )
        .replace("def dlcheck_generation_prompts():", "def dlcheck_generation_prompts(dlcheck_tokenizer):")
    )
    run = project.run("--dlcheck=L1")
    run.assert_outcome("L1", "passed")


def test_right_padded_sft_trainer_is_not_flagged_by_generation(project):
    project.conftest("""
        import pytest, tiny
        from datasets import Dataset
        from trl import SFTConfig, SFTTrainer

        @pytest.fixture(scope="session")
        def dlcheck_trainer(tmp_path_factory):
            tok = tiny.tokenizer(padding_side="right")
            ds = Dataset.from_dict({"text": tiny.texts(8)})
            args = tiny.trainer_args(tmp_path_factory.mktemp("sft"), SFTConfig, max_length=64)
            return SFTTrainer(model=tiny.gpt2(tok), args=args, train_dataset=ds, processing_class=tok)
    """)
    run = project.run("--dlcheck=L1", "-rA")
    run.assert_outcome("L1", "passed")
    run.fnmatch(
        [
            "training: 6 padded examples (6 right-padded) lose as alone*",
            "generation: not checked, the pipeline does not generate in batches*",
        ]
    )


def test_grpo_trainer_generation_is_left_padded_by_trl(project):
    # the tokenizer says right, but GRPOTrainer left-pads its prompts itself: no false alarm
    project.conftest("""
        import pytest, tiny
        from datasets import Dataset
        from trl import GRPOConfig, GRPOTrainer

        @pytest.fixture(scope="session")
        def dlcheck_trainer(tmp_path_factory):
            tok = tiny.tokenizer(padding_side="right")
            ds = Dataset.from_dict({"prompt": tiny.PROMPTS})
            args = tiny.trainer_args(tmp_path_factory.mktemp("grpo"), GRPOConfig, num_generations=2,
                                     max_completion_length=8, beta=0.0, per_device_train_batch_size=4)
            return GRPOTrainer(model=tiny.gpt2(tok), reward_funcs=lambda completions, **kw: [0.0] * len(completions),
                               args=args, train_dataset=ds, processing_class=tok)
    """)
    run = project.run("--dlcheck=L1", "-rA")
    run.assert_outcome("L1", "passed")
    run.fnmatch(
        [
            "generation: greedy generate of 6 prompts padded together (padding side: left; the prompts of the "
            "GRPOTrainer's dataset, padded on the left as GRPOTrainer does itself) gives every prompt the continuation "
            "it gets alone*",
            "training: not checked, GRPOTrainer builds its training batches inside the trainer (from generations)",
        ]
    )
    # the training half concerns GRPO (it pads its prompts and completions) and was not judged: a partial pass
    run.fnmatch(["*L1_padding_side PASSED (generation: *partly judged: training not judged*"])


def test_no_trace_on_model_and_tokenizer(project):
    project.conftest(
        train_project("left", "gpt2").replace(
            "return tiny.gpt2(dlcheck_tokenizer)", "return tiny.gpt2(dlcheck_tokenizer).train()"
        )
    )
    project.pytester.makepyfile(
        test_user="""
        def test_state(dlcheck_model, dlcheck_tokenizer):
            assert all(m.training for m in dlcheck_model.modules())
            assert dlcheck_tokenizer.padding_side == "left"
            assert all(p.requires_grad and p.grad is None for p in dlcheck_model.parameters())
    """
    )
    run = project.run("--dlcheck=L1")
    run.assert_outcome("L1", "failed")
    run.fnmatch(["*test_user.py::test_state PASSED*"])


def test_generation_leaves_no_trace(project):
    project.conftest(
        GENERATE.format(side="right", arch="gpt2").replace(
            "return tiny.gpt2(dlcheck_tokenizer)",
            """model = tiny.gpt2(dlcheck_tokenizer).train()
        model.before = (model.generation_config.to_dict(), {k: v.clone() for k, v in model.state_dict().items()})
        return model""",
        )
    )
    project.pytester.makepyfile(
        test_user="""
        import torch

        def test_state(dlcheck_model, dlcheck_tokenizer):
            config, weights = dlcheck_model.before
            assert dlcheck_model.generation_config.to_dict() == config
            assert all(torch.equal(v, weights[k]) for k, v in dlcheck_model.state_dict().items())
            assert all(m.training for m in dlcheck_model.modules())
            assert dlcheck_tokenizer.padding_side == "right"
    """
    )
    run = project.run("--dlcheck=L1")
    run.assert_outcome("L1", "failed")
    run.fnmatch(["*test_user.py::test_state PASSED*"])
