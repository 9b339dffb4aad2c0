"""Whose error it is when an exception escapes a check. An exception raised in a check's own code, or by the
user's code handed an input the check made up, is an internal error of pytest-dlcheck: it says so, names the
plugin's frame and asks for a report. Only the user's code raising on the pipeline's own inputs is the user's,
naming the role. A None or a NaN in the user's data blames nobody by itself.

The checks here are a small check pack whose module lives in a directory counted as pytest-dlcheck's own code
(``session.PLUGIN_DIRS``), as the built-in checks' do."""

from __future__ import annotations

import textwrap

import pytest

from pytest_dlcheck import entry, registry, session

DOC = '''"""A check of the attribution tests.

    What it does
        x
    Why it is bad
        x
    Example
        x
    Use instead
        x
    Known problems
        x
    Not applicable
        x
    """'''

CHECKS = f"""
import torch

from pytest_dlcheck.registry import check
from pytest_dlcheck.session import made_up


@check("L91", domain="llm", title="a check whose own code raises", roles=("model",))
def check_own_code_raises(dlcheck):
    {DOC}
    dlcheck.role("model")
    settings = {{}}
    return settings["threshold"]  # the check's own bug


@check("L92", domain="llm", title="the model on an input the check made up", roles=("model",))
def check_made_up_input(dlcheck):
    {DOC}
    model = dlcheck.role("model")
    dlcheck.call("model", lambda: model(torch.full((2, 3), 99.0)), synthetic="inputs of 99 (made up)")


@check("L93", domain="llm", title="the model on the pipeline's own batch", roles=("model", "dataloader"))
def check_own_batch(dlcheck):
    {DOC}
    model, loader = dlcheck.require("model", "dataloader")
    batch = next(iter(loader))
    dlcheck.call("model", lambda: model(batch["x"]))
    dlcheck.measured("the model ran on the first batch")


@check("L94", domain="llm", title="the training machinery on a made-up batch", roles=("model",))
def check_made_up_deep(dlcheck):
    {DOC}
    from pytest_dlcheck.session import user_call

    model = dlcheck.role("model")
    with made_up("a batch whose inputs are all 99"):
        user_call("model", lambda: model(torch.full((2, 3), 99.0)))  # as deep in the shared machinery


@check("L95", domain="llm", title="a check's own code on a batch holding a None", roles=("collator", "dataset"))
def check_none_in_data(dlcheck):
    {DOC}
    collator, dataset = dlcheck.require("collator", "dataset")
    batch = dlcheck.call("collator", lambda: collator([dataset[0], dataset[1]]))
    return batch["weights"] + 1  # the check's own code, not ready for a None


@check("L96", domain="llm", title="a check's own code on a batch holding a NaN", roles=("collator", "dataset"))
def check_nan_in_data(dlcheck):
    {DOC}
    collator, dataset = dlcheck.require("collator", "dataset")
    batch = dlcheck.call("collator", lambda: collator([dataset[0], dataset[1]]))
    return int(batch["scores"].sum())  # the check's own code, not ready for a NaN


@check("L98", domain="llm", title="the user's loader iterated by the check's own code", roles=("dataloader",))
def check_iterates_loader(dlcheck):
    {DOC}
    (loader,) = dlcheck.require("dataloader")
    batch = next(iter(loader))  # the shared machinery's way: no dlcheck.call around the loader
    dlcheck.measured(f"{{len(batch)}} fields")


@check("L97", domain="llm", title="a check's own code on examples before collation", roles=("dataset",))
def check_raw_rows(dlcheck):
    {DOC}
    from pytest_dlcheck.sampling import Sample

    (dataset,) = dlcheck.require("dataset")
    # the examples as the collator takes them: a multiple-choice example holds one list of ids per choice
    sample = dlcheck.memo(dataset, "attr:rows", lambda: Sample(list(dataset), [], None, "dlcheck_dataset"))
    return sample.rows[0]["input_ids"][0][40]  # the check's own code, reading past a choice's end
"""

CONFTEST = """
import pytest, torch
import attr_checks  # noqa: F401  (the check pack)


class Model(torch.nn.Module):
    '''The user's model: it asserts its inputs are below 10 (real inputs are)'''

    def __init__(self):
        super().__init__()
        self.lin = torch.nn.Linear(3, 2)

    def forward(self, x):
        if float(x.max()) >= {limit}:
            raise ValueError("inputs must be normalised")
        return self.lin(x)


@pytest.fixture(scope="session")
def dlcheck_model():
    return Model()


@pytest.fixture(scope="session")
def dlcheck_dataloader():
    return [{{"x": torch.full((2, 3), 5.0)}}]


@pytest.fixture(scope="session")
def dlcheck_dataset():
    return [{{"x": [1.0, 2.0], "weights": None}}, {{"x": [3.0, 4.0], "weights": None}}]


@pytest.fixture(scope="session")
def dlcheck_collator():
    def collate(rows):
        return {{"x": torch.tensor([r["x"] for r in rows]), "weights": rows[0]["weights"],
                 "scores": torch.tensor([1.0, float("nan")])}}
    return collate
"""

INTERNAL = "internal error of pytest-dlcheck (this is a bug of pytest-dlcheck, not of your pipeline): "


@pytest.fixture
def pack(project, monkeypatch):
    """The check pack beside the user's conftest.py, its directory counted as the plugin's code; the
    registry and the plugin's directories are put back afterwards."""
    monkeypatch.setattr(registry, "_CHECKS", dict(registry._CHECKS))
    monkeypatch.setattr(entry, "_packs", lambda: True)  # its IDs are judged once it is loaded, as a pack's
    folder = project.pytester.path / "pack"
    folder.mkdir()
    (folder / "attr_checks.py").write_text(textwrap.dedent(CHECKS))
    monkeypatch.syspath_prepend(str(folder))
    monkeypatch.setattr(session, "PLUGIN_DIRS", (*session.PLUGIN_DIRS, str(folder)))
    monkeypatch.delitem(__import__("sys").modules, "attr_checks", raising=False)
    return project


def _one_line(text: str) -> str:
    return " ".join(text.split())


def test_a_checks_own_bug_is_an_internal_error_at_the_plugins_frame(pack):
    pack.conftest(CONFTEST.format(limit=10))
    run = pack.run("--dlcheck=L91")
    run.assert_outcome("L91", "failed")
    text = _one_line(run.text)
    assert INTERNAL + "KeyError: 'threshold' at check_own_code_raises at " in text, run.text
    assert "attr_checks.py:" in text and "please report it with this output" in text, run.text
    assert "role dlcheck_model" not in text and "dlcheck_model: " not in text, run.text


def test_the_users_code_raising_on_a_made_up_input_is_an_internal_error_naming_it(pack):
    pack.conftest(CONFTEST.format(limit=10))
    run = pack.run("--dlcheck=L92,L94")
    for cid in ("L92", "L94"):
        run.assert_outcome(cid, "failed")
    text = _one_line(run.text)
    assert (
        INTERNAL + "ValueError: inputs must be normalised (dlcheck_model raised it on inputs of 99 (made up), not on "
        "your pipeline's own data) at <lambda> at pack/attr_checks.py:" in text
    ), run.text
    assert "(dlcheck_model raised it on a batch whose inputs are all 99, not on your pipeline's own data)" in text
    assert "dlcheck_model: raised" not in text, run.text


def test_the_users_code_raising_on_the_pipelines_own_batch_is_the_users_naming_the_role(pack):
    pack.conftest(CONFTEST.format(limit=1))
    run = pack.run("--dlcheck=L93")
    run.assert_outcome("L93", "failed")
    text = _one_line(run.text)
    assert "error raised ValueError: inputs must be normalised (in forward at conftest.py:" in text, run.text
    assert "role dlcheck_model (the fixture that provides it" in text, run.text
    assert "internal error" not in text, run.text
    # the correct twin: inputs below the model's limit
    pack.conftest(CONFTEST.format(limit=10))
    pack.run("--dlcheck=L93").assert_outcome("L93", "passed")


def test_a_none_in_the_users_data_does_not_blame_the_role(pack):
    """The check's own code adds 1 to a field the user's collator leaves None (a legitimate value): the
    crash is the check's bug, not "dlcheck_collator returned a value whose field 'weights' is None"."""
    pack.conftest(CONFTEST.format(limit=10))
    run = pack.run("--dlcheck=L95")
    run.assert_outcome("L95", "failed")
    text = _one_line(run.text)
    assert INTERNAL + "TypeError: unsupported operand type(s) for +: 'NoneType' and 'int' at check_none_in_data" in text
    assert "is None" not in text and "returned a value whose" not in text, run.text


def test_a_nan_in_the_users_data_does_not_blame_the_role(pack):
    """A NaN score (a legitimate value for the pipeline) that the check's own int() cannot take: the check's
    bug, not "dlcheck_collator returned a value whose field 'scores' has 1 NaN/Inf values"."""
    pack.conftest(CONFTEST.format(limit=10))
    run = pack.run("--dlcheck=L96")
    run.assert_outcome("L96", "failed")
    text = _one_line(run.text)
    assert INTERNAL + "ValueError: cannot convert float NaN to integer at check_nan_in_data" in text, run.text
    assert "NaN/Inf values" not in text and "returned a value whose" not in text, run.text


def test_ragged_examples_before_collation_do_not_blame_the_role(pack, monkeypatch):
    """Examples before collation hold lists of any length (the collator pads them; a multiple-choice example holds
    one list per choice): a check's own IndexError on them is its bug, not "dlcheck_dataset gave data whose rows
    item 0: field 'input_ids' is a ragged list" (what run_swag's collator and dataset were blamed for)."""
    pack.conftest(
        CONFTEST.format(limit=10).replace(
            'return [{"x": [1.0, 2.0], "weights": None}, {"x": [3.0, 4.0], "weights": None}]',
            'return [{"input_ids": [[5, 6, 7], [5, 6], [5, 6, 7, 8]], "label": 1}]',
        )
    )
    run = pack.run("--dlcheck=L97")
    run.assert_outcome("L97", "failed")
    text = _one_line(run.text)
    assert INTERNAL + "IndexError: list index out of range at check_raw_rows" in text, run.text
    assert "is a ragged" not in text and "gave data whose" not in text, run.text


LOADER = """
import pytest, torch
from torch.utils.data import DataLoader, Dataset
import attr_checks  # noqa: F401  (the check pack)


class Images(Dataset):
    # the user's dataset: its augmentation raises on some examples (timm's RandAugment posterize at 0 bits on a
    # newer Pillow, as facebookresearch/mae's fine-tuning hit)

    def __len__(self):
        return 8

    def __getitem__(self, i):
        if i == 1:
            raise ValueError("bits must be between or equal to 1 and 8")
        return torch.zeros(3)


@pytest.fixture(scope="session")
def dlcheck_dataloader():
    return DataLoader(Images(), batch_size=4, num_workers={workers})
"""


@pytest.mark.parametrize("workers", [0, 1])
def test_the_users_loader_raising_on_its_own_data_is_the_users_naming_the_role(pack, workers):
    """A DataLoader whose dataset raises on its own data (in the main process, or in a worker whose error the loader
    re-raises) while the plugin iterates it: the dataloader role's error, never an internal error (found blind, set
    16: facebookresearch/mae main_finetune.py, 11 checks had said 'this is a bug of pytest-dlcheck')."""
    pack.conftest(LOADER.format(workers=workers))
    run = pack.run("--dlcheck=L98")
    run.assert_outcome("L98", "failed")
    text = _one_line(run.text)
    assert "bits must be between or equal to 1 and 8" in text, run.text
    assert "role dlcheck_dataloader" in text, run.text
    assert "internal error" not in text, run.text
