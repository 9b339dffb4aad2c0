"""L5 on a model without a config: a model whose training batches hold images (float inputs), with no tokenizer
and no Trainer, is no language model: not applicable; a hand-written language model without a config (integer
token ids in its batches) still skips saying it has no config to read positions from."""

import pytest
import torch

# torch.compile's modules imported once here, outside pytester's in-process runs, which forget them and would
# register their operator libraries a second time
torch.compile(torch.nn.Identity())
import torch._dynamo  # noqa: E402,F401
import torch.ao.quantization.fx._decomposed  # noqa: E402,F401

PROJECT = """
    import pytest, torch
    from torch import nn
    from torch.utils.data import DataLoader, TensorDataset

    @pytest.fixture(scope="session")
    def dlcheck_model():
        torch.manual_seed(0)
        if {images}:
            return nn.Sequential(nn.Conv2d(3, 4, 3), nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(4, 2))
        lm = nn.Sequential(nn.Embedding(50, 8), nn.Linear(8, 50))  # a character LM without a config
        return torch.compile(lm) if {compiled} else lm

    @pytest.fixture(scope="session")
    def dlcheck_dataloader():
        g = torch.Generator().manual_seed(0)
        if {images}:
            x = torch.rand(16, 3, 8, 8, generator=g)
            return DataLoader(TensorDataset(x, torch.randint(0, 2, (16,), generator=g)), batch_size=4)
        ids = torch.randint(0, 50, (16, 9), generator=g)
        return DataLoader(TensorDataset(ids[:, :-1], ids[:, 1:]), batch_size=4)
"""


def test_an_image_model_without_a_config_is_not_applicable(project):
    project.conftest(PROJECT.format(images=True, compiled=False))
    run = project.run("--dlcheck=L5", "-rs")
    run.assert_outcome("L5", "skipped")
    run.fnmatch(
        [
            "*L5_positions: not applicable: Sequential has no config and its training batches' inputs are floats "
            "(torch.float32 (4, 3, 8, 8)), not token ids: it is no language model*"
        ]
    )


@pytest.mark.parametrize("compiled", [False, True])
def test_a_language_model_without_a_config_still_skips(project, compiled):
    # a torch.compile wrapper is looked through: the skip names the module, not OptimizedModule
    project.conftest(PROJECT.format(images=False, compiled=compiled))
    run = project.run("--dlcheck=L5", "-rs")
    run.assert_outcome("L5", "skipped")
    run.fnmatch(["*L5_positions: Sequential has no config to read positions from*"])
    assert "not applicable" not in run.text
