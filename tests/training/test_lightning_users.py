"""Lightning manual optimization and a compiled submodule run through the train, ckpt and smoke checks:
no check blames the user's module for being used outside a Trainer, and none loses the compiled forward."""

import lightning_kinds as lk
import pytest

CHECKS = "T1,T2,T3,T4,T5,S1,S2,S3,C1,C2"


@pytest.mark.parametrize("module", ["ManualClassifier", "CompiledClassifier"])
def test_train_ckpt_smoke_run_on_the_module_as_written(project, module):
    project.conftest(lk.PROJECT.format(module=module))
    run = project.run(f"--dlcheck={CHECKS}")
    assert "not attached to a `Trainer`" not in run.text and "internal error" not in run.text, run.text
    assert "has no attribute 'forward'" not in run.text and "_forward_unimplemented" not in run.text, run.text
    for cid in ("T1", "T3", "T5", "S1", "S3"):
        run.assert_outcome(cid, "passed")
    assert run.result.ret == 0, run.text


def test_a_gan_s_two_losses_for_two_optimizers_are_not_averaged_into_one(project):
    """self.optimizers() gives the step its two optimizers (a stand-in list, as a Trainer gives); the generator's
    and the discriminator's losses are separate objectives, so the checks that need one loss of the step say they
    do not judge it, instead of failing on the mean or blaming the module for the stand-ins."""
    project.conftest(lk.PROJECT.format(module="GAN"))
    run = project.run("--dlcheck=T1,T2,T3,T5,T9,S1", "-rA")
    assert "internal error" not in run.text and "cannot unpack" not in run.text, run.text
    for cid in ("T1", "T2", "T3", "T5"):
        run.assert_outcome(cid, "skipped")
    text = " ".join(run.text.split())
    assert (
        "T2_overfit_batch: not judged: GAN.training_step hands 2 losses to manual_backward for its 2 optimizers (a "
        "GAN's generator and discriminator, an actor and a critic): each is minimised by its own optimizer" in text
    ), text
    run.assert_outcome("T9", "skipped")
    assert "T9_zero_grad: not judged: GAN uses manual optimization" in text
    run.assert_outcome("S1", "passed")


def test_a_compiled_submodule_saves_its_keys_with_the_compile_prefix(project):
    # a true finding: Lightning saves the state dict of the module holding the compiled net as net._orig_mod.*
    project.conftest(lk.PROJECT.format(module="CompiledClassifier"))
    run = project.run("--dlcheck=C18")
    run.assert_outcome("C18", "failed")
    text = " ".join(run.section("C18").split())
    assert "'net._orig_mod.0.bias' is 'net.0.bias' in the unwrapped model" in text, text
    assert "taken from the torch.compile wrapper" in text and "('_orig_mod.')" in text, text


def test_the_manual_step_trains_nothing_when_a_check_only_wants_its_loss(project):
    import torch

    from pytest_dlcheck.training.lightning import step_loss

    torch.manual_seed(0)
    module = lk.ManualClassifier()
    before = {k: v.clone() for k, v in module.state_dict().items()}
    x, y = lk.blobs(8, seed=3).tensors
    loss = step_loss(module, (x, y))
    # what the step hands manual_backward: an untrained net's loss on three classes (about ln 3), divided by
    # the step's accumulation factor of 2
    assert loss.requires_grad and 0.3 < loss.item() < 1.0
    assert all(p.grad is None for p in module.parameters())
    assert all(torch_equal(before[k], v) for k, v in module.state_dict().items())
    assert "optimizers" not in vars(module) and "manual_backward" not in vars(module)


def torch_equal(a, b):
    return bool((a == b).all())
