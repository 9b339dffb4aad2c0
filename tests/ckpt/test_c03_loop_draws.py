"""C3: what the user's epoch loop draws from the global RNGs between the load and the first resumed step.

transformers' run_mlm_no_trainer.py (Accelerate): ``accelerator.load_state`` puts the global RNG states back, then
the epoch loop iterates ``accelerator.skip_first_batches(train_dataloader, resume_step)``: a new DataLoader iterator
draws its base seed from the global torch RNG, and the prepared loader fetches the first resumed batch again (the
uninterrupted run had fetched it before the save), so DataCollatorForLanguageModeling's masks and the model's
dropout draw other numbers than the uninterrupted run's, although the data order (a seedable sampler) is right: C1
passes, C3 fails. A loop that re-sets the RNG states after building its resumed iterator passes; one whose steps
draw nothing (no dropout, no masking) is not applicable."""

import json
import re
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "train"))
import tiny_train as tt  # noqa: E402

#: a WordPiece vocabulary built in code, a tiny BERT from a config, 16 distinct blocks of 8 tokens, 2 a batch (an
#: epoch of 8 steps); ``{collator}`` masks them (or not), ``{dropout}`` the model's dropout
COMMON = """
    import pytest, torch
    from tokenizers import Tokenizer, models, pre_tokenizers
    from torch.utils.data import DataLoader, Subset
    from transformers import BertConfig, BertForMaskedLM, BertTokenizerFast, DataCollatorForLanguageModeling

    torch.set_num_threads(1)
    WORDS = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"] + [f"w{{i}}" for i in range(40)]
    backend = Tokenizer(models.WordPiece({{w: i for i, w in enumerate(WORDS)}}, unk_token="[UNK]"))
    backend.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    TOK = BertTokenizerFast(tokenizer_object=backend, unk_token="[UNK]", pad_token="[PAD]", cls_token="[CLS]",
                            sep_token="[SEP]", mask_token="[MASK]")
    g = torch.Generator().manual_seed(0)
    BLOCKS = [{{"input_ids": [2] + torch.randint(5, len(WORDS), (6,), generator=g).tolist() + [3],
               "attention_mask": [1] * 8, "special_tokens_mask": [1] + [0] * 6 + [1]}} for _ in range(16)]
    COLLATOR = DataCollatorForLanguageModeling(TOK, {collator})

    def bert():
        torch.manual_seed(0)
        return BertForMaskedLM(BertConfig(vocab_size=len(WORDS), hidden_size=16, num_hidden_layers=1,
                                          num_attention_heads=2, intermediate_size=32, max_position_embeddings=16,
                                          hidden_dropout_prob={dropout}, attention_probs_dropout_prob={dropout}))

    @pytest.fixture(scope="session")
    def dlcheck_make_training():
        return make

    @pytest.fixture(scope="session")
    def dlcheck_dataloader():
        return loader()

    @pytest.fixture(scope="session")
    def dlcheck_train_step():
        return step
"""

#: run_mlm_no_trainer.py: a shuffled loader prepared by Accelerate (its seedable sampler keeps the data order right),
#: the script's step, save_state / load_state (dlcheck's stand-in), the epoch loop after load_state iterating
#: accelerator.skip_first_batches(train_dataloader, resume_step)
ACCELERATE = """
    from accelerate import Accelerator
    from accelerate.utils import DataLoaderConfiguration

    def loader():
        return DataLoader(BLOCKS, batch_size=2, shuffle=True, collate_fn=COLLATOR)

    def make():
        acc = Accelerator(cpu=True, dataloader_config=DataLoaderConfiguration(use_seedable_sampler=True))
        model = bert()
        opt = torch.optim.AdamW(model.parameters(), lr=5e-5)
        model, opt, dl = acc.prepare(model, opt, loader())
        return {{"accelerator": acc, "model": model, "optimizer": opt, "dataloader": dl}}

    def step(state, batch):
        acc = state["accelerator"]
        with acc.accumulate(state["model"]):
            loss = state["model"](**batch).loss
            acc.backward(loss)
            state["optimizer"].step()
            state["optimizer"].zero_grad()
        return loss

    @pytest.fixture(scope="session")
    def dlcheck_resume_dataloader():
        return lambda state, dataloader, resumed_step: state["accelerator"].skip_first_batches(dataloader, resumed_step)
"""

#: a plain loop: the blocks in order, its checkpoint holds the model, the optimizer and torch's RNG state; after the
#: load, the epoch loop trains on a loader of the rest of the epoch, its iterator built ``{where}``
PLAIN = """
    def loader():
        return DataLoader(BLOCKS, batch_size=2, collate_fn=COLLATOR)

    def make():
        model = bert()
        return {{"model": model, "optimizer": torch.optim.AdamW(model.parameters(), lr=5e-5), "dataloader": loader()}}

    def step(state, batch):
        loss = state["model"](**batch).loss
        loss.backward()
        state["optimizer"].step()
        state["optimizer"].zero_grad()
        return loss

    @pytest.fixture(scope="session")
    def dlcheck_save_checkpoint():
        def save(state, path):
            torch.save({{"model": state["model"].state_dict(), "optimizer": state["optimizer"].state_dict(),
                        "rng": torch.get_rng_state()}}, path)
        return save

    @pytest.fixture(scope="session")
    def dlcheck_load_checkpoint():
        def load(state, path):
            ckpt = torch.load(path, weights_only=False)
            state["model"].load_state_dict(ckpt["model"])
            state["optimizer"].load_state_dict(ckpt["optimizer"])
            torch.set_rng_state(ckpt["rng"])
        return load

    def rest_of_epoch(state, dataloader, resumed_step):
        rest = DataLoader(Subset(dataloader.dataset, range(2 * resumed_step, len(dataloader.dataset))), batch_size=2,
                          collate_fn=dataloader.collate_fn)
        if {reset}:  # the RNG states as the load left them, put back after the iterator drew its base seed
            after_load = torch.get_rng_state()
            it = iter(rest)
            torch.set_rng_state(after_load)
            return it
        return rest

    @pytest.fixture(scope="session")
    def dlcheck_resume_dataloader():
        return rest_of_epoch
"""


def accelerate_project(dropout: float = 0.1, collator: str = "mlm_probability=0.5") -> str:
    return (COMMON + ACCELERATE).format(dropout=dropout, collator=collator)


def plain_project(reset: bool) -> str:
    return (COMMON + PLAIN).format(dropout=0.1, collator="mlm_probability=0.5", reset=reset)


def _results(path: Path) -> dict:
    return {r["id"]: r for r in json.loads(path.read_text())["results"]}


def test_skip_first_batches_after_load_state_draws_ahead_of_the_uninterrupted_run(project, tmp_path):
    project.conftest(accelerate_project())
    out = tmp_path / "r.json"
    run = project.run("--dlcheck=C1,C3", f"--dlcheck-json={out}")
    run.assert_outcome("C1", "passed")  # the data order is right (the seedable sampler): C1 cannot see it
    run.assert_outcome("C3", "failed")
    by = _results(out)
    text = " ".join(tt.section(run, "C3").split())
    # which generator, how far it moved, where: the global torch RNG, past the uninterrupted run's state
    assert "global torch RNG" in text, text
    assert re.search(r"global torch RNG is ahead of the uninterrupted run's by \d+ numbers? of 32 bits", text), text
    assert "dlcheck_resume_dataloader" in text, text
    # what then draws other numbers: the resumed steps (dropout) and the first resumed batch (its masks)
    assert re.search(r"steps? \d+", text), text
    assert "first resumed batch" in text, text
    assert "epoch loop" in by["C3"]["cause"], by["C3"]
    fix = by["C3"]["fix"]
    assert "after" in fix and "iterator" in fix and "generator" in fix, fix


def test_a_plain_loop_resuming_on_a_new_iterator_draws_ahead(project, tmp_path):
    project.conftest(plain_project(reset=False))
    run = project.run("--dlcheck=C3")
    run.assert_outcome("C3", "failed")
    text = " ".join(tt.section(run, "C3").split())
    assert "global torch RNG is ahead of the uninterrupted run's by" in text, text


def test_a_loop_that_resets_the_rng_after_building_its_iterator_passes(project, tmp_path):
    project.conftest(plain_project(reset=True))
    out = tmp_path / "r.json"
    run = project.run("--dlcheck=C3", f"--dlcheck-json={out}")
    run.assert_outcome("C3", "passed")
    by = _results(out)["C3"]
    said = json.dumps(by)
    assert "your epoch loop's draws after the load" not in said, said  # judged now, not left out
    assert "first resumed batch" in said, said


def test_a_loop_whose_steps_draw_nothing_stays_not_applicable(project, tmp_path):
    # no dropout, no masking (a causal-LM collation): the new iterator's base seed moves the global RNG, nothing
    # the resumed run draws reads it
    project.conftest(accelerate_project(dropout=0.0, collator="mlm=False"))
    out = tmp_path / "r.json"
    project.run("--dlcheck=C3", f"--dlcheck-json={out}")
    by = _results(out)["C3"]
    assert by["outcome"] == "not_applicable", by
