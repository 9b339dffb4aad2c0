"""The Accelerate launch trains on the user's own DataLoader, prepared or not, never on a stand-in it prepares
itself, so D3 judges what trains: a loader the factory returns but never passed to ``accelerator.prepare``, or the
plain ``dlcheck_dataloader`` when the factory prepared none, gives each of the two ranks the whole dataset in the
same order (D3 fails, saying which loader and that it was not prepared); the prepared twin passes with Accelerate's
own sharding. One launch per test."""

import multiprocessing
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import tiny_accelerate as ta  # noqa: E402
import tiny_own_loader as tol  # noqa: E402

N = ta.N


def _flat(text):
    return " ".join(text.split())


def _no_leftover_process():
    import torch

    assert not torch.distributed.is_initialized()
    assert not multiprocessing.active_children(), multiprocessing.active_children()


def _every_rank_gets_everything(d3):
    # each rank lists all N indices of epoch 0: the whole dataset, in the same order on both
    assert f"epoch 0 on 2 ranks, dataset of {N} examples, sampler RandomSampler: rank 0: {N} indices, rank 1: {N}" in d3
    assert f"rank 0 and rank 1 share {N} examples" in d3
    assert "every rank iterates them in the same order" in d3
    assert "gives every rank the whole dataset, so each step trains on duplicates" in d3
    assert "pass the DataLoader to accelerator.prepare" in d3


def test_a_prepared_loader_is_sharded_by_accelerate(project):
    project.conftest(tol.project("make_training_prepared"))
    run = project.run("--dlcheck=D1,D3", "-rA")
    run.assert_outcome("D1", "passed")
    run.assert_outcome("D3", "passed")
    assert f"the 2 ranks' shards of epoch 0 are disjoint and cover the {N} examples" in _flat(run.text)
    _no_leftover_process()


def test_a_loader_left_out_of_prepare_gives_every_rank_the_whole_dataset(project):
    project.conftest(tol.project("make_training_loader_unprepared"))
    run = project.run("--dlcheck=D1,D3", "-rA")
    run.assert_outcome("D1", "passed")  # the model is prepared: DDP keeps the replicas in step
    run.assert_outcome("D3", "failed")
    d3 = _flat(run.section("D3"))
    _every_rank_gets_everything(d3)
    assert (
        "the DataLoader the ranks train on — dlcheck_make_training (state['train_dataloader']) — was not passed to "
        "accelerator.prepare" in d3
    )
    assert "BatchSamplerShard" not in d3  # the launch prepared no stand-in
    _no_leftover_process()


def test_a_factory_preparing_no_loader_trains_on_the_plain_dlcheck_dataloader(project):
    project.conftest(tol.project("make_training_no_loader", dataloader=True))
    run = project.run("--dlcheck=D1,D3", "-rA")
    run.assert_outcome("D1", "passed")
    run.assert_outcome("D3", "failed")
    d3 = _flat(run.section("D3"))
    _every_rank_gets_everything(d3)
    assert (
        "the DataLoader the ranks train on — dlcheck_dataloader (dlcheck_make_training's Accelerator prepared no "
        "DataLoader) — was not passed to accelerator.prepare" in d3
    )
    assert "return the prepared loader in dlcheck_make_training's dict" in d3
    assert "prepared by the launch" not in _flat(run.text)
    _no_leftover_process()
