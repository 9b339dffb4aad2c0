"""A plain loop whose model is called on something the step makes, not on the batch (pytorch/examples dcgan, found
blind, set 13): dlcheck_make_training's "model" is the generator netG, and dlcheck_train_step calls netG(noise) and
netD(images) on (images, labels) batches. T4 called netG on the images (an internal error) and V3 did too (blaming
the role for an input the pipeline never produces). The checks now learn how the pipeline calls the model from one
call of its own step: T4 judges the generator on the noise the step hands it, V3 reads no class ids from it."""

import re

import pytest
import tiny_train as tt
import torchvision  # noqa: F401  (imported once, outside pytester's in-process runs)

GAN = """
    import pytest, torch
    from torch import nn

    NZ = 4
    CALLS = []  # the calls of the user's step

    @pytest.fixture(scope="session", autouse=True)
    def _count():
        yield
        print(f"STEP CALLS {{len(CALLS)}}")

    class Mix(nn.Module):  # a batch-mixing layer: every example sees the batch's mean
        def forward(self, x):
            return x + x.mean(0, keepdim=True)

    class Generator(nn.Module):
        def __init__(self, mix=False):
            super().__init__()
            self.main = nn.Sequential(
                nn.ConvTranspose2d(NZ, 8, 4, 1, 0, bias=False), nn.BatchNorm2d(8), nn.ReLU(True),
                *([Mix()] if mix else []),
                nn.ConvTranspose2d(8, 3, 4, 2, 1, bias=False), nn.Tanh(),
            )

        def forward(self, input):
            return self.main(input)

    class Discriminator(nn.Module):
        def __init__(self):
            super().__init__()
            self.main = nn.Sequential(
                nn.Conv2d(3, 8, 4, 2, 1, bias=False), nn.LeakyReLU(0.2, inplace=True),
                nn.Conv2d(8, 1, 4, 1, 0, bias=False), nn.Sigmoid(),
            )

        def forward(self, input):
            return self.main(input).view(-1, 1).squeeze(1)

    @pytest.fixture(scope="session")
    def dlcheck_dataloader():
        g = torch.Generator().manual_seed(0)
        images = torch.rand(16, 3, 8, 8, generator=g) * 2 - 1
        labels = torch.zeros(16, dtype=torch.long)  # an image folder of one class
        return torch.utils.data.DataLoader(torch.utils.data.TensorDataset(images, labels), batch_size=4)

    @pytest.fixture(scope="session")
    def dlcheck_make_training():
        def make():
            netG, netD = Generator(mix={mix}), Discriminator()
            return {{
                "model": netG,
                "netD": netD,
                "optimizer": torch.optim.Adam(netG.parameters(), lr=2e-4, betas=(0.5, 0.999)),
                "optimizerD": torch.optim.Adam(netD.parameters(), lr=2e-4, betas=(0.5, 0.999)),
            }}
        return make

    @pytest.fixture(scope="session")
    def dlcheck_train_step():
        criterion = nn.BCELoss()

        def step(state, batch):
            CALLS.append(1)
            netG, netD = state["model"], state["netD"]
            real = batch[0]
            b = real.size(0)
            netD.zero_grad()
            err_real = criterion(netD(real), torch.ones(b))
            err_real.backward()
            fake = netG(torch.randn(b, NZ, 1, 1))
            err_fake = criterion(netD(fake.detach()), torch.zeros(b))
            err_fake.backward()
            state["optimizerD"].step()
            netG.zero_grad()
            err_g = criterion(netD(fake), torch.ones(b))
            err_g.backward()
            state["optimizer"].step()
            return err_real + err_fake + err_g
        return step
"""


def test_a_generator_mixing_the_noise_batch_fails(project):
    project.conftest(GAN.format(mix=True))
    run = project.run("--dlcheck=T4")
    run.assert_outcome("T4", "failed")
    text = tt.section(run, "T4")
    assert "the output of example 0 depends on the input of example" in text
    assert "Generator's input as dlcheck_train_step gives it: float32 (4, 4, 1, 1)" in text
    assert "the first module whose output mixes the examples: main.3 (Mix)" in text
    assert "internal error" not in run.text


def test_the_dcgan_loop_passes_t4_on_the_noise_and_v3_is_not_applicable(project):
    project.conftest(GAN.format(mix=False))
    run = project.run("--dlcheck=T4,V3", "-rA")
    run.assert_outcome("T4", "passed")
    run.fnmatch(["*Generator's input as dlcheck_train_step gives it: float32 (4, 4, 1, 1)*"])
    run.assert_outcome("V3", "skipped")
    skip = re.search(r"^SKIPPED \[\d+\] conftest\.py::V3_boxes_labels: (.*)$", run.text, re.M)
    assert skip and skip.group(1).startswith("not applicable: "), run.text
    assert "dlcheck_train_step calls Generator on float32 (4, 4, 1, 1), not on the batch" in skip.group(1), run.text
    assert "internal error" not in run.text and "raised" not in run.text


@pytest.mark.parametrize("mix", [False, True])
def test_the_capture_costs_one_step_per_session(project, mix):
    """T4 and V3 share one call of the user's step to learn how the pipeline calls the model."""
    project.conftest(GAN.format(mix=mix))
    run = project.run("--dlcheck=T4,V3", "-s")
    assert "STEP CALLS 1" in run.text, run.text
