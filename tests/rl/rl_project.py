"""Several user configurations in one throwaway project: one directory (and conftest.py) per
configuration, one in-process pytest run for all of them (each run costs seconds of start-up), outcomes
and failure sections read per directory."""

from __future__ import annotations

import re
import textwrap

from helpers import flat

ITEM_RE = re.compile(r"^(\S+)/conftest\.py::([A-Z]+\d+)_\w+ (PASSED|FAILED|SKIPPED|ERROR)", re.M)
HEADER_RE = re.compile(r"^_+ ([A-Z]+\d+) .*? _+$", re.M)  # long titles leave only 2 underscores
SKIP_RE = re.compile(r"^SKIPPED \[\d+\] (\S+)/conftest\.py(?::\d+|::\w+): (.*)$", re.M)


class MultiRun:
    def __init__(self, run):
        self.run = run
        self.text = run.text
        self.outcomes = {(d, cid): o.lower() for d, cid, o in ITEM_RE.findall(self.text)}
        failed = [(d, cid) for d, cid, o in ITEM_RE.findall(self.text) if o == "FAILED"]
        heads = list(HEADER_RE.finditer(self.text))
        self.sections = {}
        for (d, cid), head in zip(failed, heads):
            assert head.group(1) == cid, self.text
            end = re.compile(r"^(_+ [A-Z]+\d+ |={3,})", re.M).search(self.text, head.end())
            self.sections[(d, cid)] = self.text[head.end() : end.start() if end else None]
        self.skips: dict[str, str] = {}  # directory -> its skip reasons, joined
        for d, reason in SKIP_RE.findall(self.text):
            self.skips[d] = self.skips.get(d, "") + reason + "\n"

    def outcome(self, d: str, cid: str) -> str:
        assert (d, cid) in self.outcomes, f"{d}: {cid} did not run:\n{self.text}"
        return self.outcomes[(d, cid)]

    def assert_outcome(self, d: str, cid: str, expected: str) -> None:
        assert self.outcome(d, cid) == expected, (
            f"{d}: {cid} expected {expected}, got {self.outcome(d, cid)}\n{self.text}"
        )

    def section(self, d: str, cid: str) -> str:
        assert (d, cid) in self.sections, f"{d}: no failure section for {cid}:\n{self.text}"
        return self.sections[(d, cid)]

    def passed(self, d: str, cid: str) -> str:
        """The first line of what a passing check measured, as ``-v`` shows it beside PASSED (its first 69
        characters, then "…")."""
        self.assert_outcome(d, cid, "passed")
        m = re.search(rf"^{re.escape(d)}/conftest\.py::{cid}_\w+ PASSED \((.*)\)(?:\s+\[\s*\d+%\])?$", self.text, re.M)
        assert m, f"{d}: {cid} passed without evidence:\n{self.text}"
        return m.group(1)

    def flat(self, d: str, cid: str) -> str:
        """The failure section with its line wrapping undone (whitespace runs become one space)."""
        return flat(self.section(d, cid))


def run_configs(project, configs: dict[str, str], *args: str) -> MultiRun:
    """Write ``configs`` (directory name -> conftest.py source) and run pytest once over all of them."""
    for d, source in configs.items():
        project.conftest(textwrap.dedent(source), path=f"{d}/conftest.py")
    return MultiRun(project.run(*args))
