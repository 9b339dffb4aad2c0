"""D1–D6 end to end: the user's loop launched in two real processes (torch.distributed, gloo, DDP,
DistributedSampler, torch.distributed.checkpoint), one clean DDP script passing everything, and two buggy
scripts each carrying several independent bugs that fail different checks with their evidence."""

import multiprocessing
import socket
import sys
import time
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent))
import tiny_dist as td  # noqa: E402

DIST = ("D1", "D2", "D3", "D4", "D5", "D6")


def _flat(text):
    """A failure section with its line wrapping undone."""
    return " ".join(text.split())


def _names_the_largest_difference(d1):
    """D1 names the parameter that differs most (the first of its largest differences), with its size."""
    import re

    named = re.search(
        r"after micro-step 1 of 3 on 2 ranks, parameter '([\w.]+)' differs between rank 0 and rank 1 \(max "
        r"\|diff\| ([\d.e+-]+)\)",
        d1,
    )
    assert named, d1
    largest = re.search(r"the largest differences: '([\w.]+)' ([\d.e+-]+)", d1)
    assert largest and largest.groups() == named.groups(), d1


def _no_leftover_process():
    assert not multiprocessing.active_children(), multiprocessing.active_children()


def test_clean_ddp_script_passes_every_dist_check(project):
    import random

    import numpy as np
    import torch

    project.conftest(td.project())
    rng = (random.getstate(), np.random.get_state()[1].copy(), torch.get_rng_state())
    save = torch.save
    run = project.run("--dlcheck=dist", "-rA")
    # no trace in the pytest process: its generators, torch.save (patched in the ranks only), no process group
    assert random.getstate() == rng[0] and (np.random.get_state()[1] == rng[1]).all()
    assert torch.equal(torch.get_rng_state(), rng[2])
    assert torch.save is save and not torch.distributed.is_initialized()
    for cid in DIST:
        run.assert_outcome(cid, "passed")
    run.fnmatch(
        [
            "3 parameters and 9 optimizer-state tensors identical on the 2 ranks after each of 3 micro-steps "
            "(DistributedDataParallel, gloo, forked processes), through 3 optimizer steps (after micro-steps 1, 2, 3)",
            "the averaged gradient of the first distributed step points the same way as the single-process gradient "
            "on the 2 batches (4 examples) of 2 ranks concatenated (cosine 1.000000), *x as long (clip_grad_norm_ clipped "
            "the norm * to max_norm 1 in that step: the length is not judged)",
            "the 2 ranks' shards of epoch 0 are disjoint and cover the 21 examples (11, 11 indices)",
            "1 example(s) appear on two ranks as padding (drop_last=False pads 21 to 22: indices *)",
            "epoch 1 reshuffled on every rank after dlcheck_start_epoch *",
            "3 parameters identical on the 2 ranks after dlcheck_dist_wrap",
            "example 0's augmentation differs between the ranks (2 different sequences of 16 fetches on 2 ranks)",
            "the first micro-step of dlcheck_train_step (dropout off) draws nothing from the global generators *",
            "dlcheck_save_checkpoint on 2 ranks: one collective torch.distributed.checkpoint save",
            "loaded on every rank with the saved weights (3 parameters); files: checkpoint/.metadata, "
            "checkpoint/__0_0.distcp, checkpoint/__1_0.distcp",
            "the DCP checkpoint saved at world size 2 loads at world size 1 with the same weights",
            "the DCP checkpoint saved at world size 1 (after 3 micro-steps) loads at world size 2 with the same "
            "weights on every rank",
            "micro-step 4: rank 1's 'embed' outputs inf, the other ranks' batches are finite",
            "every rank skipped the update, with identical weights afterwards",
        ]
    )
    _no_leftover_process()


def test_no_sync_same_seed_every_rank_saving_no_set_epoch_local_skip(project):
    project.conftest(
        td.project(
            setup="seed_every_rank_alike",
            epoch="train_mode_only",
            step="step_no_sync",
            save="save_every_rank",
            load="load_file",
        )
    )
    run = project.run("--dlcheck=dist", "-rA")
    for cid in ("D1", "D3", "D4", "D5"):
        run.assert_outcome(cid, "failed")
    run.assert_outcome("D2", "skipped")
    assert "the ranks' gradients differ at the first optimizer step: D1 reports the lost synchronisation" in run.text
    # the replicas differ before the overflow step: its local skip is not D6's to judge (causes follow D1's)
    run.assert_outcome("D6", "skipped")
    assert "D6_nonfinite_agreement: the replicas already differ after micro-step 1" in _flat(run.text)

    d1 = _flat(run.section("D1"))
    _names_the_largest_difference(d1)
    assert "the gradients the optimizer stepped on already differed between ranks" in d1
    assert "backward ran inside model.no_sync()" in d1
    assert "(contextlib.nullcontext() if stepping else model.no_sync())" in d1

    d3 = _flat(run.section("D3"))
    assert "sampler DistributedSampler(shuffle=True," in d3
    assert "every rank's order is the same as in epoch 0" in d3
    assert "DistributedSampler.set_epoch(epoch) is not called at the top of the epoch loop" in d3

    d4 = _flat(run.section("D4"))
    assert "the fetches differ (random augmentation), yet every rank's fetches are identical, one by one" in d4
    assert "torch.manual_seed(seed + rank)" in d4

    d5 = _flat(run.section("D5"))
    assert "given the same path: ranks 0, 1 each write checkpoint (torch.save)" in d5
    assert "if dist.get_rank() == 0: torch.save(...)" in d5

    _no_leftover_process()


def test_rank_mean_loss_no_distributed_sampler_local_skip_under_ddp(project):
    project.conftest(td.project(loader="shuffled_loader", step="step_rank_mean_local_skip"))
    run = project.run("--dlcheck=dist", "-rA")
    for cid in ("D2", "D3", "D6"):
        run.assert_outcome(cid, "failed")
    for cid in ("D1", "D4", "D5"):
        run.assert_outcome(cid, "passed")

    d2 = _flat(run.section("D2"))
    assert "first optimizer step on 2 ranks vs one process on the 2 batches (4 examples) of 2 ranks" in d2
    assert "supervised tokens per rank: rank 0: " in d2
    assert "the distributed gradient is the average of each rank's own mean loss" in d2
    assert "per-rank mean over a variable number of tokens" in d2
    assert "dist.all_reduce(n)" in d2

    d3 = _flat(run.section("D3"))
    assert "sampler RandomSampler: rank 0: 21 indices, rank 1: 21 indices" in d3
    assert "rank 0 and rank 1 share 21 examples" in d3
    assert "not a DistributedSampler" in d3

    d6 = _flat(run.section("D6"))
    # DDP: rank 1 skips its backward, rank 0 waits in the gradient all-reduce until rank 1 has gone
    assert (
        "rank 0: was left waiting in a collective that another rank never joined" in d6
        or "rank 0: never finished the step (stopped after waiting in a collective)" in d6
    )
    assert "rank 1: skipped the update" in d6
    _no_leftover_process()


def test_a_rank_that_raises_is_reported_as_the_users_role_naming_the_rank(project):
    project.conftest(td.project(step="step_raising_on_last_rank"))
    run = project.run("--dlcheck=D1,D6")
    run.assert_outcome("D1", "failed")
    text = _flat(run.section("D1"))
    assert (
        "error on rank 1 of 2: raised ValueError: labels out of range on this shard (step 0) "
        "(in step_raising_on_last_rank at" in text
    )
    assert "role dlcheck_train_step" in text
    assert "Connection reset" not in text  # rank 0's broken collective is the consequence, not the cause
    _no_leftover_process()


def test_dist_checks_ask_for_the_wrap_role(project):
    project.conftest("""
    import pytest, tiny_dist as td

    @pytest.fixture(scope="session")
    def dlcheck_make_training():
        return td.make_training
    """)
    run = project.run("--dlcheck=dist")
    for cid in DIST:
        run.assert_outcome(cid, "skipped")
    assert "define fixture dlcheck_dist_wrap in conftest.py" in run.text


def test_a_hung_rank_is_killed_at_the_wall_clock_limit(tmp_path):
    from pytest_dlcheck.checks.dist.launch import Job, launch

    job = Job(
        world=2,
        out=str(tmp_path / "launch"),
        steps=1,
        make_training=td.make_training,
        wrap=td.wrap_ddp,
        dist_setup=td.stuck_rank0_setup,
        make_dataloader=td.distributed_loader,
        pg_timeout=60,
    )
    t0 = time.monotonic()
    run = launch(job, limit=4)
    assert time.monotonic() - t0 < 20
    assert run.timed_out
    assert [r.killed for r in run.ranks] == [True, True]
    assert run.ranks[0].last == "in dlcheck_dist_setup"
    assert run.ranks[1].last == "in dlcheck_make_training" or run.ranks[1].last.startswith("in dlcheck_")
    assert run.stage("train") is None
    _no_leftover_process()
    with socket.socket() as s:  # nothing listens on the rendezvous port any more (TIME_WAIT aside)
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        s.bind(("127.0.0.1", run.port))
        s.listen()


def test_spawned_ranks_rebuild_the_roles_from_their_modules(tmp_path):
    """The start method used when CUDA is initialised in the pytest process: the job is pickled, each rank
    a fresh interpreter importing torch and the user's module (slow: ~15 s for two ranks)."""
    from pytest_dlcheck.checks.dist.launch import Job, launch
    from pytest_dlcheck.errors import MISSING
    from pytest_dlcheck.training.loop import LoopSetup

    setup = LoopSetup(td.make_training, td.step_global_tokens, td.token_loss, MISSING, MISSING, MISSING, MISSING, None)
    job = Job(
        world=2,
        out=str(tmp_path / "spawned"),
        steps=2,
        make_training=td.make_training,
        setup=setup,
        wrap=td.wrap_ddp,
        dist_setup=td.seed_per_rank,
        make_dataloader=td.distributed_loader,
        start_epoch=td.set_epoch,
    )
    run = launch(job, start_method="spawn")
    assert run.start_method == "spawn" and not run.errors, [r.error for r in run.ranks]
    train = run.stage("train")
    assert train is not None and [len(r["steps"]) for r in train] == [2, 2]
    assert train[0]["steps"][-1]["params"] == train[1]["steps"][-1]["params"]
    assert run.stage("d6") is not None
    _no_leftover_process()


def test_unwrapped_unseeded_model_drifts_and_augments_alike_on_every_rank(project):
    # no seeding at all: the ranks start as fresh processes of this torch do. Before torch 2.14, torch's default
    # seed, the same in every fresh process, gives identical starts (then each rank steps on its own gradient) and
    # the same augmentation stream on every rank; torch 2.14 seeds each process from the OS: the unwrapped
    # replicas start apart, which D4 reports (a forked rank must not keep the pytest process's seeded generator)
    project.conftest(td.project(setup=None, wrap="no_wrap", save=None, load=None))
    from pytest_dlcheck.checks.dist.launch import fresh_process_seed

    run = project.run("--dlcheck=D1,D4", "-rA")
    if fresh_process_seed() is None:
        run.assert_outcome("D4", "failed")
        run.assert_outcome("D1", "skipped")
        d4 = _flat(run.section("D4"))
        assert "right after dlcheck_dist_wrap, parameter 'embed.weight' differs between rank 0 and rank 1" in d4
        assert "no DistributedDataParallel wrap (which broadcasts rank 0's weights)" in d4
        return
    run.assert_outcome("D1", "failed")
    run.assert_outcome("D4", "failed")
    d4 = _flat(run.section("D4"))
    assert "3 parameters identical on the 2 ranks after dlcheck_dist_wrap" in d4
    assert "(or none: torch's default seed is the same in every process)" in d4
    d1 = _flat(run.section("D1"))
    _names_the_largest_difference(d1)
    assert "the model each rank trains: TokenLM" in d1
    assert "the model is not wrapped in DistributedDataParallel (TokenLM)" in d1


def test_per_rank_seeds_without_ddp_start_the_replicas_apart(project):
    project.conftest(td.project(wrap="no_wrap", save=None, load=None))
    run = project.run("--dlcheck=D1,D4", "-rA")
    run.assert_outcome("D4", "failed")
    run.assert_outcome("D1", "skipped")
    assert "the replicas differ before the first step (embed.weight): D4 reports the initialisation" in run.text
    d4 = _flat(run.section("D4"))
    assert "right after dlcheck_dist_wrap, parameter 'embed.weight' differs between rank 0 and rank 1" in d4
    assert "no DistributedDataParallel wrap (which broadcasts rank 0's weights)" in d4
    _no_leftover_process()


def test_hostile_dist_roles_are_reported_as_the_users(project):
    # a wrap that returns the model instead of the dict: every rank raises, named as dlcheck_dist_wrap
    project.conftest(td.project(wrap="wrap_returning_the_model"))
    run = project.run("--dlcheck=D1,D3")
    run.assert_outcome("D1", "failed")
    text = _flat(run.section("D1"))
    assert (
        "error on rank 0 of 2: returned a DistributedDataParallel, expected the dict of objects" in text
        or "error on rank 1 of 2: returned a DistributedDataParallel, expected the dict of objects" in text
    )
    assert "role dlcheck_dist_wrap" in text
    _no_leftover_process()


def test_a_dist_role_that_is_not_callable_breaks_its_contract_before_any_launch(project):
    project.conftest(
        td.project(wrap=None) + "\n@pytest.fixture(scope='session')\ndef dlcheck_dist_wrap():\n    return 42\n"
    )
    run = project.run("--dlcheck=D1")
    run.assert_outcome("D1", "failed")
    assert "is a int (42), expected the wrap of your fresh training objects (a callable)" in _flat(run.text)


def test_gradients_summed_by_hand_on_three_ranks(project):
    # identical starts (one seed everywhere, no DDP), gradients all-reduced by hand: the replicas stay equal (D1)
    # but every step is world-size times too large (D2)
    project.conftest(td.project(setup="seed_every_rank_alike", wrap="no_wrap", step="step_summed_grads"))
    run = project.run("--dlcheck=D1,D2", "--dlcheck-world-size=3", "-rA")
    run.assert_outcome("D1", "passed")
    run.assert_outcome("D2", "failed")
    run.fnmatch(["*identical on the 3 ranks after each of 3 micro-steps (TokenLM, gloo, forked processes)*"])
    d2 = _flat(run.section("D2"))
    assert "first optimizer step on 3 ranks vs one process on the 3 batches (6 examples) of 3 ranks" in d2
    assert "norm ratio 3" in d2
    assert "the gradients are summed over the ranks, not averaged: the step is 3x the single-process step" in d2
    _no_leftover_process()


def test_a_loss_raising_on_the_concatenated_batch_is_an_internal_error_not_a_skip(project):
    """D2 concatenates the ranks' batches, a batch the pipeline never builds: a loss that raises on it is not
    the user's error, and not a quiet skip either, but an internal error of pytest-dlcheck naming that batch.
    (Formerly: "skipped: cannot compute the single-process step on the concatenated batch".)"""
    project.conftest(td.project(loss="token_loss_of_one_rank"))
    run = project.run("--dlcheck=D2", "-rA")
    run.assert_outcome("D2", "failed")
    text = _flat(run.text)
    assert (
        "internal error of pytest-dlcheck (this is a bug of pytest-dlcheck, not of your pipeline): ValueError: this "
        "loss takes the batch of one rank (2 rows), got 4 (dlcheck_compute_loss raised it on the 2 batches of the "
        "ranks' first optimizer step concatenated into one, not on your pipeline's own data) at " in text
    ), run.text
    assert "please report it with this output" in text
    assert "dlcheck_compute_loss: raised" not in text
    _no_leftover_process()


def test_roles_that_cannot_be_sent_to_spawned_ranks_are_named(tmp_path):
    import pytest

    from pytest_dlcheck.checks.dist.launch import Job, launch
    from pytest_dlcheck.training import SetupError

    job = Job(world=2, out=str(tmp_path / "closure"), steps=1, make_training=lambda: td.make_training())
    with pytest.raises(SetupError, match="define the role functions at module level of an importable module"):
        launch(job, start_method="spawn")
    _no_leftover_process()


def test_drifting_replicas_make_d5_and_d6_defer_to_d1(project):
    # no DDP, the same seed everywhere, a correct step (skip decided on the gradient norm) and a correct DCP save:
    # the replicas drift at the first step, so one checkpoint cannot give rank 1 its own weights back and rank 1
    # alone sees the overflow; both follow from D1's finding, not from the save or the skip
    project.conftest(td.project(setup="seed_every_rank_alike", wrap="no_wrap"))
    run = project.run("--dlcheck=D1,D5,D6", "-rA")
    run.assert_outcome("D1", "failed")
    run.assert_outcome("D5", "skipped")
    run.assert_outcome("D6", "skipped")
    assert "the model is not wrapped in DistributedDataParallel (TokenLM)" in _flat(run.section("D1"))
    text = _flat(run.text)
    assert "loads other weights than its own replica's" in text
    assert "the replicas already differ after micro-step 1" in text
    assert text.count("D1 reports the lost synchronisation") >= 2
    assert "the ranks' decisions on an overflow are judged on identical replicas only" in text
    assert "own loss or gradient" not in text and "not the saved one" not in text
    _no_leftover_process()


def test_a_head_created_after_the_ddp_wrap_is_named(project):
    # the same seed on every rank: the head starts equal, but DDP does not average its gradients; the backbone,
    # averaged, moves apart only through the clipping coefficient (Adam's first step: ~1e-8), the head by ~1e-2
    project.conftest(
        td.project(setup="seed_every_rank_alike", wrap="wrap_ddp_then_head", training="make_training_headless")
    )
    run = project.run("--dlcheck=D1", "-rA")
    run.assert_outcome("D1", "failed")
    d1 = _flat(run.section("D1"))
    assert "after micro-step 1 of 3 on 2 ranks, parameter 'head." in d1, d1
    assert "the largest differences: 'head." in d1
    assert (
        "parameters the DistributedDataParallel wrap does not know (created after it): 'head.weight', 'head.bias'" in d1
    )
    assert "module 'head' was created after the model was wrapped (DistributedDataParallel)" in d1
    assert "build (or attach) every module before wrapping" in d1
    assert "no_sync" not in d1
    _no_leftover_process()


def test_a_head_created_after_the_ddp_wrap_with_per_rank_seeds_fails_d4_naming_it(project):
    project.conftest(td.project(wrap="wrap_ddp_then_head", training="make_training_headless", save=None, load=None))
    run = project.run("--dlcheck=D1,D4", "-rA")
    run.assert_outcome("D4", "failed")
    run.assert_outcome("D1", "skipped")
    d4 = _flat(run.section("D4"))
    assert "right after dlcheck_dist_wrap, parameter 'head.weight' differs between rank 0 and rank 1" in d4
    assert "2 of 3 parameters differ between the ranks" in d4
    assert "module 'head' was created after the model was wrapped (DistributedDataParallel)" in d4
    assert "no DistributedDataParallel wrap" not in d4
    _no_leftover_process()


def test_a_head_attached_before_the_ddp_wrap_passes(project):
    project.conftest(td.project(wrap="wrap_head_then_ddp", training="make_training_headless", save=None, load=None))
    run = project.run("--dlcheck=D1,D4", "-rA")
    run.assert_outcome("D1", "passed")
    run.assert_outcome("D4", "passed")
    _no_leftover_process()


def test_a_sampler_seeded_with_the_rank_is_named(project):
    project.conftest(td.project(loader="loader_seeded_per_rank", save=None, load=None))
    run = project.run("--dlcheck=D3", "-rA")
    run.assert_outcome("D3", "failed")
    d3 = _flat(run.section("D3"))
    assert "the sampler is seeded differently on each rank (rank 0: num_replicas=2, rank=0, seed=0; rank 1: " in d3
    assert "num_replicas=2, rank=1, seed=1)" in d3
    assert "a seed that does not depend on the rank" in d3
    assert "do not match" not in d3
    _no_leftover_process()


def test_a_random_split_drawn_in_every_process_fails_d3_on_the_examples_its_indices_select(project):
    # the sampler's indices are disjoint; they index two different splits (minGPT-ddp's unseeded random_split)
    project.conftest(td.project(loader="loader_split_per_rank", save=None, load=None))
    run = project.run("--dlcheck=D3", "-rA")
    run.assert_outcome("D3", "failed")
    d3 = _flat(run.section("D3"))
    assert "each rank's dataset is a Subset that selects other examples: rank 0's selects 15 of the 21 examples" in d3
    assert "resolved to the examples underneath, rank 0's and rank 1's shards share" in d3
    assert "random_split(ds, lengths, generator=torch.Generator().manual_seed(seed))" in d3
    assert "not a DistributedSampler" not in d3
    _no_leftover_process()


def test_a_random_split_with_a_fixed_generator_passes_d3(project):
    project.conftest(td.project(loader="loader_split_seeded", save=None, load=None))
    run = project.run("--dlcheck=D3", "-rA")
    run.assert_outcome("D3", "passed")
    d3 = _flat(run.text)
    assert "are disjoint and cover the 15 examples" in d3
    _no_leftover_process()


def test_a_dataset_presharded_by_rank_passes_d3_without_a_distributed_sampler(project):
    project.conftest(td.project(loader="loader_presharded_by_rank", save=None, load=None))
    run = project.run("--dlcheck=D3", "-rA")
    run.assert_outcome("D3", "passed")
    d3 = _flat(run.text)
    assert "resolved through each rank's own selection, share no example" in d3
    assert "rank 0's selects 11 of the 21 examples underneath (first: 0, 2, 4" in d3
    _no_leftover_process()


def test_a_datasets_shard_per_rank_is_not_compared_by_position(project):
    # found in review: ds.shard(world, rank) keeps no indices; D3 compared positions and said the ranks share 16
    # examples, while each rank holds its own
    project.conftest(td.project(loader="loader_hf_shard_per_rank", save=None, load=None))
    run = project.run("--dlcheck=D3", "-rA")
    run.assert_outcome("D3", "skipped")
    text = _flat(run.text)
    assert "the ranks' datasets hold other examples at the same positions" in text, text
    _no_leftover_process()


def test_a_loss_averaged_over_the_ranks_once_more_fails_d2_on_its_length(project):
    # no clipping: the gradient points the right way but is 1/2 as long, judged
    project.conftest(td.project(step="step_averaged_over_ranks_again", save=None, load=None))
    run = project.run("--dlcheck=D2", "-rA")
    run.assert_outcome("D2", "failed")
    d2 = _flat(run.section("D2"))
    assert "the gradient points the same way (cosine 1.0" in d2
    assert "but is 0.5x as long" in d2
    assert "no gradient clipping in that step (clip_grad_norm_ not called before the optimizer step)" in d2
    assert "the loss is averaged over the ranks once more" in d2
    assert "the step is 1/2 (1/world size) of the single-process step" in d2
    assert "loss = loss_sum * dist.get_world_size() / n_global" in d2
    _no_leftover_process()


def test_a_global_token_loss_without_clipping_passes_d2_on_direction_and_length(project):
    project.conftest(td.project(step="step_global_tokens_no_clip", save=None, load=None))
    run = project.run("--dlcheck=D2", "-rA")
    run.assert_outcome("D2", "passed")
    run.fnmatch(
        [
            "*the averaged gradient of the first distributed step equals the single-process gradient on the 2 batches "
            "(4 examples) of 2 ranks concatenated (relative difference *)"
        ]
    )
    _no_leftover_process()


def test_a_ddp_wrap_on_rank_0_only_is_named_within_the_checks_time_bound(project):
    # rank 0 waits in DDP's constructor for a rank that never builds a DDP; the process group's timeout comes from
    # --dlcheck-timeout (20 s: a 15 s launch, 5 s collectives), not gloo's 60 s
    project.conftest(td.project(wrap="wrap_ddp_on_rank0", save=None, load=None))
    t0 = time.monotonic()
    run = project.run("--dlcheck=D1,D4", "--dlcheck-timeout=20", "-rA")
    assert time.monotonic() - t0 < 40
    run.assert_outcome("D1", "failed")
    run.assert_outcome("D4", "skipped")
    assert (
        "the ranks did not run the same collectives (rank 0 waited in dlcheck_dist_wrap for rank 1): D1 reports it"
        in (_flat(run.text))
    )
    d1 = _flat(run.section("D1"))
    assert "rank 0 of 2 waited in a collective in dlcheck_dist_wrap (wrap_ddp at " in d1, d1
    assert "until the process group's timeout (5 s, set from the check's time bound)" in d1
    assert "rank 1 was in dlcheck_train_step (micro-step 1) (step_global_tokens at " in d1
    assert "it never called that collective" in d1
    assert "rank 1 never joined the one rank 0 waits in" in d1
    assert "(under `if rank == 0:`, a main-process-only block)" in d1
    assert "role dlcheck_dist_wrap" not in d1
    _no_leftover_process()


def test_a_barrier_on_rank_0_only_is_named(project):
    project.conftest(td.project(wrap="barrier_on_rank0", save=None, load=None))
    run = project.run("--dlcheck=D1", "--dlcheck-timeout=20", "-rA")
    run.assert_outcome("D1", "failed")
    d1 = _flat(run.section("D1"))
    assert "barrier_on_rank0 at " in d1 and "wrap_ddp at " in d1, d1
    assert "it never called that collective" in d1
    assert "a DistributedDataParallel wrap, a dist.barrier() or a collective run on some ranks only" in d1
    _no_leftover_process()


def test_every_rank_wrapping_passes_under_the_same_short_time_bound(project):
    project.conftest(td.project(save=None, load=None))
    run = project.run("--dlcheck=D1", "--dlcheck-timeout=20", "-rA")
    run.assert_outcome("D1", "passed")
    _no_leftover_process()


def test_batchnorm_per_rank_statistics_are_the_reference_of_a_correct_step(project):
    """A model with BatchNorm normalises each rank's batch with its own statistics (accelerate's cv_example, a
    ResNet, found blind): one process's step on the whole batch differs by the statistics alone. D2 compares with the
    whole batch's loss under each rank's statistics, computed rank by rank: a globally normalised step passes (it
    failed 'relative difference 0.772, cosine 0.65' blaming the loss's normalisation)."""
    project.conftest(td.project(training="make_training_batchnorm", wrap="wrap_ddp_batchnorm", save=None, load=None))
    run = project.run("--dlcheck=D2", "-rA")
    run.assert_outcome("D2", "passed")
    text = _flat(run.text)
    assert "the model's 1 BatchNorm layers (norm) normalise each rank's batch with that rank's own statistics" in text
    assert "equals the gradient of the whole batch's loss with each rank's statistics" in text, text
    _no_leftover_process()


def test_batchnorm_does_not_hide_a_per_rank_mean_over_unequal_tokens(project):
    project.conftest(
        td.project(
            training="make_training_batchnorm",
            wrap="wrap_ddp_batchnorm",
            step="step_rank_mean_local_skip",
            save=None,
            load=None,
        )
    )
    run = project.run("--dlcheck=D2", "-rA")
    run.assert_outcome("D2", "failed")
    d2 = _flat(run.section("D2"))
    assert "it is the plain average of each rank's own mean loss" in d2, d2
    assert "per-rank mean over a variable number of tokens" in d2, d2
    _no_leftover_process()


def test_a_models_functional_attention_dropout_is_off_in_d2s_comparison(project):
    """run_summarization_no_trainer, found blind: T5's attention dropout is a float attribute passed to
    F.dropout, which D2 left on, so it skipped ("your loss draws its own random numbers") on a per-rank token mean
    it should fail. Both computations now run with it at 0, as T10's do."""
    project.conftest(td.project(step="step_rank_mean_local_skip", training="make_training_functional_dropout"))
    run = project.run("--dlcheck=D2", "-rA")
    run.assert_outcome("D2", "failed")
    d2 = _flat(run.section("D2"))
    assert "the distributed gradient is the average of each rank's own mean loss" in d2
    _no_leftover_process()


def test_a_short_first_accumulation_window_is_not_blamed_on_the_ranks(project):
    """run_glue_no_trainer, found blind: `loss / k` and a step when step % k == 0 from 0 make the first optimizer
    step 1/k of its batch's gradient, in one process as on N ranks. With k = N = 2, D2 read the 0.5 as the loss
    averaged over the ranks once more and failed; the short first window (T10's) is said, not blamed on the ranks."""
    project.conftest(td.project(step="step_off_by_one_window"))
    run = project.run("--dlcheck=D2", "-rA")
    run.assert_outcome("D2", "passed")
    text = _flat(run.text)
    assert "the first optimizer step came after 1 micro-step(s) and the next after 2" in text, text
    assert "averaged over the ranks once more" not in text
    _no_leftover_process()


def test_an_overflow_injected_inside_an_accumulation_window_is_said_not_seen(project):
    """run_glue_no_trainer and train_dreambooth_lora, found blind: D6 passed 'every rank skipped the update' when the
    injected micro-step fell where the loop takes no optimizer step anyway (gradient accumulation)."""
    project.conftest(td.project(step="step_off_by_one_window"))
    run = project.run("--dlcheck=D6", "-rA")
    run.assert_outcome("D6", "skipped")
    text = _flat(run.text)
    assert "falls inside an accumulation window (your loop steps its optimizer every 2 micro-steps" in text, text
    assert "skipped the update" not in text
    _no_leftover_process()


@pytest.mark.parametrize(("loader", "outcome"), [("loader_fold", "passed"), ("loader_fold_half", "failed")])
def test_a_sampler_confined_to_a_fold_is_judged_on_the_fold(project, loader, outcome):
    # Fabric's kfold_cv: the validation fold is on no rank by design (D3 had failed '6 of 21 examples on no rank':
    # blind set 11); a share that leaves part of the fold out still fails
    project.conftest(td.project(loader=loader, save=None, load=None))
    run = project.run("--dlcheck=D3", "-rA")
    run.assert_outcome("D3", outcome)
    d3 = _flat(run.text)
    if outcome == "passed":
        assert "cover the 15 examples their sampler draws of the dataset's 21" in d3
    else:
        assert "(the subset of 15 indices its sampler draws) are on no rank" in d3
    _no_leftover_process()


def test_ranks_forked_from_a_process_holding_a_process_group_start_their_own(project):
    """A script whose start runs init_process_group in the pytest process (DINO's init_distributed_mode on a world of
    1, needed by its loss and sampler): the forked ranks inherited that default group and every dist check ended in
    an internal error ('trying to initialize the default process group twice'; found blind, set 14). The ranks
    forget the inherited group and join the launch's; the pytest process keeps its own."""
    project.conftest(
        td.project()
        + """

import os
import torch.distributed as dist


@pytest.fixture(scope="session", autouse=True)
def world_of_one():
    os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
    os.environ["MASTER_PORT"] = "29683"
    dist.init_process_group("gloo", rank=0, world_size=1)
    yield
    dist.destroy_process_group()
"""
    )
    run = project.run("--dlcheck=D1", "-rA")
    run.assert_outcome("D1", "passed")
    assert "process group twice" not in run.text


def test_every_rank_raising_on_the_overflow_is_a_shared_decision(project):
    """Found blind (Lightning Fabric's PPO example, set 15): fabric.clip_gradients raises on a non-finite norm after
    DDP's all-reduce, so every rank raises on the overflow step. D6 had failed, saying the ranks' weights differed:
    it compared the weights of the ranks that had not raised (none). Every rank raising alike is one decision, with
    the weights compared on every rank."""
    project.conftest(td.project(step="step_clip_raising_on_nonfinite"))
    run = project.run("--dlcheck=D6", "-rA")
    run.assert_outcome("D6", "passed")
    text = _flat(run.text)
    assert "micro-step 4: rank 1's 'embed' outputs inf, the other ranks' batches are finite" in text
    assert "every rank raised RuntimeError: The total norm of order 2.0 for gradients" in text
    assert "with identical weights afterwards" in text
    _no_leftover_process()


def test_the_same_examples_on_every_rank_name_both_causes(project):
    """Lightning Fabric's PPO example (found blind, set 15): each rank collects a rollout of its own, seeded alike on
    every rank, so the ranks' datasets hold the same examples, iterated by a RandomSampler. The evidence is the same as
    for one dataset left unsharded; D3's cause and fix name both (a DistributedSampler alone was the wrong fix for
    data each rank collects)."""
    project.conftest(td.project(loader="shuffled_loader"))
    run = project.run("--dlcheck=D3")
    run.assert_outcome("D3", "failed")
    d3 = _flat(run.section("D3"))
    assert "not a DistributedSampler" in d3
    assert (
        "if each rank is meant to train on data of its own (a rollout it collects, a set it generates), the ranks' "
        in d3
    )
    assert "datasets come out identical: the same seed on every rank" in d3
    assert "data of each rank's own: seed each process with its rank before building it" in d3
    _no_leftover_process()


def test_the_overflowing_rank_raising_before_its_step_is_a_loud_stop(project):
    """CleanRL's ppo_atari_multigpu (found blind, set 16): the injected overflow makes the rank's Categorical refuse
    NaN logits (ValueError) before its backward, and the other rank waits for it in DDP's all-reduce until it is gone.
    D6 had failed, saying the rank with the overflow skips alone; the run stops on every rank instead."""
    project.conftest(td.project(step="step_raising_on_nonfinite_loss"))
    run = project.run("--dlcheck=D6", "-rA")
    run.assert_outcome("D6", "passed")
    text = _flat(run.text)
    assert "rank 1: raised ValueError: Expected parameter logits" in text
    assert "rank 1 raised on the overflow before stepping and no rank stepped: the run stops on every rank" in text
    _no_leftover_process()
