"""The diffusion roles: documented in --dlcheck-list, derived from a diffusers pipeline, and skipped with
one line naming the fixture when missing."""

import pytest
import tinydiff


def test_list_documents_the_diffusion_roles_and_checks(project):
    project.conftest("")
    result = project.pytester.runpytest_inprocess("-p", "no:cacheprovider", "--dlcheck-list")
    text = result.stdout.str()
    for fixture in (
        "dlcheck_pipeline",
        "dlcheck_unet",
        "dlcheck_vae",
        "dlcheck_text_encoder",
        "dlcheck_noise_scheduler",
        "dlcheck_inference_scheduler",
        "dlcheck_training_inputs",
        "dlcheck_condition",
        "dlcheck_uncond",
        "dlcheck_ema",
        "dlcheck_sample_images",
    ):
        assert fixture in text, fixture
    for cid in ("DF1", "DF2", "DF3", "DF4", "DF5", "DF6", "DF7", "DF8"):
        assert f"\n{cid} " in text, cid
    detail = project.pytester.runpytest_inprocess("-p", "no:cacheprovider", "--dlcheck-list", "DF5").stdout.str()
    assert "false_alarm" in detail and "Known problems" in detail and "0.95^300" in detail


def test_missing_roles_skip_naming_the_fixture(project):
    """Only a training scheduler: every check skips naming what to add (DF2, with no EMA anywhere, is not
    applicable rather than asking for one); the core dlcheck_model default fixture, which asks the
    diffusion deriver for a dlcheck_pipeline nobody defined, resolves to MISSING."""
    project.conftest("""
        import pytest, tinydiff

        @pytest.fixture
        def dlcheck_noise_scheduler():
            return tinydiff.noise_scheduler()
    """)
    run = project.run("--dlcheck=diffusion")
    for cid in ("DF2", "DF3", "DF4", "DF5", "DF6", "DF8"):
        run.assert_outcome(cid, "skipped")
    assert (
        "not applicable: no EMA configured (no dlcheck_ema): DF2 concerns trainings that sample from an EMA" in run.text
    )
    # the denoiser is unknown (latent or pixel space?): the VAE is asked for
    assert "missing role: define fixture dlcheck_vae (or dlcheck_pipeline) in conftest.py" in run.text
    assert "missing role: define fixture dlcheck_inference_scheduler (or dlcheck_pipeline) in conftest.py" in run.text
    assert "missing role: define fixture dlcheck_training_inputs in conftest.py" in run.text
    assert "Error" not in run.text


@pytest.fixture(scope="module")
def sd():
    return tinydiff.setup()


def test_pipeline_derives_its_components(sd):
    from pytest_dlcheck.checks.diffusion import empty_prompt_embeddings, from_pipeline
    from pytest_dlcheck.roles import MISSING

    cache = {}

    def memo(source, key, make):
        return cache.setdefault((id(source), key), make())

    def get(name):
        return sd.pipeline if name == "pipeline" else MISSING

    assert from_pipeline("vae", get, memo) is sd.vae
    assert from_pipeline("unet", get, memo) is sd.unet
    assert from_pipeline("model", get, memo) is MISSING  # the core model role is not taken from a pipeline
    assert from_pipeline("tokenizer", get, memo) is sd.tokenizer
    assert from_pipeline("text_encoder", get, memo) is sd.text_encoder
    assert from_pipeline("inference_scheduler", get, memo) is sd.pipeline.scheduler
    assert from_pipeline("noise_scheduler", get, memo) is MISSING  # training side: only the user knows it
    uncond = from_pipeline("uncond", get, memo)
    ids = sd.tokenizer(
        [""], padding="max_length", max_length=sd.tokenizer.model_max_length, return_tensors="pt"
    ).input_ids
    # what StableDiffusionPipeline.encode_prompt computes as negative_prompt_embeds for no negative prompt
    _, negative = sd.pipeline.encode_prompt("a red square", "cpu", 1, True)
    assert uncond.shape == negative.shape
    assert (uncond - negative).abs().max() < 1e-5
    assert (empty_prompt_embeddings(sd.tokenizer, sd.text_encoder) - sd.text_encoder(ids)[0]).abs().max() < 1e-5
