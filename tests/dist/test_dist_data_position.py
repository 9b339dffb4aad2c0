"""D5: the data position across a mid-epoch save and resume on two gloo ranks (issue 31 item 2).

An Accelerate user whose factory prepares a shuffled DataLoader saves with ``accelerator.save_state`` (plus the
step) and, on load, skips the batches already trained with ``accelerator.skip_first_batches``. In each rank the
run of one epoch of the rank's shard is saved half way and resumed from fresh objects; the examples the two ranks
train together after the resume are counted against the uninterrupted ranks':

- the correct twin: a seedable sampler and a skip of this rank's own steps: the uninterrupted batches, step by step;
- a skip over a reshuffled epoch (no seedable sampler): examples trained twice and never seen on the ranks;
- a skip of ``step * num_processes`` batches (the step counted for all ranks, a bug one process never shows: there
  ``num_processes`` is 1): each rank skips past its shard, and the examples left are never seen.

One launch per test; the causes and counts are asserted, and no process is left behind."""

import re

from helpers import flat as _flat
from helpers import no_leftover_process as _no_leftover_process
from helpers import role_fixtures

CONFTEST = """
    import os
    import pytest, torch
    from torch import nn
    from torch.utils.data import DataLoader, TensorDataset
    from accelerate import Accelerator
    from accelerate.utils import DataLoaderConfiguration

    torch.set_num_threads(1)
    # 16 examples, 2 a batch on each of 2 ranks: an epoch of 4 steps per rank
    DATA = TensorDataset(torch.randn(16, 4, generator=torch.Generator().manual_seed(0)), torch.arange(16) % 2)

    def make():
        acc = Accelerator(cpu=True, dataloader_config=DataLoaderConfiguration(use_seedable_sampler={seedable}))
        model = nn.Linear(4, 2)
        opt = torch.optim.SGD(model.parameters(), lr=0.1)
        loader = DataLoader(DATA, batch_size=2, shuffle=True)
        model, opt, loader = acc.prepare(model, opt, loader)
        return {{"accelerator": acc, "model": model, "optimizer": opt, "dataloader": loader, "step": 0}}

    def step(state, batch):
        acc = state["accelerator"]
        with acc.accumulate(state["model"]):
            x, y = batch
            loss = nn.functional.cross_entropy(state["model"](x), y)
            acc.backward(loss)
            state["optimizer"].step()
            state["optimizer"].zero_grad()
        state["step"] += 1
        return loss.detach()

    def save(state, path):
        acc = state["accelerator"]
        acc.save_state(path)
        if acc.is_main_process:
            torch.save({{"step": state["step"]}}, os.path.join(path, "step.pt"))
        acc.wait_for_everyone()

    def load(state, path):
        acc = state["accelerator"]
        acc.load_state(path)
        state["step"] = torch.load(os.path.join(path, "step.pt"))["step"]
        state["dataloader"] = acc.skip_first_batches(state["dataloader"], {skipped})

{fixtures}
"""

ROLES = role_fixtures(make_training="make", train_step="step", save_checkpoint="save", load_checkpoint="load")
CONFTEST = CONFTEST.replace("{fixtures}", ROLES.replace("{", "{{").replace("}", "}}"))

#: the steps this rank trained (correct), or the steps of every rank (buggy on N ranks)
OWN_STEPS = 'state["step"]'
ALL_RANKS = 'state["step"] * acc.num_processes'

COUNTS = re.compile(r"over the 2 ranks together, steps 1-4: (\d+) examples trained twice, (\d+) never seen")


def _counts(text):
    found = COUNTS.search(text)
    assert found, text
    return int(found.group(1)), int(found.group(2))


def test_a_seedable_sampler_skipped_by_the_ranks_own_steps_passes(project):
    project.conftest(CONFTEST.format(seedable=True, skipped=OWN_STEPS))
    run = project.run("--dlcheck=D5", "-rA")
    run.assert_outcome("D5", "passed")
    text = _flat(run.text)
    assert (
        "data position: on each of 2 ranks the uninterrupted run draws steps 1-4 (each rank's whole epoch) from "
        "state['dataloader'] (DataLoaderShard) and saves after step 2" in text
    ), text
    assert "the uninterrupted ranks' batches, step by step (over the 2 ranks: 16 examples, none trained twice" in text
    _no_leftover_process()


def test_a_skip_over_a_reshuffled_epoch_trains_examples_twice_on_the_ranks(project):
    project.conftest(CONFTEST.format(seedable=False, skipped=OWN_STEPS))
    run = project.run("--dlcheck=D5")
    run.assert_outcome("D5", "failed")
    text = _flat(run.section("D5"))
    twice, never = _counts(text)
    # a whole epoch of each rank compared: each example trained twice pushes one out
    assert twice > 0 and twice == never, text
    assert "the resume on 2 ranks does not restore the data position" in text, text
    assert "it yields examples already trained before the save" in text, text
    assert "use_seedable_sampler=True" in text, text
    _no_leftover_process()


def test_a_skip_of_every_ranks_steps_leaves_examples_never_seen(project):
    project.conftest(CONFTEST.format(seedable=True, skipped=ALL_RANKS))
    run = project.run("--dlcheck=D5")
    run.assert_outcome("D5", "failed")
    text = _flat(run.section("D5"))
    twice, never = _counts(text)
    # each rank skips 2 x 2 = 4 batches: its whole shard; the 2 batches left after the save are never trained
    assert (twice, never) == (0, 8), text
    assert "rank 0: 0 twice, 4 never seen; rank 1: 0 twice, 4 never seen" in text, text
    assert "skips past batches it never trained" in text, text
    assert "not a step multiplied by num_processes" in text, text
    _no_leftover_process()


def test_a_load_that_leaves_the_loader_untouched_is_said_not_judged(project):
    # load_state alone: the loop may skip in its epoch loop (run_clm_no_trainer.py does), which the launch does not
    # see without dlcheck_resume_dataloader: not judged, and said (the family's bugs fail above)
    project.conftest(
        CONFTEST.format(seedable=True, skipped=OWN_STEPS).replace(
            '        state["dataloader"] = acc.skip_first_batches(state["dataloader"], state["step"])\n', ""
        )
    )
    run = project.run("--dlcheck=D5", "-rA")
    run.assert_outcome("D5", "passed")
    text = _flat(run.text)
    # a pass on the weights and the shards alone: counted apart, as partly judged, saying why
    assert (
        "the data position: not judged, on 2 ranks: rank 0: your dlcheck_load_checkpoint leaves state['dataloader']"
        in text
    ), text
    assert "partly judged: the data position not judged" in text, text
    assert re.search(r"^dist +0 of 1 judged: 1 partly judged$", run.text, re.M), run.text
    _no_leftover_process()


#: a torchrun-style plain loop: DDP by dlcheck_dist_wrap, a DistributedSampler (seed 0, epoch 0) in the training
#: dict, rank 0 saves the weights and the step; on load each rank either builds its loader anew (the epoch starts
#: again) or skips the batches it trained on the same shuffle
PLAIN = """
    import itertools
    import pytest, torch
    import torch.distributed as dist
    from torch import nn
    from torch.utils.data import DataLoader, DistributedSampler, TensorDataset

    torch.set_num_threads(1)
    DATA = TensorDataset(torch.randn(16, 4, generator=torch.Generator().manual_seed(0)), torch.arange(16) % 2)

    def loader():
        return DataLoader(DATA, batch_size=2, sampler=DistributedSampler(DATA, shuffle=True, seed=0))

    def make():
        model = nn.Linear(4, 2)
        return {{"model": model, "optimizer": torch.optim.SGD(model.parameters(), lr=0.1), "dataloader": loader(),
                "step": 0}}

    def wrap(state):
        model = nn.parallel.DistributedDataParallel(state["model"])
        return dict(state, model=model, optimizer=torch.optim.SGD(model.parameters(), lr=0.1))

    def step(state, batch):
        x, y = batch
        loss = nn.functional.cross_entropy(state["model"](x), y)
        loss.backward()
        state["optimizer"].step()
        state["optimizer"].zero_grad()
        state["step"] += 1
        return loss.detach()

    def save(state, path):
        if dist.get_rank() == 0:
            torch.save({{"model": state["model"].module.state_dict(), "step": state["step"]}}, path)
        dist.barrier()

    def load(state, path):
        ckpt = torch.load(path)
        state["model"].module.load_state_dict(ckpt["model"])
        state["step"] = ckpt["step"]
        state["dataloader"] = {resumed}

{fixtures}
"""


PLAIN = PLAIN.replace(
    "{fixtures}",
    role_fixtures(
        make_training="make", dist_wrap="wrap", train_step="step", save_checkpoint="save", load_checkpoint="load"
    )
    .replace("{", "{{")
    .replace("}", "}}"),
)


def test_a_torchrun_loop_whose_resume_restarts_the_epoch_repeats_examples(project):
    project.conftest(PLAIN.format(resumed="loader()"))
    run = project.run("--dlcheck=D5")
    run.assert_outcome("D5", "failed")
    text = _flat(run.section("D5"))
    twice, never = _counts(text)
    # each rank trains its shard's first 2 batches again and never reaches its last 2
    assert (twice, never) == (8, 8), text
    assert "from state['dataloader'] (DataLoader)" in text, text
    assert "it yields examples already trained before the save" in text, text
    assert "itertools.islice(loader, step_in_epoch, None)" in text, text
    _no_leftover_process()


def test_a_torchrun_loop_that_skips_its_trained_batches_passes(project):
    project.conftest(PLAIN.format(resumed='itertools.islice(state["dataloader"], ckpt["step"], None)'))
    run = project.run("--dlcheck=D5", "-rA")
    run.assert_outcome("D5", "passed")
    text = _flat(run.text)
    assert (
        "fresh objects loaded by dlcheck_load_checkpoint draw steps 3-4 from their state['dataloader'] (a islice"
        in text
    ), text
    assert "the uninterrupted ranks' batches, step by step (over the 2 ranks: 16 examples" in text, text
    _no_leftover_process()


def _epoch_loop_project(resumed: str) -> str:
    """load_state alone, and the skip handed over as the user's epoch loop (dlcheck_resume_dataloader), as
    run_clm_no_trainer does it: ``accelerator.skip_first_batches(train_dataloader, resume_step)`` in the loop."""
    base = CONFTEST.format(seedable=True, skipped=OWN_STEPS).replace(
        '        state["dataloader"] = acc.skip_first_batches(state["dataloader"], state["step"])\n', ""
    )
    loop = (
        "\n    def resume(state, dataloader, resumed_step):\n"
        f"        return {resumed}\n\n" + role_fixtures(resume_dataloader="resume") + "\n"
    )
    return base + loop


def test_the_epoch_loop_handed_over_reaches_the_ranks(project):
    # dlcheck_resume_dataloader went missing on the way to the forked ranks (copy.copy of the setup dropped it, as
    # pickling for spawn does): D5 said "not visible" although the role was given
    project.conftest(_epoch_loop_project('state["accelerator"].skip_first_batches(dataloader, resumed_step)'))
    run = project.run("--dlcheck=D5", "-rA")
    run.assert_outcome("D5", "passed")
    text = _flat(run.text)
    assert "what your dlcheck_resume_dataloader makes of their state['dataloader']" in text, text
    assert "not visible" not in text and "partly judged" not in text, text
    _no_leftover_process()


def test_an_epoch_loop_that_restarts_the_epoch_fails_on_the_ranks(project):
    project.conftest(_epoch_loop_project("dataloader"))
    run = project.run("--dlcheck=D5")
    run.assert_outcome("D5", "failed")
    twice, never = _counts(_flat(run.section("D5")))
    assert twice > 0 and never > 0
    _no_leftover_process()


#: an Accelerate loop with gradient accumulation 2 that checkpoints every 2 optimizer steps: each rank's epoch (16
#: examples, 2 a batch on 2 ranks: 4 micro-steps) ends at the save (blind set 12's amused). No seedable sampler: the
#: resumed ranks' next epoch is shuffled otherwise than the uninterrupted ranks' (accelerate's generator, made at
#: prepare time, is not in save_state), which is a new epoch's order, not a lost position. The epoch loop after the
#: load skips the micro-steps already trained in the epoch: the rank's micro-steps (correct: none at an epoch's end),
#: or the optimizer steps counted as batches (the bug: 2 batches of the new epoch skipped)
BOUNDARY = """
    import os
    import pytest, torch
    from torch import nn
    from torch.utils.data import DataLoader, TensorDataset
    from accelerate import Accelerator

    torch.set_num_threads(1)
    DATA = TensorDataset(torch.randn(16, 4, generator=torch.Generator().manual_seed(0)), torch.arange(16) % 2)

    def make():
        acc = Accelerator(cpu=True, gradient_accumulation_steps=2)
        model = nn.Linear(4, 2)
        opt = torch.optim.SGD(model.parameters(), lr=0.1)
        loader = DataLoader(DATA, batch_size=2, shuffle=True)
        model, opt, loader = acc.prepare(model, opt, loader)
        return {{"accelerator": acc, "model": model, "optimizer": opt, "dataloader": loader, "global_step": 0}}

    def step(state, batch):
        acc = state["accelerator"]
        with acc.accumulate(state["model"]):
            x, y = batch
            loss = nn.functional.cross_entropy(state["model"](x), y)
            acc.backward(loss)
            state["optimizer"].step()
            state["optimizer"].zero_grad()
        if acc.sync_gradients:
            state["global_step"] += 1
        return loss.detach()

    def save(state, path):
        acc = state["accelerator"]
        acc.save_state(path)
        if acc.is_main_process:
            torch.save({{"global_step": state["global_step"]}}, os.path.join(path, "step.pt"))
        acc.wait_for_everyone()

    def load(state, path):
        state["accelerator"].load_state(path)
        state["global_step"] = torch.load(os.path.join(path, "step.pt"))["global_step"]

    def resume(state, dataloader, resumed_step):
        skip = {skip} % len(dataloader)
        return state["accelerator"].skip_first_batches(dataloader, skip) if skip else dataloader

{fixtures}
"""
BOUNDARY = BOUNDARY.replace(
    "{fixtures}",
    role_fixtures(
        make_training="make",
        train_step="step",
        save_checkpoint="save",
        load_checkpoint="load",
        resume_dataloader="resume",
        checkpoint_every="2",
    )
    .replace("{", "{{")
    .replace("}", "}}"),
)


def test_a_save_at_the_ranks_epoch_end_resumed_on_a_new_shuffle_is_a_whole_epoch(project):
    # the amused false alarm: 2 steps of the new epoch against the uninterrupted ranks' 2 steps of another shuffle
    # were counted as examples trained twice and never seen
    project.conftest(BOUNDARY.format(skip='state["global_step"] * 2'))
    run = project.run("--dlcheck=D5", "-rA")
    run.assert_outcome("D5", "passed")
    text = _flat(run.text)
    assert "and saves after step 4 (optimizer step 2, where your loop checkpoints" in text, text
    assert "steps 5-6, past the end of each rank's epoch, start a new epoch in another order" in text, text
    assert (
        "drawn whole (steps 5-8: steps 7-8 without training them), is a whole epoch over the 2 ranks (16 examples"
        in text
    )
    assert "partly judged" not in text, text
    _no_leftover_process()


def test_a_skip_into_the_new_epoch_after_an_epoch_end_save_fails_on_the_ranks(project):
    # optimizer steps counted as batches: 2 of the new epoch's 4 batches skipped on each rank, then another epoch
    project.conftest(BOUNDARY.format(skip='state["global_step"]'))
    run = project.run("--dlcheck=D5")
    run.assert_outcome("D5", "failed")
    text = _flat(run.section("D5"))
    found = re.search(r"over the 2 ranks together, that new epoch: (\d+) examples twice, (\d+) never seen", text)
    assert found, text
    assert int(found.group(1)) > 0 and int(found.group(2)) > 0, text
    assert "the save is at the end of each rank's epoch: the resumed ranks start a new epoch, drawn whole" in text
    assert "does not give the ranks a whole epoch after the save" in text, text
    assert "optimizer steps x gradient_accumulation_steps, modulo len(dataloader)" in text, text
    _no_leftover_process()


#: a torchrun-style epoch loop that checkpoints at its epochs' ends (the DDP tutorial's save_every): rank 0 saves the
#: finished epoch; on load the loop resumes at the next epoch (correct) or at the saved one again (the off-by-one),
#: its DistributedSampler's set_epoch given the epoch it resumes at
EPOCHS = """
    import pytest, torch
    import torch.distributed as dist
    from torch import nn
    from torch.utils.data import DataLoader, DistributedSampler, TensorDataset

    torch.set_num_threads(1)
    DATA = TensorDataset(torch.randn(16, 4, generator=torch.Generator().manual_seed(0)), torch.arange(16) % 2)

    def make():
        model = nn.Linear(4, 2)
        dl = DataLoader(DATA, batch_size=2, sampler=DistributedSampler(DATA, shuffle=True, seed=0))
        return {{"model": model, "optimizer": torch.optim.SGD(model.parameters(), lr=0.1), "dataloader": dl,
                "epoch": 0, "it": 0}}

    def wrap(state):
        model = nn.parallel.DistributedDataParallel(state["model"])
        return dict(state, model=model, optimizer=torch.optim.SGD(model.parameters(), lr=0.1))

    def step(state, batch):
        if state["it"] == len(state["dataloader"]):
            state["epoch"] += 1
            state["it"] = 0
        x, y = batch
        loss = nn.functional.cross_entropy(state["model"](x), y)
        loss.backward()
        state["optimizer"].step()
        state["optimizer"].zero_grad()
        state["it"] += 1
        return loss.detach()

    def save(state, path):
        if dist.get_rank() == 0:
            torch.save({{"model": state["model"].module.state_dict(), "epoch": state["epoch"]}}, path)
        dist.barrier()

    def load(state, path):
        ckpt = torch.load(path)
        state["model"].module.load_state_dict(ckpt["model"])
        state["epoch"] = ckpt["epoch"]{plus}
        state["it"] = 0

    def resume(state, dataloader, resumed_step):
        dataloader.sampler.set_epoch(state["epoch"])
        return dataloader

{fixtures}
"""
EPOCHS = EPOCHS.replace(
    "{fixtures}",
    role_fixtures(
        make_training="make",
        dist_wrap="wrap",
        train_step="step",
        save_checkpoint="save",
        load_checkpoint="load",
        resume_dataloader="resume",
        start_epoch="lambda state, dataloader, epoch: dataloader.sampler.set_epoch(epoch)",
        checkpoint_every="'epoch'",
    )
    .replace("{", "{{")
    .replace("}", "}}"),
)


def test_an_epoch_end_saver_resuming_at_the_next_epoch_passes_on_the_ranks(project):
    project.conftest(EPOCHS.format(plus=" + 1"))
    run = project.run("--dlcheck=D5", "-rA")
    run.assert_outcome("D5", "passed")
    text = _flat(run.text)
    assert "saves after step 4 (the end of epoch 1, where your loop checkpoints" in text, text
    assert "the uninterrupted ranks' batches, step by step" in text, text
    _no_leftover_process()


def test_an_epoch_end_saver_resuming_the_saved_epoch_again_fails_on_the_ranks(project):
    # the order of the new epoch is not judged, but the saved epoch replayed in its order is the off-by-one resume
    project.conftest(EPOCHS.format(plus=""))
    run = project.run("--dlcheck=D5")
    run.assert_outcome("D5", "failed")
    text = _flat(run.section("D5"))
    assert "the resumed ranks train the saved epoch again, in its order: step 5 = step 1's batch" in text, text
    assert "does not start the epoch after the saved one" in text, text
    assert "checkpoint['epoch'] + 1" in text, text
    _no_leftover_process()
