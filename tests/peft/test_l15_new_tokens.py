"""L15: tokens added to the tokenizer after pretraining (tool tags, a chat marker) whose embedding rows stay at
resize_token_embeddings' mean initialisation because LoRA freezes the embeddings — failed with the ids, their
counts in the batches, the missing gradient, the distance to the mean and the adapter's saved state; the same
with trainable_token_indices or modules_to_save passes; a tokenizer without added tokens is not applicable; a
new pad token that only pads passes."""

import json
import sys
from pathlib import Path

import peft_tiny
import pytest

sys.path.insert(0, str(Path(__file__).parents[1] / "train"))
import tiny_train as tt  # noqa: E402

TRAINER = """
    import pytest, tiny, peft_tiny
    from peft import get_peft_model
    from transformers import DataCollatorForLanguageModeling, Trainer

    @pytest.fixture(scope="session")
    def dlcheck_trainer(tmp_path_factory):
        tok = peft_tiny.tool_tokenizer()
        model = get_peft_model(peft_tiny.pretrained(tok), peft_tiny.lora({lora}))
        rows = [tok(t + tok.eos_token) for t in peft_tiny.tool_texts(8)]
        args = tiny.trainer_args(tmp_path_factory.mktemp("o"))
        return Trainer(model=model, args=args, train_dataset=rows, processing_class=tok,
                       data_collator=DataCollatorForLanguageModeling(tok, mlm=False))
"""

LOOP = """
    import pytest, torch, peft_tiny
    from peft import get_peft_model

    @pytest.fixture(scope="session")
    def dlcheck_tokenizer():
        return {tokenizer}

    @pytest.fixture(scope="session")
    def dlcheck_dataloader(dlcheck_tokenizer):
        return {loader}

    @pytest.fixture(scope="session")
    def dlcheck_make_training(dlcheck_tokenizer):
        def make():
            model = get_peft_model({model}, peft_tiny.lora({lora}))
            return {{"model": model, "optimizer": torch.optim.AdamW(model.parameters(), lr=1e-3)}}
        return make
"""


def loop(lora: str = "", model: str = 'peft_tiny.pretrained(dlcheck_tokenizer, "qwen2")', tokenizer=None, loader=None):
    return LOOP.format(
        lora=lora,
        model=model,
        tokenizer=tokenizer or "peft_tiny.tool_tokenizer()",
        loader=loader or "peft_tiny.tool_loader(dlcheck_tokenizer)",
    )


@pytest.fixture(autouse=True)
def _paths(monkeypatch):
    monkeypatch.syspath_prepend(str(Path(__file__).parent))


def test_the_resize_gives_new_rows_the_mean_of_the_old_ones():
    # what the check's "never trained" rests on, measured on the library: transformers' mean resizing
    tok = peft_tiny.tool_tokenizer()
    w = peft_tiny.pretrained(tok).get_input_embeddings().weight.detach()
    mean = w[:300].mean(0)
    assert float((w[300:] - mean).norm(dim=1).max()) < 1e-3 * float((w[:300] - mean).norm(dim=1).median())


def test_lora_with_frozen_new_token_rows_fails_through_a_trainer(project):
    project.conftest(TRAINER.format(lora=""))
    run = project.run("--dlcheck=L15")
    run.assert_outcome("L15", "failed")
    text = tt.section(run, "L15")
    assert (
        "2 token(s) added beyond the tokenizer's base vocabulary of 300: '<|tool|>'(id 300), '<|/tool|>'(id 301)"
        in text
    )
    assert "'<|tool|>' 8x in, 8x as label, '<|/tool|>' 8x in, 8x as label" in text, text
    assert "get no gradient: no trainable parameter of PeftModelForCausalLM depends on them (Embedding" in text, text
    assert "each lies at most 3.5e-05 x a base row's typical distance (0.16)" in text, text
    assert "from the mean of the base rows, the value resize_token_embeddings gave it" in text, text
    assert "the adapter's state (get_peft_model_state_dict) holds 8 tensors, none of the embeddings" in text, text
    assert "trainable_token_indices={'embed_tokens': [300, 301]}" in text, text
    assert "modules_to_save=['embed_tokens', 'lm_head']" in text, text


def test_an_untied_lm_head_is_reported_too(project):
    project.conftest(loop())
    run = project.run("--dlcheck=L15")
    run.assert_outcome("L15", "failed")
    text = tt.section(run, "L15")
    assert "the untied output layer base_model.model.lm_head: the logit rows of '<|tool|>'(id 300)" in text, text
    assert "trainable_token_indices={'embed_tokens': [300, 301], 'lm_head': [300, 301]}" in text, text


def test_trainable_token_indices_pass_through_a_trainer(project, tmp_path):
    project.conftest(TRAINER.format(lora='trainable_token_indices={"embed_tokens": [300, 301]}'))
    out = tmp_path / "r.json"
    run = project.run("--dlcheck=L15", "-rA", f"--dlcheck-json={out}")
    run.assert_outcome("L15", "passed")
    evidence = " ".join(json.loads(out.read_text())["results"][0]["evidence"])
    assert "2 of 2 added token(s) occur in 8 sampled rows" in evidence, evidence
    assert "the embedding rows of '<|tool|>'(id 300), '<|/tool|>'(id 301) get a gradient" in evidence, evidence


def test_modules_to_save_on_an_untied_model_passes(project):
    project.conftest(loop(lora='modules_to_save=["embed_tokens", "lm_head"]'))
    run = project.run("--dlcheck=L15", "-rA")
    run.assert_outcome("L15", "passed")


def test_a_misspelt_modules_to_save_entry_is_named_as_the_cause(project):
    # TRL's adapter docs write modules_to_save=["lm_head", "embed_token"]: the second entry matches no module
    project.conftest(loop(lora='modules_to_save=["lm_head", "embed_token"]'))
    run = project.run("--dlcheck=L15")
    run.assert_outcome("L15", "failed")
    text = tt.section(run, "L15")
    assert (
        "modules_to_save names 'embed_token', which matches no module of the model (did you mean 'embed_tokens'?)"
        in text
    ), text
    assert "modules_to_save lists 'embed_token', a name no module has (the embedding is 'embed_tokens')" in text, text
    assert "modules_to_save=[..., 'embed_tokens']" in text, text


def test_a_tokenizer_without_added_tokens_is_not_applicable(project):
    project.conftest(
        loop(
            model="tiny.llama(dlcheck_tokenizer)",
            tokenizer="tiny.tokenizer()",
            loader="tt.llm_loader(dlcheck_tokenizer)",
        ).replace("import pytest, torch, peft_tiny", "import pytest, torch, peft_tiny, tiny, tiny_train as tt")
    )
    run = project.run("--dlcheck=L15", "-rs")
    run.assert_outcome("L15", "skipped")
    run.fnmatch(["*not applicable*no added token beyond its base vocabulary of 300*"])


def test_a_new_pad_token_that_only_pads_passes(project):
    # the tokenizer shipped without a pad token; '<|newpad|>' added and resized, frozen under LoRA: it sits only
    # at positions the attention mask hides, so its row never reaches a real token
    project.conftest(
        loop(
            model="peft_tiny.pretrained(dlcheck_tokenizer)",
            tokenizer='peft_tiny.tool_tokenizer(tokens=[], pad=None); tok.pad_token = "<|newpad|>"',
            loader="tt.llm_loader(dlcheck_tokenizer)",
        )
        .replace(
            "return peft_tiny.tool_tokenizer(tokens=[], pad=None); tok.pad",
            "tok = peft_tiny.tool_tokenizer(tokens=[], pad=None); tok.pad",
        )
        .replace('tok.pad_token = "<|newpad|>"', 'tok.add_special_tokens({"pad_token": "<|newpad|>"}); return tok')
        .replace("import pytest, torch, peft_tiny", "import pytest, torch, peft_tiny, tiny_train as tt")
    )
    run = project.run("--dlcheck=L15", "-rA")
    run.assert_outcome("L15", "passed")
    run.fnmatch(["*1 added token(s) beyond the base vocabulary ('<|newpad|>'(id 300)) occur at no attended position*"])
