"""The vision checks on projects they do not concern say so ("not applicable"), and never ask for a
fixture that would not make them run: an RL training learns from an environment and has no image dataset."""

import gymnasium  # noqa: F401  (imported once, outside the in-process runs)
import tiny_vision  # noqa: F401  (torchvision, timm and the plugin's roles imported once, outside the runs)


def test_an_rl_training_is_not_asked_for_image_data(project):
    """A gymnasium CartPole env factory, as CleanRL users hand it over: no vision or vlm check asks for a
    dataloader, a model or towers."""
    project.conftest("""
        import gymnasium, pytest

        @pytest.fixture(scope="session")
        def dlcheck_env():
            return lambda: gymnasium.make("CartPole-v1")
    """)
    run = project.run("--dlcheck=vision,vlm")
    for cid in ("V1", "V2", "V3", "V4", "V5", "V6", "V7", "V8", "X1", "X2", "X3", "X4", "X5"):
        run.assert_outcome(cid, "skipped")
    assert "missing role" not in run.text, run.text
    run.fnmatch(
        [
            "n/a:*not applicable: an RL training (dlcheck_env is a function): it learns from an environment, with no "
            "image dataset or dataloader for the vision checks to read (8 checks)",
            "n/a:*not applicable: dlcheck_env is a function: an RL training, with no vision-language model (5 checks)",
        ]
    )
