"""T6 on a plain loop that writes its learning rate into the param groups by hand (a warmup computed from the
step counter, no LR scheduler object, as nanoGPT-style loops do): only that the LR is not 0 is judged, so the pass
is partly judged and names the schedule's units and warmup; a constant LR with no scheduler has no schedule to
judge and passes whole; a hand-set LR of 0 still fails."""

import tiny_train as tt  # noqa: F401  (the tests' tiny builders, imported by the project below)

LOOP = """
    import pytest, torch
    from torch.nn import functional as F
    from torch.utils.data import DataLoader
    import tiny_train as tt

    def loader():
        return DataLoader(tt.blobs(64), batch_size=8, shuffle=True, generator=torch.Generator().manual_seed(0))

    @pytest.fixture(scope="session")
    def dlcheck_make_training():
        def make():
            torch.manual_seed(0)
            model = tt.MLP()
            return {{"model": model, "optimizer": torch.optim.AdamW(model.parameters(), lr=1e-2), "step": 0}}
        return make

    @pytest.fixture(scope="session")
    def dlcheck_dataloader():
        return loader()

    @pytest.fixture(scope="session")
    def dlcheck_train_step():
        def step(state, batch):
            for group in state["optimizer"].param_groups:
                group["lr"] = {lr}
            x, y = batch
            loss = F.cross_entropy(state["model"](x), y)
            loss.backward()
            state["optimizer"].step()
            state["optimizer"].zero_grad()
            state["step"] += 1
            return loss.detach()
        return step
"""

WARMUP = "1e-2 * min(1.0, (state['step'] + 1) / 100)"


def test_a_hand_set_warmup_is_a_partly_judged_pass(project):
    project.conftest(LOOP.format(lr=WARMUP))
    run = project.run("--dlcheck=T6", "-rA")
    run.assert_outcome("T6", "passed")
    run.fnmatch(["*T6_lr_schedule PASSED (*; partly judged: the schedule's units and warmup not judged)*"])
    assert "with no LR scheduler object in the training" in run.text, run.text


def test_a_constant_lr_without_a_scheduler_passes_whole(project):
    project.conftest(LOOP.format(lr="1e-2"))
    run = project.run("--dlcheck=T6", "-rA")
    run.assert_outcome("T6", "passed")
    assert "partly judged" not in run.text, run.text


def test_a_hand_set_lr_of_zero_still_fails(project):
    project.conftest(LOOP.format(lr="0.0"))
    run = project.run("--dlcheck=T6")
    run.assert_outcome("T6", "failed")
    assert "the learning rate is 0 at all" in run.text, run.text
