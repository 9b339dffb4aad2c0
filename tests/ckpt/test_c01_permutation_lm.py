"""C1 on a permutation-LM Trainer (transformers' run_plm.py, found blind, set 16): DataCollatorForPermutationLanguageModeling
draws other spans, perm_mask and target_mapping at every collation, so a resumed run's batches never equal the
uninterrupted run's bit for bit although they hold the same examples in the same order. The data position is told by
the tokens the labels restore (``where(labels != -100, labels, input_ids)``), not by what the draw made: the script's
own resume is not called a reordering (it had failed 'the same examples in another order'); a sampler that draws the
resumed epoch's order anew (group_by_length) still fails on the order. The resume still fails on its masks: the
Trainer fetches the first resumed batch (the collator draws its spans) before it restores rng_state.pth, as with a
masked LM's collator (transformers#39215)."""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "train"))
import tiny_train as tt  # noqa: E402

TRAINER = """
    import pytest, tiny, tiny_plm
    from datasets import Dataset
    from transformers import DataCollatorForPermutationLanguageModeling, Trainer

    @pytest.fixture(scope="session")
    def dlcheck_trainer(tmp_path_factory):
        tok = tiny_plm.tokenizer()
        # 8 full blocks of one token stream, 2 a batch: an epoch of 4 optimizer steps
        data = Dataset.from_list(tiny_plm.blocks(tok)[:8])
        args = tiny.trainer_args(tmp_path_factory.mktemp("o"), learning_rate=1e-3, {args})
        return Trainer(
            model=tiny_plm.model(tok), args=args, train_dataset=data,
            data_collator=DataCollatorForPermutationLanguageModeling(tok, plm_probability=1 / 6, max_span_length=3),
        )
"""


def test_permutation_lm_resumed_mid_epoch_is_no_reordering(project):
    project.conftest(TRAINER.format(args="seed=0"))
    run = project.run("--dlcheck=C1", "--dlcheck-set", "C1.steps=8")
    run.assert_outcome("C1", "failed")  # the resumed batch's spans are drawn before the RNG states are restored
    text = " ".join(tt.section(run, "C1").split())
    assert "saved after step 5" in text and "middle of epoch 2" in text, text
    assert "another order" not in text and "order of examples is drawn anew" not in text, text
    assert "trains other batches" not in text, text


def test_permutation_lm_resumed_epoch_drawn_anew_fails(project):
    project.conftest(TRAINER.format(args='train_sampling_strategy="group_by_length"'))
    run = project.run("--dlcheck=C1", "--dlcheck-set", "C1.steps=8")
    run.assert_outcome("C1", "failed")
    text = tt.section(run, "C1")
    assert "middle of epoch 2" in text, text
    assert "order of examples is drawn anew" in text, text


def test_example_digests_of_a_permutation_lm_batch_are_its_original_tokens():
    import tiny_plm
    import torch
    from transformers import DataCollatorForPermutationLanguageModeling

    from pytest_dlcheck.training.runs import example_digests, labels_restore

    tok = tiny_plm.tokenizer()
    rows = tiny_plm.blocks(tok)[:4]
    plm = DataCollatorForPermutationLanguageModeling(tok, plm_probability=1 / 6, max_span_length=3)
    assert labels_restore(plm) is True
    torch.manual_seed(0)
    first = plm(rows)
    torch.manual_seed(1)
    second = plm(rows[::-1])
    assert not torch.equal(first["perm_mask"], second["perm_mask"].flip(0))  # other spans and permutations
    a, b = example_digests(first, True), example_digests(second, True)
    assert a == b[::-1] and len(set(a)) == 4
    assert example_digests(first) == a  # told from the batch alone too (its <mask> id)
    # other blocks are other examples
    torch.manual_seed(0)
    assert not set(example_digests(plm(tiny_plm.blocks(tok)[4:8]), True)) & set(a)
