"""Bad input never crashes a session: Hypothesis generates hostile role fixtures (None, wrong types,
empty/endless/broken datasets and dataloaders, NaN/Inf, missing keys, ragged lists, wrong dtypes, meta
tensors, fixtures and callables that raise or never return), each replacing one role of a valid tiny
project of its domain, and every check that can meet that role runs on it. Every outcome must be a pass,
a skip, or a failure in the house format — a check's evidence, or the error of the role that is wrong
(or of what was derived from or fed by it) — never an INTERNALERROR, never a traceback into plugin
internals, never a hang. A pass on a value no check can use (an int, an empty loader, a meta model...) by a
check that read it is no clean outcome: it judged nothing and named nothing. The user's object that raises
on any input, handed an input a check made up, is reported as pytest-dlcheck's internal error naming it."""

from __future__ import annotations

import contextlib
import faulthandler
import math
import os
import re
import textwrap
from dataclasses import replace
from pathlib import Path

import pytest
import rel_hostile as H
from hypothesis import HealthCheck, Phase, given, settings
from hypothesis import strategies as st
from rel_nonet import NoNetwork
from rel_tracker import check_id

from pytest_dlcheck import registry
from pytest_dlcheck.errors import MISSING
from pytest_dlcheck.outcome import Rendered
from pytest_dlcheck.session import CONTEXT_KEY

CHECKS = registry.load_checks()
CASES = [H.Case(d, r, k) for (d, r), kinds in H.KINDS.items() for k in kinds]
FIELDS = ("input_ids", "labels", "attention_mask", "pixel_values", "0", "1")


def params(case: H.Case) -> st.SearchStrategy:
    """Where the hostile value breaks: at batch/example k, at element `at`, which field, which
    non-finite value, which dtype. Rotated so that Hypothesis' simplest draw is not the trivial one."""
    return st.fixed_dictionaries(
        {
            "k": st.integers(0, 3).map(lambda k: (k + 1) % 4),
            "at": st.integers(0, 63).map(lambda a: (a + 5) % 64),
            "cut": st.integers(1, 3),
            "field": st.sampled_from(FIELDS),
            "value": st.sampled_from([math.inf, math.nan, -math.inf]),
            "dtype": st.sampled_from(["float16", "float32", "int8", "bool"]),
        }
    ).map(lambda d: tuple(sorted(d.items())))


def conftest(case: H.Case) -> str:
    out = [f"import pytest, rel_hostile as H\nfrom math import inf, nan\nCASE = H.{case!r}\n"]
    for role in H.roles_for(case.domain, case.role):
        # a fixture that asks for a fixture nobody defines (a typo in the user's conftest)
        needs = "no_such_fixture" if role == case.role and case.kind == "needs_missing" else ""
        out.append(
            textwrap.dedent(f"""
            @pytest.fixture(scope="session")
            def dlcheck_{role}({needs}):
                return H.value(CASE, {role!r})
            """)
        )
    return "".join(out)


class Verdicts:
    """Keeps, per directory, the checks that can meet its hostile role, and judges every report."""

    def __init__(self, cases: dict[str, H.Case]):
        self.cases = cases
        self.problems: list[str] = []
        self.outcomes: dict[str, str] = {}
        #: per item, the roles its check resolved to an object (given or derived)
        self.resolved: dict[str, set[str]] = {}

    def case_of(self, nodeid: str) -> H.Case | None:
        return self.cases.get(nodeid.split("/conftest.py")[0].rsplit("/", 1)[-1])

    def pytest_collection_modifyitems(self, items, config):
        keep, drop = [], []
        for item in items:
            case = self.case_of(item.nodeid)
            (keep if case and check_id(item.nodeid) in H.selected(CHECKS, case) else drop).append(item)
        items[:] = keep
        config.hook.pytest_deselected(items=drop)

    @pytest.hookimpl(wrapper=True)
    def pytest_runtest_call(self, item):
        try:
            return (yield)
        finally:
            roles = getattr(item.stash.get(CONTEXT_KEY, None), "_roles", {})
            self.resolved[item.nodeid] = {n for n, v in roles.items() if v is not MISSING and v is not None}

    def pytest_runtest_logreport(self, report):
        case = self.case_of(report.nodeid)
        if case is None:
            return
        where = f"{report.nodeid} ({case.kind} dlcheck_{case.role}, {report.when})"
        if report.passed and report.when == "call":
            # a value no check can use, read by the check (the role resolved to it): a pass did not judge it, and
            # the check said nothing of the role being unusable
            if case.kind in H.UNUSABLE and case.role in self.resolved.get(report.nodeid, set()):
                evidence = dict(report.sections).get("dlcheck evidence", "(no evidence)")
                self.problems.append(f"{where}: passed on {case.kind} dlcheck_{case.role}, which it read:\n{evidence}")
        if report.passed and report.when == "call" or report.skipped:
            self.outcomes.setdefault(report.nodeid, report.outcome)
            return
        if not report.failed:
            return
        self.outcomes[report.nodeid] = "failed"
        text = str(report.longrepr)
        if "pytest-dlcheck internal error" in text:
            # the user's object that raises on any input, handed an input the check made up: the plugin's error
            # (it cannot know the pipeline's own inputs would fail too), naming the object and the input
            made_up = re.search(
                r"\(dlcheck_(\w+) raised it on .+?, not on your pipeline's own data\)", " ".join(text.split())
            )
            if not (made_up and case.kind in H.RAISING and made_up.group(1) in H.related(case.role)):
                self.problems.append(f"{where}: internal error:\n{text[-3000:]}")
            return
        if not isinstance(report.longrepr, Rendered):
            self.problems.append(f"{where}: not in the house format:\n{text[-3000:]}")
            return
        for line in text.splitlines():
            if line.strip().startswith("role ") and "dlcheck_" in line:
                named = line.split("dlcheck_", 1)[1].split()[0].rstrip(":")
                if named not in H.related(case.role):
                    self.problems.append(f"{where}: names dlcheck_{named}, not dlcheck_{case.role}:\n{text}")


@contextlib.contextmanager
def watchdog(seconds: float):
    """A hang the plugin failed to bound kills this test run with every thread's stack, not CI's time."""
    faulthandler.dump_traceback_later(seconds, exit=True)
    try:
        yield
    finally:
        faulthandler.cancel_dump_traceback_later()


def run_cases(pytester: pytest.Pytester, cases: list[H.Case], folder: str, *args: str) -> Verdicts:
    """One in-process run per domain (its checks collected only beside its own cases)."""
    verdicts = Verdicts({c.name: c for c in cases})
    for domain in sorted({c.domain for c in cases}):
        root = pytester.path / folder / domain
        for case in (c for c in cases if c.domain == domain):
            (root / case.name).mkdir(parents=True)
            (root / case.name / "conftest.py").write_text(conftest(case))
        selection = [a for a in args if a.startswith("--dlcheck=")] or [
            f"--dlcheck={','.join(H.DOMAINS.get(domain, (domain,)))}"
        ]
        with watchdog(300):
            result = pytester.runpytest_inprocess(
                "-p",
                "no:cacheprovider",
                *selection,
                *(a for a in args if not a.startswith("--dlcheck=")),
                *os.environ.get("DLCHECK_HOSTILE_ARGS", "").split(),
                str(root),
                plugins=[verdicts, NoNetwork()],
            )
        text = result.stdout.str()
        assert "INTERNALERROR" not in text, text[-5000:]
        assert result.ret in (0, 1, 5), text[-5000:]
    seen = {n.split("/conftest.py")[0].rsplit("/", 1)[-1] for n in verdicts.outcomes}
    verdicts.problems += [f"{name}: no check ran" for name in sorted({c.name for c in cases} - seen)]
    return verdicts


def generated_cases(examples: int = 2) -> list[list[H.Case]]:
    """Hypothesis draws where each hostile value breaks (deterministic: derandomised, no database).
    The checks run outside Hypothesis' own test loop: some of them (R7, property mode) run Hypothesis
    themselves, and Hypothesis tests do not nest. Each example covers half of the role/kind cases, so
    one test run meets every case once, half of them with non-trivial parameters."""
    drawn: list[list[H.Case]] = []

    @settings(
        max_examples=examples,
        derandomize=True,
        database=None,
        deadline=None,
        phases=(Phase.generate,),
        suppress_health_check=list(HealthCheck),
    )
    @given(data=st.data())
    def draw(data):
        half = len(drawn) % 2
        drawn.append([replace(c, params=data.draw(params(c), label=c.name)) for c in CASES[half::2]])

    draw()
    return drawn


#: a check that read a value no check can use (the role resolved to an int, a dict, a swapped object, a
#: callable that raises or returns nonsense, an empty or all-None loader, a meta model) and passed, saying nothing
#: of the role: found when passes on broken input stopped counting as clean (issue 30), not fixed yet
PASS_ON_UNUSABLE = "passes on the unusable role without naming it"

#: cases whose unclean outcome is a known gap: reported (DLCHECK_HOSTILE_REPORT), not failed here; a case that
#: becomes clean must leave the list (checked at the default two draws, from which the list was read)
KNOWN_OPEN: dict[tuple[str, str, str, str], str] = {
    ("diffusion", "condition", "meta", "DF5"): PASS_ON_UNUSABLE,
    ("diffusion", "noise_scheduler", "dict", "DF6"): PASS_ON_UNUSABLE,
    ("diffusion", "noise_scheduler", "int", "DF6"): PASS_ON_UNUSABLE,
    ("diffusion", "noise_scheduler", "object", "DF6"): PASS_ON_UNUSABLE,
    ("diffusion", "noise_scheduler", "str", "DF6"): PASS_ON_UNUSABLE,
    ("diffusion", "training_inputs", "dict", "DF4"): PASS_ON_UNUSABLE,
    ("diffusion", "training_inputs", "dict", "DF5"): PASS_ON_UNUSABLE,
    ("diffusion", "training_inputs", "int", "DF4"): PASS_ON_UNUSABLE,
    ("diffusion", "training_inputs", "int", "DF5"): PASS_ON_UNUSABLE,
    ("diffusion", "training_inputs", "meta", "DF4"): PASS_ON_UNUSABLE,
    ("diffusion", "training_inputs", "meta", "DF5"): PASS_ON_UNUSABLE,
    ("diffusion", "training_inputs", "object", "DF4"): PASS_ON_UNUSABLE,
    ("diffusion", "training_inputs", "object", "DF5"): PASS_ON_UNUSABLE,
    ("diffusion", "training_inputs", "raises_call", "DF4"): PASS_ON_UNUSABLE,
    ("diffusion", "training_inputs", "raises_call", "DF5"): PASS_ON_UNUSABLE,
    ("diffusion", "training_inputs", "returns_none", "DF4"): PASS_ON_UNUSABLE,
    ("diffusion", "training_inputs", "returns_none", "DF5"): PASS_ON_UNUSABLE,
    ("diffusion", "training_inputs", "returns_str", "DF4"): PASS_ON_UNUSABLE,
    ("diffusion", "training_inputs", "returns_str", "DF5"): PASS_ON_UNUSABLE,
    ("diffusion", "training_inputs", "str", "DF4"): PASS_ON_UNUSABLE,
    ("diffusion", "training_inputs", "str", "DF5"): PASS_ON_UNUSABLE,
    ("llm", "dataloader", "empty", "L3"): PASS_ON_UNUSABLE,
    ("llm", "dataloader", "empty_list", "L3"): PASS_ON_UNUSABLE,
    ("llm", "dataloader", "none_batches", "L3"): PASS_ON_UNUSABLE,
    ("llm", "dataset", "empty", "L3"): PASS_ON_UNUSABLE,
    ("llm", "model", "meta", "L11"): PASS_ON_UNUSABLE,
    ("llm", "model", "meta", "L3"): PASS_ON_UNUSABLE,
    ("llm", "model", "meta", "L5"): PASS_ON_UNUSABLE,
    ("llm", "model", "raises_forward", "L11"): PASS_ON_UNUSABLE,
    ("llm", "model", "swapped", "L11"): PASS_ON_UNUSABLE,
    ("llm", "raw_dataset", "empty", "L12"): PASS_ON_UNUSABLE,
    ("llm", "raw_dataset", "empty", "L13"): PASS_ON_UNUSABLE,
    ("llm", "raw_dataset", "empty", "L2"): PASS_ON_UNUSABLE,
    ("llm", "tokenizer", "swapped", "L1"): PASS_ON_UNUSABLE,
    ("llm", "tokenizer", "swapped", "L13"): PASS_ON_UNUSABLE,
    ("llm", "tokenizer", "swapped", "L14"): PASS_ON_UNUSABLE,
    ("llm", "tokenizer", "swapped", "L2"): PASS_ON_UNUSABLE,
    ("llm", "tokenizer", "swapped", "L5"): PASS_ON_UNUSABLE,
    ("llm", "trainer", "dict", "L1"): PASS_ON_UNUSABLE,
    ("llm", "trainer", "dict", "L13"): PASS_ON_UNUSABLE,
    ("llm", "trainer", "dict", "L5"): PASS_ON_UNUSABLE,
    ("llm", "trainer", "object", "L1"): PASS_ON_UNUSABLE,
    ("llm", "trainer", "object", "L13"): PASS_ON_UNUSABLE,
    ("llm", "trainer", "object", "L5"): PASS_ON_UNUSABLE,
    ("llm", "training_args", "dict", "L13"): PASS_ON_UNUSABLE,
    ("llm", "training_args", "dict", "L5"): PASS_ON_UNUSABLE,
    ("llm", "training_args", "object", "L13"): PASS_ON_UNUSABLE,
    ("llm", "training_args", "object", "L5"): PASS_ON_UNUSABLE,
    ("rl", "env", "int", "R7"): PASS_ON_UNUSABLE,
    ("rl", "env", "str", "R7"): PASS_ON_UNUSABLE,
    ("train", "dataloader", "empty", "T8"): PASS_ON_UNUSABLE,
    ("train", "dataloader", "none_batches", "T8"): PASS_ON_UNUSABLE,
    ("train", "dataloader", "strings", "T8"): PASS_ON_UNUSABLE,
    ("train", "make_training", "dict", "T7"): PASS_ON_UNUSABLE,
    ("train", "make_training", "int", "T7"): PASS_ON_UNUSABLE,
    ("train", "make_training", "raises_call", "T7"): PASS_ON_UNUSABLE,
    ("train", "make_training", "returns_none", "T7"): PASS_ON_UNUSABLE,
    ("train", "make_training", "returns_str", "T7"): PASS_ON_UNUSABLE,
    ("vision", "dataloader", "empty", "V1"): PASS_ON_UNUSABLE,
    ("vision", "dataloader", "empty_list", "V1"): PASS_ON_UNUSABLE,
    ("vision", "dataloader", "none_batches", "V1"): PASS_ON_UNUSABLE,
    ("vision", "eval_dataloader", "empty", "V1"): PASS_ON_UNUSABLE,
    ("vision", "eval_fn", "returns_none", "V2"): PASS_ON_UNUSABLE,
    ("vision", "eval_fn", "returns_str", "V2"): PASS_ON_UNUSABLE,
    ("vision", "model", "meta", "V1"): PASS_ON_UNUSABLE,
    ("vision", "model", "meta", "V3"): PASS_ON_UNUSABLE,
    ("vision", "model", "meta", "V7"): PASS_ON_UNUSABLE,
    ("vision", "model", "raises_forward", "V1"): PASS_ON_UNUSABLE,
    # V2's model-mode half reads the model's modules (no dropout, no BatchNorm with running statistics: model.eval()
    # changes nothing) without running its forward, which raises: true of the modules, silent on the forward
    ("vision", "model", "raises_forward", "V2"): PASS_ON_UNUSABLE,
}


def _open_key(problem: str) -> tuple | None:
    for key in KNOWN_OPEN:
        domain, role, kind, cid = key
        if f"{domain}__{role}__{kind}/conftest.py::{cid}_" in problem:
            return key
    return None


def test_hostile_roles_fail_cleanly(pytester):
    problems: list[str] = []
    for i, cases in enumerate(generated_cases(int(os.environ.get("DLCHECK_HOSTILE_EXAMPLES", 2)))):
        # DF5's 300 draws are about its statistics, not about bad input: 40 keep it cheap over ~100 cases
        verdicts = run_cases(pytester, cases, f"run{i}", "--dlcheck-timeout=60", "--dlcheck-set=DF5.draws=40")
        problems += verdicts.problems
    unexpected = [p for p in problems if _open_key(p) is None]
    still_open = {_open_key(p) for p in problems} - {None}
    closed = sorted(set(KNOWN_OPEN) - still_open)
    report = "\n\n".join(problems)
    if os.environ.get("DLCHECK_HOSTILE_REPORT"):
        Path(os.environ["DLCHECK_HOSTILE_REPORT"]).write_text(report)
    assert not unexpected, f"{len(unexpected)} unclean outcomes:\n\n" + "\n\n".join(unexpected)
    if int(os.environ.get("DLCHECK_HOSTILE_EXAMPLES", 2)) == 2:  # the draws KNOWN_OPEN was read from
        assert not closed, f"clean now, take them out of KNOWN_OPEN: {closed}"


def test_formerly_open_cases(pytester):
    """Cases once listed in KNOWN_OPEN, kept as regressions: a non-numeric advantage_fn output (R7), a
    save function that writes nothing (C1 names dlcheck_save_checkpoint, not the load)."""
    cases = [H.Case("rl", "advantage_fn", "returns_str"), H.Case("train", "save_checkpoint", "returns_str")]
    verdicts = run_cases(pytester, cases, "open", "--dlcheck-timeout=60")
    assert not verdicts.problems, "\n\n".join(verdicts.problems)


HANGS = [
    H.Case("llm", "collator", "hang"),
    H.Case("llm", "dataloader", "hang"),
    H.Case("vision", "eval_fn", "hang"),
    H.Case("diffusion", "condition", "hang"),
]


def test_a_role_that_never_returns_is_stopped_and_named(pytester):
    verdicts = run_cases(pytester, HANGS, "hangs", "--dlcheck-timeout=1", "--dlcheck=L14,V2,DF5")
    assert not verdicts.problems, "\n\n".join(verdicts.problems)


def test_a_shared_factory_keeps_each_projects_roles(pytester):
    """Two projects that share the factory and the loader (a common module) but not their checkpoint save:
    each is judged with its own."""
    shared = """
import pytest, rel_hostile as H

@pytest.fixture(scope="session")
def dlcheck_make_training():
    return H.base("train")["make_training"]

@pytest.fixture(scope="session")
def dlcheck_dataloader():
    return H.base("train")["dataloader"]

@pytest.fixture(scope="session")
def dlcheck_load_checkpoint():
    return H.base("train")["load_checkpoint"]

@pytest.fixture(scope="session")
def dlcheck_loss_fn():
    return H.base("train")["loss_fn"]
"""
    (pytester.path / "a").mkdir()
    (pytester.path / "a" / "conftest.py").write_text(
        shared
        + """
@pytest.fixture(scope="session")
def dlcheck_save_checkpoint():
    return H.base("train")["save_checkpoint"]
"""
    )
    (pytester.path / "b").mkdir()
    (pytester.path / "b" / "conftest.py").write_text(
        shared
        + """
@pytest.fixture(scope="session")
def dlcheck_save_checkpoint():
    def save(state, path):
        raise RuntimeError("disk full")
    return save
"""
    )
    result = pytester.runpytest_inprocess(
        "-p", "no:cacheprovider", "--dlcheck=C1", "-p", "no:randomly", "-rA", plugins=[NoNetwork()]
    )
    text = result.stdout.str()
    assert "disk full" in text, "project b's own dlcheck_save_checkpoint never ran:\n" + text[-3000:]
    # the short summary line of a pass carries its evidence: "PASSED (4 steps, …) a/conftest.py::C1_resume"
    assert re.search(r"^PASSED .*a/conftest.py::C1_resume$", text, re.M), text[-3000:]
