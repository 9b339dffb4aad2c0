"""--dlcheck=all on one project: the checks of another domain skip with the reason instead of reading
the project's objects as their own. A vision/plain loader's (inputs, targets) tuples are no token batches
(the llm checks skip); DF5 needs a diffusion role before it reads captions or calls a tokenizer."""

import tiny  # noqa: F401

PROJECT = """
    import pytest, tiny, torch
    from torch.utils.data import DataLoader, TensorDataset

    @pytest.fixture(scope="session")
    def dlcheck_tokenizer():
        return tiny.tokenizer()

    @pytest.fixture(scope="session")
    def dlcheck_dataloader():
        g = torch.Generator().manual_seed(0)
        data = TensorDataset(torch.randn(32, 3, 8, 8, generator=g), torch.randint(0, 4, (32,), generator=g))
        return DataLoader(data, batch_size=8, shuffle=True)
"""


def test_tuple_batches_are_not_token_batches(project):
    project.conftest(PROJECT)
    run = project.run("--dlcheck=llm,DF5")
    assert not [cid for cid, outs in run.outcomes.items() if "failed" in outs], run.text
    assert "dlcheck_dataloader yields lists of tensors ((8, 3, 8, 8), (8,)), not mappings of token fields" in run.text
    run.assert_outcome("DF5", "skipped")
    assert "no diffusion role: DF5 judges the conditioning of a text-to-image training" in run.text
