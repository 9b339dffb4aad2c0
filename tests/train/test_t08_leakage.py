"""T8: no eval example is also a training example."""

import pytest
import tiny_train as tt
from helpers import flat

SFT = """
    import pytest, tiny
    from datasets import Dataset
    from trl import SFTConfig, SFTTrainer

    @pytest.fixture(scope="session")
    def dlcheck_trainer(tmp_path_factory):
        tok = tiny.tokenizer()
        data = Dataset.from_dict({{"text": tiny.texts(12)[:6]}})
        held_out = Dataset.from_dict({{"text": ["a tiny model learned to stop", "the lazy dog jumps"]}})
        args = tiny.trainer_args(tmp_path_factory.mktemp("o"), SFTConfig)
        return SFTTrainer(model=tiny.llama(tok), args=args, processing_class=tok, train_dataset=data,
                          eval_dataset={eval})
"""


def test_eval_split_taken_from_the_training_data(project):
    project.conftest(SFT.format(eval="data.select(range(4))"))
    run = project.run("--dlcheck=T8")
    run.assert_outcome("T8", "failed")
    text = tt.section(run, "T8")
    assert "4 of 4 eval examples (100%) are also in the 6 training examples, by content: eval #0 = train #0" in text
    assert "'what is 2+2? The answer is 4." in text and "train_test_split" in text


def test_held_out_eval_split_passes(project):
    project.conftest(SFT.format(eval="held_out"))
    run = project.run("--dlcheck=T8", "-rA")
    run.fnmatch(
        ["*::T8_train_eval_leakage PASSED (0 of 2 eval examples (dlcheck_eval_dataset) are among the 6 training*"]
    )
    run.fnmatch(
        [
            "0 of 2 eval examples (dlcheck_eval_dataset) are among the 6 training examples (dlcheck_dataset), by the "
            "content of their inputs (targets ignored); 0% allowed"
        ]
    )


def test_plain_loop_eval_loader_over_training_examples(project):
    project.conftest(
        tt.loop_project(
            extra="""
    @pytest.fixture(scope="session")
    def dlcheck_eval_dataloader():
        return torch.utils.data.DataLoader(torch.utils.data.Subset(tt.blobs(), range(8, 16)), batch_size=8)
    """
        )
    )
    run = project.run("--dlcheck=T8")
    run.assert_outcome("T8", "failed")
    assert "8 of 8 eval examples (100%) are also in the 64 training examples" in tt.section(run, "T8")


def test_plain_loop_disjoint_eval_passes(project):
    project.conftest(tt.loop_project())
    run = project.run("--dlcheck=T8", "-rA")
    run.assert_outcome("T8", "passed")
    run.fnmatch(
        [
            "0 of 32 eval examples (dlcheck_eval_dataloader.dataset) are among the 64 training examples "
            "(dlcheck_dataloader.dataset), by the content of their inputs (targets ignored); 0% allowed"
        ]
    )


LOADERS = """
    import pytest, torch, tiny_train as tt

    @pytest.fixture(scope="session")
    def dlcheck_dataloader():
        return {train}

    @pytest.fixture(scope="session")
    def dlcheck_eval_dataloader():
        return {eval}
"""

OVERLAP = "torch.utils.data.Subset(tt.blobs(), range(8, 16))"


def test_iterable_dataset_loaders_are_compared_by_what_they_yield(project):
    """Loaders over IterableDatasets have a .dataset without a length: T8 compares the examples the datasets yield,
    iterated once (it used to skip, asking for dataloaders the user had defined); their items are the examples,
    whatever layout the loaders' collate gives the batches."""
    stream = "torch.utils.data.DataLoader(tt.Stream({}), batch_size=8)"
    project.conftest(LOADERS.format(train=stream.format("tt.blobs()"), eval=stream.format(OVERLAP)))
    run = project.run("--dlcheck=T8")
    run.assert_outcome("T8", "failed")
    text = tt.section(run, "T8")
    assert "8 of 8 eval examples (100%) are also in the 64 training examples, by content: eval #0 = train #8" in text
    assert "eval #0 (dlcheck_eval_dataloader.dataset (8 examples drawn: iterated once)): float32 (8,)" in text
    project.conftest(LOADERS.format(train=stream.format("tt.blobs()"), eval=stream.format("tt.blobs(32, seed=1)")))
    run = project.run("--dlcheck=T8", "-rA")
    run.assert_outcome("T8", "passed")
    run.fnmatch(
        [
            "0 of 32 eval examples (dlcheck_eval_dataloader.dataset (32 examples drawn: iterated once)) are among the "
            "64 training examples (dlcheck_dataloader.dataset (64 examples drawn: iterated once)), by the content of "
            "their inputs (targets ignored); 0% allowed"
        ]
    )


def test_generator_backed_loaders_without_a_dataset(project):
    """A hand-written loader (a generator of batches, no .dataset): T8 draws from it instead of asking for the
    dlcheck_dataset / dlcheck_eval_dataset the user cannot give."""
    project.conftest(LOADERS.format(train="tt.GeneratorLoader(tt.blobs())", eval=f"tt.GeneratorLoader({OVERLAP})"))
    run = project.run("--dlcheck=T8")
    run.assert_outcome("T8", "failed")
    assert "8 of 8 eval examples (100%) are also in the 64 training examples" in tt.section(run, "T8")
    project.conftest(
        LOADERS.format(train="tt.GeneratorLoader(tt.blobs())", eval="tt.GeneratorLoader(tt.blobs(32, seed=1))")
    )
    run = project.run("--dlcheck=T8", "-rA")
    run.fnmatch(
        ["*::T8_train_eval_leakage PASSED (0 of 32 eval examples (dlcheck_eval_dataloader (32 examples drawn:*"]
    )


TOKENS = """
    import pytest, tiny, tiny_train as tt
    from transformers import DataCollatorWithPadding

    @pytest.fixture(scope="session")
    def dlcheck_tokenizer():
        return tiny.tokenizer()

    @pytest.fixture(scope="session")
    def dlcheck_dataloader(dlcheck_tokenizer):
        return tt.llm_loader(dlcheck_tokenizer, batch_size=4)

    @pytest.fixture(scope="session")
    def dlcheck_eval_dataloader(dlcheck_tokenizer):
        # a hand-written eval loop over a slice of the training texts, batched 3 at a time: other padding
        data = tiny.tokenized(dlcheck_tokenizer)[2:8]
        return tt.GeneratorLoader(data, batch_size=3, collate=DataCollatorWithPadding(dlcheck_tokenizer))
"""


def test_token_batches_match_whatever_their_padding(project):
    """The training loader has a dataset, the eval loader does not: both are drawn from their loaders, and
    the same text padded to another length in another batch is still the same example."""
    project.conftest(TOKENS)
    run = project.run("--dlcheck=T8")
    run.assert_outcome("T8", "failed")
    text = tt.section(run, "T8")
    assert "6 of 6 eval examples (100%) are also in the 12 training examples, by content: eval #0 = train #2" in text
    assert (
        "eval #0 (dlcheck_eval_dataloader (6 examples drawn: batches split into examples, padding dropped)): "
        "'Name a colour. Blue is a colour.<|endoftext|>'" in text
    )


def test_a_one_shot_generator_is_not_consumed(project):
    project.conftest(LOADERS.format(train="tt.loader()", eval="iter(tt.GeneratorLoader(tt.blobs(32, seed=1)))"))
    run = project.run("--dlcheck=T8")
    run.assert_outcome("T8", "skipped")
    run.fnmatch(
        [
            "*dlcheck_eval_dataloader is a one-shot iterator (generator): reading it would consume your data; return "
            "a re-iterable loader*"
        ]
    )


CHAR_CONTEXTS = """
    import random, pytest, torch
    from torch.utils.data import DataLoader, TensorDataset

    def names(n, seed):
        rng = random.Random(seed)
        return ["".join(rng.choice("aeilnorst") for _ in range(rng.randint(3, 7))) for _ in range(n)]

    def contexts(words, block=3):
        # makemore: every 3-character context of every name, '.' pads the start
        xs, ys = [], []
        for w in words:
            ctx = [0] * block
            for ch in w + ".":
                ix = ".aeilnorst".index(ch)
                xs.append(list(ctx))
                ys.append(ix)
                ctx = ctx[1:] + [ix]
        return TensorDataset(torch.tensor(xs), torch.tensor(ys))

    WORDS = names(300, seed=0)

    @pytest.fixture(scope="session")
    def dlcheck_dataloader():
        return DataLoader(contexts(WORDS[:270]), batch_size=32)

    @pytest.fixture(scope="session")
    def dlcheck_eval_dataloader():
        return DataLoader(contexts({eval_words}), batch_size=32)
"""


def test_short_inputs_that_repeat_by_nature_are_no_leak(project):
    # split by name, as the makemore lecture does: many 3-character contexts recur in both splits
    project.conftest(CHAR_CONTEXTS.format(eval_words="WORDS[270:]"))
    run = project.run("--dlcheck=T8", "-rA")
    run.assert_outcome("T8", "passed")
    run.fnmatch(["*no more than two disjoint parts of the training data share with each other*repeat by nature*"])


def test_an_eval_split_taken_from_the_training_names_still_fails(project):
    project.conftest(CHAR_CONTEXTS.format(eval_words="WORDS[:30]"))
    run = project.run("--dlcheck=T8")
    run.assert_outcome("T8", "failed")
    assert "two disjoint parts of the training data share only" in flat(run.section("T8"))


PACKED = """
    import pytest

    DOCS = [[10 + d, 20 + d, 30 + d, 40 + d] for d in range(12)]

    def pack(doc_ids):
        # TRL's packed rows: documents concatenated, their lengths in seq_lengths
        return {{"input_ids": [t for d in doc_ids for t in DOCS[d]], "seq_lengths": [len(DOCS[d]) for d in doc_ids]}}

    @pytest.fixture(scope="session")
    def dlcheck_dataset():
        return [pack([0, 1, 2]), pack([3, 4, 5]), pack([6, 7, 8])]

    @pytest.fixture(scope="session")
    def dlcheck_eval_dataset():
        return [pack({eval_docs})]
"""


def test_packed_rows_are_compared_by_their_documents(project):
    # the eval row packs two training documents in another order: no row repeats, two documents do
    project.conftest(PACKED.format(eval_docs=[4, 0]))
    run = project.run("--dlcheck=T8")
    run.assert_outcome("T8", "failed")
    assert "2 of 2 eval examples (100%)" in flat(run.section("T8"))
    assert "unpacked into its documents" in flat(run.section("T8"))


def test_packed_rows_of_held_out_documents_pass(project):
    project.conftest(PACKED.format(eval_docs=[9, 10, 11]))
    project.run("--dlcheck=T8").assert_outcome("T8", "passed")


CONVERSATIONS = """
    import itertools, pytest, tiny

    SYSTEM = "You are a tiny model. Answer briefly and stop."
    PAIRS = list(itertools.product(tiny.PROMPTS, tiny.COMPLETIONS))  # 36 distinct conversations

    def chats(pairs):
        tok = tiny.tokenizer()
        return [
            {{"input_ids": tok.apply_chat_template(
                [{{"role": "system", "content": SYSTEM}}, {{"role": "user", "content": p}},
                 {{"role": "assistant", "content": c}}], tokenize=True, return_dict=True)["input_ids"]}}
            for p, c in pairs
        ]

    @pytest.fixture(scope="session")
    def dlcheck_tokenizer():
        return tiny.tokenizer()

    @pytest.fixture(scope="session")
    def dlcheck_dataset():
        return chats([p for p in PAIRS[:16] for _ in range(2)])  # the training data repeats itself: each one twice

    @pytest.fixture(scope="session")
    def dlcheck_eval_dataset():
        return chats({eval_pairs})
"""


def test_copied_conversations_are_a_leak_even_when_the_training_data_repeats_itself(project):
    """9 of 20 eval conversations (45%) are exact copies of training conversations. The training data holds every
    conversation twice, so two disjoint parts of it share most of their rows: the old T8 took that as the natural
    rate and passed. A conversation this long cannot recur by chance: it is a copy."""
    project.conftest(CONVERSATIONS.format(eval_pairs="PAIRS[:9] + PAIRS[16:27]"))
    run = project.run("--dlcheck=T8")
    run.assert_outcome("T8", "failed")
    text = tt.section(run, "T8")
    assert "9 of 20 eval examples (45%) are also in the 32 training examples, by content" in text, text
    assert "9 of them are long enough to be unique by chance (≥ 128 bits each" in text, text
    assert "the training data repeats itself too" in text and "which does not excuse copies" in text
    assert "deduplicate the training data itself before splitting" in text


def test_held_out_conversations_pass_beside_a_training_set_that_repeats_itself(project):
    project.conftest(CONVERSATIONS.format(eval_pairs="PAIRS[16:36]"))
    run = project.run("--dlcheck=T8", "-rA")
    run.assert_outcome("T8", "passed")
    run.fnmatch(["*0 of 20 eval examples (dlcheck_eval_dataset) are among the 32 training examples*"])


TRL_PACKED = """
    import pytest, tiny
    from datasets import Dataset
    from trl.data_utils import pack_dataset

    def packed(texts, strategy):
        tok = tiny.tokenizer()
        ids = [tok(t + tok.eos_token)["input_ids"] for t in texts]
        return pack_dataset(Dataset.from_dict({{"input_ids": ids}}), seq_length=48, strategy=strategy)

    TEXTS = [f"{{w}} {{t}}" for w in ("so", "and", "then") for t in tiny.CORPUS[:5]] + tiny.CORPUS[:3]

    @pytest.fixture(scope="session")
    def dlcheck_tokenizer():
        return tiny.tokenizer()

    @pytest.fixture(scope="session")
    def dlcheck_dataset():
        return packed(TEXTS[:10], "{strategy}")

    @pytest.fixture(scope="session")
    def dlcheck_eval_dataset():
        return packed({eval_texts}, "{strategy}")
"""


@pytest.mark.parametrize("strategy", ["bfd", "wrapped"])
def test_trl_packed_rows_are_compared_by_their_documents(project, strategy):
    """TRL's pack_dataset: best-fit packing keeps the documents' lengths in seq_lengths (the old T8 read only
    input_ids and compared whole rows: 0 shared); wrapped packing keeps none, and each document ends with EOS."""
    project.conftest(TRL_PACKED.format(strategy=strategy, eval_texts="TEXTS[3:8]"))
    run = project.run("--dlcheck=T8")
    run.assert_outcome("T8", "failed")
    text = tt.section(run, "T8")
    assert "unpacked into its documents" in text and "eval examples (" in text, text
    assert "0 of " not in text.split("eval examples")[0], text
    project.conftest(TRL_PACKED.format(strategy=strategy, eval_texts="TEXTS[10:]"))
    run = project.run("--dlcheck=T8", "-rA")
    run.assert_outcome("T8", "passed")
    run.fnmatch(["*0 of * eval examples (dlcheck_eval_dataset, unpacked into its documents) are among the *"])


PAIRS = """
    import pytest
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers
    from transformers import PreTrainedTokenizerFast

    SUBJECTS = ["the bank", "police", "the team", "a court", "the company"]
    VERBS = ["reported", "estimated", "denied", "announced"]
    PAIRS = [
        (f"{{s}} {{v}} a rise on day {{i}} .", f"officials said {{s}} {{v}} it on day {{i + 1}} .")
        for i, (s, v) in enumerate((s, v) for s in SUBJECTS for v in VERBS)
    ] * 2
    PAIRS = [(a, b.replace("said", "noted") if k >= 20 else b) for k, (a, b) in enumerate(PAIRS)]  # 40 distinct

    def roberta_tokenizer():
        # a RoBERTa-style byte-level BPE: tokenizer(a, b) -> <s> a </s></s> b </s>
        tok = Tokenizer(models.BPE(unk_token=None))
        tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
        tok.decoder = decoders.ByteLevel()
        tok.train_from_iterator(
            [t for p in PAIRS for t in p],
            trainers.BpeTrainer(vocab_size=300, special_tokens=["<s>", "<pad>", "</s>", "<unk>", "<mask>"],
                                initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False),
        )
        tok.post_processor = processors.RobertaProcessing(("</s>", tok.token_to_id("</s>")),
                                                          ("<s>", tok.token_to_id("<s>")))
        return PreTrainedTokenizerFast(tokenizer_object=tok, bos_token="<s>", eos_token="</s>", sep_token="</s>",
                                       cls_token="<s>", unk_token="<unk>", pad_token="<pad>", mask_token="<mask>")

    TOK = roberta_tokenizer()

    def rows(pairs):
        return [dict(TOK(a, b), labels=k % 2) for k, (a, b) in enumerate(pairs)]

    @pytest.fixture(scope="session")
    def dlcheck_tokenizer():
        return TOK

    @pytest.fixture(scope="session")
    def dlcheck_dataset():
        return rows(PAIRS[:32])

    @pytest.fixture(scope="session")
    def dlcheck_eval_dataset():
        return rows({eval_pairs})
"""


def test_sentence_pairs_copied_into_the_eval_split_are_counted_in_pairs(project):
    """MRPC-style pairs for a RoBERTa tokenizer (<s>A</s></s>B</s>): the old T8 took every row with more than one
    EOS as packed and counted 3 pieces a pair (the bare </s> in the middle shared by every pair). 2 of the 8 eval
    pairs (25%) are copied from the training pairs: counted as pairs."""
    project.conftest(PAIRS.format(eval_pairs="PAIRS[:2] + PAIRS[34:40]"))
    run = project.run("--dlcheck=T8")
    run.assert_outcome("T8", "failed")
    text = tt.section(run, "T8")
    assert "2 of 8 eval examples (25%) are also in the 32 training examples, by content: eval #0 = train #0" in text
    assert "unpacked into its documents" not in text, text
    assert "text pairs as your tokenizer's pair template joins them: one example each" in text, text


def test_held_out_sentence_pairs_pass_counted_in_pairs(project):
    project.conftest(PAIRS.format(eval_pairs="PAIRS[32:40]"))
    run = project.run("--dlcheck=T8", "-rA")
    run.assert_outcome("T8", "passed")
    run.fnmatch(
        [
            "0 of 8 eval examples (dlcheck_eval_dataset, text pairs as your tokenizer's pair template joins them: one "
            "example each, not packed documents) are among the 32 training examples (dlcheck_dataset, text pairs), by "
            "the content of their inputs*"
        ]
    )


STREAM = """
    import pytest, torch
    from torch.utils.data import DataLoader, Dataset

    TRAIN = torch.randint(0, 50, (1400,), generator=torch.Generator().manual_seed(0))
    HELD_OUT = torch.randint(0, 50, (700,), generator=torch.Generator().manual_seed(1))

    def batchify(data, bsz):
        # word_language_model's batchify: the stream cut into bsz columns, (seq, bsz)
        n = data.size(0) // bsz
        return data[: n * bsz].view(bsz, -1).t().contiguous()

    class Chunks(Dataset):
        # chunk k of the batchified stream, as get_batch(source, k * bptt) returns it: (data, target)
        def __init__(self, source, bptt=7):
            self.source, self.bptt = source, bptt
            self.starts = list(range(0, source.size(0) - 1, bptt))

        def __len__(self):
            return len(self.starts)

        def __getitem__(self, k):
            i = self.starts[k]
            n = min(self.bptt, len(self.source) - 1 - i)
            return self.source[i : i + n], self.source[i + 1 : i + 1 + n].reshape(-1)

    @pytest.fixture(scope="session")
    def dlcheck_dataloader():
        return DataLoader(Chunks(batchify(TRAIN, 20)), batch_size=None)

    @pytest.fixture(scope="session")
    def dlcheck_eval_dataloader():
        return DataLoader(Chunks(batchify({eval_stream}, {eval_width})), batch_size=None)
"""


def test_a_token_stream_batchified_at_another_width_is_not_judged(project):
    """The eval stream IS the training text, batchified at 10 columns where training uses 20: no (7, 10) chunk can
    equal a (7, 20) one, and the old T8 passed on '0 of 20 eval examples'. It is said not judged."""
    project.conftest(STREAM.format(eval_stream="TRAIN", eval_width=10))
    run = project.run("--dlcheck=T8", "-rA")
    run.assert_outcome("T8", "skipped")
    text = flat(run.text)
    assert "not judged: the training examples (dlcheck_dataloader.dataset) are 10 tensors of shape (7, 20)" in text
    assert "the eval examples (dlcheck_eval_dataloader.dataset) 20 tensors of shape (7, 10)" in text, text
    assert "even if the eval data were the training data" in text, text


def test_token_streams_batchified_at_one_width_are_compared(project):
    # the same width: chunks compare; the training text as eval data fails, a held-out stream passes
    project.conftest(STREAM.format(eval_stream="TRAIN", eval_width=20))
    run = project.run("--dlcheck=T8")
    run.assert_outcome("T8", "failed")
    assert "10 of 10 eval examples (100%) are also in the 10 training examples" in tt.section(run, "T8")
    project.conftest(STREAM.format(eval_stream="HELD_OUT", eval_width=20))
    run = project.run("--dlcheck=T8", "-rA")
    run.assert_outcome("T8", "passed")
    run.fnmatch(["*0 of 5 eval examples (dlcheck_eval_dataloader.dataset) are among the 10 training examples*"])


PADDED_CAPTIONS = """
    import pytest, tiny
    from datasets import Dataset

    # run_clip's captions, tokenized with padding="max_length" in the dataset: every row ends with its EOS and pads
    @pytest.fixture(scope="session")
    def dlcheck_tokenizer():
        return tiny.tokenizer()

    def captions(tok, texts):
        enc = tok(texts, padding="max_length", max_length=32, truncation=True)
        return Dataset.from_dict({{"input_ids": enc["input_ids"], "attention_mask": enc["attention_mask"]}})

    @pytest.fixture(scope="session")
    def dlcheck_dataset(dlcheck_tokenizer):
        return captions(dlcheck_tokenizer, [t + tiny.END for t in tiny.texts(12)])

    @pytest.fixture(scope="session")
    def dlcheck_eval_dataset(dlcheck_tokenizer):
        held_out = [f"a held out caption number {{i}} of the eval split" + tiny.END for i in range(4)]
        return captions(dlcheck_tokenizer, {eval_texts})
"""


@pytest.mark.parametrize(
    ("eval_texts", "outcome"), [("held_out", "passed"), ("[t + tiny.END for t in tiny.texts(4)]", "failed")]
)
def test_rows_padded_to_max_length_are_compared_whole_not_as_documents(project, eval_texts, outcome):
    # the pads after each row's EOS had been read as packed documents, identical in every row: "50% of eval
    # examples share their inputs ... by nature" on run_clip's distinct captions (blind set 10)
    project.conftest(PADDED_CAPTIONS.format(eval_texts=eval_texts))
    run = project.run("--dlcheck=T8", "-rA")
    run.assert_outcome("T8", outcome)
    assert "unpacked into its documents" not in run.text


KFOLD = """
    import pytest, torch, tiny_train as tt
    from torch.utils.data import DataLoader, SubsetRandomSampler

    # Lightning Fabric's kfold_cv: one dataset, each fold's loaders drawing their indices with SubsetRandomSampler
    data = tt.blobs(100)

    @pytest.fixture(scope="session")
    def dlcheck_dataloader():
        return DataLoader(data, batch_size=8, sampler=SubsetRandomSampler(list(range(20, 100))))

    @pytest.fixture(scope="session")
    def dlcheck_eval_dataloader():
        return DataLoader(data, batch_size=8, sampler=SubsetRandomSampler(list(range({start}, {start} + 20))))
"""


@pytest.mark.parametrize(("start", "outcome"), [(0, "passed"), (40, "failed")])
def test_folds_drawn_by_a_subset_sampler_are_compared_by_the_indices_they_draw(project, start, outcome):
    # T8 had compared the whole dataset behind both loaders with itself: "100 of 100 eval examples in training"
    # (blind set 11's Fabric k-fold); a validation fold inside the training indices still fails
    project.conftest(KFOLD.format(start=start))
    run = project.run("--dlcheck=T8", "-rA")
    run.assert_outcome("T8", outcome)
    assert "at the 20 indices its SubsetRandomSampler draws" in " ".join(run.text.split())
