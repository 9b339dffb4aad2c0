"""No false alarms: clean, correctly configured pipelines from the real libraries run the whole llm
domain with zero failures, from a single `dlcheck_trainer` fixture."""

import pytest

TRAINERS = {
    "sft_prompt_completion": """
        @pytest.fixture(scope="session")
        def dlcheck_trainer(tmp_path_factory):
            from datasets import Dataset
            from trl import SFTConfig, SFTTrainer
            tok = tiny.tokenizer()
            data = Dataset.from_dict({"prompt": tiny.PROMPTS * 2, "completion": tiny.COMPLETIONS * 2})
            return SFTTrainer(model=tiny.llama(tok), args=tiny.trainer_args(tmp_path_factory.mktemp("o"), SFTConfig),
                              processing_class=tok, train_dataset=data)
    """,
    "sft_messages_assistant_only": """
        @pytest.fixture(scope="session")
        def dlcheck_trainer(tmp_path_factory):
            from datasets import Dataset
            from trl import SFTConfig, SFTTrainer
            tok = tiny.tokenizer()
            rows = [[{"role": "user", "content": p}, {"role": "assistant", "content": c.strip()}]
                    for p, c in zip(tiny.PROMPTS, tiny.COMPLETIONS)]
            data = Dataset.from_dict({"messages": rows * 2})
            args = tiny.trainer_args(tmp_path_factory.mktemp("o"), SFTConfig, assistant_only_loss=True)
            model = tiny.llama(tok)
            # turns end with <|end|>: generation must stop there too
            model.generation_config.eos_token_id = [tok.eos_token_id, tok.convert_tokens_to_ids(tiny.END)]
            return SFTTrainer(model=model, args=args, processing_class=tok, train_dataset=data)
    """,
    "sft_packed": """
        @pytest.fixture(scope="session")
        def dlcheck_trainer(tmp_path_factory):
            from datasets import Dataset
            from trl import SFTConfig, SFTTrainer
            tok = tiny.tokenizer()
            data = Dataset.from_dict({"text": tiny.texts(12)})
            args = tiny.trainer_args(tmp_path_factory.mktemp("o"), SFTConfig, packing=True, max_length=64)
            return SFTTrainer(model=tiny.llama(tok), args=args, processing_class=tok, train_dataset=data)
    """,
    "trainer_lm_collator_own_pad": """
        @pytest.fixture(scope="session")
        def dlcheck_trainer(tmp_path_factory):
            from datasets import Dataset
            from transformers import DataCollatorForLanguageModeling, Trainer
            tok = tiny.tokenizer()
            data = Dataset.from_dict({"text": tiny.texts(12)}).map(
                lambda r: tok(r["text"] + tok.eos_token), remove_columns=["text"])
            return Trainer(model=tiny.llama(tok), args=tiny.trainer_args(tmp_path_factory.mktemp("o")),
                           data_collator=DataCollatorForLanguageModeling(tok, mlm=False), train_dataset=data,
                           eval_dataset=data, processing_class=tok)
    """,
    "dpo": """
        @pytest.fixture(scope="session")
        def dlcheck_trainer(tmp_path_factory):
            import copy
            from datasets import Dataset
            from trl import DPOConfig, DPOTrainer
            tok = tiny.tokenizer()
            model = tiny.llama(tok)
            data = Dataset.from_dict({"prompt": tiny.PROMPTS, "chosen": tiny.COMPLETIONS,
                                      "rejected": list(reversed(tiny.COMPLETIONS))})
            args = tiny.trainer_args(tmp_path_factory.mktemp("o"), DPOConfig, max_length=64, beta=0.1)
            return DPOTrainer(model=model, ref_model=copy.deepcopy(model), args=args, processing_class=tok,
                              train_dataset=data)
    """,
    "grpo": """
        @pytest.fixture(scope="session")
        def dlcheck_trainer(tmp_path_factory):
            from datasets import Dataset
            from trl import GRPOConfig, GRPOTrainer
            tok = tiny.tokenizer(padding_side="left")
            data = Dataset.from_dict({"prompt": tiny.PROMPTS})
            args = tiny.trainer_args(tmp_path_factory.mktemp("o"), GRPOConfig, num_generations=2,
                                     max_completion_length=8, beta=0.0, per_device_train_batch_size=4)
            return GRPOTrainer(model=tiny.llama(tok), reward_funcs=lambda completions, **kw: [float(len(c)) for c in completions],
                               args=args, processing_class=tok, train_dataset=data)
    """,
}


@pytest.mark.parametrize("kind", sorted(TRAINERS))
def test_clean_trainer_passes_the_whole_llm_domain(project, kind):
    project.conftest("        import pytest, tiny\n" + TRAINERS[kind])
    run = project.run("--dlcheck=llm", "-rs")
    assert run.result.ret == 0, run.text
    assert not [c for c, outs in run.outcomes.items() if "failed" in outs or "error" in outs], run.text
    passed = [cid for cid, outs in run.outcomes.items() if outs == ["passed"]]
    assert passed, f"nothing ran for {kind}:\n{run.text}"
