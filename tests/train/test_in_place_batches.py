"""User code that changes its batch in place, and a factory that shares a frozen module between its results.

Found blind (set 14, pytorch/examples fast_neural_style): the loss normalises the images with
``batch.div_(255.0)``, in place, harmless in the script (each batch is used once). The plugin handed the same
cached batch tensors to every call (T2's steps on batch 0, the smoke run, T3...), so batch 0 was divided by 255
again and again down to a constant image: T3 then failed "exactly zero gradient... never train" (InstanceNorm of a
constant image is 0), and C1/C3 called the run "not reproducible". A pipeline hands each call a batch of its own:
so does the plugin now, a copy of the batch's tensors in the batch's own container.

The same project's first conftest returned ONE frozen VGG (built once) in every ``make_training()`` result; the
smoke run's memory release emptied that module's weights in place and every later run crashed inside the user's
step. Only what is fresh to a call of the factory is released; a module shared between its results is the user's
and is left as it was."""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from helpers import role_fixtures  # noqa: E402

CONFTEST = """
    import os, pytest, torch
    from torch import nn

    torch.set_num_threads(1)

    class TransformerNet(nn.Module):  # image to image, InstanceNorm as fast_neural_style's
        def __init__(self):
            super().__init__()
            self.pad = nn.ReflectionPad2d(1)  # upstream's ConvLayer pads first (the conv never sees x itself)
            self.conv1 = nn.Conv2d(3, 6, 3)
            self.in1 = nn.InstanceNorm2d(6, affine=True)
            self.conv2 = nn.Conv2d(6, 3, 3, padding=1)
            {unused}

        def forward(self, x):
            return self.conv2(torch.relu(self.in1(self.conv1(self.pad(x)))))

    class Features(nn.Module):  # the frozen feature extractor of the perceptual loss
        def __init__(self):
            super().__init__()
            self.conv = nn.Conv2d(3, 5, 3, padding=1)
            for p in self.parameters():
                p.requires_grad_(False)

        def forward(self, x):
            return torch.relu(self.conv(x))

    def normalize_batch(batch):  # upstream's utils.normalize_batch: divides its argument in place
        mean = batch.new_tensor([0.485, 0.456, 0.406]).view(-1, 1, 1)
        std = batch.new_tensor([0.229, 0.224, 0.225]).view(-1, 1, 1)
        batch = batch.div_(255.0)
        return (batch - mean) / std

    g = torch.Generator().manual_seed(0)
    IMAGES = torch.randint(0, 256, (16, 3, 8, 8), generator=g).float()
    LOADER = torch.utils.data.DataLoader(
        torch.utils.data.TensorDataset(IMAGES, torch.zeros(16, dtype=torch.long)), batch_size=4
    )
    SHARED = Features()
    SHARED_START = {{k: v.clone() for k, v in SHARED.state_dict().items()}}

    def perceptual(model, features, x):
        # the loader gives images in [0, 255]: a batch an earlier call divided in place is none the pipeline makes
        if x.max() <= 1.0:
            raise ValueError(f"handed a batch already divided in place (max {{float(x.max()):.3g}})")
        y = normalize_batch(model(x))
        x = normalize_batch(x)
        return nn.functional.mse_loss(features(y), features(x)) + 1e-3 * nn.functional.mse_loss(y, x)

    def make():
        model = TransformerNet()
        return {{"model": model, "optimizer": torch.optim.Adam(model.parameters(), 1e-2),
                "features": {features}}}

    def step(state, batch):
        x, _ = batch
        state["optimizer"].zero_grad()
        loss = perceptual(state["model"], state["features"], x)
        loss.backward()
        state["optimizer"].step()
        return loss

    def compute_loss(model, batch):
        x, _ = batch
        return perceptual(model, SHARED, x)

    def save(state, path):
        os.makedirs(path, exist_ok=True)
        torch.save({{"model": state["model"].state_dict(), "optimizer": state["optimizer"].state_dict()}},
                   f"{{path}}/ckpt.pt")

    def load(state, path):
        got = torch.load(f"{{path}}/ckpt.pt")
        state["model"].load_state_dict(got["model"])
        state["optimizer"].load_state_dict(got["optimizer"])

    def pytest_sessionfinish(session):
        now = SHARED.state_dict()
        kept = all(now[k].shape == v.shape and torch.equal(now[k], v) for k, v in SHARED_START.items())
        kept = kept and all(not p.requires_grad and p.grad is None for p in SHARED.parameters())
        (session.config.rootpath / "shared_module.txt").write_text("kept" if kept else "changed")

{fixtures}
"""

CONFTEST = CONFTEST.replace(
    "{fixtures}",
    role_fixtures(
        make_training="make",
        dataloader="LOADER",
        train_step="step",
        compute_loss="compute_loss",
        save_checkpoint="save",
        load_checkpoint="load",
    ),
)


def style(unused: bool = False, shared: bool = False) -> str:
    return CONFTEST.format(
        unused="self.unused = nn.Linear(3, 3)  # never called" if unused else "",
        features="SHARED" if shared else "Features()",
    )


def errors(run) -> list[str]:
    """The summary's error line (a role that raised, an internal error), if any."""
    return [line for line in run.text.splitlines() if line.startswith("error:")]


def flat(run) -> str:
    return " ".join(run.text.split())


def test_a_loss_that_divides_its_batch_in_place_is_judged_on_the_pipeline_s_batches(project):
    project.conftest(style())
    run = project.run("--dlcheck=T2,T3,C1,C3", "-rA")
    text = flat(run)
    assert not errors(run), run.text
    run.assert_outcome("T3", "passed")
    assert "not reproducible" not in text, text
    run.assert_outcome("C1", "passed")
    assert "nondeterministic" not in text, text
    assert run.outcome("T2") in ("passed", "skipped")
    assert "exactly zero gradient" not in text, text


def test_a_parameter_nothing_uses_still_fails_t3_under_an_in_place_loss(project):
    project.conftest(style(unused=True))
    run = project.run("--dlcheck=T2,T3")
    run.assert_outcome("T3", "failed")
    section = " ".join(run.section("T3").split())
    assert "unused.weight" in section and "unused.bias" in section, section
    assert "conv1.weight" not in section and "in1.weight" not in section, section


def test_a_frozen_module_shared_by_every_training_state_is_left_as_it_was(project):
    project.conftest(style(shared=True))
    run = project.run("--dlcheck=train,smoke,ckpt", "-rA")
    assert not errors(run), run.text
    assert "weight should have" not in run.text and "internal error" not in run.text.lower(), run.text
    assert (project.pytester.path / "shared_module.txt").read_text() == "kept", run.text
    # the smoke run first, on the factory's first result (no other result to compare with yet): the same
    run = project.run("--dlcheck=S1,C1,T9")
    assert not errors(run), run.text
    assert (project.pytester.path / "shared_module.txt").read_text() == "kept", run.text


def test_each_call_gets_its_own_tensors_in_the_batch_s_own_containers():
    import dataclasses
    from typing import NamedTuple

    import torch
    from transformers import BatchEncoding

    from pytest_dlcheck.training.runs import own_batch

    class Pair(NamedTuple):
        x: torch.Tensor
        y: torch.Tensor

    @dataclasses.dataclass
    class Batch:
        x: torch.Tensor
        name: str

    x, y = torch.ones(2, 3), torch.tensor([0, 1])
    for batch in (
        (x, y),
        [x, y],
        {"x": x, "y": y},
        BatchEncoding({"x": x, "y": y}),
        Pair(x, y),
        Batch(x, "b"),
    ):
        got = own_batch(batch)
        assert type(got) is type(batch)
        inner = got.x if isinstance(got, (Pair, Batch)) else got["x"] if not isinstance(got, (list, tuple)) else got[0]
        assert inner is not x and torch.equal(inner, x)
        inner.div_(255.0)  # what a normalisation in place does to the copy
    assert torch.equal(x, torch.ones(2, 3))
    # a check's leaf input still receives its gradient through the copy
    leaf = torch.ones(2, 3, requires_grad=True)
    (own_batch((leaf, y))[0].div_(2.0).sum()).backward()
    assert torch.equal(leaf.grad, torch.full((2, 3), 0.5))
