"""The same LLaVA project with three silent bugs that train without an error message (until the first
batch reaches the model):
- stage 1 freezes model.model.vision_tower and model.model.language_model, but in transformers 5 lm_head
  sits outside language_model: the LM's output layer trains during feature alignment (X1);
- one global learning rate: AdamW over every trainable parameter at the LM's 2e-5, so the vision tower
  unfrozen in stage 2 trains 10x faster than the recipe's 2e-6 (X3);
- max_length=128, a text-sized limit, while one picture expands to 256 <image> tokens: the collator cuts
  them (X4; X5 then skips: the model cannot run on such a batch).

    pytest --dlcheck=vlm examples/vlm        # X1, X3 and X4 fail here, with evidence and the fix
"""

import pytest
import tinyllava
import torch

STAGES = {
    "align": {"projector": 1e-3},
    "instruct": {"vision": 2e-6, "projector": 2e-5, "language_model": 2e-5},
}


def setup_stage(model, stage):
    model.model.vision_tower.requires_grad_(stage == "instruct")
    model.model.language_model.requires_grad_(stage == "instruct")
    lr = 1e-3 if stage == "align" else 2e-5
    return torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=lr)


@pytest.fixture(scope="session")
def dlcheck_trainer(tmp_path_factory):
    from trl import SFTConfig, SFTTrainer

    processor = tinyllava.build_processor()
    args = SFTConfig(**tinyllava.common_args(tmp_path_factory.mktemp("sft")), max_length=128)
    return SFTTrainer(
        model=tinyllava.build_model(processor), args=args, processing_class=processor, train_dataset=tinyllava.dataset()
    )


@pytest.fixture(scope="session")
def dlcheck_stages():
    return STAGES


@pytest.fixture(scope="session")
def dlcheck_stage_setup():
    return setup_stage
