"""The Accelerate launch trains on the user's own DataLoader, prepared or not, never on a stand-in it prepares
itself, so D3 judges what trains: a loader the factory returns but never passed to ``accelerator.prepare`` gives
each of the two ranks the whole dataset in the same order (D3 fails, saying which loader and that it was not
prepared); the prepared twin passes with Accelerate's own sharding. When the factory returns no training loader
and prepared none, the ranks iterate the plain ``dlcheck_dataloader``, which says nothing of the script (it may
prepare its loader outside the factory): D3 skips, saying how to have it judged. A prepared evaluation loader is
never taken for the training one. One launch per test."""

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


def test_a_factory_preparing_no_loader_leaves_the_plain_dlcheck_dataloader_unjudged(project):
    # the factory returns no loader and its Accelerator prepared none: the script may prepare its loader outside
    # the factory, so the whole dataset on every rank of the plain fixture is no evidence against it; the buggy
    # family (a loader in the factory's dict left out of prepare) still fails, in the test above
    project.conftest(tol.project("make_training_no_loader", dataloader=True))
    run = project.run("--dlcheck=D1,D3", "-rA")
    run.assert_outcome("D1", "passed")
    run.assert_outcome("D3", "skipped")
    text = _flat(run.text)
    assert (
        "not judged: the ranks' shards of your training loader: dlcheck_dataloader (dlcheck_make_training's "
        "Accelerator prepared no DataLoader), so the launch iterates dlcheck_dataloader as it is on every rank" in text
    ), text
    assert "in dlcheck_make_training's dict" in text and "to have it judged" in text
    assert "was not passed to accelerator.prepare" not in text
    assert "prepared by the launch" not in text
    _no_leftover_process()


def test_a_prepared_eval_loader_is_not_taken_for_the_training_one(project):
    # the evaluation loader is prepared first and keyed first; the training loader's key names neither: the ranks
    # train on the training loader's 42 examples, sharded, not on the 10 evaluation ones
    project.conftest(tol.project("make_training_eval_prepared_first"))
    run = project.run("--dlcheck=D1,D3", "-rA")
    run.assert_outcome("D3", "passed")
    assert f"the 2 ranks' shards of epoch 0 are disjoint and cover the {N} examples" in _flat(run.text)
    _no_leftover_process()


def test_a_prepared_training_loader_missing_from_the_dict_is_found_past_the_eval_one(project):
    # only the evaluation loader is in the dict; the Accelerator prepared the training loader after it
    project.conftest(tol.project("make_training_only_eval_in_dict"))
    run = project.run("--dlcheck=D3", "-rA")
    run.assert_outcome("D3", "passed")
    assert f"the 2 ranks' shards of epoch 0 are disjoint and cover the {N} examples" in _flat(run.text)
    _no_leftover_process()


def test_an_unprepared_training_loader_beside_a_prepared_eval_one_fails(project):
    # the buggy twin: the prepared evaluation loader used to be taken (its shards pass) while the training loader
    # in the same dict, never prepared, gives every rank the whole dataset
    project.conftest(tol.project("make_training_train_unprepared_beside_eval"))
    run = project.run("--dlcheck=D3", "-rA")
    run.assert_outcome("D3", "failed")
    d3 = _flat(run.section("D3"))
    _every_rank_gets_everything(d3)
    assert (
        "the DataLoader the ranks train on — dlcheck_make_training (state['loader']) — was not passed to "
        "accelerator.prepare" in d3
    ), d3
    _no_leftover_process()


def test_a_factory_preparing_only_an_eval_loader_does_not_train_on_it(project):
    project.conftest(tol.project("make_training_eval_only", dataloader=True))
    run = project.run("--dlcheck=D3", "-rA")
    run.assert_outcome("D3", "skipped")
    text = _flat(run.text)
    assert (
        "Accelerator prepared no training DataLoader: only state['eval_dataloader'], keyed as an evaluation loader, "
        "which is not trained on)" in text
    ), text
    assert f"cover the {tol.EVAL_N} examples" not in text
    _no_leftover_process()
