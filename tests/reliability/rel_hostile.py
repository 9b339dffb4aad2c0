"""Hostile role values for the bad-input proofs: every one a thing a real user's conftest.py can return
by mistake — None, the wrong type, an empty or endless dataset, a dataloader that breaks at batch k,
batches with NaN/Inf, missing keys, ragged lists, wrong dtypes, tensors on the meta device, a fixture
that raises, a callable that never returns. Each case replaces one role of an otherwise valid tiny
project of its domain (built once per process and shared by every case, so the plugin's shared samples
of the valid roles are computed once).

Imported by the throwaway conftests (``rel_hostile.value(case, role)``), which run in the same process."""

from __future__ import annotations

import functools
import itertools
import math
from dataclasses import dataclass, field
from typing import Any

import rel_projects  # noqa: F401  (sys.path for tiny, tinydiff, tiny_vision; libraries imported once)
import tiny
import tiny_vision as tv
import tinydiff
import torch
from torch.utils.data import DataLoader, IterableDataset

# ---- the valid projects (built once) --------------------------------------------------------------


@functools.cache
def base(domain: str) -> dict[str, Any]:
    if domain == "llm":
        from transformers import DataCollatorForLanguageModeling

        tok = tiny.tokenizer()
        collator = DataCollatorForLanguageModeling(tok, mlm=False)
        data = tiny.tokenized(tok)
        return dict(
            tokenizer=tok,
            model=tiny.llama(tok),
            collator=collator,
            dataset=data,
            dataloader=DataLoader(data, batch_size=4, collate_fn=collator),
        )
    if domain == "vision":
        ds = tv.Shapes([i % 4 for i in range(16)], size=32, transform=tv.classification_tf(train=True))
        ev = tv.Shapes([i % 4 for i in range(8)], size=32, transform=tv.classification_tf(train=False))
        return dict(
            model=tv.resnet18(4),
            dataloader=DataLoader(ds, batch_size=8),
            eval_dataloader=DataLoader(ev, batch_size=8),
            loss_fn=torch.nn.CrossEntropyLoss(),
            eval_fn=lambda model, loader: [model(x) for x, _ in loader],
        )
    if domain == "diffusion":
        ns = tinydiff.setup()
        return {role: getattr(ns, role) for role in tinydiff.CLEAN_ROLES + ("condition",)}
    if domain == "train":  # a plain loop; the train, ckpt and smoke checks
        import tiny_train

        def make():
            model = tiny_train.MLP()
            opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
            return {
                "model": model,
                "optimizer": opt,
                "lr_scheduler": torch.optim.lr_scheduler.LambdaLR(opt, tiny_train.warmup(3)),
            }

        return dict(
            make_training=make,
            dataloader=tiny_train.loader(shuffle=True),
            eval_dataloader=tiny_train.loader(32, seed=1),
            loss_fn=torch.nn.CrossEntropyLoss(),
            save_checkpoint=tiny_train.save_atomic,
            load_checkpoint=tiny_train.load_all,
        )
    if domain == "rl":
        import tiny_rl

        from pytest_dlcheck.rl import advantage_fn

        return dict(
            model=tiny_rl.shared_agent(),
            env=tiny_rl.make_envs,
            advantage_fn=advantage_fn(tiny_rl.compute_gae, arrays="torch"),
        )
    if domain == "vlm":
        import tinyvlm

        proc = tinyvlm.processor()
        return dict(
            model=tinyvlm.llava(proc.tokenizer),
            tokenizer=proc,
            collator=tinyvlm.collator(proc),
            dataset=tinyvlm.rows(8),
            stages=tinyvlm.STAGES,
            stage_setup=tinyvlm.setup_clean(tinyvlm.STAGES),
        )
    raise KeyError(domain)


#: the roles each domain's valid project hands over (a dataloader case drops collator + dataset, which
#: the checks would otherwise prefer to a given dataloader)
ROLES = {
    "llm": ("tokenizer", "model", "collator", "dataset"),
    "vision": ("model", "dataloader", "eval_dataloader", "loss_fn", "eval_fn"),
    "diffusion": tinydiff.CLEAN_ROLES + ("condition",),
    "train": ("make_training", "dataloader", "eval_dataloader", "loss_fn", "save_checkpoint", "load_checkpoint"),
    "rl": ("model", "env", "advantage_fn"),
    "vlm": ("model", "tokenizer", "collator", "dataset", "stages", "stage_setup"),
}
#: the checks a case's project runs: its domain's (train also runs ckpt and smoke)
DOMAINS = {"train": ("train", "ckpt", "smoke")}


def roles_for(domain: str, role: str) -> tuple[str, ...]:
    roles = ROLES[domain]
    if domain == "llm" and role == "dataloader":
        roles = ("tokenizer", "model")
    if domain == "diffusion" and role == "dataloader":
        roles = tuple(r for r in roles if r not in ("dataset", "collator"))
    return tuple(dict.fromkeys(roles + (role,)))


# ---- hostile values -------------------------------------------------------------------------------


@dataclass(frozen=True)
class Case:
    domain: str
    role: str
    kind: str
    #: the parameters Hypothesis draws: k (the batch/example that breaks), field, value, dtype…
    params: tuple = field(default_factory=tuple)

    @property
    def name(self) -> str:
        return f"{self.domain}__{self.role}__{self.kind}"

    def p(self, key: str, default: Any = None) -> Any:
        return dict(self.params).get(key, default)


class UserBug(RuntimeError):
    pass


def _batches(domain: str) -> list[Any]:
    """A few valid batches of the domain, as the valid dataloader gives them."""
    loader = (
        base(domain)["dataloader"]
        if domain != "diffusion"
        else DataLoader(base(domain)["dataset"], batch_size=4, collate_fn=base(domain)["collator"])
    )
    return [b for b, _ in zip(loader, range(3))]


class Breaks:
    """An iterable of valid batches that raises at batch k (a corrupt shard, a lost worker)."""

    def __init__(self, batches: list[Any], k: int):
        self.batches, self.k = batches, k

    def __iter__(self):
        for i in itertools.count():
            if i >= self.k:
                raise UserBug(f"shard {i} is corrupt")
            yield self.batches[i % len(self.batches)]


class Endless(IterableDataset):
    """An IterableDataset that never ends (a streaming source without a stop)."""

    def __init__(self, items: list[Any]):
        self.items = items

    def __iter__(self):
        i = 0
        while True:
            yield self.items[i % len(self.items)]
            i += 1


class BrokenDataset(torch.utils.data.Dataset):
    def __init__(self, items: list[Any], k: int):
        self.items, self.k = items, k

    def __len__(self):
        return len(self.items)

    def __getitem__(self, i):
        if i >= self.k:
            raise UserBug(f"example {i}: image file is truncated")
        return self.items[i]


class Huge(torch.utils.data.Dataset):
    """A dataset claiming 10**12 examples (a sharded corpus): reading it all never ends."""

    def __init__(self, items: list[Any]):
        self.items = items

    def __len__(self):
        return 10**12

    def __getitem__(self, i):
        return self.items[i % len(self.items)]


def _map_batch(batch: Any, fn) -> Any:
    if isinstance(batch, dict) or hasattr(batch, "keys"):
        return {k: fn(k, v) for k, v in batch.items()}
    if isinstance(batch, (list, tuple)):
        return (
            type(batch)(fn(str(i), v) for i, v in enumerate(batch))
            if not isinstance(batch, tuple) or not hasattr(batch, "_fields")
            else batch
        )
    return batch


def _poison(case: Case, batch: Any) -> Any:
    """One valid batch made hostile the way ``case.kind`` says."""
    fieldname = case.p("field")
    value = case.p("value", math.nan)

    def nan(k, v):
        if isinstance(v, torch.Tensor) and v.is_floating_point():
            v = v.clone()
            v.view(-1)[case.p("at", 0) % max(v.numel(), 1)] = value
        return v

    def wrong_dtype(k, v):
        return v.to(getattr(torch, case.p("dtype", "float32"))) if isinstance(v, torch.Tensor) else v

    def meta(k, v):
        return v.to("meta") if isinstance(v, torch.Tensor) else v

    def ragged(k, v):
        if isinstance(v, torch.Tensor) and v.dim() >= 2:
            rows = v.tolist()
            rows[0] = rows[0][: max(1, len(rows[0]) - case.p("cut", 1))]
            return rows
        return v

    if case.kind == "nan":
        return _map_batch(batch, nan)
    if case.kind == "wrong_dtype":
        return _map_batch(batch, wrong_dtype)
    if case.kind == "meta":
        return _map_batch(batch, meta)
    if case.kind == "ragged":
        return _map_batch(batch, ragged)
    if case.kind == "missing_keys" and isinstance(batch, dict):
        keys = list(batch)
        drop = fieldname if fieldname in batch else keys[case.p("at", 0) % len(keys)]
        return {k: v for k, v in batch.items() if k != drop}
    return batch


def hostile(case: Case) -> Any:
    kind, domain = case.kind, case.domain
    generic = {
        "none": None,
        "int": 42,
        "str": "gpt2",
        "float": 0.5,
        "dict": {"name": "my-thing", "size": 3},
        "object": object(),
        "list_of_ints": [1, 2, 3],
    }
    if kind in generic:
        return generic[kind]
    if kind == "raises":
        raise UserBug(f"could not build dlcheck_{case.role}: config file missing")
    valid = base(domain)
    if case.role in ("dataloader", "eval_dataloader"):
        batches = _batches(domain)
        if kind == "empty":
            return DataLoader([], batch_size=4)
        if kind == "empty_list":
            return []
        if kind == "raise_at":
            return Breaks(batches, case.p("k", 0))
        if kind == "endless":
            return DataLoader(Endless([batches[0]]), batch_size=None)
        if kind == "tuples":
            return [tuple(b.values()) if isinstance(b, dict) else b for b in batches]
        if kind == "strings":
            return ["input_ids: 1 2 3"] * 3
        if kind == "none_batches":
            return [None, None]
        if kind == "hang":

            def never():
                while True:
                    pass
                yield  # unreachable: a generator that never yields

            return never()
        return [_poison(case, b) for b in batches]
    if case.role in ("dataset", "eval_dataset", "raw_dataset"):
        items = [valid["dataset"][i] for i in range(4)] if "dataset" in valid else []
        if kind == "empty":
            return []
        if kind == "missing_keys":
            return [{"text_field": "hello"} for _ in range(8)]
        if kind == "raise_at":
            return BrokenDataset(items * 3, case.p("k", 0))
        if kind == "endless":
            return Endless(items)
        if kind == "huge":
            return Huge(items)
        if kind == "float_ids":
            return [{k: [float(x) for x in v] if isinstance(v, list) else v for k, v in it.items()} for it in items]
        if kind == "ragged":  # input_ids and attention_mask of different lengths
            return (
                [{**it, "attention_mask": list(it["attention_mask"])[: -case.p("cut", 1)]} for it in items]
                if items and "attention_mask" in items[0]
                else items
            )
        if kind == "nan":
            return [
                {k: v * math.nan if isinstance(v, torch.Tensor) and v.is_floating_point() else v for k, v in it.items()}
                for it in items
            ]
        raise KeyError(kind)
    if case.role == "model":
        if kind == "meta":
            if domain == "llm":
                with torch.device("meta"):
                    return tiny.llama(valid["tokenizer"])
            return _meta_copy(valid["model"])
        if kind == "raises_forward":

            class Broken(torch.nn.Module):
                def __init__(self):
                    super().__init__()
                    self.inner = torch.nn.Linear(2, 2)

                def forward(self, *args, **kwargs):
                    raise UserBug("CUDA error: device-side assert triggered")

            return Broken()
        if kind == "swapped":
            return base("llm")["tokenizer"]
        if kind == "nan_weights":
            return _nan_copy(valid["model"])
        raise KeyError(kind)
    if case.role == "tokenizer":
        if kind == "swapped":
            return valid.get("model") or base("llm")["model"]
        raise KeyError(kind)
    # callables: collator, loss_fn, eval_fn, training_inputs, condition, sample_images, compute_metrics
    if kind == "raises_call":

        def fn(*args, **kwargs):
            raise UserBug(f"dlcheck_{case.role} failed on its input")

        return fn
    if kind == "returns_none":
        return lambda *args, **kwargs: None
    if kind == "returns_str":
        return lambda *args, **kwargs: "ok"
    if kind == "hang":

        def forever(*args, **kwargs):
            while True:
                pass

        return forever
    if kind in ("nan", "wrong_dtype", "meta", "ragged", "missing_keys"):
        original = valid[case.role]
        return lambda *args, **kwargs: _poison(case, original(*args, **kwargs))
    raise KeyError(kind)


def _meta_copy(model: torch.nn.Module) -> torch.nn.Module:
    import copy

    return copy.deepcopy(model).to_empty(device="meta")


def _nan_copy(model: torch.nn.Module) -> torch.nn.Module:
    import copy

    m = copy.deepcopy(model)
    with torch.no_grad():
        for p in m.parameters():
            p.fill_(math.nan)
    return m


def value(case: Case, role: str) -> Any:
    """What fixture dlcheck_<role> of the case's project returns. The plain loop's factory is wrapped
    per case: the plugin keys its training set-up on it (see test_a_shared_factory_keeps_each_projects_roles)."""
    if role == case.role:
        return hostile(case)
    valid = base(case.domain)[role]
    if role == "make_training":
        return _FACTORIES.setdefault(case, lambda: valid())
    return valid


_FACTORIES: dict[Case, Any] = {}


# ---- the cases ------------------------------------------------------------------------------------

GENERIC = ("none", "int", "str", "dict", "object", "raises", "needs_missing")
#: the core roles have contracts (roles.given): one wrong type is as good as another there
CORE_GENERIC = ("none", "int", "dict", "raises", "needs_missing")
LOADER = (
    "empty",
    "empty_list",
    "raise_at",
    "endless",
    "tuples",
    "strings",
    "none_batches",
    "nan",
    "wrong_dtype",
    "meta",
    "ragged",
    "missing_keys",
)
DATA = ("empty", "missing_keys", "raise_at", "endless", "huge", "float_ids", "ragged")
CALLABLE = ("raises_call", "returns_none", "returns_str", "nan", "meta", "ragged", "missing_keys")

KINDS: dict[tuple[str, str], tuple[str, ...]] = {
    ("llm", "tokenizer"): CORE_GENERIC + ("swapped",),
    ("llm", "model"): CORE_GENERIC + ("meta", "raises_forward", "swapped", "nan_weights"),
    ("llm", "collator"): CORE_GENERIC + CALLABLE + ("wrong_dtype",),
    ("llm", "dataset"): CORE_GENERIC + DATA,
    ("llm", "raw_dataset"): ("none", "int", "dict", "empty", "missing_keys", "endless", "huge"),
    ("llm", "dataloader"): CORE_GENERIC + LOADER,
    ("llm", "eval_dataset"): ("none", "int", "empty", "missing_keys", "raise_at"),
    ("llm", "documents"): ("none", "int", "dict", "raises", "empty", "endless", "huge"),
    ("llm", "compute_metrics"): ("int", "raises", "raises_call", "returns_none", "returns_str"),
    ("llm", "training_args"): ("int", "dict", "object", "raises"),
    ("llm", "trainer"): ("int", "str", "dict", "object", "raises"),
    ("vision", "model"): CORE_GENERIC + ("object", "meta", "raises_forward", "nan_weights"),
    ("vision", "dataloader"): CORE_GENERIC + LOADER,
    ("vision", "eval_dataloader"): ("none", "int", "empty", "raise_at", "nan", "meta", "tuples"),
    ("vision", "loss_fn"): ("int", "str", "raises", "raises_call", "returns_none"),
    ("vision", "eval_fn"): ("int", "raises", "raises_call", "returns_none", "returns_str"),
    ("vision", "num_classes"): ("none", "str", "dict", "object", "raises"),
    ("vision", "box_format"): ("int", "dict", "raises"),
    ("diffusion", "pipeline"): GENERIC,
    ("diffusion", "noise_scheduler"): GENERIC,
    ("diffusion", "training_inputs"): GENERIC + CALLABLE,
    ("diffusion", "condition"): ("int", "raises", "raises_call", "returns_none", "returns_str", "nan", "meta"),
    ("diffusion", "dataset"): ("none", "int", "empty", "raise_at", "endless", "huge"),
    ("diffusion", "collator"): ("int", "raises", "raises_call", "returns_none", "nan", "meta", "missing_keys"),
    ("diffusion", "dataloader"): ("empty", "raise_at", "endless", "nan", "meta", "missing_keys", "none_batches"),
    ("diffusion", "ema"): GENERIC,
    ("diffusion", "sample_images"): ("int", "raises", "raises_call", "returns_none", "returns_str"),
    ("train", "make_training"): ("none", "int", "dict", "raises", "raises_call", "returns_none", "returns_str"),
    ("train", "dataloader"): ("empty", "raise_at", "endless", "nan", "strings", "none_batches"),
    ("train", "save_checkpoint"): ("int", "raises_call", "returns_str"),
    ("train", "load_checkpoint"): ("int", "raises_call"),
    ("rl", "env"): ("none", "int", "str", "raises", "raises_call"),
    ("rl", "advantage_fn"): ("int", "raises", "raises_call", "returns_none", "returns_str"),
    ("vlm", "stages"): ("none", "int", "str", "list_of_ints", "raises"),
    ("vlm", "stage_setup"): ("int", "raises_call", "returns_str"),
    ("vlm", "dataset"): ("empty", "missing_keys", "raise_at"),
}

#: roles a RoleError may name for a case of this role: the role, what is derived from it, and the
#: object that consumed it (a collator fed broken examples)
CONSUMERS = {"model", "condition", "training_inputs", "eval_fn", "loss_fn"}
RELATED = {
    "dataset": {"dataset", "raw_dataset", "collator", "dataloader", "eval_dataset"} | CONSUMERS,
    "raw_dataset": {"raw_dataset", "dataset"},
    "eval_dataset": {"eval_dataset", "collator", "eval_dataloader"} | CONSUMERS,
    "collator": {"collator", "dataloader", "eval_dataloader"} | CONSUMERS,
    "dataloader": {"dataloader"} | CONSUMERS,
    "eval_dataloader": {"eval_dataloader"} | CONSUMERS,
    "model": {"model", "unet", "eval_fn", "sample_images", "training_inputs", "condition", "compute_metrics"},
    "trainer": {"trainer", "model", "tokenizer", "collator", "dataset", "dataloader", "training_args"},
    "pipeline": {"pipeline", "unet", "vae", "text_encoder", "tokenizer", "inference_scheduler", "uncond"},
    "training_inputs": {"training_inputs", "condition"},
}


def related(role: str) -> set[str]:
    return RELATED.get(role, {role})


#: checks that can meet a case's role: they declare it or a role derived from it
DERIVED = {
    "dataset": ("dataset", "raw_dataset", "dataloader", "eval_dataset", "eval_dataloader"),
    "raw_dataset": ("raw_dataset",),
    "collator": ("collator", "dataloader", "eval_dataloader"),
    "eval_dataset": ("eval_dataset", "eval_dataloader"),
    "trainer": (
        "trainer",
        "model",
        "tokenizer",
        "collator",
        "dataset",
        "dataloader",
        "training_args",
        "optimizer",
        "lr_scheduler",
        "compute_metrics",
        "eval_dataset",
        "raw_dataset",
    ),
    "pipeline": ("pipeline", "unet", "vae", "text_encoder", "tokenizer", "inference_scheduler", "uncond", "model"),
    "model": ("model", "unet", "num_classes"),
    "training_inputs": ("training_inputs", "condition"),
}


def reach(role: str) -> set[str]:
    """The role and the roles derived from it: what a check reads when it reads the case's value."""
    return set(DERIVED.get(role, (role,)))


#: values no check can judge anything on: a check that read one (resolved the role to it) and passed judged
#: nothing, so the pass is a false "clean" (None is no such value: it means "not given")
UNUSABLE = {
    "int",
    "str",
    "float",
    "dict",
    "object",
    "list_of_ints",
    "swapped",
    "raises_call",
    "returns_none",
    "returns_str",
    "raises_forward",
    "meta",
    "empty",
    "empty_list",
    "strings",
    "none_batches",
}
#: the user's object raises on any input: on an input the check made up, that is reported as pytest-dlcheck's
#: internal error naming the object and the input (the plugin cannot tell it from a bug of its own input)
RAISING = {"raises_call", "raises_forward"}


def selected(checks: dict, case: Case) -> list[str]:
    reach = set(DERIVED.get(case.role, (case.role,)))
    return [
        cid
        for cid, c in checks.items()
        if c.domain in DOMAINS.get(case.domain, (case.domain,))
        and (reach & (set(c.roles) | set(c.optional_roles)) or not (c.roles or c.optional_roles))
    ]
