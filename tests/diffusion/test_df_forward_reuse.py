"""The diffusion domain's work (issue 20): frozen encoders run once per distinct input (checks.shared.reuse),
DF2 reads the one sampling run DF3, DF4 and DF6 share, DF5 gives the text encoder many batches' rows per call,
and the passes inside the user's own sampling routine are counted apart (``in_user_routines``)."""

from __future__ import annotations

import json
import shutil
from collections import OrderedDict
from pathlib import Path

import pytest
import tinydiff  # noqa: F401  (keeps the diffusion modules imported across in-process runs)
import torch
from helpers import work_of
from transformers import CLIPTextConfig, CLIPTextModel

from pytest_dlcheck.checks.shared.reuse import reusing
from pytest_dlcheck.cost import counting

EXAMPLE = Path(__file__).parents[2] / "examples" / "diffusion"


class _Session:
    """What ``reusing`` reads of the check's context: the session's memo (here one store for the test)."""

    def __init__(self):
        self.store = OrderedDict()

    def memo(self, sources, key, make):
        return self.store


def _encoder(dropout: float = 0.0) -> CLIPTextModel:
    torch.manual_seed(0)
    return CLIPTextModel(
        CLIPTextConfig(
            vocab_size=32,
            hidden_size=16,
            intermediate_size=32,
            num_hidden_layers=1,
            num_attention_heads=2,
            max_position_embeddings=8,
            attention_dropout=dropout,
            bos_token_id=2,
            eos_token_id=3,
        )
    )


def test_same_input_runs_once_and_returns_a_copy():
    enc = _encoder().eval()
    ids = torch.tensor([[1, 5, 7, 2]])
    other = torch.tensor([[1, 6, 7, 2]])
    ctx = _Session()
    with counting() as cost, torch.no_grad(), reusing(ctx, enc):
        first = enc(ids)[0]
        again = enc(ids)[0]
        third = enc(other)[0]
    assert cost.forward == 2 and cost.models["CLIPTextModel"] == 2  # the repeat is not a pass
    assert torch.equal(first, again) and again.data_ptr() != first.data_ptr()  # a copy the caller may change
    assert not torch.equal(first, third)
    assert "forward" not in enc.__dict__  # nothing left on the module
    with torch.no_grad():
        assert torch.equal(enc(ids)[0], first)


def test_changed_weights_gradients_or_dropout_run_again():
    enc = _encoder().eval()
    ids = torch.tensor([[1, 5, 7, 2]])
    ctx = _Session()
    with counting() as cost, reusing(ctx, enc):
        with torch.no_grad():
            before = enc(ids)[0]
            enc.final_layer_norm.bias.add_(1.0)  # weights changed in place: computed again
            after = enc(ids)[0]
        with_grad = enc(ids)[0]  # gradients on: never reused
    assert cost.forward == 3
    assert not torch.equal(before, after) and with_grad.requires_grad
    with torch.no_grad():
        enc.final_layer_norm.bias.sub_(1.0)

    noisy = _encoder(dropout=0.5).train()  # attention dropout drawn anew at every call: never reused
    with counting() as cost, torch.no_grad(), reusing(_Session(), noisy):
        noisy(ids)
        noisy(ids)
    assert cost.forward == 2


@pytest.fixture
def example_json(project, tmp_path):
    shutil.copytree(EXAMPLE, project.pytester.path, dirs_exist_ok=True)
    out = tmp_path / "report.json"
    run = project.run("clean", "--dlcheck=diffusion", f"--dlcheck-json={out}")
    assert "failed" not in run.text.split("dlcheck summary")[-1], run.text
    return json.loads(out.read_text())


def test_clean_example_work(example_json):
    # each check's work with the shared runs it made (the sampled draws, the sampling run) added back
    cost = {r["id"]: work_of(example_json, r["id"]) for r in example_json["results"]}
    example_json = {r["id"]: r for r in example_json["results"]}
    # 16 calls of dlcheck_training_inputs over 2 sampled batches: the VAE (Encoder, quant_conv) and the text
    # encoder run once per batch; the sampled images' own encodes are the same images (0 more)
    assert cost["DF3"]["models"] == {"Encoder": 2, "Conv2d": 2, "CLIPTextModel": 2}, cost
    # DF2 watched the EMA in the one sampling run (the user's routine: 2 UNet steps, prompt and "", a decode)
    assert cost["DF2"]["in_user_routines"] == {"dlcheck_sample_images": cost["DF2"]["forward"]}, cost
    assert all(cost[c]["forward"] == 0 for c in ("DF4", "DF6", "DF8")), cost
    # DF5: 200 rows of captions in 2 calls of the text encoder, not 50
    assert cost["DF5"]["forward"] == 2 and "2 calls of dlcheck_condition" in " ".join(example_json["DF5"]["evidence"])
    own = sum(c["forward"] - sum(c.get("in_user_routines", {}).values()) for c in cost.values())
    assert own <= 10, cost
