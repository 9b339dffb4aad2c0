"""T5 on a loop that trains under autocast with a GradScaler (found blind on a self-supervised ViT loop): at the
scaler's starting scale (2**16) the first backwards overflow by design; the scaler finds the Inf, skips the optimizer
step and lowers its scale. Those gradients are still scaled and never applied: T5 judges the gradients as the
optimizer applies them (after unscaling, at the steps taken). Its buggy twins still fail: a NaN in the forward, a
gradient that is non-finite at every scale (the scaler skips every step), a scaled gradient stepped past the
scaler's skip, and a loop without a scaler whose gradients overflow."""

import pytest
import tiny_train as tt

PROJECT = """
    import pytest, torch, tiny_train as tt
    from torch import nn
    from torch.utils.data import DataLoader

    SCALER = torch.amp.GradScaler("cpu", init_scale=2.0**16)

    @pytest.fixture(scope="session")
    def dlcheck_make_training():
        def make():
            model = tt.MLP()
            opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
            return {{"model": model, "optimizer": opt, "scaler": torch.amp.GradScaler("cpu", init_scale=2.0**16)}}
        return make

    @pytest.fixture(scope="session")
    def dlcheck_dataloader():
        data = tt.blobs()
        return DataLoader([{{"image": x, "label": y}} for x, y in zip(*data.tensors)], batch_size=8)

    @pytest.fixture(scope="session")
    def dlcheck_train_step():
        def step(state, batch):
            model, opt, scaler = state["model"], state["optimizer"], {scaler}
            with torch.autocast("cpu", dtype=torch.{dtype}):
                out = model(batch["image"])
                loss = nn.functional.cross_entropy(out.float(), batch["label"], reduction="sum")
            {extra}
            {backward}
            scaler.unscale_(opt)
            torch.nn.utils.clip_grad_norm_(model.parameters(), 3.0)
            {opt_step}
            scaler.update()
            opt.zero_grad()
            return loss.detach()
        return step
"""


def project_text(
    dtype="float16",
    scaler='state["scaler"]',
    extra="",
    backward="scaler.scale(loss).backward()",
    opt_step="scaler.step(opt)",
):
    return PROJECT.format(dtype=dtype, scaler=scaler, extra=extra, backward=backward, opt_step=opt_step)


@pytest.mark.parametrize("scaler", ['state["scaler"]', "SCALER"], ids=["in_the_state", "called_by_the_step"])
def test_the_scalers_designed_overflow_passes(project, scaler):
    project.conftest(project_text(scaler=scaler))
    run = project.run("--dlcheck=T5,S1", "-rA")
    run.assert_outcome("T5", "passed")
    run.assert_outcome("S1", "passed")  # S1 reads the gradients at the optimizer's steps taken
    text = " ".join(run.text.split())
    assert "whose scaled gradients overflowed" in text and "skips their optimizer step" in text, text
    assert "at every optimizer step taken" in text, text


def test_bfloat16_autocast_with_a_scaler_passes(project):
    project.conftest(project_text(dtype="bfloat16"))
    run = project.run("--dlcheck=T5", "-rA")
    run.assert_outcome("T5", "passed")


def test_a_nan_in_the_forward_under_the_scaler_still_fails(project):
    # log of a negative: the forward itself is NaN, unscaled
    project.conftest(project_text(extra="loss = loss + torch.log(out.float() - 1e3).mean()"))
    run = project.run("--dlcheck=T5")
    run.assert_outcome("T5", "failed")
    text = tt.section(run, "T5")
    assert "the step returned the loss nan" in text, text


def test_a_gradient_non_finite_at_every_scale_fails(project):
    # sqrt at 0: the gradient is 0/0 whatever the scale; the scaler skips every step and never trains
    project.conftest(
        project_text(extra="loss = loss + torch.sqrt(((model.head.weight - model.head.weight.detach()) ** 2).sum())")
    )
    run = project.run("--dlcheck=T5,S1", "-rA")
    run.assert_outcome("T5", "failed")
    text = tt.section(run, "T5")
    assert "the GradScaler skipped every optimizer step" in text, text
    assert "non-finite even unscaled" in text, text
    # S1's run took no optimizer step either: it says so rather than claim weights finite after its steps
    said = " ".join(run.text.split())
    assert "no optimizer step taken" in said and "gradients and updates not judged" in said, said
    assert "weights finite after" not in said, said


def test_a_scaled_gradient_stepped_past_the_scaler_fails(project):
    # optimizer.step() called directly: the scaler's skip is bypassed and its Inf gradients reach the weights
    project.conftest(project_text(opt_step="opt.step()"))
    run = project.run("--dlcheck=T5")
    run.assert_outcome("T5", "failed")
    text = tt.section(run, "T5")
    assert "the optimizer step taken at call 1 applied gradients that hold NaN/Inf" in text, text
    assert "scaler.step(optimizer)" in text, text


def test_an_overflow_without_a_scaler_still_fails(project):
    # no scaler: a huge loss multiplier overflows the float16 backward, and the step applies it
    project.conftest(
        project_text(
            backward="(loss * 1e30).backward()",
            opt_step="opt.step()",
        )
        .replace("scaler.unscale_(opt)", "pass")
        .replace("scaler.update()", "pass")
    )
    run = project.run("--dlcheck=T5")
    run.assert_outcome("T5", "failed")
    text = tt.section(run, "T5")
    assert "parameter gradients hold NaN/Inf" in text, text
