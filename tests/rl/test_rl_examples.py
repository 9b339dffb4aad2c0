"""examples/rl: the clean configuration passes, the broken one fails R4 and R7 with full reports."""

import shutil
from pathlib import Path

import tiny_rl  # noqa: F401  (gymnasium, SB3 imported once, before the in-process runs)
from rl_project import MultiRun

EXAMPLE = Path(__file__).parents[2] / "examples" / "rl"


def test_rl_example_project(project):
    shutil.copytree(EXAMPLE, project.pytester.path, dirs_exist_ok=True)
    run = MultiRun(project.run("--dlcheck=rl"))
    failed = {(d, cid) for (d, cid), o in run.outcomes.items() if o in ("failed", "error")}
    assert failed == {("broken", "R4"), ("broken", "R7")}, run.text
    for cid in ("R3", "R4", "R7", "R8"):
        run.assert_outcome("clean", cid, "passed")
    assert "obs_rms.count: 130 before the save, 0.0001 after the load" in run.flat("broken", "R4")
    assert "done = terminated or truncated used for bootstrapping" in run.flat("broken", "R7")
