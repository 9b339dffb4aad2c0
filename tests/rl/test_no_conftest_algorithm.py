"""An SB3 algorithm handed over on the command line (``--dlcheck-algorithm=MODULE:ATTR``), no conftest.py: the
rl checks are collected beside the builder's module file and judge the algorithm it builds."""

import textwrap

import tiny_rl  # noqa: F401  (stable-baselines3 imported once, before the in-process run)


def test_an_algorithm_builder_without_conftest(project):
    (project.pytester.path / "agent.py").write_text(
        textwrap.dedent(
            """
            import tiny_rl

            def build_ppo():
                return tiny_rl.sb3_ppo()
            """
        )
    )
    run = project.run("--dlcheck=R3", "--dlcheck-algorithm=agent:build_ppo")
    run.fnmatch(["agent.py::R3_advantage_whitening PASSED*"])
