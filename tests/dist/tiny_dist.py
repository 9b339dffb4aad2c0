"""Tiny real distributed training parts for the dist tests: a token model, a dataset with prompt-masked
labels (so the ranks' batches hold different numbers of supervised tokens) and a random augmentation,
the steps, saves and loads of a correct DDP script, of a correct FSDP2 (fully_shard) script and of buggy
ones. Imported by the throwaway user
projects (and, in their rank processes, through the fork)."""

from __future__ import annotations

import os

import torch
import torch.distributed as dist
import torch.distributed.checkpoint  # noqa: F401  (imported once, outside pytester's in-process runs)
import torch.distributed.checkpoint.state_dict  # noqa: F401
import torch.distributed.fsdp  # noqa: F401  (FSDP2's fully_shard and DTensor, imported once here too)
import torch.distributed.tensor  # noqa: F401
import torch.nn.functional as F
from torch import nn
from torch.utils.data import DataLoader, Dataset, DistributedSampler, Subset, random_split

VOCAB, LENGTH, N = 16, 8, 21


class TokenLM(nn.Module):
    def __init__(self, dropout: float = 0.1):
        super().__init__()
        self.embed = nn.Embedding(VOCAB, 16)
        self.drop = nn.Dropout(dropout)
        self.head = nn.Linear(16, VOCAB)

    def forward(self, input_ids):
        return self.head(self.drop(self.embed(input_ids)))


class Prompts(Dataset):
    """Sequences whose first (i * 3) % 7 tokens are the prompt (label -100); each fetch swaps one token at
    random (the augmentation, drawn from torch's global generator)."""

    def __len__(self):
        return N

    def __getitem__(self, i):
        g = torch.Generator().manual_seed(i)
        ids = torch.randint(0, VOCAB, (LENGTH,), generator=g)
        where = int(torch.randint(0, LENGTH, ()))
        ids[where] = int(torch.randint(0, VOCAB, ()))
        labels = ids.clone()
        labels[: (i * 3) % 7] = -100
        return {"input_ids": ids, "labels": labels}


def token_loss(model, batch):
    """Mean cross-entropy over the supervised tokens of this batch."""
    logits = model(batch["input_ids"])
    return F.cross_entropy(logits.flatten(0, 1), batch["labels"].flatten(), ignore_index=-100)


def token_loss_of_one_rank(model, batch):
    """A loss written for this rank's batches only (2 rows): it raises on anything bigger, such as the ranks'
    batches concatenated by D2 (the pipeline itself never builds that batch)."""
    if batch["input_ids"].shape[0] > 2:
        raise ValueError(f"this loss takes the batch of one rank (2 rows), got {batch['input_ids'].shape[0]}")
    return token_loss(model, batch)


def make_training():
    model = TokenLM()
    return {"model": model, "optimizer": torch.optim.AdamW(model.parameters(), lr=1e-2)}


class TokenLMFunctionalDropout(TokenLM):
    """Its dropout a float attribute passed to F.dropout at every call, as T5's and Llama's attention dropout is."""

    def __init__(self):
        super().__init__(dropout=0.0)
        self.attention_dropout = 0.3

    def forward(self, input_ids):
        return self.head(F.dropout(self.embed(input_ids), self.attention_dropout, self.training))


def make_training_functional_dropout():
    model = TokenLMFunctionalDropout()
    return {"model": model, "optimizer": torch.optim.AdamW(model.parameters(), lr=1e-2)}


def wrap_ddp(state):
    model = nn.parallel.DistributedDataParallel(state["model"])
    return {"model": model, "optimizer": torch.optim.AdamW(model.parameters(), lr=1e-2)}


def seed_per_rank(rank, world_size):
    torch.manual_seed(1234 + rank)


def seed_every_rank_alike(rank, world_size):
    torch.manual_seed(1234)


def distributed_loader():
    return DataLoader(Prompts(), batch_size=2, sampler=DistributedSampler(Prompts(), shuffle=True, seed=0))


def shuffled_loader():
    return DataLoader(Prompts(), batch_size=2, shuffle=True)


def set_epoch(state, loader, epoch):
    if hasattr(loader.sampler, "set_epoch"):
        loader.sampler.set_epoch(epoch)


def train_mode_only(state, loader, epoch):
    state["model"].train()


def step_global_tokens(state, batch, index):
    """Correct: the sum of token losses over the global number of supervised tokens (all-reduced), the
    skip decided on the all-reduced gradient norm."""
    model, opt = state["model"], state["optimizer"]
    model.train()
    logits = model(batch["input_ids"])
    total = F.cross_entropy(logits.flatten(0, 1), batch["labels"].flatten(), ignore_index=-100, reduction="sum")
    tokens = (batch["labels"] != -100).sum()
    world = 1
    if dist.is_initialized():  # the same step runs in one process (the train domain's checks)
        dist.all_reduce(tokens)
        world = dist.get_world_size()
    loss = total * world / tokens
    loss.backward()
    norm = torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
    if torch.isfinite(norm):
        opt.step()
    opt.zero_grad(set_to_none=True)
    return loss.detach()


def step_off_by_one_window(state, batch, index):
    """run_glue_no_trainer's accumulation: the global-token loss divided by k=2, the optimizer stepped when
    index % 2 == 0 (after one micro-batch first, then every two): a short first window, not a ranks' factor."""
    model, opt = state["model"], state["optimizer"]
    model.train()
    logits = model(batch["input_ids"])
    total = F.cross_entropy(logits.flatten(0, 1), batch["labels"].flatten(), ignore_index=-100, reduction="sum")
    tokens = (batch["labels"] != -100).sum()
    world = 1
    if dist.is_initialized():
        dist.all_reduce(tokens)
        world = dist.get_world_size()
    loss = total * world / tokens / 2
    loss.backward()
    if index % 2 == 0:
        opt.step()
        opt.zero_grad(set_to_none=True)
    return loss.detach()


def step_rank_mean_local_skip(state, batch, index):
    """Buggy: each rank's own token mean (DDP then averages the ranks' means), and a rank-local skip."""
    model, opt = state["model"], state["optimizer"]
    model.train()
    loss = token_loss(model, batch)
    if not torch.isfinite(loss):
        opt.zero_grad(set_to_none=True)
        return loss.detach()
    loss.backward()
    opt.step()
    opt.zero_grad(set_to_none=True)
    return loss.detach()


def step_no_sync(state, batch, index):
    """Buggy: gradient accumulation's no_sync() around every micro-step, the stepping one too; and a
    rank-local skip of a non-finite loss."""
    model, opt = state["model"], state["optimizer"]
    model.train()
    with model.no_sync():
        loss = token_loss(model, batch)
        if not torch.isfinite(loss):
            opt.zero_grad(set_to_none=True)
            return loss.detach()
        loss.backward()
    opt.step()
    opt.zero_grad(set_to_none=True)
    return loss.detach()


def save_every_rank(state, path):
    torch.save({"model": state["model"].module.state_dict()}, path)


def load_file(state, path):
    state["model"].module.load_state_dict(torch.load(path)["model"])


def save_dcp(state, path):
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.state_dict import get_model_state_dict

    dcp.save({"model": get_model_state_dict(state["model"])}, checkpoint_id=path)


def load_dcp(state, path):
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.state_dict import get_model_state_dict, set_model_state_dict

    sd = {"model": get_model_state_dict(state["model"])}
    dcp.load(sd, checkpoint_id=path)
    set_model_state_dict(state["model"], sd["model"])


def project(
    setup="seed_per_rank",
    wrap="wrap_ddp",
    loader="distributed_loader",
    epoch="set_epoch",
    step="step_global_tokens",
    save="save_dcp",
    load="load_dcp",
    loss="token_loss",
    training="make_training",
) -> str:
    """A user's conftest.py: every part named by the function of this module it returns."""
    parts = {
        "dist_setup": setup,
        "dist_wrap": wrap,
        "make_dataloader": loader,
        "start_epoch": epoch,
        "train_step": step,
        "save_checkpoint": save,
        "load_checkpoint": load,
        "make_training": training,
        "compute_loss": loss,
    }
    src = ["import pytest", "import tiny_dist as td", ""]
    for role, fn in parts.items():
        if fn:
            src += ["@pytest.fixture(scope='session')", f"def dlcheck_{role}():", f"    return td.{fn}", ""]
    return "\n".join(src)


HERE = os.path.dirname(os.path.abspath(__file__))


def step_raising_on_last_rank(state, batch, index):
    if dist.get_rank() == dist.get_world_size() - 1:
        raise ValueError(f"labels out of range on this shard (step {index})")
    return step_global_tokens(state, batch, index)


def stuck_rank0_setup(rank, world_size):
    """Rank 0 never gets past its start (a barrier only it calls, here a sleep): the others wait for it."""
    if rank == 0:
        import time

        time.sleep(600)


def no_wrap(state):
    """Buggy: the model is left unwrapped (no DistributedDataParallel)."""
    return state


def wrap_returning_the_model(state):
    """Hostile: returns the wrapped model instead of the dict of objects."""
    return nn.parallel.DistributedDataParallel(state["model"])


def step_summed_grads(state, batch, index):
    """Buggy: no DDP; the gradients all-reduced by hand with SUM and never divided by the world size."""
    model, opt = state["model"], state["optimizer"]
    model.train()
    logits = model(batch["input_ids"])
    total = F.cross_entropy(logits.flatten(0, 1), batch["labels"].flatten(), ignore_index=-100, reduction="sum")
    tokens = (batch["labels"] != -100).sum()
    dist.all_reduce(tokens)
    loss = total * dist.get_world_size() / tokens
    loss.backward()
    for p in model.parameters():
        dist.all_reduce(p.grad)  # SUM: world_size x the averaged gradient
    opt.step()
    opt.zero_grad(set_to_none=True)
    return loss.detach()


def wrap_fsdp(state):
    """FSDP2: every layer and the root sharded over the ranks (fully_shard), the optimizer on the shards."""
    from torch.distributed.fsdp import fully_shard

    model = state["model"]
    for layer in (model.embed, model.head):
        fully_shard(layer)
    fully_shard(model)
    return {"model": model, "optimizer": torch.optim.AdamW(model.parameters(), lr=1e-2)}


def wrap_fsdp1(state):
    """FSDP1: FullyShardedDataParallel on CPU (gloo), its flat parameter sharded over the ranks."""
    from torch.distributed.fsdp import FullyShardedDataParallel

    model = FullyShardedDataParallel(state["model"], device_id=torch.device("cpu"))
    return {"model": model, "optimizer": torch.optim.AdamW(model.parameters(), lr=1e-2)}


def save_dcp_sharded(state, path):
    """Correct for FSDP: the sharded model and optimizer state dicts, saved collectively by every rank."""
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.state_dict import get_model_state_dict, get_optimizer_state_dict

    model, opt = state["model"], state["optimizer"]
    dcp.save({"model": get_model_state_dict(model), "optim": get_optimizer_state_dict(model, opt)}, checkpoint_id=path)


def load_dcp_sharded(state, path):
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.state_dict import (
        get_model_state_dict,
        get_optimizer_state_dict,
        set_model_state_dict,
        set_optimizer_state_dict,
    )

    model, opt = state["model"], state["optimizer"]
    sd = {"model": get_model_state_dict(model), "optim": get_optimizer_state_dict(model, opt)}
    dcp.load(sd, checkpoint_id=path)
    set_model_state_dict(model, sd["model"])
    set_optimizer_state_dict(model, opt, sd["optim"])


def save_state_dict_on_rank0(state, path):
    """Buggy under FSDP: model.state_dict() holds this rank's shards (DTensors); rank 0 alone writes it."""
    if dist.get_rank() == 0:
        torch.save({"model": state["model"].state_dict()}, path)
    dist.barrier()


def load_state_dict(state, path):
    state["model"].load_state_dict(torch.load(path)["model"])


def save_per_rank_file(state, path):
    """Buggy: each rank writes its own file (no shared-file race), named after its rank."""
    model = state["model"].module
    torch.save(
        {"model": model.state_dict(), "optimizer": state["optimizer"].state_dict()}, f"{path}.rank{dist.get_rank()}"
    )


def load_per_rank_file(state, path):
    """Each rank reads the file of its own rank: none for a rank that did not exist when it was written."""
    saved = torch.load(f"{path}.rank{dist.get_rank()}")
    state["model"].module.load_state_dict(saved["model"])
    state["optimizer"].load_state_dict(saved["optimizer"])


def make_training_headless():
    """A backbone whose task head the script attaches later (an identity until then: embeddings are VOCAB wide)."""
    model = TokenLM()
    model.head = nn.Identity()
    return {"model": model, "optimizer": torch.optim.AdamW(model.parameters(), lr=1e-2)}


def wrap_ddp_then_head(state):
    """Buggy: the task head is created after the DDP wrap (DDP neither broadcasts nor averages its parameters)."""
    model = nn.parallel.DistributedDataParallel(state["model"])
    model.module.head = nn.Linear(16, VOCAB)
    return {"model": model, "optimizer": torch.optim.AdamW(model.parameters(), lr=1e-2)}


def wrap_head_then_ddp(state):
    """Correct: the task head is attached first, then the whole model wrapped."""
    state["model"].head = nn.Linear(16, VOCAB)
    model = nn.parallel.DistributedDataParallel(state["model"])
    return {"model": model, "optimizer": torch.optim.AdamW(model.parameters(), lr=1e-2)}


def loader_seeded_per_rank():
    """Buggy: the DistributedSampler seeded with the rank (each rank slices its own permutation)."""
    return DataLoader(
        Prompts(), batch_size=2, sampler=DistributedSampler(Prompts(), shuffle=True, seed=dist.get_rank())
    )


def loader_split_per_rank():
    """Buggy (minGPT-ddp's main.py): the training split drawn in every process by random_split without a
    generator, so from each rank's own global generator: the DistributedSampler deals out disjoint indices, but
    each rank's indices select from its own split."""
    train, _held_out = random_split(Prompts(), [15, 6])
    return DataLoader(train, batch_size=2, sampler=DistributedSampler(train, shuffle=True, seed=0))


class FoldSampler(torch.utils.data.Sampler):
    """A K-fold's training fold dealt out to the ranks (Fabric's kfold_cv: a SubsetRandomSampler of the fold's
    indices wrapped for the process group): ``indices`` is the fold; each rank draws every ``stride``-th of them."""

    def __init__(self, indices, stride_per_rank=1):
        self.indices = list(indices)
        self.stride = dist.get_world_size() * stride_per_rank
        self.epoch = 0

    def set_epoch(self, epoch):
        self.epoch = epoch

    def __iter__(self):
        order = torch.randperm(len(self.indices), generator=torch.Generator().manual_seed(self.epoch)).tolist()
        return iter([self.indices[i] for i in order][dist.get_rank() :: self.stride])

    def __len__(self):
        return len(self.indices[dist.get_rank() :: self.stride])


def loader_fold():
    """Correct: the training fold (indices 6-20 of 21) shared out disjointly; the validation fold is on no rank."""
    return DataLoader(Prompts(), batch_size=2, sampler=FoldSampler(range(6, 21)))


def loader_fold_half():
    """Buggy: every rank skips every other index of its share: half of the fold is on no rank."""
    return DataLoader(Prompts(), batch_size=2, sampler=FoldSampler(range(6, 21), stride_per_rank=2))


def loader_split_seeded():
    """Correct: the same split on every rank, drawn with a fixed generator."""
    train, _held_out = random_split(Prompts(), [15, 6], generator=torch.Generator().manual_seed(0))
    return DataLoader(train, batch_size=2, sampler=DistributedSampler(train, shuffle=True, seed=0))


def loader_presharded_by_rank():
    """Correct without a DistributedSampler: each rank's dataset is its own slice of the examples."""
    mine = Subset(Prompts(), range(dist.get_rank(), N, dist.get_world_size()))
    return DataLoader(mine, batch_size=2, shuffle=True)


def loader_hf_shard_per_rank():
    """Each rank its own contiguous shard of a datasets.Dataset (ds.shard(world, rank)), no DistributedSampler: the
    shard slices the table and keeps no indices to resolve; the ranks' positions name different examples."""
    from datasets import Dataset

    rows = [Prompts()[i] for i in range(N)]
    ds = Dataset.from_dict({k: [r[k].tolist() for r in rows] for k in rows[0]}).with_format("torch")
    return DataLoader(ds.shard(dist.get_world_size(), dist.get_rank(), contiguous=True), batch_size=2, shuffle=True)


def step_global_tokens_no_clip(state, batch, index):
    """Correct, without gradient clipping: the sum of token losses over the global supervised token count, times
    the world size (DDP divides by it again)."""
    model, opt = state["model"], state["optimizer"]
    model.train()
    logits = model(batch["input_ids"])
    total = F.cross_entropy(logits.flatten(0, 1), batch["labels"].flatten(), ignore_index=-100, reduction="sum")
    tokens = (batch["labels"] != -100).sum()
    dist.all_reduce(tokens)
    loss = total * dist.get_world_size() / tokens
    loss.backward()
    opt.step()
    opt.zero_grad(set_to_none=True)
    return loss.detach()


def step_averaged_over_ranks_again(state, batch, index):
    """Buggy: the global token mean (all-reduced count), not multiplied back by the world size: DDP then averages
    it once more, every gradient 1/world_size of the whole batch's. No clipping."""
    model, opt = state["model"], state["optimizer"]
    model.train()
    logits = model(batch["input_ids"])
    total = F.cross_entropy(logits.flatten(0, 1), batch["labels"].flatten(), ignore_index=-100, reduction="sum")
    tokens = (batch["labels"] != -100).sum()
    dist.all_reduce(tokens)
    loss = total / tokens
    loss.backward()
    opt.step()
    opt.zero_grad(set_to_none=True)
    return loss.detach()


def wrap_ddp_on_rank0(state):
    """Buggy: the DDP wrap under `if rank == 0` (a main-process-only block): rank 0 waits in DDP's constructor
    for the others, which never build a DDP."""
    if dist.get_rank() == 0:
        return wrap_ddp(state)
    return state


def barrier_on_rank0(state):
    """Buggy: a barrier only rank 0 reaches (inside `if rank == 0`), then the correct wrap."""
    if dist.get_rank() == 0:
        dist.barrier()
    return wrap_ddp(state)


class BatchNormTokenLM(TokenLM):
    """TokenLM with a BatchNorm over its embedding features: in train mode each rank normalises with its own batch's
    statistics (a torchvision ResNet's BatchNorm2d does the same to images)."""

    def __init__(self):
        super().__init__(dropout=0.0)
        self.norm = nn.BatchNorm1d(16)

    def forward(self, input_ids):
        e = self.embed(input_ids)
        return self.head(self.norm(e.flatten(0, 1)).view_as(e))


def make_training_batchnorm():
    torch.manual_seed(0)
    model = BatchNormTokenLM()
    return {"model": model, "optimizer": torch.optim.AdamW(model.parameters(), lr=1e-2)}


def wrap_ddp_batchnorm(state):
    model = nn.parallel.DistributedDataParallel(state["model"])
    return {"model": model, "optimizer": torch.optim.AdamW(model.parameters(), lr=1e-2)}


def step_clip_raising_on_nonfinite(state, batch, index):
    """Correct: clip_grad_norm_(error_if_nonfinite=True) after DDP's all-reduce (Lightning Fabric's
    clip_gradients default): an overflow on any rank makes every rank raise, a loud stop shared by all."""
    model, opt = state["model"], state["optimizer"]
    model.train()
    logits = model(batch["input_ids"])
    loss = F.cross_entropy(logits.flatten(0, 1), batch["labels"].flatten(), ignore_index=-100)
    loss.backward()
    torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0, error_if_nonfinite=True)
    opt.step()
    opt.zero_grad(set_to_none=True)
    return loss.detach()


def step_raising_on_nonfinite_loss(state, batch, index):
    """A step whose loss refuses non-finite values with an exception (as torch.distributions.Categorical refuses NaN
    logits in a PPO update): the rank with the overflow raises before its backward, the others wait for it."""
    model, opt = state["model"], state["optimizer"]
    model.train()
    logits = model(batch["input_ids"])
    loss = F.cross_entropy(logits.flatten(0, 1), batch["labels"].flatten(), ignore_index=-100)
    if not torch.isfinite(loss):
        raise ValueError("Expected parameter logits to satisfy the constraint IndependentConstraint(Real())")
    loss.backward()
    opt.step()
    opt.zero_grad(set_to_none=True)
    return loss.detach()
