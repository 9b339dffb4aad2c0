"""One way to call the user's model on a batch: a forward that requires fields the batch does not hold
(a denoiser needs noisy latents and timesteps that the user's loss makes from the images) is no bug of
the user's: the checks that call the model on the batch say "not applicable" (T4 calls it on what the user's loss
hands it instead), the ones that need only a loss run through dlcheck_compute_loss, and without it the skip names
that fixture."""

DENOISER = """
    import pytest, torch
    from torch import nn
    from torch.utils.data import DataLoader

    class Denoiser(nn.Module):
        def __init__(self):
            super().__init__()
            self.net = nn.Sequential(nn.Linear(9, 32), nn.SiLU(), nn.Linear(32, 8))

        def forward(self, sample, timestep):
            t = timestep.float().reshape(-1, 1) / 1000
            return self.net(torch.cat([sample, t], dim=1))

    def batches():
        g = torch.Generator().manual_seed(0)
        rows = [{{"pixel_values": torch.randn(8, generator=g)}} for _ in range(32)]
        return DataLoader(rows, batch_size=8)

    @pytest.fixture(scope="session")
    def dlcheck_make_training():
        def make():
            model = Denoiser()
            return {{"model": model, "optimizer": torch.optim.AdamW(model.parameters(), lr=1e-3)}}
        return make

    @pytest.fixture(scope="session")
    def dlcheck_dataloader():
        return batches()
    {compute_loss}
"""

COMPUTE_LOSS = """
    @pytest.fixture(scope="session")
    def dlcheck_compute_loss():
        def loss(model, batch):
            x = batch["pixel_values"]
            noise = torch.randn_like(x)
            t = torch.randint(0, 1000, (x.shape[0],))
            a = (1 - t.float() / 1000).reshape(-1, 1)
            return torch.nn.functional.mse_loss(model(a.sqrt() * x + (1 - a).sqrt() * noise, t), noise)
        return loss
"""


def test_a_denoiser_is_called_by_the_users_loss_not_on_the_batch(project):
    project.conftest(DENOISER.format(compute_loss=COMPUTE_LOSS))
    run = project.run("--dlcheck=T3,T4,T5", "-rA")
    assert "internal error" not in run.text and "missing 1 required positional" not in run.text, run.text
    run.assert_outcome("T3", "passed")
    run.assert_outcome("T5", "passed")
    # T4 calls the denoiser on what dlcheck_compute_loss hands it (the noisy samples and the timesteps, learnt from
    # one call of the loss), never on the batch; the timesteps are said as not judged
    run.assert_outcome("T4", "passed")
    run.fnmatch(["*T4_batch_independence PASSED (*; partly judged: the other inputs not judged)*"])
    assert "Denoiser's input as dlcheck_compute_loss gives it: float32 (8, 8)" in run.text, run.text


def test_without_a_loss_the_skip_names_dlcheck_compute_loss(project):
    project.conftest(DENOISER.format(compute_loss=""))
    run = project.run("--dlcheck=T3", "-rs")
    run.assert_outcome("T3", "skipped")
    run.fnmatch(["*missing role: define fixture dlcheck_compute_loss (model, batch) -> loss: Denoiser does not take*"])
