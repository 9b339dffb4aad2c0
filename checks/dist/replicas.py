from __future__ import annotations

from ...registry import check
from . import measure, zero
from .launch import ACCUMULATION_BOUND

#: dlcheck_make_training or dlcheck_trainer, and a plain loop's dlcheck_dist_wrap, are asked for by measure.the_setup
#: (an Accelerate user's prepare wraps the model; a Trainer user's launch serves D1, the others say why they skip)
ROLES = ()
OPTIONAL = (
    "make_training",
    "trainer",
    "dist_wrap",
    "train_step",
    "compute_loss",
    "dist_setup",
    "make_dataloader",
    "dataloader",
    "start_epoch",
    "save_checkpoint",
    "load_checkpoint",
)


@check(
    "D1",
    domain="dist",
    title="replicas drift apart: parameters or optimizer state differ between ranks",
    roles=ROLES,
    optional_roles=OPTIONAL,
)
def check_replicas_identical(dlcheck):
    """Every rank holds the same parameters and optimizer state after each step.

    What it does
        Runs your loop in ``--dlcheck-world-size`` processes (torch.distributed, gloo on CPU, started as torchrun
        starts them): in each, ``dlcheck_dist_setup``, ``dlcheck_make_training``, ``dlcheck_dist_wrap``, then a
        few micro-steps of ``dlcheck_train_step`` on that rank's batches. After every micro-step each rank digests
        every parameter and every optimizer-state tensor (Adam's moments, …). Fails at the first step where a
        tensor differs between ranks, naming the parameters that differ most (a module that trains apart, not a
        weight moved by 1e-8 through a clipping coefficient computed from it) with their largest differences; a
        module the DDP wrap does not know (created after ``DistributedDataParallel(model)`` or
        ``accelerator.prepare``) is named as such. A collective that never completes because the ranks do not run
        the same ones (a rank waits in it while another stands elsewhere in the script: a DDP wrap, a barrier or a
        collective under ``if rank == 0:``) fails here, naming where each rank was; the process group's timeout is
        set from the check's time bound (a quarter of the launch's limit, itself at most 3/4 of
        ``--dlcheck-timeout``; between 5 s and gloo's 60 s), and the other dist checks skip naming D1. An Accelerate user's factory
        (its dict holds the ``Accelerator``) runs as under ``accelerate launch --cpu``: Accelerate's process state is
        reset in each rank, so ``accelerator.prepare`` wraps the model in DDP and shards the DataLoader it prepared.
        A transformers / TRL Trainer (``dlcheck_trainer``) runs as a clone in each rank, through its own
        ``train()`` for the same few steps, its TrainingArguments' cached device state set up again in the rank.
        A ``torch.distributed.optim.ZeroRedundancyOptimizer`` keeps each parameter's optimizer state on the rank
        that owns it (its local optimizer, ``optimizer.optim``) and broadcasts the parameters each owner updated, so
        identical parameters say nothing about the shards: D1 compares the state each rank owns — the partitions
        cover every parameter once, the local optimizers' hyperparameters and every owned parameter's step count
        agree across ranks, the gradients the shards stepped on are the same on every rank, and after the first
        optimizer step each rank's owned moments and the parameters it owns equal one optimizer of the same class
        and hyperparameters stepped in one process from the same weights on the same gradient.
    Why it is bad
        Data parallelism is only correct while every replica is the same model: once gradients stop being
        averaged (a model not wrapped in DistributedDataParallel, ``no_sync()`` left around the micro-step that
        steps the optimizer, a loss computed through ``model.module`` that bypasses DDP's hooks, a head created
        after the wrap, whose parameters DDP never saw) each rank
        trains its own model on its own shard. Nothing raises; the saved checkpoint (rank 0's) has seen 1/N of
        the data, and evaluations on different ranks disagree.
    Example
        with model.no_sync():        # meant for accumulation micro-steps only
            loss = loss_fn(model, batch)
            loss.backward()
        optimizer.step()             # steps on this rank's own gradient
    Use instead
        wrap the model (``DistributedDataParallel(model)``) and call the loss through the wrapper; use
        ``no_sync()`` only on the micro-steps that do not step the optimizer
        (``contextlib.nullcontext() if last_micro_step else model.no_sync()``).
    Known problems
        Compares after each of a few micro-steps (3; a loop that accumulates gradients over more, and so steps no
        optimizer in them on any rank, is trained on to its first optimizer step and the window after it, at most
        16 micro-steps), so a drift that starts later (a rank-dependent learning rate schedule after warm-up) is not
        seen. The pass says how many optimizer steps the comparison covered; one that covered none is partly judged
        (the replicas after an update not judged). Buffers (BatchNorm statistics, which DDP broadcasts from
        rank 0 by default) are not compared. FSDP1 (``FullyShardedDataParallel``: flat sharded parameters and
        optimizer state) runs on CPU with gloo but is not judged (it skips naming ``fully_shard``, whose DTensor state
        is gathered and compared); a ZeroRedundancyOptimizer's owned state is compared against one process after
        the first optimizer step only, and for small models (their tensors are sent back). Launches plain loops and
        Accelerate loops (``dlcheck_make_training``) and supervised Trainers (``dlcheck_trainer``: not GRPO or DPO
        yet); not Lightning.
    Not applicable
        Training that does not run distributed: a plain loop without ``dlcheck_dist_wrap`` is asked for it (an
        Accelerate user's ``accelerator.prepare`` and a Trainer's ``train()`` wrap the model in DDP themselves).
    """
    run = measure.get_launch(dlcheck)
    recs = measure.records(dlcheck, run, "train")
    init = measure.first_difference([r["init"] for r in recs])
    if init is not None:
        dlcheck.skip(f"the replicas differ before the first step ({init[0]}): D4 reports the initialisation")
    n_steps = min(len(r["steps"]) for r in recs)
    if n_steps == 0:
        dlcheck.skip("the ranks' dataloaders yielded no batch")
    local_sgd = recs[0].get("local_sgd")
    for s in range(n_steps):
        steps = [r["steps"][s] for r in recs]
        for kind, what in (("params", "parameter"), ("opt", "optimizer state")):
            diff = measure.first_difference([st[kind] for st in steps])
            if diff is None:
                continue
            if local_sgd:
                # accelerate's LocalSGD: each rank steps on its own gradients and the weights are averaged every
                # local_sgd_steps steps, so the replicas differ in between by design (blind set 11's local_sgd.py)
                dlcheck.skip(
                    f"your loop trains with accelerate's LocalSGD (local_sgd_steps={local_sgd.get('steps')}): the "
                    f"replicas train apart between its averagings by design, and differ after micro-step {s + 1} of "
                    f"{n_steps}; whether each averaging brings them back together is not judged (the launch's "
                    f"{n_steps} micro-steps reach none)"
                )
            name, rank = diff
            size = None
            # the tensors that differ most, not the first listed: a module that trains apart on each rank, not a
            # weight that moved by 1e-8 through a clipping coefficient computed from it
            ranked = measure.largest_differences([st["tensors"] for st in steps]) if kind == "params" else []
            if ranked:
                name, rank, size = ranked[0]
            drifting = [n for n in steps[0][kind] if any(st[kind].get(n) != steps[0][kind][n] for st in steps[1:])]
            evidence = [
                f"after micro-step {s + 1} of {n_steps} on {run.world} ranks, {what} {measure.short(name)!r} differs "
                f"between rank 0 and rank {rank}" + (f" (max |diff| {size:.3g})" if size is not None else ""),
                f"{len(drifting)} of {len(steps[0][kind])} {what} tensors differ then; all were identical before "
                "the first step",
            ]
            if len(ranked) > 1:
                evidence.append(
                    "the largest differences: "
                    + ", ".join(f"{measure.short(n)!r} {d:.3g}" for n, _, d in ranked[:4])
                    + (f", … ({len(ranked) - 4} more)" if len(ranked) > 4 else "")
                )
            evidence.append(f"the model each rank trains: {recs[0]['wrapped']}")
            grads = [r.get("grads") for r in recs]
            accelerate = recs[0].get("accelerate")
            late = [n for n in recs[0].get("unsynced") or () if n in drifting or any(n == d[0] for d in ranked)]
            if late:
                unknown = recs[0]["unsynced"]
                modules = _modules(unknown)
                wrapper = "accelerator.prepare" if accelerate else "DistributedDataParallel"
                evidence.append(
                    f"parameters the {wrapper} wrap does not know (created after it): "
                    + ", ".join(repr(measure.short(n)) for n in unknown[:6])
                    + (f", … ({len(unknown) - 6} more)" if len(unknown) > 6 else "")
                )
                cause = (
                    f"module {', '.join(map(repr, modules))} was created after the model was wrapped ({wrapper}): DDP "
                    "averages the gradients of the parameters it saw at construction only, so each rank trains its own "
                    "copy of the rest"
                )
                fix = "build (or attach) every module before wrapping: model.head = nn.Linear(...) first, then " + (
                    "model = accelerator.prepare(model) (and the optimizer on model.parameters() after it)"
                    if accelerate
                    else "DistributedDataParallel(model), and the optimizer on the wrapped model's parameters"
                )
            elif not recs[0]["ddp"] and not recs[0].get("fsdp"):
                cause = (
                    f"the model is not wrapped in DistributedDataParallel ({recs[0]['wrapped']}): nothing averages "
                    "the gradients, each rank steps on its own"
                )
                fix = "wrap it in dlcheck_dist_wrap / your script: state['model'] = DistributedDataParallel(model)"
                if accelerate:
                    cause += " (state['model'] was not passed to accelerator.prepare)"
                    fix = (
                        "model, optimizer, loader = accelerator.prepare(model, optimizer, loader) in "
                        "dlcheck_make_training, and state['model'] the prepared model (it is wrapped in DDP)"
                    )
            elif all(g is not None for g in grads) and _grads_differ(grads):
                evidence.append(
                    "the gradients the optimizer stepped on already differed between ranks at the first optimizer step"
                )
                cause = (
                    "the gradients are not all-reduced on the micro-step that steps the optimizer: backward ran "
                    "inside model.no_sync() (or through model.module, bypassing DDP's hooks)"
                )
                fix = (
                    "call no_sync() only on the accumulation micro-steps that do not step "
                    "(contextlib.nullcontext() if stepping else model.no_sync()), and call the loss through the "
                    "DDP wrapper, not model.module"
                )
                if accelerate:
                    cause = (
                        "the gradients are not all-reduced on the micro-step that steps the optimizer: the loss was "
                        "computed through accelerator.unwrap_model(model) (or model.module), which bypasses DDP's "
                        "hooks, or backward ran inside accelerator.no_sync(model)"
                    )
                    fix = (
                        "compute the loss with the prepared model (loss = loss_fn(model(x), y); "
                        "accelerator.backward(loss)); keep accelerator.unwrap_model(model) for saving and evaluation, "
                        "and accumulate with `with accelerator.accumulate(model):` instead of no_sync()"
                    )
            else:
                cause = (
                    "the ranks applied different updates to the same gradients: a rank-dependent learning rate, "
                    "optimizer or parameter change outside the averaged gradient"
                )
                fix = "build the optimizer and scheduler identically on every rank; change parameters only through it"
                if recs[0].get("trainer"):
                    cause += (
                        f" (your {recs[0]['trainer']}'s own step averaged the gradients: a TrainerCallback, or an "
                        "override of the Trainer, changed the weights on some ranks only)"
                    )
                    fix = (
                        "change the weights only through the optimizer, or on every rank: a TrainerCallback that edits "
                        "parameters must not run under `if state.is_world_process_zero:` (or args.process_index == 0)"
                    )
            dlcheck.fail(evidence, cause, fix, step=s + 1, tensor=name, rank=rank)
    # a ZeroRedundancyOptimizer: each rank owns the state of its partition (its own ``state`` stays empty)
    sharded = zero.judge(dlcheck, run, recs, n_steps)
    n_params = len(recs[0]["steps"][-1]["params"])
    n_opt = len(recs[0]["steps"][-1]["opt"])
    what = f"{n_params} parameters" if sharded else f"{n_params} parameters and {n_opt} optimizer-state tensors"
    stepped = [s + 1 for s, st in enumerate(recs[0]["steps"][:n_steps]) if st.get("opt_steps")]
    updates = sum(st.get("opt_steps") or 0 for st in recs[0]["steps"][:n_steps])
    if not updates:
        # the replicas were compared before any update: identical weights then say only that they started so
        dlcheck.not_judged(
            "the replicas after an optimizer step",
            f"the launch's {n_steps} micro-steps made no optimizer step on rank 0"
            + (
                f" (your loop's first optimizer step comes later than {n_steps} micro-steps, the most the launch "
                "trains to reach it)"
                if n_steps >= ACCUMULATION_BOUND
                else " (its dataloader ran out first)"
                if n_steps < measure.STEPS
                else ""
            )
            + ": the parameters were compared before any update",
        )
    dlcheck.measured(
        f"{what} identical on the {run.world} ranks after each of "
        f"{n_steps} micro-steps ({recs[0]['wrapped']}, {run.backend}, {run.start_method}ed processes)"
        + (
            f", through {updates} optimizer step{'s' if updates > 1 else ''} (after micro-step"
            f"{'s' if len(stepped) > 1 else ''} {', '.join(map(str, stepped))})"
            if updates
            else ", before any optimizer step (none in them)"
        )
        + (
            f"; a clone of your {recs[0]['trainer']} trained through its own train() in each rank "
            f"(args.world_size {recs[0].get('args_world')})"
            if recs[0].get("trainer")
            else ""
        )
        + (
            f"; {recs[0]['fsdp']}: each sharded tensor compared as the full tensor gathered from the ranks' shards"
            if recs[0].get("fsdp")
            else ""
        ),
        *(sharded or ()),
        world=run.world,
        steps=n_steps,
        optimizer_steps=updates,
        launch_seconds=round(run.wall, 2),
    )


def _modules(names: list[str]) -> list[str]:
    """The modules that own these parameters (their common prefixes, shortest first)."""
    owners = sorted({n.rsplit(".", 1)[0] if "." in n else n for n in names}, key=len)
    return [o for o in owners if not any(o.startswith(p + ".") for p in owners if p != o)]


def _grads_differ(grads: list[dict]) -> bool:
    base = grads[0]
    for other in grads[1:]:
        for n, g in base.items():
            if n not in other or other[n].shape != g.shape or not bool((other[n] == g).all()):
                return True
    return False
