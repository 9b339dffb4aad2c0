"""A clean two-stage LLaVA set-up: TRL's SFTTrainer with no max_length cutting the 256 image tokens, and
a stage set-up that freezes the whole model, unfreezes exactly the towers the recipe declares and gives
each its own param group and learning rate. The trainer also loads its checkpoints through LLaVA's
key conversion: transformers 5 saves LLaVA's weights under their original names and the Trainer's
resume loads them with load_state_dict(strict=False), which restores none of them (C1 catches it).

    pytest --dlcheck=vlm examples/vlm        # every vlm check passes here
"""

import pytest
import tinyllava
import torch

STAGES = {
    "align": {"projector": 1e-3},  # stage 1: feature alignment
    "instruct": {"vision": 2e-6, "projector": 2e-5, "language_model": 2e-5},  # stage 2: instruction tuning
}


def setup_stage(model, stage):
    model.requires_grad_(False)
    groups = []
    for tower, lr in STAGES[stage].items():
        params = [p for module in tinyllava.tower_modules(model)[tower] for p in module.parameters()]
        for p in params:
            p.requires_grad_(True)
        groups.append({"params": params, "lr": lr})
    return torch.optim.AdamW(groups)


@pytest.fixture(scope="session")
def dlcheck_trainer(tmp_path_factory):
    from trl import SFTConfig, SFTTrainer

    class ResumableSFTTrainer(SFTTrainer):
        def _load_from_checkpoint(self, checkpoint, model=None):
            model = model or self.model  # from_pretrained applies the key conversion save_pretrained reverted
            model.load_state_dict(type(model).from_pretrained(checkpoint, dtype=model.dtype).state_dict())

    processor = tinyllava.build_processor()
    args = SFTConfig(**tinyllava.common_args(tmp_path_factory.mktemp("sft")), max_length=None)
    return ResumableSFTTrainer(
        model=tinyllava.build_model(processor), args=args, processing_class=processor, train_dataset=tinyllava.dataset()
    )


@pytest.fixture(scope="session")
def dlcheck_stages():
    return STAGES


@pytest.fixture(scope="session")
def dlcheck_stage_setup():
    return setup_stage
