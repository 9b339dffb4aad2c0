"""The example projects a newcomer runs first: the clean configuration passes its domain, the broken one
fails with the failures its conftest.py promises."""

import shutil
from pathlib import Path

import pytest

EXAMPLES = Path(__file__).parent.parent / "examples"

# domain -> IDs the broken project must fail
BROKEN = {
    "llm": {"L2", "L11"},
    "vision": {"V1", "V2", "V3", "V7"},
}  # diffusion: tests/diffusion/test_df_example_project.py


@pytest.mark.parametrize("domain", sorted(BROKEN))
def test_example_project(project, domain):
    shutil.copytree(EXAMPLES / domain, project.pytester.path, dirs_exist_ok=True)
    run = project.run(f"--dlcheck={domain}", "-p", "no:cacheprovider")
    failed = {cid for cid, outs in run.outcomes.items() if "failed" in outs}
    assert failed == BROKEN[domain], run.text
    for line in run.text.splitlines():
        if line.startswith("clean/conftest.py::"):
            assert "FAILED" not in line and "ERROR" not in line, run.text
    for cid in BROKEN[domain]:
        section = run.section(cid)
        assert "evidence" in section and "cause" in section and "fix" in section
