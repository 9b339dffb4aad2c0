"""Tiny real LLaVA pieces built offline (RECIPES.md §7): a LlavaForConditionalGeneration from a config
(a 2-layer CLIP vision tower on 32-px images with 8-px patches, so one image is 16 placeholder tokens; a
2-layer Llama), a LlavaProcessor over tests/tiny.py's tokenizer with an <image> token, TRL's
DataCollatorForVisionLanguageModeling on prompt/completion examples with images, and stage set-ups
written the way people write them. Imported by the tests and by the throwaway user projects they write."""

from __future__ import annotations

# pytester's in-process runs put sys.modules back afterwards: import the libraries (and the plugin's
# vlm modules) here, outside any run, so nothing is half re-imported by the next run
import PIL.Image  # noqa: E402
import tiny  # noqa: F401  (offline environment first)
import torch  # noqa: E402
from transformers import (  # noqa: E402,F401
    CLIPImageProcessor,
    CLIPVisionConfig,
    CLIPVisionModel,
    Idefics3Config,
    Idefics3ForConditionalGeneration,
    LlamaConfig,
    LlavaConfig,
    LlavaForConditionalGeneration,
    LlavaNextConfig,
    LlavaNextForConditionalGeneration,
    LlavaNextImageProcessor,
    LlavaNextProcessor,
    LlavaProcessor,
    PaliGemmaConfig,
    PaliGemmaForConditionalGeneration,
    Qwen2VLConfig,
    Qwen2VLForConditionalGeneration,
)
from transformers.models.llava import modeling_llava  # noqa: E402,F401
from trl.trainer.sft_trainer import DataCollatorForVisionLanguageModeling  # noqa: E402

import pytest_dlcheck.checks.vlm.measure  # noqa: E402,F401
import pytest_dlcheck.context  # noqa: E402,F401
from pytest_dlcheck import registry as _registry  # noqa: E402

_registry.load_checks()

IMAGE = "<image>"
SIZE, PATCH = 32, 8
TOKENS_PER_IMAGE = (SIZE // PATCH) ** 2  # 16: the CLS feature is dropped ("default" strategy)

#: the LLaVA-1.5 recipe: stage 1 aligns the projector, stage 2 adds the LM; the vision tower stays frozen
STAGES = {"align": {"projector": 1e-3}, "instruct": {"projector": 2e-5, "language_model": 2e-5}}
#: a recipe that also tunes the vision tower in stage 2, ten times slower (LLaVA-OneVision style)
STAGES_VISION = {"align": {"projector": 1e-3}, "instruct": {"vision": 2e-6, "projector": 2e-5, "language_model": 2e-5}}


def tokenizer():
    tok = tiny.tokenizer()
    tok.add_tokens([IMAGE], special_tokens=True)
    return tok


def processor(tok=None, strategy: str = "default", additional: int = 1):
    tok = tok or tokenizer()
    ip = CLIPImageProcessor(
        size={"shortest_edge": SIZE},
        crop_size={"height": SIZE, "width": SIZE},
        image_mean=[0.5] * 3,
        image_std=[0.5] * 3,
    )
    return LlavaProcessor(
        image_processor=ip,
        tokenizer=tok,
        patch_size=PATCH,
        vision_feature_select_strategy=strategy,
        image_token=IMAGE,
        num_additional_image_tokens=additional,
    )


def llava(tok, seed: int = 0, hidden: int = 64):
    cfg = LlavaConfig(
        vision_config=CLIPVisionConfig(
            hidden_size=32,
            intermediate_size=64,
            num_hidden_layers=2,
            num_attention_heads=4,
            image_size=SIZE,
            patch_size=PATCH,
            projection_dim=32,
        ),
        text_config=LlamaConfig(
            vocab_size=len(tok),
            hidden_size=hidden,
            intermediate_size=2 * hidden,
            num_hidden_layers=2,
            num_attention_heads=4,
            num_key_value_heads=2,
            max_position_embeddings=256,
            pad_token_id=tok.pad_token_id,
            bos_token_id=tok.bos_token_id,
            eos_token_id=tok.eos_token_id,
        ),
        image_token_id=tok.convert_tokens_to_ids(IMAGE),
        vision_feature_layer=-2,
        vision_feature_select_strategy="default",
    )
    torch.manual_seed(seed)
    return LlavaForConditionalGeneration(cfg)


GRID = [[SIZE, SIZE], [SIZE, 2 * SIZE], [2 * SIZE, SIZE], [2 * SIZE, 2 * SIZE]]


def processor_next(tok=None):
    """LLaVA-NeXT's any-resolution processor: the token count depends on each image's size."""
    tok = tok or tokenizer()
    ip = LlavaNextImageProcessor(
        size={"shortest_edge": SIZE},
        crop_size={"height": SIZE, "width": SIZE},
        image_grid_pinpoints=GRID,
        image_mean=[0.5] * 3,
        image_std=[0.5] * 3,
    )
    return LlavaNextProcessor(
        image_processor=ip,
        tokenizer=tok,
        patch_size=PATCH,
        vision_feature_select_strategy="default",
        image_token=IMAGE,
        num_additional_image_tokens=1,
    )


def llava_next(tok, seed: int = 0):
    cfg = LlavaNextConfig(
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
            max_position_embeddings=256,
            pad_token_id=tok.pad_token_id,
        ),
        image_token_id=tok.convert_tokens_to_ids(IMAGE),
        image_grid_pinpoints=GRID,
        vision_feature_layer=-2,
    )
    torch.manual_seed(seed)
    return LlavaNextForConditionalGeneration(cfg)


def rows_mixed_sizes(n: int = 8) -> list[dict]:
    """As :func:`rows`, every other picture twice as wide (so it expands to more tokens under LLaVA-NeXT)."""
    out = rows(n)
    for i in range(1, n, 2):
        out[i]["images"] = [out[i]["images"][0].resize((2 * SIZE, SIZE))]
    return out


def image(i: int):
    """A 32-px picture: a coloured background with a square of the opposite colour somewhere."""
    import numpy as np

    r = np.random.RandomState(i)
    a = np.zeros((SIZE, SIZE, 3), np.uint8)
    a[:] = r.randint(0, 255, 3)
    x, y = r.randint(0, SIZE - 10, 2)
    a[y : y + 10, x : x + 10] = 255 - a[0, 0]
    return PIL.Image.fromarray(a)


def rows(n: int = 8, end: str = "") -> list[dict]:
    """Prompt/completion examples with one image each, as TRL's vision collator takes them; ``end`` is appended
    to every completion (tiny.EOS: what TRL leaves to the user for a vision dataset)."""
    prompts = tiny.PROMPTS * (n // len(tiny.PROMPTS) + 1)
    completions = tiny.COMPLETIONS * (n // len(tiny.COMPLETIONS) + 1)
    return [{"images": [image(i)], "prompt": IMAGE + prompts[i], "completion": completions[i] + end} for i in range(n)]


#: llava-hf/llava-1.5-7b-hf's chat_template.json: an assistant turn ends with its text and a space, no EOS
LLAVA_15_TEMPLATE = (
    "{% for message in messages %}{% if message['role'] != 'system' %}{{ message['role'].upper() + ': '}}{% endif %}"
    "{# Render all images first #}{% for content in message['content'] | selectattr('type', 'equalto', 'image') %}"
    "{{ '<image>\n' }}{% endfor %}{# Render all text next #}{% if message['role'] != 'assistant' %}"
    "{% for content in message['content'] | selectattr('type', 'equalto', 'text') %}{{ content['text'] + ' '}}"
    "{% endfor %}{% else %}{% for content in message['content'] | selectattr('type', 'equalto', 'text') %}"
    "{% generation %}{{ content['text'] + ' '}}{% endgeneration %}{% endfor %}{% endif %}{% endfor %}"
    "{% if add_generation_prompt %}{{ 'ASSISTANT:' }}{% endif %}"
)
#: the same template closing every assistant turn with the tokenizer's EOS (the fix)
LLAVA_15_EOS_TEMPLATE = LLAVA_15_TEMPLATE.replace(
    "{% generation %}{{ content['text'] + ' '}}{% endgeneration %}",
    "{% generation %}{{ content['text'] + eos_token }}{% endgeneration %}",
)


def conversations(n: int = 8) -> list[dict]:
    """llava-instruct-mix-style rows: "messages" (content lists with an image entry) and "images"; every
    third conversation has a second, text-only exchange."""
    prompts = tiny.PROMPTS * (n // len(tiny.PROMPTS) + 1)
    completions = tiny.COMPLETIONS * (n // len(tiny.COMPLETIONS) + 1)
    out = []
    for i in range(n):
        msgs = [
            {"role": "user", "content": [{"type": "image"}, {"type": "text", "text": prompts[i]}]},
            {"role": "assistant", "content": [{"type": "text", "text": completions[i].strip()}]},
        ]
        if i % 3 == 2:
            msgs += [
                {"role": "user", "content": [{"type": "text", "text": prompts[i + 1]}]},
                {"role": "assistant", "content": [{"type": "text", "text": completions[i + 1].strip()}]},
            ]
        out.append({"messages": msgs, "images": [image(i)]})
    return out


def conversation_dataset(n: int = 8):
    from datasets import Dataset

    data = conversations(n)
    return Dataset.from_dict({k: [r[k] for r in data] for k in data[0]})


class ImageMaskingCollator(DataCollatorForVisionLanguageModeling):
    """TRL's vision collator with the image placeholders masked in the labels (the fix for whole-sequence
    training of a VLM: labels[input_ids == image_token_id] = -100)."""

    def torch_call(self, examples):
        batch = super().torch_call(examples)
        batch["labels"][batch["input_ids"] == self.processor.image_token_id] = -100
        return batch


def collator(proc, max_length: int | None = None, completion_only_loss: bool = True):
    return DataCollatorForVisionLanguageModeling(proc, max_length=max_length, completion_only_loss=completion_only_loss)


def dataset(n: int = 8, end: str = ""):
    from datasets import Dataset

    data = rows(n, end)
    return Dataset.from_dict({k: [r[k] for r in data] for k in data[0]})


# ---- stage set-ups, (model, stage) -> optimizer ---------------------------------------------------


def towers(model) -> dict:
    m = model.model
    return {
        "vision": [m.vision_tower],
        "projector": [m.multi_modal_projector],
        "language_model": [m.language_model, model.lm_head],
    }


def groups(model, stage_lrs: dict) -> list[dict]:
    mods = towers(model)
    return [{"params": [p for mod in mods[t] for p in mod.parameters()], "lr": lr} for t, lr in stage_lrs.items()]


def setup_clean(stages: dict):
    """Freeze everything, unfreeze the declared towers, one param group per tower at its LR."""

    def setup(model, stage):
        model.requires_grad_(False)
        for tower in stages[stage]:
            for mod in towers(model)[tower]:
                mod.requires_grad_(True)
        return torch.optim.AdamW(groups(model, stages[stage]))

    return setup


def setup_vision_left_trainable(model, stage):
    """Stage 1 freezes the language model (and its head) but forgets the vision tower."""
    model.model.language_model.requires_grad_(False)
    model.lm_head.requires_grad_(False)
    if stage == "instruct":
        model.model.language_model.requires_grad_(True)
        model.lm_head.requires_grad_(True)
    return torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=STAGES[stage]["projector"])


def setup_lm_head_left_trainable(model, stage):
    """Stage 1 freezes model.model.vision_tower and model.model.language_model — but lm_head sits outside."""
    model.model.vision_tower.requires_grad_(False)
    model.model.language_model.requires_grad_(stage == "instruct")
    return torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=STAGES[stage]["projector"])


def setup_one_lr(model, stage):
    """The right towers, but one global LR for the whole optimizer (the Trainer default)."""
    model.requires_grad_(False)
    for tower in STAGES_VISION[stage]:
        for mod in towers(model)[tower]:
            mod.requires_grad_(True)
    return torch.optim.AdamW(
        [p for p in model.parameters() if p.requires_grad], lr=2e-5 if stage == "instruct" else 1e-3
    )


#: objects the throwaway projects hand back to the test that ran them (same process)
SEEN: dict = {}


def fingerprint(model, proc=None) -> dict:
    """What a check must leave as it was: weights, requires_grad, train/eval flags, processor settings."""
    from pytest_dlcheck.guard import tokenizer_settings

    return {
        "weights": [float(p.detach().double().sum()) for p in model.parameters()],
        "requires_grad": [p.requires_grad for p in model.parameters()],
        "training": [m.training for m in model.modules()],
        "tokenizer": tokenizer_settings(proc.tokenizer) if proc is not None else None,
        "torch_rng": torch.random.get_rng_state().tolist(),
    }


class PromptMaskingCollator:
    """A hand-written VLM collator: the processor on prompt+completion with the images, padding masked,
    and the prompt masked by a length counted ``how``: "text" — len(tokenizer(prompt)), before the
    processor expands <image> into the image's tokens (the bug); "expanded" — len(processor(prompt,
    images)), after it (the fix); "none" — labels = input_ids."""

    def __init__(self, proc, how: str = "expanded"):
        self.proc, self.how = proc, how

    def __call__(self, examples):
        texts = [e["prompt"] + e["completion"] for e in examples]
        batch = self.proc(text=texts, images=[e["images"] for e in examples], padding=True, return_tensors="pt")
        labels = batch["input_ids"].clone()
        labels[batch["attention_mask"] == 0] = -100
        for i, e in enumerate(examples):
            if self.how == "text":
                labels[i, : len(self.proc.tokenizer(e["prompt"])["input_ids"])] = -100
            elif self.how == "expanded":
                labels[i, : len(self.proc(text=e["prompt"], images=e["images"])["input_ids"][0])] = -100
        batch["labels"] = labels
        return batch


class ScaledProjector(torch.nn.Module):
    """A projector whose output is multiplied by sqrt(hidden) "to match the embedding scale" (the Gemma
    normaliser copied into a Llama-based VLM): the stray factor X2 measures."""

    def __init__(self, inner, hidden: int):
        super().__init__()
        self.inner, self.factor = inner, hidden**0.5

    def forward(self, features):
        return self.inner(features) * self.factor


def hand_projector(vision: int = 32, hidden: int = 64, seed: int = 100):
    """LLaVA's own builder: Linear, GELU, Linear with PyTorch's default initialisation."""
    torch.manual_seed(seed)
    return torch.nn.Sequential(torch.nn.Linear(vision, hidden), torch.nn.GELU(), torch.nn.Linear(hidden, hidden))
