"""examples/diffusion: the clean project passes the domain, the broken one fails DF2, DF3, DF4 and DF5."""

import shutil
from pathlib import Path

import tinydiff  # noqa: F401  (keeps the diffusion modules imported across in-process runs)

EXAMPLE = Path(__file__).parents[2] / "examples" / "diffusion"


def test_example_project(project):
    shutil.copytree(EXAMPLE, project.pytester.path, dirs_exist_ok=True)
    run = project.run("--dlcheck=diffusion")
    failed = {cid for cid, outs in run.outcomes.items() if "failed" in outs}
    assert failed == {"DF2", "DF3", "DF4", "DF5"}, run.text
    for line in run.text.splitlines():
        if line.startswith("clean/conftest.py::"):
            assert "FAILED" not in line and "ERROR" not in line, run.text
    assert (
        "vae.config.scaling_factor = 0.18215 (Stable Diffusion 1.x's value, calibrated for its VAE) is never applied"
        in tinydiff.flat(run.section("DF3"))
    )
    assert "prediction_type: training DDPMScheduler 'v_prediction', inference DDIMScheduler 'epsilon'" in tinydiff.flat(
        run.section("DF4")
    )
    assert "0 of 1296 embedding rows from 300 calls of dlcheck_condition were null" in tinydiff.flat(run.section("DF5"))
    assert "with the raw trained weights" in tinydiff.flat(run.section("DF2"))
