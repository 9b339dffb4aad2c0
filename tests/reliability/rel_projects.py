"""Real user projects, one directory (and conftest.py) each, grouped by the domain whose checks they
exercise; the no-trace proof runs every check of a domain on each of its projects. Every project builds
its objects in one session fixture (``objects``, autouse: it runs before any check) and hands out its
parts through trivial ``dlcheck_*`` fixtures, so only the checks can change them.

To cover a new domain, add ``PROJECTS[domain] = {directory: conftest source}`` with at least one real
project on which its checks run (not skip for a missing role); tests/<domain>/ helpers are the place
to build them from."""

from __future__ import annotations

import sys
import textwrap
from pathlib import Path

TESTS = Path(__file__).resolve().parents[1]
for sub in ("", "vision", "diffusion", "rl", "vlm", "train", "dist"):
    if str(TESTS / sub) not in sys.path:
        sys.path.insert(0, str(TESTS / sub))

import tiny  # noqa: E402,F401
import tiny_dist  # noqa: E402,F401  (torch.distributed and its checkpoint imported once, outside the runs)
import tiny_rl  # noqa: E402,F401  (gymnasium, stable-baselines3)
import tiny_train  # noqa: E402,F401
import tiny_vision  # noqa: E402,F401  (torchvision/timm imported once, outside the runs)
import tinydiff  # noqa: E402,F401  (diffusers imported once, outside the runs)
import tinyvlm  # noqa: E402,F401


def _roles(*names: str) -> str:
    return "".join(
        f"""
@pytest.fixture(scope="session")
def dlcheck_{name}(objects):
    return objects[{name!r}]
"""
        for name in names
    )


def _project(build: str, *roles: str, header: str = "import pytest, torch, tiny\n") -> str:
    return (
        header
        + "\n@pytest.fixture(scope='session', autouse=True)\ndef objects(tmp_path_factory):\n"
        + textwrap.indent(textwrap.dedent(build).strip("\n"), "    ")
        + "\n"
        + _roles(*roles)
    )


# ---- llm ------------------------------------------------------------------------------------------

LLM_HAND = _project(
    """
    from torch.utils.data import DataLoader
    from transformers import DataCollatorForLanguageModeling, TrainingArguments
    tok = tiny.tokenizer(padding_side="left")
    model = tiny.llama(tok)
    model.train()
    model.model.layers[0].eval()                      # a user's mixed modes must survive
    model.model.embed_tokens.weight.requires_grad_(False)
    collator = DataCollatorForLanguageModeling(tok, mlm=False)
    data = tiny.tokenized(tok)
    loader = DataLoader(data, batch_size=4, shuffle=True, collate_fn=collator,
                        generator=torch.Generator().manual_seed(1))
    opt = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=1e-3)
    model(**collator(data[:2])).loss.backward()       # mid-training: gradients and optimizer state exist
    opt.step()
    sched = torch.optim.lr_scheduler.LinearLR(opt, total_iters=10)
    args = TrainingArguments(output_dir=str(tmp_path_factory.mktemp("out")), report_to="none", use_cpu=True,
                             per_device_train_batch_size=4, max_steps=2)
    return dict(tokenizer=tok, model=model, collator=collator, dataset=data, dataloader=loader,
                eval_dataset=tiny.tokenized(tok, 8), compute_metrics=lambda pred: {"perplexity": 1.0},
                optimizer=opt, lr_scheduler=sched, training_args=args,
                generation_prompts=["what is 2+2?", "hello", "Name a colour. Blue"])
""",
    "tokenizer",
    "model",
    "collator",
    "dataset",
    "dataloader",
    "eval_dataset",
    "compute_metrics",
    "optimizer",
    "lr_scheduler",
    "training_args",
    "generation_prompts",
)

LLM_BROKEN = _project(
    """
    from transformers import DataCollatorForLanguageModeling
    tok = tiny.tokenizer(pad=tiny.EOS)                # pad == eos: the real EOS is masked (L11)
    collate = DataCollatorForLanguageModeling(tok, mlm=False)
    return dict(tokenizer=tok, model=tiny.gpt2(tok), collator=collate, dataset=tiny.tokenized(tok))
""",
    "tokenizer",
    "model",
    "collator",
    "dataset",
)

LLM_PACKED = _project(
    """
    from transformers import DataCollatorWithFlattening
    tok = tiny.tokenizer()
    return dict(tokenizer=tok, model=tiny.llama(tok), dataset=tiny.tokenized(tok),
                collator=DataCollatorWithFlattening(return_position_ids=True))
""",
    "tokenizer",
    "model",
    "collator",
    "dataset",
)

LLM_SFT = _project(
    """
    from datasets import Dataset
    from trl import SFTConfig, SFTTrainer
    tok = tiny.tokenizer()
    data = Dataset.from_dict({"prompt": tiny.PROMPTS, "completion": tiny.COMPLETIONS})
    return dict(trainer=SFTTrainer(model=tiny.llama(tok), processing_class=tok, train_dataset=data,
                                   eval_dataset=data,
                                   args=tiny.trainer_args(tmp_path_factory.mktemp("sft"), SFTConfig)))
""",
    "trainer",
)

LLM_DPO = _project(
    """
    import copy
    from datasets import Dataset
    from trl import DPOConfig, DPOTrainer
    tok = tiny.tokenizer()
    model = tiny.llama(tok)
    data = Dataset.from_dict({"prompt": tiny.PROMPTS, "chosen": tiny.COMPLETIONS,
                              "rejected": tiny.COMPLETIONS[1:] + tiny.COMPLETIONS[:1]})
    args = tiny.trainer_args(tmp_path_factory.mktemp("dpo"), DPOConfig, max_length=64, beta=0.1)
    return dict(trainer=DPOTrainer(model=model, ref_model=copy.deepcopy(model), args=args, processing_class=tok,
                                   train_dataset=data))
""",
    "trainer",
)

# ---- vision ---------------------------------------------------------------------------------------

VISION_HEADER = "import pytest, torch, tiny_vision as tv\nfrom torch.utils.data import DataLoader\n"


def _vision(model: str, train: str, eval: str, collate: str = "", extra: str = "", roles=()) -> str:
    return _project(
        f"""
        model = {model}
        model.train()
        evaluate = lambda model, loader: [model(list(x) if isinstance(x, tuple) else x) for x, _ in loader]
        return dict(model=model, eval_fn=evaluate,
                    dataloader=DataLoader({train}, batch_size=8, shuffle=True, generator=torch.Generator().manual_seed(2){collate}),
                    eval_dataloader=DataLoader({eval}, batch_size=8{collate}){extra})
    """,
        "model",
        "dataloader",
        "eval_dataloader",
        "eval_fn",
        *roles,
        header=VISION_HEADER,
    )


VISION_CLS = _vision(
    "tv.timm_resnet(4)",
    "tv.Shapes([i % 4 for i in range(32)], transform=tv.classification_tf(train=True))",
    "tv.Shapes([i % 4 for i in range(16)], transform=tv.classification_tf(train=False))",
    extra=", loss_fn=torch.nn.CrossEntropyLoss()",
    roles=("loss_fn",),
)
VISION_CLS_BROKEN = _vision(  # unscaled 0-255 inputs, eval augmentation, batch 8 BatchNorm, 10:1 imbalance
    "tv.resnet18(4)",
    "tv.Shapes([0] * 30 + [1, 2, 3], transform=tv.classification_tf(train=True, scale=False))",
    "tv.Shapes([i % 4 for i in range(16)], transform=tv.classification_tf(train=True))",
    extra=", loss_fn=torch.nn.CrossEntropyLoss()",
    roles=("loss_fn",),
)
VISION_DET = _vision(
    "tv.fasterrcnn(3)",
    "tv.ShapesDetection(16, transforms=tv.detection_tf(train=True))",
    "tv.ShapesDetection(8, transforms=tv.detection_tf(train=False))",
    collate=", collate_fn=tv.detection_collate",
)
VISION_DET_BROKEN = _vision(
    "tv.fasterrcnn(3)",
    "tv.ShapesDetection(16, boxes='coco_as_xyxy', label_offset=-1, transforms=tv.detection_tf(train=True))",
    "tv.ShapesDetection(8, transforms=tv.detection_tf(train=False))",
    collate=", collate_fn=tv.detection_collate",
)
VISION_SEG = _vision(
    "tv.lraspp(3)",
    "tv.ShapesSegmentation(16, transforms=tv.segmentation_tf(train=True))",
    "tv.ShapesSegmentation(8, transforms=tv.segmentation_tf(train=False))",
    extra=", loss_fn=torch.nn.CrossEntropyLoss(ignore_index=255)",
    roles=("loss_fn",),
)

# ---- diffusion ------------------------------------------------------------------------------------


def _diffusion(**knobs) -> str:
    roles = tinydiff.CLEAN_ROLES + ("condition",)
    return _project(f"return tinydiff.setup(**{knobs!r}).__dict__", *roles, header="import pytest, tinydiff\n")


DIFFUSION_CLEAN = _diffusion(steps=2)
DIFFUSION_BROKEN = _diffusion(
    ema_use="no-restore", p_empty=0.0, factor=None, timesteps="narrow", steps=1, inference="defaults"
)


# ---- rl -------------------------------------------------------------------------------------------

RL_CLEANRL = _project(
    """
    from pytest_dlcheck.rl import advantage_fn
    agent = tiny_rl.Agent()
    def save(d):
        torch.save(agent.state_dict(), d / "agent.pt")
    def load(d):
        fresh = tiny_rl.Agent()
        fresh.load_state_dict(torch.load(d / "agent.pt"))
        return fresh
    return dict(model=agent, env=tiny_rl.make_envs, advantage_fn=advantage_fn(tiny_rl.compute_gae, arrays="torch"),
                advantage_minibatches=tiny_rl.ppo_minibatches(agent, tiny_rl.make_envs()), save_agent=save,
                load_agent=load)
""",
    "model",
    "env",
    "advantage_fn",
    "advantage_minibatches",
    "save_agent",
    "load_agent",
    header="import pytest, torch, tiny_rl\n",
)

RL_SB3 = _project(
    """
    from stable_baselines3 import PPO
    from stable_baselines3.common.env_util import make_vec_env
    from stable_baselines3.common.vec_env import VecNormalize
    algo = tiny_rl.sb3_ppo()
    algo.learn(128)
    def save(d):
        algo.save(d / "model")
        algo.get_vec_normalize_env().save(d / "vecnormalize.pkl")
    def load(d):
        venv = VecNormalize.load(d / "vecnormalize.pkl", make_vec_env("CartPole-v1", n_envs=2))
        return PPO.load(d / "model", env=venv, device="cpu")
    return dict(algorithm=algo, save_agent=save, load_agent=load)
""",
    "algorithm",
    "save_agent",
    "load_agent",
    header="import pytest, torch, tiny_rl\n",
)

RL_GRPO = _project(
    """
    trainer = tiny_rl.grpo_trainer_with_reference(tmp_path_factory.mktemp("grpo"), max_steps=2,
                                                  reward_funcs=(tiny_rl.reward_brevity, tiny_rl.reward_matches_solution))
    trainer.train()
    return dict(trainer=trainer, group_advantages=tiny_rl.group_advantages_trl)
""",
    "trainer",
    "group_advantages",
    header="import pytest, torch, tiny_rl\n",
)

# ---- vlm ------------------------------------------------------------------------------------------

VLM_TRAINER = _project(
    """
    from trl import SFTConfig, SFTTrainer
    proc = tinyvlm.processor()
    model = tinyvlm.llava(proc.tokenizer)
    model.train()
    args = tiny.trainer_args(tmp_path_factory.mktemp("vlm"), SFTConfig, max_length=None)
    return dict(trainer=SFTTrainer(model=model, args=args, processing_class=proc, train_dataset=tinyvlm.dataset(8)),
                stages=tinyvlm.STAGES, stage_setup=tinyvlm.setup_clean(tinyvlm.STAGES))
""",
    "trainer",
    "stages",
    "stage_setup",
    header="import pytest, torch, tiny, tinyvlm\n",
)

VLM_BROKEN = _project(
    """
    proc = tinyvlm.processor()
    model = tinyvlm.llava(proc.tokenizer)
    return dict(model=model, tokenizer=proc, collator=tinyvlm.collator(proc, max_length=12),
                dataset=tinyvlm.rows(8), stages=tinyvlm.STAGES, stage_setup=tinyvlm.setup_vision_left_trainable)
""",
    "model",
    "tokenizer",
    "collator",
    "dataset",
    "stages",
    "stage_setup",
    header="import pytest, torch, tinyvlm\n",
)

# ---- train, ckpt, smoke ---------------------------------------------------------------------------

TRAIN_LOOP = _project(
    """
    from torch import nn
    def make():
        model = tiny_train.MLP()
        optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2)
        return {"model": model, "optimizer": optimizer,
                "lr_scheduler": torch.optim.lr_scheduler.LambdaLR(optimizer, tiny_train.warmup(3))}
    data = tiny_train.blobs(64)  # a DistributedSampler, as a multi-GPU loop has: its epoch must survive T7's set_epoch
    sampler = torch.utils.data.DistributedSampler(data, num_replicas=1, rank=0, shuffle=True, seed=0)
    return dict(make_training=make, dataloader=torch.utils.data.DataLoader(data, batch_size=8, sampler=sampler),
                eval_dataloader=tiny_train.loader(32, seed=1),
                loss_fn=nn.CrossEntropyLoss(), save_checkpoint=tiny_train.save_atomic,
                load_checkpoint=tiny_train.load_all)
""",
    "make_training",
    "dataloader",
    "eval_dataloader",
    "loss_fn",
    "save_checkpoint",
    "load_checkpoint",
    header="import pytest, torch, tiny_train\n",
)

TRAIN_SFT = _project(
    """
    from datasets import Dataset
    from trl import SFTConfig, SFTTrainer
    tok = tiny.tokenizer()
    train = Dataset.from_dict({"prompt": tiny.PROMPTS[:4] * 3, "completion": tiny.COMPLETIONS[:4] * 3})
    held_out = Dataset.from_dict({"prompt": tiny.PROMPTS[4:], "completion": tiny.COMPLETIONS[4:]})
    args = tiny.trainer_args(tmp_path_factory.mktemp("sft"), SFTConfig, learning_rate=1e-3, warmup_steps=1)
    return dict(trainer=SFTTrainer(model=tiny.llama(tok), args=args, processing_class=tok, train_dataset=train,
                                   eval_dataset=held_out))
""",
    "trainer",
)


# ---- dist: the user's DDP loop launched in two processes (tests/dist/tiny_dist.py) -------------------

DIST_DDP = _project(
    """
    import tiny_dist as td
    return dict(make_training=td.make_training, dist_wrap=td.wrap_ddp, dist_setup=td.seed_per_rank,
                make_dataloader=td.distributed_loader, start_epoch=td.set_epoch, train_step=td.step_global_tokens,
                compute_loss=td.token_loss, save_checkpoint=td.save_dcp, load_checkpoint=td.load_dcp)
    """,
    "make_training",
    "dist_wrap",
    "dist_setup",
    "make_dataloader",
    "start_epoch",
    "train_step",
    "compute_loss",
    "save_checkpoint",
    "load_checkpoint",
)


#: (domains run together, {directory: conftest.py source}): one in-process run per group
GROUPS: list[tuple[tuple[str, ...], dict[str, str]]] = [
    (
        ("llm",),
        {
            "llm_hand": LLM_HAND,
            "llm_broken": LLM_BROKEN,
            "llm_packed": LLM_PACKED,
            "llm_sft": LLM_SFT,
            "llm_dpo": LLM_DPO,
        },
    ),
    (
        ("vision",),
        {
            "vision_cls": VISION_CLS,
            "vision_cls_broken": VISION_CLS_BROKEN,
            "vision_det": VISION_DET,
            "vision_det_broken": VISION_DET_BROKEN,
            "vision_seg": VISION_SEG,
        },
    ),
    (("diffusion",), {"diffusion_clean": DIFFUSION_CLEAN, "diffusion_broken": DIFFUSION_BROKEN}),
    (("rl",), {"rl_cleanrl": RL_CLEANRL, "rl_sb3": RL_SB3, "rl_grpo": RL_GRPO}),
    (("vlm",), {"vlm_trainer": VLM_TRAINER, "vlm_broken": VLM_BROKEN}),
    (("train", "ckpt", "smoke"), {"train_loop": TRAIN_LOOP, "train_sft": TRAIN_SFT, "train_dpo": LLM_DPO}),
    (("dist",), {"dist_ddp": DIST_DDP}),
]
PROJECTS = {domain: projects for domains, projects in GROUPS for domain in domains}
