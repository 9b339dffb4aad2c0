"""D4 on the random streams of a DDP loop, in two real processes: the dataset's RandomHorizontalFlip (p = 0.5) is
seen on 16 fetches of example 0 (two fetches agree half the time, which read as "no randomness", found blind on
diffusers' train_instruct_pix2pix), and the noise and timesteps the training step draws (torch.randn_like,
torch.randint) are followed on the first micro-step with dropout off: with Accelerate's set_seed(seed) alike on
every rank both fail; seeded with the rank both pass; a step whose only draw changes nothing (a LayerDrop of 0)
passes. One launch per test."""

import multiprocessing
import re
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import tiny_d4 as t4  # noqa: E402


def _flat(text):
    return " ".join(text.split())


def _no_leftover_process():
    import torch

    assert not torch.distributed.is_initialized()
    assert not multiprocessing.active_children(), multiprocessing.active_children()


def test_a_half_probability_flip_seeded_alike_on_every_rank_fails(project):
    project.conftest(t4.project(step="plain_step", loss="plain_loss"))
    run = project.run("--dlcheck=D4", "-rA")
    run.assert_outcome("D4", "failed")
    d4 = _flat(run.section("D4"))
    found = re.search(
        r"example 0 fetched 16 times through the dataloader's pipeline on each rank: the fetches differ \(random "
        r"augmentation\), yet every rank's fetches are identical, one by one \(rank 0: (\d+) different results, the "
        r"first (\w+), rank 1: (\d+) different results, the first (\w+)\)",
        d4,
    )
    assert found, d4
    assert found.group(1) == "2" and found.group(1, 2) == found.group(3, 4)
    assert "every rank draws its augmentation from the same random stream" in d4
    assert "set_seed(seed, device_specific=True)" in d4
    # the step draws nothing with dropout off: no step evidence
    assert "draws from torch's global generator" not in d4
    _no_leftover_process()


def test_noise_and_timesteps_drawn_alike_on_every_rank_fail(project):
    project.conftest(t4.project(loader="plain_loader"))
    run = project.run("--dlcheck=D4", "-rA")
    run.assert_outcome("D4", "failed")
    d4 = _flat(run.section("D4"))
    assert "example 0 comes out the same on 16 fetches on every rank, and the fetch draws nothing" in d4
    assert (
        "the first micro-step of dlcheck_train_step (dropout off) draws from torch's global generator: its state "
        "moves over the step" in d4
    )
    found = re.search(
        r"torch's global generator is identical on every rank when that step begins \(state \w+ on the 2 ranks\); "
        r"its next numbers: rank 0: ([\d., ]+); rank 1: ([\d., ]+)",
        d4,
    )
    assert found and found.group(1).strip(" ;") == found.group(2).strip(" ;"), d4
    losses = re.search(r"under two different seeds of the global generators: ([\d.e+-]+) vs ([\d.e+-]+)", d4)
    assert losses and losses.group(1) != losses.group(2), d4
    assert "dlcheck_dist_setup seeds every rank alike" in d4
    assert "its noise, timesteps or masks" in d4
    assert "set_seed(seed, device_specific=True)" in d4 and "torch.manual_seed(seed + rank)" in d4
    _no_leftover_process()


def test_flip_and_noise_seeded_with_the_rank_pass(project):
    project.conftest(t4.project(setup="seed_with_rank"))
    run = project.run("--dlcheck=D4", "-rA")
    run.assert_outcome("D4", "passed")
    text = _flat(run.text)
    assert "4 parameters identical on the 2 ranks after dlcheck_dist_wrap" in text
    assert "example 0's augmentation differs between the ranks (2 different sequences of 16 fetches on 2 ranks)" in text
    assert (
        "the first micro-step (dropout off) draws from torch's global generator, whose state differs between the "
        "ranks when it begins (the ranks are seeded apart" in text
    )
    _no_leftover_process()


def test_a_layerdrop_draw_that_changes_nothing_passes(project):
    project.conftest(
        t4.project(loader="plain_loader", step="plain_step", loss="plain_loss", training="make_training_layerdrop")
    )
    run = project.run("--dlcheck=D4", "-rA")
    run.assert_outcome("D4", "passed")
    text = _flat(run.text)
    assert "the fetch draws nothing from the global generators: the dataset's fetch has no randomness" in text
    assert (
        "the first micro-step (dropout off) draws from torch's global generator, identical on every rank, but the "
        "loss of its batch is the same under two different seeds" in text
    )
    assert "dropout (drop (p=0.1)): the ranks' torch generators at the first step are identical" in text
    _no_leftover_process()


def test_a_flip_from_a_generator_seeded_alike_in_every_rank_fails(project):
    # dlcheck_make_dataloader runs in every rank: the dataset's torch.Generator().manual_seed(0) is built there, alike
    project.conftest(t4.project(setup="seed_with_rank", loader="own_seeded_loader"))
    run = project.run("--dlcheck=D4", "-rA")
    run.assert_outcome("D4", "failed")
    d4 = _flat(run.section("D4"))
    assert "every rank's fetches are identical, one by one (rank 0: 2 different results" in d4
    assert "reseeded differently: the fetches are still identical on every rank, one by one" in d4
    assert (
        "torch.Generator at dataset.gen (initial seed 0): built in the rank (after the launch started it); reseeded "
        "differently on each rank, the fetches differ" in d4
    )
    assert (
        "your data pipeline draws its augmentation from torch.Generator at dataset.gen (initial seed 0), built in" in d4
    )
    assert "torch.Generator().manual_seed(seed + rank)" in d4 and "A.Compose(..., seed=seed + rank)" in d4
    _no_leftover_process()


def test_a_flip_from_a_generator_the_ranks_inherit_is_not_judged(project):
    # a module-level dataset whose NumPy generator was seeded from the OS in the pytest process: the forked ranks
    # share its state, each process of a real launch would build its own
    project.conftest(t4.project(setup="seed_with_rank", loader="inherited_loader"))
    run = project.run("--dlcheck=D4", "-rA")
    run.assert_outcome("D4", "passed")
    text = _flat(run.text)
    assert "every rank's fetches are identical, one by one" in text
    assert "the augmentation's random stream across the ranks not judged" in text, text
    assert "the same draws on every rank come from numpy.random.Generator at dataset.gen (SeedSequence entropy" in text
    assert "dlcheck_make_dataloader hands every rank an object built before the launch" in text
    assert "build it in dlcheck_make_dataloader, as each process does, to have it judged" in text
    _no_leftover_process()


def test_a_generator_alike_on_every_rank_that_the_loss_does_not_read_passes(project):
    """Found in review: NumPy seeded alike (a draw that decides whether to log) beside torch seeded with the rank
    (the noise): reseeding every generator at once made the loss move, and D4 blamed NumPy's. Each generator is now
    reseeded alone: NumPy's leaves the loss as it is, and the noise differs between the ranks."""
    project.conftest(
        t4.project(
            setup="seed_numpy_alike_torch_apart",
            loader="plain_loader",
            step="noise_step_logging",
            loss="noise_loss_logging",
        )
    )
    run = project.run("--dlcheck=D4", "-rA")
    run.assert_outcome("D4", "passed")
    text = _flat(run.text)
    assert "NumPy's global generator is identical on every rank, but reseeding it alone leaves the loss" in text, text
    _no_leftover_process()
