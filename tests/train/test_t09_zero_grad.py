"""T9: gradients reset between optimizer steps, told apart from deliberate gradient accumulation."""

import tiny_train as tt

STEP = """
    @pytest.fixture(scope="session")
    def dlcheck_train_step():
        def step(state, batch, i):
            model, opt = state["model"], state["optimizer"]
            x, y = batch
            loss = nn.functional.cross_entropy(model(x), y) / {accum}
            loss.backward()
            if (i + 1) % {accum} == 0:
                opt.step()
                {zero}
            return loss.detach() * {accum}
        return step
"""


def test_a_step_without_zero_grad_fails(project):
    project.conftest(tt.loop_project(extra=STEP.format(accum=1, zero="pass  # zero_grad forgotten")))
    run = project.run("--dlcheck=T9")
    run.assert_outcome("T9", "failed")
    text = tt.section(run, "T9")
    # the verdict is in at the second step, which applies the first step's gradient again: no further step is spent
    assert (
        "2 calls of dlcheck_train_step made 2 optimizer step(s); after step 1, the next backward found .grad of "
        "'body.0.bias'" in text
    ), text
    assert "still holding exactly the gradient that step used, and nothing reset it before that optimizer's" in text
    assert "0 reset" in text
    assert "never zeroed between optimizer steps" in text and "zero_grad(set_to_none=True)" in text


def test_accumulation_that_forgets_to_zero_after_its_step_fails(project):
    project.conftest(tt.loop_project(extra=STEP.format(accum=2, zero="pass")))
    run = project.run("--dlcheck=T9")
    run.assert_outcome("T9", "failed")
    assert "4 calls of dlcheck_train_step made 2 optimizer step(s); after step 1" in tt.section(run, "T9")


def test_deliberate_accumulation_that_zeroes_after_each_step_passes(project):
    project.conftest(tt.loop_project(extra=STEP.format(accum=2, zero="opt.zero_grad(set_to_none=True)")))
    run = project.run("--dlcheck=T9", "-rA")
    run.assert_outcome("T9", "passed")
    run.fnmatch(
        [
            "*5 calls of dlcheck_train_step made 2 optimizer step(s); the backward after each of the first 2 found "
            "the watched gradients reset*"
        ]
    )


def test_a_reset_skipped_every_other_step_fails_at_the_second_step(project):
    """zero_grad under a condition that holds every other step: the first step's gradients are reset, the second's
    are not — the watch judges two steps before it stops."""
    project.conftest(tt.loop_project(extra=STEP.format(accum=1, zero="if i % 2 == 0: opt.zero_grad()")))
    run = project.run("--dlcheck=T9")
    run.assert_outcome("T9", "failed")
    text = tt.section(run, "T9")
    assert "3 calls of dlcheck_train_step made 3 optimizer step(s); after step 2, the next backward found" in text
    assert "still holding exactly the gradient that step used" in text


def test_zeroing_to_zeros_instead_of_none_passes(project):
    project.conftest(tt.loop_project(extra=STEP.format(accum=1, zero="opt.zero_grad(set_to_none=False)")))
    run = project.run("--dlcheck=T9")
    run.assert_outcome("T9", "passed")


def test_the_default_step_is_not_concerned(project):
    project.conftest(tt.loop_project())
    run = project.run("--dlcheck=T9", "-rs")
    run.assert_outcome("T9", "skipped")
    run.fnmatch(["*not applicable: no dlcheck_train_step: the default step zeroes the gradients itself*"])


GAN = """
    import pytest, torch
    from torch import nn
    from torch.utils.data import DataLoader, TensorDataset

    @pytest.fixture(scope="session")
    def dlcheck_make_training():
        def make():
            netD = nn.Sequential(nn.Linear(8, 16), nn.LeakyReLU(0.2), nn.Linear(16, 1), nn.Sigmoid())
            netG = nn.Sequential(nn.Linear(4, 16), nn.ReLU(), nn.Linear(16, 8), nn.Tanh())
            return {"model": netD, "optimizer": torch.optim.Adam(netD.parameters(), lr=2e-4, betas=(0.5, 0.999)),
                    "netG": netG, "optimizerG": torch.optim.Adam(netG.parameters(), lr=2e-4, betas=(0.5, 0.999))}
        return make

    @pytest.fixture(scope="session")
    def dlcheck_dataloader():
        g = torch.Generator().manual_seed(0)
        return DataLoader(TensorDataset(torch.rand(64, 8, generator=g) * 2 - 1), batch_size=16)

    @pytest.fixture(scope="session")
    def dlcheck_train_step():
        # pytorch/examples dcgan's iteration: (1) update D on real and detached fake, (2) update G through D
        def step(state, batch):
            netD, netG, optD, optG = state["model"], state["netG"], state["optimizer"], state["optimizerG"]
            real, = batch
            crit = nn.BCELoss()
            {zero_d}
            err_real = crit(netD(real).view(-1), torch.ones(len(real)))
            err_real.backward()
            fake = netG(torch.randn(len(real), 4))
            err_fake = crit(netD(fake.detach()).view(-1), torch.zeros(len(real)))
            err_fake.backward()
            optD.step()
            {zero_g}
            err_g = crit(netD(fake).view(-1), torch.ones(len(real)))   # adds to netD's .grad too, reset next time
            err_g.backward()
            optG.step()
            return err_real + err_fake + err_g
        return step
"""


def test_a_gan_whose_generator_loss_passes_through_the_discriminator_passes(project):
    """dcgan's G update backpropagates through D and leaves D's .grad non-zero after D's step; D's zero_grad at
    the top of the next iteration resets it before D's next step. Only a gradient that reaches the next step is
    stale, and the generator's optimizer is watched too."""
    project.conftest(GAN.replace("{zero_d}", "netD.zero_grad()").replace("{zero_g}", "netG.zero_grad()"))
    run = project.run("--dlcheck=T9", "-rA")
    run.assert_outcome("T9", "passed")
    run.fnmatch(["*calls of dlcheck_train_step made * optimizer step(s) of 2 optimizers; the backward after each*"])


def test_a_gan_that_never_resets_its_generator_fails_naming_it(project):
    project.conftest(GAN.replace("{zero_d}", "netD.zero_grad()").replace("{zero_g}", "pass"))
    run = project.run("--dlcheck=T9")
    run.assert_outcome("T9", "failed")
    text = tt.section(run, "T9")
    assert "after step 2, the next backward found .grad of 'netG.0.bias', 'netG.0.weight'" in text, text


def test_a_gan_that_never_resets_its_discriminator_fails(project):
    project.conftest(GAN.replace("{zero_d}", "pass").replace("{zero_g}", "netG.zero_grad()"))
    run = project.run("--dlcheck=T9")
    run.assert_outcome("T9", "failed")
    assert "after step 1, the next backward found .grad of '0.bias', '0.weight'" in tt.section(run, "T9")
