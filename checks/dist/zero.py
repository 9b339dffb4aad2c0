"""ZeRO-style sharded optimizers in D1: ``torch.distributed.optim.ZeroRedundancyOptimizer`` keeps each parameter's
optimizer state on the one rank that owns it (its local optimizer, ``optimizer.optim``, built on that rank's
partition); the ZeRO optimizer's own ``state`` stays empty. After every step the owner broadcasts the parameters it
updated, so the replicated parameters stay identical even when an owner updated its shard wrongly: D1 compares what
each rank owns instead.

In a rank (:func:`owned_state`, after every micro-step): the names of the parameters of its partition, the digests
of its owned state tensors (and, for a small model, the tensors), each owned parameter's step count and its local
optimizer's hyperparameters. In the parent (:func:`judge`): the partitions cover every parameter once; the local
optimizers' hyperparameters are the same on every rank; every owned parameter stepped as often; the gradients the
shards stepped on are the same on every rank; after the first optimizer step, each rank's owned moments and the
parameters it owns equal one optimizer of the same class and hyperparameters stepped in one process from the same
weights on the same gradient."""

from __future__ import annotations

import math
from typing import Any

from . import measure


def is_zero(opt: Any) -> bool:
    return any(
        c.__name__ == "ZeroRedundancyOptimizer" and c.__module__.startswith("torch.distributed.optim")
        for c in type(opt).__mro__
    )


def _hyper(group: dict[str, Any]) -> dict[str, Any]:
    """A parameter group's hyperparameters as plain values (a tensor LR as a float)."""
    import torch

    out: dict[str, Any] = {}
    for k, v in group.items():
        if k == "params":
            continue
        if isinstance(v, torch.Tensor) and v.numel() == 1:
            v = float(v)
        if isinstance(v, (int, float, bool, str, type(None))) or (
            isinstance(v, tuple) and all(isinstance(x, (int, float)) for x in v)
        ):
            out[k] = v
    return out


def owned_state(opt: Any, inner: Any, small: bool) -> dict[str, Any] | None:
    """This rank's shard of a ZeroRedundancyOptimizer (None for any other optimizer)."""
    import torch

    from .launch import tensor_digest

    if not is_zero(opt):
        return None
    local = getattr(opt, "optim", None)
    names = {id(p): n for n, p in inner.named_parameters()}
    partition = [names.get(id(p), "?") for g in getattr(local, "param_groups", []) for p in g["params"]]
    everything = [names.get(id(p), "?") for g in opt.param_groups for p in g["params"]]
    digests: dict[str, str] = {}
    tensors: dict[str, Any] = {}
    steps: dict[str, float] = {}
    for p, st in list(getattr(local, "state", {}).items()):
        name = names.get(id(p), "?")
        for k, v in (st or {}).items():
            if not isinstance(v, torch.Tensor):
                continue
            if k == "step" and v.numel() == 1:
                steps[name] = float(v)
            digests[f"{name}:{k}"] = tensor_digest(v)
            if small:
                tensors[f"{name}:{k}"] = v.detach().cpu().clone()
    return {
        "local": type(local).__name__,
        "local_module": type(local).__module__,
        "partition": partition,
        "all": everything,
        "hyper": [_hyper(g) for g in getattr(local, "param_groups", [])],
        "digests": digests,
        "tensors": tensors if small else None,
        "steps": steps,
    }


def _shown(hyper: dict[str, Any]) -> str:
    keys = [k for k in ("lr", "betas", "momentum", "eps", "weight_decay") if k in hyper]
    return ", ".join(f"{k}={hyper[k]:g}" if isinstance(hyper[k], float) else f"{k}={hyper[k]}" for k in keys)


def judge(dlcheck: Any, run: Any, recs: list[dict[str, Any]], n_steps: int) -> list[str] | None:
    """D1 on the shards of a ZeroRedundancyOptimizer: fails on the first inconsistency, else returns what was
    compared (None when the optimizer is not one)."""
    first = [r["steps"][0].get("owned") for r in recs]
    if any(o is None for o in first):
        return None
    world = run.world
    # every rank's partition, and the whole parameter list ZeRO was given
    parts = [o["partition"] for o in first]
    owners: dict[str, list[int]] = {}
    for r, part in enumerate(parts):
        for n in part:
            owners.setdefault(n, []).append(r)
    everything = first[0]["all"]
    twice = {n: rs for n, rs in owners.items() if len(rs) > 1}
    nobody = [n for n in everything if n not in owners]
    if twice or nobody or any(o["all"] != everything for o in first[1:]):
        evidence = [
            f"the {world} ranks' ZeroRedundancyOptimizer partitions: "
            + "; ".join(f"rank {r}: {len(p)} parameter(s)" for r, p in enumerate(parts))
        ]
        if twice:
            n, rs = next(iter(twice.items()))
            evidence.append(
                f"{len(twice)} parameter(s) owned by several ranks, e.g. {measure.short(n)!r} by ranks {rs}"
            )
        if nobody:
            evidence.append(
                f"{len(nobody)} parameter(s) owned by no rank (never updated), e.g. {measure.short(nobody[0])!r}"
            )
        if any(o["all"] != everything for o in first[1:]):
            evidence.append("the ranks gave ZeroRedundancyOptimizer their parameters in different orders")
        dlcheck.fail(
            evidence,
            "ZeroRedundancyOptimizer partitions the parameters it is given by their order: the ranks built it on "
            "different parameter lists, so their partitions disagree",
            "build the ZeroRedundancyOptimizer on every rank from the same parameters in the same order "
            "(ZeroRedundancyOptimizer(ddp_model.parameters(), optimizer_class=...))",
        )
    grads = [r.get("grads") for r in recs]
    if all(g is not None for g in grads) and _grads_differ(grads):
        name, size = _largest_grad_difference(grads)
        dlcheck.fail(
            [
                f"at the first optimizer step the gradients the ZeroRedundancyOptimizer stepped on differ between the "
                f"ranks: {measure.short(name)!r} by up to {size:.3g} (rank 0 against rank 1)",
                f"each parameter is updated on the rank that owns it ({_owners_words(parts)}) from that rank's gradient, "
                "then broadcast: the replicas stay identical, but each shard trained on its owner's batches only",
                f"the model each rank trains: {recs[0]['wrapped']}",
            ],
            "the gradients are not averaged over the ranks before ZeroRedundancyOptimizer.step(): it shards the "
            "optimizer state, it does not all-reduce gradients (a model not wrapped in DistributedDataParallel, or a "
            "backward through model.module / inside no_sync())",
            "wrap the model in DistributedDataParallel and build the ZeroRedundancyOptimizer on the wrapped model's "
            "parameters; call the loss through the wrapper",
            tensor=name,
        )
    for s in range(n_steps):
        owned = [r["steps"][s].get("owned") for r in recs]
        hypers = [o["hyper"] for o in owned]
        for r in range(1, world):
            if hypers[r] == hypers[0]:
                continue
            g = (
                next(i for i, (a, b) in enumerate(zip(hypers[0], hypers[r])) if a != b)
                if len(hypers[0]) == len(hypers[r])
                else 0
            )
            a, b = (hypers[0][g] if g < len(hypers[0]) else {}), (hypers[r][g] if g < len(hypers[r]) else {})
            keys = [k for k in sorted(set(a) | set(b)) if a.get(k) != b.get(k)]
            shown = ", ".join(f"{k}: rank 0 {a.get(k)!r}, rank {r} {b.get(k)!r}" for k in keys[:4])
            dlcheck.fail(
                [
                    f"after micro-step {s + 1} of {n_steps} the local optimizers of the ZeroRedundancyOptimizer "
                    f"({owned[0]['local']}) differ between rank 0 and rank {r} in parameter group {g}: {shown}",
                    f"rank 0 owns {_few(parts[0])}; rank {r} owns {_few(parts[r])}: each shard is updated with its "
                    "owner's hyperparameters, then broadcast, so the replicas stay identical and the difference "
                    "shows nowhere else",
                ],
                "the optimizer is built with rank-dependent hyperparameters (a learning rate scaled by the rank, or a "
                "scheduler stepped on some ranks only): the parameters each rank owns are trained with its own",
                "build the ZeroRedundancyOptimizer and its scheduler identically on every rank, and step the scheduler "
                "on every rank",
                step=s + 1,
                rank=r,
                hyperparameters=keys,
            )
        counts = {(r, n): c for r, o in enumerate(owned) for n, c in o["steps"].items()}
        if len(set(counts.values())) > 1:
            low = min(counts, key=counts.get)
            high = max(counts, key=counts.get)
            dlcheck.fail(
                [
                    f"after micro-step {s + 1} of {n_steps} the owned optimizer state counts different steps: "
                    f"{measure.short(low[1])!r} (rank {low[0]}) {counts[low]:g}, {measure.short(high[1])!r} "
                    f"(rank {high[0]}) {counts[high]:g}",
                ],
                "the shards were not all stepped as often: optimizer.step() ran on some ranks only, or one rank's "
                "local optimizer skipped a step",
                "call optimizer.step() on every rank at every optimizer step (ZeroRedundancyOptimizer.step is a "
                "collective: each rank updates its own shard and broadcasts it)",
                step=s + 1,
            )
    compared = _reference(dlcheck, recs, parts)
    n_state = sum(len(o["digests"]) for o in first)
    kinds = sorted({k.rsplit(":", 1)[-1] for o in first for k in o["digests"]})
    last = [r["steps"][n_steps - 1]["owned"] for r in recs]
    steps_seen = sorted({c for o in last for c in o["steps"].values()})
    return [
        f"ZeroRedundancyOptimizer ({first[0]['local']}): the optimizer state each rank owns compared — "
        + "; ".join(
            f"rank {r} owns {len(p)} parameter(s) ({len(first[r]['digests'])} state tensors)"
            for r, p in enumerate(parts)
        )
        + f"; the partitions cover the {len(everything)} parameters once ({n_state} owned tensors: {', '.join(kinds)})",
        f"the local optimizers' hyperparameters are identical on the {world} ranks ({_shown(first[0]['hyper'][0])})"
        if first[0]["hyper"]
        else "the local optimizers have no parameter group",
        "every owned parameter counts the same steps after each micro-step"
        + (f" ({', '.join(f'{c:g}' for c in steps_seen)} after the last)" if steps_seen else ""),
        "the gradients the shards stepped on are identical on every rank at the first optimizer step",
        *compared,
    ]


def rank_reference(opt: Any, rec: dict[str, Any]) -> dict[str, Any] | None:
    """In a rank, after the launch's micro-steps: the owned state and owned parameters after the first optimizer step
    against one optimizer of the local optimizer's class and hyperparameters, built here on copies of the weights
    every rank started from and stepped once on the gradient this rank's ZeroRedundancyOptimizer stepped on (a
    process that has stepped an optimizer already: no first-step imports in the pytest process). None for any other
    optimizer; ``{"not_judged": why}`` when it cannot be built."""
    import torch

    if not is_zero(opt):
        return None
    micro, grads, init = rec.get("d2_micro_steps"), rec.get("grads"), rec.get("init_tensors")
    if not micro or grads is None or init is None:
        return {
            "not_judged": "the first optimizer step's gradients or the starting weights were not kept (a large model)"
        }
    step = rec["steps"][micro - 1]
    owned, after = step.get("owned") or {}, step.get("tensors")
    if owned.get("tensors") is None or after is None:
        return {"not_judged": "a model too large to keep its tensors"}
    local = opt.optim
    params = {name: init[name].clone() for name in owned["partition"] if name in init}
    for name, p in params.items():
        if name in grads:
            p.grad = grads[name].clone()
    groups = [dict(h, params=list(params.values())) for h in owned["hyper"][:1]]
    try:
        ref = type(local)(groups)
        with torch.no_grad():
            ref.step()
    except Exception as exc:  # noqa: BLE001 - an optimizer that cannot be rebuilt from its group: not judged
        return {
            "not_judged": f"{type(local).__name__} cannot be rebuilt from its parameter group: {type(exc).__name__}"
        }
    by_id = {id(p): name for name, p in params.items()}
    worst: tuple[float, str] = (0.0, "")
    n = 0
    for p, st in ref.state.items():
        name = by_id[id(p)]
        for k, v in st.items():
            got = owned["tensors"].get(f"{name}:{k}")
            if isinstance(v, torch.Tensor) and got is not None:
                n += 1
                worst = max(worst, (_diff(got, v), f"{name}:{k}"))
        n += 1
        worst = max(worst, (_diff(after[name], p), name))
    return {"tensors": n, "worst": worst[0], "what": worst[1], "micro": micro}


def _reference(dlcheck: Any, recs: list[dict[str, Any]], parts: list[list[str]]) -> list[str]:
    """D1's reading of each rank's :func:`rank_reference`: fails on an owned tensor that differs from the
    one-process step; returns what was compared."""
    got = [r.get("zero_reference") for r in recs]
    why = next((g["not_judged"] for g in got if g and "not_judged" in g), None)
    if why or any(g is None for g in got):
        dlcheck.not_judged("the owned state against one process", why or "not computed in every rank")
        return []
    local = recs[0]["steps"][0]["owned"]["local"]
    r = max(range(len(got)), key=lambda i: got[i]["worst"])
    worst = got[r]
    if worst["worst"] > 1e-4:
        what = worst["what"]
        kind = "owned state tensor" if ":" in what else "parameter"
        dlcheck.fail(
            [
                f"after the first optimizer step (micro-step {worst['micro']}) the {kind} {measure.short(what)!r} of "
                f"rank {r}'s shard differs from one {local} stepped in one process on the same weights and gradient "
                f"(relative difference {worst['worst']:.3g})",
                f"rank {r} owns {_few(parts[r])}",
            ],
            "the rank that owns this shard updates it differently from the optimizer it was built as (its state or "
            "parameters changed outside ZeroRedundancyOptimizer.step, or the step it ran is not the one of its local "
            "optimizer)",
            "change the shards only through ZeroRedundancyOptimizer.step(), identically on every rank",
            rank=r,
            tensor=what,
        )
    return [
        f"after the first optimizer step each rank's owned state and the parameters it owns equal one {local} stepped "
        f"in one process from the same weights on the same gradient ({sum(g['tensors'] for g in got)} tensors, "
        f"largest relative difference {worst['worst']:.2g})"
    ]


def _diff(a: Any, b: Any) -> float:
    a, b = a.detach().double().cpu(), b.detach().double().cpu()
    if a.shape != b.shape:
        return math.inf
    scale = max(float(b.abs().max()) if b.numel() else 0.0, 1e-12)
    return float((a - b).abs().max()) / scale if a.numel() else 0.0


def _few(names: list[str], n: int = 3) -> str:
    shown = ", ".join(repr(measure.short(x)) for x in names[:n])
    return shown + (f", … ({len(names) - n} more)" if len(names) > n else "") if names else "nothing"


def _owners_words(parts: list[list[str]]) -> str:
    return "; ".join(f"rank {r}: {_few(p, 2)}" for r, p in enumerate(parts))


def _grads_differ(grads: list[dict]) -> bool:
    base = grads[0]
    return any(
        n not in other or other[n].shape != g.shape or not bool((other[n] == g).all())
        for other in grads[1:]
        for n, g in base.items()
    )


def _largest_grad_difference(grads: list[dict]) -> tuple[str, float]:
    best = ("?", 0.0)
    for n, g in grads[0].items():
        other = grads[1].get(n)
        if other is not None and other.shape == g.shape:
            d = float((other.double() - g.double()).abs().max())
            if d > best[1]:
                best = (n, d)
    return best
