"""C10 under a gradient accumulation longer than its micro-steps (found blind, set 15: diffusers'
examples/vqgan/train_vqgan.py, README settings: batch 2, gradient_accumulation_steps=8). C10 trained its 4
micro-steps, made no optimizer step and skipped ("raise C10.micro_steps above your gradient accumulation"), while
C1 lengthened its own runs until the accumulation stepped and found the resumed epoch restarting. C10 now
lengthens its run the way C1 does (doubled, bounded), reaches its save point and judges the same resume: the
epoch restarted after accelerator.load_state fails both checks; its twin that skips the trained batches on a
seedable shuffle passes both. Real Accelerate, a tiny linear classifier."""

import re
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "train"))
import tiny_train as tt  # noqa: E402

PROJECT = """
    import os
    import pytest, torch
    from torch import nn
    from torch.utils.data import DataLoader, TensorDataset
    from accelerate import Accelerator
    from accelerate.utils import DataLoaderConfiguration

    torch.set_num_threads(1)
    # 48 examples, 2 a batch: an epoch of 24 micro-steps, 3 optimizer steps of 8 micro-batches
    DATA = TensorDataset(torch.randn(48, 4, generator=torch.Generator().manual_seed(0)), torch.arange(48) % 2)

    def make():
        acc = Accelerator(
            cpu=True,
            gradient_accumulation_steps=8,
            dataloader_config=DataLoaderConfiguration(use_seedable_sampler={seedable}),
        )
        model = nn.Linear(4, 2)
        opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
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
        return loss

    def save(state, path):
        state["accelerator"].save_state(path)
        torch.save({{"step": state["step"]}}, os.path.join(path, "step.pt"))

    def load(state, path):
        state["accelerator"].load_state(path)
        state["step"] = torch.load(os.path.join(path, "step.pt"))["step"]

    @pytest.fixture(scope="session")
    def dlcheck_make_training():
        return make

    @pytest.fixture(scope="session")
    def dlcheck_dataloader():
        return DataLoader(DATA, batch_size=2, shuffle=True)

    @pytest.fixture(scope="session")
    def dlcheck_train_step():
        return step

    @pytest.fixture(scope="session")
    def dlcheck_save_checkpoint():
        return save

    @pytest.fixture(scope="session")
    def dlcheck_load_checkpoint():
        return load

    @pytest.fixture(scope="session")
    def dlcheck_resume_dataloader():
        return {resume}
"""

#: the epoch loop after the resume: from the loader's first batch again (the vqgan script), or skipping the
#: micro-steps trained before the save on the same (seedable) shuffle (run_clm_no_trainer.py)
RESTARTS = "lambda state, dataloader, resumed_step: dataloader"
SKIPS = "lambda state, dataloader, resumed_step: state['accelerator'].skip_first_batches(dataloader, resumed_step)"

COUNTS = re.compile(r"(\d+) examples trained twice, (\d+) never seen in the resumed epoch")


def test_c10_under_an_accumulation_of_8_fails_a_restarted_epoch_like_c1(project):
    project.conftest(PROJECT.format(seedable=False, resume=RESTARTS))
    run = project.run("--dlcheck=C1,C10")
    for cid in ("C1", "C10"):
        run.assert_outcome(cid, "failed")
        text = " ".join(tt.section(run, cid).split())
        assert "no optimizer step in 4 micro-steps" not in text, text
        found = COUNTS.search(text)
        assert found and int(found.group(1)) > 0 and int(found.group(2)) > 0, text
        assert "does not restore the data position" in text, text
        assert "use_seedable_sampler=True" in text, text


def test_c10_under_an_accumulation_of_8_passes_a_resume_that_skips_on_the_same_shuffle(project):
    project.conftest(PROJECT.format(seedable=True, resume=SKIPS))
    run = project.run("--dlcheck=C1,C10", "-rA")
    run.assert_outcome("C1", "passed")
    run.assert_outcome("C10", "passed")
    text = " ".join(run.text.split())
    assert "no optimizer step in 4 micro-steps" not in text, text
    assert "none trained twice, none lost" in text, text
    # C10's round trip was lengthened past one accumulation: at least 8 micro-steps, at least one optimizer step
    trained = re.search(r"fresh objects trained (\d+) micro-steps \((\d+) optimizer steps?", text)
    assert trained and int(trained.group(1)) >= 8 and int(trained.group(2)) >= 1, text
    assert "C10.micro_steps = 4 doubled while your gradient accumulation left no optimizer step in them" in text


def test_c10_lengthening_is_bounded_and_said(project):
    """An accumulation longer than the bound (64 micro-steps, C1's): C10 skips, saying how far it trained."""
    source = PROJECT.format(seedable=True, resume=SKIPS).replace(
        "gradient_accumulation_steps=8", "gradient_accumulation_steps=200"
    )
    project.conftest(source)
    run = project.run("--dlcheck=C10", "-rs", "--dlcheck-set", "C10.micro_steps=2")
    run.assert_outcome("C10", "skipped")
    assert "no optimizer step in 64 micro-steps" in run.text, run.text
