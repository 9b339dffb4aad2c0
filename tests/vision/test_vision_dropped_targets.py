"""Targets the model never trains on (blind set 10's run_mim): the dataset's examples carry a 'label' column that
the collate_fn leaves out (SimMIM trains on pixel_values and bool_masked_pos). The vision checks of targets judge
what the model trains on: not applicable there (V3 had compared the labels 0..9 with a masked-image model's
default config.num_labels = 2 and failed). A classifier whose collate keeps the labels still fails V3."""

import pytest

CONFTEST = """
import pytest, torch
from torch.utils.data import DataLoader, Dataset
from transformers import ViTConfig, {cls}


class Images(Dataset):
    def __len__(self):
        return 24

    def __getitem__(self, i):
        g = torch.Generator().manual_seed(i)
        return {{"pixel_values": torch.rand(3, 16, 16, generator=g) * 2 - 1, "label": i % 10}}


def collate(examples):
    batch = {{"pixel_values": torch.stack([e["pixel_values"] for e in examples])}}
    {keep}
    return batch


@pytest.fixture(scope="session")
def dlcheck_dataset():
    return Images()


@pytest.fixture(scope="session")
def dlcheck_dataloader(dlcheck_dataset):
    return DataLoader(dlcheck_dataset, batch_size=4, collate_fn=collate)


@pytest.fixture(scope="session")
def dlcheck_model():
    torch.manual_seed(0)
    cfg = ViTConfig(image_size=16, patch_size=4, hidden_size=16, num_hidden_layers=1, num_attention_heads=2,
                    intermediate_size=32, encoder_stride=4)
    return {cls}(cfg)
"""

MIM_KEEP = 'batch["bool_masked_pos"] = torch.rand(len(examples), 16) < 0.5'
LABELS_KEEP = 'batch["labels"] = torch.tensor([e["label"] for e in examples])'


def test_labels_the_collator_leaves_out_are_not_judged_against_a_head_the_model_lacks(project):
    project.conftest(CONFTEST.format(cls="ViTForMaskedImageModeling", keep=MIM_KEEP))
    run = project.run("--dlcheck=V3,V5,V6,V8", "-rA")
    for cid in ("V3", "V5", "V6", "V8"):
        run.assert_outcome(cid, "skipped")
    text = " ".join(run.text.split())
    assert (
        "V3 judges boxes and class ids; the sampled examples (8 examples of dlcheck_dataset) carry no targets" in text
    )
    assert "num_classes 2" not in text


@pytest.mark.parametrize("cls", ["ViTForImageClassification"])
def test_a_classifier_trained_on_labels_past_its_head_still_fails(project, cls):
    # the twin: the collate keeps the labels 0..9, the head predicts config.num_labels = 2
    project.conftest(CONFTEST.format(cls=cls, keep=LABELS_KEEP))
    run = project.run("--dlcheck=V3")
    run.assert_outcome("V3", "failed")
    assert "num_classes 2 (model head model.config.num_labels)" in " ".join(run.text.split())
