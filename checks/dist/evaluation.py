"""D7: the distributed evaluation counts every eval example exactly once across the ranks.

The evaluation runs in a launch of its own (``Job.mode == "eval"``), not in the shared launch of D1–D6, for two
reasons: a buggy evaluation (a collective only rank 0 calls, ranks whose collectives fall out of step) would hang
or desynchronise the shared launch and take D1–D6's records with it; and a metric is judged against the same
evaluation in one process (a process group of one: DistributedSampler and Accelerate then shard nothing), which is
a second launch in any case. Both launches are memoized; the one-process launch runs only when the evaluation
returns a metric (gathered predictions are judged by their count alone).

In each rank (:func:`evaluate`): the script's start (``dlcheck_dist_setup``), the fresh objects
(``dlcheck_make_training`` + ``dlcheck_dist_wrap``), this rank's eval DataLoader (``dlcheck_make_eval_dataloader``,
else a DataLoader in the factory's dict under a key naming eval / val / test, as an Accelerate script prepares
it), the indices its sampler yields, then the user's ``dlcheck_dist_eval(state, eval_dataloader)``, with the
collectives it ran counted (the process group's sequence number, so an imported alias of ``all_reduce`` counts
too) and the batch-dependent modules (BatchNorm) found in training mode during its forwards."""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Mapping
from typing import Any

from ...registry import Setting, check
from . import measure
from .replicas import OPTIONAL, ROLES

#: keys of dlcheck_make_training's dict that name an eval DataLoader
EVAL_KEYS = ("eval", "val", "test", "dev")

role_names = ("dist_eval", "make_eval_dataloader")


# --------------------------------------------------------------------------------------------------
# in a rank


def _sequence(dist: Any) -> int | None:
    """The default process group's collective sequence number (None where the backend keeps none)."""
    try:
        return int(dist.distributed_c10d._get_default_group()._get_sequence_number_for_group())
    except Exception:  # noqa: BLE001 - a backend without sequence numbers: the collectives are not counted
        return None


def _is_loader(obj: Any) -> bool:
    from torch.utils.data import DataLoader

    from .accelerate import is_prepared_loader

    return isinstance(obj, DataLoader) or is_prepared_loader(obj)


def eval_loader(rank: Any, state: Mapping[str, Any]) -> tuple[Any, str | None]:
    """(this rank's eval DataLoader, where it comes from), or (None, None)."""
    if rank.job.make_eval_dataloader is not None:
        return rank.call("make_eval_dataloader", rank.job.make_eval_dataloader), "dlcheck_make_eval_dataloader"
    for key, value in state.items():
        if any(word in str(key).lower() for word in EVAL_KEYS) and _is_loader(value):
            return value, f"dlcheck_make_training (state[{key!r}])"
    return None, None


def _scalar(x: Any) -> float | None:
    import torch

    if isinstance(x, bool):
        return None
    if isinstance(x, (int, float)):
        return float(x)
    if isinstance(x, torch.Tensor) and x.numel() == 1 and x.dim() == 0:
        return float(x.detach().double().cpu())
    if type(x).__module__ == "numpy" and getattr(x, "shape", None) == ():
        return float(x)
    return None


def _rows(x: Any) -> int | None:
    """Rows of an array-like of predictions (its first dimension)."""
    shape = getattr(x, "shape", None)
    if shape is not None and len(shape) >= 1:
        return int(shape[0])
    return None


def summarize(result: Any) -> dict[str, Any]:
    """What dlcheck_dist_eval returned, as D7 judges it: gathered predictions (their row count), a metric
    (its numbers), nothing (a rank that reports no metric), or something else."""
    if result is None:
        return {"kind": "none"}
    value = _scalar(result)
    if value is not None:
        return {"kind": "metric", "values": {"metric": value}}
    rows = _rows(result)
    if rows is not None:
        return {"kind": "predictions", "rows": rows, "shape": f"a {type(result).__name__} of {rows} rows"}
    if isinstance(result, Mapping) and result:
        values = {str(k): _scalar(v) for k, v in result.items()}
        if all(v is not None for v in values.values()):
            return {"kind": "metric", "values": values}
        arrays = {str(k): _rows(v) for k, v in result.items() if _rows(v) is not None}
        if arrays and len(set(arrays.values())) == 1:
            rows = next(iter(arrays.values()))
            return {"kind": "predictions", "rows": rows, "shape": f"a dict of {', '.join(arrays)} ({rows} rows)"}
        return {"kind": "other", "type": f"a dict with keys {', '.join(map(str, list(result)[:6]))}"}
    if isinstance(result, tuple) and result and all(_rows(v) is not None for v in result):
        sizes = {_rows(v) for v in result}
        if len(sizes) == 1:
            rows = sizes.pop()
            return {"kind": "predictions", "rows": rows, "shape": f"a tuple of {len(result)} arrays of {rows} rows"}
    if isinstance(result, list):
        if result and all(isinstance(v, str) for v in result):  # decoded texts, what BLEU / ROUGE are computed over
            return {"kind": "predictions", "rows": len(result), "shape": f"a list of {len(result)} texts"}
        if all(_scalar(v) is not None for v in result):
            return {"kind": "predictions", "rows": len(result), "shape": f"a list of {len(result)} values"}
        if all(_rows(v) is not None or _scalar(v) is not None for v in result):
            rows = sum(_rows(v) if _rows(v) is not None else 1 for v in result)
            return {"kind": "predictions", "rows": rows, "shape": f"a list of {len(result)} chunks ({rows} rows)"}
    if isinstance(result, list) and result:
        kinds = sorted({type(v).__name__ for v in result})
        return {"kind": "other", "type": f"a list of {', '.join(kinds[:3])}"}
    return {"kind": "other", "type": f"a {type(result).__name__}"}


def evaluate(rank: Any) -> dict[str, Any]:
    """The rank's part of D7's launch (see the module's doc)."""
    import torch
    import torch.distributed as dist

    from .accelerate import is_prepared_loader
    from .launch import SMALL_MODEL, unwrap

    job = rank.job
    if job.dist_setup is not None:
        rank.call("dist_setup", lambda: job.dist_setup(rank.rank, rank.world))
    state = rank.build()
    inner = unwrap(state["model"])
    rec: dict[str, Any] = {"rank": rank.rank, "weights_error": None}
    if job.eval_weights is not None:
        try:
            with torch.no_grad():
                params = dict(inner.named_parameters())
                for name, value in job.eval_weights.items():
                    params[name].copy_(value.to(params[name].device))
        except Exception as exc:  # noqa: BLE001 - D7 says the reference could not take the weights
            rec["weights_error"] = f"{type(exc).__name__}: {str(exc)[:200]}"
    rec["params"] = rank.params(inner)
    small = sum(p.numel() for p in inner.parameters()) <= SMALL_MODEL
    rec["tensors"] = rank.tensors(inner) if small and rank.rank == 0 and job.eval_weights is None else None
    loader, built_by = eval_loader(rank, state)
    rec["loader"] = None
    if loader is None:
        return rec
    rec["loader"] = rank.describe_loader(loader) | {"built_by": built_by}
    rec["indices"] = rank.indices(loader, 0)
    # the collectives a pass over a prepared loader runs by itself (Accelerate synchronises the generators)
    base = 0
    if is_prepared_loader(loader):
        before = _sequence(dist)
        for _ in loader:
            pass
        after = _sequence(dist)
        base = after - before if before is not None and after is not None else 0
    batch_dependent = [(n, m) for n, m in inner.named_modules() if isinstance(m, torch.nn.modules.batchnorm._BatchNorm)]
    dropouts = [(n, m) for n, m in inner.named_modules() if isinstance(m, torch.nn.modules.dropout._DropoutNd) and m.p]
    in_train_mode: set[str] = set()
    dropout_on: set[str] = set()

    def pre(module: Any, args: Any) -> None:
        in_train_mode.update(n for n, m in batch_dependent if m.training)
        dropout_on.update(n for n, m in dropouts if m.training)

    # the collectives a wrapper runs inside its own forward (DistributedDataParallel broadcasts its buffers there)
    # are no reduction of the metric: counted apart
    inside = {"n": 0, "at": None}

    def wrapper_pre(module: Any, args: Any) -> None:
        inside["at"] = _sequence(dist)

    def wrapper_post(module: Any, args: Any, out: Any) -> None:
        now = _sequence(dist)
        if inside["at"] is not None and now is not None:
            inside["n"] += now - inside["at"]
        inside["at"] = None

    handles = [inner.register_forward_pre_hook(pre)]
    if state["model"] is not inner and isinstance(state["model"], torch.nn.Module):
        handles += [
            state["model"].register_forward_pre_hook(wrapper_pre),
            state["model"].register_forward_hook(wrapper_post),
        ]
    try:
        before = _sequence(dist)
        result = rank.call("dist_eval", lambda: job.dist_eval(state, loader))
        after = _sequence(dist)
        rec["wrapper_collectives"] = inside["n"]
        rec["result"] = summarize(result)
        if job.eval_twice:
            rec["again"] = summarize(rank.call("dist_eval", lambda: job.dist_eval(state, loader)))
    finally:
        for handle in handles:
            handle.remove()
    rec["collectives"] = (
        after - before - base - rec["wrapper_collectives"] if before is not None and after is not None else None
    )
    rec["train_mode"] = sorted(in_train_mode)
    rec["dropout_on"] = sorted(dropout_on)
    return rec


# --------------------------------------------------------------------------------------------------
# in the pytest process


def _roles(dlcheck: Any) -> dict[str, Any]:
    return {name: dlcheck.role(name) for name in (*measure.RUN_ROLES, *role_names)}


def eval_launch(dlcheck: Any, world: int, base: Any = None, weights: Any = None) -> Any:
    """The launch of the user's evaluation at world size ``world`` (memoized): the distributed one, or (``base``
    given: the distributed launch) the one-process reference, on ``weights``, evaluated twice."""
    setup = measure._rank_setup(dlcheck)
    roles = _roles(dlcheck)
    tmp = dlcheck.request.getfixturevalue("tmp_path_factory")
    limit, pg_timeout = measure.bounds(dlcheck)

    def run() -> Any:
        job = measure._job(
            roles,
            setup,
            world,
            str(tmp.mktemp(f"dlcheck-dist-eval{world}")),
            mode="eval",
            pg_timeout=pg_timeout,
            dist_eval=measure._value(roles["dist_eval"]),
            make_eval_dataloader=measure._value(roles["make_eval_dataloader"]),
            eval_weights=weights,
            eval_twice=base is not None,
        )
        return measure.launch(job, limit=limit, hang=measure.HANG_LIMIT)

    sources = tuple(roles.values()) if base is None else (*roles.values(), base)
    return measure.memo_or_skip(dlcheck, sources, f"dist:eval:{world}" + (":reference" if base else ""), run)


def _few(xs: list[int], n: int = 8) -> str:
    xs = sorted(xs)
    return ", ".join(map(str, xs[:n])) + (", …" if len(xs) > n else "")


def _where(info: dict[str, Any]) -> str:
    if info.get("sampler") == "BatchSamplerShard":
        return (
            f"Accelerate's BatchSamplerShard over a {info.get('inner')} (batch_size={info.get('batch_size')}, "
            f"drop_last={info.get('drop_last')}, even_batches={info.get('even_batches')})"
        )
    if info.get("sampler") == "DistributedSampler":
        return f"DistributedSampler(drop_last={info.get('drop_last')}), batch_size={info.get('batch_size')}"
    return f"a {info.get('sampler')}, batch_size={info.get('batch_size')}"


def _fmt(x: float) -> str:
    return f"{x:.6g}"


ACCELERATE_FIX = (
    "accelerator.gather_for_metrics(...) in place of accelerator.gather(...): it drops the examples the last batches "
    "repeat; then compute the metric over what it returns"
)
PLAIN_FIX = (
    "count each example once: split the eval set without padding (sampler=range(rank, len(eval_set), world_size), "
    "or gather the example indices with the predictions and keep the first of each) and reduce the metric's sums and "
    "counts with dist.all_reduce on every rank, dividing after the reduction"
)
REDUCE_FIX = (
    "reduce the metric across the ranks before reporting it: dist.all_reduce the sums and the counts on every rank "
    "(or accelerator.gather_for_metrics the predictions), then divide; return None from dlcheck_dist_eval on the "
    "ranks that report nothing"
)


@check(
    "D7",
    domain="dist",
    title="the distributed evaluation counts eval examples twice or leaves them out",
    roles=ROLES,
    optional_roles=(*OPTIONAL, *role_names),
    settings=(
        Setting(
            "rtol",
            1e-5,
            "relative difference between the distributed metric and the one-process metric beyond which they differ: "
            "well above float32 rounding of a sum taken in another order, below what one example counted twice moves "
            "a mean over thousands",
        ),
    ),
)
def check_eval_counts(dlcheck):
    """The evaluation of a distributed run counts every eval example exactly once across the ranks.

    What it does
        Launches your evaluation in ``--dlcheck-world-size`` processes as D1 launches your training (a launch of
        its own: a buggy evaluation cannot disturb D1–D6): in each rank ``dlcheck_dist_setup``,
        ``dlcheck_make_training`` + ``dlcheck_dist_wrap`` (the fresh objects), this rank's eval DataLoader
        (``dlcheck_make_eval_dataloader``, or the DataLoader your factory prepared under a key naming ``eval``),
        then ``dlcheck_dist_eval(state, eval_dataloader)``: your own evaluation, with your own gather or
        ``compute_metrics`` and reductions, as the script runs it in every rank. Lists the indices each rank's eval
        loader yields (the padding that evens the shards out), and counts the collectives your evaluation ran.
        Gathered predictions (a tensor / array with a row per prediction, a tuple or dict of them, a list of
        numbers, arrays or decoded texts) fail when their count on a rank differs from the eval set's length. A
        metric (a number or a dict of numbers) is compared with the same evaluation run in one process (world size 1, rank 0's weights) over the whole
        eval set, which counts each example once; it fails when they differ, naming why: no collective at all
        (each rank's metric covers its own shard), ranks reporting different values, the padding counted,
        examples dropped, or shards of different sizes averaged with equal weights.
    Why it is bad
        ``DistributedSampler`` (``drop_last=False``) and Accelerate's ``even_batches`` repeat examples to give
        every rank the same number of batches: 9 examples on 2 ranks at batch 3 are dealt as 12.
        ``accelerator.gather`` / ``dist.all_gather`` return those repeats too, so the metric is computed over 12
        predictions for 9 examples; a metric computed on rank 0 only, without a reduction, covers rank 0's shard.
        Nothing raises: the reported eval score is not the score of the eval set, and it changes with the number
        of GPUs.
    Example
        for x, y in eval_loader:                      # accelerator.prepare'd, 9 examples, batch 3, 2 ranks
            preds.append(accelerator.gather(model(x).argmax(-1)))
            labels.append(accelerator.gather(y))      # 12 predictions for 9 examples
    Use instead
        ``accelerator.gather_for_metrics((preds, y))`` (it drops the last batches' repeats); in a plain DDP loop,
        an eval split without padding (``sampler=range(rank, len(eval_set), world_size)``) and
        ``dist.all_reduce`` of the metric's sums and counts on every rank, divided after the reduction.
    Known problems
        Evaluates the fresh objects (the weights of ``dlcheck_make_training`` after the wrap), over the whole eval
        loader your factory builds: keep its eval set small in the fixture, and of a size the ranks do not divide
        evenly (9 examples on 2 ranks at batch 3), or no padding is there to be counted. A metric that changes
        from one evaluation to the next on the same weights (dropout left on) is not judged, nor one computed
        with BatchNorm in training mode (its outputs depend on how the examples are batched). The one-process
        reference needs a model small enough to send its weights back (up to 4M elements). An eval loader without
        a dataset length or a sampler to list (a script's own strided loader, as llm.c's) has its metric compared
        with one process all the same; which examples each rank evaluates is then not listed (partly judged), and
        gathered predictions are not judged. The collectives a wrapper runs inside its forwards
        (``DistributedDataParallel``'s buffer broadcast) are not counted as the evaluation's reduction. Launches plain loops
        and Accelerate loops; a transformers Trainer's ``evaluate()`` is not launched yet.
    Not applicable
        Training that does not run distributed: a single-process script of the user's own. A plain loop without
        ``dlcheck_dist_wrap`` is asked for it (a missing role: the wrap is what says the script runs distributed);
        an Accelerate user's ``accelerator.prepare`` wraps the model itself.
    """
    setup = measure.the_setup(dlcheck)
    if setup.kind == "trainer":
        dlcheck.skip(
            "your Trainer's evaluate() is not launched yet (its evaluation loop gathers with "
            "accelerator.gather_for_metrics itself; a compute_metrics is not run in the ranks yet)"
        )
    # an Accelerate user's factory may hand over the prepared eval DataLoader itself; a plain loop's comes from hers
    dlcheck.require("dist_eval", *(() if setup.kind == "accelerate" else ("make_eval_dataloader",)))
    world = measure.world_size(dlcheck)
    run = eval_launch(dlcheck, world)
    recs = measure.records(dlcheck, run, "eval")
    if recs[0]["loader"] is None:
        dlcheck.skip(
            "missing role: define fixture dlcheck_make_eval_dataloader (this rank's eval DataLoader), or return the "
            "prepared eval DataLoader from dlcheck_make_training under a key naming 'eval'"
        )
    diff = measure.first_difference([r["params"] for r in recs])
    if diff is not None:
        dlcheck.skip(
            f"the replicas evaluate different weights ({measure.short(diff[0])!r} differs on rank {diff[1]}): D4 "
            "reports the initialisation"
        )
    info = recs[0]["loader"]
    n = info.get("dataset_len")
    indices = [r["indices"] for r in recs]
    results = [r["result"] for r in recs]
    other = next((res for res in results if res["kind"] == "other"), None)
    if other is not None:
        dlcheck.skip(
            f"dlcheck_dist_eval returned {other['type']}: neither predictions (a tensor / array with a row per "
            "prediction, a tuple or dict of them, a list of numbers, arrays or texts) nor a metric (a number or a "
            "dict of numbers)"
        )
    if all(res["kind"] == "none" for res in results):
        dlcheck.skip("dlcheck_dist_eval returned None on every rank: no predictions or metric to judge")
    uncounted = (
        "the eval DataLoader's dataset has no length"
        if not n
        else f"the eval DataLoader's sampler ({info.get('sampler')}) yields no indices to list"
        if any(i is None for i in indices)
        else None
    )
    if uncounted:
        metrics = [(r, res["values"]) for r, res in enumerate(results) if res["kind"] == "metric"]
        if not metrics or any(res["kind"] == "predictions" for res in results):
            dlcheck.skip(f"{uncounted}: how many examples the evaluation counts is unknown")
        # a metric needs no count: it is compared with the same evaluation in one process
        dlcheck.not_judged(
            "the examples each rank evaluates", f"{uncounted}: the padding and the shards are not listed"
        )
        notes = _judge_metrics(
            dlcheck, run, recs, metrics, None, None, None, [], [], uncounted, setup.kind == "accelerate"
        )
        dlcheck.measured(*notes)
        return

    counts = [len(i) for i in indices]
    total = sum(counts)
    seen = Counter(x for i in indices for x in i)
    union = set(seen)
    repeated = sorted(x for x, c in seen.items() if c > 1)
    missing = sorted(set(range(n)) - union)
    same_everywhere = world > 1 and all(i == indices[0] for i in indices[1:])
    accelerate = setup.kind == "accelerate"
    head = (
        f"eval loader on {world} ranks ({_where(info)}), {n} eval examples dealt as {total} indices: "
        + ", ".join(f"rank {r}: {c}" for r, c in enumerate(counts))
        + (f"; repeated on two ranks: {_few(repeated)}" if repeated else "")
        + (f"; on no rank: {_few(missing)}" if missing else "")
    )
    notes: list[str] = []
    preds = [(r, res) for r, res in enumerate(results) if res["kind"] == "predictions"]
    for r, res in preds:
        rows = res["rows"]
        if rows == n:
            continue
        evidence = [f"{rows} predictions gathered on rank {r} for {n} eval examples ({res['shape']})", head]
        if rows > n:
            if same_everywhere:
                cause = (
                    f"every rank evaluates the same {counts[0]} examples (the eval loader is not sharded: "
                    f"{info.get('sampler')}), and the gather stacks the {world} copies"
                )
                fix = (
                    "prepare the eval DataLoader with the Accelerator (accelerator.prepare(eval_loader)) and gather "
                    "with accelerator.gather_for_metrics"
                    if accelerate
                    else "DataLoader(eval_set, sampler=DistributedSampler(eval_set, shuffle=False)) in every process, "
                    "then count each example once"
                )
            elif total > n and rows == total:
                evidence[0] += f": {rows - n} duplicate{'s' if rows - n > 1 else ''} padding the last batches"
                cause = (
                    f"the eval loader repeats {total - n} example(s) so that every rank gets the same number of "
                    "batches, and "
                    + ("accelerator.gather" if accelerate else "the gather (all_gather)")
                    + " returns every rank's batches as they are, the repeats included: they are counted twice"
                )
                fix = ACCELERATE_FIX if accelerate else PLAIN_FIX
            else:
                cause = f"the evaluation gathers {rows - n} prediction(s) more than there are eval examples"
                fix = ACCELERATE_FIX if accelerate else PLAIN_FIX
        elif rows == counts[r] and world > 1:
            cause = f"the predictions are not gathered across the ranks: rank {r}'s own shard ({rows} of {n} examples)"
            fix = (
                "accelerator.gather_for_metrics(predictions) on every rank"
                if accelerate
                else "gather every rank's predictions (dist.all_gather) or all_reduce the metric's sums and counts"
            )
        elif missing and rows == len(union):
            cause = f"the eval loader leaves {len(missing)} example(s) out (drop_last=True): they are never evaluated"
            fix = "drop_last=False for evaluation (every example evaluated), with the repeats dropped by the gather"
        else:
            cause = f"the evaluation gathers {n - rows} prediction(s) fewer than there are eval examples"
            fix = ACCELERATE_FIX if accelerate else PLAIN_FIX
        dlcheck.fail(evidence, cause, fix, rank=r, predictions=rows, examples=n, indices=total)
    if preds:
        notes.append(
            f"{preds[0][1]['rows']} predictions gathered on rank{'s' if len(preds) > 1 else ''} "
            f"{', '.join(str(r) for r, _ in preds)} for the {n} eval examples"
            + (f" ({total - len(union)} repeated as padding by the eval loader, not counted)" if total > n else "")
        )

    metrics = [(r, res["values"]) for r, res in enumerate(results) if res["kind"] == "metric"]
    if metrics:
        notes += _judge_metrics(dlcheck, run, recs, metrics, n, counts, total, repeated, missing, head, accelerate)
    dlcheck.measured(*notes, examples=n, indices=total)


def _judge_metrics(dlcheck, run, recs, metrics, n, counts, total, repeated, missing, head, accelerate) -> list[str]:
    """Compare the metric every reporting rank returned with the one-process evaluation of the same weights."""
    weights = recs[0].get("tensors")
    if weights is None:
        dlcheck.skip(
            "the model is too large to send its weights to the one-process evaluation (over 4M elements): the metric "
            "is not judged"
        )
    ref_run = eval_launch(dlcheck, 1, base=run, weights=weights)
    ref = measure.records(dlcheck, ref_run, "eval")[0]
    if ref["weights_error"] or ref["params"] != recs[0]["params"]:
        dlcheck.skip(
            "the one-process evaluation could not take the distributed launch's weights"
            + (f" ({ref['weights_error']})" if ref["weights_error"] else "")
        )
    if ref["result"]["kind"] != "metric":
        dlcheck.skip(f"dlcheck_dist_eval returned no metric in one process ({ref['result']['kind']})")
    rtol = float(dlcheck.setting("rtol"))
    reference, again = ref["result"]["values"], ref.get("again", {}).get("values", {})

    def differ(a: float, b: float) -> bool:
        return abs(a - b) > rtol * max(abs(a), abs(b)) + 1e-12

    judged, unstable = [], []
    for key, value in reference.items():
        other = again.get(key)
        if not math.isfinite(value) or other is None or not math.isfinite(other) or differ(value, other):
            unstable.append(key)
        elif all(key in values for _, values in metrics):
            judged.append(key)
    dropout_on = sorted({m for r in (ref, *recs) for m in r.get("dropout_on") or ()})
    why_unstable = (
        f"its dropout runs in training mode during the evaluation ({', '.join(dropout_on[:4])}: model.eval() is not "
        "called; V2 judges it)"
        if dropout_on
        else "no dropout ran in training mode: the evaluation draws random numbers of its own, a collator's random "
        "masks or a sampling"
    )
    if unstable:
        dlcheck.not_judged(
            ", ".join(unstable),
            f"changes from one evaluation to the next on the same weights and data in one process ({why_unstable}), "
            "or is not finite",
        )
    if not judged:
        dlcheck.skip(
            "no metric of dlcheck_dist_eval can be compared with the one-process evaluation "
            f"(reported: {', '.join(reference) or 'none'}; not the same twice: {', '.join(unstable) or 'none'}"
            + (f": {why_unstable}" if unstable else "")
            + ")"
        )
    if any(r["train_mode"] for r in recs):
        modules = sorted({m for r in recs for m in r["train_mode"]})
        dlcheck.skip(
            f"the evaluation runs {', '.join(modules[:4])} (BatchNorm) in training mode: its outputs depend on how the "
            "examples are batched, so the distributed metric is not comparable with the one-process one (call "
            "model.eval() in the evaluation)"
        )
    bad = [(key, r, values[key]) for key in judged for r, values in metrics if differ(values[key], reference[key])]
    over = f"over the {n} eval examples" if n else "over its whole eval loader"
    if not bad:
        key = judged[0]
        return [
            f"{key} = {_fmt(metrics[0][1][key])} on rank{'s' if len(metrics) > 1 else ''} "
            f"{', '.join(str(r) for r, _ in metrics)} of {run.world}, the one-process evaluation of the same weights "
            f"{over} gives {_fmt(reference[key])}"
            + (
                f" ({total - n + len(missing)} index(es) repeated as padding: the distributed value equals the one "
                "without them)"
                if repeated
                else ""
            )
        ]
    key, r, value = bad[0]
    evidence = [
        f"{key} = {_fmt(value)} on rank {r} of {run.world}; the same evaluation in one process {over} (rank 0's "
        f"weights) gives {_fmt(reference[key])}",
        head,
    ]
    collectives = [rec.get("collectives") for rec in recs]
    values = [values[key] for _, values in metrics]
    fix = REDUCE_FIX
    if all(c == 0 for c in collectives):
        wrapped = sum(rec.get("wrapper_collectives") or 0 for rec in recs)
        evidence.append(
            "no collective ran during dlcheck_dist_eval on any rank (the process group's count stayed put"
            + (
                f", beside the {wrapped} the model's wrapper ran inside its forwards: DistributedDataParallel's "
                "buffer broadcast, no reduction of the metric)"
                if wrapped
                else ")"
            )
        )
        cause = f"the metric is not reduced across the ranks: rank {r}'s {key} covers its own shard only" + (
            f" ({counts[r]} of {n} examples)" if counts else ""
        )
    elif len(metrics) > 1 and any(differ(v, values[0]) for v in values[1:]):
        evidence.append(
            "the ranks report different values: " + ", ".join(f"rank {q}: {_fmt(vals[key])}" for q, vals in metrics)
        )
        cause = (
            f"the ranks' {key} differ: the reduction leaves the full value on some ranks only (dist.reduce / "
            "dist.gather to one rank) or reduces only part of it"
        )
    elif n is None:
        dlcheck.skip(
            f"{key} differs from the one-process evaluation ({_fmt(value)} on rank {r}, {_fmt(reference[key])} in one "
            f"process), a reduction ran and the ranks agree; {head}: which examples are counted twice or left out "
            "cannot be told"
        )
    elif missing:
        cause = f"the eval loader leaves {len(missing)} example(s) out (drop_last=True): they are never evaluated"
        fix = (
            "drop_last=False for evaluation, with the repeats the loader adds counted once (see the fix of the padding)"
        )
    elif total > n:
        cause = (
            f"the {total - n} example(s) the eval loader repeats to give every rank the same number of batches are "
            f"counted in {key} as if they were more eval examples"
        )
        fix = ACCELERATE_FIX if accelerate else PLAIN_FIX
    elif len(set(counts)) > 1:
        cause = (
            f"the ranks' shards differ in size ({', '.join(map(str, counts))} examples) and their {key} are averaged "
            "with equal weights: an example of the smaller shard counts more"
        )
        fix = "all_reduce the sums and the counts on every rank, then divide (not the ranks' means)"
    else:
        dlcheck.skip(
            f"{key} differs from the one-process evaluation ({_fmt(value)} on rank {r}, {_fmt(reference[key])} in one "
            "process) with no repeated or left-out example, a reduction run and the ranks agreeing: not a count D7 can "
            "name"
        )
    dlcheck.fail(evidence, cause, fix, rank=r, metric=key, value=value, reference=reference[key], examples=n)
