"""T4 on a model that embeds its token ids sequence-first (transformers' XLNet transposes input_ids to (seq, batch)
before its word embedding; found blind, set 16: run_plm.py): T4 had differentiated against the embedding output as
if its dim 0 were the examples, compared positions, and failed 'example 0 depends on example 3' on a model whose
examples are independent. The leaf is taken batch first now. The twin: a sequence-first model that mixes the batch
(a mean over the batch axis after the embedding) still fails."""

import pytest

CONFTEST = """
import pytest, torch
import torch.nn as nn
from transformers import XLNetConfig, XLNetLMHeadModel

V = 40


class SeqFirstLM(nn.Module):
    '''A hand-written LM that embeds (seq, batch), as XLNet does, and optionally mixes the batch.'''

    def __init__(self, mix):
        super().__init__()
        self.mix = mix
        self.embed = nn.Embedding(V, 8)
        self.out = nn.Linear(8, V)

    def get_input_embeddings(self):
        return self.embed

    def forward(self, input_ids, labels=None):
        h = self.embed(input_ids.transpose(0, 1).contiguous())  # (seq, batch, dim)
        if self.mix:
            h = h + h.mean(dim=1, keepdim=True)  # over the batch axis: examples see each other
        logits = self.out(h).transpose(0, 1)
        return {{"logits": logits}}


@pytest.fixture(scope="session")
def dlcheck_model():
    torch.manual_seed(0)
    if {model!r} == "xlnet":
        return XLNetLMHeadModel(XLNetConfig(vocab_size=V, d_model=16, n_layer=1, n_head=2, d_inner=32))
    return SeqFirstLM(mix={model!r} == "mixed")


@pytest.fixture(scope="session")
def dlcheck_dataloader():
    g = torch.Generator().manual_seed(0)
    ids = torch.randint(0, V, (8, 12), generator=g)
    return [{{"input_ids": ids[i : i + 4], "labels": ids[i : i + 4]}} for i in (0, 4)]
"""


@pytest.mark.parametrize("model,outcome", [("xlnet", "passed"), ("independent", "passed"), ("mixed", "failed")])
def test_sequence_first_embeddings_are_read_per_example(project, model, outcome):
    project.conftest(CONFTEST.format(model=model))
    run = project.run("--dlcheck=T4", "-rA")
    assert "internal error" not in run.text
    run.assert_outcome("T4", outcome)
