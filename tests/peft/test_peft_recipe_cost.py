"""The passes a PEFT recipe pays under --dlcheck=all (issue 33): a tiny Llama "pretrained" on the base
vocabulary, ChatML tokens added (<|im_start|>, <|im_end|> as EOS, the embeddings resized, the new rows trained
through modules_to_save), LoRA on every linear layer, TRL's SFTTrainer with gradient checkpointing on and an eval
set. The counts per check are the stable assertion (seconds depend on the machine's load; the wall time is
printed with the JSON report's split).

Where the 1176 forward and 158 backward passes for 55 optimizer steps came from (issue 33): gradient
checkpointing runs each layer's forward again inside the backward pass, and each of those recomputed blocks was
counted as a forward pass of its own (and reentrant checkpointing's inner backward as a backward pass); the
shared smoke run's 20 steps were charged to whichever check asked first (L6, an information item); L6 measured
log Z one row at a time. Now a recomputation is part of its backward, the smoke run's passes are the run's
(under "shared"), and L6 runs one forward of a batch on the fresh and one on the trained model."""

import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parents[1] / "reliability"))

import rel_budget  # noqa: E402

RECIPE = """
    import pytest, tiny, torch
    from datasets import Dataset
    from peft import LoraConfig
    from trl import SFTConfig, SFTTrainer

    CHATML = (
        "{% for m in messages %}<|im_start|>{{ m['role'] }}\\n{% if m['role'] == 'assistant' %}{% generation %}"
        "{{ m['content'] }}<|im_end|>{% endgeneration %}{% else %}{{ m['content'] }}<|im_end|>{% endif %}\\n"
        "{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\\n{% endif %}"
    )

    @pytest.fixture(scope="session")
    def dlcheck_trainer(tmp_path_factory):
        torch.set_num_threads(1)
        tok = tiny.tokenizer()
        model = tiny.llama(tok)  # "pretrained" on the base vocabulary; then the ChatML tokens are added
        tok.add_special_tokens(
            {"additional_special_tokens": ["<|im_start|>", "<|im_end|>"]}, replace_extra_special_tokens=False
        )
        tok.eos_token, tok.chat_template = "<|im_end|>", CHATML
        model.resize_token_embeddings(len(tok))
        model.config.tie_word_embeddings = False  # an untied head, as Llama 3 ships
        model.lm_head.weight = torch.nn.Parameter(model.lm_head.weight.detach().clone())
        model.config.eos_token_id = model.generation_config.eos_token_id = tok.eos_token_id
        chats = [
            [{"role": "user", "content": p}, {"role": "assistant", "content": c.strip()}]
            for p, c in zip(tiny.PROMPTS, tiny.COMPLETIONS)
        ]
        train, held_out = Dataset.from_dict({"messages": chats[:4] * 3}), Dataset.from_dict({"messages": chats[4:]})
        args = tiny.trainer_args(
            tmp_path_factory.mktemp("sft"), SFTConfig, learning_rate=1e-2, warmup_steps=1, max_length=64,
            eos_token="<|im_end|>", assistant_only_loss=True, gradient_checkpointing=True,
        )
        lora = LoraConfig(
            r=4, lora_alpha=8, target_modules="all-linear", task_type="CAUSAL_LM",
            modules_to_save=["embed_tokens", "lm_head"],  # the added tokens' rows train
        )
        return SFTTrainer(model=model, args=args, processing_class=tok, train_dataset=train,
                          eval_dataset=held_out, peft_config=lora)
"""


def test_the_peft_chatml_sft_recipe_pays_the_passes_each_check_needs(project, tmp_path):
    project.conftest(RECIPE)
    out = tmp_path / "r.json"
    run = project.run("--dlcheck=all", f"--dlcheck-json={out}")
    doc = json.loads(out.read_text())
    print(rel_budget.figures("PEFT LoRA SFT recipe", doc))  # the wall time, as this machine's load gave it
    by = {r["id"]: r for r in doc["results"]}
    assert doc["summary"]["error"] == 0, run.text
    # S5 may say the 4 chats repeated 3 times are memorised (a tiny duplicated set: its own words); nothing else
    assert {r["id"] for r in doc["results"] if r["outcome"] == "failed"} <= {"S5"}, run.text
    cost = {cid: r["cost"] for cid, r in by.items()}
    shared = doc["shared"]

    # the shared smoke run: 20 optimizer steps, one forward and one backward pass each (the checkpointed layers'
    # recomputation is part of the backward; no eval pass per step), counted as the run's, not L6's
    smoke = shared["smoke run"]["cost"]
    assert (smoke["optimizer_steps"], smoke["forward"], smoke["backward"]) == (20, 20, 20), smoke
    assert set(smoke["models"]) == {"PeftModelForCausalLM"}, smoke  # no recomputed block counted as a model
    assert cost["L6"].get("optimizer_steps", 0) == 0

    # the llm checks: at most 10 forward passes together, per check as follows
    assert cost["L6"]["forward"] == 2, cost["L6"]  # log Z of one batch, fresh and trained
    assert shared["lm:batch_forward"]["cost"]["forward"] <= 2  # one forward per sampled batch, shared (L1, L6)
    llm = rel_budget.domain_forward(doc)["llm"]
    assert sum(llm.values()) <= rel_budget.DOMAIN_MAX_FORWARD, llm

    # the training checks: single passes where one serves (T1 no backward, T3 one, T5 two batches)
    assert cost["T1"].get("backward", 0) == 0 and cost["T3"]["backward"] == 1 and cost["T5"]["backward"] <= 2, cost
    # the whole session: every optimizer step within the training budget of 60; every pass counted once (checks +
    # shared runs), a few per step, not the 1176 forward / 158 backward of 55 steps before
    steps, forward, backward = (doc["cost"][k] for k in ("optimizer_steps", "forward", "backward"))
    assert steps <= rel_budget.BUDGET_STEPS, doc["cost"]
    assert forward <= 2 * steps + 40 and backward <= steps + 20, doc["cost"]
