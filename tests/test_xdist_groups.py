"""scripts/test runs the suite with ``-n 2 --dist loadgroup``: the tests of one ``xdist_group`` share one worker
(and the runs they share, made once per process), whatever the pytest version (tests/xdist_groups.py)."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

GROUPED = """
import time, pytest

pytestmark = pytest.mark.xdist_group("shared")


@pytest.mark.parametrize("i", range(4))
def test_grouped(i):
    time.sleep(0.3)  # long enough for the other worker to ask for more work meanwhile
"""

LOOSE = """
import time


def test_loose_1():
    time.sleep(0.3)


def test_loose_2():
    time.sleep(0.3)
"""


def test_a_group_runs_on_one_worker(pytester, monkeypatch):
    pytest.importorskip("xdist")
    pytester.makepyfile(test_grouped=GROUPED, test_loose=LOOSE)
    monkeypatch.setenv("PYTHONPATH", str(Path(__file__).parent))
    result = pytester.runpytest_subprocess(
        "-n", "2", "--dist", "loadgroup", "-v", "-p", "xdist_groups", "-p", "no:dlcheck", "-p", "no:cacheprovider"
    )
    result.assert_outcomes(passed=6)
    ran = re.findall(r"\[(gw\d)\] \[ *\d+%\] PASSED (\S+)", result.stdout.str())
    grouped = {worker for worker, nodeid in ran if "test_grouped" in nodeid}
    assert len(grouped) == 1, result.stdout.str()
    assert all(nodeid.endswith("@shared") for _, nodeid in ran if "test_grouped" in nodeid), result.stdout.str()
