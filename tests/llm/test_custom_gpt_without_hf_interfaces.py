"""A hand-written causal LM pipeline (a nanoGPT-style loop): a tokenizer class of its own (encode / decode /
get_bos_token_id, no ``len()``, no ``vocab_size``, no added vocabulary), a GPT whose config is a dataclass of its
own and whose rotary positions are precomputed ``cos`` / ``sin`` buffers, and (inputs, targets) token batches.
L15 cannot read such a tokenizer's added tokens: it skips saying so (never an error blamed on the role). L5 sees
the rotary tables: its limit is unread, so it skips as not judged rather than calling the model ALiBi; the same
GPT without any rotary table is still not applicable."""

PROJECT = """
    import dataclasses, pytest, torch
    from torch import nn
    from torch.utils.data import DataLoader, TensorDataset

    class Tokenizer:
        # a byte-level tokenizer of the pipeline's own, as tiktoken / rustbpe wrappers are: no len(), no vocab_size
        def encode(self, text):
            return [256] + list(text.encode())

        def decode(self, ids):
            return bytes(i for i in ids if i < 256).decode(errors="replace")

        def get_bos_token_id(self):
            return 256

        def get_vocab_size(self):
            return 257

    @dataclasses.dataclass
    class GPTConfig:
        sequence_len: int = 16
        vocab_size: int = 257
        n_embd: int = 16

    class GPT(nn.Module):
        def __init__(self, config, rotary):
            super().__init__()
            self.config = config
            self.wte = nn.Embedding(config.vocab_size, config.n_embd)
            self.lm_head = nn.Linear(config.n_embd, config.vocab_size, bias=False)
            self.rotary = rotary
            if rotary:
                t = torch.arange(config.sequence_len * 10, dtype=torch.float32)
                inv = 1.0 / (10000 ** (torch.arange(0, config.n_embd, 2).float() / config.n_embd))
                freqs = torch.outer(t, inv)
                self.register_buffer("cos", freqs.cos()[None, :, None, :], persistent=False)
                self.register_buffer("sin", freqs.sin()[None, :, None, :], persistent=False)

        def forward(self, idx, targets=None):
            x = self.wte(idx)
            if self.rotary:
                T, half = idx.shape[1], x.shape[-1] // 2
                assert T <= self.cos.size(1)
                cos, sin = self.cos[0, :T, 0], self.sin[0, :T, 0]
                x1, x2 = x[..., :half], x[..., half:]
                x = torch.cat([x1 * cos + x2 * sin, x2 * cos - x1 * sin], -1)
            logits = self.lm_head(x)
            if targets is None:
                return logits
            return nn.functional.cross_entropy(logits.flatten(0, 1), targets.flatten())

    @pytest.fixture(scope="session")
    def dlcheck_tokenizer():
        return Tokenizer()

    @pytest.fixture(scope="session")
    def dlcheck_model():
        torch.manual_seed(0)
        return GPT(GPTConfig(), rotary={rotary})

    @pytest.fixture(scope="session")
    def dlcheck_dataloader(dlcheck_tokenizer):
        ids = torch.tensor([dlcheck_tokenizer.encode("a tiny text of the loop, number %02d" % i)[:17] for i in range(8)])
        return DataLoader(TensorDataset(ids[:, :-1], ids[:, 1:]), batch_size=4)
"""


def test_a_tokenizer_without_an_added_vocabulary_is_not_judged_not_an_error(project):
    project.conftest(PROJECT.format(rotary=True))
    run = project.run("--dlcheck=L15", "-rs")
    run.assert_outcome("L15", "skipped")
    run.fnmatch(
        [
            "*L15_new_tokens: not judged: the tokenizer is a Tokenizer without get_added_vocab() and vocab_size, so "
            "which tokens were added beyond the vocabulary it was trained with cannot be read*"
        ]
    )
    assert "your role raised" not in run.text and "has no len()" not in run.text, run.text


def test_rotary_tables_without_a_declared_limit_are_not_judged(project):
    project.conftest(PROJECT.format(rotary=True))
    run = project.run("--dlcheck=L5", "-rs")
    run.assert_outcome("L5", "skipped")
    run.fnmatch(
        [
            "*L5_positions: not judged: GPT rotates positions (rotary tables in its buffers: cos (1, 160, 1, 8), "
            "sin (1, 160, 1, 8)), but its config (GPTConfig) declares no max_position_embeddings*"
        ]
    )
    assert "ALiBi" not in run.text and "not applicable" not in run.text, run.text


def test_the_same_gpt_without_rotary_tables_is_still_not_applicable(project):
    # the twin: no rotary table and no declared limit, nothing numbers positions past which anything breaks
    project.conftest(PROJECT.format(rotary=False))
    run = project.run("--dlcheck=L5", "-rs")
    run.assert_outcome("L5", "skipped")
    run.fnmatch(["*L5_positions: not applicable: *config declares no max_position_embeddings (ALiBi or relative*"])
