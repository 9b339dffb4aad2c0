"""examples/train: `pytest --dlcheck=train,ckpt,smoke examples/train` passes the clean projects and fails
the broken ones with exactly the failures their conftest.py promises."""

import shutil
from pathlib import Path

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "train"

PROMISED = {
    "clean": set(),
    "clean_trainer": set(),
    "broken": {"T3", "T6", "T8", "C1", "C2"},
    "broken_trainer": {"T6", "T8", "C1"},
}


def test_train_example(project):
    shutil.copytree(EXAMPLE, project.pytester.path, dirs_exist_ok=True)
    run = project.run("--dlcheck=train,ckpt,smoke")
    failed: dict[str, set[str]] = {name: set() for name in PROMISED}
    for line in run.text.splitlines():
        head, _, rest = line.partition("/conftest.py::")
        if rest and ("FAILED" in rest or "ERROR" in rest):
            failed[head.strip()].add(rest.split("_", 1)[0])
    assert failed == PROMISED, run.text
    assert "INTERNALERROR" not in run.text
