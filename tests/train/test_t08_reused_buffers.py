"""T8 on a loader that refills and yields the same preallocated tensors every time (a token-stream pretraining
loader's speed trick): the examples drawn are copies, so an eval split made from a training file is found."""

import tiny_train as tt

BUFFERED = """
    import pytest, torch

    def stream(seed, n=4096):
        return torch.randint(0, 500, (n,), generator=torch.Generator().manual_seed(seed))

    class BufferLoader:
        # (inputs, targets) of shape (B, T) cut from a token stream, written into one preallocated pair of buffers
        def __init__(self, tokens, batch=4, seq=16):
            self.tokens, self.batch, self.seq = tokens, batch, seq
            self.inputs = torch.empty(batch, seq, dtype=torch.long)
            self.targets = torch.empty(batch, seq, dtype=torch.long)

        def __iter__(self):
            span = self.batch * self.seq
            for start in range(0, len(self.tokens) - span - 1, span):
                chunk = self.tokens[start : start + span + 1]
                self.inputs.copy_(chunk[:-1].view(self.batch, self.seq))
                self.targets.copy_(chunk[1:].view(self.batch, self.seq))
                yield self.inputs, self.targets

    TRAIN = torch.cat([stream(0), stream(1)])

    @pytest.fixture(scope="session")
    def dlcheck_dataloader():
        return BufferLoader(TRAIN)

    @pytest.fixture(scope="session")
    def dlcheck_eval_dataloader():
        return BufferLoader({eval})
"""


def test_a_loader_reusing_its_buffers_with_an_eval_split_from_a_training_file_fails(project):
    project.conftest(BUFFERED.format(eval="stream(0)"))
    run = project.run("--dlcheck=T8")
    run.assert_outcome("T8", "failed")
    text = tt.section(run, "T8")
    # every eval chunk of the first file is a training chunk too (all 252 eval rows, not the last batch's 4)
    assert "252 of 252 eval examples (100%) are also in the 508 training examples" in text


def test_a_loader_reusing_its_buffers_with_a_held_out_file_passes(project):
    project.conftest(BUFFERED.format(eval="stream(2)"))
    run = project.run("--dlcheck=T8", "-rA")
    run.assert_outcome("T8", "passed")
    run.fnmatch(["*0 of 252 eval examples (dlcheck_eval_dataloader (252 examples drawn*are among the 508 training*"])
