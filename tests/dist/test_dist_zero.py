"""D1 on a ZeroRedundancyOptimizer, two real gloo processes: each rank owns the optimizer state of its partition
(``optimizer.optim``) and broadcasts the parameters it updated, so the replicated parameters stay identical even when
one rank's shard is trained wrongly. D1 compares the state each rank owns: a learning rate scaled by the rank and a
ZeRO without DDP (each shard stepped on its owner's gradient alone) fail with their cause; ZeRO on DDP passes, naming
the owned state it compared and the single-process reference of the first step."""

import multiprocessing
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import tiny_zero as tz  # noqa: E402


def _flat(text):
    return " ".join(text.split())


def _no_leftover_process():
    assert not multiprocessing.active_children(), multiprocessing.active_children()


def test_zero_on_ddp_passes_comparing_the_state_each_rank_owns(project):
    project.conftest(tz.project("wrap_ddp_zero"))
    run = project.run("--dlcheck=D1", "-rA")
    run.assert_outcome("D1", "passed")
    text = _flat(run.text)
    assert "3 parameters identical on the 2 ranks after each of 3 micro-steps (DistributedDataParallel" in text
    # tiny_dist's TokenLM: embed.weight, head.weight, head.bias, partitioned by ZeRO over the two ranks
    assert "ZeroRedundancyOptimizer (AdamW): the optimizer state each rank owns compared — rank 0 owns" in text
    assert "the partitions cover the 3 parameters once (9 owned tensors: exp_avg, exp_avg_sq, step)" in text
    assert "the local optimizers' hyperparameters are identical on the 2 ranks (lr=0.01" in text
    assert "every owned parameter counts the same steps after each micro-step (3 after the last)" in text
    assert "the gradients the shards stepped on are identical on every rank at the first optimizer step" in text
    assert (
        "after the first optimizer step each rank's owned state and the parameters it owns equal one AdamW stepped in "
        "one process from the same weights on the same gradient (12 tensors" in text
    )
    _no_leftover_process()


def test_a_learning_rate_scaled_by_the_rank_fails_on_the_owned_shard(project):
    project.conftest(tz.project("wrap_ddp_zero_lr_per_rank"))
    run = project.run("--dlcheck=D1", "-rA")
    run.assert_outcome("D1", "failed")
    d1 = _flat(run.section("D1"))
    assert (
        "after micro-step 1 of 3 the local optimizers of the ZeroRedundancyOptimizer (AdamW) differ between rank 0 and "
        "rank 1 in parameter group 0: lr: rank 0 0.01, rank 1 0.02" in d1
    )
    assert "rank 1 owns 'head.weight'" in d1 and "so the replicas stay identical" in d1
    assert "the optimizer is built with rank-dependent hyperparameters" in d1
    _no_leftover_process()


def test_zero_without_ddp_steps_each_shard_on_its_owners_gradient(project):
    project.conftest(tz.project("wrap_zero_without_ddp", setup="seed_every_rank_alike"))
    run = project.run("--dlcheck=D1,D2", "-rA")
    run.assert_outcome("D1", "failed")
    run.assert_outcome("D2", "skipped")
    d1 = _flat(run.section("D1"))
    assert (
        "at the first optimizer step the gradients the ZeroRedundancyOptimizer stepped on differ between the ranks"
        in d1
    )
    assert "each parameter is updated on the rank that owns it (rank 0:" in d1
    assert "the model each rank trains: TokenLM" in d1
    assert "the gradients are not averaged over the ranks before ZeroRedundancyOptimizer.step()" in d1
    assert "wrap the model in DistributedDataParallel and build the ZeroRedundancyOptimizer" in d1
    _no_leftover_process()


def test_a_shard_changed_outside_the_step_differs_from_one_process(project):
    project.conftest(tz.project("wrap_ddp_zero", step="step_resetting_moments_on_rank1"))
    run = project.run("--dlcheck=D1", "-rA")
    run.assert_outcome("D1", "failed")
    d1 = _flat(run.section("D1"))
    assert "after the first optimizer step (micro-step 1) the owned state tensor" in d1
    assert ":exp_avg' of rank 1's shard differs from one AdamW stepped in one process on the same weights and" in d1
    assert "rank 1 owns 'head.weight'" in d1
    assert "changed outside ZeroRedundancyOptimizer.step" in d1
    _no_leftover_process()
