"""V1 reads the range a diffusion training's images belong in from the pipeline's own image processor
(``pipeline.image_processor.config.do_normalize``), not from the kind of pipeline: aMUSEd's pipeline keeps images in
[0, 1] (do_normalize=False, its VQ-GAN encodes [0, 1]), so train_amused.py's ToTensor() images pass and a
Normalize([0.5], [0.5]) added to them fails; a Stable Diffusion pipeline (do_normalize=True) fed [0, 1] images still
fails. (blind set 12: V1 asked bl12_amused for Normalize([0.5], [0.5]), which would have broken its training.)"""

import tinyamused
import tinydiff
import torchvision.tv_tensors  # noqa: F401  (V1 reads tv_tensors: imported once, outside the in-process runs)

AMUSED = (
    "dlcheck_pipeline is a diffusers AmusedPipeline (its image_processor, a VaeImageProcessor, has do_normalize=False)"
)
SD = "dlcheck_pipeline is a diffusers StableDiffusionPipeline (its image_processor, a VaeImageProcessor, has do_normalize=True)"


def test_amused_images_in_0_1_pass_as_its_image_processor_says(project):
    project.conftest(tinyamused.conftest())
    run = project.run("--dlcheck=V1", "-rA")
    run.assert_outcome("V1", "passed")
    text = tinydiff.flat(run.text)
    assert (
        f"within [0, 1] (± 0.05), the range its autoencoder encodes: {AMUSED}, so the pipeline hands it [0, 1]" in text
    )
    assert "Normalize([0.5], [0.5])" not in text


def test_amused_images_normalised_to_minus_1_1_fail(project):
    """The fix V1 used to propose, applied: the VQ-GAN now encodes images outside the range it was trained on."""
    project.conftest(tinyamused.conftest(pixels="[-1, 1]"))
    run = project.run("--dlcheck=V1")
    run.assert_outcome("V1", "failed")
    text = tinydiff.flat(run.section("V1"))
    assert f"outside [0, 1] (± 0.05); {AMUSED}: its autoencoder works on images in [0, 1]" in text
    assert "the images are normalised (to [-1, 1]) but this pipeline's autoencoder encodes [0, 1] images" in text
    assert "remove the Normalize: feed ToDtype(torch.float32, scale=True) (ToTensor()) images in [0, 1]" in text


SD_0_1 = """
@pytest.fixture(scope="session")
def dlcheck_dataset(sd):
    return [{**e, "pixel_values": (e["pixel_values"] + 1) / 2} for e in sd.dataset]  # Normalize([0.5], [0.5]) left out
"""


def test_stable_diffusion_fed_0_1_images_still_fails(project):
    project.conftest(tinydiff.conftest(roles=("pipeline", "collator")) + SD_0_1)
    run = project.run("--dlcheck=V1")
    run.assert_outcome("V1", "failed")
    text = tinydiff.flat(run.section("V1"))
    assert "the pixels lie in [0, 1] (" in text
    assert f"); {SD}, which works on images in [-1, 1]" in text
    assert "append T.Normalize([0.5], [0.5]) after ToDtype(torch.float32, scale=True)" in text


def test_stable_diffusion_fed_minus_1_1_images_passes(project):
    project.conftest(tinydiff.conftest(roles=("pipeline", "collator", "dataset")))
    run = project.run("--dlcheck=V1", "-rA")
    run.assert_outcome("V1", "passed")
    assert f"within [-1, 1] (± 0.05), the range {SD} maps images to" in tinydiff.flat(run.text)
