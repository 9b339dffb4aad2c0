"""The CI recipe of docs/ci/dlcheck.yml: its pytest command line, exactly as written there, run on the llm example
project (with --dlcheck-twin): exit code 0 on the clean configuration, 1 on the broken one, and the JUnit XML,
the HTML report and the JSON written where the workflow's later steps pick them up."""

import json
import shlex
import shutil
import subprocess
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest

ROOT = Path(__file__).parent.parent
WORKFLOW = ROOT / "docs" / "ci" / "dlcheck.yml"
EXAMPLE = ROOT / "examples" / "llm"


def workflow_steps() -> list[dict]:
    try:
        import yaml
    except ImportError:  # pragma: no cover - PyYAML is in the test environment
        pytest.skip("PyYAML is not installed")
    workflow = yaml.safe_load(WORKFLOW.read_text())
    triggers = workflow.get("on", workflow.get(True))  # YAML 1.1 reads the key `on` as true
    assert "pull_request" in triggers
    (job,) = workflow["jobs"].values()
    assert job["runs-on"] == "ubuntu-latest"
    return job["steps"]


def pytest_line() -> list[str]:
    lines = [
        line.strip()
        for step in workflow_steps()
        for line in step.get("run", "").splitlines()
        if line.strip().startswith("pytest ")
    ]
    assert len(lines) == 1, lines
    return shlex.split(lines[0])


def test_the_workflow_installs_cpu_torch_with_the_pip_cache_and_uploads_the_report_always():
    steps = workflow_steps()
    setup = next(s for s in steps if s.get("uses", "").startswith("actions/setup-python@"))
    assert setup["with"]["cache"] == "pip"
    install = "\n".join(s.get("run", "") for s in steps)
    assert "--index-url https://download.pytorch.org/whl/cpu" in install
    assert 'pip install "pytest-dlcheck[all]"' in install
    # torch is installed from the CPU index before the plugin, so the plugin's torch requirement is already met
    assert install.index("download.pytorch.org/whl/cpu") < install.index("pytest-dlcheck[all]")
    upload = next(s for s in steps if s.get("uses", "").startswith("actions/upload-artifact@"))
    assert upload["if"] == "always()"
    assert {"dlcheck-report.html", "dlcheck.json"} <= set(upload["with"]["path"].split())
    junit = next(s for s in steps if "report_paths" in s.get("with", {}))
    assert junit["if"] == "always()" and junit["with"]["report_paths"] == "dlcheck-junit.xml"
    assert junit["continue-on-error"] is True  # publishing the view (not allowed on a fork's PR) never gates
    # the pytest step itself has no `if:`/`continue-on-error`: its exit code fails the job, which gates the merge
    step = next(s for s in steps if "pytest --dlcheck" in s.get("run", ""))
    assert "if" not in step and not step.get("continue-on-error", False)
    args = pytest_line()
    assert args[0] == "pytest" and "--dlcheck-twin" in args
    assert {
        "--junitxml=dlcheck-junit.xml",
        "--dlcheck-report=dlcheck-report.html",
        "--dlcheck-json=dlcheck.json",
    } <= set(args)


def test_every_run_block_is_valid_shell():
    for step in workflow_steps():
        if "run" in step:
            check = subprocess.run(["bash", "-n"], input=step["run"], text=True, capture_output=True)
            assert check.returncode == 0, (step.get("name"), check.stderr)


@pytest.mark.parametrize(("variant", "exit_code", "failed"), [("clean", 0, set()), ("broken", 1, {"L2", "L11"})])
def test_the_recipe_command_line_gates_on_the_example(pytester, variant, exit_code, failed):
    for name in ("pytest.ini", "tinyllm.py"):
        shutil.copy(EXAMPLE / name, pytester.path / name)
    shutil.copy(EXAMPLE / variant / "conftest.py", pytester.path / "conftest.py")
    args = pytest_line()
    result = pytester.runpytest_inprocess(*args[1:])
    assert result.ret == exit_code, result.stdout.str()

    suite = ET.parse(pytester.path / "dlcheck-junit.xml").getroot()
    cases = list(suite.iter("testcase"))
    failures = {case.get("name").split("_")[0] for case in cases if case.find("failure") is not None}
    assert failures == failed
    judged = [case for case in cases if case.find("failure") is None and case.find("skipped") is None]
    assert judged, "the CI's test view shows passes too"
    for case in suite.iter("testcase"):
        if case.find("failure") is not None:  # the CI's test view shows the house format, not a traceback
            text = case.find("failure").text
            assert "evidence" in text and "cause" in text and "fix" in text
    assert "<html" in (pytester.path / "dlcheck-report.html").read_text().lower()
    report = json.loads((pytester.path / "dlcheck.json").read_text())
    assert report["summary"]["failed"] == len(failed) and report["summary"]["passed"] == len(judged)
