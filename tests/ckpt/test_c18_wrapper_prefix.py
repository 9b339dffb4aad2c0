"""C18: checkpoint keys load strictly into the unwrapped model."""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "train"))
import tiny_train as tt  # noqa: E402
import torch  # noqa: E402

# torch.compile's modules are imported once here: pytester's in-process runs drop the modules they import
torch.compile(torch.nn.Linear(1, 1))

SAVE = """
    @pytest.fixture(scope="session")
    def dlcheck_save_checkpoint():
        return tt.{save}
"""

DDP = """
    import torch.distributed as dist

    @pytest.fixture(scope="session", autouse=True)
    def process_group(tmp_path_factory):
        dist.init_process_group("gloo", init_method=f"file://{tmp_path_factory.mktemp('pg')}/store", rank=0, world_size=1)
        yield
        dist.destroy_process_group()
"""


def test_state_dict_of_a_compiled_model(project):
    project.conftest(
        tt.loop_project(model="torch.compile(tt.MLP())", extra=SAVE.format(save="save_model_and_optimizer"))
    )
    run = project.run("--dlcheck=C18")
    run.assert_outcome("C18", "failed")
    text = tt.section(run, "C18")
    assert (
        "4 of 4 keys of the state dict at checkpoint['model'] (written by dlcheck_save_checkpoint) carry a wrapper segment"
        in text
    )
    assert "'_orig_mod.body.0.bias' is 'body.0.bias' in the unwrapped model" in text
    assert "would miss 4 keys" in text and "torch.compile wrapper" in text and "model._orig_mod.state_dict()" in text


def test_unwrapped_state_dict_of_a_compiled_model_passes(project):
    project.conftest(tt.loop_project(model="torch.compile(tt.MLP())", extra=SAVE.format(save="save_unwrapped")))
    run = project.run("--dlcheck=C18", "-rA")
    run.fnmatch(["*::C18_wrapper_prefix PASSED (the state dict at checkpoint*"])
    run.fnmatch(
        [
            "the state dict at checkpoint['model'] (written by dlcheck_save_checkpoint): 4 of its 4 keys are the "
            "unwrapped MLP's own keys, none carries a module. / _orig_mod. wrapper segment"
        ]
    )


def test_state_dict_of_a_ddp_wrapped_model(project):
    project.conftest(
        tt.loop_project(
            model="torch.nn.parallel.DistributedDataParallel(tt.MLP())",
            extra=DDP + SAVE.format(save="save_model_and_optimizer"),
        )
    )
    run = project.run("--dlcheck=C18")
    run.assert_outcome("C18", "failed")
    text = tt.section(run, "C18")
    assert "'module.body.0.bias' is 'body.0.bias'" in text and "DistributedDataParallel/DataParallel wrapper" in text
    assert "model.module.state_dict()" in text


def test_unwrapped_state_dict_of_a_ddp_model_passes(project):
    project.conftest(
        tt.loop_project(
            model="torch.nn.parallel.DistributedDataParallel(tt.MLP())", extra=DDP + SAVE.format(save="save_unwrapped")
        )
    )
    run = project.run("--dlcheck=C18", "-rA")
    run.assert_outcome("C18", "passed")
    assert (
        "the state dict at checkpoint['model'] (written by dlcheck_save_checkpoint): 4 of its 4 keys are the "
        "unwrapped MLP's own keys, none carries a module. / _orig_mod. wrapper segment"
    ) in run.text.splitlines()
