"""L4: packed documents must not attend to each other, and no document's first token is a target."""

import re

from helpers import flat

COMMON = """
    import pytest, torch, tiny
    from transformers import DataCollatorWithFlattening

    @pytest.fixture(scope="session")
    def dlcheck_tokenizer():
        return tiny.tokenizer()

    @pytest.fixture(scope="session")
    def dlcheck_dataset(dlcheck_tokenizer):
        return tiny.tokenized(dlcheck_tokenizer)
"""

MODEL = """
    @pytest.fixture(scope="session")
    def dlcheck_model(dlcheck_tokenizer):
        model = tiny.{arch}(dlcheck_tokenizer)
        model.config.use_cache = {use_cache}
        return model
"""


def packer_project(collator: str, arch: str = "llama", use_cache: bool = False) -> str:
    return COMMON + MODEL.format(arch=arch, use_cache=use_cache) + collator


NAIVE = """
    @pytest.fixture(scope="session")
    def dlcheck_collator():
        def concatenate(rows):
            # documents joined with EOS (tiny.tokenized appends it), no position_ids restart, labels = input_ids
            ids = [t for r in rows for t in r["input_ids"]]
            return {"input_ids": torch.tensor([ids]), "attention_mask": torch.ones(1, len(ids), dtype=torch.long),
                    "labels": torch.tensor([ids])}
        return concatenate
"""

RESTART_NO_MASKED_LABEL = """
    @pytest.fixture(scope="session")
    def dlcheck_collator():
        def pack(rows):
            ids = [t for r in rows for t in r["input_ids"]]
            pos = [p for r in rows for p in range(len(r["input_ids"]))]
            return {"input_ids": torch.tensor([ids]), "position_ids": torch.tensor([pos]), "labels": torch.tensor([ids])}
        return pack
"""

FLATTENING = """
    @pytest.fixture(scope="session")
    def dlcheck_collator():
        return DataCollatorWithFlattening()
"""

FLATTENING_WITH_MASK = """
    @pytest.fixture(scope="session")
    def dlcheck_collator():
        flatten = DataCollatorWithFlattening()

        def collate(rows):
            batch = flatten(rows)
            batch["attention_mask"] = torch.ones_like(batch["input_ids"])
            return batch
        return collate
"""


def test_naive_concatenation_leaks(project):
    # the naive SFT packer (TRL #3067): separate dataset examples concatenated into one row, running positions, one
    # causal mask, labels = input_ids. Judged by default: the rows hold several of the examples handed to the collator
    project.conftest(packer_project(NAIVE, "gpt2"))
    run = project.run("--dlcheck=L4")
    run.assert_outcome("L4", "failed")
    text = flat(run.section("L4"))
    assert "2 packed rows holding 8 documents (found by EOS separators ('<|endoftext|>', id 0)" in text
    # which examples share a row
    assert (
        "the collator packs several dataset examples into one row: sampled examples 0, 1, 2, 3 (dataset rows 0, 2, 3, "
        "5) share row 0.0; sampled examples 4, 5, 6, 7 (dataset rows 6, 8, 9, 11) share row 1.0"
    ) in text
    # the loss of a document packed vs alone
    assert "later documents lose differently inside the packed row than alone" in text
    assert "packed 5." in text and ", alone 5." in text and "(Δ 0.0" in text
    assert "<|endoftext|>'" in text  # the document, decoded
    assert "the same documents match alone: Δ at most" in text
    assert "later document starts are supervised" in text
    assert "'<|endoftext|>'(0)→0" in text  # the boundary: EOS, then the next document's first token is a target
    assert "the collator concatenates separate dataset examples into one row (a naive SFT packer)" in text
    assert "DataCollatorWithFlattening()" in text and "L4.allow_cross_document=true" in text
    assert "Traceback" not in run.text


NAIVE_LOADER = """
    @pytest.fixture(scope="session")
    def dlcheck_dataloader(dlcheck_tokenizer):
        def concatenate(rows):
            ids = [t for r in rows for t in r["input_ids"]]
            return {"input_ids": torch.tensor([ids]), "attention_mask": torch.ones(1, len(ids), dtype=torch.long),
                    "labels": torch.tensor([ids])}
        return torch.utils.data.DataLoader(tiny.tokenized(dlcheck_tokenizer), batch_size=4, collate_fn=concatenate)
"""

#: run_clm's group_texts: the tokenized texts (EOS appended) concatenated and cut into 32-token blocks, labels =
#: input_ids; each dataset example is already a block of the stream
BLOCKS = """
    def group_texts(tok):
        ids = [t for r in tiny.tokenized(tok) for t in r["input_ids"]]
        n = len(ids) // 32 * 32
        return [{"input_ids": ids[i:i + 32], "attention_mask": [1] * 32, "labels": ids[i:i + 32]} for i in range(0, n, 32)]
"""


def stream_project(fixtures: str) -> str:
    head = COMMON.split('    @pytest.fixture(scope="session")\n    def dlcheck_dataset')[0]
    return head + MODEL.format(arch="gpt2", use_cache=False) + BLOCKS + fixtures


PRE_CHUNKED = """
    @pytest.fixture(scope="session")
    def dlcheck_dataset(dlcheck_tokenizer):
        return group_texts(dlcheck_tokenizer)

    @pytest.fixture(scope="session")
    def dlcheck_collator():
        from transformers import default_data_collator
        return default_data_collator
"""

PRE_CHUNKED_LOADER = """
    @pytest.fixture(scope="session")
    def dlcheck_dataloader(dlcheck_tokenizer):
        from transformers import default_data_collator
        return torch.utils.data.DataLoader(group_texts(dlcheck_tokenizer), batch_size=4, collate_fn=default_data_collator)
"""


def test_naive_packer_behind_a_bare_dataloader_leaks(project):
    # no dlcheck_collator/dlcheck_dataset: the loader's own dataset shows one document per example
    project.conftest(COMMON.split("    @pytest.fixture(scope=\"session\")\n    def dlcheck_dataset")[0]
                     + MODEL.format(arch="gpt2", use_cache=False) + NAIVE_LOADER)  # fmt: skip
    run = project.run("--dlcheck=L4")
    run.assert_outcome("L4", "failed")
    text = flat(run.section("L4"))
    assert "later documents lose differently inside the packed row than alone" in text
    assert "later document starts are supervised" in text


def test_a_pre_chunked_stream_is_pretraining_by_default(project):
    # run_clm's group_texts with EOS between texts, default_data_collator: each row is one dataset example
    project.conftest(stream_project(PRE_CHUNKED))
    run = project.run("--dlcheck=L4")
    run.assert_outcome("L4", "skipped")
    run.fnmatch(
        [
            "SKIPPED * not applicable: the rows of dlcheck_collator on 7 examples of dlcheck_dataset are a pretraining "
            "stream: documents joined by EOS with no position_ids restart and every token but EOS/padding supervised; "
            "each row is one "
            "example of dlcheck_dataset as the dataset holds it*"
        ]
    )
    # judged on request: the documents of a block do attend to each other
    run = project.run("--dlcheck=L4", "--dlcheck-set", "L4.judge_streams=true")
    run.assert_outcome("L4", "failed")
    text = flat(run.section("L4"))
    assert "later documents lose differently inside the packed row than alone" in text
    assert "the collator packs several dataset examples" not in text
    assert "documents are concatenated with EOS and nothing marks their boundaries" in text


HF_COURSE_STREAM = """
    @pytest.fixture(scope="session")
    def dlcheck_dataset(dlcheck_tokenizer):
        return [{k: v for k, v in r.items() if k != "labels"} for r in group_texts(dlcheck_tokenizer)]

    @pytest.fixture(scope="session")
    def dlcheck_collator(dlcheck_tokenizer):
        from transformers import DataCollatorForLanguageModeling
        dlcheck_tokenizer.pad_token = dlcheck_tokenizer.eos_token
        return DataCollatorForLanguageModeling(dlcheck_tokenizer, mlm=False)
"""


def test_a_pre_chunked_stream_with_its_eos_masked_is_pretraining(project):
    # the HF course's causal LM from scratch: blocks cut from the stream, tokenizer.pad_token = eos_token and
    # DataCollatorForLanguageModeling(mlm=False), which masks every EOS (L11's finding, not packing)
    project.conftest(stream_project(HF_COURSE_STREAM))
    run = project.run("--dlcheck=L4")
    run.assert_outcome("L4", "skipped")
    run.fnmatch(["SKIPPED * not applicable: * are a pretraining stream: *each row is one example of dlcheck_dataset*"])


def test_a_pre_chunked_stream_behind_a_bare_dataloader_is_pretraining(project):
    project.conftest(stream_project(PRE_CHUNKED_LOADER))
    run = project.run("--dlcheck=L4")
    run.assert_outcome("L4", "skipped")
    run.fnmatch(["SKIPPED * not applicable: * are a pretraining stream: *the dataset's examples already hold several*"])


def test_naive_concatenation_allowed_for_stream_pretraining(project):
    project.conftest(packer_project(NAIVE, "gpt2"))
    run = project.run("--dlcheck=L4", "--dlcheck-set", "L4.allow_cross_document=true")
    run.assert_outcome("L4", "skipped")
    run.fnmatch(
        [
            "SKIPPED * not applicable: the packed rows of dlcheck_collator on 8 examples of dlcheck_dataset are "
            "EOS-separated documents of a concatenated stream, where cross-document attention is allowed "
            "(L4.allow_cross_document=true)"
        ]
    )


def test_restarting_packer_that_supervises_document_starts(project):
    project.conftest(packer_project(RESTART_NO_MASKED_LABEL))
    run = project.run("--dlcheck=L4")
    run.assert_outcome("L4", "failed")
    text = flat(run.section("L4"))
    assert "found by position_ids restarts" in text
    assert "lose differently" not in text  # attention is isolated; only the labels are wrong
    assert "6 of 6 later document starts are supervised" in text
    assert "boundary at token" in text and "'<|endoftext|>'(0)→0" in text
    assert "labels[start] = -100" in text


def test_flattening_with_use_cache_leaks_in_a_custom_loop(project):
    project.conftest(packer_project(FLATTENING, use_cache=True))
    run = project.run("--dlcheck=L4")
    run.assert_outcome("L4", "failed")
    text = flat(run.section("L4"))
    assert "found by position_ids restarts" in text
    assert "of 6 later documents lose differently inside the packed row than alone" in text
    assert "model.config.use_cache=True" in text
    assert "model.config.use_cache = False" in text
    assert "document starts are supervised" not in text  # DataCollatorWithFlattening masks every document start


def test_flattening_with_attention_mask_leaks(project):
    project.conftest(packer_project(FLATTENING_WITH_MASK))
    run = project.run("--dlcheck=L4")
    run.assert_outcome("L4", "failed")
    text = flat(run.section("L4"))
    assert "carries an attention_mask" in text and "drop attention_mask" in text


def test_flattening_without_cache_isolates_documents(project):
    project.conftest(packer_project(FLATTENING, "llama"))
    run = project.run("--dlcheck=L4", "-rA")
    run.assert_outcome("L4", "passed")
    run.fnmatch(["*::L4_packing PASSED (6 later documents in 2 packed rows lose the same packed as alone*"])
    run.fnmatch(
        [
            "6 later documents in 2 packed rows lose the same packed as alone: max |Δ| * <= atol 0.001 nats "
            "(mean NLL over the same supervised tokens); documents found by position_ids restarts in "
            "dlcheck_collator on 8 examples of dlcheck_dataset",
            "  document 3 of row 0.0: packed *, alone *",
            "6 of 6 later document starts have label -100",
        ]
    )
    assert_same_packed_as_alone(run.text)


def test_flattening_gpt2_without_cache_isolates_documents(project):
    project.conftest(packer_project(FLATTENING, "gpt2"))
    run = project.run("--dlcheck=L4", "-rA")
    run.assert_outcome("L4", "passed")
    run.fnmatch(["6 later documents in 2 packed rows lose the same packed as alone: max |Δ| * <= atol 0.001*"])
    assert_same_packed_as_alone(run.text)


def assert_same_packed_as_alone(text: str, atol: float = 0.001) -> None:
    """What a pass guarantees: each document loses packed as alone within atol; the difference itself is float
    rounding (bitwise 0 on one machine, ~1e-7 on another), not asserted digit for digit."""
    worst = re.search(r"lose the same packed as alone: max \|Δ\| (\S+) <= atol 0\.001", text)
    assert worst and float(worst[1]) <= atol, text
    pairs = re.findall(r"packed ([\d.]+), alone ([\d.]+)", text)
    assert all(abs(float(a) - float(b)) <= atol for a, b in pairs), text


def test_flattening_under_the_hf_trainer_passes(project):
    # the model comes with config.use_cache=True; Trainer.__init__ sets it from TrainingArguments.use_cache=False
    project.conftest("""
        import pytest, tiny
        from transformers import DataCollatorWithFlattening, Trainer

        @pytest.fixture(scope="session")
        def dlcheck_trainer(tmp_path_factory):
            tok = tiny.tokenizer()
            return Trainer(model=tiny.llama(tok), args=tiny.trainer_args(tmp_path_factory.mktemp("hf")),
                           data_collator=DataCollatorWithFlattening(), train_dataset=tiny.tokenized(tok),
                           processing_class=tok)
    """)
    run = project.run("--dlcheck=L4", "-rA")
    run.assert_outcome("L4", "passed")
    run.fnmatch(["6 later documents in 2 packed rows lose the same packed as alone*", "6 of 6 later document starts*"])


def test_trl_sft_packing_passes(project):
    project.conftest("""
        import pytest, tiny
        from datasets import Dataset
        from trl import SFTConfig, SFTTrainer

        @pytest.fixture(scope="session")
        def dlcheck_trainer(tmp_path_factory):
            tok = tiny.tokenizer()
            ds = Dataset.from_dict({"text": [t + tok.eos_token for t in tiny.texts(8)]})
            args = tiny.trainer_args(tmp_path_factory.mktemp("sft"), SFTConfig, packing=True, max_length=64)
            return SFTTrainer(model=tiny.llama(tok), args=args, train_dataset=ds, processing_class=tok)
    """)
    run = project.run("--dlcheck=L4", "-rA")
    run.assert_outcome("L4", "passed")
    run.fnmatch(["* later documents in 1 packed rows lose the same packed as alone*by position_ids restarts*"])


def test_unpacked_padded_batches_are_not_applicable(project):
    project.conftest(
        COMMON
        + MODEL.format(arch="llama", use_cache=True)
        + """
    @pytest.fixture(scope="session")
    def dlcheck_collator(dlcheck_tokenizer):
        from transformers import DataCollatorForLanguageModeling
        return DataCollatorForLanguageModeling(dlcheck_tokenizer, mlm=False)
    """
    )
    run = project.run("--dlcheck=L4")
    run.assert_outcome("L4", "skipped")
    run.fnmatch(
        [
            "*::L4_packing SKIPPED (*not applicable: *",
            "SKIPPED * not applicable: no packed row among the 8 sampled rows of dlcheck_collator on 8 examples of "
            "dlcheck_dataset: no position_ids restart and no several EOS-separated documents in one row",
        ]
    )


def test_eos_ending_chat_turns_is_not_packing(project):
    # a Qwen-style template ends every turn with the EOS token: a multi-turn chat is one document
    project.conftest(
        COMMON.replace(
            "return tiny.tokenizer()",
            """tok = tiny.tokenizer()
        tok.chat_template = tiny.CHAT_TEMPLATE.replace("<|end|>", "<|endoftext|>")
        return tok""",
        )
        + MODEL.format(arch="llama", use_cache=True)
        + NAIVE
    )
    run = project.run("--dlcheck=L4")
    run.assert_outcome("L4", "skipped")
    run.fnmatch(
        ["SKIPPED * not applicable: no packed row *(EOS is not read as a separator: the chat template ends turns with*"]
    )


def test_isolated_positions_restart_at_documents_and_padding():
    from pytest_dlcheck.checks.llm.packing import _isolated_positions, _split_by_eos
    from pytest_dlcheck.checks.shared import lm

    row = lm.Row(0, 0, [1, 0, 2, 3, 0, 9, 9], [1, 1, 1, 1, 1, 0, 0], None, None)
    docs = _split_by_eos(row, eos=0, pad=9)
    assert docs == [[0, 1], [2, 3, 4]]
    pos = _isolated_positions([row], {0: docs}, 7)
    assert pos.tolist() == [[0, 1, 0, 1, 2, 0, 1]]
    left = lm.Row(0, 0, [9, 9, 5, 6], [0, 0, 1, 1], None, None)
    assert _isolated_positions([left], {}, 4).tolist() == [[0, 1, 0, 1]]


def test_grpo_trainer_is_not_packed(project):
    project.conftest("""
        import pytest, tiny
        from datasets import Dataset
        from trl import GRPOConfig, GRPOTrainer

        @pytest.fixture(scope="session")
        def dlcheck_trainer(tmp_path_factory):
            tok = tiny.tokenizer()
            args = tiny.trainer_args(tmp_path_factory.mktemp("grpo"), GRPOConfig, num_generations=2,
                                     max_completion_length=8, beta=0.0, per_device_train_batch_size=4)
            return GRPOTrainer(model=tiny.llama(tok), reward_funcs=lambda completions, **kw: [0.0] * len(completions),
                               args=args, train_dataset=Dataset.from_dict({"prompt": tiny.PROMPTS}), processing_class=tok)
    """)
    run = project.run("--dlcheck=L4,L5")
    run.assert_outcome("L4", "skipped")
    run.assert_outcome("L5", "skipped")
    run.fnmatch(
        [
            "SKIPPED * not applicable: GRPOTrainer builds its training batches inside the trainer, from generations: "
            "nothing is packed"
        ]
    )
    run.fnmatch(
        [
            "SKIPPED * training data: GRPOTrainer builds its training batches inside the trainer; no "
            "dlcheck_inference_config to compare rope settings with"
        ]
    )


def test_eos_is_ambiguous_in_chats():
    import tiny

    from pytest_dlcheck.checks.llm.packing import _eos_ambiguous

    tok = tiny.tokenizer()
    assert _eos_ambiguous(tok, [{"text": "a"}]) is None
    tok.chat_template = "{% for m in messages %}{{ m['content'] + eos_token }}{% endfor %}"  # Llama-2 / Mistral style
    assert "inserts eos_token between turns" in _eos_ambiguous(tok, None)
    tok.chat_template = None
    assert (
        _eos_ambiguous(tok, [{"prompt": [{"role": "user", "content": "hi"}], "completion": "x"}])
        == "the examples are conversations"
    )
