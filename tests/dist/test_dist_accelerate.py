"""Accelerate users through the dist domain: their factory's ``Accelerator(cpu=True)`` built in two real processes
(the Accelerate singletons inherited from the pytest process reset in each rank), so ``accelerator.prepare`` wraps
the model in DDP and shards the loader itself — no ``dlcheck_dist_wrap``. One clean script passes D1–D4 and D6 (D5
asks for its save/load roles); a step through ``accelerator.unwrap_model(model)`` drifts (D1); a model left out
of ``prepare`` drifts too (a loader left out of ``prepare``: test_dist_own_loader.py). One launch per test."""

import multiprocessing
import re
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import tiny_accelerate as ta  # noqa: E402


def _flat(text):
    return " ".join(text.split())


def _no_leftover_process():
    assert not multiprocessing.active_children(), multiprocessing.active_children()


def test_a_clean_accelerate_script_passes_without_a_wrap_role(project):
    import torch
    from accelerate.state import PartialState

    project.conftest(ta.project())
    run = project.run("--dlcheck=dist", "-rA")
    for cid in ("D1", "D2", "D3", "D4", "D6"):
        run.assert_outcome(cid, "passed")
    run.assert_outcome("D5", "skipped")  # no dlcheck_save_checkpoint / dlcheck_load_checkpoint given
    assert "define fixture dlcheck_save_checkpoint" in run.text
    assert "dlcheck_dist_wrap" not in run.text.split("short test summary")[-1]
    run.fnmatch(
        [
            # accelerator.prepare wrapped the model in DDP on each rank: the Accelerator saw the 2 processes
            "4 parameters and 12 optimizer-state tensors identical on the 2 ranks after each of 3 micro-steps "
            "(DistributedDataParallel, gloo, forked processes), through 3 optimizer steps (after micro-steps 1, 2, 3)",
            "the averaged gradient of the first distributed step equals the single-process gradient on the 2 batches "
            "(8 examples) of 2 ranks concatenated (relative difference *)",
            "the 2 ranks' shards of epoch 0 are disjoint and cover the 42 examples (24, 24 indices)",
            "6 index(es) repeated as padding: Accelerate's even_batches completes the last batches from the start of "
            "the epoch (42 examples dealt as 48 indices; on two ranks: *)",
            "epoch 1 reshuffled on every rank (the prepared loader's second pass) *",
            "4 parameters identical on the 2 ranks after dlcheck_make_training (accelerator.prepare)",
            "example 0 comes out the same on 16 fetches on every rank, and the fetch draws nothing from the global "
            "generators: the dataset's fetch has no randomness (what the script draws before its loader exists, a "
            "rollout collected with a seeded policy or a random split, is not seen here)",
            "micro-step 4: rank 1's 'hidden' outputs inf, the other ranks' batches are finite",
        ]
    )
    assert "not a DistributedSampler" not in run.text and "reshuffling not judged" not in run.text
    # nothing left in the pytest process: no process group, Accelerate's state still this process's own
    assert not torch.distributed.is_initialized()
    if PartialState._shared_state:
        assert PartialState().num_processes == 1
    _no_leftover_process()


def test_a_step_through_unwrap_model_lets_the_replicas_drift(project):
    project.conftest(ta.project(train_step="step_unwrapped"))
    run = project.run("--dlcheck=D1,D2", "-rA")
    run.assert_outcome("D1", "failed")
    run.assert_outcome("D2", "skipped")
    assert "the ranks' gradients differ at the first optimizer step: D1 reports the lost synchronisation" in run.text
    d1 = _flat(run.section("D1"))
    # which parameter differs most depends on the run's numbers: any of the MLP's
    assert re.search(
        r"after micro-step 1 of 3 on 2 ranks, parameter '(hidden|out)\.(weight|bias)' differs between rank 0 and rank 1",
        d1,
    ), d1
    assert "the model each rank trains: DistributedDataParallel" in d1
    assert "the gradients the optimizer stepped on already differed between ranks" in d1
    assert "computed through accelerator.unwrap_model(model)" in d1
    assert "keep accelerator.unwrap_model(model) for saving and evaluation" in d1
    _no_leftover_process()


def test_replicas_apart_between_local_sgd_averagings_are_not_blamed(project):
    # accelerate's LocalSGD averages the weights every 8 steps and leaves the gradients unaveraged: the replicas
    # differ in between by design (D1 had failed 'backward ran inside no_sync' with a fix that removes LocalSGD:
    # blind set 11); a step that bypasses DDP without LocalSGD still fails (the test above)
    project.conftest(ta.project(make="make_training_local_sgd", train_step="step_local_sgd"))
    run = project.run("--dlcheck=D1,D2", "-rA")
    run.assert_outcome("D1", "skipped")
    text = _flat(run.text)
    assert "your loop trains with accelerate's LocalSGD (local_sgd_steps=8): the replicas train apart" in text
    assert "D1 reports the lost synchronisation" not in text
    _no_leftover_process()


def test_a_model_left_out_of_prepare_drifts(project):
    project.conftest(ta.project(make="make_training_model_left_out"))
    run = project.run("--dlcheck=D1,D3", "-rA")
    run.assert_outcome("D1", "failed")
    run.assert_outcome("D3", "passed")  # the loader is prepared: each rank trains on its own batches
    d1 = _flat(run.section("D1"))
    # which parameter differs most depends on the run's numbers: any of the MLP's
    assert re.search(
        r"after micro-step 1 of 3 on 2 ranks, parameter '(hidden|out)\.(weight|bias)' differs between rank 0 and rank 1",
        d1,
    ), d1
    assert "the model is not wrapped in DistributedDataParallel (MLP)" in d1
    assert "(state['model'] was not passed to accelerator.prepare)" in d1
    assert "model, optimizer, loader = accelerator.prepare(model, optimizer, loader)" in d1
    _no_leftover_process()


def test_a_head_attached_after_prepare_is_named_not_a_backbone_weight(project):
    project.conftest(ta.project(make="make_training_head_after_prepare"))
    run = project.run("--dlcheck=D1,D6", "-rA")
    run.assert_outcome("D1", "failed")
    run.assert_outcome("D6", "skipped")  # the replicas already differ: the overflow step is not D6's to judge
    d1 = _flat(run.section("D1"))
    assert "after micro-step 1 of 3 on 2 ranks, parameter 'out." in d1, d1
    assert "parameters the accelerator.prepare wrap does not know (created after it): 'out.weight', 'out.bias'" in d1
    assert "module 'out' was created after the model was wrapped (accelerator.prepare)" in d1
    assert "then model = accelerator.prepare(model)" in d1
    assert "unwrap_model(model)" not in d1  # not the cause of a step through the unwrapped model
    assert "D1 reports the lost synchronisation" in _flat(run.text)
    _no_leftover_process()


def test_a_head_attached_before_prepare_passes(project):
    project.conftest(ta.project(make="make_training_head_before_prepare"))
    run = project.run("--dlcheck=D1,D6", "-rA")
    run.assert_outcome("D1", "passed")
    run.assert_outcome("D6", "passed")
    _no_leftover_process()
