"""pytest citizenship: the check items behave like any other test under the options users rely on —
--collect-only, -k, -m, --lf, --junitxml, -p no:dlcheck — next to the user's own tests and fixtures,
including fixtures of the same scope and name as the plugin's defaults. (-n 2: test_rel_flake_xdist.)"""

from __future__ import annotations

import xml.etree.ElementTree as ET

import pytest
import tiny  # noqa: F401
from rel_nonet import NoNetwork

CONFTEST = r"""
import pathlib, pytest, tiny
from transformers import DataCollatorForLanguageModeling

@pytest.fixture(scope="session")
def dlcheck_tokenizer():
    (pathlib.Path(__file__).parent / "built.txt").write_text("the user's objects were built")
    return tiny.tokenizer(pad=tiny.EOS)              # pad == eos: L11 fails

@pytest.fixture                                      # function scope, like the plugin's own default
def dlcheck_collator(dlcheck_tokenizer):
    return DataCollatorForLanguageModeling(dlcheck_tokenizer, mlm=False)

@pytest.fixture
def dlcheck_dataset(dlcheck_tokenizer):
    return tiny.tokenized(dlcheck_tokenizer)

@pytest.fixture(autouse=True)
def user_autouse(request):
    with open(pathlib.Path(__file__).parent / "calls.txt", "a") as f:
        f.write(request.node.name + "\n")
    yield

def pytest_configure(config):
    config.addinivalue_line("markers", "slow: the user's own marker")
"""

USER_TEST = """
import pytest

def test_users_own_test(dlcheck_tokenizer):
    assert dlcheck_tokenizer.pad_token == dlcheck_tokenizer.eos_token

@pytest.mark.slow
def test_users_slow_test():
    pass
"""

SELECT = "--dlcheck=L3,L11,L14"


@pytest.fixture
def user_project(pytester):
    pytester.makeconftest(CONFTEST)
    pytester.makepyfile(test_user=USER_TEST)
    return pytester


def run(pytester, *args):
    return pytester.runpytest_inprocess(*args, plugins=[NoNetwork()])


def outcomes(result) -> dict[str, str]:
    out = {}
    for rep in result.reprec.getreports("pytest_runtest_logreport"):
        name = rep.nodeid.rsplit("::", 1)[-1]
        if rep.when == "call" or rep.outcome != "passed":
            out[name] = rep.outcome
    return out


def test_collect_only_builds_nothing(user_project):
    result = run(user_project, "-p", "no:cacheprovider", SELECT, "--collect-only", "-q")
    assert result.ret == 0, result.stdout.str()
    result.stdout.fnmatch_lines(
        [
            "conftest.py::L3_special_tokens",
            "conftest.py::L11_eos_supervised",
            "conftest.py::L14_attention_mask",
            "test_user.py::test_users_own_test",
            "*5 tests*",
        ]
    )
    assert not (user_project.path / "built.txt").exists(), "collecting built the user's objects"


def test_k_and_m_select_check_items(user_project):
    assert outcomes(run(user_project, "-p", "no:cacheprovider", SELECT, "-k", "L11")) == {
        "L11_eos_supervised": "failed"
    }
    assert outcomes(run(user_project, "-p", "no:cacheprovider", SELECT, "-k", "L14 or users_own")) == {
        "L14_attention_mask": "passed",
        "test_users_own_test": "passed",
    }
    checks = outcomes(run(user_project, "-p", "no:cacheprovider", SELECT, "-m", "dlcheck"))
    assert set(checks) == {"L3_special_tokens", "L11_eos_supervised", "L14_attention_mask"}
    assert set(outcomes(run(user_project, "-p", "no:cacheprovider", SELECT, "-m", "dlcheck_llm"))) == set(checks)
    assert set(outcomes(run(user_project, "-p", "no:cacheprovider", SELECT, "-m", "not dlcheck and not slow"))) == {
        "test_users_own_test"
    }


def test_last_failed_reruns_the_failed_check(user_project):
    first = outcomes(run(user_project, SELECT))
    assert first["L11_eos_supervised"] == "failed" and first["test_users_own_test"] == "passed"
    again = run(user_project, SELECT, "--lf")
    assert outcomes(again) == {"L11_eos_supervised": "failed"}, again.stdout.str()
    again.stdout.fnmatch_lines(["*run-last-failure*"])


def test_junitxml_carries_the_house_format(user_project):
    run(user_project, "-p", "no:cacheprovider", SELECT, "--junitxml=junit.xml")
    cases = {c.get("name"): c for c in ET.parse(user_project.path / "junit.xml").getroot().iter("testcase")}
    assert set(cases) == {
        "L3_special_tokens",
        "L11_eos_supervised",
        "L14_attention_mask",
        "test_users_own_test",
        "test_users_slow_test",
    }
    failure = cases["L11_eos_supervised"].find("failure")
    assert failure is not None and failure.get("message", "").startswith("L11")
    for row in ("evidence", "cause", "fix", "see       pytest --dlcheck-list L11"):
        assert row in failure.text, failure.text
    assert "Traceback" not in failure.text and "pytest_dlcheck/" not in failure.text


def test_user_fixtures_of_the_plugins_scope_and_name_win_and_run_beside_the_checks(user_project):
    result = run(user_project, "-p", "no:cacheprovider", SELECT, "-p", "no:randomly")
    got = outcomes(result)
    assert got["L11_eos_supervised"] == "failed" and got["test_users_own_test"] == "passed", result.stdout.str()
    text = result.stdout.str()
    # the user's function-scoped dlcheck_collator (pad == eos) is the one L11 judged
    assert "<|endoftext|>" in text and "-100" in text
    calls = set((user_project.path / "calls.txt").read_text().split())
    assert {"L3_special_tokens", "L11_eos_supervised", "L14_attention_mask", "test_users_own_test"} <= calls


def test_p_no_dlcheck_turns_the_plugin_off(user_project):
    user_project.makeini("[pytest]\ndlcheck = llm\n")
    off = run(user_project, "-p", "no:cacheprovider", "-p", "no:dlcheck")
    assert off.ret == 0, off.stdout.str()
    assert set(outcomes(off)) == {"test_users_own_test", "test_users_slow_test"}
    on = run(user_project, "-p", "no:cacheprovider")  # the ini turns it on when the plugin is loaded
    assert "L11_eos_supervised" in outcomes(on)
    usage = run(user_project, "-p", "no:cacheprovider", "-p", "no:dlcheck", "--dlcheck=llm")
    assert usage.ret == pytest.ExitCode.USAGE_ERROR
