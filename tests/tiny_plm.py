"""A tiny permutation-LM pipeline built offline: an XLNet tokenizer over a unigram vocabulary trained in code (XLNet's
special tokens at XLNet's ids, ``A <sep> <cls>``), a tiny XLNetLMHeadModel from a config, and group_texts-style
full blocks of token ids, for transformers' DataCollatorForPermutationLanguageModeling."""

import json

WORDS = (
    "the river city valley army king church station album song season game team player north south east west "
    "village county road bridge tower castle battle war island ship was is were became played built opened "
    "released moved won lost joined wrote named early late first second third new old large small famous"
).split()

#: XLNet's special tokens in XLNet's id order (<unk> 0, <s> 1, </s> 2, <cls> 3, <sep> 4, <pad> 5, <mask> 6)
SPECIALS = ["<unk>", "<s>", "</s>", "<cls>", "<sep>", "<pad>", "<mask>", "<eod>", "<eop>"]


def texts(n: int = 24, seed: int = 0) -> list[str]:
    import random

    rng = random.Random(seed)
    return [" ".join(rng.choice(WORDS) for _ in range(rng.randint(6, 14))) for _ in range(n)]


def tokenizer():
    from tokenizers import Tokenizer, models, pre_tokenizers, trainers
    from transformers import XLNetTokenizer

    tok = Tokenizer(models.Unigram())
    tok.pre_tokenizer = pre_tokenizers.Metaspace(replacement="\u2581", prepend_scheme="always")
    tok.train_from_iterator(
        texts(80, 1),
        trainers.UnigramTrainer(vocab_size=120, special_tokens=SPECIALS, unk_token="<unk>", show_progress=False),
    )
    vocab = [tuple(piece) for piece in json.loads(tok.to_str())["model"]["vocab"]]
    return XLNetTokenizer(vocab=vocab)


def model(tok, seed: int = 0):
    import torch
    from transformers import XLNetConfig, XLNetLMHeadModel

    torch.manual_seed(seed)
    return XLNetLMHeadModel(XLNetConfig(vocab_size=len(tok), d_model=16, n_layer=1, n_head=2, d_inner=32))


def blocks(tok, n_texts: int = 24, block: int = 16) -> list[dict]:
    """run_plm.py's tokenize (every text ends with ``<sep><cls>``) and group_texts: full blocks of ``block`` tokens of
    one token stream, as a list of rows."""
    enc = tok(texts(n_texts))
    stream = {k: sum(v, []) for k, v in enc.items()}
    total = len(stream["input_ids"]) // block * block
    return [{k: v[i : i + block] for k, v in stream.items()} for i in range(0, total, block)]
