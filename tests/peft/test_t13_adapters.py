"""T13: what a PEFT model trains — per module type, how many layers the adapter covers; a base left unfrozen
after get_peft_model fails, and so does an adapter that covers a module type in only some layers when
target_modules were names; layers chosen with layers_to_transform pass; a model without PEFT is not applicable."""

import json
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parents[1] / "train"))
import tiny_train as tt  # noqa: E402

PROJECT = """
    import pytest, tiny, torch, peft_tiny
    import tiny_train as tt
    from peft import get_peft_model

    @pytest.fixture(scope="session")
    def dlcheck_tokenizer():
        return tiny.tokenizer()

    @pytest.fixture(scope="session")
    def dlcheck_dataloader(dlcheck_tokenizer):
        return tt.llm_loader(dlcheck_tokenizer)

    @pytest.fixture(scope="session")
    def dlcheck_make_training(dlcheck_tokenizer):
        def make():
            model = get_peft_model(tiny.llama(dlcheck_tokenizer), peft_tiny.lora({lora}))
            {after}
            return {{"model": model, "optimizer": torch.optim.AdamW(model.parameters(), lr=1e-3)}}
        return make
"""


def project_source(lora: str = "", after: str = "") -> str:
    return PROJECT.format(lora=lora, after=after)


@pytest.fixture(autouse=True)
def _paths(monkeypatch):
    monkeypatch.syspath_prepend(str(Path(__file__).parent))
    monkeypatch.syspath_prepend(str(Path(__file__).parents[1] / "train"))


def test_a_base_unfrozen_after_get_peft_model_fails(project):
    project.conftest(project_source(after="for p in model.parameters(): p.requires_grad = True"))
    run = project.run("--dlcheck=T13")
    run.assert_outcome("T13", "failed")
    text = tt.section(run, "T13")
    # the tiny Llama: 20 base tensors (embeddings, 2 layers of q/k/v/o, mlp, norms), tied lm_head
    assert "20 of 20 base-model parameter tensors of the model of" in text, text
    assert "(LORA, adapter 'default') require gradients" in text, text
    assert "(100.0%), beside 1,792 adapter values" in text, text
    assert "base_model.model.model.embed_tokens.weight" in text, text
    assert "save_pretrained does not save them" in text, text
    assert "LoraConfig(modules_to_save=[...])" in text and "print_trainable_parameters()" in text, text


def test_an_adapter_in_only_some_layers_from_a_copied_module_path_fails(project):
    project.conftest(project_source(lora='target_modules=["model.layers.0.self_attn.q_proj", "v_proj"]'))
    run = project.run("--dlcheck=T13")
    run.assert_outcome("T13", "failed")
    text = tt.section(run, "T13")
    assert "q_proj: adapted in 1 of the 2 layers that have it (layers 0; not in 1)" in text, text
    assert "target_modules entries that name one module by its full path: model.layers.0.self_attn.q_proj" in text
    assert "layers_to_transform=[...]" in text, text
    assert "v_proj" not in text.split("LoraConfig(")[0], text  # v_proj is in every layer


def test_layers_chosen_with_layers_to_transform_pass(project, tmp_path):
    project.conftest(project_source(lora="layers_to_transform=[1]"))
    out = tmp_path / "r.json"
    run = project.run("--dlcheck=T13", "-rA", f"--dlcheck-json={out}")
    run.assert_outcome("T13", "passed")
    result = json.loads(out.read_text())["results"][0]
    assert "q_proj: 1 of 2 layers, v_proj: 1 of 2 layers (selected on purpose: layers_to_transform)" in " ".join(
        result["evidence"]
    ), result


def test_a_plain_lora_reports_what_it_adapts_and_passes(project, tmp_path):
    project.conftest(project_source(lora='modules_to_save=["lm_head"]'))
    out = tmp_path / "r.json"
    run = project.run("--dlcheck=T13", "-rA", f"--dlcheck-json={out}")
    run.assert_outcome("T13", "passed")
    evidence = " ".join(json.loads(out.read_text())["results"][0]["evidence"])
    assert "adapts q_proj: 2 of 2 layers, v_proj: 2 of 2 layers; not adapted: down_proj, gate_proj, k_proj" in evidence
    assert "modules_to_save: lm_head" in evidence and "none of the 20 base tensors" in evidence, evidence


def test_a_model_without_peft_is_not_applicable(project):
    project.conftest(tt.loop_project())
    run = project.run("--dlcheck=T13", "-rs")
    run.assert_outcome("T13", "skipped")
    run.fnmatch(["*not a peft.PeftModel*"])


def test_a_target_name_with_a_separator_left_in_it_fails(project):
    """TRL's gspo.py docstring (found blind, set 15): --lora_target_modules "q_proj", "v_proj" reaches the parser as
    ['q_proj,', 'v_proj']: PEFT drops the entry that matches nothing, and q_proj trains without an adapter."""
    project.conftest(project_source(lora="target_modules=['q_proj,', 'v_proj']"))
    run = project.run("--dlcheck=T13")
    run.assert_outcome("T13", "failed")
    text = tt.section(run, "T13")
    assert "target_modules entry 'q_proj,' of adapter 'default' matches no module of the model of" in text, text
    assert "'q_proj' does" in text and "not adapted:" in text and "q_proj" in text, text
    assert "target_modules=['q_proj', 'v_proj']" in text, text


def test_a_target_name_of_another_architecture_is_said_not_failed(project):
    """Its twin: a shared target list naming modules of another family ('query', 'value': BERT's) beside the Llama's
    own: nothing is a near miss of a module here, so the pass says which entries matched nothing."""
    project.conftest(project_source(lora="target_modules=['q_proj', 'v_proj', 'query', 'value']"))
    run = project.run("--dlcheck=T13", "-rA")
    run.assert_outcome("T13", "passed")
    assert "target_modules entries matching no module (another architecture's names?): 'query', 'value'" in " ".join(
        run.text.split()
    )
