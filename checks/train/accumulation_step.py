"""T10's measurement of a step whose loss exists only inside it (no ``dlcheck_compute_loss``, a model given no
labels, batches no ``dlcheck_loss_fn`` takes): what each backward of the user's step adds to ``.grad``, the
constant factor at the root of the loss it backwards, the step's random draws (recorded, then replayed row by
row on the union of the window's micro-batches), and the union itself (concatenated, or collated by the user's
own collator from the micro-batches' examples)."""

from __future__ import annotations

import contextlib
import math
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any

import torch

from ...guard import preserved_rng
from ...session import made_up
from ...training import SEED, batch_len, seed_all
from ...training.runs import draw_batches, unwrap_prepared

#: the torch functions whose draws are recorded and replayed (a draw through another source is caught by running the
#: union at two seeds: its contribution then differs)
DRAWS = ("rand", "randn", "randint", "rand_like", "randn_like", "randint_like", "bernoulli", "multinomial", "normal")
#: the per-backward contributions kept for the weight fit: the first parameters up to this many elements
FIT_ELEMENTS = 1 << 22
#: graph nodes a scalar loss passes through unchanged in value (a dtype cast, a copy)
_TRANSPARENT = ("ToCopyBackward0", "CloneBackward0", "AliasBackward0")


def root_factor(loss: torch.Tensor) -> float | None:
    """The constant factor at the root of ``loss``'s graph: ``loss / k`` gives 1/k, ``loss * s`` gives s, a sum of
    terms all scaled alike gives their factor, a loss backwarded whole gives 1.0; None when the terms are scaled
    unlike (no one factor)."""

    def const(node: Any, name: str) -> float | None:
        value = getattr(node, name, None)
        if isinstance(value, torch.Tensor) and value.numel() == 1:
            return float(value.detach().double())
        if isinstance(value, (int, float)):
            return float(value)
        return None

    def walk(node: Any, depth: int) -> float | None:
        if node is None or depth > 64:
            return 1.0
        kind = type(node).__name__
        nxt = [f for f, _ in node.next_functions]
        if kind in _TRANSPARENT and len(nxt) == 1:
            return walk(nxt[0], depth + 1)
        if kind == "NegBackward0":
            inner = walk(nxt[0], depth + 1)
            return None if inner is None else -inner
        if kind in ("DivBackward0", "MulBackward0") and len(nxt) == 2:
            if nxt[1] is None and nxt[0] is not None:
                c = const(node, "_saved_other")
                branch = nxt[0]
            elif nxt[0] is None and nxt[1] is not None and kind == "MulBackward0":
                c = const(node, "_saved_self")
                branch = nxt[1]
            else:
                return 1.0  # both operands carry gradient: no constant factor here
            if c is None or c == 0:
                return 1.0
            inner = walk(branch, depth + 1)
            if inner is None:
                return None
            return inner / c if kind == "DivBackward0" else inner * c
        if kind == "AddBackward0" and getattr(node, "_saved_alpha", 1) == 1:
            found = [walk(f, depth + 1) for f in nxt if f is not None]
            if not found or any(f is None for f in found):
                return None
            if all(abs(f - found[0]) <= 1e-9 * max(1.0, abs(found[0])) for f in found):
                return found[0]
            return None
        return 1.0

    return walk(loss.grad_fn, 0) if isinstance(loss, torch.Tensor) else None


@dataclass
class Backward:
    call: int  # the call of the user's step it came in
    factor: float | None  # the constant factor at the root of the loss it backwarded
    part: dict[str, torch.Tensor]  # what it added to .grad, on the fit parameters (float32, cpu)


@dataclass
class Record:
    """What the user's step did in one run, backward by backward and draw by draw."""

    backwards: list[Backward] = field(default_factory=list)
    totals: dict[int, dict[str, torch.Tensor]] = field(default_factory=dict)  # per call: the sum of its contributions
    draws: list[tuple[int, torch.Tensor]] = field(default_factory=list)  # (call, the tensor drawn)
    replay_error: str | None = None
    replayed: int = 0  # draws given back from the recording
    now: int = 0

    def total(self, calls: range) -> dict[str, torch.Tensor]:
        out: dict[str, torch.Tensor] = {}
        for c in calls:
            for name, g in self.totals.get(c, {}).items():
                out[name] = out[name] + g if name in out else g.clone()
        return out

    def in_calls(self, calls: range) -> list[Backward]:
        return [b for b in self.backwards if b.call in calls]


class Replay:
    """Gives the step's draws back: the pre-window calls their own draws as recorded; the union's calls the
    window's draws joined row by row (the draw j of every micro-batch, stacked over the rows of the union; a
    longer union, padded, keeps a fresh draw of the live RNG beyond each micro-batch's length)."""

    def __init__(self, recorded: list[tuple[int, torch.Tensor]], start: int, end: int, rows: list[int]):
        self.before = {c: [t for cc, t in recorded if cc == c] for c in range(start)}
        self.window = [t for c, t in recorded if start <= c <= end]
        self.k = end - start + 1
        self.rows = rows
        self.used: dict[int, int] = {}
        self.t = 0

    def per_micro_batch(self) -> int | None:
        if len(self.window) % self.k:
            return None
        return len(self.window) // self.k

    def give(self, call: int, fresh: torch.Tensor, rec: Record) -> torch.Tensor:
        if call in self.before:
            i = self.used.get(call, 0)
            self.used[call] = i + 1
            old = self.before[call]
            if i >= len(old) or old[i].shape != fresh.shape or old[i].dtype != fresh.dtype:
                rec.replay_error = f"call {call + 1} draws otherwise than when it was watched"
                return fresh
            rec.replayed += 1
            return old[i].to(fresh.device).clone()
        m = self.per_micro_batch()
        if not m:
            rec.replay_error = (
                f"the window's {len(self.window)} draws do not split into the same number per micro-batch (k={self.k})"
            )
            return fresh
        j = self.t % m
        self.t += 1
        parts = [self.window[i * m + j] for i in range(self.k)]
        shape = tuple(fresh.shape)
        if (
            fresh.dim() == 0
            or any(p.dim() != fresh.dim() or p.dtype != fresh.dtype for p in parts)
            or [p.shape[0] for p in parts] != self.rows
            or sum(self.rows) != shape[0]
            or any(p.shape[d] > shape[d] for p in parts for d in range(1, fresh.dim()))
        ):
            rec.replay_error = (
                f"the union's draw of shape {list(shape)} is not the micro-batches' draws of shapes "
                f"{', '.join(str(list(p.shape)) for p in parts)} joined row by row (one row per example)"
            )
            return fresh
        out = fresh.clone()
        row = 0
        for p in parts:
            out[(slice(row, row + p.shape[0]), *(slice(0, s) for s in p.shape[1:]))] = p.to(out.device)
            row += p.shape[0]
        rec.replayed += 1
        return out


@contextlib.contextmanager
def watched(params: list[tuple[str, torch.Tensor]], rec: Record, replay: Replay | None = None) -> Iterator[Record]:
    """While open: every ``torch.autograd.backward`` (``loss.backward()``, ``accelerator.backward``) is measured
    (what it adds to the watched parameters' ``.grad``, the factor at its loss's root), and the step's draws through
    :data:`DRAWS` are recorded, or, with ``replay``, given back."""
    fit, budget = set(), FIT_ELEMENTS
    for name, p in params:
        if budget <= 0:
            break
        fit.add(name)
        budget -= p.numel()
    original_backward = torch.autograd.backward
    depth = [0]

    def backward(tensors: Any, *args: Any, **kwargs: Any) -> Any:
        if depth[0]:
            return original_backward(tensors, *args, **kwargs)
        root = tensors if isinstance(tensors, torch.Tensor) else None
        if root is None and isinstance(tensors, (list, tuple)) and len(tensors) == 1:
            root = tensors[0]
        factor = root_factor(root) if root is not None and root.numel() == 1 else None
        before = {n: p.grad.detach().clone() for n, p in params if p.grad is not None}
        depth[0] += 1
        try:
            out = original_backward(tensors, *args, **kwargs)
        finally:
            depth[0] -= 1
        total = rec.totals.setdefault(rec.now, {})
        part: dict[str, torch.Tensor] = {}
        for name, p in params:
            if p.grad is None:
                continue
            now = p.grad.detach().float()
            delta = now - before[name].float() if name in before else now.clone()  # never the live .grad itself
            total[name] = total[name] + delta if name in total else delta.clone()
            if name in fit:
                part[name] = delta.cpu().clone() if delta.device.type != "cpu" else delta
        rec.backwards.append(Backward(rec.now, factor, part))
        return out

    def drawing(name: str, fn: Any) -> Any:
        def draw(*args: Any, **kwargs: Any) -> Any:
            out = fn(*args, **kwargs)
            if not isinstance(out, torch.Tensor):
                return out
            if replay is not None:
                return replay.give(rec.now, out, rec)
            rec.draws.append((rec.now, out.detach().clone()))
            return out

        return draw

    originals = {name: getattr(torch, name) for name in DRAWS if hasattr(torch, name)}
    mine = {name: drawing(name, fn) for name, fn in originals.items()}
    torch.autograd.backward = backward
    for name, fn in mine.items():
        setattr(torch, name, fn)
    try:
        yield rec
    finally:
        if torch.autograd.backward is backward:
            torch.autograd.backward = original_backward
        for name, fn in mine.items():
            if getattr(torch, name) is fn:
                setattr(torch, name, originals[name])


def loss_scale(state: Any) -> float:
    """The scale of a mixed-precision GradScaler of the training state (its own ``scaler``, or its Accelerator's),
    by which ``scaler.scale(loss)`` multiplies every loss before its backward; 1.0 when there is none."""
    from ...training.accelerate import accelerator_of

    for scaler in (state.get("scaler"), getattr(accelerator_of(state), "scaler", None)):
        enabled = getattr(scaler, "is_enabled", None)
        if callable(enabled) and enabled() and callable(getattr(scaler, "get_scale", None)):
            got = float(scaler.get_scale())
            if got > 0:
                return got
    return 1.0


def watched_params(model: Any, opt: Any) -> list[tuple[str, torch.Tensor]]:
    inner = unwrap_prepared(opt)
    names = {id(p): n for n, p in model.named_parameters()}
    return [(names[id(p)], p) for g in inner.param_groups for p in g["params"] if id(p) in names and p.requires_grad]


# --------------------------------------------------------------------------------------------------------------
# the union of the window's micro-batches


def _rebuild(like: Any, values: Any) -> Any:
    try:
        return type(like)(values)
    except Exception:  # a mapping class that takes no dict (its fields by keyword)
        return dict(values)


def _concat(values: list[Any], rows: list[int]) -> tuple[Any, str | None]:
    """The values joined along their rows (the examples), or None with why they cannot be (padded to different
    lengths: the reason starts with 'padded')."""
    first = values[0]
    if all(isinstance(v, torch.Tensor) for v in values):
        if all(v.dim() == 0 for v in values):
            return (first, None) if all(torch.equal(v, first) for v in values) else (None, "scalars differ")
        if any(v.dim() == 0 or v.shape[0] != n for v, n in zip(values, rows)):
            return None, "a tensor field is not one row per example"
        if any(v.shape[1:] != first.shape[1:] for v in values):
            return None, "padded to different lengths: " + ", ".join(str(list(v.shape)) for v in values)
        return torch.cat(values, 0), None
    if all(isinstance(v, Mapping) for v in values):
        keys = list(first)
        if any(list(v) != keys for v in values):
            return None, "the micro-batches have different fields"
        out = {}
        for k in keys:
            got, why = _concat([v[k] for v in values], rows)
            if why is not None:
                return None, why
            out[k] = got
        return _rebuild(first, out), None
    if all(isinstance(v, (list, tuple)) for v in values):
        if all(len(v) == n for v, n in zip(values, rows)) and not any(
            isinstance(x, (torch.Tensor, Mapping)) for x in first
        ):
            joined = [x for v in values for x in v]
            return (type(first)(joined) if isinstance(first, list) else tuple(joined)), None
        if any(len(v) != len(first) for v in values):
            return None, "the micro-batches have different structures"
        out_items = []
        for i in range(len(first)):
            got, why = _concat([v[i] for v in values], rows)
            if why is not None:
                return None, why
            out_items.append(got)
        if hasattr(first, "_fields"):  # a named tuple
            return type(first)(*out_items), None
        return type(first)(out_items), None
    if all(v == first for v in values):
        return first, None
    return None, f"a {type(first).__name__} field differs between the micro-batches"


def _same(a: Any, b: Any) -> bool:
    if isinstance(a, torch.Tensor) or isinstance(b, torch.Tensor):
        return isinstance(a, torch.Tensor) and isinstance(b, torch.Tensor) and a.shape == b.shape and torch.equal(a, b)
    if isinstance(a, Mapping) and isinstance(b, Mapping):
        return list(a) == list(b) and all(_same(a[k], b[k]) for k in a)
    if isinstance(a, (list, tuple)) and isinstance(b, (list, tuple)):
        return len(a) == len(b) and all(_same(x, y) for x, y in zip(a, b))
    try:
        return bool(a == b)
    except Exception:
        return False


def union(loader: Any, batches: list[Any], start: int) -> tuple[Any, str]:
    """The window's micro-batches as one batch, and how it was formed; (None, why) when it cannot be formed
    honestly. Fields of the same width are concatenated; micro-batches padded to different lengths are collated
    again by the loader's own collate_fn from their examples (drawn again, each micro-batch checked to come out
    as it was)."""
    rows = [batch_len(b) or 0 for b in batches]
    if not all(rows):
        return None, "the micro-batches' examples cannot be counted"
    joined, why = _concat(batches, rows)
    if joined is not None:
        return joined, f"the {len(batches)} micro-batches concatenated ({sum(rows)} examples)"
    if not why.startswith("padded"):
        return None, why
    collate = getattr(loader, "collate_fn", None)
    if not isinstance(loader, torch.utils.data.DataLoader) or collate is None:
        return None, f"{why}, and dlcheck_dataloader is no DataLoader whose collate_fn could pad them together"
    if getattr(loader, "num_workers", 0):
        return None, f"{why}, and the loader's workers collate its batches (num_workers > 0)"
    seen: list[list[Any]] = []

    def recorder(examples: Any) -> Any:
        seen.append(list(examples))
        return collate(examples)

    end = start + len(batches)
    try:
        loader.collate_fn = recorder
        again = draw_batches(loader, end)
    finally:
        loader.collate_fn = collate
    if len(seen) < end or len(again) < end:
        return None, f"{why}, and drawing the loader again gave fewer batches"
    examples = seen[start:end]
    if not all(_same(collate(list(e)), b) for e, b in zip(examples, batches)):
        return None, f"{why}, and the loader's collate_fn on the examples drawn again does not give the micro-batches"
    together = collate([x for e in examples for x in e])
    return together, f"the {len(batches)} micro-batches' {sum(rows)} examples collated together by your collate_fn"


# --------------------------------------------------------------------------------------------------------------
# comparisons


def rel(g: dict[str, torch.Tensor], h: dict[str, torch.Tensor], scale: float = 1.0) -> float:
    diff = norm = 0.0
    for name in set(g) | set(h):
        a = g[name].double() if name in g else None
        b = h[name].double() * scale if name in h else None
        if a is not None and b is not None:
            diff += float((a - b.to(a.device)).pow(2).sum())
        elif a is not None:
            diff += float(a.pow(2).sum())
        if b is not None:
            norm += float(b.pow(2).sum())
    return math.sqrt(diff) / math.sqrt(norm) if norm > 0 else math.inf


def fit_weights(
    parts: list[dict[str, torch.Tensor]], target: dict[str, torch.Tensor]
) -> tuple[list[float | None], float]:
    """The weights w minimising |target - sum_i w_i parts_i| over the parts' parameters, and the relative residual;
    a part that added no gradient (all its elements zero) has no weight (None)."""
    names = sorted(set().union(*parts) & set(target))
    if not names:
        return [], math.inf
    cols = [
        torch.cat([p[n].double().flatten() if n in p else torch.zeros(target[n].numel()) for n in names]) for p in parts
    ]
    big = max(float(c.norm()) for c in cols)
    used = [i for i, c in enumerate(cols) if big > 0 and float(c.norm()) > 1e-6 * big]
    b = torch.cat([target[n].double().cpu().flatten() for n in names])
    if not used:
        return [None] * len(parts), math.inf
    a = torch.stack([cols[i] for i in used], 1)
    w = torch.linalg.lstsq(a, b.unsqueeze(1)).solution.squeeze(1)
    resid = float((a @ w - b).norm()) / max(float(b.norm()), 1e-300)
    out: list[float | None] = [None] * len(parts)
    for i, x in zip(used, w):
        out[i] = float(x)
    return out, resid


def run_union(
    setup: Any,
    quiet: Any,
    win: Any,
    before: list[Any],
    joined: Any,
    draws: list[tuple[int, torch.Tensor]],
    rows: list[int],
    seed: int,
    replicate: bool,
) -> Record:
    """The user's step on fresh objects: the calls before the window on their own batches (their draws replayed),
    then the union of the window's micro-batches at the window's first call (``replicate``: at every call of the
    window, through its optimizer step)."""
    from ...training.resume import own_generators

    state = setup.state()
    model, opt = state["model"], state.get("optimizer")
    quiet(model)
    setup.train_mode(state)
    if seed != SEED:
        for gen in own_generators(state).values():
            gen.manual_seed(seed)  # fresh objects: the run's own generators drawn otherwise too
    rec = Record()
    replay = Replay(draws, win.start, win.end, rows)
    calls = range(win.start, win.end + 1) if replicate else range(win.start, win.start + 1)
    with preserved_rng():
        seed_all(seed)
        with watched(watched_params(model, opt), rec, replay):
            for i, batch in enumerate(before):
                rec.now = i
                setup.step(state, batch, i)
            with made_up(f"the union of the {win.end - win.start + 1} micro-batches of an accumulation window"):
                for c in calls:
                    rec.now = c
                    setup.step(state, joined, c)
    del state
    return rec
