"""D7 end to end: the user's evaluation launched in two real processes (gloo), over an eval set of 9 examples that
2 ranks do not divide evenly. Accelerate: accelerator.gather keeps the repeats of even_batches (12 predictions for
9 examples) and fails, gather_for_metrics passes. A plain DDP loop: a loss all-reduced over a padded
DistributedSampler counts example 0 twice and fails, a loss computed on rank 0's shard only fails naming the
missing reduction, the same all-reduce over a split without padding passes (compared with the same evaluation in
one process)."""

import math
import multiprocessing
import re
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import tiny_eval as te  # noqa: E402


def _flat(text):
    return " ".join(text.split())


def _no_leftover_process():
    assert not multiprocessing.active_children(), multiprocessing.active_children()


def test_accelerate_gather_counts_the_padding_of_the_last_batches(project):
    project.conftest(te.accelerate_project("eval_gather"))
    run = project.run("--dlcheck=D7", "-rA")
    run.assert_outcome("D7", "failed")
    d7 = _flat(run.section("D7"))
    assert "12 predictions gathered on rank 0 for 9 eval examples (a tuple of 2 arrays of 12 rows): 3 duplicates" in d7
    assert "9 eval examples dealt as 12 indices: rank 0: 6, rank 1: 6; repeated on two ranks: 0, 1, 2" in d7
    assert "Accelerate's BatchSamplerShard over a SequentialSampler (batch_size=3, drop_last=False" in d7
    assert "accelerator.gather returns every rank's batches as they are, the repeats included" in d7
    assert "accelerator.gather_for_metrics(...) in place of accelerator.gather(...)" in d7
    _no_leftover_process()


def test_accelerate_gather_for_metrics_counts_each_example_once(project):
    project.conftest(te.accelerate_project("eval_gather_for_metrics"))
    run = project.run("--dlcheck=D7", "-rA")
    run.assert_outcome("D7", "passed")
    run.fnmatch(
        [
            "*9 predictions gathered on ranks 0, 1 for the 9 eval examples (3 repeated as padding by the eval loader, "
            "not counted)*"
        ]
    )
    _no_leftover_process()


def test_ddp_loss_all_reduced_over_a_padded_sampler_counts_an_example_twice(project):
    project.conftest(te.dist_project("eval_loss_all_reduce", "padded_eval_loader"))
    run = project.run("--dlcheck=D7", "-rA")
    run.assert_outcome("D7", "failed")
    d7 = _flat(run.section("D7"))
    found = re.search(
        r"eval_loss = ([\d.]+) on rank 0 of 2; the same evaluation in one process over the 9 eval examples "
        r"\(rank 0's weights\) gives ([\d.]+)",
        d7,
    )
    assert found and found.group(1) != found.group(2), d7
    assert "9 eval examples dealt as 10 indices: rank 0: 5, rank 1: 5; repeated on two ranks: 0" in d7
    assert "DistributedSampler(drop_last=False), batch_size=3" in d7
    assert "the 1 example(s) the eval loader repeats to give every rank the same number of batches are counted" in d7
    assert "sampler=range(rank, len(eval_set), world_size)" in d7 and "dist.all_reduce" in d7
    _no_leftover_process()


def test_ddp_loss_of_rank0s_shard_is_not_reduced(project):
    project.conftest(te.dist_project("eval_loss_rank0_only", "padded_eval_loader"))
    run = project.run("--dlcheck=D7", "-rA")
    run.assert_outcome("D7", "failed")
    d7 = _flat(run.section("D7"))
    assert "no collective ran during dlcheck_dist_eval on any rank" in d7
    assert "the metric is not reduced across the ranks: rank 0's eval_loss covers its own shard only (5 of 9" in d7
    assert "dist.all_reduce the sums and the counts on every rank" in d7
    _no_leftover_process()


def test_ddp_loss_all_reduced_over_an_unpadded_split_passes(project):
    project.conftest(te.dist_project("eval_loss_all_reduce", "unpadded_eval_loader"))
    run = project.run("--dlcheck=D7", "-rA")
    run.assert_outcome("D7", "passed")
    run.fnmatch(
        [
            "*eval_loss = * on ranks 0, 1 of 2, the one-process evaluation of the same weights over the 9 eval examples "
            "gives *"
        ]
    )
    text = _flat(run.text)
    found = re.search(
        r"eval_loss = ([\d.e+-]+) on ranks 0, 1 of 2, .* over the 9 eval examples gives ([\d.e+-]+)", text
    )
    # what D7 guarantees: the two agree within its rtol (a sum taken in another order may move the printed 6th digit)
    assert found and math.isclose(float(found.group(1)), float(found.group(2)), rel_tol=1e-5), text
    _no_leftover_process()


def test_ddp_all_gather_of_a_padded_sampler_counts_the_padding(project):
    project.conftest(te.dist_project("eval_losses_all_gather", "padded_eval_loader"))
    run = project.run("--dlcheck=D7", "-rA")
    run.assert_outcome("D7", "failed")
    d7 = _flat(run.section("D7"))
    assert "10 predictions gathered on rank 0 for 9 eval examples (a Tensor of 10 rows): 1 duplicate padding" in d7
    assert "the gather (all_gather) returns every rank's batches as they are, the repeats included" in d7
    assert "gather the example indices with the predictions and keep the first of each" in d7
    assert "gather_for_metrics" not in d7  # a plain DDP loop has no Accelerator
    _no_leftover_process()


def test_ddp_mean_of_the_ranks_means_over_unequal_shards(project):
    project.conftest(te.dist_project("eval_loss_mean_of_ranks", "unpadded_eval_loader"))
    run = project.run("--dlcheck=D7", "-rA")
    run.assert_outcome("D7", "failed")
    d7 = _flat(run.section("D7"))
    assert "9 eval examples dealt as 9 indices: rank 0: 5, rank 1: 4" in d7
    assert "the ranks' shards differ in size (5, 4 examples) and their eval_loss are averaged with equal weights" in d7
    assert "all_reduce the sums and the counts on every rank, then divide" in d7
    _no_leftover_process()


def test_ddp_buffer_broadcast_is_no_reduction_of_the_metric(project):
    # llm.c: a DDP model with a buffer (the causal mask) broadcasts it in every forward; rank 0's unreduced loss
    # was read as "a reduction ran"
    project.conftest(te.dist_project("eval_loss_rank0_only", "unpadded_eval_loader", "make_training_with_buffer"))
    run = project.run("--dlcheck=D7", "-rA")
    run.assert_outcome("D7", "failed")
    d7 = _flat(run.section("D7"))
    assert "no collective ran during dlcheck_dist_eval on any rank" in d7
    assert "the model's wrapper ran inside its forwards: DistributedDataParallel's buffer broadcast" in d7
    assert "the metric is not reduced across the ranks: rank 0's eval_loss covers its own shard only (5 of 9" in d7
    _no_leftover_process()


def test_an_eval_loader_without_a_length_still_has_its_metric_judged(project):
    # llm.c's own loader: no dataset, no sampler; the metric needs no count to be compared with one process
    project.conftest(te.dist_project("eval_loss_rank0_only", "strided_eval_batches"))
    run = project.run("--dlcheck=D7", "-rA")
    run.assert_outcome("D7", "failed")
    d7 = _flat(run.section("D7"))
    assert "the same evaluation in one process over its whole eval loader (rank 0's weights) gives" in d7
    assert "the metric is not reduced across the ranks: rank 0's eval_loss covers its own shard only" in d7
    _no_leftover_process()


def test_an_eval_loader_without_a_length_all_reduced_passes(project):
    project.conftest(te.dist_project("eval_loss_all_reduce", "strided_eval_batches"))
    run = project.run("--dlcheck=D7", "-rA")
    run.assert_outcome("D7", "passed")
    text = _flat(run.text)
    assert "the one-process evaluation of the same weights over its whole eval loader gives" in text
    assert "the examples each rank evaluates not judged" in text or "examples each rank evaluates" in text
    _no_leftover_process()


def test_decoded_texts_are_counted_as_predictions(project):
    project.conftest(te.dist_project("eval_texts_all_gather", "padded_eval_loader"))
    run = project.run("--dlcheck=D7", "-rA")
    run.assert_outcome("D7", "failed")
    d7 = _flat(run.section("D7"))
    assert "10 predictions gathered on rank 0 for 9 eval examples (a list of 10 texts)" in d7
    _no_leftover_process()
