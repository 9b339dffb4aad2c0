"""D5 across world sizes, and FSDP2 (fully_shard) on CPU: a sharded checkpoint saved at world size 1 loads on 2
ranks (DCP) or does not (a file per rank); an FSDP script saving its sharded state dicts through DCP passes
every dist check, one saving ``model.state_dict()`` on rank 0 loses the other rank's shards."""

import multiprocessing
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "train"))
import tiny_dist as td  # noqa: E402
import tiny_lightning as tl  # noqa: E402, F401 - Lightning imported once, before the in-process runs

DIST = ("D1", "D2", "D3", "D4", "D5", "D6")


def _flat(text):
    return " ".join(text.split())


def _no_leftover_process():
    assert not multiprocessing.active_children(), multiprocessing.active_children()


def test_a_file_per_rank_loads_at_world_size_1_but_not_on_more_ranks(project):
    project.conftest(td.project(save="save_per_rank_file", load="load_per_rank_file"))
    run = project.run("--dlcheck=D5", "-rA")
    run.assert_outcome("D5", "failed")
    d5 = _flat(run.section("D5"))
    # the 2-rank save loaded in one process passed (rank 0's file); the 1-process save on 2 ranks does not load
    assert (
        "the checkpoint saved in 1 process (world size 1, after 3 micro-steps), loaded on 2 ranks "
        "(dlcheck_make_training + dlcheck_dist_wrap + dlcheck_load_checkpoint on each): rank 1 raised "
        "FileNotFoundError" in d5
    ), d5
    assert "No such file or directory: 'checkpoint.rank1' (in load_per_rank_file at" in d5
    assert "files written at world size 1: checkpoint.rank0" in d5
    assert "each rank saves and loads its own file, so a rank that did not exist at save time finds none" in d5
    assert "dcp.save({'model': get_model_state_dict(model)}, checkpoint_id=path)" in d5
    _no_leftover_process()


def test_fsdp2_script_saving_sharded_state_dicts_with_dcp_passes_every_dist_check(project):
    project.conftest(td.project(wrap="wrap_fsdp", save="save_dcp_sharded", load="load_dcp_sharded"))
    run = project.run("--dlcheck=dist", "-rA")
    for cid in DIST:
        run.assert_outcome(cid, "passed")
    run.fnmatch(
        [
            "*3 parameters and 9 optimizer-state tensors identical on the 2 ranks after each of 3 micro-steps "
            "(FSDPTokenLM, gloo, forked processes), through 3 optimizer steps (after micro-steps 1, 2, 3); "
            "FSDP2: each sharded tensor compared as the full tensor "
            "gathered from the ranks' shards",
            "*dlcheck_save_checkpoint on 2 ranks: one collective torch.distributed.checkpoint save*",
            "*loaded on every rank with the saved weights (3 parameters); files: checkpoint/.metadata, "
            "checkpoint/__0_0.distcp, checkpoint/__1_0.distcp*",
            "*the DCP checkpoint saved at world size 2 loads at world size 1 with the same weights*",
            "*the DCP checkpoint saved at world size 1 (after 3 micro-steps) loads at world size 2 with the same "
            "weights on every rank*",
        ]
    )
    _no_leftover_process()


def test_fsdp2_state_dict_saved_on_rank0_holds_its_shards_only(project):
    project.conftest(td.project(wrap="wrap_fsdp", save="save_state_dict_on_rank0", load="load_state_dict"))
    run = project.run("--dlcheck=D1,D5", "-rA")
    run.assert_outcome("D1", "passed")
    run.assert_outcome("D5", "failed")
    d5 = _flat(run.section("D5"))
    assert (
        "rank 0 of 2 saves 3 sharded tensors (DTensor) with torch.save to checkpoint: 'model.embed.weight' is the "
        "rank's own shard 8x16 of 16x16" in d5
    ), d5
    assert "loaded on 2 ranks, rank 0 gets another 'embed.weight' than the saved one" in d5
    assert "the model each rank trains: FSDP2 over 2 ranks" in d5
    assert "written by rank 0 alone, the checkpoint lacks the other ranks' shards" in d5
    assert "get_optimizer_state_dict(model, optimizer)" in d5
    _no_leftover_process()


def test_fsdp1_runs_on_cpu_but_is_not_judged_yet(project):
    # FullyShardedDataParallel runs on CPU with gloo; its flat parameters are each rank's shard, which the
    # checks would take for drifted replicas: they skip, naming FSDP1 and fully_shard
    project.conftest(td.project(wrap="wrap_fsdp1", save="save_dcp_sharded", load="load_dcp_sharded"))
    run = project.run("--dlcheck=D1,D5")
    run.assert_outcome("D1", "skipped")
    run.assert_outcome("D5", "skipped")
    assert "the model is wrapped in FullyShardedDataParallel (FSDP1)" in _flat(run.text)
    assert "the dist domain compares FSDP2 models only yet (fully_shard(model))" in _flat(run.text)
    _no_leftover_process()


LIGHTNING = """
    import pytest
    import tiny_lightning as tl


    @pytest.fixture(scope="session")
    def dlcheck_lightning_module():
        return tl.Classifier()

    @pytest.fixture(scope="session")
    def dlcheck_datamodule():
        return tl.Blobs(shuffle=True)
"""


def test_a_lightning_module_is_said_not_launched_not_asked_for_a_plain_loops_roles(project):
    """Lightning's imagenet example, found blind: D1-D4 said a LightningModule is not launched while D5 asked for
    dlcheck_make_training, dlcheck_save_checkpoint and dlcheck_load_checkpoint (roles of another kind of user)."""
    project.conftest(LIGHTNING)
    run = project.run("--dlcheck=D1,D5", "-rs")
    run.assert_outcome("D5", "skipped")
    d5 = _flat(next(ln for ln in run.text.splitlines() if ln.startswith("SKIPPED") and "D5_distributed" in ln))
    assert "a LightningModule is not launched in several processes" in d5, d5
    assert "missing role" not in d5 and "dlcheck_make_training" not in d5, d5
