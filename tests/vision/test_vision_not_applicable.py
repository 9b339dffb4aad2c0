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


def test_a_trainer_whose_processing_class_is_an_image_processor_is_no_language_model(project):
    """transformers' run_mae, found blind: a Trainer of an image model with its ViTImageProcessor as processing_class.
    L15 took the processor for a tokenizer and failed with "your role raised" (len() of an image processor); the
    llm domain is not applicable, decided from the batches, as for image batches without a Trainer."""
    project.conftest("""
        import pytest, tiny_vision as tv
        from torchvision import transforms as T1

        PROCESSOR = tv.ViTImageProcessor(image_mean=[0.5] * 3, image_std=[0.5] * 3)

        @pytest.fixture(scope="session")
        def dlcheck_trainer(tmp_path_factory):
            tf = T1.Compose([T1.ToTensor(), T1.Normalize(PROCESSOR.image_mean, PROCESSOR.image_std)])
            train = tv.with_pixel_values(tv.hf_images([i % 2 for i in range(16)]), tf)
            out = tmp_path_factory.mktemp("out")
            return tv.image_trainer(tv.tiny_vit(2), train, out, processing_class=PROCESSOR)
    """)
    run = project.run("--dlcheck=llm", "-rs")
    for cid in [f"L{i}" for i in range(1, 16)]:
        run.assert_outcome(cid, "skipped")
    text = " ".join(run.text.split())
    assert "your role raised" not in text and "error" not in run.outcomes.values(), text
    assert "not applicable: the Trainer's processing_class is a ViTImageProcessor, no text tokenizer" in text
    assert "missing role" not in text, text
