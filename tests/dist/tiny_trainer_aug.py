"""Tiny real transformers ``Trainer`` users whose dataset augments each example at random (a token-replacement noise
drawn in ``__getitem__``, as a noising / span-corruption dataset does), for D4 in the dist launch. The Trainer calls
``set_seed(args.seed)`` in every process, so what decides whether the ranks draw the same noise is where the dataset
draws from and whether DataLoader workers run:

- ``global`` with ``dataloader_num_workers=1``: correct by construction — the Trainer's ``seed_worker`` reseeds
  random / NumPy / torch in every worker with ``num_workers * process_index + torch.initial_seed()``
  (transformers PR #37980), so each rank's worker draws its own noise;
- ``global`` with ``dataloader_num_workers=0`` (the default): buggy — the noise is drawn in the main process from
  torch's global generator, which ``set_seed(args.seed)`` left in the same state on every rank (transformers issue
  #37932 is this report for workers);
- ``import`` with ``dataloader_num_workers=1``: buggy — the noise comes from a ``torch.Generator`` seeded once, at
  import, with a fixed seed: the same stream on every rank, which neither ``set_seed`` nor ``seed_worker`` reaches.
  But the dist launch forks its ranks from the pytest process, which imported the module: they inherit that one
  generator, as they would one seeded from the OS (``entropy``), so D4 cannot tell it (not judged, saying why);
- ``entropy``: correct under torchrun — the dataset draws from a NumPy ``Generator`` built with ``default_rng()``
  (seeded from the OS, as albumentations 2.x's ``A.Compose`` does without ``seed``) when the dataset is built: each
  process of a real launch builds its own; the forked ranks inherit the pytest process's (not judged, saying why);
- ``lazy`` with ``dataloader_num_workers=0``: buggy — the dataset builds its ``torch.Generator`` seeded with a fixed
  seed at its first fetch, in the process that fetches: in every rank, alike (D4 fails).

Imported by the throwaway user projects (and, in their rank processes, through the fork)."""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import torch
from transformers import DataCollatorForLanguageModeling, Trainer

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
import tiny  # noqa: E402

#: buggy: seeded once at import with a fixed seed, the same on every rank
NOISE = torch.Generator().manual_seed(1234)
#: the share of tokens replaced by a random token
REPLACE = 0.3


class NoisyTokens(torch.utils.data.Dataset):
    """Tokenized examples whose tokens are replaced at random (probability ``REPLACE``) every time one is fetched;
    the draws come from torch's global generator (``source="global"``), from the module's ``NOISE``
    (``source="import"``), from a NumPy generator seeded from the OS when the dataset is built (``"entropy"``) or
    from a ``torch.Generator`` seeded with a fixed seed at the first fetch (``"lazy"``)."""

    def __init__(self, examples: list[dict], vocab: int, source: str = "global"):
        self.examples, self.vocab, self.source = examples, vocab, source
        self.rng = np.random.default_rng() if source == "entropy" else None
        self.gen: torch.Generator | None = None

    def __len__(self) -> int:
        return len(self.examples)

    def __getitem__(self, i: int) -> dict:
        ids = torch.tensor(self.examples[i]["input_ids"])
        if self.rng is not None:
            replace = torch.from_numpy(self.rng.random(ids.shape) < REPLACE)
            noise = torch.from_numpy(self.rng.integers(3, self.vocab, ids.shape))
            return {"input_ids": torch.where(replace, noise, ids).tolist()}
        if self.source == "lazy" and self.gen is None:
            self.gen = torch.Generator().manual_seed(1234)
        gen = NOISE if self.source == "import" else self.gen
        replace = torch.rand(ids.shape, generator=gen) < REPLACE
        noise = torch.randint(3, self.vocab, ids.shape, generator=gen)
        return {"input_ids": torch.where(replace, noise, ids).tolist()}


def make_trainer(out: str, source: str = "global", workers: int = 0) -> Trainer:
    tok = tiny.tokenizer()
    args = tiny.trainer_args(
        out,
        learning_rate=1e-3,
        max_steps=2,
        per_device_train_batch_size=2,
        seed=0,
        dataloader_num_workers=workers,
    )
    return Trainer(
        model=tiny.llama(tok),
        args=args,
        train_dataset=NoisyTokens(tiny.tokenized(tok, 16), len(tok), source),
        data_collator=DataCollatorForLanguageModeling(tok, mlm=False),
        processing_class=tok,
    )


def project(source: str = "global", workers: int = 0) -> str:
    """A user's conftest.py whose dlcheck_trainer is :func:`make_trainer`."""
    return "\n".join(
        [
            "import pytest",
            "import tiny_trainer_aug as tta",
            "",
            "@pytest.fixture(scope='session')",
            "def dlcheck_trainer(tmp_path_factory):",
            f"    return tta.make_trainer(str(tmp_path_factory.mktemp('out')), source={source!r}, workers={workers})",
            "",
        ]
    )
