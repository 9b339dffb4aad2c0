"""T3 under LoRA: reentrant gradient checkpointing with frozen embeddings cuts every adapter off the loss (T3
names the cause and the fix); the same checkpointing with the input hook transformers installs, or the
non-reentrant variant, passes (autograd.grad alone would see no path into a reentrant checkpointed layer); LoRA's
zero-initialised B gives lora_A an exactly zero gradient, which T3 explains and does not fail."""

import sys
from pathlib import Path

import peft_tiny
import pytest
import tiny

sys.path.insert(0, str(Path(__file__).parents[1] / "train"))
import tiny_train as tt  # noqa: E402

LLAMA_LOOP = """
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
            model = get_peft_model(tiny.llama(dlcheck_tokenizer), peft_tiny.lora())
            {checkpointing}
            return {{"model": model, "optimizer": torch.optim.AdamW(model.parameters(), lr=1e-3)}}
        return make
"""

REENTRANT = 'model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": True})'
# transformers 5 installs the input-require-grads hook in gradient_checkpointing_enable; transformers 4 did not for
# a PeftModel, and disable_input_require_grads() puts a model back in that state
NO_INPUT_HOOK = REENTRANT + "; model.disable_input_require_grads()"
NON_REENTRANT = 'model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})'


def llama_loop(checkpointing: str) -> str:
    return LLAMA_LOOP.format(checkpointing=checkpointing)


CUSTOM = """
    import pytest, torch, peft_tiny, tiny_train as tt
    from torch import nn
    from peft import LoraConfig, get_peft_model

    @pytest.fixture(scope="session")
    def dlcheck_make_training():
        def make():
            torch.manual_seed(0)
            model = get_peft_model(peft_tiny.CheckpointedNet(reentrant={reentrant}), LoraConfig(r=4, target_modules=["proj"]))
            return {{"model": model, "optimizer": torch.optim.AdamW(model.parameters(), lr=1e-2)}}
        return make

    @pytest.fixture(scope="session")
    def dlcheck_dataloader():
        return torch.utils.data.DataLoader(tt.token_classes(), batch_size=8)

    @pytest.fixture(scope="session")
    def dlcheck_loss_fn():
        return nn.CrossEntropyLoss()
"""


@pytest.fixture(autouse=True)
def _paths(monkeypatch):
    monkeypatch.syspath_prepend(str(Path(__file__).parent))
    monkeypatch.syspath_prepend(str(Path(__file__).parents[1] / "train"))


def test_reentrant_checkpointing_without_the_input_hook_names_the_cause(project):
    project.conftest(llama_loop(NO_INPUT_HOOK))
    run = project.run("--dlcheck=T3")
    run.assert_outcome("T3", "failed")
    text = tt.section(run, "T3")
    assert "8 of 8 trainable parameter tensors get no gradient" in text, text
    assert "gradient checkpointing is on in" in text and "with use_reentrant=True" in text, text
    assert "None of the inputs have requires_grad=True" in text, text
    assert "the input embeddings (Embedding) are frozen" in text, text
    assert "reentrant gradient checkpointing runs each checkpointed layer under torch.no_grad()" in text, text
    assert "model.enable_input_require_grads()" in text and "'use_reentrant': False" in text, text
    assert "computed under torch.no_grad() or from detached tensors" not in text, text


def test_a_hand_written_forward_that_checkpoints_with_reentrant_true_names_the_cause(project):
    project.conftest(CUSTOM.format(reentrant=True))
    run = project.run("--dlcheck=T3")
    run.assert_outcome("T3", "failed")
    text = tt.section(run, "T3")
    assert "4 of 4 trainable parameter tensors get no gradient" in text, text
    assert "the forward calls torch.utils.checkpoint.checkpoint(..., use_reentrant=True)" in text, text
    assert "model.enable_input_require_grads()" in text, text


def test_a_hand_written_forward_checkpointing_without_reentrance_passes(project):
    project.conftest(CUSTOM.format(reentrant=False))
    run = project.run("--dlcheck=T3", "-rA")
    run.assert_outcome("T3", "passed")


@pytest.mark.parametrize("checkpointing", [REENTRANT, NON_REENTRANT], ids=["reentrant-with-hook", "non-reentrant"])
def test_checkpointing_that_keeps_the_graph_passes(project, checkpointing):
    project.conftest(llama_loop(checkpointing))
    run = project.run("--dlcheck=T3", "-rA")
    run.assert_outcome("T3", "passed")
    run.fnmatch(["all 8 trainable parameter tensors get a gradient from the loss on batch 0*"])


def test_lora_b_at_zero_gives_lora_a_an_exact_zero_gradient_and_t3_explains_it(project):
    # the library's own behaviour, measured: B = 0 at initialisation, so dL/dA = B^T (...) = 0 exactly
    tok = tiny.tokenizer()
    from peft import get_peft_model

    model = get_peft_model(tiny.llama(tok), peft_tiny.lora())
    batch = next(iter(tt.llm_loader(tok)))
    model(**batch).loss.backward()
    grads = {n: p.grad for n, p in model.named_parameters() if p.requires_grad}
    assert all(not g.any() for n, g in grads.items() if "lora_A" in n)
    assert all(g.any() for n, g in grads.items() if "lora_B" in n)

    project.conftest(llama_loop(""))
    run = project.run("--dlcheck=T3", "-rA")
    run.assert_outcome("T3", "passed")
    text = run.text.replace("\n", " ")
    assert "4 of them get an exactly zero gradient (4 LoRA factors" in text, text
    assert "is zero at initialisation, so this one's gradient is 0 until the first step" in text, text
