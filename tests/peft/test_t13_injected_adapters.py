"""T13 on adapters injected into a plain module without the PeftModel wrapper: peft's ``inject_adapter_in_model``,
which diffusers' ``unet.add_adapter(LoraConfig(...))`` (train_text_to_image_lora.py) and transformers'
``model.add_adapter`` call. The module holds real ``peft.tuners.lora.LoraLayer`` layers and a ``peft_config``; T13
reads them and judges what it judges for a PeftModel. Before, it said "not a peft.PeftModel: no adapter to read"
and was blind to a base left unfrozen in every diffusers LoRA script (found blind on train_text_to_image_lora)."""

import json
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parents[1] / "train"))
import tiny_train as tt  # noqa: E402

#: a tiny two-block torch module, LoRA injected into its q and v projections
INJECTED = """
    from peft import LoraConfig, inject_adapter_in_model

    class Block(nn.Module):
        def __init__(self):
            super().__init__()
            self.q, self.v = nn.Linear(8, 8), nn.Linear(8, 8)

        def forward(self, x):
            return x + torch.tanh(self.v(self.q(x)))

    class Net(nn.Module):
        def __init__(self):
            super().__init__()
            self.layers = nn.ModuleList([Block(), Block()])
            self.head = nn.Linear(8, 4)

        def forward(self, x):
            for block in self.layers:
                x = block(x)
            return self.head(x)

    def lora_net():
        torch.manual_seed(0)
        net = Net()
        net = inject_adapter_in_model(LoraConfig(r=2, lora_alpha=4, target_modules=["q", "v"]), net)
        {after}
        return net
"""


def injected(after: str = "pass") -> str:
    return tt.loop_project(
        model="lora_net()",
        optimizer="torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=1e-2)",
    ) + INJECTED.format(after=after)


@pytest.fixture(autouse=True)
def _paths(monkeypatch):
    monkeypatch.syspath_prepend(str(Path(__file__).parents[1] / "train"))


def test_a_base_unfrozen_after_inject_adapter_in_model_fails(project):
    project.conftest(injected(after="net.requires_grad_(True)"))
    run = project.run("--dlcheck=T13")
    run.assert_outcome("T13", "failed")
    text = tt.section(run, "T13")
    # 4 q/v Linear weights and biases + the head's weight and bias
    assert "10 of 10 base-model parameter tensors of the model of" in text, text
    assert "(LORA injected into the Net without a PeftModel wrapper, adapter 'default') require gradients" in text
    assert "layers.0.q.base_layer.weight" in text, text
    assert "the base model was unfrozen after the adapter was added (add_adapter / inject_adapter_in_model)" in text
    assert "leave requires_grad as add_adapter / inject_adapter_in_model sets it" in text, text


def test_injected_lora_with_a_frozen_base_passes(project, tmp_path):
    project.conftest(injected())
    out = tmp_path / "r.json"
    run = project.run("--dlcheck=T13", "-rA", f"--dlcheck-json={out}")
    run.assert_outcome("T13", "passed")
    evidence = " ".join(json.loads(out.read_text())["results"][0]["evidence"])
    assert "adapts q: 2 of 2 layers, v: 2 of 2 layers" in evidence, evidence
    assert "8 adapter/modules_to_save tensors train" in evidence, evidence
    assert "none of the 10 base tensors" in evidence, evidence


#: diffusers' train_text_to_image_lora.py in small: the UNet frozen, then unet.add_adapter(LoraConfig(...))
UNET = """
    import pytest, torch
    from diffusers import UNet2DConditionModel
    from peft import LoraConfig

    @pytest.fixture(scope="session")
    def dlcheck_model():
        torch.manual_seed(0)
        unet = UNet2DConditionModel(sample_size=8, in_channels=4, out_channels=4, layers_per_block=1,
                                    block_out_channels=(8, 16), norm_num_groups=4, cross_attention_dim=8,
                                    attention_head_dim=2, down_block_types=("CrossAttnDownBlock2D", "DownBlock2D"),
                                    up_block_types=("UpBlock2D", "CrossAttnUpBlock2D"))
        unet.requires_grad_(False)
        unet.add_adapter(LoraConfig(r=2, lora_alpha=2, init_lora_weights="gaussian",
                                    target_modules=["to_k", "to_q", "to_v", "to_out.0"]))
        {after}
        return unet
"""


def test_diffusers_unet_add_adapter_is_read(project):
    project.conftest(UNET.format(after="pass"))
    run = project.run("--dlcheck=T13", "-rA")
    run.assert_outcome("T13", "passed")
    text = " ".join(run.text.split())
    assert "LORA injected into the UNet2DConditionModel without a PeftModel wrapper" in text, text[-3000:]
    assert "not a peft.PeftModel" not in text, text[-3000:]


def test_diffusers_unet_unfrozen_after_add_adapter_fails(project):
    project.conftest(UNET.format(after="unet.requires_grad_(True)"))
    run = project.run("--dlcheck=T13")
    run.assert_outcome("T13", "failed")
    text = tt.section(run, "T13")
    assert "base-model parameter tensors of dlcheck_model (LORA injected into the UNet2DConditionModel" in text, text
