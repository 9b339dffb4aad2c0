"""transformers Trainer users through the dist domain: a clone of their Trainer runs its own ``train()`` in two real
processes (the TrainingArguments' cached single-process device state dropped in each rank), so the Trainer's
Accelerator sees the 2 processes and wraps the model in DDP itself. A clean Trainer keeps its replicas identical
(D1 passes; D4 probes the Trainer's own DataLoader and passes; D2, D3 and D6 say why they do not judge a
Trainer yet); a TrainerCallback that edits the weights on
the main process only makes them drift (D1 fails). One launch per test."""

import multiprocessing
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import tiny_trainer as tt  # noqa: E402


def _flat(text):
    return " ".join(text.split())


def test_a_clean_trainer_keeps_its_replicas_identical(project):
    import torch

    project.conftest(tt.project())
    run = project.run("--dlcheck=dist", "-rA")
    run.assert_outcome("D1", "passed")
    # D4 probes the Trainer's own train DataLoader: the causal-LM collator draws nothing at random
    run.assert_outcome("D4", "passed")
    for cid in ("D2", "D3", "D5", "D6"):
        run.assert_outcome(cid, "skipped")
    run.fnmatch(
        [
            # the Trainer's Accelerator saw 2 processes (args.world_size 2) and train() wrapped the model in DDP
            "* parameters and * optimizer-state tensors identical on the 2 ranks after each of 3 micro-steps "
            "(DistributedDataParallel, gloo, forked processes), through 3 optimizer steps (after micro-steps 1, 2, 3); "
            "a clone of your Trainer trained through its own "
            "train() in each rank (args.world_size 2)",
        ]
    )
    text = _flat(run.text)
    assert "the Trainer builds its sharded DataLoader inside train()" in text
    assert "the single-process reference step needs the first distributed step's batches" in text
    assert "parameters identical on the 2 ranks when Trainer.train() began" in text
    assert (
        "example 0 comes out the same on 16 fetches on every rank, and the fetch draws nothing from the global "
        "generators: the dataset's fetch has no randomness" in text
    )
    assert "the Trainer seeded every rank with set_seed(args.seed=0); dataloader_num_workers=0" in text
    assert "the injected non-finite micro-step runs outside the Trainer's train() loop" in text
    # D5 says why it is not judged, not "missing role" for a plain loop's fixtures (found blind on run_mae)
    assert "the ranks' writes and loads are not recorded for a Trainer yet" in text
    assert "missing role" not in text
    assert "a Trainer or a LightningModule is not launched" not in text
    assert not torch.distributed.is_initialized()
    assert not multiprocessing.active_children(), multiprocessing.active_children()


def test_a_callback_editing_weights_on_the_main_process_only_lets_the_replicas_drift(project):
    project.conftest(tt.project(callback=True))
    run = project.run("--dlcheck=D1", "-rA")
    run.assert_outcome("D1", "failed")
    d1 = _flat(run.section("D1"))
    assert (
        "after micro-step 1 of 3 on 2 ranks, parameter 'model.embed_tokens.weight' differs between rank 0 and rank 1"
        in d1
    )
    assert "the model each rank trains: DistributedDataParallel" in d1
    assert "the gradients the optimizer stepped on already differed" not in d1
    assert "a TrainerCallback, or an override of the Trainer, changed the weights on some ranks only" in d1
    assert "must not run under `if state.is_world_process_zero:`" in d1
    assert not multiprocessing.active_children(), multiprocessing.active_children()
