"""T12 on an EMA wrapper that holds the online model as a submodule beside its averaged copy (the shape of
``EMA(model, beta=0.995, update_every=10)`` in lucidrains' ema_pytorch, written out here): the online
model's tensors move with training whether or not the EMA updates, so only ``ema_model`` is judged."""

import re

import tiny_train as tt

EMA_WRAPPER_LOOP = """
    import copy, pytest, torch, tiny_train as tt
    from torch import nn

    class EMA(nn.Module):
        # online model kept as a submodule (include_online_model=True), its averaged copy as ema_model
        def __init__(self, model, beta=0.995, update_after_step={after}, update_every={every}):
            super().__init__()
            self.beta, self.update_after_step, self.update_every = beta, update_after_step, update_every
            self.online_model = model
            self.ema_model = copy.deepcopy(model).requires_grad_(False)
            self.register_buffer("initted", torch.tensor(False))
            self.register_buffer("step", torch.tensor(0))

        @torch.no_grad()
        def update(self):
            step = int(self.step)
            self.step += 1
            if step % self.update_every:
                return
            if step <= self.update_after_step or not bool(self.initted):
                for e, o in zip(self.ema_model.parameters(), self.online_model.parameters()):
                    e.copy_(o)
                self.initted.fill_(step > self.update_after_step)
                return
            for e, o in zip(self.ema_model.parameters(), self.online_model.parameters()):
                e.lerp_(o, 1 - self.beta)

    @pytest.fixture(scope="session")
    def dlcheck_make_training():
        def make():
            model = tt.MLP()
            optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2)
            return {{"model": model, "optimizer": optimizer, "ema": EMA(model)}}
        return make

    @pytest.fixture(scope="session")
    def dlcheck_dataloader():
        return tt.loader()

    @pytest.fixture(scope="session")
    def dlcheck_train_step():
        def step(state, batch):
            model, opt, ema = state["model"], state["optimizer"], state["ema"]
            x, y = batch
            loss = nn.functional.cross_entropy(model(x), y)
            loss.backward()
            opt.step()
            opt.zero_grad(set_to_none=True)
            {update}
            return loss.detach()
        return step
"""


def project_with(update="ema.update()", after=0, every=1):
    return EMA_WRAPPER_LOOP.format(update=update, after=after, every=every)


def test_wrapper_whose_update_is_never_called_fails(project):
    """The online model (4 tensors) trains; the averaged copy never moves: the 8 tensors of the wrapper
    must not read as an EMA that moved."""
    project.conftest(project_with(update="pass  # ema.update() forgotten"))
    run = project.run("--dlcheck=T12")
    run.assert_outcome("T12", "failed")
    text = tt.section(run, "T12")
    assert "its online_model shared with the trained model, 4 tensors, left out" in text
    assert "still holds exactly its initial weights: all 4 tensors equal the fresh state's, bit for bit" in text
    assert "the training loop never updates the EMA" in text
    assert "call ema.update() right after each optimizer.step()" in text


def test_wrapper_updated_each_step_passes(project):
    project.conftest(project_with())
    run = project.run("--dlcheck=T12", "-rA")
    run.assert_outcome("T12", "passed")
    assert re.search(
        r"its online_model shared with the trained model, 4 tensors, left out[^\n]*moved with it: 4 of 4 "
        r"tensors changed",
        run.text,
    )


def test_wrapper_with_its_defaults_updated_every_step_passes(project):
    """update_every=10 after a warm-up of 100 steps: within the 20-step smoke run, the calls at its steps 0
    and 10 copy the online model into ema_model (ema_pytorch's warm-up), which moves it."""
    project.conftest(project_with(after=100, every=10))
    run = project.run("--dlcheck=T12", "-rA")
    run.assert_outcome("T12", "passed")


def test_an_ema_that_only_holds_the_trained_model_fails(project):
    """A wrapper without a copy of its own (all its tensors the model's) is the model itself."""
    conftest = project_with().replace(
        "self.ema_model = copy.deepcopy(model).requires_grad_(False)", "self.ema_model = model"
    )
    project.conftest(conftest)
    run = project.run("--dlcheck=T12")
    run.assert_outcome("T12", "failed")
    text = tt.section(run, "T12")
    assert "all 4 parameter tensors of the EMA state['ema']" in text
    assert "the EMA is the trained model itself" in text
