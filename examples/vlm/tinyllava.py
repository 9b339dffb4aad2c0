"""A tiny but real LLaVA project, built offline in a second: a byte-level BPE tokenizer trained in-process
with an <image> token, a LlavaForConditionalGeneration from configs (a 2-layer CLIP vision tower on 64-px
pictures with 4-px patches, so one image is 256 placeholder tokens — LLaVA-1.5 has 576 — and a 2-layer
Llama), a LlavaProcessor, and picture/caption data. Stands in for your own project."""

import os

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
os.environ.setdefault("HF_DATASETS_DISABLE_PROGRESS_BARS", "1")

SIZE, PATCH = 64, 4
COLOURS = {"red": (220, 40, 40), "green": (40, 180, 60), "blue": (40, 70, 220), "yellow": (230, 210, 40)}
SHAPES = ("square", "circle")
QUESTION = "<image>What is in the picture?"


def build_processor():
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers
    from transformers import CLIPImageProcessor, LlavaProcessor, PreTrainedTokenizerFast

    bpe = Tokenizer(models.BPE())
    bpe.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    bpe.decoder = decoders.ByteLevel()
    bpe.post_processor = processors.ByteLevel(trim_offsets=False)
    corpus = [QUESTION + caption(c, s) for c in COLOURS for s in SHAPES] * 10
    bpe.train_from_iterator(
        corpus,
        trainers.BpeTrainer(
            vocab_size=300,
            special_tokens=["<|endoftext|>", "<|pad|>", "<image>"],
            initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
            show_progress=False,
        ),
    )
    tok = PreTrainedTokenizerFast(tokenizer_object=bpe, eos_token="<|endoftext|>", pad_token="<|pad|>")
    images = CLIPImageProcessor(
        size={"shortest_edge": SIZE},
        crop_size={"height": SIZE, "width": SIZE},
        image_mean=[0.5] * 3,
        image_std=[0.5] * 3,
    )
    return LlavaProcessor(
        image_processor=images,
        tokenizer=tok,
        patch_size=PATCH,
        image_token="<image>",
        vision_feature_select_strategy="default",
        num_additional_image_tokens=1,
    )


def build_model(processor):
    import torch
    from transformers import CLIPVisionConfig, LlamaConfig, LlavaConfig, LlavaForConditionalGeneration

    tok = processor.tokenizer
    torch.manual_seed(0)
    config = LlavaConfig(
        vision_config=CLIPVisionConfig(
            hidden_size=32,
            intermediate_size=64,
            num_hidden_layers=2,
            num_attention_heads=4,
            image_size=SIZE,
            patch_size=PATCH,
        ),
        text_config=LlamaConfig(
            vocab_size=len(tok),
            hidden_size=64,
            intermediate_size=128,
            num_hidden_layers=2,
            num_attention_heads=4,
            num_key_value_heads=2,
            max_position_embeddings=512,
            eos_token_id=tok.eos_token_id,
            pad_token_id=tok.pad_token_id,
        ),
        image_token_id=tok.convert_tokens_to_ids("<image>"),
        vision_feature_layer=-2,
        vision_feature_select_strategy="default",
    )
    return LlavaForConditionalGeneration(config)


def caption(colour, shape):
    return f" A {colour} {shape}."


def picture(colour, shape, seed):
    import numpy as np
    from PIL import Image

    rng = np.random.default_rng(seed)
    a = np.full((SIZE, SIZE, 3), 245, np.uint8)
    r = int(rng.integers(10, 18))
    cy, cx = rng.integers(r + 2, SIZE - r - 2, 2)
    yy, xx = np.mgrid[:SIZE, :SIZE]
    inside = (
        (abs(yy - cy) <= r) & (abs(xx - cx) <= r) if shape == "square" else (yy - cy) ** 2 + (xx - cx) ** 2 <= r * r
    )
    a[inside] = COLOURS[colour]
    return Image.fromarray(a)


def dataset(n=16):
    """Prompt/completion examples with one picture each, in TRL's vision format. Each caption ends with the
    tokenizer's EOS: SFTTrainer appends it to text-only datasets only (a vision dataset is not prepared, and
    DataCollatorForVisionLanguageModeling adds none), and a model never trained on EOS never stops (L11)."""
    from datasets import Dataset

    pairs = [(c, s) for c in COLOURS for s in SHAPES]
    rows = [pairs[i % len(pairs)] for i in range(n)]
    return Dataset.from_dict(
        {
            "images": [[picture(c, s, i)] for i, (c, s) in enumerate(rows)],
            "prompt": [QUESTION] * n,
            "completion": [caption(c, s) + "<|endoftext|>" for c, s in rows],
        }
    )


def common_args(output_dir):
    return dict(
        output_dir=str(output_dir),
        report_to="none",
        use_cpu=True,
        bf16=False,
        fp16=False,
        max_steps=10,
        per_device_train_batch_size=4,
        save_strategy="no",
        disable_tqdm=True,
        activation_checkpointing=False,
    )


def tower_modules(model):
    """The three towers of a transformers 5 Llava: lm_head sits outside model.model.language_model."""
    return {
        "vision": [model.model.vision_tower],
        "projector": [model.model.multi_modal_projector],
        "language_model": [model.model.language_model, model.lm_head],
    }
