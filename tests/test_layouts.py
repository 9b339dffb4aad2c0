"""The checks are collected beside each conftest.py that defines dlcheck_* fixtures, and see exactly the
fixtures the user's own tests there see. Run on the newest pytest by the suite and on 8.4 by CI
(scripts/oldest-pytest), whose fixture visibility works by nodeid strings, not collection nodes."""

TOKENIZER = """
    import pytest, tiny

    @pytest.fixture(scope="session")
    def dlcheck_tokenizer():
        return tiny.tokenizer(pad={pad})
"""

DATA = """
    import pytest, tiny
    from transformers import DataCollatorForLanguageModeling

    @pytest.fixture(scope="session")
    def dlcheck_collator(dlcheck_tokenizer):
        return DataCollatorForLanguageModeling(dlcheck_tokenizer, mlm=False)

    @pytest.fixture(scope="session")
    def dlcheck_dataset(dlcheck_tokenizer):
        return tiny.tokenized(dlcheck_tokenizer)
"""

USER_TEST = """
    def test_users_own(dlcheck_tokenizer):
        assert dlcheck_tokenizer.eos_token
"""


def test_root_conftest(project):
    project.conftest(TOKENIZER.format(pad="tiny.PAD") + DATA)
    project.pytester.makepyfile(test_user=USER_TEST)
    run = project.run("--dlcheck=L11")
    run.fnmatch(["conftest.py::L11_eos_supervised PASSED*", "test_user.py::test_users_own PASSED*"])


def test_tests_directory_conftest(project):
    project.conftest(TOKENIZER.format(pad="tiny.PAD") + DATA, path="tests/conftest.py")
    run = project.run("--dlcheck=L11")
    run.fnmatch(["tests/conftest.py::L11_eos_supervised PASSED*"])
    run.result.assert_outcomes(passed=1)


def test_nested_conftests_see_their_parents_fixtures(project):
    project.conftest(TOKENIZER.format(pad="tiny.PAD"))
    project.conftest(DATA, path="sub/conftest.py")
    run = project.run("--dlcheck=L11")
    # the root sees only the tokenizer: L11 skips naming the missing role; sub sees both and runs
    run.fnmatch(["conftest.py::L11_eos_supervised SKIPPED*", "sub/conftest.py::L11_eos_supervised PASSED*"])
    run.fnmatch(
        [
            "*missing role: define fixture dlcheck_dataloader (or dlcheck_collator + dlcheck_dataset, or dlcheck_trainer)*"
        ]
    )


def test_two_models_get_the_checks_once_each(project):
    project.conftest(TOKENIZER.format(pad="tiny.PAD") + DATA, path="clean/conftest.py")
    project.conftest(TOKENIZER.format(pad="tiny.EOS") + DATA, path="broken/conftest.py")
    run = project.run("--dlcheck=L11")
    run.fnmatch(["broken/conftest.py::L11_eos_supervised FAILED*", "clean/conftest.py::L11_eos_supervised PASSED*"])
    run.result.assert_outcomes(passed=1, failed=1)


def test_conftest_without_roles_collects_nothing(project):
    project.conftest("import pytest\n\n@pytest.fixture\ndef other():\n    return 1\n")
    project.pytester.makepyfile(test_user="def test_one():\n    pass\n")
    run = project.run("--dlcheck=llm")
    run.result.assert_outcomes(passed=1)
    assert "::L11" not in run.text


def test_builder_module_without_conftest(project):
    # roles named on the command line (no conftest.py): the checks are collected beside the
    # builder's own module file (claimed in pytest_collect_file, under the user's own package node)
    project.conftest("", path="mypkg/__init__.py")
    project.conftest(
        """
        import tiny

        def build_tokenizer():
            return tiny.tokenizer(pad=tiny.PAD)

        def build_dataset():
            return tiny.tokenized(build_tokenizer())

        def build_collator():
            from transformers import DataCollatorForLanguageModeling
            return DataCollatorForLanguageModeling(build_tokenizer(), mlm=False)
        """,
        path="mypkg/data.py",
    )
    project.pytester.makepyfile(test_user="def test_users_own():\n    pass\n")
    run = project.run(
        "--dlcheck=L11",
        "--dlcheck-role=tokenizer=mypkg.data:build_tokenizer()",
        "--dlcheck-role=dataset=mypkg.data:build_dataset()",
        "--dlcheck-role=collator=mypkg.data:build_collator()",
    )
    run.fnmatch(["mypkg/data.py::L11_eos_supervised PASSED*", "test_user.py::test_users_own PASSED*"])
    run.result.assert_outcomes(passed=2)
