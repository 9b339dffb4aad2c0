"""A causal-LM LoRA recipe's own preprocessing (found blind): each training row is prompt + label + EOS, padded on
the left to max_length and then sliced [:max_length] (an over-long prompt loses its label); the eval rows for
generation are the same prompts without the label. T8 must see that every eval row is a training example's start
(not only the 3 whose truncation made them identical); L13 must read enough rows to find the 3 left without
supervision."""

# imported once here: pytester drops modules first imported inside a run, and datasets (pyarrow
# extension types) cannot be imported twice in one process
from datasets import Dataset  # noqa: F401
from helpers import flat

PROMPT_ROWS = """
    import random, pytest, torch, tiny
    from datasets import Dataset
    from transformers import default_data_collator

    WORDS = "the cat dog runs fast slow blue green house tree river stone cloud light dark warm cold bird fish".split()
    MAX = 128

    def tweets(seed, n=50, long=3):
        rng = random.Random(seed)
        out = [" ".join(rng.choice(WORDS) for _ in range(rng.randint(4, 8))) for _ in range(n)]
        for k in range(long):  # prompts longer than MAX tokens on their own
            out[3 + k * 17] = " ".join(rng.choice(WORDS) for _ in range(40))
        return out

    def labels_of(n):
        return ["complaint" if i % 2 else "no complaint" for i in range(n)]

    def prompt(text):
        return f"Tweet text : {{text}} Label : "

    def train_rows(tok, texts, keep_supervision):
        rows = {{"input_ids": [], "attention_mask": [], "labels": []}}
        for text, label in zip(texts, labels_of(len(texts))):
            p = tok(prompt(text))["input_ids"]
            if keep_supervision:
                p = p[: MAX - 12]
            y = tok(label)["input_ids"] + [tok.eos_token_id]
            ids = p + y
            pad = MAX - len(ids)
            rows["input_ids"].append(([tok.pad_token_id] * pad + ids)[:MAX])
            rows["attention_mask"].append(([0] * pad + [1] * len(ids))[:MAX])
            rows["labels"].append(([-100] * pad + [-100] * len(p) + y)[:MAX])
        return Dataset.from_dict(rows)

    def eval_rows(tok, texts):
        rows = {{"input_ids": [], "attention_mask": []}}
        for text in texts:
            p = tok(prompt(text))["input_ids"]
            pad = MAX - len(p)
            rows["input_ids"].append(([tok.pad_token_id] * pad + p)[:MAX])
            rows["attention_mask"].append(([0] * pad + [1] * len(p))[:MAX])
        return Dataset.from_dict(rows)

    @pytest.fixture(scope="session")
    def dlcheck_tokenizer():
        return tiny.tokenizer(padding_side="left")

    @pytest.fixture(scope="session")
    def dlcheck_dataset(dlcheck_tokenizer):
        return train_rows(dlcheck_tokenizer, tweets(0), keep_supervision={keep})

    @pytest.fixture(scope="session")
    def dlcheck_collator():
        return default_data_collator

    @pytest.fixture(scope="session")
    def dlcheck_dataloader(dlcheck_dataset):
        return torch.utils.data.DataLoader(dlcheck_dataset, batch_size=8, collate_fn=default_data_collator)

    @pytest.fixture(scope="session")
    def dlcheck_eval_dataset(dlcheck_tokenizer):
        return eval_rows(dlcheck_tokenizer, tweets({eval_seed}))
"""


def test_eval_prompts_of_the_training_rows_are_found_whole(project):
    project.conftest(PROMPT_ROWS.format(keep="False", eval_seed=0))
    run = project.run("--dlcheck=T8")
    run.assert_outcome("T8", "failed")
    text = flat(run.section("T8"))
    assert "50 of 50 eval examples (100%) are also in the 50 training examples" in text
    assert "47 of them are not identical to a training example but are its start" in text


def test_held_out_prompts_pass(project):
    project.conftest(PROMPT_ROWS.format(keep="False", eval_seed=1))
    run = project.run("--dlcheck=T8", "-rA")
    run.assert_outcome("T8", "passed")
    run.fnmatch(["*0 of 50 eval examples (dlcheck_eval_dataset) are among the 50 training examples*"])
    run.fnmatch(["*token sequences also matched as the start of a training example's tokens*: 0 of*"])


def test_the_few_over_long_rows_left_without_labels_are_read(project):
    """3 of 50 rows lose every label to the [:max_length] slice: L13 reads all 50 stored rows, not 8 of them."""
    project.conftest(PROMPT_ROWS.format(keep="False", eval_seed=1))
    run = project.run("--dlcheck=L13")
    run.assert_outcome("L13", "failed")
    text = flat(run.section("L13"))
    assert "3 of 50" in text


def test_rows_that_keep_their_labels_pass(project):
    project.conftest(PROMPT_ROWS.format(keep="True", eval_seed=1))
    run = project.run("--dlcheck=L13", "-rA")
    run.assert_outcome("L13", "passed")
    run.fnmatch(
        [
            "*50 of 50 sampled examples keep supervised tokens after truncation; source: dlcheck_collator on 50 of "
            "the 50 examples of dlcheck_dataset*"
        ]
    )
