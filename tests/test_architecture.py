"""The house: the import contracts of pyproject.toml hold, and break when a module crosses them; the
wheel built from the repository installs the checks inside the plugin's namespace and lists them all."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
BIN = Path(sys.executable).parent


def installed_layout(dest: Path) -> Path:
    """The package as it is installed (checks/ inside pytest_dlcheck/), where lint-imports reads it."""
    shutil.copytree(ROOT / "pytest_dlcheck", dest / "pytest_dlcheck", ignore=shutil.ignore_patterns("__pycache__"))
    shutil.copytree(ROOT / "checks", dest / "pytest_dlcheck" / "checks", ignore=shutil.ignore_patterns("__pycache__"))
    return dest


def lint_imports(tree: Path, *contracts: str) -> subprocess.CompletedProcess:
    only = [arg for cid in contracts for arg in ("--contract", cid)]
    return subprocess.run(
        [str(BIN / "lint-imports"), "--config", str(ROOT / "pyproject.toml"), "--no-cache", *only],
        cwd=tree,
        env={**os.environ, "PYTHONPATH": str(tree)},
        capture_output=True,
        text=True,
    )


def test_the_import_contracts_hold(tmp_path):
    result = lint_imports(installed_layout(tmp_path))
    assert result.returncode == 0, result.stdout + result.stderr
    assert "4 kept, 0 broken" in result.stdout


@pytest.mark.parametrize(
    ("module", "line", "contract"),
    [
        # a core module at the bottom reaching up to the hooks
        ("pytest_dlcheck/errors.py", "from .plugin import PROPERTY_SUFFIX", "core-layers"),
        ("pytest_dlcheck/sampling.py", "from .context import CheckContext", "core-layers"),
        ("pytest_dlcheck/roles.py", "from .checks.llm import common", "core-imports-no-check"),
        ("pytest_dlcheck/checks/llm/eos_supervised.py", "from ..vision import measure", "domains-independent"),
        ("pytest_dlcheck/training/loop.py", "from .trainer import TrainerSetup", "training-layers"),
    ],
)
def test_a_module_crossing_a_contract_breaks_it(tmp_path, module, line, contract):
    tree = installed_layout(tmp_path)
    target = tree / module
    target.write_text(target.read_text() + f"\n{line}  # a deliberate violation\n")
    result = lint_imports(tree, contract)
    assert result.returncode != 0, result.stdout
    assert "0 kept, 1 broken" in result.stdout, result.stdout
    assert line.split()[1].lstrip(".") in result.stdout  # the offending import is named


def test_the_wheel_installs_the_checks_inside_the_plugin_and_lists_them_all(tmp_path):
    src = tmp_path / "src"  # a copy: building writes build/ and *.egg-info beside the sources
    src.mkdir()
    for name in ("pyproject.toml", "README.md"):
        shutil.copy(ROOT / name, src / name)
    for name in ("pytest_dlcheck", "checks"):
        shutil.copytree(ROOT / name, src / name, ignore=shutil.ignore_patterns("__pycache__"))
    pip = [sys.executable, "-m", "pip", "--disable-pip-version-check", "-q"]
    subprocess.run(
        [*pip, "wheel", "--no-deps", "--no-build-isolation", "-w", str(tmp_path / "dist"), str(src)], check=True
    )
    (wheel,) = (tmp_path / "dist").glob("pytest_dlcheck-*.whl")
    names = zipfile.ZipFile(wheel).namelist()
    assert not [n for n in names if n.split("/")[0] in ("checks", "tests", "examples")], names
    assert "pytest_dlcheck/checks/llm/eos_supervised.py" in names
    assert "pytest_dlcheck/checks/shared/multimodal.py" in names
    assert "pytest_dlcheck/report.schema.json" in names
    # a fresh venv: the wheel installed into its own site-packages; the dependencies (pytest, torch…) seen
    # through a plain path line to the test venv's site-packages (a plain line runs none of that
    # directory's .pth files, so this checkout's editable install stays out of it)
    venv = tmp_path / "fresh"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True)
    python = venv / "bin" / "python"
    site = Path(
        subprocess.run(
            [str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
            capture_output=True,
            text=True,
            check=True,
        ).stdout.strip()
    )
    deps = subprocess.run(
        [sys.executable, "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout.strip()
    (site / "zz-test-dependencies.pth").write_text(deps + "\n")
    subprocess.run([*pip, "--python", str(python), "install", "--no-deps", str(wheel)], check=True)
    where = subprocess.run(
        [
            str(python),
            "-c",
            "import pytest_dlcheck.checks as c, pytest_dlcheck.registry as r; "
            "print(c.__path__[0]); print(len(r.load_checks()))",
        ],
        capture_output=True,
        text=True,
        check=True,
        cwd=tmp_path,
    ).stdout.split()
    assert where[0] == str(site / "pytest_dlcheck" / "checks")
    listed = subprocess.run(
        [str(python), "-m", "pytest", "--dlcheck-list", "-p", "no:cacheprovider"],
        capture_output=True,
        text=True,
        cwd=tmp_path,
    )
    assert listed.returncode == 0, listed.stdout + listed.stderr
    ids = [m.group(1) for m in re.finditer(r"^([A-Z]+\d+)\s", listed.stdout, re.M)]
    assert len(ids) == int(where[1]) >= 59, listed.stdout
