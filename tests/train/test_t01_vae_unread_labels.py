"""T1, V3, V6 on a plain-loop VAE in small, as pytorch/examples' vae/main.py writes it: (images, digit) batches whose
digit the loop never reads (``for data, _ in loader``), a summed reconstruction BCE + KLD, and a forward that draws
its reparameterisation noise (``torch.randn_like``) in eval mode too. The loss is the same, to the bit, with the
labels shuffled among the examples when both are computed from the same random state: no classes (the 64-pixel
output is no row of 64 class scores), so T1, V3 and V6 are not applicable, and none asks for a role. The twin, a
classifier with the same noise in its forward and a summed cross-entropy over the digits, is still judged (found
blind in set 9: T1 read the VAE's 784 pixels as 784 classes and failed, V3 passed on "num_classes 784", V6 asked for
dlcheck_loss_fn)."""

import tiny_train as tt

PROJECT = """
    import pytest, torch
    from torch import nn
    from torch.nn import functional as F

    torch.manual_seed(0)
    g = torch.Generator().manual_seed(0)
    IMAGES = (torch.rand(64, 1, 8, 8, generator=g) > 0.6).float()   # binary 8x8 images in [0, 1]
    DIGITS = torch.randint(0, 10, (64,), generator=g)                # labels the VAE's loop never reads
    LOADER = torch.utils.data.DataLoader(torch.utils.data.TensorDataset(IMAGES, DIGITS), batch_size=16, shuffle=True,
                                         generator=torch.Generator().manual_seed(0))


    class VAE(nn.Module):
        def __init__(self):
            super().__init__()
            self.fc1 = nn.Linear(64, 32)
            self.fc21 = nn.Linear(32, 4)
            self.fc22 = nn.Linear(32, 4)
            self.fc3 = nn.Linear(4, 32)
            self.fc4 = nn.Linear(32, 64)

        def forward(self, x):
            h = F.relu(self.fc1(x.view(-1, 64)))
            mu, logvar = self.fc21(h), self.fc22(h)
            z = mu + torch.randn_like(mu) * torch.exp(0.5 * logvar)   # sampled in eval mode too
            return torch.sigmoid(self.fc4(F.relu(self.fc3(z)))), mu, logvar


    class NoisyClassifier(nn.Module):
        def __init__(self):
            super().__init__()
            self.fc1 = nn.Linear(64, 32)
            self.head = nn.Linear(32, 10)

        def forward(self, x):
            h = F.relu(self.fc1(x.view(-1, 64)))
            return self.head(h + 0.1 * torch.randn_like(h))           # noise in eval mode too


    def vae_loss(model, batch):
        data, _ = batch
        recon, mu, logvar = model(data)
        bce = F.binary_cross_entropy(recon, data.view(-1, 64), reduction="sum")
        kld = -0.5 * torch.sum(1 + logvar - mu.pow(2) - logvar.exp())
        return bce + kld


    def classifier_loss(model, batch):
        data, digits = batch
        return F.cross_entropy(model(data), digits, reduction="sum")


    @pytest.fixture(scope="session")
    def dlcheck_make_training():
        def make():
            model = {model}()
            return {{"model": model, "optimizer": torch.optim.Adam(model.parameters(), lr=1e-3)}}
        return make


    @pytest.fixture(scope="session")
    def dlcheck_model():
        return {model}()


    @pytest.fixture(scope="session")
    def dlcheck_dataloader():
        return LOADER


    @pytest.fixture(scope="session")
    def dlcheck_compute_loss():
        return {loss}


    @pytest.fixture(scope="session")
    def dlcheck_train_step():
        def step(state, batch):
            state["optimizer"].zero_grad()
            loss = {loss}(state["model"], batch)
            loss.backward()
            state["optimizer"].step()
            return loss
        return step
"""


def test_a_vae_whose_loss_ignores_the_labels_is_no_classifier(project):
    project.conftest(PROJECT.format(model="VAE", loss="vae_loss"))
    run = project.run("--dlcheck=T1,V3,V6", "-rs")
    for cid in ("T1", "V3", "V6"):
        run.assert_outcome(cid, "skipped")
    unread = (
        "the training's loss (*) does not read the batch's labels (int64 (16,)): it is * with them and the same, to "
        "the bit, with them shuffled among the batch's examples (both from the same seeded random state)"
    )
    run.fnmatch(
        [
            f"*V3_*: not applicable: V3 judges class ids against the model's head; {unread}",
            f"*V6_*: not applicable: V6 judges the class balance the loss trains on; {unread}",
            f"*T1_*: not applicable: {unread}: not a cross-entropy over classes, ln(classes) does not apply",
        ]
    )
    assert "missing role" not in run.text and "dlcheck_loss_fn" not in run.text
    assert "784" not in run.text and "ln(64)" not in run.text


def test_a_classifier_with_the_same_noise_and_a_summed_loss_still_fails(project):
    project.conftest(PROJECT.format(model="NoisyClassifier", loss="classifier_loss"))
    run = project.run("--dlcheck=T1,V3", "-rA")
    run.assert_outcome("T1", "failed")
    text = tt.section(run, "T1")
    assert "x ln(10)" in text and "summed over the batch" in text and "reduction='mean'" in text
    run.assert_outcome("V3", "passed")
    run.fnmatch(["*V3_*PASSED*labels*0..9*"])
