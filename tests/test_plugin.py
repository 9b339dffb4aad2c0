"""The plugin core: activation, laziness, selection, ini/env settings, markers, the catalog, errors."""

import subprocess
import sys

import pytest

from pytest_dlcheck import registry

CLEAN = """
    import pytest, tiny
    from transformers import DataCollatorForLanguageModeling

    @pytest.fixture(scope="session")
    def dlcheck_tokenizer():
        return tiny.tokenizer()

    @pytest.fixture(scope="session")
    def dlcheck_collator(dlcheck_tokenizer):
        return DataCollatorForLanguageModeling(dlcheck_tokenizer, mlm=False)

    @pytest.fixture(scope="session")
    def dlcheck_dataset(dlcheck_tokenizer):
        return tiny.tokenized(dlcheck_tokenizer)
"""

# ---- laziness -------------------------------------------------------------------------------------


def test_importing_the_plugin_imports_no_torch_nor_transformers():
    code = (
        "import sys, pytest_dlcheck, pytest_dlcheck.plugin, pytest_dlcheck.registry, pytest_dlcheck.roles, "
        "pytest_dlcheck.fixtures, pytest_dlcheck.outcome, pytest_dlcheck.listing\n"
        "heavy = [m for m in ('torch', 'transformers', 'trl', 'torchvision', 'diffusers', 'numpy') if m in sys.modules]\n"
        "assert not heavy, heavy\n"
    )
    subprocess.run([sys.executable, "-c", code], check=True)


def test_installed_but_not_enabled_imports_nothing_heavy(pytester):
    pytester.makeconftest("import pytest\n\n@pytest.fixture\ndef dlcheck_model():\n    return None\n")
    pytester.makepyfile(
        test_lazy="""
        import sys

        def test_nothing_heavy_loaded():
            assert "torch" not in sys.modules and "transformers" not in sys.modules
        """
    )
    result = pytester.runpytest_subprocess("-p", "no:cacheprovider")
    result.assert_outcomes(passed=1)
    assert "dlcheck:" not in result.stdout.str()


def _pytest_importtime(cwd, *args: str) -> tuple[subprocess.CompletedProcess, set[str]]:
    """``python -X importtime -m pytest ARGS`` in a fresh interpreter: the run, and every module it imported."""
    run = subprocess.run(
        [sys.executable, "-X", "importtime", "-m", "pytest", "-p", "no:cacheprovider", *args],
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=300,
    )
    imported = {line.rsplit("|", 1)[1].strip() for line in run.stderr.splitlines() if line.startswith("import time:")}
    return run, imported - {"imported package"}


def test_a_run_without_dlcheck_imports_only_the_entry_module(pytester):
    """Installed but not enabled: the entry point's tiny module alone (the options and ini keys), none of the
    core (context, fixtures, report, html, outcome, roles, registry…). pytest loads an entry point through
    importlib, which -X importtime does not log: the run's own test reads sys.modules as well."""
    pytester.makeconftest("import pytest\n\n@pytest.fixture\ndef dlcheck_model():\n    return None\n")
    pytester.makepyfile(
        test_one="""
        import sys

        def test_one():
            ours = sorted(m for m in sys.modules if m.split(".")[0] == "pytest_dlcheck")
            assert ours == ["pytest_dlcheck", "pytest_dlcheck.entry"], ours
        """
    )
    run, imported = _pytest_importtime(pytester.path)
    assert run.returncode == 0, run.stdout + run.stderr
    assert not [m for m in imported if m.startswith("pytest_dlcheck.") and m != "pytest_dlcheck.entry"]
    assert not {"torch", "transformers", "numpy", "matplotlib"} & imported


@pytest.mark.parametrize(
    ("args", "said"),
    [
        (["--dlcheck=llmm"], "--dlcheck: unknown domain or check ID 'llmm' (did you mean llm?)"),
        (["--dlcheck=visoin,L11"], "--dlcheck: unknown domain or check ID 'visoin' (did you mean vision?)"),
        (["--dlcheck=L111"], "--dlcheck: unknown domain or check ID 'L111' (did you mean L11?)"),
        (["--dlcheck=llm", "--dlcheck-ignore=L999x"], "dlcheck ignore: unknown domain or check ID 'L999x'"),
        (["--dlcheck=L11", "--dlcheck-set=L111.max_missing_share=1"], "unknown check ID 'L111' (did you mean L11?)"),
        (
            ["--dlcheck=L11", "--dlcheck-set=L11.max_mising_share=1"],
            "L11 has no setting 'max_mising_share' (did you mean max_missing_share?) (settings: max_missing_share)",
        ),
        (["--dlcheck=L11", "--dlcheck-set=L11max_missing_share=1"], "expected ID.NAME=VALUE"),
        (["--dlcheck=L11", "-o", "dlcheck_samples=lots"], "ini dlcheck_samples = 'lots': expected a positive integer"),
        (
            ["--dlcheck=L11", "-o", "dlcheck_timeout=-1"],
            "ini dlcheck_timeout = '-1': expected a number of seconds >= 0",
        ),
    ],
)
def test_usage_errors_come_before_any_heavy_import(pytester, args, said):
    run, imported = _pytest_importtime(pytester.path, *args)
    assert run.returncode == pytest.ExitCode.USAGE_ERROR, run.stdout + run.stderr
    assert said in run.stderr, run.stderr
    heavy = [m for m in ("torch", "transformers", "numpy", "pytest_dlcheck.plugin") if m in imported]
    assert not heavy, heavy


def test_a_typo_names_where_the_selection_came_from(pytester, monkeypatch):
    monkeypatch.setenv("PYTEST_DLCHECK", "llmm")
    env = pytester.runpytest_inprocess("-p", "no:cacheprovider")
    assert env.ret == pytest.ExitCode.USAGE_ERROR
    env.stderr.fnmatch_lines(["*env PYTEST_DLCHECK: unknown domain or check ID 'llmm' (did you mean llm?)*"])
    monkeypatch.delenv("PYTEST_DLCHECK")
    pytester.makeini("[pytest]\ndlcheck = vison\n")
    ini = pytester.runpytest_inprocess("-p", "no:cacheprovider")
    ini.stderr.fnmatch_lines(["*ini dlcheck: unknown domain or check ID 'vison' (did you mean vision?)*"])
    listed = pytester.runpytest_inprocess("-p", "no:cacheprovider", "--dlcheck-list", "L11x")
    assert listed.ret == pytest.ExitCode.USAGE_ERROR
    listed.stdout.fnmatch_lines(["*--dlcheck-list: unknown domain or check ID 'L11x' (did you mean L11?)*"])


def test_the_entry_module_knows_the_registrys_domains_ids_and_settings():
    """The entry point judges the usage on the checks' source without importing them: what it reads there is
    the registry's catalog (IDs; setting names where a check writes them out, the rest judged once loaded)."""
    from pytest_dlcheck import entry, session

    assert entry.DOMAINS == registry.DOMAINS
    assert entry.DEFAULT_TIMEOUT == session.DEFAULT_TIMEOUT
    checks = registry.load_checks()
    static = entry._builtin_catalog()
    assert set(static) == set(checks)
    for cid, names in static.items():
        assert names is None or names == tuple(s.name for s in checks[cid].settings), cid
    assert sum(names is not None for names in static.values()) >= len(checks) - 10


def test_a_setting_only_the_loaded_registry_knows_is_still_checked(project):
    """S1's settings are not written out in its decorator: its typo is caught once the checks are loaded."""
    project.conftest(CLEAN)
    bad = project.pytester.runpytest_inprocess("--dlcheck=L11", "--dlcheck-set=S1.step=3")
    assert bad.ret == pytest.ExitCode.USAGE_ERROR
    bad.stderr.fnmatch_lines(["*S1 has no setting 'step' (did you mean steps?)*"])


def test_disabled_with_p_no(pytester):
    pytester.makepyfile(test_one="def test_one():\n    pass\n")
    result = pytester.runpytest_inprocess("-p", "no:dlcheck", "-p", "no:cacheprovider")
    result.assert_outcomes(passed=1)


def test_the_all_extra_is_everything_a_user_of_any_domain_needs():
    """``pip install "pytest-dlcheck[all]"``: every domain's libraries, Lightning and the report's figures."""
    import re
    from pathlib import Path

    tomllib = pytest.importorskip("tomllib")  # Python 3.11+

    extras = tomllib.loads((Path(__file__).parents[1] / "pyproject.toml").read_text())["project"][
        "optional-dependencies"
    ]

    def closure(name: str) -> set[str]:
        out = set()
        for req in extras[name]:
            inner = re.fullmatch(r"pytest-dlcheck\[(.*)\]", req)
            out |= set().union(*(closure(n.strip()) for n in inner.group(1).split(","))) if inner else {req}
        return out

    every_user_extra = set(extras) - {"all", "test"}
    assert every_user_extra >= {"llm", "vision", "diffusion", "rl", "lightning", "report"}
    assert closure("all") == set().union(*(closure(n) for n in every_user_extra))
    assert {"matplotlib>=3.7", "lightning>=2.2"} <= closure("all")


# ---- selection ------------------------------------------------------------------------------------


def test_exact_ids_and_domains():
    ids = lambda tokens, ignore=(): [c.id for c in registry.select(tokens, list(ignore))]  # noqa: E731
    assert ids(["L11"]) == ["L11"]
    assert ids(["l11"]) == ["L11"]
    assert "L11" in ids(["llm"]) and "L11" in ids(["all"])
    assert "L11" not in ids(["llm"], ["L11"])
    if "L1" in registry.load_checks():
        assert ids(["L1"]) == ["L1"]  # L1 must not select L10-L14
    with pytest.raises(ValueError, match="unknown domain or check ID 'L999'"):
        registry.select(["L999"], [])
    with pytest.raises(ValueError, match="unknown domain or check ID 'nope'"):
        registry.select(["llm"], ["nope"])


def test_split_tokens():
    assert registry.split_tokens("llm, train") == ["llm", "train"]
    assert registry.split_tokens(["V6 L13", "L2"]) == ["V6", "L13", "L2"]
    assert registry.split_tokens(None) == []


def test_unknown_selection_is_a_usage_error(project):
    project.conftest(CLEAN)
    result = project.pytester.runpytest_inprocess("--dlcheck=llm,L999", "-p", "no:cacheprovider")
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines(["*unknown domain or check ID 'L999'*"])


def test_ini_selection_ignore_and_header(project):
    project.conftest(CLEAN)
    project.pytester.makeini("[pytest]\ndlcheck = llm\ndlcheck_ignore = L11\n")
    run = project.run()
    assert "::L11" not in run.text
    run.fnmatch(["dlcheck: llm (from ini) -> * checks*"])


def test_env_selection(project, monkeypatch):
    project.conftest(CLEAN)
    monkeypatch.setenv("PYTEST_DLCHECK", "L11")
    run = project.run()
    run.fnmatch(["dlcheck: L11 (from env PYTEST_DLCHECK) -> 1 checks [[]L11[]]*"])
    run.assert_outcome("L11", "passed")


def test_command_line_ignore(project):
    project.conftest(CLEAN)
    run = project.run("--dlcheck=L11", "--dlcheck-ignore=L11")
    assert "::L11" not in run.text


def test_markers_and_keywords(project):
    project.conftest(CLEAN)
    project.pytester.makepyfile(test_user="def test_mine():\n    pass\n")
    only_checks = project.run("--dlcheck=L11", "-m", "dlcheck")
    only_checks.result.assert_outcomes(passed=1)
    assert "test_mine" not in only_checks.text
    no_checks = project.run("--dlcheck=L11", "-m", "not dlcheck")
    no_checks.result.assert_outcomes(passed=1)
    assert "::L11" not in no_checks.text
    by_domain = project.run("--dlcheck=L11", "-m", "dlcheck_llm")
    by_domain.assert_outcome("L11", "passed")
    by_k = project.run("--dlcheck=L11", "-k", "L11")
    by_k.result.assert_outcomes(passed=1)


# ---- settings -------------------------------------------------------------------------------------


def test_setting_overrides_are_validated(project):
    project.conftest(CLEAN)
    bad_name = project.pytester.runpytest_inprocess("--dlcheck=L11", "--dlcheck-set=L11.nope=1")
    assert bad_name.ret == pytest.ExitCode.USAGE_ERROR
    bad_name.stderr.fnmatch_lines(["*L11 has no setting 'nope' (settings: max_missing_share)*"])
    bad_value = project.pytester.runpytest_inprocess("--dlcheck=L11", "--dlcheck-set=L11.max_missing_share=lots")
    assert bad_value.ret == pytest.ExitCode.USAGE_ERROR
    bad_samples = project.pytester.runpytest_inprocess("--dlcheck=L11", "--dlcheck-samples=0")
    assert bad_samples.ret == pytest.ExitCode.USAGE_ERROR


def test_setting_override_changes_the_verdict(project):
    project.conftest(CLEAN.replace("tiny.tokenizer()", "tiny.tokenizer(pad=tiny.EOS)"))
    project.run("--dlcheck=L11").assert_outcome("L11", "failed")
    project.run("--dlcheck=L11", "--dlcheck-set=L11.max_missing_share=1.0").assert_outcome("L11", "passed")


# ---- the catalog ----------------------------------------------------------------------------------


def test_every_check_has_a_complete_doc():
    for check in registry.load_checks().values():
        assert check.summary, check.id
        missing = [s for s in registry.DOC_SECTIONS if not check.doc.get(s)]
        assert not missing, f"{check.id} doc lacks {missing}"
        for s in check.settings:
            assert s.help, f"{check.id}.{s.name} has no help"


def test_catalog_lists_every_check(pytester):
    result = pytester.runpytest_inprocess("--dlcheck-list")
    assert result.ret == 0
    lines = result.stdout.lines
    for check in registry.load_checks().values():
        assert any(
            line.split()[:2] == [check.id, check.domain] and check.title in line for line in lines if line.strip()
        ), check.id
    result.stdout.fnmatch_lines(["*dlcheck_trainer*", "Details of one check: pytest --dlcheck-list ID"])


def test_catalog_explains_one_check(pytester):
    result = pytester.runpytest_inprocess("--dlcheck-list", "L11")
    assert result.ret == 0
    result.stdout.fnmatch_lines(
        [
            "L11 end-of-sequence token is never supervised  [[]llm[]]",
            "What it does",
            "Why it is bad",
            "Example",
            "Use instead",
            "Known problems",
            "*L11.max_missing_share = 0.0",
        ]
    )
    bad = pytester.runpytest_inprocess("--dlcheck-list", "Z9")
    assert bad.ret == pytest.ExitCode.USAGE_ERROR


def test_help_shows_the_option_group(pytester):
    result = pytester.runpytest_inprocess("--help")
    result.stdout.fnmatch_lines(
        [
            "deep-learning pipeline checks (pytest-dlcheck):",
            "*--dlcheck=DOMAINS|IDS*",
            "*--dlcheck-ignore=IDS*",
            "*--dlcheck-list*",
            "*--dlcheck-samples=N*",
            "*--dlcheck-batch-size=N*",
            "*--dlcheck-set=ID.NAME=VALUE*",
            "*--dlcheck-json=PATH*",
            "*--dlcheck-report=PATH*",
        ]
    )


# ---- errors and skips -----------------------------------------------------------------------------


def test_missing_roles_skip_naming_the_fixture(project):
    project.conftest("import pytest\n\n@pytest.fixture\ndef dlcheck_model():\n    return object()\n")
    run = project.run("--dlcheck=L11")
    run.assert_outcome("L11", "skipped")
    run.fnmatch(
        [
            "*missing role: define fixture dlcheck_tokenizer (or dlcheck_trainer); dlcheck_dataloader (or *) in conftest.py*"
        ]
    )
    run.fnmatch(
        ["*dlcheck summary*", "llm *1 missing role", "skipped:   missing role: define fixture dlcheck_tokenizer*"]
    )


def test_short_skip_lines_name_the_check(project):
    """``-rs`` lines read ``conftest.py::<ID>_<name>: <reason>``: every check collected beside one conftest.py shares
    its location, so the line names the check item; two checks with the same reason get a line each; the reason
    (and the ``-v`` line) does not repeat the ID."""
    project.conftest("import pytest\n\n@pytest.fixture\ndef dlcheck_model():\n    return object()\n")
    run = project.run("--dlcheck=L2,L11")
    run.fnmatch(["SKIPPED [[]1[]] conftest.py::L2_labels_masked: missing role: define fixture dlcheck_tokenizer*"])
    run.fnmatch(["SKIPPED [[]1[]] conftest.py::L11_eos_supervised: missing role: define fixture dlcheck_tokenizer*"])
    assert "SKIPPED (L2 " not in run.text
    # the reports keep the reason itself
    run.fnmatch(["*dlcheck summary*", "skipped:   missing role: define fixture dlcheck_tokenizer* (2 checks)"])


def test_the_evidence_beside_passed_is_never_cut_inside_a_clause():
    from pytest_dlcheck.report import status_text

    short = "8 of 8 sampled documents end with a supervised stop token (<|endoftext|>)"
    assert status_text(short) == short
    long = (
        "padding: 0 of 8 sampled rows supervise any of their 48 padding positions (attention_mask 0, judged on "
        "the collated batch); source: dlcheck_collator on 8 examples of dlcheck_dataset, shuffled with seed 0"
    )
    shown = status_text(long)
    assert shown.endswith(" … (-rA)") and len(shown) <= 160
    kept = shown.removesuffix(" … (-rA)")
    assert long.startswith(kept) and long[len(kept)] in ";,:" or long[len(kept) :].startswith(" (")
    assert kept.count("(") == kept.count(")")  # never inside a parenthesis
    assert status_text("x" * 200) == "evidence: -rA"  # no clause to show: the pointer alone


def test_passed_lines_point_to_the_whole_evidence(project):
    project.conftest(CLEAN)
    run = project.run("--dlcheck=llm", "-rA")
    passed = [line for line in run.text.splitlines() if " PASSED (" in line]
    assert passed, run.text
    for line in passed:
        assert "…" not in line or "… (-rA))" in line, line
    run.fnmatch(["*-- dlcheck evidence --*", "8 of 8 sampled documents end with a supervised stop token*"])


def test_a_collator_that_raises_is_the_users_error(project):
    project.conftest(
        CLEAN
        + """
    @pytest.fixture(scope="session")
    def dlcheck_collator():
        def collate(examples):
            return {"input_ids": examples[0]["nope"]}
        return collate
    """
    )
    run = project.run("--dlcheck=L11")
    run.assert_outcome("L11", "failed")
    text = run.section("L11")
    assert "dlcheck_collator: raised KeyError: 'nope'" in text or "error     raised KeyError: 'nope'" in text
    assert "(in collate at conftest.py:" in text
    assert "pytest_dlcheck/" not in text


def test_a_batch_that_is_not_a_mapping_is_reported(project):
    project.conftest(
        CLEAN
        + """
    @pytest.fixture(scope="session")
    def dlcheck_collator():
        return lambda examples: [e["input_ids"] for e in examples]
    """
    )
    run = project.run("--dlcheck=L11")
    run.assert_outcome("L11", "failed")
    assert "returned a list, expected a mapping of batch fields" in run.section("L11")


def test_an_empty_dataset_skips(project):
    project.conftest(
        CLEAN
        + """
    @pytest.fixture(scope="session")
    def dlcheck_dataset():
        return []
    """
    )
    run = project.run("--dlcheck=L11")
    run.assert_outcome("L11", "skipped")
    run.fnmatch(["*dlcheck_dataset is empty*"])


def test_readme_documents_every_check_and_core_role():
    from pathlib import Path

    from pytest_dlcheck.roles import ROLES

    readme = (Path(__file__).parent.parent / "README.md").read_text()
    for check in registry.load_checks().values():
        assert f"| {check.id} |" in readme or f"`{check.id}`" in readme, f"README does not list {check.id}"
    for role in ROLES.values():
        assert f"`{role.fixture}`" in readme, f"README does not document {role.fixture}"


def test_a_test_file_that_fails_to_import_is_a_collection_error_not_a_crash_of_the_plugin(project):
    """A user's test module that raises at import gives pytest a CollectReport (no phase, no user properties): the
    plugin's status hook leaves it to pytest (it raised AttributeError: 'CollectReport' object has no attribute
    'user_properties', found blind beside a CleanRL project's probe folder)."""
    project.conftest("import pytest\n")
    project.pytester.makepyfile(test_broken="import os\nos.environ['NO_SUCH_KEY_FOR_DLCHECK']\n")
    run = project.run("--dlcheck=T1", "-v")
    assert "AttributeError" not in run.text and "user_properties" not in run.text, run.text
    assert "ERROR collecting test_broken.py" in run.text, run.text
    assert run.result.ret == 2, run.text
