"""Role fixtures are found as pytest registers them: under the attribute a fixture is bound to, under an
explicit ``name=``, and in the modules a conftest.py names in ``pytest_plugins``. A ``dlcheck_*``
fixture that is no role is a collection error naming the closest role; ``--dlcheck`` that finds no role
anywhere says so instead of exiting green in silence."""

import textwrap


def _write(pytester, files):
    for name, text in files.items():
        (pytester.path / name).write_text(textwrap.dedent(text))


def test_a_fixture_bound_to_a_role_name_is_a_role(project):
    project.conftest(
        """
        import pytest, tiny

        def build_tokenizer():
            return tiny.tokenizer()

        def build_model(dlcheck_tokenizer):
            return tiny.llama(dlcheck_tokenizer)

        dlcheck_tokenizer = pytest.fixture(build_tokenizer, scope="session")
        dlcheck_model = pytest.fixture(build_model, scope="session")
        """
    )
    run = project.run("--dlcheck=L3")
    run.assert_outcome("L3", "passed")


def test_a_fixture_with_an_explicit_role_name_is_a_role(project):
    project.conftest(
        """
        import pytest, tiny

        @pytest.fixture(scope="session", name="dlcheck_tokenizer")
        def my_tokenizer():
            return tiny.tokenizer()

        @pytest.fixture(scope="session", name="dlcheck_model")
        def my_model(dlcheck_tokenizer):
            return tiny.llama(dlcheck_tokenizer)
        """
    )
    run = project.run("--dlcheck=L3")
    run.assert_outcome("L3", "passed")


def test_roles_from_a_pytest_plugins_module_are_collected_beside_its_conftest(project, pytester):
    _write(
        pytester,
        {
            "dlcheck_roles_plugin.py": """
            import pytest, tiny

            @pytest.fixture(scope="session")
            def dlcheck_tokenizer():
                return tiny.tokenizer()

            @pytest.fixture(scope="session")
            def dlcheck_model(dlcheck_tokenizer):
                return tiny.llama(dlcheck_tokenizer)
            """,
        },
    )
    pytester.syspathinsert()
    project.conftest('pytest_plugins = ["dlcheck_roles_plugin"]\n')
    run = project.run("--dlcheck=L3")
    run.assert_outcome("L3", "passed")
    assert "conftest.py::L3_special_tokens" in run.text


def test_an_unknown_dlcheck_fixture_names_the_closest_role(project):
    project.conftest(
        """
        import pytest

        @pytest.fixture(scope="session")
        def dlcheck_train_dataset():
            return [{"input_ids": [1, 2, 3]}]
        """
    )
    run = project.run("--dlcheck=llm")
    assert run.result.ret != 0
    run.fnmatch(["*dlcheck_train_dataset (did you mean dlcheck_*dataset?): no pytest-dlcheck role of that name*"])
    assert "Traceback" not in run.text


def test_no_role_anywhere_is_said_after_collection_and_in_the_summary(project, pytester):
    pytester.makepyfile(test_own="def test_own():\n    assert True\n")
    run = project.run("--dlcheck=llm")
    assert run.result.ret == 0
    run.fnmatch(["dlcheck: no check collected: no conftest.py defines dlcheck_* fixtures*", "*1 passed*"])
    run.fnmatch(["*dlcheck summary*", "no check ran: no conftest.py defines dlcheck_* fixtures*"])
