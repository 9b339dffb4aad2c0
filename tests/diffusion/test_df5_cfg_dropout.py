"""DF5: the training conditioning path drops the condition 5–50% of the time, to the sampler's null."""

import math
import re

import pytest
import tinydiff

from pytest_dlcheck.checks.diffusion import measure as D

WITH_CONDITION = tinydiff.CLEAN_ROLES + ("condition",)


def _run(project, roles, **knobs):
    project.conftest(tinydiff.conftest(roles=roles, **knobs))
    return project.run("--dlcheck=DF5", "-rs")


def test_no_caption_dropout(project):
    run = _run(project, WITH_CONDITION, p_empty=0.0)
    run.assert_outcome("DF5", "failed")
    text = tinydiff.flat(run.section("DF5"))
    assert "0 of 1296 embedding rows from 300 calls of dlcheck_condition were null (0.0%)" in text
    assert "freshly collated by dlcheck_collator from 12 examples of dlcheck_dataset" in text
    assert "e.g. 'a red square' was kept" in text
    assert "no null call in 300 has probability 2.1e-07 (≤ 5e-07)" in text
    assert "never learns the unconditional prediction that classifier-free guidance extrapolates from" in text
    assert "proportion_empty_prompts=0.1" in text


def test_null_is_a_zero_embedding_but_the_sampler_uses_the_empty_prompt(project):
    run = _run(project, tinydiff.CLEAN_ROLES, p_empty=0.0, null="zeros", p_null=0.1)
    run.assert_outcome("DF5", "failed")
    text = tinydiff.flat(run.section("DF5"))
    assert "null rows are all-zero embeddings; the sampler's unconditional input is dlcheck_uncond" in text
    assert "calls of the 'encoder_hidden_states' of dlcheck_training_inputs were null" in text
    assert "negative_prompt_embeds=torch.zeros_like(prompt_embeds)" in text


def test_dropout_to_the_empty_prompt_embedding_passes(project):
    project.conftest(tinydiff.conftest(roles=tinydiff.CLEAN_ROLES, p_empty=0.0, null="uncond", p_null=0.1))
    run = project.run("--dlcheck=DF5", "-rA")
    run.assert_outcome("DF5", "passed")
    run.fnmatch(
        [
            "*dlcheck evidence*",
            "* of * embedding rows null (*%) from * calls of the 'encoder_hidden_states' of dlcheck_training_inputs, "
            "within [[]5%, 50%]",
            "* of * embedding rows from * calls of the 'encoder_hidden_states' of dlcheck_training_inputs were null (*%) "
            "— on batches freshly collated by dlcheck_collator from 12 examples of dlcheck_dataset",
            "null = dlcheck_uncond, an embedding of norm * (the empty prompt's, when derived from the pipeline) or "
            "all-zero embeddings; every null row is the sampler's unconditional input (* of *)",
            "stopped early after * calls: the rate lies in [[]*%, *%] with confidence 1 − 0.001, inside [[]2.5%, 75%]",
        ]
    )


def test_an_inverted_dropout_test_drops_too_much(project):
    """caption = "" if random.random() > 0.1 (the comparison inverted): 90% of the captions dropped."""
    run = _run(project, WITH_CONDITION, p_empty=0.9)
    run.assert_outcome("DF5", "failed")
    text = tinydiff.flat(run.section("DF5"))
    assert re.search(
        r"\d+ of 1200 embedding rows from 12 calls of dlcheck_condition were null \((8[5-9]|9\d)\.\d%\)", text
    )
    assert "with a true null rate ≤ 50%" in text
    assert "starving the conditional model" in text


def test_a_path_that_drops_every_condition_fails(project):
    run = _run(project, WITH_CONDITION, p_empty=1.0)
    run.assert_outcome("DF5", "failed")
    text = tinydiff.flat(run.section("DF5"))
    assert "with a true null rate ≤ 50%" in text and "starving the conditional model" in text


def test_half_the_prompts_dropped_on_purpose_passes(project):
    """diffusers' ControlNet example trains with --proportion_empty_prompts 0.5: a deliberate rate, not a bug
    (DF5's old 20% upper bound failed it)."""
    project.conftest(tinydiff.conftest(roles=WITH_CONDITION, p_empty=0.5))
    run = project.run("--dlcheck=DF5", "-rA")
    run.assert_outcome("DF5", "passed")
    run.fnmatch(["*embedding rows null (*%) from * calls of dlcheck_condition, within [[]5%, 50%]*"])


def test_batch_captions_alone(project):
    """Only the data path: dropout in the collator passes; none seen is a skip (it may happen later)."""
    project.conftest(tinydiff.conftest(roles=("pipeline", "dataset", "collator"), p_empty=0.1))
    run = project.run("--dlcheck=DF5", "-rA")
    run.assert_outcome("DF5", "passed")
    run.fnmatch(
        [
            "*::DF5_cfg_dropout PASSED (* of * token-id rows null (*%) from * calls of the batch's*",
            "*dlcheck evidence*",
            "null = the empty prompt tokenized to 16 ids or all-pad (or all-zero) token rows; every null row is the "
            "sampler's unconditional input (* of *)",
        ]
    )
    run = _run(project, ("pipeline", "dataset", "collator"), p_empty=0.0)
    run.assert_outcome("DF5", "skipped")
    assert "no null caption in 1200 token-id rows of 300 batches" in run.text
    assert "define dlcheck_condition" in run.text


def test_binomial_tails_are_exact():
    n, p = 30, 0.1
    brute = sum(math.comb(n, i) * p**i * (1 - p) ** (n - i) for i in range(4))
    assert D.binom_cdf(3, n, p) == pytest.approx(brute, rel=1e-12)
    assert D.binom_sf(4, n, p) == pytest.approx(1 - brute, rel=1e-12)
    assert D.binom_cdf(0, 300, 0.05) == pytest.approx(0.95**300, rel=1e-9)
    assert 0.95**300 < 5e-7  # the documented reason for draws = 300
    ub = D.upper_bound(0, 300, 5e-7)
    assert D.binom_cdf(0, 300, ub) == pytest.approx(5e-7, rel=1e-6)
    lb = D.lower_bound(60, 300, 5e-7)
    assert D.binom_sf(60, 300, lb) == pytest.approx(5e-7, rel=1e-6)


def test_false_alarm_rate_inside_the_band_is_bounded():
    """At the band's edges, the exact probability that the 300-draw test fails is ≤ 1e-6 / 2 per side."""
    alpha = 1e-6
    n = 1200
    k_low = next(k for k in range(n) if D.binom_cdf(k + 1, n, 0.05) > alpha / 2)  # largest failing count
    assert D.binom_cdf(k_low, n, 0.05) <= alpha / 2 < D.binom_cdf(k_low + 1, n, 0.05)
    assert 10 < k_low < 0.05 * n  # a real margin below the 60 nulls expected at 5%
    k_high = next(k for k in range(int(0.5 * n), n) if D.binom_sf(k, n, 0.5) <= alpha / 2)  # smallest failing count
    assert D.binom_sf(k_high, n, 0.5) <= alpha / 2 < D.binom_sf(k_high - 1, n, 0.5)
    assert 0.5 * n < k_high < 0.6 * n


def test_null_is_the_empty_prompt_but_the_sampler_uses_zeros(project):
    """The other direction: training drops to the empty prompt's embedding, the sampler's null is an
    all-zero embedding: named as the null mismatch, not as missing dropout."""
    project.conftest(
        tinydiff.conftest(roles=tinydiff.CLEAN_ROLES, p_empty=0.0, null="uncond", p_null=0.1)
        + """
import torch

@pytest.fixture(scope="session")
def dlcheck_uncond(sd):
    return torch.zeros_like(tinydiff.empty_embedding(sd.text_encoder))
"""
    )
    run = project.run("--dlcheck=DF5")
    run.assert_outcome("DF5", "failed")
    text = tinydiff.flat(run.section("DF5"))
    assert "null rows are the empty prompt's embedding (text_encoder(''))" in text
    assert "the sampler's unconditional input is dlcheck_uncond, an all-zero embedding" in text
    assert "but classifier-free guidance feeds it an all-zero embedding" in text
    assert "never learns the unconditional prediction" not in text


def test_class_label_conditioning_without_dropout_gets_class_wording(project):
    """Class-conditional training (labels as the condition, null class id 10 at sampling) with no label
    dropout: the fix speaks of the null class id, not of empty prompts."""
    project.conftest(
        tinydiff.conftest(roles=("pipeline", "dataset", "collator"))
        + """
import torch

@pytest.fixture(scope="session")
def dlcheck_uncond():
    return 10                                   # the null class id the sampler passes

@pytest.fixture(scope="session")
def dlcheck_condition():
    return lambda batch: torch.randint(0, 10, (batch["input_ids"].shape[0],))   # never the null id
"""
    )
    run = project.run("--dlcheck=DF5")
    run.assert_outcome("DF5", "failed")
    text = tinydiff.flat(run.section("DF5"))
    assert "class labels" in text and "null = the class id 10" in text
    assert "replace the class label by the null class id (10" in text
    assert "empty prompt" not in text
