"""DF5 and a frozen denoiser: textual inversion freezes the UNet (unet.requires_grad_(False)) and trains one token
embedding row. Caption dropout trains the denoiser's unconditional prediction, which a frozen denoiser cannot learn:
DF5 is not applicable. A LoRA inside the frozen UNet, or a ControlNet trained beside it, is trained, and still fails
without caption dropout."""

import tinydiff

ROLES = tuple(r for r in tinydiff.CLEAN_ROLES if r != "pipeline") + ("condition",)

FROZEN = """
@pytest.fixture(scope="session")
def dlcheck_pipeline(sd):
    # textual_inversion.py: vae, unet and the text encoder frozen but for its token embedding
    sd.vae.requires_grad_(False)
    sd.unet.requires_grad_(False)
    sd.text_encoder.requires_grad_(False)
    sd.text_encoder.get_input_embeddings().requires_grad_(True)
    if {lora}:  # train_text_to_image_lora.py: LoRA adapters added to the frozen UNet are what trains
        from peft import LoraConfig

        sd.unet.add_adapter(LoraConfig(r=4, lora_alpha=4, target_modules=["to_q", "to_k", "to_v", "to_out.0"]))
    if {controlnet}:  # train_controlnet.py: the UNet frozen, a ControlNet made from it is what trains
        from diffusers import ControlNetModel, StableDiffusionControlNetPipeline

        p = sd.pipeline
        return StableDiffusionControlNetPipeline(
            vae=p.vae, text_encoder=p.text_encoder, tokenizer=p.tokenizer, unet=p.unet,
            controlnet=ControlNetModel.from_unet(p.unet), scheduler=p.scheduler, safety_checker=None,
            feature_extractor=None, requires_safety_checker=False,
        )
    return sd.pipeline
"""


def _run(project, lora: bool = False, controlnet: bool = False):
    project.conftest(tinydiff.conftest(roles=ROLES, p_empty=0.0) + FROZEN.format(lora=lora, controlnet=controlnet))
    return project.run("--dlcheck=DF5", "-rA")


def test_a_frozen_denoiser_is_not_applicable(project):
    run = _run(project, lora=False)
    run.assert_outcome("DF5", "skipped")
    text = " ".join(run.text.split())
    assert ("not applicable: the denoiser UNet2DConditionModel (dlcheck_unet) is frozen: none of its ") in text, (
        run.text
    )
    assert (
        "parameter tensors requires grad: dropping the condition trains the denoiser's unconditional prediction, "
        "which a frozen denoiser cannot learn"
    ) in text


def test_a_lora_in_the_frozen_denoiser_is_trained_and_judged(project):
    run = _run(project, lora=True)
    run.assert_outcome("DF5", "failed")
    text = tinydiff.flat(run.section("DF5"))
    assert "0 of 1296 embedding rows from 300 calls of dlcheck_condition were null (0.0%)" in text
    assert "never learns the unconditional prediction that classifier-free guidance extrapolates from" in text


def test_a_trained_controlnet_beside_the_frozen_unet_is_judged(project):
    """train_controlnet.py freezes the UNet and trains a ControlNet, whose residuals are part of the prediction
    guidance extrapolates from: the denoiser as a whole is trained, and DF5 judges its conditioning."""
    run = _run(project, controlnet=True)
    run.assert_outcome("DF5", "failed")
    text = tinydiff.flat(run.section("DF5"))
    assert "embedding rows from 300 calls of dlcheck_condition were null (0.0%)" in text
