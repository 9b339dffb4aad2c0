"""A PEFT (LoRA) model works everywhere a model does: through a transformers Trainer and a plain loop, the
llm, train, ckpt and smoke checks run on fresh copies of the PeftModel (adapter checkpoints included) with
no internal error and no false alarm; LoRA's zero-initialised B is not "a parameter without gradient"."""

import json

import pytest

LORA_TRAINER = """
    import pytest, tiny
    from peft import LoraConfig, get_peft_model
    from transformers import DataCollatorForSeq2Seq, Trainer

    @pytest.fixture(scope="session")
    def dlcheck_tokenizer():
        return tiny.tokenizer()

    @pytest.fixture(scope="session")
    def dlcheck_trainer(tmp_path_factory, dlcheck_tokenizer):
        tok = dlcheck_tokenizer
        lora = LoraConfig(r=4, lora_alpha=8, target_modules=["q_proj", "v_proj"], task_type="CAUSAL_LM")
        model = get_peft_model(tiny.llama(tok), lora)
        rows = [dict(r, labels=r["input_ids"]) for r in tiny.tokenized(tok, n=6)]
        held = [tok(t + tok.eos_token) for t in ("a held out line", "and another one, unseen")]
        held = [dict(r, labels=r["input_ids"]) for r in held]
        args = tiny.trainer_args(tmp_path_factory.mktemp("o"), learning_rate=1e-2)
        return Trainer(model=model, args=args, train_dataset=rows, eval_dataset=held,
                       data_collator=DataCollatorForSeq2Seq(tok, padding=True), processing_class=tok)
"""


def test_a_lora_trainer_passes_every_applicable_check(project, tmp_path):
    project.conftest(LORA_TRAINER)
    out = tmp_path / "r.json"
    run = project.run("--dlcheck=llm,train,ckpt,smoke", f"--dlcheck-json={out}")
    doc = json.loads(out.read_text())
    by = {r["id"]: r for r in doc["results"]}
    assert doc["summary"]["error"] == 0 and doc["summary"]["failed"] == 0, run.text
    # the adapters are trained, resumed and watched through the Trainer's own checkpoint-* directories
    for cid in ("T3", "C1", "C2", "S1"):
        assert by[cid]["outcome"] == "passed", (cid, by[cid])
    # rank-4 adapters on q/v of a random tiny model do not halve a batch's loss in 30 steps: said as such
    assert by["T2"]["outcome"] == "passed" or by["T2"]["reason"].startswith("not conclusive"), by["T2"]
    assert "lora_B" not in " ".join(by["T3"]["evidence"]) or "get a gradient" in by["T3"]["evidence"][0]


LORA_LOOP = """
    import pytest, tiny, torch
    import tiny_train as tt
    from peft import LoraConfig, get_peft_model

    @pytest.fixture(scope="session")
    def dlcheck_tokenizer():
        return tiny.tokenizer()

    @pytest.fixture(scope="session")
    def dlcheck_dataloader(dlcheck_tokenizer):
        return tt.llm_loader(dlcheck_tokenizer)

    @pytest.fixture(scope="session")
    def dlcheck_make_training(dlcheck_tokenizer):
        def make():
            torch.manual_seed(0)
            lora = LoraConfig(r=4, lora_alpha=8, target_modules=["q_proj", "k_proj", "v_proj", "o_proj"])
            model = get_peft_model(tiny.llama(dlcheck_tokenizer), lora)
            return {"model": model, "optimizer": torch.optim.AdamW(model.parameters(), lr=1e-2)}
        return make

    @pytest.fixture(scope="session")
    def dlcheck_compute_loss():
        return lambda model, batch: model(**batch).loss

    @pytest.fixture(scope="session")
    def dlcheck_save_checkpoint():
        def save(state, path):
            state["model"].save_pretrained(path)  # the adapter only
            torch.save(state["optimizer"].state_dict(), f"{path}/optimizer.pt")
        return save

    @pytest.fixture(scope="session")
    def dlcheck_load_checkpoint():
        def load(state, path):
            from peft import set_peft_model_state_dict
            from safetensors.torch import load_file
            set_peft_model_state_dict(state["model"], load_file(f"{path}/adapter_model.safetensors"))
            state["optimizer"].load_state_dict(torch.load(f"{path}/optimizer.pt"))
        return load
"""


def test_a_lora_plain_loop_resumes_from_its_adapter_checkpoint(project, tmp_path):
    import sys
    from pathlib import Path

    sys.path.insert(0, str(Path(__file__).parents[1] / "train"))
    project.conftest(LORA_LOOP)
    out = tmp_path / "r.json"
    run = project.run("--dlcheck=T2,T3,C1,C18,S1", f"--dlcheck-json={out}")
    doc = json.loads(out.read_text())
    by = {r["id"]: r for r in doc["results"]}
    assert doc["summary"]["error"] == 0, run.text
    for cid in ("T3", "C1", "S1"):
        assert by[cid]["outcome"] == "passed", (cid, by[cid], run.text[-3000:])
    assert by["T2"]["outcome"] == "passed" or by["T2"]["reason"].startswith("not conclusive"), by["T2"]


def test_an_adapter_loaded_under_another_name_and_never_activated_fails_c1(project, tmp_path):
    """load_adapter(path, adapter_name=...) adds the saved adapter beside the fresh 'default' one without
    activating it: the resumed run trains the fresh adapter. C1 names the model's weights and says how a
    PEFT adapter checkpoint is loaded into the adapter being trained."""
    import sys
    from pathlib import Path

    sys.path.insert(0, str(Path(__file__).parents[1] / "train"))
    buggy = LORA_LOOP.replace(
        """            set_peft_model_state_dict(state["model"], load_file(f"{path}/adapter_model.safetensors"))""",
        """            state["model"].load_adapter(path, adapter_name="resumed")  # never set_adapter("resumed")""",
    )
    assert buggy != LORA_LOOP
    project.conftest(buggy)
    out = tmp_path / "r.json"
    run = project.run("--dlcheck=C1", "--dlcheck-json=" + str(out))
    (c1,) = json.loads(out.read_text())["results"]
    assert c1["outcome"] == "failed", run.text
    assert "model" in c1["cause"], c1
    assert "set_adapter" in c1["fix"] and "set_peft_model_state_dict" in c1["fix"], c1["fix"]


SFT_LORA = """
    import pytest, tiny
    from datasets import Dataset
    from peft import LoraConfig, prepare_model_for_kbit_training
    from trl import SFTConfig, SFTTrainer

    @pytest.fixture(scope="session")
    def dlcheck_trainer(tmp_path_factory):
        tok = tiny.tokenizer()
        train = Dataset.from_dict({"prompt": tiny.PROMPTS[:4] * 3, "completion": tiny.COMPLETIONS[:4] * 3})
        held_out = Dataset.from_dict({"prompt": tiny.PROMPTS[4:], "completion": tiny.COMPLETIONS[4:]})
        args = tiny.trainer_args(tmp_path_factory.mktemp("sft"), SFTConfig, learning_rate=1e-2, warmup_steps=1)
        model = tiny.llama(tok)
        if {prepared}:  # the QLoRA recipe's preparation (fp32 norms, gradient checkpointing, input grads), on CPU
            model = prepare_model_for_kbit_training(model, use_gradient_checkpointing=True)
        lora = LoraConfig(r=4, lora_alpha=8, target_modules="all-linear", task_type="CAUSAL_LM")
        return SFTTrainer(model=model, args=args, processing_class=tok, train_dataset=train,
                          eval_dataset=held_out, peft_config=lora)
"""


@pytest.mark.parametrize("prepared", [False, True], ids=["lora", "qlora-prepared"])
def test_trl_sft_with_a_peft_config_passes_every_applicable_check(project, tmp_path, prepared):
    """TRL's SFTTrainer wrapping the model itself (peft_config=), plain and after the QLoRA recipe's
    prepare_model_for_kbit_training: no failure, no error in llm/train/ckpt/smoke; the adapters are what
    T3, T13, C1 and S1 see."""
    project.conftest(SFT_LORA.replace("{prepared}", str(prepared)))
    out = tmp_path / "r.json"
    run = project.run("--dlcheck=llm,train,ckpt,smoke", f"--dlcheck-json={out}")
    doc = json.loads(out.read_text())
    by = {r["id"]: r for r in doc["results"]}
    assert doc["summary"]["error"] == 0 and doc["summary"]["failed"] == 0, run.text
    for cid in ("T3", "T13", "C1", "S1"):
        assert by[cid]["outcome"] == "passed", (cid, by[cid])
    assert "q_proj" in " ".join(by["T13"]["evidence"])


def test_c2_interrupts_the_adapter_save_peft_writes_through_its_own_alias(project, tmp_path):
    """peft writes adapter_model.safetensors through `from safetensors.torch import save_file as safe_save_file`:
    C2 had patched safetensors.torch.save_file only, so the adapter save was never interrupted (found blind, set 16:
    peft_lora_seq2seq_accelerate_ds_zero3_offload.py; C2 judged the optimizer file beside it, or skipped). The save
    goes into the same directory at every save here: the interrupted adapter file is the previous checkpoint's own."""
    import sys
    from pathlib import Path

    sys.path.insert(0, str(Path(__file__).parents[1] / "train"))
    project.conftest(LORA_LOOP)
    run = project.run("--dlcheck=C2")
    run.assert_outcome("C2", "failed")
    text = " ".join(run.text.split())
    assert "was interrupted half way while writing dlcheck-atomic0/checkpoint/adapter_model.safetensors" in text or (
        "adapter_model.safetensors" in text
    ), run.text
    assert "writes straight onto the previous checkpoint's path" in text, run.text
