"""An eval function is fed what the pipeline feeds it (issue 29, item 1): timm's training script hands its
validate() a ``PrefetchLoader`` around a DataLoader whose ``fast_collate`` gives uint8 images; the wrapper's
``__iter__`` converts them to float and normalises them. V2 used to call the user's eval function on a DataLoader it
rebuilt from the dataset (the uint8 batches, unconverted): the model raised on them and V2 reported it as
dlcheck_eval_fn's error. Now the eval function gets the user's own wrapper, reading a bounded copy of its loader:
a correct evaluate passes, one without model.eval() still fails."""

import tiny_vision  # noqa: F401  (torchvision, timm and the plugin's roles imported once, outside the runs)
from timm.data.loader import PrefetchLoader, fast_collate  # noqa: F401

CONFTEST = """
    import pathlib, pytest, torch, tiny_vision as tv
    from torch.utils.data import DataLoader, TensorDataset
    from timm.data.loader import PrefetchLoader, fast_collate

    def images(seed, n):
        g = torch.Generator().manual_seed(seed)
        x = torch.randint(0, 256, (n, 3, 32, 32), generator=g, dtype=torch.uint8)   # timm's fast path: uint8
        return TensorDataset(x, torch.arange(n) % 4)

    @pytest.fixture(scope="session")
    def dlcheck_model():
        model = tv.timm_resnet(4)
        snapshot = tv.state_snapshot(model)
        yield model
        (pathlib.Path(__file__).parent / "trace.txt").write_text(tv.same_state(model, snapshot) or "untouched")

    @pytest.fixture(scope="session")
    def dlcheck_eval_dataloader():
        loader = DataLoader(images(1, 16), batch_size=8, collate_fn=fast_collate)
        return PrefetchLoader(loader, device=torch.device("cpu"))   # to float, normalised, in its __iter__

    @pytest.fixture(scope="session")
    def dlcheck_eval_fn():
        # timm's train.py validate(), reduced to its mode handling
        def validate(model, loader):
            {eval_line}
            outputs = []
            with torch.no_grad():
                for inputs, target in loader:
                    outputs.append(model(inputs))
            return outputs
        return validate
"""


def test_eval_fn_gets_the_users_prefetch_loader_and_passes(project):
    project.conftest(CONFTEST.format(eval_line="model.eval()"))
    run = project.run("--dlcheck=V2", "-rA")
    run.assert_outcome("V2", "passed")
    text = " ".join(run.text.split())
    assert "dlcheck_eval_fn called twice right after model.train(): 0 of" in text
    assert "two evals give identical results" in text
    assert "(the fixture that provides it" not in text and "bug of pytest-dlcheck" not in text, run.text
    assert (project.pytester.path / "trace.txt").read_text() == "untouched"


def test_eval_fn_without_model_eval_through_the_prefetch_loader_fails(project):
    project.conftest(CONFTEST.format(eval_line="pass   # no model.eval()"))
    run = project.run("--dlcheck=V2", "-rA")
    run.assert_outcome("V2", "failed")
    section = " ".join(run.section("V2").split())
    assert "modules whose forward depends on the mode in training mode: 20 BatchNorm2d" in section, section
    assert "it moved the BatchNorm running_mean" in section
    assert "(the fixture that provides it" not in section and "raised RuntimeError" not in section, section
    assert (project.pytester.path / "trace.txt").read_text() == "untouched"
