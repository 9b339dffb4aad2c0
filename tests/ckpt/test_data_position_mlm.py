"""C1 and C10: the data position of a masked-LM pipeline across a mid-epoch resume.

transformers' run_mlm_no_trainer.py (found blind, set 12): DataCollatorForLanguageModeling masks other positions at
every collation, so the same block never collates to the same batch twice; the examples are recognised by the
tokens the labels restore (``where(labels != -100, labels, input_ids)``), not by what the draw replaced. A resume
that skips the trained batches of a reshuffled epoch then fails with its counts; the same skip on a seedable sampler
passes."""

import re
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "train"))
import tiny_train as tt  # noqa: E402

COUNTS = re.compile(r"(\d+) examples trained twice, (\d+) never seen in the resumed epoch")

#: a WordPiece vocabulary built in code, a tiny BERT from a config, 16 distinct blocks of 8 tokens (group_texts'
#: output), DataCollatorForLanguageModeling at 15%, a shuffled loader prepared by Accelerate (2 a batch: an epoch of 8
#: steps), the script's step; the epoch loop after load_state: accelerator.skip_first_batches(train_dataloader,
#: resume_step), as run_mlm_no_trainer.py does
MLM = """
    import pytest, torch
    from accelerate import Accelerator
    from accelerate.utils import DataLoaderConfiguration
    from tokenizers import Tokenizer, models, pre_tokenizers
    from torch.utils.data import DataLoader
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
    COLLATOR = DataCollatorForLanguageModeling(TOK, mlm_probability=0.15)

    def loader():
        return DataLoader(BLOCKS, batch_size=2, shuffle=True, collate_fn=COLLATOR)

    def make():
        acc = Accelerator(cpu=True, dataloader_config=DataLoaderConfiguration(use_seedable_sampler={seedable}))
        torch.manual_seed(0)
        model = BertForMaskedLM(BertConfig(vocab_size=len(WORDS), hidden_size=16, num_hidden_layers=1,
                                           num_attention_heads=2, intermediate_size=32, max_position_embeddings=16))
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
    def dlcheck_make_training():
        return make

    @pytest.fixture(scope="session")
    def dlcheck_dataloader():
        return loader()

    @pytest.fixture(scope="session")
    def dlcheck_train_step():
        return step

    @pytest.fixture(scope="session")
    def dlcheck_resume_dataloader():
        return lambda state, dataloader, resumed_step: state["accelerator"].skip_first_batches(dataloader, resumed_step)
"""


def test_masked_lm_skip_on_a_reshuffled_epoch_counts_the_examples(project):
    # run_mlm_no_trainer.py: load_state puts the global RNG back to the save, then a new iterator of the shuffle=True
    # loader draws a new order, and skip_first_batches skips batches of that order, not the ones trained
    project.conftest(MLM.format(seedable=False))
    run = project.run("--dlcheck=C1,C10")
    for cid in ("C1", "C10"):
        run.assert_outcome(cid, "failed")
        text = " ".join(tt.section(run, cid).split())
        found = COUNTS.search(text)
        assert found, text
        twice, never = int(found.group(1)), int(found.group(2))
        # the whole epoch compared, every resumed example recognised despite its new masks
        assert twice > 0 and twice == never, text
        assert "not among the uninterrupted run's" not in text, text
        assert "does not restore the data position" in text and "use_seedable_sampler=True" in text, text


def test_masked_lm_skip_on_a_seedable_sampler_passes(project):
    project.conftest(MLM.format(seedable=True))
    run = project.run("--dlcheck=C1,C10", "-rA")
    run.assert_outcome("C1", "passed")
    run.assert_outcome("C10", "passed")
    lines = [" ".join(line.split()) for line in run.text.splitlines() if line.startswith("data position:")]
    assert len(lines) == 2, run.text
    for line in lines:
        assert "not judged" not in line, line
        assert line.endswith("(over steps 1-8: 16 examples, none trained twice, none lost)"), line


def test_example_digests_of_a_masked_lm_batch_are_its_original_tokens():
    import torch
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import (
        BertTokenizerFast,
        DataCollatorForLanguageModeling,
        DataCollatorForTokenClassification,
        DataCollatorWithPadding,
    )

    from pytest_dlcheck.training.runs import example_digests, labels_restore

    words = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"] + [f"w{i}" for i in range(40)]
    backend = Tokenizer(models.WordPiece({w: i for i, w in enumerate(words)}, unk_token="[UNK]"))
    backend.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    tok = BertTokenizerFast(
        tokenizer_object=backend,
        unk_token="[UNK]",
        pad_token="[PAD]",
        cls_token="[CLS]",
        sep_token="[SEP]",
        mask_token="[MASK]",
    )
    rows = [tok(" ".join(f"w{(7 * i + j) % 40}" for j in range(12)), return_special_tokens_mask=True) for i in range(4)]
    mlm = DataCollatorForLanguageModeling(tok, mlm_probability=0.3)
    torch.manual_seed(0)
    first = mlm(rows)
    torch.manual_seed(1)
    second = mlm(rows[::-1])
    assert not torch.equal(first["labels"], second["labels"].flip(0))  # other masks
    assert (first["input_ids"] == tok.mask_token_id).any()
    # told from the batches alone (its [MASK] id), and from the collator, which says so
    a, b = example_digests(first), example_digests(second)
    assert a == b[::-1] and len(set(a)) == 4
    assert labels_restore(mlm) is True and labels_restore(DataCollatorForLanguageModeling(tok, mlm=False)) is None
    assert example_digests(first, labels_restore(mlm)) == a
    # a block the draw left whole (no position chosen) is the same example
    whole = {k: v.clone() for k, v in first.items()}
    whole["input_ids"][0] = torch.where(whole["labels"][0] != -100, whole["labels"][0], whole["input_ids"][0])
    whole["labels"][0] = -100
    assert example_digests(whole) == a
    # the same blocks as a causal LM's batch (labels = inputs): the same key
    causal = DataCollatorForLanguageModeling(tok, mlm=False)(rows)
    assert example_digests(causal) == a
    # a token classifier's tags are not tokens to restore: two sentences with the same tags stay apart
    tagged = [{"input_ids": r["input_ids"], "labels": [-100] + [1] * 12 + [-100]} for r in rows[:2]]
    tc = DataCollatorForTokenClassification(tok)(tagged)
    assert len(set(example_digests(tc))) == 2
    # labels shifted by one (a hand-written causal batch): kept with the inputs, which tell apart two rows that
    # differ in their first token only
    ids = torch.tensor([[5, 9, 10, 11, 3], [6, 9, 10, 11, 3]])
    shifted = {"input_ids": ids, "labels": torch.cat([ids[:, 1:], torch.full((2, 1), -100)], dim=1)}
    assert len(set(example_digests(shifted))) == 2
    # a sequence classifier's batch: no token labels, unchanged
    assert len(set(example_digests(DataCollatorWithPadding(tok)([dict(r, labels=i) for i, r in enumerate(rows)])))) == 4
