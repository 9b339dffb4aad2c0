from __future__ import annotations

import contextlib
import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import torch

from ...errors import MISSING
from ...guard import preserved_rng
from ...registry import Setting, check
from ...session import user_call
from ...training import SEED, SetupError, get_setup, probe, run_or_skip, seed_all
from ...training.backward import own_backward
from ...training.runs import (
    ACCUMULATION_LIMIT,
    NoStepToSaveAfter,
    NotTheBatch,
    Trajectory,
    batch_len,
    device_of,
    loss_tensor,
    model_call,
    output_tensor,
    param_names,
    past_accumulation,
    to_device,
    unwrap_prepared,
)
from ..shared.dropout import quiet_dropout
from . import accumulation_step as by_step
from . import trainer_accumulation


def _quiet_dropout(model: Any) -> int:
    """Dropout off on a fresh copy (layers' ``p`` and the float ``*dropout*`` attributes attention modules
    read at every call), so the user's step and the reference see the same function. Returns how many."""
    return len(quiet_dropout(model))


@dataclass
class Window:
    """What the user's step did up to the optimizer step that closes the first accumulation window."""

    calls: list[int] = field(default_factory=list)  # the calls of the user's step at which the optimizer stepped
    start: int = 0  # the first call of the window (1 when an optimizer step came at the very first call)
    end: int = -1  # the call at which the window's optimizer step came
    grads: dict[str, torch.Tensor] = field(default_factory=dict)  # what the optimizer saw at that step
    after_backward: dict[str, float] = field(default_factory=dict)  # each gradient's norm after the last backward
    modes: dict[str, bool] | None = None  # the train/eval flags at the window's first forward
    start_weights: dict[str, torch.Tensor] | None = None  # the weights the window started from (after step 1)
    dropouts: int = 0
    no_optimizer: bool = False
    first_grads: dict[str, torch.Tensor] | None = None  # what the optimizer saw when it stepped at the very first call
    first_modes: dict[str, bool] | None = None  # the train/eval flags at that first call's forward
    loss_missing: str | None = None  # why dlcheck cannot compute the loss apart from the step (judged from the step)
    loss_scale: float = 1.0  # a mixed-precision GradScaler's scale, a factor of every loss the step backwards
    record: by_step.Record | None = None  # the step's backwards and draws, when judged from the step
    #: the calls at whose start a parameter the optimizer holds carried a non-zero gradient (left by earlier calls)
    carried: set[int] = field(default_factory=set)
    #: what a call without an optimizer step did to the accumulated ``.grad`` itself: (call, "before" | "after" its
    #: backwards, the one factor every parameter's gradient was multiplied by; 0: zeroed)
    touched: list[tuple[int, str, float]] = field(default_factory=list)
    #: how the watch was lengthened past T10.micro_steps (an accumulation longer than it), or None
    lengthened: str | None = None
    tried: int = 0  # the calls this watch was given


def _watch_window(setup: Any, n: int) -> Window:
    """Call the user's step on fresh objects until the optimizer step that ends the first accumulation
    window (the first step, or the second when the first came at the very first call). When the loss exists only
    inside the step, each backward's contribution and the step's random draws are recorded too."""
    win = Window(tried=n)
    state = setup.state()
    model, opt = state["model"], state.get("optimizer")
    if opt is None:
        win.no_optimizer = True
        if isinstance(model, torch.nn.Module) and getattr(setup, "train_step", MISSING) is not MISSING:
            # the step may update the weights itself: which calls did (an update is a call that changed them)
            traj = Trajectory()
            with preserved_rng():
                seed_all(SEED)
                setup.run(
                    state, setup.batches(n), 0, traj, stop=lambda: sum(r.update for r in traj.steps) >= 2, planned=n
                )
            win.calls = [r.step - 1 for r in traj.steps if r.update]
            win.end = len(traj.steps) - 1
        return win
    if not isinstance(model, torch.nn.Module):
        raise SetupError(f"dlcheck_make_training's 'model' is a {type(model).__name__}, not a torch.nn.Module")
    win.dropouts = _quiet_dropout(model)
    setup.train_mode(state)  # as the user's epoch loop sets it before its steps
    inner = unwrap_prepared(opt)
    names = param_names(model)
    params = [(names[id(p)], p) for g in inner.param_groups for p in g["params"] if id(p) in names and p.requires_grad]
    now = {"call": 0}
    modes: dict[int, dict[str, bool]] = {}

    def pre(optimizer, args, kwargs):
        win.calls.append(now["call"])
        win.grads = {name: p.grad.detach().clone() for name, p in params if p.grad is not None}
        win.end = now["call"]
        if win.calls == [0]:
            win.first_grads = win.grads

    def post(optimizer, args, kwargs):
        if len(win.calls) == 1 and win.calls[0] == 0:
            # the first step came at the first call: the window to judge is the next one, from these weights
            win.start_weights = {k: v.detach().clone() for k, v in model.state_dict().items()}

    def forward_pre(module, args):
        modes.setdefault(now["call"], {name: m.training for name, m in module.named_modules()})

    # the norms of each gradient at a call's start, just before its first backward adds to it and just after its
    # last one: a call that changes .grad itself (a rescale or a zeroing inside the window) shows between them
    at_start: dict[str, float] = {}
    first_pre: dict[str, float] = {}
    last_post: dict[str, float] = {}

    def grad_norm(p: torch.Tensor) -> float:
        return float(p.grad.detach().double().norm()) if p.grad is not None else 0.0

    def norm_of(name: str):
        def hook(p: torch.Tensor) -> None:
            win.after_backward[name] = last_post[name] = grad_norm(p)

        return hook

    def before_adding(name: str, p: torch.Tensor):
        def hook(g: torch.Tensor) -> None:
            first_pre.setdefault(name, grad_norm(p))

        return hook

    handles = [inner.register_step_pre_hook(pre), inner.register_step_post_hook(post)]
    handles.append(model.register_forward_pre_hook(forward_pre))
    handles += [p.register_post_accumulate_grad_hook(norm_of(name)) for name, p in params]
    handles += [p.register_hook(before_adding(name, p)) for name, p in params]
    batches = setup.batches(n)
    if setup.compute_loss is MISSING and batches:
        win.loss_missing = setup.loss_unavailable(model, to_device(batches[0], device_of(model)))
    if win.loss_missing is not None:
        win.record = by_step.Record()
        win.loss_scale = by_step.loss_scale(state)
    try:
        with preserved_rng():
            seed_all(SEED)
            with by_step.watched(params, win.record) if win.record is not None else contextlib.nullcontext():
                for i, batch in enumerate(batches):
                    now["call"] = i
                    if win.record is not None:
                        win.record.now = i
                    if any(p.grad is not None and bool(p.grad.detach().ne(0).any()) for _, p in params):
                        win.carried.add(i)
                    at_start = {name: grad_norm(p) for name, p in params}
                    first_pre.clear()
                    last_post.clear()
                    stepped = len(win.calls)
                    setup.step(state, batch, i)
                    if len(win.calls) == stepped:
                        at_end = {name: grad_norm(p) for name, p in params}
                        for where, was, now_ in (("before", at_start, first_pre), ("after", last_post, at_end)):
                            f = _one_factor(was, now_)
                            if f is not None:
                                win.touched.append((i, where, f))
                    if len(win.calls) >= 2 or (win.calls and win.calls[0] > 0):
                        break
    finally:
        for h in handles:
            h.remove()
    if len(win.calls) >= 2:
        win.start = win.calls[0] + 1
    # the flags at the window's first forward (a step that buffers its micro-batches runs none before the last)
    win.modes = next((modes[c] for c in sorted(modes) if c >= win.start), None)
    win.first_modes = modes.get(0)
    return win


def _watch_past_accumulation(setup: Any, n: int) -> Window:
    """:func:`_watch_window` over ``n`` calls, lengthened as C1's and C10's runs are (:func:`past_accumulation`:
    doubled, up to its bound) while no window closed in them: no optimizer step, or one at the first call only (an
    accumulation longer than ``n``). Each try is a run on fresh objects; the last one is returned whatever it saw."""
    last: dict[str, Any] = {}

    def watch(m: int) -> Window:
        win = last["win"] = _watch_window(setup, m)
        last.setdefault("first", win.calls == [0])
        if not win.no_optimizer and win.calls in ([], [0]):
            raise NoStepToSaveAfter(f"no accumulation window closed in {m} calls")
        return win

    try:
        length, win = past_accumulation(watch, n)
    except NoStepToSaveAfter:
        return last["win"]
    if length > n:
        held = "optimizer step after the first call" if last.get("first") else "optimizer step"
        win.lengthened = (
            f"T10.micro_steps={n} calls held no {held}: the watch was lengthened to {length} calls (doubled, as C1's "
            f"runs are, up to {ACCUMULATION_LIMIT})"
        )
    return win


def _one_factor(was: dict[str, float], now: dict[str, float]) -> float | None:
    """The one factor every gradient's norm went from ``was`` to ``now`` by (0: all zeroed), over the gradients
    that were non-zero and seen at both; None when there is none, it is 1 or the gradients moved unlike each other."""
    factors = [now[n] / was[n] for n in was if n in now and was[n] > 0]
    if not factors:
        return None
    mid = sorted(factors)[len(factors) // 2]
    if any(abs(f - mid) > 1e-4 * max(mid, 1e-30) for f in factors) or abs(mid - 1) < 1e-4:
        return None
    return mid


def _causal(model: Any) -> bool:
    return any(type(m).__name__.endswith(("ForCausalLM", "LMHeadModel")) for m in model.modules())


def _token_labels(batch: Any) -> torch.Tensor | None:
    """The labels of a token-level batch: a mapping whose labels are integer per-token targets, or an (inputs,
    targets) pair whose targets are (a pair counts as token-level only when some target of the window is below 0:
    :func:`_tokens`)."""
    labels = batch.get("labels") if isinstance(batch, Mapping) else _pair_targets(batch)
    if isinstance(labels, torch.Tensor) and labels.dim() >= 2 and not labels.is_floating_point():
        return labels
    return None


def _pair_targets(batch: Any) -> torch.Tensor | None:
    """The targets of an (inputs, targets) pair of tensors: integer, one per position (two dimensions or more)."""
    if not isinstance(batch, (list, tuple)) or len(batch) != 2:
        return None
    x, y = batch
    if not (isinstance(x, torch.Tensor) and isinstance(y, torch.Tensor)) or y.dim() < 2 or y.is_floating_point():
        return None
    return y if y.dtype != torch.bool and int(x.shape[0]) == int(y.shape[0]) else None


def _tokens(batches: list[Any]) -> tuple[bool, list[int]]:
    """Whether the window's micro-batches are token-level, and the target values below 0 they hold (ignored: a
    negative target is never a class id of a cross-entropy, so the loss can only be ignoring it). Labels in a mapping
    always are; (inputs, targets) pairs only when some target is below 0 (an ignore_index in use: without one,
    every position counts and the examples of a pair are all the same length, so the weights are the same)."""
    found = [_token_labels(b) for b in batches]
    if not found or any(t is None for t in found):
        return False, []
    ignored = sorted({int(v) for t in found for v in torch.unique(t[t < 0]).tolist()})
    if all(isinstance(b, Mapping) for b in batches):
        return True, ignored
    return (not any(isinstance(b, Mapping) for b in batches) and bool(ignored)), ignored


def _shifted(logits: Any, labels: torch.Tensor, loss: torch.Tensor) -> bool | None:
    """Whether the loss is the token mean over labels shifted by one (a causal LM's own loss) or over the
    labels as they are, read off the logits; None when neither matches."""
    if not isinstance(logits, torch.Tensor) or logits.shape[:-1] != labels.shape:
        return None
    f = torch.nn.functional.cross_entropy
    labels = labels.masked_fill(labels < 0, -100)  # a target below 0 is ignored whatever its value
    with torch.no_grad():
        flat = logits.detach().float()
        shift = f(flat[..., :-1, :].flatten(0, -2), labels[..., 1:].flatten(), ignore_index=-100)
        plain = f(flat.flatten(0, -2), labels.flatten(), ignore_index=-100)
        target = float(loss.detach())
        tol = 1e-3 * max(1.0, abs(target))
        gaps = {True: abs(float(shift) - target), False: abs(float(plain) - target)}
    best = min(gaps, key=gaps.get)
    return best if gaps[best] <= tol else None


def _loss_and_logits(setup: Any, model: Any, batch: Any) -> tuple[torch.Tensor, Any]:
    """The user's loss on a batch (as their training computes it) and, for the model's own loss, the logits."""
    if setup.compute_loss is MISSING and isinstance(batch, Mapping):
        try:
            call = model_call(model, batch)
        except NotTheBatch:
            return setup.loss_of(model, batch), None
        if getattr(setup, "loss_unavailable", lambda m, b: None)(model, batch) is not None:
            return setup.loss_of(model, batch), None  # its output carries no loss: loss_of says which role to give
        out = user_call("make_training", call)
        return loss_tensor(out), output_tensor(out)
    return setup.loss_of(model, batch), None


def _sums(setup: Any, batches: list[Any]) -> bool:
    """Whether the loss dlcheck computes sums over the examples (``dlcheck_loss_fn`` with reduction='sum', on
    (inputs, targets) batches): then the full batch's loss is the sum of the micro-batch losses."""
    return (
        setup.compute_loss is MISSING
        and getattr(setup.loss_fn, "reduction", None) == "sum"
        and not any(isinstance(b, Mapping) for b in batches)
    )


@dataclass
class Reference:
    weighted: dict[str, torch.Tensor]  # the full-batch gradient: sum_i w_i G_i
    summed: dict[str, torch.Tensor]  # sum_i G_i (the k micro-batch gradients, not divided by k)
    sizes: list[int]  # supervised tokens (token batches) or examples per micro-batch
    tokens: bool
    shifted: bool | None
    summing: bool = False  # the loss sums over the examples (reduction='sum')
    parts: list[dict[str, torch.Tensor]] = field(default_factory=list)  # each micro-batch's gradient (on CPU)
    ignored: list[int] = field(default_factory=list)  # the target values below 0 the micro-batches hold (ignored)
    pairs: bool = False  # (inputs, targets) pairs, their targets counted as they are

    def ignore_words(self) -> str:
        """How the supervised tokens were counted, when it is not the usual labels of -100."""
        if not self.tokens or (not self.pairs and self.ignored in ([], [-100])):
            return ""
        what = "targets" if self.pairs else "labels"
        values = ", ".join(map(str, self.ignored))
        return f"; {what} below 0 ({values}) read as ignored (a negative target is never a class id: the ignore_index your loss must be using)"

    def count_words(self) -> str:
        """The expression counting one micro-batch's supervised tokens, as the user's code would write it."""
        if self.pairs:
            return f"(targets != {self.ignored[0]}).sum()" if len(self.ignored) == 1 else "(targets >= 0).sum()"
        ignore = self.ignored[0] if len(self.ignored) == 1 else -100
        return f"(labels[..., 1:] != {ignore}).sum()"

    def ignore_index(self) -> int:
        return self.ignored[0] if len(self.ignored) == 1 else -100


def _reference(
    setup: Any, batches: list[Any], win: Window, names: list[str], keep_parts: bool = False, seed: int = SEED
) -> Reference:
    """Per micro-batch gradients of the user's loss on fresh objects at the window's starting weights, in
    the mode the step used, summed plain and weighted as one full batch (``keep_parts``: each one kept too)."""
    state = setup.state()
    model = state["model"]
    _quiet_dropout(model)
    if win.start_weights is not None:
        model.load_state_dict(win.start_weights)
    if win.modes is not None:
        for name, mod in model.named_modules():
            if name in win.modes:
                mod.training = win.modes[name]
    else:
        model.train()
    by_name = dict(model.named_parameters())
    kept = [n for n in names if n in by_name]
    params = [by_name[n] for n in kept]
    device = device_of(model)
    tokens, ignored = _tokens(batches)
    pairs = tokens and not any(isinstance(b, Mapping) for b in batches)
    shifted: bool | None = None
    # running sums, two copies of the gradients whatever k: sum_i G_i and sum_i size_i G_i
    summed: dict[str, torch.Tensor] = {}
    sized: dict[str, torch.Tensor] = {}
    sizes: list[int] = []
    parts: list[dict[str, torch.Tensor]] = []
    with preserved_rng():
        seed_all(seed)
        for batch in batches:
            batch = to_device(batch, device)
            loss, logits = _loss_and_logits(setup, model, batch)
            labels = _token_labels(batch)
            if tokens and labels is not None and pairs:
                size = int((labels >= 0).sum())  # a pair's targets, as its loss takes them (aligned with the inputs)
            elif tokens and labels is not None:
                found = _shifted(logits, labels, loss)
                shift = found if found is not None else _causal(model)
                shifted = shift if shifted is None else shifted
                size = int((labels[..., 1:] >= 0).sum() if shift else (labels >= 0).sum())
            else:
                size = batch_len(batch) or 1
            sizes.append(size)
            part: dict[str, torch.Tensor] = {}
            with own_backward():  # a Fabric-wrapped model under a mixed precision: as fabric.backward runs it
                grads = torch.autograd.grad(loss, params, allow_unused=True)
            for name, g in zip(kept, grads):
                if g is None:
                    continue
                g = g.detach().float()
                if keep_parts:
                    part[name] = g.cpu()
                summed[name] = summed[name] + g if name in summed else g.clone()
                sized[name] = sized[name] + g * size if name in sized else g * size
            if keep_parts:
                parts.append(part)
            del loss, logits
    total = sum(sizes) or 1
    weighted = {name: v / total for name, v in sized.items()}
    if _sums(setup, batches):
        weighted = summed  # a summed loss: the full batch's loss is the sum over the micro-batches
    return Reference(weighted, summed, sizes, tokens, shifted, _sums(setup, batches), parts, ignored, pairs)


def _rel(g: dict[str, torch.Tensor], h: dict[str, torch.Tensor], scale: float = 1.0) -> float:
    """|g - scale*h| / |scale*h| over the union of the parameters (a missing gradient counts as zero)."""
    diff = norm = 0.0
    for name in set(g) | set(h):
        a = g[name].double() if name in g else None
        b = h[name] * scale if name in h else None
        if a is not None and b is not None:
            diff += float((a - b.to(a.device)).pow(2).sum())
        elif a is not None:
            diff += float(a.pow(2).sum())
        if b is not None:
            norm += float(b.pow(2).sum())
    return math.sqrt(diff) / math.sqrt(norm) if norm > 0 else math.inf


def _norm(g: dict[str, torch.Tensor]) -> float:
    return math.sqrt(sum(float(v.double().pow(2).sum()) for v in g.values()))


def _cosine(g: dict[str, torch.Tensor], h: dict[str, torch.Tensor]) -> float:
    dot = sum(float((g[n].double() * h[n].to(g[n].device)).sum()) for n in set(g) & set(h))
    den = _norm(g) * _norm(h)
    return dot / den if den > 0 else 0.0


def _rescale(win: Window) -> float | None:
    """The factor every gradient was multiplied by between the last backward and the optimizer step
    (gradient clipping, an unscale), when it is one factor for all of them and not 1; else None."""
    factors = []
    for name, g in win.grads.items():
        before = win.after_backward.get(name, 0.0)
        if before > 0:
            factors.append(float(g.double().norm()) / before)
    if not factors:
        return None
    mid = sorted(factors)[len(factors) // 2]
    if abs(mid - 1) < 1e-4 or mid <= 0 or any(abs(f - mid) > 1e-4 * mid for f in factors):
        return None
    return mid


def _judge(grads: dict[str, torch.Tensor], ref: Reference, k: int) -> dict[str, float]:
    return {
        "full batch": _rel(grads, ref.weighted),
        "not divided by k": _rel(grads, ref.summed),
        "per-micro-batch mean": _rel(grads, ref.summed, 1.0 / k),
    }


def _first_window(setup: Any, win: Window, k: int) -> tuple[float, float] | None:
    """When the optimizer stepped at the very first call and the next window held k > 1 micro-batches: the
    relative errors of that first step's gradient to 1/k and to all of the first micro-batch's gradient (the
    full-batch gradient of a window of one), at the initial weights in the first call's modes."""
    if win.first_grads is None or not win.first_grads or k <= 1 or win.start != 1:
        return None
    first = Window(modes=win.first_modes)
    ref = _reference(setup, setup.batches(1)[:1], first, list(win.first_grads))
    if not ref.summed or _norm(ref.summed) == 0:
        return None
    return _rel(win.first_grads, ref.summed, 1.0 / k), _rel(win.first_grads, ref.summed)


def _trainer_accumulation(setup: Any) -> int:
    if setup.kind == "trainer":
        return int(getattr(setup.trainer.args, "gradient_accumulation_steps", 1) or 1)
    t = getattr(setup, "l_trainer", MISSING)
    return int(getattr(t, "accumulate_grad_batches", 1) or 1) if t not in (MISSING, None) else 1


@check(
    "T10",
    domain="train",
    title="gradient accumulation is not equivalent to the full batch",
    roles=(),
    optional_roles=("trainer", "lightning_module", "make_training", "train_step", "dataloader"),
    settings=(
        Setting(
            "micro_steps",
            8,
            "calls of your step watched for the optimizer step that ends the first accumulation window; doubled on "
            "fresh objects (as C1's runs are, up to 64 calls) while no window closes in them: an accumulation of up "
            "to 64 micro-batches (63 when the first optimizer step comes at the first call) is judged, and the "
            "evidence says when the watch was lengthened",
        ),
        Setting(
            "max_rel_error",
            0.05,
            "relative error |g - h| / |h| within which the gradient the optimizer sees matches a candidate h: the "
            "same computation in float32 on CPU differs by ~1e-6, in bf16/TF32 on a GPU by ~1e-2; a loss not "
            "divided by k is off by k - 1, a per-micro-batch mean by the spread of the token counts",
        ),
    ),
)
def check_grad_accumulation(dlcheck):
    """The gradient the optimizer steps on after k accumulated micro-batches equals the gradient of the full batch.

    What it does
        Builds fresh objects with ``dlcheck_make_training`` (dropout off) and calls your
        ``dlcheck_train_step`` (as you wrote it: a plain loop's, or an Accelerate step with
        ``accelerator.accumulate`` + ``accelerator.backward``) on the training batches until the optimizer
        step that ends the first accumulation window; k is the number of calls in it, and the gradients the optimizer sees are kept
        (before it updates). When ``micro_steps`` calls (8) close no window (no optimizer step, or one at the first
        call only: an accumulation longer than that), the watch is run again on fresh objects, doubled as C1's and
        C10's runs are, up to 64 calls, and the evidence says so. On other fresh objects at the same weights, in the mode your step used, it takes
        the gradient of your loss (``dlcheck_compute_loss``, or the model's / ``dlcheck_loss_fn``'s) on each
        of the k micro-batches and compares the optimizer's gradient with three candidates: the full-batch
        gradient (token-level batches: the sum of token losses over the supervised tokens of all k micro-batches;
        other batches: weighted by examples), the k gradients summed (the loss not
        divided by k), and their plain mean (each micro-batch's own token mean divided by k). When the
        optimizer stepped at the very first call and then after k > 1 (a counter tested as ``step % k == 0``
        from 0), that first step is judged too: a gradient 1/k of its one micro-batch's is an off-by-one
        window. One accumulated step and k (k + 1) reference passes.

        Token-level batches are mappings whose ``labels`` are integer per-token targets, and (inputs, targets)
        pairs whose integer targets (two dimensions or more) hold a value below 0 somewhere in the window. A target
        below 0 is never a class id of a cross-entropy, so it is read as ignored (the ``ignore_index`` the loss must
        be using: -100, or -1 as nanoGPT-style SFT loops write it); a token is supervised when its target is 0 or
        more. Mapping labels are counted shifted by one when the loss is a causal LM's own (read off the logits),
        a pair's targets as they are (aligned with the inputs, as the loss takes them). Pairs without a negative
        target are weighted by examples (every position counts, and the rows of a pair are one length).

        When none of them matches, each micro-batch's share of the stepped gradient is measured: the gradient is
        fitted (least squares) on the k micro-batches' gradients of your loss, kept apart, and each fitted weight
        is divided by the micro-batch's weight in the full batch; your loss's gradient is taken at a second seed too,
        to tell whether it draws random numbers of its own (the micro-batches are the same objects in both runs,
        drawn once from your loader: a collator's random masks are the same). While your step runs, the norm of
        every gradient is read at each call's start, just before its first backward adds to ``.grad``, just after
        its last one and at its end: a call without an optimizer step that multiplies every gradient by one factor
        or zeroes them (``multiply_grads(params, 1 / num_losses)`` or a ``zero_grad()`` at every micro-step) is
        seen. Fails when the fit is within the tolerance and the micro-batches before the last count less than
        their share while the step was seen rescaling or zeroing ``.grad`` inside the window (named, with the
        factors and the shares), or count nothing (at most the tolerance of their share; the last at least half of
        its own). 2k more reference passes, only then.

        When the loss exists only inside your step (no ``dlcheck_compute_loss``, a model the batches give no
        labels, batches no ``dlcheck_loss_fn`` takes), the step itself is judged: what each of its backwards adds
        to ``.grad`` over the window is read, with the constant factor at the root of the loss it backwards
        (``loss / k``, accelerator.backward's 1/k; a GradScaler's scale left out); then, on fresh objects in the
        same state, the step is run on the union of the window's k micro-batches as one micro-batch
        (concatenated, or, padded to different lengths, collated again by your loader's collate_fn from their
        examples), k x what it adds being the full-batch gradient at the step's scale (a step that backwards
        only at the window's last call, buffering its micro-batches, gets the union at each call of a window).
        The step's draws through torch.rand / randn / randint / their _like forms / bernoulli / multinomial /
        normal are recorded and replayed on the union row by row (the union's rows drawn as the micro-batches'
        rows were); the union is run at two seeds, and a gradient that differs between them (a draw through
        python's or numpy's random, a generator of its own, torch.randperm) is not judged. Fails when the summed
        contributions are the full-batch gradient but the loss takes no factor (a mean over its micro-batch,
        backwarded whole k times: k x the full-batch gradient), or when they are a reweighting of the
        micro-batches' contributions other than by their examples (each micro-batch's loss normalized by its
        own number of tokens or masked positions: the fitted weights name each micro-batch's share in the full
        batch). Two runs of the step on the union (2k calls for a buffering step).
    Why it is bad
        Not dividing the loss by k makes every update k times the full-batch gradient: with SGD the
        effective learning rate is k times too high, with Adam the scale mostly cancels but gradient
        clipping, eps and weight decay act k times off. Dividing each micro-batch's token-mean loss by k
        gives every micro-batch the same weight whatever its number of supervised tokens: the tokens of short
        micro-batches count more than in the full batch (transformers' gradient-accumulation bug of 2024,
        fixed in 4.46 with ``num_items_in_batch``): accumulated runs train a different, worse objective
        than the full batch they stand for. Rescaling (or zeroing) the accumulated ``.grad`` after each micro-step
        multiplies again everything the earlier micro-batches added: the optimizer steps on little more than the last
        micro-batch's gradient, an effective batch k times smaller than the one configured.
    Example
        def step(state, batch, i):
            loss = state["model"](**batch).loss      # each micro-batch's own token mean
            loss.backward()                          # not divided by accum_steps
            if (i + 1) % accum_steps == 0:
                state["optimizer"].step(); state["optimizer"].zero_grad()
    Use instead
        loss = loss / accum_steps before the backward (equal-size micro-batches), and leave ``.grad`` alone between
        the micro-steps (a rescale by a count goes once, at the optimizer step); for token losses, sum the
        token losses and divide by the supervised tokens of the whole accumulated batch:
        ``loss = token_loss_sum / num_items_in_batch`` with ``num_items_in_batch = sum((mb["labels"][..., 1:]
        != -100).sum() for mb in the k micro-batches)`` (fetch the k micro-batches first, as transformers'
        Trainer does).
    Known problems
        Judged from the step itself: not judged when the union of the micro-batches cannot be formed (fields of
        different widths and no DataLoader collate_fn, loader workers, a field that is not one row per example),
        when a draw of the step is not the micro-batches' draws joined row by row (a draw per window, not per
        example), or when the union's gradient changes with the seed; a loss scaled by k in a way its graph does
        not show at the root (the learning rate divided by k instead) reads as a loss not divided by k; a first
        window of one micro-batch is judged by its backward's factor (1/k as in the full windows: off by one);
        BatchNorm's batch statistics make a micro-batch and the union differ (skipped with the numbers).
        An accumulation longer than 64 micro-batches is not judged (skip, saying how far the watch went; raise
        ``micro_steps``). A pair whose ignored targets are not below 0 (segmentation masks ignored at 255) is
        weighted by examples: a per-image mean over masks of different ignored counts is not judged. Judges the first
        accumulation window only, with dropout off; a step whose loss differs from the
        loss dlcheck computes (an auxiliary term, label smoothing not in ``dlcheck_compute_loss``) matches no
        candidate and no weighting of the micro-batches, and skips with the numbers. A loss that draws random
        numbers (noise, a gumbel quantizer) is compared at the same seed in both runs: a fit within the tolerance
        shows the draws were the same; without one the comparison is not conclusive (skip, saying so, with what
        was seen inside the window). A step that weighs the micro-batches otherwise than the full batch without
        touching ``.grad`` inside the window (a loss normalized by another count, a constant factor) is not judged
        (skip with the shares). The shares are measured only when dlcheck computes the loss apart from your step
        (not for a loss that exists only inside it). A ``dlcheck_loss_fn`` with ``reduction='sum'`` makes the full
        batch's loss the sum of the micro-batch sums. Gradient clipping or an unscale between the last backward and
        the step (one factor for every gradient) is undone before comparing. A transformers
        Trainer (``gradient_accumulation_steps`` > 1) is judged on what its ``training_step`` trusts: where the
        model accepts loss kwargs (a forward taking ``**kwargs``, or ``accepts_loss_kwargs``), a
        ``compute_loss_func`` is set or the trainer's class sets ``loss_is_scaled_for_ga = True`` (a loss it
        normalises itself, as TRL's GRPOTrainer), the Trainer does not divide by the accumulation and hands the loss
        ``num_items_in_batch``: its ``compute_loss`` is called on a training batch with N and 2N items at the
        accumulation k, and with N at an accumulation of 1 (``current_gradient_accumulation_steps`` and
        ``args.gradient_accumulation_steps`` set for the call; no gradient, same RNG states). A loss that halves with
        the items and does not move with the accumulation passes; one that ignores the items and is k times larger
        at 1 divides by the accumulation itself and passes (how it weights the items inside a micro-batch is not
        judged); one that moves with neither fails (a head that takes ``**kwargs`` and keeps its own per-batch mean:
        every step ``gradient_accumulation_steps`` times the full batch's gradient, transformers issue #47688); one
        that moves with both fails (divided twice: 1/k of the full batch's gradient). Not judged there (skip): a
        model without loss kwargs (the Trainer divides each micro-batch's loss by the accumulation, a token mean
        weighted per micro-batch), a ``training_step`` override that does not hand on to ``super().training_step``,
        a loss of 0 on the batch (a generating trainer's groups of equal rewards). Lightning runs are not judged
        (skip): Lightning divides each micro-batch's loss by ``accumulate_grad_batches`` (a token mean over variable
        counts is weighted per micro-batch there).
    Not applicable
        Trainings without gradient accumulation: every call of your step takes an optimizer step, or a call
        takes several (a delayed actor update repeated) on parameters that carried no gradient when it began, the
        plain loop's default step (no ``dlcheck_train_step``), a Trainer with ``gradient_accumulation_steps=1``, a
        Lightning Trainer with ``accumulate_grad_batches=1``.
    """
    setup = get_setup(dlcheck)
    if setup.kind not in ("loop", "accelerate"):
        accum = _trainer_accumulation(setup)
        knob = "gradient_accumulation_steps" if setup.kind == "trainer" else "accumulate_grad_batches"
        if accum <= 1:
            dlcheck.not_applicable(f"{setup.describe()} does not accumulate gradients ({knob}={accum})")
        if setup.kind == "trainer":
            fresh, batches, _ = probe(dlcheck)
            trainer_accumulation.judge(dlcheck, fresh, batches, accum)
            return
        dlcheck.skip(
            f"not judged for Lightning ({knob}={accum}): Lightning divides each micro-batch's loss by "
            "accumulate_grad_batches, which weights a token-mean loss per micro-batch, not per token; T10 runs only "
            "plain loops and Accelerate (dlcheck_make_training + dlcheck_train_step)"
        )
    own = getattr(setup, "train_step", MISSING) is not MISSING
    if setup.kind == "loop" and not own:
        dlcheck.not_applicable(
            "no dlcheck_train_step: the default step takes an optimizer step at every batch (no gradient accumulation)"
        )
    if setup.kind == "accelerate" and not own:
        dlcheck.skip(
            "missing role: define fixture dlcheck_train_step (state, batch) in conftest.py: T10 judges how your own "
            "step weights the micro-batches of an accumulation, and without it only dlcheck's default Accelerate step "
            "(accelerator.backward of each micro-batch's mean loss) would be judged"
        )
    # the Accelerate kind's default step accumulates through accelerator.accumulate / accelerator.backward
    stepname = "dlcheck_train_step" if own else "the default Accelerate step"
    accelerate = setup.kind == "accelerate"
    n = int(dlcheck.setting("micro_steps"))
    tol = float(dlcheck.setting("max_rel_error"))

    win = run_or_skip(dlcheck, lambda: _watch_past_accumulation(setup, n))
    if win.no_optimizer:
        if len(win.calls) >= 2 and win.calls[:2] == [0, 1]:
            dlcheck.not_applicable(
                f"no gradient accumulation: every call of {stepname} changed the weights (calls 1 and 2: the step "
                "updates them itself, no optimizer object in dlcheck_make_training's dict)"
            )
        if win.calls:
            dlcheck.skip(
                f"not judged: {stepname} updates the weights itself (no optimizer object), at call(s) "
                f"{', '.join(str(c + 1) for c in win.calls)} of the first {win.end + 1}: T10 compares the gradient an "
                "optimizer's step applies after an accumulation with the gradient of the micro-batches together, and "
                "does not watch a hand-written update"
            )
        dlcheck.skip(
            f"dlcheck_make_training returned no 'optimizer' and {win.end + 1} calls of {stepname} changed no weight: "
            "no update to watch"
        )
    watched = win.tried
    doubled = (
        f"T10.micro_steps={n} doubled to {watched} calls, no longer run tried past {ACCUMULATION_LIMIT}; "
        if watched > n
        else ""
    )
    if not win.calls:
        dlcheck.skip(f"{watched} calls of {stepname} took no optimizer step ({doubled}raise T10.micro_steps above k)")
    if len(win.calls) >= 2 and win.calls[1] == win.calls[0] + 1:
        dlcheck.not_applicable(
            f"no gradient accumulation: optimizer steps at calls {win.calls[0] + 1} and {win.calls[1] + 1} of "
            f"{stepname} (every micro-step is an optimizer step)"
        )
    if len(win.calls) >= 2 and win.calls[1] == win.calls[0]:
        # several optimizer steps inside one call (a delayed actor update repeated, an inner loop): the window over
        # calls that T10 compares ends inside the call
        c, many = win.calls[0], win.calls.count(win.calls[0])
        before = f", none in the {c} call(s) before it" if c else ""
        if c not in win.carried:
            dlcheck.not_applicable(
                f"no gradient accumulation: the optimizer (state['optimizer']) took {many} optimizer steps within call {c + 1} of "
                f"{stepname}{before}, and its parameters carried no gradient when that call began: each step applies "
                "the gradients of its own call (nothing is accumulated over calls)"
            )
        dlcheck.skip(
            f"the optimizer (state['optimizer']) took {many} optimizer steps within call {c + 1} of {stepname}; its "
            "parameters carried "
            "gradients from earlier calls when it began: an accumulation window over calls that ends inside a call is "
            "not judged"
        )
    if win.calls == [0]:
        dlcheck.skip(
            f"the first call of {stepname} took an optimizer step and the next {watched - 1} none: the accumulation "
            f"window cannot be told ({doubled}raise T10.micro_steps)"
        )
    if not win.grads:
        dlcheck.skip("the optimizer stepped with no gradient on its parameters: nothing to compare")
    k = win.end - win.start + 1
    batches = setup.batches(win.end + 1)[win.start : win.end + 1]
    if win.loss_missing is not None:
        _judge_from_step(dlcheck, setup, win, k, stepname, accelerate, tol)
        return
    ref = run_or_skip(dlcheck, lambda: _reference(setup, batches, win, list(win.grads)))
    if not ref.weighted or _norm(ref.weighted) == 0:
        dlcheck.skip("your loss gives no gradient on the window's micro-batches: nothing to compare")

    errors = _judge(win.grads, ref, k)
    clipped = None
    if min(errors.values()) > tol:
        factor = _rescale(win)
        if factor is not None:
            undone = {n: g / factor for n, g in win.grads.items()}
            again = _judge(undone, ref, k)
            if min(again.values()) <= tol:
                clipped, errors = factor, again
    grads = win.grads if clipped is None else {n: g / clipped for n, g in win.grads.items()}
    ratio = _norm(grads) / _norm(ref.weighted)
    cosine = _cosine(grads, ref.weighted)
    unit = "supervised tokens" if ref.tokens else "examples"
    where = f"calls {win.start + 1}-{win.end + 1}" + (", after the optimizer step at call 1" if win.start else "")
    window = (
        f"the optimizer step at call {win.end + 1} of {stepname} closes an accumulation of k={k} micro-batches "
        f"({where}); {unit} per micro-batch: {', '.join(map(str, ref.sizes))} ({sum(ref.sizes)} in all)"
        f"{ref.ignore_words()}{_lengthened(win)}"
    )
    shown = (
        f"relative error to the full-batch gradient {errors['full batch']:.2g}, to the {k} micro-batch gradients "
        f"summed {errors['not divided by k']:.2g}, to their plain mean {errors['per-micro-batch mean']:.2g}"
    )
    clip_note = (
        [
            f"the gradients were rescaled by {clipped:.3g} between the last backward and the step (clipping): compared "
            "before it"
        ]
        if clipped is not None
        else []
    )
    spread = _rel({name: v / k for name, v in ref.summed.items()}, ref.weighted)  # a per-micro-batch mean's error
    best = min(errors, key=errors.get)
    full = errors["full batch"]

    # a step on the full-batch gradient is right on these micro-batches whatever other formula it also matches (equal
    # token counts make the plain mean of token means the token-weighted mean): fail only a step that differs from it
    if (
        k > 1
        and full > tol
        and not ref.summing
        and best == "not divided by k"
        and errors[best] <= tol
        and errors[best] < full / 2
    ):
        dlcheck.fail(
            [
                window,
                f"the gradient it steps on is {ratio:.3g}x the full-batch gradient (norm {_norm(grads):.4g} vs "
                f"{_norm(ref.weighted):.4g}, cosine {cosine:.4f}): it is the sum of the {k} micro-batch gradients",
                shown,
                *clip_note,
            ],
            cause=f"the loss is not divided by the accumulation factor: each of the {k} backward passes adds a whole "
            f"micro-batch gradient, so the optimizer steps on their sum, {ratio:.3g}x the full-batch gradient (SGD: "
            f"a {ratio:.3g}x learning rate; Adam: the scale mostly cancels, but gradient clipping, eps and weight "
            "decay act on a gradient that size)"
            + (
                "; each micro-batch's token mean also weighs its tokens by its own count, not the whole batch's"
                if ref.tokens and spread > tol
                else ""
            ),
            fix=(
                "loss = token_loss_sum / num_items_in_batch, with num_items_in_batch the supervised tokens "
                f"({ref.count_words()}) of all {k} micro-batches of the optimizer step"
                if ref.tokens and spread > tol
                else "call accelerator.backward(loss) (it divides by gradient_accumulation_steps), not loss.backward()"
                if accelerate
                else f"loss = loss / accum_steps before loss.backward() (accum_steps = {k}, the micro-batches per "
                "optimizer step)"
            ),
        )
    if (
        k > 1
        and full > tol
        and ref.tokens
        and best == "per-micro-batch mean"
        and errors[best] <= tol
        and errors[best] < full / 2
    ):
        low = min(range(k), key=lambda i: ref.sizes[i])
        share = ref.sizes[low] / max(1, sum(ref.sizes))
        dlcheck.fail(
            [
                window,
                f"the gradient it steps on is the plain mean of the {k} micro-batch token-mean gradients; the "
                f"token-weighted full-batch gradient differs from it by {full:.0%} (cosine {cosine:.4f}, norm ratio "
                f"{ratio:.3g})",
                f"the {ref.sizes[low]} tokens of micro-batch {low + 1} weigh 1/{k} of the step instead of "
                f"{ref.sizes[low]}/{sum(ref.sizes)} ({(1 / k) / share if share else math.inf:.3g}x their share)",
                shown,
                *clip_note,
            ],
            cause="each micro-batch's loss is its own token mean divided by k: every micro-batch weighs the same "
            "whatever its number of supervised tokens, so the tokens of short micro-batches count more than in the "
            "full batch's token mean (transformers' gradient-accumulation bug of 2024, fixed in 4.46 with "
            "num_items_in_batch)",
            fix="loss = token_loss_sum / num_items_in_batch, with token_loss_sum = cross_entropy(..., "
            f"ignore_index={ref.ignore_index()}, reduction='sum') and num_items_in_batch the supervised tokens "
            f"({ref.count_words()}) of all {k} micro-batches of the optimizer step, counted before the first backward"
            + (
                " (through accelerator.backward, which divides by gradient_accumulation_steps: pass it "
                "token_loss_sum * accelerator.gradient_accumulation_steps / num_items_in_batch, in your own "
                "dlcheck_train_step)"
                if accelerate
                else ""
            ),
        )
    # examples (not tokens) in micro-batches of different sizes: the plain mean of the per-batch means is the
    # usual `loss / accum_steps` (a short last batch weighs a little more), not judged a bug
    plain_mean = not ref.tokens and not ref.summing and errors["per-micro-batch mean"] <= tol
    if full <= tol or plain_mean:
        how = (
            f"sum of token losses / {sum(ref.sizes)} supervised tokens of the {k} micro-batches"
            + ("" if ref.shifted is None else ", labels shifted by one" if ref.shifted else ", labels as they are")
            if ref.tokens
            else "your loss_fn sums over the examples (reduction='sum'): the sum of the micro-batch losses"
            if ref.summing
            else f"your loss on each micro-batch, weighted by its {unit}"
        )
        matched = (
            f"the gradient the optimizer steps on matches the full-batch gradient ({how}): relative error {full:.2g}"
            if full <= tol
            else f"the gradient the optimizer steps on is the mean of your loss's gradients over the {k} micro-batches "
            f"(relative error {errors['per-micro-batch mean']:.2g}); weighted by their {unit} it would differ by "
            f"{full:.2g} (micro-batches of different sizes; not judged a bug)"
        )
        first = run_or_skip(dlcheck, lambda: _first_window(setup, win, k)) if clipped is None else None
        if first is not None and first[0] <= tol and first[0] < first[1] / 2:
            dlcheck.fail(
                [
                    f"the optimizer stepped at call 1 of {stepname}, after one micro-batch, and then after the "
                    f"{k} micro-batches of calls {win.start + 1}-{win.end + 1}",
                    f"the first step's gradient is 1/{k} of its one micro-batch's gradient (relative error "
                    f"{first[0]:.2g}; to the whole micro-batch gradient {first[1]:.2g}): the loss divided by {k} for "
                    "a window of one",
                    f"the window of calls {win.start + 1}-{win.end + 1} is right: {matched}",
                ],
                cause=f"the first accumulation window is off by one: the optimizer steps when the micro-step counter is "
                f"a multiple of {k} (0, {k}, {2 * k}, ...) while the counter starts at 0, so the first optimizer step "
                f"comes after one micro-batch and moves the weights on 1/{k} of its gradient, and every later window "
                f"ends one micro-batch early (a resume that counts steps as micro_steps // {k} lands off by one too)",
                fix=f"step when (step + 1) % {k} == 0 (or at the epoch's last batch), or use `with "
                "accelerator.accumulate(model):` and step on every call (Accelerate steps when the window is full)",
            )
        if first is not None:
            dlcheck.measured(
                f"the first optimizer step came at call 1 (a window of one micro-batch); its gradient is that "
                f"micro-batch's whole gradient (relative error {first[1]:.2g}), not 1/{k} of it"
            )
        if ref.tokens and k > 1 and spread <= tol:
            dlcheck.not_judged(
                "a per-micro-batch token mean",
                f"the window's micro-batches hold token counts close enough ({', '.join(map(str, ref.sizes))}) that a "
                f"plain mean of their token means gives the full-batch gradient within {tol:g} too (it differs by "
                f"{spread:.2g}), so whether your loss weighs micro-batches of unequal counts by their tokens is not "
                "told apart",
            )
        dlcheck.measured(
            window,
            f"{matched}, norm ratio {ratio:.3f}, cosine {cosine:.4f}",
            f"told apart: a loss divided by k would be off by {1 - 1 / k:.2g}"
            if ref.summing
            else f"told apart: a loss not divided by k would be off by {errors['not divided by k']:.2g}"
            + (f", a per-micro-batch token mean by {spread:.2g}" if ref.tokens and spread > tol else ""),
            *clip_note,
            f"dropout off in both runs ({win.dropouts} dropout layer(s) or attribute(s) of the fresh copies set to 0)"
            if win.dropouts
            else "no dropout in the model",
            k=k,
            rel_error=full,
            norm_ratio=ratio,
            cosine=cosine,
        )
        return
    _unmatched(
        dlcheck, setup, win, batches, ref, k, tol, window, f"{shown}; norm ratio {ratio:.3g}, cosine {cosine:.4f}"
    )


def _lengthened(win: Window) -> str:
    return f"; {win.lengthened}" if win.lengthened else ""


def _fraction(f: float) -> str:
    """0.125 (1/8): a factor with its reciprocal named when that is a whole number."""
    if f > 0 and abs(1 / f - round(1 / f)) < 1e-4 * (1 / f):
        return f"{f:.3g} (1/{round(1 / f)})"
    return f"{f:.3g}"


def _touched_words(touched: list[tuple[int, str, float]]) -> list[str]:
    """What calls did to .grad themselves, calls alike grouped: 'calls 1, 2, 3 each multiplied .grad of every
    parameter by 0.125 (1/8) after the backward'."""
    groups: dict[tuple[str, float], list[int]] = {}
    for call, where, f in touched:
        key = next((g for g in groups if g[0] == where and abs(g[1] - f) <= 1e-4 * max(f, 1e-30)), (where, f))
        groups.setdefault(key, []).append(call)
    out = []
    for (where, f), calls in groups.items():
        who = f"call {calls[0] + 1}" if len(calls) == 1 else "calls " + ", ".join(str(c + 1) for c in calls) + " each"
        did = "zeroed .grad of every parameter" if f == 0 else f"multiplied .grad of every parameter by {_fraction(f)}"
        out.append(f"{who} {did} {where} the backward")
    return out


def _calls(touched: list[tuple[int, str, float]]) -> str:
    calls = sorted({c + 1 for c, _, _ in touched})
    return f"call {calls[0]}" if len(calls) == 1 else "calls " + ", ".join(map(str, calls))


def _unmatched(
    dlcheck: Any,
    setup: Any,
    win: Window,
    batches: list[Any],
    ref: Reference,
    k: int,
    tol: float,
    window: str,
    shown: str,
) -> None:
    """No candidate matched: each micro-batch's share of the stepped gradient (a least-squares fit on the k
    micro-batches' gradients of the loss dlcheck computes), and whether the loss draws random numbers (its gradient at
    a second seed). A fit within the tolerance whose shares show the micro-batches before the last shrunk by what the
    step did to .grad inside the window (seen between the backwards), or counting nothing, fails; anything else is
    not conclusive and skips with the numbers."""
    names = list(win.grads)
    parts = run_or_skip(dlcheck, lambda: _reference(setup, batches, win, names, keep_parts=True))
    other = run_or_skip(dlcheck, lambda: _reference(setup, batches, win, names, seed=SEED + 1))
    seed_gap = _rel(other.weighted, parts.weighted)
    drawn = seed_gap > min(1e-3, tol / 10)
    weights, resid = by_step.fit_weights(parts.parts, {n: g.detach().float().cpu() for n, g in win.grads.items()})
    total = sum(ref.sizes) or 1
    full_w = [1.0 if ref.summing else size / total for size in ref.sizes]
    shares = [None if w is None else w / v for w, v in zip(weights, full_w)]
    inputs = (
        f"the same batches in both runs: the window's {k} micro-batches were drawn once from your loader and handed "
        "to your step and to dlcheck's reference alike (a collator's random masks, crops or negatives are the same in "
        "both)"
    )
    randomness = (
        f"your loss draws random numbers itself: its gradient on the same micro-batches differs by {seed_gap:.2g} "
        "between two seeds (both runs start from the same seed)"
        if drawn
        else f"your loss draws nothing random that matters: its gradient on the same micro-batches is the same at two "
        f"seeds (differs by {seed_gap:.2g})"
    )
    final = _rescale(win)
    touched = [t for t in win.touched if win.start <= t[0] < win.end]
    seen = _touched_words(touched) + (
        [
            f"call {win.end + 1} multiplied .grad of every parameter by {_fraction(final)} after the backward, before the "
            "optimizer step"
        ]
        if final is not None
        else []
    )
    if not weights or resid > tol or any(s is None for s in shares):
        why = (
            "the step and dlcheck's reference may not see the same draws, so the comparison is not conclusive"
            if drawn
            else "your step's loss differs from the loss dlcheck computes (define dlcheck_compute_loss as your step "
            "computes it)"
        )
        dlcheck.skip(
            f"the gradient the optimizer steps on matches none of the candidates within {tol:g}: {window}; {shown}; "
            f"nor any weighting of the {k} micro-batches' gradients of your loss (best fit residual {resid:.2g}); "
            f"{inputs}; {randomness}: {why}" + (f"; seen inside the window: {'; '.join(seen)}" if seen else "")
        )
    listed = ", ".join(f"micro-batch {i + 1} counts {s:.3g}x" for i, s in enumerate(shares))
    share_line = (
        f"each micro-batch's share of the stepped gradient, fitted on the {k} micro-batches' gradients of your loss "
        f"(residual {resid:.2g}): {listed} its share in the full batch (fitted weights "
        f"{', '.join(f'{w:.3g}' for w in weights)}; the full batch's {', '.join(f'{v:.3g}' for v in full_w)})"
    )
    earlier = shares[:-1]
    last = shares[-1]
    nothing_before = bool(earlier) and all(abs(s) <= tol for s in earlier) and last >= 0.5
    zeroed = [t for t in touched if t[2] == 0]
    rescaled = [t for t in touched if t[2] != 0]
    shrunk = all(abs(s) < 1 - tol for s in earlier) if earlier else False
    if not ((touched and shrunk) or nothing_before):
        dlcheck.skip(
            f"not judged: the gradient the optimizer steps on matches none of the candidates within {tol:g}: {window}; "
            f"{shown}; {share_line}: it weighs the micro-batches otherwise than by their {'examples' if not ref.tokens else 'tokens'}"
            f" (a loss normalized by another count, a constant factor in your loss) and nothing seen inside the window "
            f"explains it; {inputs}; {randomness}" + (f"; seen inside the window: {'; '.join(seen)}" if seen else "")
        )
    spread = f"{min(earlier):.3g}x-{max(earlier):.3g}x" if len(earlier) > 1 else f"{earlier[0]:.3g}x"
    before = f"micro-batch{'es' if len(earlier) > 1 else ''} 1{'-' + str(len(earlier)) if len(earlier) > 1 else ''}"
    if zeroed and not rescaled:
        cause = (
            f"the step zeroes the accumulated .grad inside the accumulation window (at {_calls(zeroed)}): "
            f"what the micro-batches before a zeroing added is discarded, so {before} count {spread} their share in the "
            "full batch: the optimizer steps on the micro-batches after the last zeroing alone"
        )
        fix = (
            "zero the gradients only after optimizer.step() (once a window), and scale each micro-batch's loss before "
            f"its backward (loss / {k}); never touch .grad between the micro-steps"
        )
    elif touched:
        cause = (
            f"the step rescales the accumulated .grad inside the accumulation window (at {_calls(touched)}, before the "
            "window's last micro-batch): every rescale multiplies again what the earlier micro-batches "
            f"added, so {before} count {spread} their share in the full batch and micro-batch {k} counts {last:.3g}x"
        )
        fix = (
            "leave .grad alone between the micro-steps: scale each micro-batch's loss before its backward (loss / "
            f"{k}, or a sum divided by a count over all {k} micro-batches), or rescale .grad once, at the optimizer "
            f"step, by a factor counted over the whole window"
        )
    else:
        cause = (
            f"only the last micro-batch counts: {before} contribute nothing to the stepped gradient ({spread} their "
            "share in the full batch), as when .grad is zeroed or rescaled inside the window (dlcheck saw no change of "
            ".grad between the backwards, so not which)"
        )
        fix = (
            "accumulate: zero or rescale .grad only at the optimizer step (once a window), and scale each micro-batch's "
            f"loss before its backward (loss / {k})"
        )
    dlcheck.fail(
        [
            window,
            f"the gradient it steps on is not the full batch's: {shown}",
            share_line,
            *([f"seen inside the window: {'; '.join(seen)}"] if seen else []),
            inputs,
            randomness
            + (
                f"; at the step's seed the fit's residual is {resid:.2g}: the same draws in both runs"
                if drawn and resid < seed_gap / 2
                else ""
            ),
        ],
        cause=cause,
        fix=fix,
    )


def _between(total: dict[str, torch.Tensor], grads: dict[str, torch.Tensor]) -> float | None:
    """The one factor every gradient was multiplied by between the backwards and the optimizer step (clipping, an
    unscale, a division of .grad by k), or None when there is none or no one factor."""
    factors = []
    for name, g in grads.items():
        before = float(total[name].double().norm()) if name in total else 0.0
        if before > 0:
            factors.append(float(g.double().norm()) / before)
    if not factors:
        return None
    mid = sorted(factors)[len(factors) // 2]
    if abs(mid - 1) < 1e-4 or mid <= 0 or any(abs(f - mid) > 1e-4 * mid for f in factors):
        return None
    return mid


def _weights(weights: list[float | None]) -> str:
    return ", ".join("- (it added no gradient)" if w is None else f"{w:.3g}" for w in weights)


def _factor_words(f: float, k: int) -> str:
    if abs(f - 1) < 1e-12:
        return "1 (no factor in the graph of the loss it backwards)"
    if abs(f * k - 1) < 1e-9:
        return f"1/{k} (the loss divided by k={k})"
    if f > 0 and abs(1 / f - round(1 / f)) < 1e-6:
        return f"1/{round(1 / f)}"
    return f"{f:.4g}"


def _judge_from_step(
    dlcheck: Any, setup: Any, win: Window, k: int, stepname: str, accelerate: bool, tol: float
) -> None:
    """T10 for a step whose loss exists only inside it: its backwards' contributions over the window against the
    union of the window's micro-batches run through the same step as one micro-batch."""
    rec = win.record
    assert rec is not None
    calls = range(win.start, win.end + 1)
    mine = rec.in_calls(calls)
    judged_from = f"judged from {stepname} itself: the loss exists only inside it ({win.loss_missing})"
    if not mine:
        dlcheck.skip(f"{judged_from}; no backward ran in the calls {win.start + 1}-{win.end + 1} of the window")
    drawn = setup.batches(win.end + 1)
    before, batches = drawn[: win.start], drawn[win.start :]
    rows = [batch_len(b) or 0 for b in batches]
    joined, how = by_step.union(setup.loader, batches, win.start)
    if joined is None:
        dlcheck.skip(
            f"not judged: {judged_from}, and the union of the window's {k} micro-batches, which would give the "
            f"full-batch gradient through your step, cannot be formed honestly: {how}"
        )
    factors = [None if b.factor is None else b.factor / win.loss_scale for b in mine]
    f0 = factors[0]
    same = f0 is not None and all(f is not None and abs(f - f0) <= 1e-9 * max(1e-30, abs(f0)) for f in factors)
    per_call = [sum(1 for b in mine if b.call == c) for c in calls]
    one_call = same and per_call == [1] * k  # every micro-step backwards once, scaled alike: one call on the union
    seeds = (SEED, SEED + 1)
    runs = [
        run_or_skip(
            dlcheck,
            lambda s=s: by_step.run_union(
                setup, _quiet_dropout, win, before, joined, rec.draws, rows, s, replicate=not one_call
            ),
        )
        for s in seeds
    ]
    for run in runs:
        if run.replay_error is not None:
            dlcheck.skip(
                f"not judged: {judged_from}; the step draws random numbers, and they cannot be replayed on the union "
                f"of the window's micro-batches: {run.replay_error}"
            )
    union_grads = [run.total(calls) for run in runs]
    if not union_grads[0] or by_step.rel(union_grads[1], union_grads[0]) > min(1e-3, tol / 10):
        if not union_grads[0]:
            dlcheck.skip(f"{judged_from}; the step run on the union of the micro-batches added no gradient")
        dlcheck.skip(
            f"not judged: {judged_from}; the step draws random numbers dlcheck cannot replay (not through "
            f"torch.{', torch.'.join(by_step.DRAWS[:3])}, ...: python's or numpy's random, a generator of its own): "
            f"its gradient on the union of the micro-batches differs by "
            f"{by_step.rel(union_grads[1], union_grads[0]):.2g} between two seeds"
        )
    if one_call:
        theirs = runs[0].in_calls(calls)
        if len(theirs) != 1 or theirs[0].factor is None or abs(theirs[0].factor / win.loss_scale - f0) > 1e-9 * abs(f0):
            dlcheck.skip(
                f"not judged: {judged_from}; on the union of the micro-batches the step backwarded otherwise than "
                f"on each micro-batch ({len(theirs)} backward(s), factor {theirs[0].factor if theirs else None})"
            )
    full = {n: v * (k if one_call else 1) for n, v in union_grads[0].items()}
    total = rec.total(calls)
    e_full = by_step.rel(total, full)
    e_sum = by_step.rel(total, full, 1.0 / k)
    rho = _between(total, win.grads)
    divides_grads = rho is not None and abs(rho * k - 1) < 1e-3
    unit = "examples"
    where = f"calls {win.start + 1}-{win.end + 1}" + (", after the optimizer step at call 1" if win.start else "")
    window = (
        f"the optimizer step at call {win.end + 1} of {stepname} closes an accumulation of k={k} micro-batches "
        f"({where}); {unit} per micro-batch: {', '.join(map(str, rows))} ({sum(rows)} in all){_lengthened(win)}"
    )
    union_line = f"the union of the {k} micro-batches ({how}) run through your step as one micro-batch" + (
        f": {k} x its contribution is the full-batch gradient"
        if one_call
        else f" at each of the window's {k} calls: the gradient of that window is the full-batch gradient"
    )
    draws = (
        f"random draws of the step replayed row by row on the union ({runs[0].replayed} draw(s)); its gradient there "
        "is the same at two seeds"
        if rec.draws
        else "the step draws no random numbers through torch's samplers; its gradient on the union is the same at two "
        "seeds"
    )
    dropout = (
        f"dropout off in both runs ({win.dropouts} dropout layer(s) or attribute(s) of the fresh copies set to 0)"
        if win.dropouts
        else "no dropout in the model"
    )
    scaled = (
        f"each backward scales its loss by {_factor_words(f0, k)}"
        if same
        else "the backwards scale their losses unlike each other ("
        + ", ".join(f"{f:.3g}" if f is not None else "?" for f in factors)
        + ")"
    )
    shown = (
        f"relative error of the {k} micro-batches' summed contributions to the full-batch gradient {e_full:.2g}, "
        f"to 1/{k} of it (a loss that adds over examples) {e_sum:.2g}"
    )
    if e_full <= tol and e_full < e_sum:
        undivided = same and abs(f0 - 1) < 1e-12 and not divides_grads
        if undivided:
            unit_grad = {n: v / k for n, v in full.items()}
            ratio = _norm(total) / max(_norm(unit_grad), 1e-300)
            dlcheck.fail(
                [
                    window,
                    judged_from,
                    f"{scaled}; {union_line}",
                    f"the union as one micro-batch contributes 1/{k} of the {k} micro-batches' summed contributions "
                    f"(relative error {e_full:.2g}): your loss is a mean over its micro-batch, so the optimizer steps on "
                    f"{ratio:.3g}x the full-batch gradient (cosine {_cosine(total, unit_grad):.4f})",
                    draws,
                ],
                cause=f"the loss is not divided by the accumulation factor: each of the {k} backward passes adds a "
                "whole micro-batch gradient, so the optimizer steps on their sum, "
                f"{ratio:.3g}x the full-batch gradient (SGD: a {ratio:.3g}x learning rate; Adam: the scale mostly "
                "cancels, but gradient clipping, eps and weight decay act on a gradient that size)",
                fix="call accelerator.backward(loss) (it divides by gradient_accumulation_steps), not loss.backward()"
                if accelerate
                else f"loss = loss / accum_steps before loss.backward() (accum_steps = {k}, the micro-batches per "
                "optimizer step)",
            )
        first = rec.in_calls(range(0, 1)) if win.start == 1 else []
        f_first = first[0].factor / win.loss_scale if len(first) == 1 and first[0].factor is not None else None
        if f_first is not None and same and abs(f0 * k - 1) < 1e-9 and abs(f_first - f0) <= 1e-9 * abs(f0):
            dlcheck.fail(
                [
                    f"the optimizer stepped at call 1 of {stepname}, after one micro-batch, and then after the "
                    f"{k} micro-batches of calls {win.start + 1}-{win.end + 1}",
                    judged_from,
                    f"the backward of call 1 scales its loss by 1/{k}, as each backward of the window of {k} does: "
                    f"the first step moves on 1/{k} of its one micro-batch's gradient",
                    f"the window of calls {win.start + 1}-{win.end + 1} is right: {union_line}; the gradient your "
                    f"step accumulates matches it (relative error {e_full:.2g})",
                ],
                cause=f"the first accumulation window is off by one: the optimizer steps when the micro-step counter "
                f"is a multiple of {k} (0, {k}, {2 * k}, ...) while the counter starts at 0, so the first optimizer "
                f"step comes after one micro-batch and moves the weights on 1/{k} of its gradient, and every later "
                f"window ends one micro-batch early",
                fix=f"step when (step + 1) % {k} == 0 (or at the epoch's last batch), or use `with "
                "accelerator.accumulate(model):` and step on every call (Accelerate steps when the window is full)",
            )
        if f_first is not None and abs(f_first - 1) < 1e-12:
            dlcheck.measured(
                "the first optimizer step came at call 1 (a window of one micro-batch); its backward takes the "
                f"whole loss (no factor), not 1/{k} of it"
            )
        elif win.start:
            dlcheck.not_judged(
                "the first window of one micro-batch",
                f"the optimizer stepped at call 1 too; its backward's factor ({f_first}) is neither 1 nor the window's",
            )
        dlcheck.measured(
            window,
            judged_from,
            f"{scaled}" + (f"; the gradients divided by {k} before the step" if divides_grads else ""),
            union_line,
            f"the gradient your step accumulates matches the full-batch gradient: relative error {e_full:.2g}",
            f"told apart: a loss that adds over its examples would be off by {e_sum:.2g}"
            + (f"; a loss not divided by k by {k - 1}" if same and abs(f0 * k - 1) < 1e-9 else ""),
            draws,
            dropout,
            k=k,
            rel_error=e_full,
        )
        return
    if e_sum <= tol:
        dlcheck.measured(
            window,
            judged_from,
            scaled,
            union_line,
            f"your step's loss adds over the examples: the {k} micro-batches' summed contributions are 1/{k} of "
            f"{k} x the union's (relative error {e_sum:.2g}), the full batch's sum of losses at the step's scale",
            draws,
            dropout,
            k=k,
            rel_error=e_sum,
        )
        return
    parts = [b.part for b in mine]
    if len(parts) == k:
        target = {n: v for n, v in full.items() if any(n in p for p in parts)}
        weights, resid = by_step.fit_weights(parts, {n: v.cpu() for n, v in target.items()})
    else:
        weights, resid = [], math.inf
    if weights and resid <= tol:
        by_examples = [k * n / sum(rows) for n in rows]
        fitted = [(i, w) for i, w in enumerate(weights) if w is not None]
        if all(abs(w - by_examples[i]) <= tol * max(1.0, by_examples[i]) for i, w in fitted):
            dlcheck.measured(
                window,
                judged_from,
                scaled,
                union_line,
                f"the full batch weighs each micro-batch's contribution by its number of examples (fitted weights "
                f"{_weights(weights)}, residual {resid:.2g}): your step's per-micro-batch mean over micro-batches of "
                f"different sizes differs from it by {e_full:.2g} (not judged a bug)",
                draws,
                dropout,
                k=k,
                rel_error=e_full,
            )
            return
        low, low_w = min(fitted, key=lambda iw: iw[1])
        share = low_w / k
        total_w = sum(w for _, w in fitted)
        dlcheck.fail(
            [
                window,
                judged_from,
                f"{scaled}; {union_line}",
                f"the {k} micro-batches' summed contributions differ from the full-batch gradient by {e_full:.0%} "
                f"(cosine {_cosine(total, full):.4f}); the full-batch gradient is the micro-batches' contributions "
                f"weighted {_weights(weights)} (residual {resid:.2g}), your step weighs each "
                f"by 1",
                f"micro-batch {low + 1} weighs 1/{k} of the step; in the full batch it weighs {share:.3g} "
                f"({(1 / k) / share if share > 0 else math.inf:.3g}x its share), though the micro-batches hold "
                f"{'the same number of examples' if len(set(rows)) == 1 else 'examples ' + ', '.join(map(str, rows))}",
                draws,
            ],
            cause="each micro-batch's loss is normalized by its own count (a mean over its own tokens, masked "
            "positions or valid elements), so the micro-batches count alike whatever their counts, and the elements "
            "of a micro-batch with few count more than in the full batch's mean"
            + (
                f"; nor is it divided by the accumulation factor (the weights sum to {total_w:.3g}, not {k})"
                if same and abs(f0 - 1) < 1e-12 and abs(total_w - k) > tol * k
                else ""
            ),
            fix="sum the per-element losses (reduction='sum' over the supervised tokens / masked positions) and "
            f"divide by their count over all {k} micro-batches of the optimizer step, counted before the first "
            "backward (keep the micro-batches, or draw their masks, first)"
            + (
                " (accelerator.backward divides by gradient_accumulation_steps: pass it "
                "loss_sum * accelerator.gradient_accumulation_steps / count)"
                if accelerate
                else ""
            ),
        )
    dlcheck.skip(
        f"{judged_from}; {window}; {union_line}; the gradient it accumulates matches neither it nor a reweighting of "
        f"the micro-batches ({shown}"
        + (f", best reweighting residual {resid:.2g}" if weights else "")
        + "): something besides the loss differs between a micro-batch and the union (batch statistics: BatchNorm)"
    )
