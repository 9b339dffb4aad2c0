"""The project's own test set-up: hermetic, offline, one thread; heavy libraries imported once here so
that the in-process pytest runs of throwaway user projects (pytester) reuse them."""

from __future__ import annotations

import re
import textwrap

import pytest
import tiny  # noqa: F401  (sets the offline environment first)
import torch

torch.set_num_threads(1)
# pytester's in-process runs restore sys.modules afterwards: a library first imported inside one of them
# would be dropped and half re-imported by the next (transformers' lazy modules break that way), so the
# heavy libraries are imported here, once, before any in-process run.
import datasets  # noqa: E402,F401
import hypothesis.internal.observability  # noqa: E402,F401  (imported by hypothesis' plugin at summary time)
import hypothesis.strategies._internal.flatmapped  # noqa: E402,F401
import torch._dynamo  # noqa: E402,F401  (torch.manual_seed imports it lazily; a re-import inside a run crashes)

# torch.compile imports its caches on first use: a second import inside another in-process run registers them
# twice ("Artifact of type=autotune already registered")
torch.compile(torch.nn.Linear(1, 1), backend="eager")
import transformers  # noqa: E402,F401
from tokenizers import processors  # noqa: E402,F401
from transformers import (  # noqa: E402,F401
    AutoModelForCausalLM,
    AutoProcessor,
    AutoTokenizer,
    DataCollatorForLanguageModeling,
    DataCollatorWithFlattening,
    DataCollatorWithPadding,
    GPT2Config,
    GPT2LMHeadModel,
    LlamaConfig,
    LlamaForCausalLM,
    PreTrainedTokenizerFast,
    Trainer,
    TrainingArguments,
)

# the plugin's own modules too: one re-imported inside a run would bring a second MISSING sentinel and
# lose the derivers its domains registered
import pytest_dlcheck.context  # noqa: E402,F401
import pytest_dlcheck.fixtures  # noqa: E402,F401
import pytest_dlcheck.html  # noqa: E402,F401
import pytest_dlcheck.property  # noqa: E402,F401
import pytest_dlcheck.strategies  # noqa: E402,F401
from pytest_dlcheck import registry  # noqa: E402

registry.load_checks()
from trl import DPOConfig, DPOTrainer, GRPOConfig, GRPOTrainer, RLOOConfig, RLOOTrainer, SFTConfig, SFTTrainer  # noqa: E402,F401
from xdist_groups import pytest_collection_modifyitems  # noqa: E402,F401  (xdist_group marks under pytest 9)

OUTCOME_RE = re.compile(r"::([A-Z]+\d+)_\w+(\[property\])? (PASSED|FAILED|SKIPPED|ERROR|XFAIL)")


class Project:
    """A throwaway user project: a conftest.py with dlcheck_* fixtures, run through pytest in-process."""

    def __init__(self, pytester: pytest.Pytester):
        self.pytester = pytester

    def conftest(self, source: str, path: str = "conftest.py") -> None:
        target = self.pytester.path / path
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_text(textwrap.dedent(source))

    def run(self, *args: str) -> Run:
        result = self.pytester.runpytest_inprocess("-p", "no:cacheprovider", "-v", "-rs", *args)
        return Run(result)


class Run:
    def __init__(self, result: pytest.RunResult):
        self.result = result
        self.text = result.stdout.str()
        self.outcomes: dict[str, list[str]] = {}
        for cid, mode, outcome in OUTCOME_RE.findall(self.text):
            # "L11" for the sampled item, "L11[property]" for its property-mode twin
            self.outcomes.setdefault(cid + mode, []).append(outcome.lower())

    def outcome(self, cid: str) -> str:
        found = self.outcomes.get(cid)
        assert found, f"{cid} did not run:\n{self.text}"
        assert len(set(found)) == 1, f"{cid} has several outcomes {found}:\n{self.text}"
        return found[0]

    def assert_outcome(self, cid: str, expected: str) -> None:
        assert self.outcome(cid) == expected, f"{cid}: expected {expected}, got {self.outcome(cid)}\n{self.text}"

    def section(self, cid: str) -> str:
        """The failure text of one check (from its header line to the next pytest separator)."""
        m = re.search(rf"^{cid} .*?(?=^_{{3,}}|^={{3,}})", self.text, re.S | re.M)
        assert m, f"no failure section for {cid}:\n{self.text}"
        return m.group(0)

    def fnmatch(self, lines: list[str]) -> None:
        self.result.stdout.fnmatch_lines(lines)


@pytest.fixture
def project(pytester: pytest.Pytester) -> Project:
    return Project(pytester)


# the real-code corpus: user projects (each a conftest.py with dlcheck_* fixtures), run by
# tests/reliability/test_rel_realcode.py with --dlcheck=all, not collected as this suite's own conftests
collect_ignore = ["realcode/projects"]
