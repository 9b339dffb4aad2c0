"""T3 and a forward that skips modules at random (LayerDrop, stochastic depth): a module skipped on the sampled draw
gets no gradient there but does on another draw, and is not frozen by accident (blind set 12's false alarm on a
Wav2Vec2 classifier with ``layerdrop=0.1``). A module cut from the graph on every draw still fails, on every path T3
has: a plain loop, a Lightning module, a transformers Trainer, the user's own step."""

import numpy as np
import pytest
import tiny_train as tt
import torch

#: the user's model: tt.MLP's task through residual layers, one of which, drawn at random, is skipped at each
#: training step (stochastic depth at the block level: a step's draw always skips one); the branch of layer
#: ``detached`` is cut from the graph (the real bug) when it runs
LAYERDROP = """

    class LayerDropMLP(nn.Module):
        def __init__(self, detached=None, layers=3):
            super().__init__()
            self.inp = nn.Linear(8, 32)
            self.layers = nn.ModuleList(nn.Linear(32, 32) for _ in range(layers))
            self.head = nn.Linear(32, 4)
            self.detached = detached

        def forward(self, x):
            h = torch.relu(self.inp(x))
            skipped = int(torch.randint(len(self.layers), ())) if self.training else -1
            for i, layer in enumerate(self.layers):
                if i == skipped:
                    continue
                out = torch.relu(layer(h))
                h = h + (out.detach() if i == self.detached else out)
            return self.head(h)
"""


def assert_cut(run, layer: str) -> None:
    run.assert_outcome("T3", "failed")
    text = " ".join(run.section("T3").split())
    assert "2 of 10 trainable parameter tensors get no gradient from the loss on batch 0" in text, text
    assert f"{layer}.weight [32x32], {layer}.bias [32]" in text, text
    assert "more draw(s) of the same batch's loss with other RNG states" in text and "reached none of them" in text
    assert "other parameter tensors that got none on the first draw did get one on another" in text, text
    assert "cut from the autograd graph" in text, text


@pytest.mark.parametrize("detached", [None, 1])
def test_a_plain_loop_with_layerdrop(project, detached):
    project.conftest(tt.loop_project(model=f"LayerDropMLP(detached={detached})", extra=LAYERDROP))
    run = project.run("--dlcheck=T3", "-rA")
    if detached is None:
        run.assert_outcome("T3", "passed")
        text = " ".join(run.text.split())
        assert "all 10 trainable parameter tensors get a gradient from the loss on batch 0" in text, text
        assert "got none on batch 0's first draw and one on another draw of the same batch" in text, text
        assert "the forward skips modules at random (LayerDrop, stochastic depth)" in text, text
    else:
        # layer 1 never gets a gradient, the other layers do on the draws that keep them
        assert_cut(run, "layers.1")


LIGHTNING = """
    import pytest, torch, tiny_lightning as tl
    from torch import nn
{layerdrop}

    class LayerDropClassifier(tl.Classifier):
        def __init__(self, detached=None):
            super().__init__()
            self.net = LayerDropMLP(detached=detached)

    @pytest.fixture(scope="session")
    def dlcheck_lightning_module():
        torch.manual_seed(0)
        return LayerDropClassifier(detached={detached})

    @pytest.fixture(scope="session")
    def dlcheck_datamodule():
        return tl.Blobs()
"""


@pytest.mark.parametrize("detached", [None, 1])
def test_a_lightning_module_with_layerdrop(project, detached):
    project.conftest(LIGHTNING.format(layerdrop=LAYERDROP, detached=detached))
    run = project.run("--dlcheck=T3", "-rA")
    if detached is None:
        run.assert_outcome("T3", "passed")
        assert "one on another draw of the same batch" in " ".join(run.text.split()), run.text
    else:
        assert_cut(run, "net.layers.1")


STEP = """
    import pytest, torch, tiny_train as tt
    from torch import nn
    from torch.utils.data import DataLoader
{layerdrop}

    @pytest.fixture(scope="session")
    def dlcheck_make_training():
        def make():
            model = LayerDropMLP(detached={detached})
            return {{"model": model, "optimizer": torch.optim.AdamW(model.parameters(), lr=1e-2)}}
        return make

    @pytest.fixture(scope="session")
    def dlcheck_dataloader():
        rows = [{{"image": x, "label": y}} for x, y in zip(*tt.blobs().tensors)]
        return DataLoader(rows, batch_size=8)

    @pytest.fixture(scope="session")
    def dlcheck_train_step():
        def step(state, batch):
            loss = nn.functional.cross_entropy(state["model"](batch["image"]), batch["label"])
            loss.backward()
            state["optimizer"].step()
            state["optimizer"].zero_grad()
            return loss.detach()
        return step
"""


@pytest.mark.parametrize("detached", [None, 1])
def test_a_step_with_layerdrop(project, detached):
    """Through the user's step each call is a draw of its own: the step calls go on until every parameter has had a
    gradient; a layer cut on every call still fails."""
    project.conftest(STEP.format(layerdrop=LAYERDROP, detached=detached))
    run = project.run("--dlcheck=T3", "-rA")
    text = " ".join(run.text.split())
    if detached is None:
        run.assert_outcome("T3", "passed")
        assert "all 10 trainable parameter tensors got a gradient" in text, text
    else:
        run.assert_outcome("T3", "failed")
        assert "8 call(s) of dlcheck_train_step" in text, text
        assert (
            "2 of 10 trainable parameter tensors got no gradient: layers.1.weight [32x32], layers.1.bias [32]" in text
        )
        assert "cut from the autograd graph" in text, text


WAV2VEC2 = """
    import numpy as np, pytest, torch
    from transformers import Trainer, TrainingArguments, Wav2Vec2Config, Wav2Vec2ForSequenceClassification

    class Clips(torch.utils.data.Dataset):
        def __len__(self):
            return 16

        def __getitem__(self, i):
            g = torch.Generator().manual_seed(i)
            return {{"input_values": torch.randn(800, generator=g) * 0.1, "labels": i % 4}}

    def detach_output(module, args, out):
        return out.detach()

    @pytest.fixture(scope="session")
    def dlcheck_trainer(tmp_path_factory):
        cfg = Wav2Vec2Config(hidden_size=16, num_hidden_layers=2, num_attention_heads=2, intermediate_size=32,
                             conv_dim=(16, 16), conv_stride=(5, 2), conv_kernel=(10, 3), num_conv_pos_embeddings=16,
                             num_conv_pos_embedding_groups=2, num_labels=4, classifier_proj_size=8,
                             mask_time_prob=0.0, layerdrop={layerdrop})
        torch.manual_seed(0)
        model = Wav2Vec2ForSequenceClassification(cfg)
        model.freeze_feature_encoder()
        if {detached}:  # the user's hook cuts the last encoder layer's feed-forward branch from the graph
            model.wav2vec2.encoder.layers[-1].feed_forward.register_forward_hook(detach_output)
        args = TrainingArguments(str(tmp_path_factory.mktemp("out")), per_device_train_batch_size=4, max_steps=4,
                                 report_to=[], save_strategy="no", use_cpu=True, remove_unused_columns=False)
        return Trainer(model=model, args=args, train_dataset=Clips())
"""


@pytest.mark.parametrize("layerdrop, detached", [(0.5, False), (0.5, True)])
def test_a_wav2vec2_trainer_with_layerdrop(project, layerdrop, detached):
    """transformers' Wav2Vec2 encoder skips each layer with probability config.layerdrop in train mode."""
    project.conftest(WAV2VEC2.format(layerdrop=layerdrop, detached=detached))
    run = project.run("--dlcheck=T3", "-rA")
    text = " ".join(run.text.split())
    if not detached:
        run.assert_outcome("T3", "passed")
        assert "got none on batch 0's first draw and one on another draw of the same batch" in text, text
    else:
        run.assert_outcome("T3", "failed")
        assert "4 of 45 trainable parameter tensors get no gradient" in text, text
        assert "wav2vec2.encoder.layers.1.feed_forward.intermediate_dense.weight [32x16]" in text, text
        assert "reached none of them" in text and "did get one on another" in text, text


#: torchvision's StochasticDepth in "batch" mode drops a residual branch for the whole batch: its layer gets an
#: exactly zero gradient (not None) on that draw; ``dead`` multiplies one branch by a constant 0 (the real bug)
DROP_BATCH = """

    from torchvision.ops import StochasticDepth

    class DropBlockMLP(nn.Module):
        def __init__(self, dead=None, layers=3):
            super().__init__()
            self.inp = nn.Linear(8, 32)
            self.layers = nn.ModuleList(nn.Linear(32, 32) for _ in range(layers))
            self.drop = StochasticDepth(0.5, mode="batch")
            self.head = nn.Linear(32, 4)
            self.dead = dead

        def forward(self, x):
            h = torch.relu(self.inp(x))
            for i, layer in enumerate(self.layers):
                out = self.drop(torch.relu(layer(h)))
                h = h + (out * 0.0 if i == self.dead else out)
            return self.head(h)
"""


@pytest.mark.parametrize("dead", [None, 1])
def test_stochastic_depth_dropping_a_block_for_the_whole_batch(project, dead):
    """A zero gradient on one draw (and a step away) and a non-zero one on another is a block masked at random; a
    branch multiplied by a constant 0 gets zeros on every draw and still fails."""
    project.conftest(tt.loop_project(model=f"DropBlockMLP(dead={dead})", extra=DROP_BATCH))
    run = project.run("--dlcheck=T3", "-rA")
    text = " ".join(run.text.split())
    if dead is None:
        run.assert_outcome("T3", "passed")
        assert "and a non-zero one on another draw of the same batch" in text, text
        assert "stochastic depth dropping a block for the whole batch" in text, text
    else:
        run.assert_outcome("T3", "failed")
        assert "more draw(s) of the same batch with other RNG states: layers.1.weight, layers.1.bias" in text, text
        assert "a factor multiplied by a constant 0" in text, text


class DictLayerDrop(torch.nn.Module):
    """The user's own model, given as dlcheck_model (no training set-up: T3 works on it itself): a BatchNorm (its
    running statistics are buffers a train-mode forward moves) and residual layers one of which, drawn at random, is
    skipped at each forward in train mode. Takes the batch's fields and returns its loss."""

    def __init__(self):
        super().__init__()
        self.inp = torch.nn.Linear(8, 32)
        self.norm = torch.nn.BatchNorm1d(32)
        self.layers = torch.nn.ModuleList(torch.nn.Linear(32, 32) for _ in range(3))
        self.head = torch.nn.Linear(32, 4)

    def forward(self, x, labels):
        h = torch.relu(self.norm(self.inp(x)))
        skipped = int(torch.randint(len(self.layers), ())) if self.training else -1
        for i, layer in enumerate(self.layers):
            if i != skipped:
                h = h + torch.relu(layer(h))
        return torch.nn.functional.cross_entropy(self.head(h), labels)


KEEP_MODEL = """
    import pytest, tiny_train as tt
    from torch.utils.data import DataLoader

    @pytest.fixture(scope="session")
    def dlcheck_model():
        return tt.KEEP["model"]

    @pytest.fixture(scope="session")
    def dlcheck_dataloader():
        return DataLoader([{"x": x, "labels": y} for x, y in zip(*tt.blobs().tensors)], batch_size=8)
"""


def test_the_further_draws_leave_no_trace_on_the_users_model(project):
    import test_training_no_trace as nt

    torch.manual_seed(0)
    model = DictLayerDrop()
    model.head.eval()  # the user's own mixed modes survive
    tt.KEEP.clear()
    tt.KEEP["model"] = model
    try:
        before, states = nt.snapshot(model), nt.rng()
        project.conftest(KEEP_MODEL)
        run = project.run("--dlcheck=T3", "-rA")
        run.assert_outcome("T3", "passed")
        assert "and one on another draw of the same batch" in " ".join(run.text.split()), run.text
        nt.assert_same(before, model)
        after = nt.rng()
        assert after[0] == states[0] and np.array_equal(after[1], states[1]) and torch.equal(after[2], states[2])
    finally:
        tt.KEEP.clear()
