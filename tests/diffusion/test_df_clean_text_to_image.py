"""The diffusion domain on a clean small text-to-image training setup: every check passes (DF1 and DF7
are information items and skip with their note), and nothing the checks touched is left changed."""

import tinydiff


def test_clean_setup_passes_the_whole_domain(project):
    project.conftest(tinydiff.conftest(steps=2))  # two real optimizer + EMA steps taken: mid-training
    run = project.run("--dlcheck=diffusion")
    for cid in ("DF2", "DF3", "DF4", "DF5", "DF6", "DF8"):
        run.assert_outcome(cid, "passed")
    run.assert_outcome("DF1", "skipped")
    run.assert_outcome("DF7", "skipped")
    assert "info: DF1 is not a test" in run.text
    assert "info: training SNR runs from" in run.text and "uniform over timesteps" in run.text
    ns = tinydiff.LAST[-1]
    tinydiff.assert_same_state(ns.snapshot, tinydiff.snapshot_state(ns))


def test_clean_setup_with_explicit_roles_and_no_pipeline(project):
    """The same project handing over its parts one by one (no dlcheck_pipeline): still all clean."""
    roles = (
        "vae",
        "model",
        "tokenizer",
        "text_encoder",
        "noise_scheduler",
        "inference_scheduler",
        "training_inputs",
        "condition",
        "dataset",
        "collator",
        "ema",
        "sample_images",
    )
    project.conftest(tinydiff.conftest(roles=roles))
    run = project.run("--dlcheck=DF2,DF3,DF4,DF5,DF6,DF8")
    for cid in ("DF2", "DF3", "DF4", "DF5", "DF6", "DF8"):
        run.assert_outcome(cid, "passed")
