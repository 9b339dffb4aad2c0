"""DF5 on a consistency-distilled model (diffusers' train_lcm_distill_lora_sdxl.py, LCM-LoRA; found blind, set 14):
the student samples with an LCMScheduler in a few steps, its guidance distilled from a guided teacher, so the
conditioning dropout that trains an unconditional prediction for classifier-free guidance does not concern it.
The same training sampled by a DDIM pipeline without dropout still fails (test_df5_cfg_dropout)."""

import tinydiff

WITH_CONDITION = tinydiff.CLEAN_ROLES + ("condition",)


def test_a_training_sampled_by_an_lcm_scheduler_is_not_applicable(project):
    project.conftest(tinydiff.conftest(roles=WITH_CONDITION, p_empty=0.0, inference="lcm"))
    run = project.run("--dlcheck=DF5", "-rA")
    run.assert_outcome("DF5", "skipped")
    text = " ".join(run.text.split())
    assert "is a LCMScheduler, the sampler of a consistency-distilled model" in text


def test_the_same_training_sampled_by_ddim_without_dropout_fails(project):
    project.conftest(tinydiff.conftest(roles=WITH_CONDITION, p_empty=0.0))
    project.run("--dlcheck=DF5").assert_outcome("DF5", "failed")
