"""No conftest.py needed to start (issue 32, item 7): the roles are named on the command line
(``--dlcheck-trainer=mypkg.train:build_trainer``, ``--dlcheck-lightning``, ``--dlcheck-make-training``,
``--dlcheck-role``) and the checks are collected beside the builder's own module file; ``--dlcheck-init``
writes a starter conftest.py for the kind of training the source shows."""

from __future__ import annotations

import subprocess
import sys
import textwrap

import pytest

TRAIN_PY = """
    import tiny
    from transformers import DataCollatorForLanguageModeling, Trainer


    def build_trainer(tmp_path_factory):
        tok = tiny.tokenizer(pad={pad})
        args = tiny.trainer_args(tmp_path_factory.mktemp("o"), learning_rate=1e-3)
        return Trainer(model=tiny.llama(tok), args=args, processing_class=tok, train_dataset=tiny.tokenized(tok),
                       data_collator=DataCollatorForLanguageModeling(tok, mlm=False))
"""

SAME_AS_CONFTEST = """
    import pytest
    from mypkg.train import build_trainer

    @pytest.fixture(scope="session")
    def dlcheck_trainer(tmp_path_factory):
        return build_trainer(tmp_path_factory)
"""


def write(pytester: pytest.Pytester, files: dict[str, str]) -> None:
    for path, source in files.items():
        target = pytester.path / path
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_text(textwrap.dedent(source))


def trainer_project(pytester: pytest.Pytester, pad: str) -> None:
    write(pytester, {"mypkg/__init__.py": "", "mypkg/train.py": TRAIN_PY.format(pad=pad)})


def test_a_builder_module_alone_runs_llm_train_ckpt_smoke(project):
    # pad == eos and a collator masking every pad id: L11 fails; the same function handed over by a conftest.py
    # gets the same outcomes
    trainer_project(project.pytester, pad="tiny.EOS")
    assert not (project.pytester.path / "conftest.py").exists()
    run = project.run("--dlcheck=llm,train,ckpt,smoke", "--dlcheck-trainer=mypkg.train:build_trainer")
    run.fnmatch(["mypkg/train.py::L11_eos_supervised FAILED*", "mypkg/train.py::T1_initial_loss PASSED*"])
    assert "error" not in {o for found in run.outcomes.values() for o in found}, run.text
    for domain in ("llm", "train", "ckpt", "smoke"):
        assert any(cid.startswith(domain[0].upper()) for cid in run.outcomes), f"no {domain} check ran:\n{run.text}"
    section = run.section("L11")
    assert "has label -100" in section and "pad_token == eos_token" in section and "own pad token" in section
    assert "no check collected" not in run.text

    subset = ["L2", "L11", "T1", "T8", "C2", "S1"]
    project.conftest(SAME_AS_CONFTEST)
    with_conftest = project.run(f"--dlcheck={','.join(subset)}")
    with_conftest.fnmatch(["conftest.py::L11_eos_supervised FAILED*"])
    assert {c: with_conftest.outcome(c) for c in subset} == {c: run.outcome(c) for c in subset}


def test_the_clean_twin_passes(project):
    trainer_project(project.pytester, pad="tiny.PAD")
    run = project.run("--dlcheck=L11", "--dlcheck-trainer=mypkg.train:build_trainer")
    run.fnmatch(["mypkg/train.py::L11_eos_supervised PASSED*"])


@pytest.mark.parametrize(
    ("option", "said"),
    [
        (
            "--dlcheck-trainer=mypkg.train:build_trainr",
            "*--dlcheck-trainer 'mypkg.train:build_trainr': mypkg.train (*train.py) defines no 'build_trainr' "
            "(did you mean build_trainer?)*",
        ),
        (
            "--dlcheck-trainer=mypkg.trian:build_trainer",
            "*--dlcheck-trainer 'mypkg.trian:build_trainer': no module named 'mypkg.trian' (did you mean mypkg.train?)*",
        ),
        ("--dlcheck-trainer=mypkg.train", "*--dlcheck-trainer 'mypkg.train': expected MODULE:ATTRIBUTE*"),
        (
            "--dlcheck-role=dataloder=mypkg.train:x",
            "*no pytest-dlcheck role named 'dataloder' (did you mean dataloader?)*",
        ),
    ],
)
def test_an_unknown_module_or_attribute_is_a_usage_error_before_importing_it(project, option, said):
    # the module raises when imported: the usage error is judged on its source, without importing it
    write(
        project.pytester,
        {
            "mypkg/__init__.py": "",
            "mypkg/train.py": "raise RuntimeError('imported')\n\ndef build_trainer():\n    pass\n",
        },
    )
    run = project.run("--dlcheck=llm", option)
    assert run.result.ret == pytest.ExitCode.USAGE_ERROR
    run.result.stderr.fnmatch_lines([said])
    assert "imported" not in run.result.stderr.str()


def test_a_builder_without_a_selection_is_a_usage_error(project):
    trainer_project(project.pytester, pad="tiny.PAD")
    run = project.run("--dlcheck-trainer=mypkg.train:build_trainer")
    assert run.result.ret == pytest.ExitCode.USAGE_ERROR
    run.result.stderr.fnmatch_lines(["*--dlcheck-trainer names a role for the checks: say which to run*"])


def test_lightning_and_a_plain_loop_by_option(project):
    write(
        project.pytester,
        {
            "proj/__init__.py": "",
            "proj/lit.py": """
                import tiny_lightning as tl

                def build():
                    return tl.Classifier(), tl.Blobs()
            """,
            "proj/loop.py": """
                import torch, tiny_train as tt

                def make_training():
                    model = tt.MLP()
                    return {"model": model, "optimizer": torch.optim.AdamW(model.parameters(), lr=1e-2)}

                loss_fn = torch.nn.CrossEntropyLoss()

                def train_loader():
                    return tt.loader()
            """,
        },
    )
    lit = project.run("--dlcheck=T1,T3", "--dlcheck-lightning=proj.lit:build")
    lit.fnmatch(["proj/lit.py::T1_initial_loss PASSED*", "proj/lit.py::T3_gradients PASSED*", "train * 2 passed*"])
    loop = project.run(
        "--dlcheck=T1,T3",
        "--dlcheck-make-training=proj.loop:make_training",
        "--dlcheck-role=dataloader=proj.loop:train_loader()",
        "--dlcheck-role=loss_fn=proj.loop:loss_fn",
    )
    loop.fnmatch(["proj/loop.py::T1_initial_loss PASSED*", "proj/loop.py::T3_gradients PASSED*", "train * 2 passed*"])


def test_init_writes_a_trainer_conftest_that_runs(project):
    trainer_project(project.pytester, pad="tiny.EOS")
    init = project.run("--dlcheck-init")
    assert init.result.ret == 0
    conftest = (project.pytester.path / "conftest.py").read_text()
    init.fnmatch(["dlcheck-init: wrote *conftest.py for a transformers / TRL Trainer: filled dlcheck_trainer*"])
    assert "from mypkg.train import build_trainer" in conftest
    assert "return build_trainer(tmp_path_factory)" in conftest
    assert "pytest --dlcheck=llm,train,ckpt,smoke" in conftest
    run = project.run("--dlcheck=L11")
    run.fnmatch(["conftest.py::L11_eos_supervised FAILED*"])


def test_init_writes_a_plain_loop_conftest_with_todos_and_never_overwrites(project):
    write(
        project.pytester,
        {
            "train.py": """
                import torch
                from torch.utils.data import DataLoader, TensorDataset

                def get_loader(batch_size=8):
                    return DataLoader(TensorDataset(torch.randn(16, 4), torch.randint(0, 2, (16,))), batch_size=batch_size)

                def main():
                    model = torch.nn.Linear(4, 2)
                    opt = torch.optim.SGD(model.parameters(), lr=0.1)
                    for x, y in get_loader():
                        loss = torch.nn.functional.cross_entropy(model(x), y)
                        loss.backward()
                        opt.step()
                        opt.zero_grad()
            """
        },
    )
    init = project.run("--dlcheck-init")
    assert init.result.ret == 0
    written = (project.pytester.path / "conftest.py").read_text()
    init.fnmatch(["*for a plain PyTorch training loop: filled dlcheck_dataloader; TODO dlcheck_make_training*"])
    assert "from train import get_loader" in written
    assert "# TODO dlcheck_make_training:" in written
    assert "# def dlcheck_make_training():" in written
    compile(written, "conftest.py", "exec")

    again = project.run("--dlcheck-init")
    assert again.result.ret == pytest.ExitCode.USAGE_ERROR
    again.fnmatch(["dlcheck-init: *conftest.py exists: not overwritten*"])
    assert (project.pytester.path / "conftest.py").read_text() == written


def test_a_builder_usage_error_comes_before_any_heavy_import(pytester):
    write(pytester, {"mypkg/__init__.py": "", "mypkg/train.py": "import torch\n\ndef build_trainer():\n    pass\n"})
    run = subprocess.run(
        [sys.executable, "-X", "importtime", "-m", "pytest", "-p", "no:cacheprovider", "--dlcheck=llm"]
        + ["--dlcheck-trainer=mypkg.train:build_traner"],
        cwd=pytester.path,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert run.returncode == pytest.ExitCode.USAGE_ERROR, run.stdout + run.stderr
    assert "defines no 'build_traner' (did you mean build_trainer?)" in run.stderr
    imported = {line.rsplit("|", 1)[1].strip() for line in run.stderr.splitlines() if line.startswith("import time:")}
    assert not {"torch", "transformers", "mypkg.train", "pytest_dlcheck.plugin"} & imported


def test_the_entry_module_and_the_builders_name_the_same_options_and_roles():
    from pytest_dlcheck import builders, entry, registry
    from pytest_dlcheck.roles import ROLES

    assert set(entry._BUILDER_OPTIONS) == set(builders.NAMED)
    assert all(entry._BUILDER_OPTIONS[d][0] == builders.NAMED[d][0] for d in builders.NAMED)
    registry.load_checks()
    assert builders.role_names() == set(ROLES)
    assert {r for _, roles, _ in builders.NAMED.values() for r in roles} <= set(ROLES)


def test_a_builder_that_raises_is_one_error_naming_the_role(project):
    write(
        project.pytester,
        {"mypkg/__init__.py": "", "mypkg/train.py": "def build_trainer():\n    raise ValueError('no data at /d')\n"},
    )
    run = project.run("--dlcheck=L11,T1", "--dlcheck-trainer=mypkg.train:build_trainer")
    run.fnmatch(
        [
            "*the fixture raised ValueError: no data at /d (in build_trainer at*",
            "*role      dlcheck_trainer*",
            "*not run: fixture dlcheck_trainer raised ValueError (reported once*",
        ]
    )
    run.result.assert_outcomes(errors=1, skipped=1)


def test_a_run_that_does_not_reach_the_builders_file_says_where_the_checks_are(project):
    trainer_project(project.pytester, pad="tiny.PAD")
    project.pytester.makepyfile(**{"tests/test_user": "def test_one():\n    pass\n"})
    run = project.run("tests", "--dlcheck=L11", "--dlcheck-trainer=mypkg.train:build_trainer")
    run.result.assert_outcomes(passed=1)
    run.fnmatch(["dlcheck: the checks of --dlcheck-trainer mypkg.train:build_trainer are collected at *train.py*"])
    named = project.run("mypkg/train.py", "--dlcheck=L11", "--dlcheck-trainer=mypkg.train:build_trainer")
    named.fnmatch(["mypkg/train.py::L11_eos_supervised PASSED*"])


def test_init_writes_a_lightning_conftest_from_the_builder_function(project):
    write(
        project.pytester,
        {
            "proj/__init__.py": "",
            "proj/model.py": """
                import lightning.pytorch as pl

                class Net(pl.LightningModule):
                    def __init__(self, hidden):
                        super().__init__()

                class Data(pl.LightningDataModule):
                    pass

                def build_model(hidden=8):
                    return Net(hidden)
            """,
        },
    )
    init = project.run("--dlcheck-init")
    assert init.result.ret == 0
    init.fnmatch(["*for a Lightning module: filled dlcheck_lightning_module, dlcheck_datamodule; TODO none*"])
    written = (project.pytester.path / "conftest.py").read_text()
    assert "from proj.model import build_model" in written and "return build_model()" in written
    assert "from proj.model import Data" in written and "pytest --dlcheck=train,ckpt,smoke" in written


def test_a_role_named_by_an_option_and_by_a_conftest_is_a_collection_error(project):
    trainer_project(project.pytester, pad="tiny.PAD")
    project.conftest(SAME_AS_CONFTEST)
    run = project.run("--dlcheck=L11", "--dlcheck-trainer=mypkg.train:build_trainer")
    assert run.result.ret != 0
    run.fnmatch(
        [
            "*conftest.py: defines dlcheck_trainer, which --dlcheck-trainer mypkg.train:build_trainer names too: keep one*"
        ]
    )
    assert "PASSED" not in run.text


def test_a_missing_role_names_the_command_line_when_roles_come_from_it(project):
    # no conftest.py: "define fixture ... in conftest.py" alone sends the user to a file they do not have
    trainer_project(project.pytester, pad="tiny.PAD")
    # T8: the Trainer has no eval_dataset (D5 was the example before a Trainer's D5 said it is not recorded yet)
    run = project.run("--dlcheck=T8", "--dlcheck-trainer=mypkg.train:build_trainer", "-rs")
    run.assert_outcome("T8", "skipped")
    assert "in conftest.py, or name it on the command line (--dlcheck-role=NAME=module:callable)" in run.text
