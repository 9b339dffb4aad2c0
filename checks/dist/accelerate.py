"""Accelerate users in the dist launch: a ``dlcheck_make_training`` whose dict holds their ``Accelerator`` (the
accelerate kind of pytest_dlcheck.training) runs in every rank as their script runs under ``accelerate launch``.

- Accelerate keeps its process state in class-level singletons (``PartialState``, ``AcceleratorState``,
  ``GradientState``); a forked rank inherits the pytest process's, which describe one process without
  distribution. :func:`reset_state` forgets them once the rank's process group is up, so the user's
  ``Accelerator()`` reads this rank's environment (RANK, WORLD_SIZE, the gloo group: ``MULTI_CPU`` on CPU) and
  ``accelerator.prepare(model)`` wraps the model in DistributedDataParallel itself (no ``dlcheck_dist_wrap``).
- The rank's data is the user's own DataLoader, never a stand-in: the one their factory prepared (in its dict,
  else the first one its Accelerator prepared), sharded by Accelerate's ``BatchSamplerShard``; else a DataLoader
  their dict holds that never went through ``accelerator.prepare`` (each rank then iterates the whole dataset,
  which D3 judges), else ``dlcheck_dataloader``, both as they are (of the fixture D3 says it was not judged: the
  script may prepare its loader outside the factory); a loader the dict keys as an evaluation one (eval, val,
  valid, test, dev as a word of the key) is never the training loader; :func:`indices` lists the indices the loader yields
  this epoch on this rank, as its ``__iter__`` draws them (the random generators synchronised from rank 0 first,
  a collective every rank calls at the same point); :func:`describe` adds how many examples Accelerate's own
  sharding repeats (``even_batches``) or leaves out (``drop_last``) by design, D3's allowance."""

from __future__ import annotations

import os
import re
import sys
from typing import Any

from ...training.accelerate import accelerator_of

#: where the loader of an Accelerate user's ranks comes from (D3 and D4 say so)
FROM_FACTORY = "dlcheck_make_training"
#: the user's dlcheck_dataloader, as it is: their factory's Accelerator prepared no (training) DataLoader
FROM_ROLE_PREFIX = "dlcheck_dataloader (dlcheck_make_training's Accelerator prepared no"
FROM_ROLE = f"{FROM_ROLE_PREFIX} DataLoader)"


def reset_state(cpu: bool) -> None:
    """Forget the Accelerate singletons inherited from the parent process (nothing to forget when it never
    imported Accelerate, as in a spawned rank); ranks without a GPU of their own get ``ACCELERATE_USE_CPU=true``,
    as ``accelerate launch --cpu`` sets it, so a plain ``Accelerator()`` runs them as ``MULTI_CPU`` processes."""
    if cpu:
        os.environ["ACCELERATE_USE_CPU"] = "true"
    state = sys.modules.get("accelerate.state")
    if state is None:
        return
    state.AcceleratorState._reset_state(reset_partial_state=True)
    state.GradientState._reset_state()


def is_prepared_loader(obj: Any) -> bool:
    """A DataLoader returned by ``accelerator.prepare`` (``DataLoaderShard`` / ``DataLoaderDispatcher``)."""
    return any(
        c.__module__.startswith("accelerate.") and c.__name__ in ("DataLoaderShard", "DataLoaderDispatcher")
        for c in type(obj).__mro__
    )


#: words of a dict key that name an evaluation loader, never the training one (matched as whole words of the key:
#: "val" names val_loader, not retrieval_loader; "test" names test_dl, not latest_loader)
EVAL_WORDS = frozenset({"eval", "evaluation", "val", "valid", "validation", "test", "testing", "dev"})
TRAIN_WORDS = frozenset({"train", "training"})


def key_words(key: Any) -> set[str]:
    """The words of a dict key, lower-cased: split on ``_ . -``, spaces, digits and camelCase humps."""
    text = re.sub(r"([a-z])([A-Z])", r"\1_\2", str(key))
    return {w for w in re.split(r"[_.\-\s\d]+", text.lower()) if w}


def names_eval(key: Any) -> bool:
    """The key names an evaluation loader (eval / val / valid / test / dev ... as a word of it) and not training."""
    words = key_words(key)
    return bool(words & EVAL_WORDS) and not words & TRAIN_WORDS


def _training_candidates(state: dict[str, Any], keep: Any) -> list[tuple[Any, Any]]:
    """The (key, value) pairs of the factory's dict that ``keep`` accepts and that may be the training loader: a
    key naming "train" first, then keys naming neither training nor evaluation; never an evaluation-keyed one."""
    found = [(k, v) for k, v in state.items() if keep(v) and not names_eval(k)]
    return sorted(found, key=lambda kv: not key_words(kv[0]) & TRAIN_WORDS)


def from_role(built_by: Any) -> bool:
    """The ranks iterate ``dlcheck_dataloader`` as it is, because the factory's Accelerator prepared no training
    DataLoader (:func:`loader_of`)."""
    return isinstance(built_by, str) and built_by.startswith(FROM_ROLE_PREFIX)


def loader_of(state: dict[str, Any], given: Any) -> tuple[Any, str]:
    """(this rank's loader, where it comes from): the user's own, never a stand-in — a prepared DataLoader in the
    factory's dict (a key naming "train" first, then one naming no evaluation), else the first DataLoader the
    factory's Accelerator prepared that its dict does not key as an evaluation loader, else a DataLoader in the
    dict that was not prepared (the same order), else ``given`` (dlcheck_dataloader); the last two as they are, as
    the user's script iterates them (D3 judges what the first does to the shards; of the second it says it was not
    judged). A loader keyed eval / val / valid / test / dev is never taken for the training one."""
    from torch.utils.data import DataLoader

    found = _training_candidates(state, is_prepared_loader)
    if found:
        return found[0][1], f"{FROM_FACTORY} (state[{found[0][0]!r}])"
    evaluation = {id(v): k for k, v in state.items() if names_eval(k)}
    accelerator = accelerator_of(state)
    for loader in getattr(accelerator, "_dataloaders", None) or []:
        if is_prepared_loader(loader) and id(loader) not in evaluation:
            return loader, f"{FROM_FACTORY} (the DataLoader it passed to accelerator.prepare)"
    plain = _training_candidates(state, lambda v: isinstance(v, DataLoader))
    if plain:
        return plain[0][1], f"{FROM_FACTORY} (state[{plain[0][0]!r}])"
    prepared_eval = [k for k, v in state.items() if names_eval(k) and is_prepared_loader(v)]
    if prepared_eval:
        return given, (
            f"{FROM_ROLE_PREFIX} training DataLoader: only {', '.join(f'state[{k!r}]' for k in prepared_eval)}, "
            "keyed as an evaluation loader, which is not trained on)"
        )
    if given is None or accelerator is None:
        return given, "dlcheck_dataloader"
    return given, FROM_ROLE


def _shard_sampler(loader: Any) -> Any:
    """The batch sampler the prepared loader iterates: Accelerate's ``BatchSamplerShard``, or the user's own
    batch sampler when the Accelerator that prepared it ran one process (nothing sharded); None for a
    dispatcher or an iterable dataset."""
    for candidate in (getattr(loader, "batch_sampler", None), getattr(loader, "sampler", None)):
        if type(candidate).__name__ == "BatchSamplerShard":
            return candidate
    dispatched = any(c.__name__ == "DataLoaderDispatcher" for c in type(loader).__mro__)
    batches = getattr(loader, "batch_sampler", None)
    if not dispatched and batches is not None and hasattr(batches, "sampler") and hasattr(batches, "__iter__"):
        return batches
    return None


def _reference(shard: Any, n: int) -> tuple[int, int, int]:
    """(examples on two ranks or more, examples on none, indices yielded) when Accelerate shards ``range(n)``
    the way ``shard`` is configured: the duplicates and the drops its own sharding makes by design."""
    from accelerate.data_loader import BatchSamplerShard
    from torch.utils.data import BatchSampler

    inner = shard.batch_sampler
    per_rank = []
    for r in range(shard.num_processes):
        ref = BatchSamplerShard(
            BatchSampler(range(n), inner.batch_size, inner.drop_last),
            num_processes=shard.num_processes,
            process_index=r,
            split_batches=shard.split_batches,
            even_batches=shard.even_batches,
        )
        per_rank.append([i for batch in ref for i in batch])
    seen: dict[int, int] = {}
    for got in per_rank:
        for i in set(got):
            seen[i] = seen.get(i, 0) + 1
    return sum(1 for c in seen.values() if c > 1), n - len(seen), sum(len(g) for g in per_rank)


def describe(loader: Any, n: int | None) -> dict[str, Any]:
    """D3's description of a prepared loader: the sampler inside Accelerate's shard, and its allowances."""
    shard = _shard_sampler(loader)
    if shard is None:
        return {
            "type": type(loader).__name__,
            "sampler": None,
            "no_indices": f"a {type(loader).__name__} (rank 0 reads every batch and sends each rank its slice, or "
            "the dataset is iterable): the ranks' indices cannot be listed",
        }
    from torch.utils.data import RandomSampler

    if type(shard).__name__ != "BatchSamplerShard":  # prepared by an Accelerator of one process: not sharded
        sampler = getattr(shard, "sampler", None)
        return {
            "type": type(loader).__name__,
            "sampler": type(sampler).__name__,
            "shuffle": isinstance(sampler, RandomSampler),
            "drop_last": getattr(shard, "drop_last", None),
            "sampler_rank": None,
            "sampler_replicas": None,
            "batch_size": getattr(shard, "batch_size", None),
            "unsharded": True,
        }
    inner = shard.batch_sampler
    sampler = getattr(inner, "sampler", None)
    info = {
        "type": type(loader).__name__,
        "sampler": "BatchSamplerShard",
        "inner": type(sampler).__name__,
        "shuffle": isinstance(sampler, RandomSampler),
        "drop_last": getattr(inner, "drop_last", None),
        "sampler_rank": shard.process_index,
        "sampler_replicas": shard.num_processes,
        "batch_size": getattr(inner, "batch_size", None),
        "even_batches": shard.even_batches,
        "split_batches": shard.split_batches,
    }
    if n:
        try:
            info["padding"], info["dropped"], info["expected_total"] = _reference(shard, n)
        except Exception:  # noqa: BLE001 - a custom batch sampler: D3 falls back on DistributedSampler's rule
            pass
    return info


def indices(loader: Any, saved_rng: Any, epoch: int) -> list[int] | None:
    """The indices the prepared loader yields on this rank in its pass of ``epoch``: what its ``__iter__`` does
    before fetching (the generators synchronised from rank 0, the sampler's epoch set: the loader counts its
    passes itself, so epoch 1 is its second pass even after a pass cut short), then its batch sampler listed;
    the generators put back afterwards, so the pass itself draws the same order. A collective: every rank calls
    it at the same point."""
    shard = _shard_sampler(loader)
    if shard is None:
        return None
    from accelerate.utils import synchronize_rng_states

    generator = getattr(loader, "synchronized_generator", None)
    sampler = getattr(getattr(shard, "batch_sampler", shard), "sampler", None)
    with saved_rng(generator, getattr(sampler, "generator", None)):
        if getattr(loader, "rng_types", None):
            synchronize_rng_states(loader.rng_types, generator)
        if hasattr(loader, "set_epoch"):
            loader.set_epoch(max(getattr(loader, "iteration", 0), epoch))
        return [int(i) for batch in shard for i in batch]
