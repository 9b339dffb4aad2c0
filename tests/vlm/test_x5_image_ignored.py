"""X5: the logits move when the image is replaced."""

import tinyvlm
import torch
import torchvision.models  # noqa: F401  (imported once, outside the in-process runs)
from helpers import flat

from pytest_dlcheck.checks.vlm import measure as vlm

PROJECT = """
    import pytest, torch, tinyvlm

    @pytest.fixture(scope="session")
    def dlcheck_tokenizer():
        return tinyvlm.processor()

    @pytest.fixture(scope="session")
    def dlcheck_model(dlcheck_tokenizer):
        model = tinyvlm.llava(dlcheck_tokenizer.tokenizer)
        {change}
        return model

    @pytest.fixture(scope="session")
    def dlcheck_dataset():
        return tinyvlm.rows(8)

    @pytest.fixture(scope="session")
    def dlcheck_collator(dlcheck_tokenizer):
        return {collator}
"""

ZEROED = "[torch.nn.init.zeros_(p) for p in model.model.multi_modal_projector.parameters()]"


def test_zeroed_projector_ignores_the_image(project):
    project.conftest(PROJECT.format(change=ZEROED, collator="tinyvlm.collator(dlcheck_tokenizer)"))
    run = project.run("--dlcheck=X2,X5")
    run.assert_outcome("X5", "failed")
    text = flat(run.section("X5"))
    assert (
        "the logits at 154 text positions after the image move by 0 with another example's image; 0 with noise "
        "(mean ‖Δ logits‖ / ‖logits‖; at least 0.01 expected)"
    ) in text
    assert "example 0: '<image>×16what is 2+2? The answer is 4.'" in text
    assert "the projector outputs zeros for every image" in text
    assert "strict=True" in text
    # the root cause shows in X2 too
    run.assert_outcome("X2", "failed")
    assert "the projector's output is zero next to the text" in flat(run.section("X2"))


def test_projector_with_zero_weights_but_a_bias_ignores_the_image(project):
    change = (
        "proj = model.model.multi_modal_projector; torch.nn.init.zeros_(proj.linear_2.weight); "
        "torch.nn.init.constant_(proj.linear_2.bias, 0.05)"
    )
    project.conftest(PROJECT.format(change=change, collator="tinyvlm.collator(dlcheck_tokenizer)"))
    run = project.run("--dlcheck=X5")
    run.assert_outcome("X5", "failed")
    assert "the projector's output is the same for every image" in flat(run.section("X5"))


DROPS_PIXELS = """(lambda collate: lambda rows: {k: v for k, v in collate(rows).items() if k != "pixel_values"})(
            tinyvlm.collator(dlcheck_tokenizer))"""


def test_collator_that_drops_pixel_values(project):
    project.conftest(PROJECT.format(change="", collator=DROPS_PIXELS))
    run = project.run("--dlcheck=X5")
    run.assert_outcome("X5", "failed")
    text = flat(run.section("X5"))
    assert (
        "2 of 2 sampled batches carry 64 <image> placeholders but no pixel_values (batch keys: attention_mask, input_ids, labels)"
        in text
    )
    assert "embeds <image> as an ordinary token" in text
    assert "remove_unused_columns=False" in text


def test_randomly_initialised_model_looks_at_the_image(project):
    project.conftest(PROJECT.format(change="", collator="tinyvlm.collator(dlcheck_tokenizer)"))
    run = project.run("--dlcheck=X5", "-rA")
    run.assert_outcome("X5", "passed")
    run.fnmatch(
        [
            "*::X5_image_ignored PASSED (the logits at * text positions after the image move by*",
            "*dlcheck evidence*",
            "the logits at * text positions after the image move by 0.* with another example's image; 0.* with noise "
            "(mean ‖Δ logits‖ / ‖logits‖; at least 0.01 expected)",
            "2 sampled batch(es) from dlcheck_collator on 8 examples of dlcheck_dataset, each run as is, with each "
            "example's image replaced by another example's, and by noise of the same per-channel statistics",
        ]
    )


def test_a_vision_classifier_is_not_applicable(project):
    """A torchvision ResNet with an image dataloader under --dlcheck=vlm: no language model, no image tokens."""
    project.conftest("""
        import pytest, torch
        from torch.utils.data import DataLoader, TensorDataset
        from torchvision.models import resnet18

        @pytest.fixture(scope="session")
        def dlcheck_model():
            return resnet18(weights=None, num_classes=4)

        @pytest.fixture(scope="session")
        def dlcheck_dataloader():
            g = torch.Generator().manual_seed(0)
            data = TensorDataset(torch.randn(16, 3, 32, 32, generator=g), torch.randint(0, 4, (16,), generator=g))
            return DataLoader(data, batch_size=4)
    """)
    run = project.run("--dlcheck=vlm")
    for cid in ("X1", "X2", "X3", "X4", "X5"):
        run.assert_outcome(cid, "skipped")
    assert "missing role" not in run.text, run.text
    run.fnmatch(
        [
            "n/a:*not applicable: dlcheck_model is a torchvision ResNet, an image model without a language model "
            "(5 checks)"
        ]
    )


def test_threshold_separates_random_from_zeroed_models():
    """The measurement behind min_change's default: random tiny Llavas move ~1, zeroed projectors 0."""
    proc = tinyvlm.processor()
    batch = tinyvlm.collator(proc)(tinyvlm.rows(4))
    positions = vlm.text_after_image(batch, proc.image_token_id)
    moved = []
    for seed in (0, 1):
        model = tinyvlm.llava(proc.tokenizer, seed=seed)
        for zero in (False, True):
            if zero:
                with torch.no_grad():
                    for p in model.model.multi_modal_projector.parameters():
                        p.zero_()
            base = vlm.run_forward(model, batch).logits
            other = vlm.run_forward(model, batch, pixel_values=batch["pixel_values"].roll(1, 0)).logits
            moved.append((zero, float(vlm.relative_change(base, other, positions).mean())))
    assert all(m > 0.5 for zero, m in moved if not zero), moved
    assert all(m == 0 for zero, m in moved if zero), moved


RESCALED_TWICE = """
    import numpy as np, pytest, tinyvlm

    @pytest.fixture(scope="session")
    def dlcheck_tokenizer():
        return tinyvlm.processor()

    @pytest.fixture(scope="session")
    def dlcheck_model(dlcheck_tokenizer):
        return tinyvlm.llava(dlcheck_tokenizer.tokenizer)

    @pytest.fixture(scope="session")
    def dlcheck_dataset():
        rows = tinyvlm.rows(8)
        for r in rows:  # "normalised" to [0, 1] while loading; the processor divides by 255 again
            r["images"] = [np.asarray(im, dtype=np.float32) / 255.0 for im in r["images"]]
        return rows

    @pytest.fixture(scope="session")
    def dlcheck_collator(dlcheck_tokenizer):
        return tinyvlm.collator(dlcheck_tokenizer)
"""


def test_images_rescaled_twice_are_constant(project):
    project.conftest(RESCALED_TWICE)
    run = project.run("--dlcheck=X5")
    run.assert_outcome("X5", "failed")
    text = flat(run.section("X5"))
    assert "the images are (nearly) constant: the largest per-image std of pixel_values is" in text
    assert "your images are constant" in text and "do_rescale=False" in text
    assert "the image path is cut" not in text
