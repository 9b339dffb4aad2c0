"""Roles: the user's objects, handed over as ``dlcheck_<role>`` fixtures, and what can be derived from
what. A role that is neither given nor derivable resolves to :data:`MISSING`; the check that needs it
skips with one line naming the fixture to add."""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from .errors import MISSING, RoleError


@dataclass(frozen=True)
class Role:
    name: str
    help: str
    #: how else it can be had, for the skip line ("or dlcheck_trainer")
    alternatives: str = ""
    #: the role's contract: value -> what is wrong with it, or None when it can be this role
    expect: Callable[[Any], str | None] | None = None

    @property
    def fixture(self) -> str:
        return f"dlcheck_{self.name}"

    def hint(self) -> str:
        return self.fixture + (f" (or {self.alternatives})" if self.alternatives else "")


ROLES: dict[str, Role] = {}


def role(name: str, help: str, alternatives: str = "", expect: Callable[[Any], str | None] | None = None) -> Role:
    ROLES[name] = Role(name, help, alternatives, expect)
    return ROLES[name]


# ---- contracts: what a role's value must at least be. They only reject what no check could use (a
# number for a model, a non-callable collator, a dict of splits for a dataset), never an unusual but
# valid object.


def _kind(value: Any) -> str:
    text = repr(value)
    return f"a {type(value).__name__} ({text if len(text) <= 40 else text[:37] + '...'})"


def _scalar(value: Any) -> bool:
    return isinstance(value, (str, bytes, int, float, complex, bool))


def an_object(what: str) -> Callable[[Any], str | None]:
    def expect(value: Any) -> str | None:
        return f"is {_kind(value)}, expected {what}" if _scalar(value) else None

    return expect


def _config_or_path(value: Any) -> str | None:
    if isinstance(value, (str, os.PathLike)):
        return None if os.path.exists(value) else f"is a path that does not exist ({str(value)[:80]!r})"
    return an_object("the inference config (a PretrainedConfig, a dict or a config.json path)")(value)


def a_callable(what: str) -> Callable[[Any], str | None]:
    def expect(value: Any) -> str | None:
        return None if callable(value) else f"is {_kind(value)}, expected {what} (a callable)"

    return expect


def _splits(value: Any) -> str | None:
    if type(value).__name__ in ("DatasetDict", "IterableDatasetDict"):
        return f"is a {type(value).__name__} with splits {list(value)}: return one split, e.g. ds[{next(iter(value), 'train')!r}]"
    return None


def data(what: str) -> Callable[[Any], str | None]:
    from collections.abc import Mapping

    def expect(value: Any) -> str | None:
        if _scalar(value):
            return f"is {_kind(value)}, expected {what}"
        found = _splits(value)
        if found:
            return found
        if isinstance(value, Mapping):
            return f"is a {type(value).__name__} with keys {list(value)[:6]}, expected {what} (a sequence of examples)"
        if not (hasattr(value, "__iter__") or hasattr(value, "__getitem__")):
            return f"is {_kind(value)}, expected {what} (iterable, or indexable with a length)"
        return None

    return expect


def loader(what: str) -> Callable[[Any], str | None]:
    from collections.abc import Mapping

    def expect(value: Any) -> str | None:
        if _scalar(value) or isinstance(value, Mapping) or not hasattr(value, "__iter__"):
            return f"is {_kind(value)}, expected {what} (an iterable of batches, e.g. a torch DataLoader)"
        return None

    return expect


def _model(value: Any) -> str | None:
    from collections.abc import Mapping

    if isinstance(value, Mapping):
        return (
            f"is a {type(value).__name__} with keys {list(value)[:4]} (a state_dict?), expected the model (a "
            "torch.nn.Module): build the model and load_state_dict into it"
        )
    if _scalar(value) or not callable(value):
        return f"is {_kind(value)}, expected the model (a torch.nn.Module, callable on a batch)"
    return None


def _tokenizer(value: Any) -> str | None:
    if _scalar(value) or not (callable(value) or hasattr(value, "encode") or hasattr(value, "tokenizer")):
        return f"is {_kind(value)}, expected a tokenizer or processor (callable on text, with encode/decode)"
    return None


def _optimizer(value: Any) -> str | None:
    return None if hasattr(value, "param_groups") else f"is {_kind(value)}, expected an optimizer (with param_groups)"


def _scheduler(value: Any) -> str | None:
    return (
        None
        if callable(getattr(value, "step", None))
        else f"is {_kind(value)}, expected a learning-rate scheduler (with step())"
    )


def given(name: str, value: Any) -> Any:
    """A value a user's fixture returned, as the checks may use it: None means "not provided" (MISSING);
    one that breaks the role's contract raises RoleError naming the role and what is wrong."""
    if value is None or value is MISSING:
        return MISSING
    spec = ROLES.get(name)
    problem = spec.expect(value) if spec is not None and spec.expect is not None else None
    if problem:
        raise RoleError(name, problem)
    return value


role(
    "trainer",
    "a transformers Trainer or a TRL SFTTrainer/DPOTrainer/GRPOTrainer; derives the roles below",
    expect=an_object("a trainer object"),
)
role("model", "the model being trained (torch.nn.Module, e.g. AutoModelForCausalLM)", "dlcheck_trainer", expect=_model)
role(
    "twin_model",
    "with --dlcheck-twin: a small model of the same architecture as yours (or a callable returning one), for "
    "models whose class cannot be rebuilt from a transformers/diffusers config",
)
role("tokenizer", "the tokenizer or processor", "dlcheck_trainer", expect=_tokenizer)
role(
    "collator",
    "callable: list of examples -> batch dict",
    "dlcheck_trainer",
    expect=a_callable("the collator: list of examples -> batch"),
)
role(
    "dataset",
    "the training examples, as the collator takes them (map-style or iterable)",
    "dlcheck_trainer",
    expect=data("the training examples"),
)
role(
    "raw_dataset",
    "the training examples with every field (prompt, completion, messages) before a Trainer removes "
    "unused columns; defaults to dlcheck_dataset",
    "dlcheck_dataset, or dlcheck_trainer",
    expect=data("the training examples with every field"),
)
role(
    "dataloader",
    "the training DataLoader",
    "dlcheck_collator + dlcheck_dataset, or dlcheck_trainer",
    expect=loader("the training dataloader"),
)
role(
    "eval_dataset",
    "the evaluation examples, as the collator takes them",
    "dlcheck_trainer",
    expect=data("the evaluation examples"),
)
role(
    "eval_dataloader",
    "the evaluation DataLoader",
    "dlcheck_collator + dlcheck_eval_dataset, or dlcheck_trainer",
    expect=loader("the evaluation dataloader"),
)
role("optimizer", "the optimizer", "dlcheck_trainer", expect=_optimizer)
role("lr_scheduler", "the learning-rate scheduler", "dlcheck_trainer", expect=_scheduler)
role(
    "training_args",
    "transformers TrainingArguments / TRL config",
    "dlcheck_trainer",
    expect=an_object("the training arguments (TrainingArguments or a TRL config)"),
)
role(
    "compute_metrics",
    "the eval metric function (EvalPrediction -> dict)",
    "dlcheck_trainer",
    expect=a_callable("the metric function: EvalPrediction -> dict"),
)
role(
    "preprocess_logits_for_metrics",
    "the Trainer's preprocess_logits_for_metrics (logits, labels) -> logits",
    "dlcheck_trainer",
    expect=a_callable("preprocess_logits_for_metrics: (logits, labels) -> logits"),
)
role(
    "inference_config",
    "the model config used at inference (for train/inference comparisons): a "
    "PretrainedConfig, a dict, or the path of a config.json / model directory",
    expect=_config_or_path,
)


def is_hf_trainer(obj: Any) -> bool:
    return any(
        c.__module__.startswith(("transformers.", "trl.")) and c.__name__.endswith("Trainer") for c in type(obj).__mro__
    )


def _trainer_split(trainer: Any, split: str) -> Any:
    dataset = trainer.train_dataset if split == "train" else trainer.eval_dataset
    return MISSING if dataset is None or isinstance(dataset, dict) else dataset


def _trainer_collation(trainer: Any, split: str) -> tuple[Any, Any]:
    """(collator, dataset) exactly as the trainer's own ``_get_dataloader`` pairs them, without building
    an accelerate-prepared DataLoader (which would register itself on the user's trainer)."""
    dataset = _trainer_split(trainer, split)
    if dataset is MISSING:
        return MISSING, MISSING
    description = "training" if split == "train" else "evaluation"
    collator = trainer.data_collator
    try:
        import datasets

        if isinstance(dataset, datasets.Dataset):
            return collator, trainer._remove_unused_columns(dataset, description=description)
    except ImportError:
        pass
    return trainer._get_collator_with_removed_columns(collator, description=description), dataset


def _from_trainer(name: str, trainer: Any, cache: Callable[[str, Callable[[], Any]], Any]) -> Any:
    """Derive a role from an HF/TRL trainer. The collator and examples are paired as the trainer's own
    dataloader pairs them, so what the checks collate is exactly what training collates (unused columns
    removed)."""
    if name == "model":
        return trainer.model
    if name == "tokenizer":
        tok = getattr(trainer, "processing_class", None) or getattr(trainer, "tokenizer", None)
        if tok is None:
            # a Trainer built without processing_class (peft's DoRA example): its collator holds the tokenizer it
            # pads with (DataCollatorForLanguageModeling, DataCollatorWithPadding, ...)
            collator = getattr(trainer, "data_collator", None)
            found = getattr(collator, "tokenizer", None) or getattr(collator, "processing_class", None)
            tok = found if found is not None and hasattr(found, "convert_ids_to_tokens") else None
        return tok if tok is not None else MISSING
    if name == "training_args":
        return trainer.args
    if name == "optimizer":
        return trainer.optimizer if trainer.optimizer is not None else MISSING
    if name == "lr_scheduler":
        return trainer.lr_scheduler if trainer.lr_scheduler is not None else MISSING
    if name in ("compute_metrics", "preprocess_logits_for_metrics"):
        value = getattr(trainer, name, None)
        return value if value is not None else MISSING
    if name == "raw_dataset":
        return _trainer_split(trainer, "train")
    if name in ("collator", "dataset"):
        collator, dataset = cache("collation:train", lambda: _trainer_collation(trainer, "train"))
        return collator if name == "collator" else dataset
    if name == "eval_dataset":
        return cache("collation:eval", lambda: _trainer_collation(trainer, "eval"))[1]
    if name in ("dataloader", "eval_dataloader"):
        # a plain DataLoader over the trainer's own (collator, dataset) pairing: get_train_dataloader()
        # would register an accelerate-prepared loader on the user's trainer
        split = "train" if name == "dataloader" else "eval"
        collator, dataset = cache(f"collation:{split}", lambda: _trainer_collation(trainer, split))
        if dataset is MISSING:
            return MISSING
        size = trainer.args.per_device_train_batch_size if split == "train" else trainer.args.per_device_eval_batch_size
        return cache(f"dataloader:{split}", lambda: _plain_dataloader(dataset, collator, size))
    return MISSING


Deriver = Callable[[str, Callable[[str], Any], Callable[[Any, str, Callable[[], Any]], Any]], Any]

#: functions (name, get, cache) -> value or MISSING; a domain registers its own (a diffusers pipeline
#: gives its vae/unet/scheduler…) with :func:`deriver`
DERIVERS: list[Deriver] = []


def deriver(func: Deriver) -> Deriver:
    DERIVERS.append(func)
    return func


def derive(name: str, get: Callable[[str], Any], cache: Callable[[Any, str, Callable[[], Any]], Any]) -> Any:
    """Derive role ``name`` from the other roles (``get(role)`` resolves one, MISSING if absent).
    ``cache(source, key, make)`` memoises per source object so a derived object is built once. Derivers
    may ask for each other's roles; a role already being derived resolves to MISSING, which breaks
    cycles (a unet derived from a model derived from a unet…)."""
    if name in _DERIVING:
        return MISSING
    _DERIVING.add(name)
    try:
        for func in DERIVERS:
            value = func(name, get, cache)
            if value is not MISSING:
                return value
        return MISSING
    finally:
        _DERIVING.discard(name)


_DERIVING: set[str] = set()


@deriver
def from_trainer(name: str, get: Callable[[str], Any], cache: Callable[[Any, str, Callable[[], Any]], Any]) -> Any:
    if name == "trainer":
        return MISSING
    trainer = get("trainer")
    if trainer is MISSING or not is_hf_trainer(trainer):
        return MISSING
    return _from_trainer(name, trainer, lambda key, make: cache(trainer, key, make))


@deriver
def from_collator_and_dataset(
    name: str, get: Callable[[str], Any], cache: Callable[[Any, str, Callable[[], Any]], Any]
) -> Any:
    if name == "raw_dataset":
        return get("dataset")
    if name in ("dataloader", "eval_dataloader"):
        collator = get("collator")
        dataset = get("dataset" if name == "dataloader" else "eval_dataset")
        if collator is not MISSING and dataset is not MISSING:
            return cache((collator, dataset), name, lambda: _plain_dataloader(dataset, collator))
    return MISSING


def _plain_dataloader(dataset: Any, collator: Any, batch_size: int = 4) -> Any:
    from torch.utils.data import DataLoader

    return DataLoader(dataset, batch_size=batch_size, shuffle=False, collate_fn=collator)
