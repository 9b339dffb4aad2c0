"""A hand-written loop through Hugging Face Accelerate (the diffusers and most LLM fine-tuning scripts):
objects from ``accelerator.prepare``, ``with accelerator.accumulate(model)``, ``accelerator.backward``,
``clip_grad_norm_`` when ``sync_gradients``. The train and smoke checks see the optimizer and scheduler
inside Accelerate's wrappers, which step them only at the end of an accumulation."""

PROJECT = """
    import pytest, torch
    from torch import nn
    from torch.nn import functional as F
    from torch.utils.data import DataLoader, TensorDataset
    from accelerate import Accelerator

    def data():
        g = torch.Generator().manual_seed(0)
        y = torch.randint(0, 3, (64,), generator=g)
        x = torch.tensor([[2.0, 0.0], [-2.0, 0.0], [0.0, 2.0]])[y] + 0.3 * torch.randn(64, 2, generator=g)
        return TensorDataset(x, y)

    @pytest.fixture(scope="session")
    def dlcheck_make_training():
        def make():
            acc = Accelerator(cpu=True, gradient_accumulation_steps=2)
            model = nn.Sequential(nn.Linear(2, 16), nn.Tanh(), nn.Linear(16, 3))
            opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
            sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: min(1.0, (s + 1) / 3))
            loader = DataLoader(data(), batch_size=8, shuffle=True)
            model, opt, loader, sched = acc.prepare(model, opt, loader, sched)
            return {"model": model, "optimizer": opt, "lr_scheduler": sched, "accelerator": acc}
        return make

    @pytest.fixture(scope="session")
    def dlcheck_dataloader():
        return DataLoader(data(), batch_size=8, shuffle=True)

    @pytest.fixture(scope="session")
    def dlcheck_train_step():
        def step(state, batch):
            acc, model, opt, sched = state["accelerator"], state["model"], state["optimizer"], state["lr_scheduler"]
            x, y = batch
            with acc.accumulate(model):
                loss = F.cross_entropy(model(x), y)
                acc.backward(loss)
                if acc.sync_gradients:
                    acc.clip_grad_norm_(model.parameters(), 1.0)
                opt.step()
                sched.step()
                opt.zero_grad()
            return loss
        return step

    @pytest.fixture(scope="session")
    def dlcheck_loss_fn():
        return nn.CrossEntropyLoss()
"""


def test_prepared_optimizer_and_scheduler_are_understood(project):
    project.conftest(PROJECT)
    run = project.run("--dlcheck=T1,T2,T3,T5,T6,S1,S2,S3", "-rA")
    assert "internal error" not in run.text, run.text
    for cid in ("T1", "T2", "T3", "T5", "T6", "S1", "S2", "S3"):
        run.assert_outcome(cid, "passed")
