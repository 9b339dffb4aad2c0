"""Offline text and tokenizers shared by the real-code corpus projects (run_clm, run_clm_eos, trl_sft_chatml,
trl_sft_chatml_packed, trl_dpo). Nothing here is downloaded: the corpora are generated in code and the
tokenizers are byte-level BPEs trained in-process (see /work/shared/RECIPES.md section 1).

Two tokenizers stand in for the hub ones the upstream scripts load:

- ``gpt2_like_tokenizer``: the GPT-2 tokenizer's special-token layout (a single ``<|endoftext|>`` that is
  bos, eos and unk; no pad token; nothing added around a text; model_max_length 1024), as
  ``AutoTokenizer.from_pretrained("gpt2")`` gives it to run_clm.py.
- ``qwen_chatml_tokenizer``: Qwen2-0.5B-Instruct's layout: eos ``<|im_end|>``, pad ``<|endoftext|>`` (pad !=
  eos), no bos, ``<|im_start|>`` as an extra special token, and Qwen2-Instruct's ChatML chat template
  (default system prompt "You are a helpful assistant." when the conversation has none).
"""

from __future__ import annotations

import random

SUBJECTS = [
    "the old farmer",
    "a young scholar",
    "my neighbour",
    "the captain",
    "our teacher",
    "the quiet child",
    "a travelling merchant",
    "the baker",
    "her brother",
    "the village doctor",
    "an honest clerk",
    "the gardener",
]
VERBS = ["carried", "painted", "repaired", "found", "sold", "watched", "described", "remembered", "counted", "planted"]
OBJECTS = [
    "a wooden boat",
    "the red door",
    "three silver coins",
    "an old map",
    "the garden wall",
    "a basket of apples",
    "the broken clock",
    "a letter from home",
    "the mountain road",
    "a small lantern",
    "the winter coat",
]
PLACES = [
    "near the river",
    "in the morning",
    "before the storm",
    "at the market",
    "behind the church",
    "after supper",
    "under the bridge",
    "on the hill",
    "during the festival",
    "by the harbour",
]
ENDINGS = [
    "and nobody noticed.",
    "and everyone laughed.",
    "so the day ended well.",
    "while the dogs slept.",
    "because it was needed.",
    "and then went home.",
    "as the bells rang.",
    "without a word.",
]


def documents(n: int, seed: int = 0) -> list[str]:
    """``n`` short English documents (2-4 sentences each), deterministic."""
    rng = random.Random(seed)
    docs = []
    for _ in range(n):
        sentences = []
        for _ in range(rng.randint(2, 4)):
            s = f"{rng.choice(SUBJECTS)} {rng.choice(VERBS)} {rng.choice(OBJECTS)} {rng.choice(PLACES)} {rng.choice(ENDINGS)}"
            sentences.append(s[0].upper() + s[1:])
        docs.append(" ".join(sentences))
    return docs


QUESTIONS = [
    ("What is the capital of France?", "The capital of France is Paris."),
    ("How many legs does a spider have?", "A spider has eight legs."),
    ("What colour is the sky on a clear day?", "On a clear day the sky is blue."),
    ("Name a fruit that is yellow.", "A banana is a yellow fruit."),
    ("What is two plus three?", "Two plus three is five."),
    ("Which animal says moo?", "A cow says moo."),
    ("What do bees make?", "Bees make honey."),
    ("How many days are in a week?", "There are seven days in a week."),
    ("What is frozen water called?", "Frozen water is called ice."),
    ("Which planet do we live on?", "We live on the planet Earth."),
    ("What do you use to write on paper?", "You can write on paper with a pen or a pencil."),
    ("What is the opposite of hot?", "The opposite of hot is cold."),
    ("How many hours are in a day?", "A day has twenty four hours."),
    ("What do plants need to grow?", "Plants need water, light and soil to grow."),
    ("Which season comes after winter?", "Spring comes after winter."),
    ("What is the largest ocean?", "The Pacific is the largest ocean."),
]
FOLLOW_UPS = [
    ("Can you say that more briefly?", "Yes: {short}"),
    ("Thank you. Is that always true?", "As far as we know, yes. {short}"),
    ("Please repeat the answer.", "Of course. {short}"),
]
WRONG = [
    "I do not know.",
    "Maybe ask someone else.",
    "That is a strange question.",
    "Purple, probably.",
    "It is forty two.",
    "Nobody can tell.",
]


def question(i: int) -> tuple[str, str]:
    """The i-th question and its answer: a fact from QUESTIONS or an addition, every i a distinct question."""
    if i % 4 == 0 and i // 4 < len(QUESTIONS):
        return QUESTIONS[i // 4]
    a, b = 3 + i, 2 + (i * 7) % 19
    return f"What is {a} plus {b}?", f"{a} plus {b} is {a + b}."


def conversations(n: int, seed: int = 0, start: int = 0) -> list[list[dict]]:
    """``n`` distinct chats (questions ``start`` .. ``start + n - 1``) in the "messages" format, some with a
    system prompt, some two turns long, like trl-lib/Capybara."""
    rng = random.Random(seed)
    out = []
    for i in range(start, start + n):
        q, a = question(i)
        msgs = []
        if rng.random() < 0.3:
            msgs.append({"role": "system", "content": "You answer in one short sentence."})
        msgs += [{"role": "user", "content": q}, {"role": "assistant", "content": a}]
        if rng.random() < 0.4:
            fq, fa = rng.choice(FOLLOW_UPS)
            msgs += [{"role": "user", "content": fq}, {"role": "assistant", "content": fa.format(short=a)}]
        out.append(msgs)
    return out


def preferences(n: int, seed: int = 0, start: int = 0) -> list[dict]:
    """``n`` conversational preference rows with an explicit prompt (prompt / chosen / rejected as message
    lists, distinct prompts), the layout of trl-lib/ultrafeedback_binarized after its prompt is split off."""
    rng = random.Random(seed)
    rows = []
    for i in range(start, start + n):
        q, a = question(i)
        rows.append(
            {
                "prompt": [{"role": "user", "content": q}],
                "chosen": [{"role": "assistant", "content": a}],
                "rejected": [{"role": "assistant", "content": rng.choice(WRONG)}],
            }
        )
    return rows


def _train_bpe(corpus: list[str], special: list[str], vocab_size: int):
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers

    tok = Tokenizer(models.BPE(unk_token=None))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    tok.post_processor = processors.ByteLevel(trim_offsets=False)
    tok.train_from_iterator(
        corpus,
        trainers.BpeTrainer(
            vocab_size=vocab_size,
            special_tokens=special,
            initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
            show_progress=False,
        ),
    )
    return tok


def _flat_chats() -> list[str]:
    texts = []
    for chat in conversations(64, seed=1):
        texts += [m["content"] for m in chat]
    texts += WRONG + [q for q, _ in QUESTIONS]
    return texts


def gpt2_like_tokenizer(save_dir=None):
    """GPT-2's special-token layout on a BPE trained here; saved and reloaded through AutoTokenizer when
    ``save_dir`` is given (as run_clm.py's ``--tokenizer_name`` would load it)."""
    from transformers import AutoTokenizer, PreTrainedTokenizerFast

    raw = _train_bpe(documents(400, seed=7) + _flat_chats(), ["<|endoftext|>"], 400)
    tok = PreTrainedTokenizerFast(
        tokenizer_object=raw,
        bos_token="<|endoftext|>",
        eos_token="<|endoftext|>",
        unk_token="<|endoftext|>",
        model_max_length=1024,
    )
    if save_dir is None:
        return tok
    tok.save_pretrained(str(save_dir))
    return AutoTokenizer.from_pretrained(str(save_dir))


#: Qwen2-0.5B-Instruct's chat template (ChatML, with the default system prompt)
QWEN2_CHAT_TEMPLATE = (
    "{% for message in messages %}"
    "{% if loop.first and messages[0]['role'] != 'system' %}"
    "{{ '<|im_start|>system\\nYou are a helpful assistant.<|im_end|>\\n' }}"
    "{% endif %}"
    "{{'<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>' + '\\n'}}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}"
)


def qwen_chatml_tokenizer():
    """Qwen2-Instruct's special-token layout and chat template on a BPE trained here."""
    from transformers import PreTrainedTokenizerFast

    special = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
    raw = _train_bpe(
        documents(300, seed=7) + _flat_chats() + ["system user assistant You are a helpful assistant."] * 5,
        special,
        450,
    )
    tok = PreTrainedTokenizerFast(
        tokenizer_object=raw,
        eos_token="<|im_end|>",
        pad_token="<|endoftext|>",
        extra_special_tokens=["<|im_start|>", "<|im_end|>"],
        model_max_length=32768,
    )
    tok.chat_template = QWEN2_CHAT_TEMPLATE
    return tok


def tiny_qwen2(tok, **overrides):
    """A tiny Qwen2ForCausalLM with Qwen2-0.5B-Instruct's id layout: bos/pad = <|endoftext|>, eos = <|im_end|>,
    tied embeddings, and a generation_config whose eos_token_id holds both ids."""
    from transformers import GenerationConfig, Qwen2Config, Qwen2ForCausalLM

    endoftext = tok.convert_tokens_to_ids("<|endoftext|>")
    im_end = tok.convert_tokens_to_ids("<|im_end|>")
    cfg = dict(
        vocab_size=len(tok),
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=2048,
        tie_word_embeddings=True,
        bos_token_id=endoftext,
        eos_token_id=im_end,
        pad_token_id=endoftext,
    )
    cfg.update(overrides)
    model = Qwen2ForCausalLM(Qwen2Config(**cfg))
    model.generation_config = GenerationConfig(
        bos_token_id=endoftext,
        eos_token_id=[im_end, endoftext],
        pad_token_id=endoftext,
        do_sample=True,
        temperature=0.7,
        top_p=0.8,
        top_k=20,
        repetition_penalty=1.05,
    )
    return model


def bert_like_tokenizer(save_dir, corpus=None, vocab_size: int = 400):
    """bert-base-uncased's layout on a WordPiece trained here: [PAD] id 0, [UNK], [CLS], [SEP], [MASK];
    lower-casing BertNormalizer and BertPreTokenizer; "[CLS] A [SEP]" / "[CLS] A [SEP] B [SEP]" with
    token_type_ids 0/1; model_max_length 512. Saved and loaded back through AutoTokenizer (a
    BertTokenizerFast), as the examples' --model_name_or_path / --tokenizer_name would load it. The small
    vocabulary splits rarer words into ##pieces, as the real one does for rare names."""
    from tokenizers import Tokenizer, decoders, models, normalizers, pre_tokenizers, processors, trainers
    from transformers import AutoTokenizer, BertTokenizerFast

    special = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"]
    raw = Tokenizer(models.WordPiece(unk_token="[UNK]"))
    raw.normalizer = normalizers.BertNormalizer(lowercase=True)
    raw.pre_tokenizer = pre_tokenizers.BertPreTokenizer()
    raw.decoder = decoders.WordPiece()
    raw.train_from_iterator(
        corpus if corpus is not None else documents(400, seed=7) + _flat_chats(),
        trainers.WordPieceTrainer(
            vocab_size=vocab_size,
            special_tokens=special,
            initial_alphabet=list("abcdefghijklmnopqrstuvwxyz0123456789.,;:!?'\"()-"),
            show_progress=False,
        ),
    )
    cls, sep = raw.token_to_id("[CLS]"), raw.token_to_id("[SEP]")
    raw.post_processor = processors.TemplateProcessing(
        single="[CLS] $A [SEP]",
        pair="[CLS] $A [SEP] $B:1 [SEP]:1",
        special_tokens=[("[CLS]", cls), ("[SEP]", sep)],
    )
    tok = BertTokenizerFast(
        tokenizer_object=raw,
        unk_token="[UNK]",
        sep_token="[SEP]",
        pad_token="[PAD]",
        cls_token="[CLS]",
        mask_token="[MASK]",
        model_max_length=512,
    )
    tok.save_pretrained(str(save_dir))
    return AutoTokenizer.from_pretrained(str(save_dir))
