"""D4 for transformers Trainer users: in each of two real processes a clone of the user's Trainer runs its own
``train()`` (which calls ``set_seed(args.seed)`` in every process); when training begins each rank fetches example
0 16 times through the Trainer's own train DataLoader (its dataset, collator, workers and ``seed_worker``), then once
more with its global generators reseeded per rank. A dataset that draws its noise from torch's global generator
with DataLoader workers is decorrelated by the Trainer itself (passes); the same dataset with no workers, and a
dataset drawing from a generator seeded at import, give every rank the same noise (D4 fails, naming which).
One launch per test."""

import multiprocessing
import re
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import tiny_trainer_aug as tta  # noqa: E402


def _flat(text):
    return " ".join(text.split())


def _no_leftover_process():
    import torch

    assert not torch.distributed.is_initialized()
    assert not multiprocessing.active_children(), multiprocessing.active_children()


def _same_first_fetch(d4):
    """The fetches of example 0 are the same digests, one by one, on both ranks, and the pipeline is random."""
    found = re.search(
        r"every rank's fetches are identical, one by one \(rank 0: (\d+) different results, the first (\w+), "
        r"rank 1: (\d+) different results, the first (\w+)\)",
        d4,
    )
    assert found, d4
    assert found.group(1, 2) == found.group(3, 4) and int(found.group(1)) > 1
    assert "fetched 16 times through the dataloader's pipeline on each rank: the fetches differ (random" in d4


def test_global_noise_with_dataloader_workers_is_decorrelated_by_the_trainer(project):
    project.conftest(tta.project(source="global", workers=1))
    run = project.run("--dlcheck=D4", "-rA")
    run.assert_outcome("D4", "passed")
    text = _flat(run.text)
    assert "parameters identical on the 2 ranks when Trainer.train() began" in text
    # the noise is random and differs between the ranks: measured, not assumed
    assert "example 0's augmentation differs between the ranks (2 different sequences of 16 fetches on 2 ranks)" in text
    assert "the Trainer seeded every rank with set_seed(args.seed=0); dataloader_num_workers=1" in text
    _no_leftover_process()


def test_global_noise_without_workers_is_the_same_on_every_rank(project):
    project.conftest(tta.project(source="global", workers=0))
    run = project.run("--dlcheck=D4", "-rA")
    run.assert_outcome("D4", "failed")
    d4 = _flat(run.section("D4"))
    _same_first_fetch(d4)
    assert "set_seed(args.seed=0) (args.data_seed=None); dataloader_num_workers=0" in d4
    # the draws follow the global generators the Trainer seeded alike: reseeded per rank, they differ
    assert "reseeded differently: the fetches are different (2 sequences on 2 ranks: the draws come from the" in d4
    assert "the Trainer seeds every rank alike — set_seed(args.seed) in each process — and with" in d4
    assert "dataloader_num_workers=0 your dataset's __getitem__ and the data collator draw in the main process" in d4
    assert "dataloader_num_workers >= 1 in the TrainingArguments" in d4
    _no_leftover_process()


def test_noise_from_a_generator_seeded_at_import_is_inherited_by_the_forked_ranks_and_not_judged(project):
    # the module was imported in the pytest process: the forked ranks inherit its generator, as they would one
    # seeded from the OS; whether each process of a real launch seeds it alike is not seen (stated, with its seed)
    project.conftest(tta.project(source="import", workers=1))
    run = project.run("--dlcheck=D4", "-rA")
    run.assert_outcome("D4", "passed")
    text = _flat(run.text)
    assert "the augmentation's random stream across the ranks not judged" in text, text
    assert (
        "the same draws on every rank come from torch.Generator at tiny_trainer_aug.NOISE (initial seed 1234)" in text
    )
    assert "built before the launch: your Trainer's train dataset (and its transform) was built in the pytest" in text
    assert "seeded alike in every process (a fixed seed: the ranks draw the same augmentation, a real finding)" in text
    _no_leftover_process()


def test_noise_from_a_generator_seeded_from_the_os_in_the_pytest_process_is_not_failed(project):
    # albumentations 2.x's A.Compose without seed (transformers' run_object_detection.py): default_rng() when the
    # dataset is built; every process of a real launch builds its own, the forked ranks share the pytest process's
    project.conftest(tta.project(source="entropy", workers=1))
    run = project.run("--dlcheck=D4", "-rA")
    run.assert_outcome("D4", "passed")
    text = _flat(run.text)
    assert "every rank's fetches are identical, one by one" in text
    assert "reseeded differently: the fetches are still identical on every rank, one by one" in text
    assert "the augmentation's random stream across the ranks not judged" in text, text
    assert (
        "the same draws on every rank come from numpy.random.Generator at dataset.rng (SeedSequence entropy of" in text
    )
    assert "bits, as default_rng() draws from the OS), built before the launch" in text
    assert (
        "Forked, every rank starts from one state of it, whereas each process of a real launch builds its own" in text
    )
    _no_leftover_process()


def test_noise_from_a_generator_built_at_the_first_fetch_in_every_rank_fails(project):
    # built in the rank (after the fork) with a fixed seed: the ranks' identical stream is the script's own seeding
    project.conftest(tta.project(source="lazy", workers=0))
    run = project.run("--dlcheck=D4", "-rA")
    run.assert_outcome("D4", "failed")
    d4 = _flat(run.section("D4"))
    _same_first_fetch(d4)
    assert (
        "the fetches are still identical on every rank, one by one (the draws come from a generator of your own)" in d4
    )
    assert "torch.Generator at dataset.gen (initial seed 1234): built in the rank (after the launch started it);" in d4
    assert "reseeded differently on each rank, the fetches differ" in d4
    assert "draws its augmentation from torch.Generator at dataset.gen (initial seed 1234), built in every rank" in d4
    assert "torch.Generator().manual_seed(seed + args.process_index)" in d4
    # not the cause of the global stream drawn without workers
    assert "with dataloader_num_workers=0 your dataset" not in d4
    _no_leftover_process()
