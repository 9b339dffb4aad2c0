"""Tiny real distributed evaluations for D7: an eval set of 9 examples (2 ranks do not divide it evenly, nor do
batches of 3), evaluated by a plain DDP script (tiny_dist's training) and by an Accelerate script
(tiny_accelerate's), correct and buggy. Imported by the throwaway user projects (and, in their rank processes,
through the fork)."""

from __future__ import annotations

import tiny_accelerate as ta
import tiny_dist as td
import torch
import torch.distributed as dist
import torch.nn.functional as F
from accelerate import Accelerator
from torch.utils.data import DataLoader, Dataset, DistributedSampler, TensorDataset

N_EVAL, EVAL_BATCH = 9, 3


class EvalPrompts(Dataset):
    """9 fixed sequences (no augmentation: an eval set), their first (i * 3) % 7 tokens a prompt (label -100)."""

    def __len__(self):
        return N_EVAL

    def __getitem__(self, i):
        g = torch.Generator().manual_seed(1000 + i)
        ids = torch.randint(0, td.VOCAB, (td.LENGTH,), generator=g)
        labels = ids.clone()
        labels[: (i * 3) % 7] = -100
        return {"input_ids": ids, "labels": labels}


def padded_eval_loader():
    """DistributedSampler(shuffle=False, drop_last=False): 9 examples dealt as 10, example 0 on both ranks."""
    ds = EvalPrompts()
    return DataLoader(ds, batch_size=EVAL_BATCH, sampler=DistributedSampler(ds, shuffle=False))


def unpadded_eval_loader():
    """Every example on exactly one rank: indices rank, rank + world, … (5 and 4 examples)."""
    ds = EvalPrompts()
    return DataLoader(ds, batch_size=EVAL_BATCH, sampler=range(dist.get_rank(), len(ds), dist.get_world_size()))


def _example_losses(model, batch):
    """The mean token loss of every example of the batch."""
    logits = model(batch["input_ids"])
    tokens = F.cross_entropy(logits.flatten(0, 1), batch["labels"].flatten(), ignore_index=-100, reduction="none")
    tokens = tokens.view(batch["labels"].shape)
    mask = batch["labels"] != -100
    return (tokens * mask).sum(1) / mask.sum(1)


def _local_sums(state, loader):
    model = state["model"]
    model.eval()
    total = torch.zeros(2, dtype=torch.float64)
    with torch.no_grad():
        for batch in loader:
            losses = _example_losses(model, batch).double()
            total += torch.stack([losses.sum(), torch.tensor(float(len(losses)), dtype=torch.float64)])
    return total


def eval_loss_all_reduce(state, loader):
    """The sum of the examples' losses and their count, all-reduced on every rank, divided after."""
    total = _local_sums(state, loader)
    dist.all_reduce(total)
    return {"eval_loss": float(total[0] / total[1])}


def eval_loss_rank0_only(state, loader):
    """Buggy: rank 0 reports the loss of its own shard; nothing is reduced across the ranks."""
    total = _local_sums(state, loader)
    return {"eval_loss": float(total[0] / total[1])} if dist.get_rank() == 0 else None


def eval_loss_mean_of_ranks(state, loader):
    """Buggy over shards of different sizes: the mean of the ranks' means (each rank's example weighs 1/its count)."""
    total = _local_sums(state, loader)
    mean = total[0] / total[1]
    dist.all_reduce(mean)
    return {"eval_loss": float(mean / dist.get_world_size())}


def eval_losses_all_gather(state, loader):
    """Buggy over a padded sampler: every example's loss gathered with dist.all_gather, the padding included."""
    model = state["model"]
    model.eval()
    gathered = []
    with torch.no_grad():
        for batch in loader:
            losses = _example_losses(model, batch)
            parts = [torch.empty_like(losses) for _ in range(dist.get_world_size())]
            dist.all_gather(parts, losses)
            gathered += parts
    return torch.cat(gathered)


def eval_texts_all_gather(state, loader):
    """Buggy over a padded sampler: every example's predicted tokens decoded to a text and gathered with
    all_gather_object (what BLEU / ROUGE are computed over), the padding included."""
    model = state["model"]
    model.eval()
    texts = []
    with torch.no_grad():
        for batch in loader:
            for row in model(batch["input_ids"]).argmax(-1):
                texts.append(" ".join(map(str, row.tolist())))
    parts = [None] * dist.get_world_size()
    dist.all_gather_object(parts, texts)
    return [t for part in parts for t in part]


class StridedEvalBatches:
    """llm.c's DistributedDataLoader: batches of this rank's strided share of the eval examples, built by the
    script itself: no dataset, no sampler, no length."""

    def __iter__(self):
        ds = EvalPrompts()
        mine = list(range(dist.get_rank(), len(ds), dist.get_world_size()))
        for i in range(0, len(mine), EVAL_BATCH):
            items = [ds[j] for j in mine[i : i + EVAL_BATCH]]
            yield {k: torch.stack([it[k] for it in items]) for k in items[0]}


def strided_eval_batches():
    return StridedEvalBatches()


def make_training_with_buffer():
    """tiny_dist's training, the model holding a buffer (GPT's causal mask): DistributedDataParallel broadcasts its
    buffers in every forward, a collective of the wrapper, not of the evaluation."""
    model = td.TokenLM()
    model.register_buffer("causal", torch.ones(td.LENGTH, td.LENGTH).tril())
    return {"model": model, "optimizer": torch.optim.AdamW(model.parameters(), lr=1e-2)}


# ---- Accelerate: the eval loader prepared beside the training objects


def eval_data() -> TensorDataset:
    g = torch.Generator().manual_seed(1)
    y = torch.randint(0, ta.CLASSES, (N_EVAL,), generator=g)
    x = torch.randn(N_EVAL, ta.FEATURES, generator=g) + y[:, None].float()
    return TensorDataset(x, y)


def make_training_with_eval():
    """As tiny_accelerate.make_training, with the eval DataLoader (9 examples, batch 3) prepared too."""
    accelerator = Accelerator(cpu=True)
    model, opt, loader, eval_loader = accelerator.prepare(*ta._parts(), DataLoader(eval_data(), batch_size=EVAL_BATCH))
    return {
        "model": model,
        "optimizer": opt,
        "train_dataloader": loader,
        "eval_dataloader": eval_loader,
        "accelerator": accelerator,
    }


def _predict(state, loader, gather):
    model = state["model"]
    model.eval()
    preds, labels = [], []
    with torch.no_grad():
        for x, y in loader:
            p, y = gather((model(x).argmax(-1), y))
            preds.append(p)
            labels.append(y)
    return torch.cat(preds), torch.cat(labels)


def eval_gather(state, loader):
    """Buggy: accelerator.gather keeps the examples even_batches repeats (12 predictions for 9 examples)."""
    return _predict(state, loader, state["accelerator"].gather)


def eval_gather_for_metrics(state, loader):
    """Correct: accelerator.gather_for_metrics drops the repeats of the last batches."""
    return _predict(state, loader, state["accelerator"].gather_for_metrics)


def _fixture(role: str, value: str) -> list[str]:
    return ["@pytest.fixture(scope='session')", f"def dlcheck_{role}():", f"    return {value}", ""]


def dist_project(evaluate: str, loader: str, training: str | None = None) -> str:
    """tiny_dist's correct DDP script, with this module's evaluation and eval loader factory (and training)."""
    return "\n".join(
        [
            td.project(),
            "import tiny_eval as te",
            "",
            *_fixture("dist_eval", f"te.{evaluate}"),
            *_fixture("make_eval_dataloader", f"te.{loader}"),
            *(_fixture("make_training", f"te.{training}") if training else []),
        ]
    )


def accelerate_project(evaluate: str) -> str:
    """tiny_accelerate's correct script, its factory preparing the eval loader, with this module's evaluation."""
    return "\n".join(
        [
            "import pytest",
            "import tiny_accelerate as ta",
            "import tiny_eval as te",
            "",
            *_fixture("make_training", "te.make_training_with_eval"),
            *_fixture("train_step", "ta.step"),
            *_fixture("compute_loss", "ta.loss_of"),
            *_fixture("dist_eval", f"te.{evaluate}"),
        ]
    )
