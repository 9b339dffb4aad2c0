from __future__ import annotations

from typing import Any

import torch

from ...errors import MISSING
from ...guard import preserved_rng
from ...registry import Setting, check
from ...training import get_setup, run_or_skip
from ...training.runs import ACCUMULATION_LIMIT, NoStepToSaveAfter, Trajectory, past_accumulation, unwrap_prepared


def _named_parameters(state: dict[str, Any]) -> dict[int, str]:
    """Every parameter of the state's modules by id, named as the user knows it: ``model``'s by their own
    names, another module's (a GAN's generator, a second critic) as ``key.name``."""
    names: dict[int, str] = {}
    model = unwrap_prepared(state.get("model"))
    modules = [("model", model)] + [(k, unwrap_prepared(v)) for k, v in state.items() if k != "model"]
    for key, module in modules:
        if isinstance(module, torch.nn.Module):
            for n, p in module.named_parameters():
                names.setdefault(id(p), n if key == "model" else f"{key}.{n}")
    return names


def _optimizers(state: dict[str, Any]) -> list[Any]:
    """Every optimizer of the state, ``state['optimizer']`` first (a GAN's two, an actor's and a critic's)."""
    out: list[Any] = []
    for key in ["optimizer", *(k for k in state if k != "optimizer")]:
        opt = unwrap_prepared(state.get(key))
        if isinstance(opt, torch.optim.Optimizer) and all(opt is not o for o in out):
            out.append(opt)
    return out


def _watch(state: dict[str, Any], limit: int) -> tuple[dict[str, Any], Any]:
    """Hooks on the fresh objects, for every optimizer of the state and a few of the parameters it updates:
    at each optimizer step, a copy of their gradients; at each backward that reaches them, whether ``.grad``
    was reset (``None`` or zeros) or still held that step's gradient; at the optimizer's next step, whether
    the gradient it applies was reset since the last one. A backward of another network's loss that passes
    through them (a GAN's generator loss through the discriminator) may add to a gradient not reset yet: only
    a gradient that reaches the optimizer's next step unreset is stale."""
    names = _named_parameters(state)
    # seen["crossed"]: optimizer steps judged (the gradient they apply reset, or stale)
    seen: dict[str, Any] = {"steps": 0, "stale": [], "reset": 0, "crossed": 0, "optimizers": 0}
    handles = []
    for opt in _optimizers(state):
        # only parameters the optimizer updates: one left out of it (T3's finding) is never zeroed by zero_grad
        params = [p for g in opt.param_groups for p in g["params"] if p.requires_grad][:limit]
        if not params:
            continue
        seen["optimizers"] += 1
        named = [
            (names.get(id(p), f"parameter {i} of optimizer {seen['optimizers']}"), p) for i, p in enumerate(params)
        ]

        before_step, stepped, hooks = _param_watch(named, seen)
        handles += [
            opt.register_step_pre_hook(lambda *_a, f=before_step: f()),
            opt.register_step_post_hook(lambda *_a, f=stepped: f()),
        ]
        handles += hooks
    return seen, lambda: [h.remove() for h in handles]


def _param_watch(
    named: list[tuple[str, torch.Tensor]], seen: dict[str, Any], own: bool = False
) -> tuple[Any, Any, list]:
    """For the watched parameters: what to do right before an update (judge the gradients carried since the last
    one), right after it (keep a copy of the gradients) and the hooks that see each backward arrive. ``own``: the
    updates are the step's own (no optimizer object), seen once the call returned: a gradient already None or zeros
    then was reset inside the step (zeroed after the update)."""
    # per parameter since the last update: its gradient then, "carried" (the first backward after it found exactly
    # that gradient) or "reset" (a backward found None or zeros)
    watch: dict[str, Any] = {"after": {}, "state": {}, "step": 0}

    def before_step() -> None:
        judged = False
        for name, _ in named:
            if watch["state"].get(name) == "carried":
                seen["stale"].append((watch["step"], name))
                judged = True
        if judged:
            seen["crossed"] += 1

    def stepped() -> None:
        seen["steps"] += 1
        watch["step"] = seen["steps"]
        watch["after"] = {n: p.grad.detach().clone() for n, p in named if p.grad is not None and p.grad.any()}
        watch["state"] = {}
        if own and len(watch["after"]) < len(named):
            seen["reset"] += len(named) - len(watch["after"])  # zeroed inside the step, after its update
            if not watch["after"]:
                seen["crossed"] += 1  # every watched gradient of that update reset: judged

    def incoming(name: str, param: torch.Tensor):
        def hook(grad: torch.Tensor) -> None:
            before = watch["after"].get(name)
            if before is None or watch["state"].get(name) == "reset":
                return  # no gradient at the last step, or already reset since
            held = param.grad
            if held is None or not held.any():
                watch["state"][name] = "reset"
                seen["reset"] += 1
                if all(watch["state"].get(n) == "reset" for n in watch["after"]):
                    seen["crossed"] += 1  # every watched gradient of that step reset: judged
            elif name not in watch["state"] and held.shape == before.shape and bool(torch.equal(held, before)):
                watch["state"][name] = "carried"  # stale unless a reset comes before the next step

        return hook

    return before_step, stepped, [p.register_hook(incoming(n, p)) for n, p in named]


def _watch_own(state: dict[str, Any], limit: int) -> tuple[dict[str, Any], Any, Any]:
    """The watch of a step that updates the weights itself (no optimizer object in the state): an update is a call
    after which the model's weights changed (the run's :class:`UpdateWatch` records it), and the gradients it left
    are judged as an optimizer step's are. Returns (seen, the function called after each call, undo)."""
    names = _named_parameters(state)
    params = [p for p in unwrap_prepared(state["model"]).parameters() if p.requires_grad][:limit]
    seen: dict[str, Any] = {"steps": 0, "stale": [], "reset": 0, "crossed": 0, "optimizers": 1 if params else 0}
    seen["own"] = True
    named = [(names.get(id(p), f"parameter {i}"), p) for i, p in enumerate(params)]
    before_step, stepped, hooks = _param_watch(named, seen, own=True)

    def called(rec: Any) -> None:
        if rec is not None and rec.update:
            before_step()
            stepped()

    return seen, called, lambda: [h.remove() for h in hooks]


def _watch_past_accumulation(watched: Any, n: int) -> dict[str, Any]:
    """``watched(n)``, lengthened as C1's and C10's runs are (:func:`past_accumulation`: doubled, up to its bound)
    while nothing was judged and no call followed the first update (no update, or one at the last call: a gradient
    accumulation longer than the run). Each try is a run on fresh objects; the last one is returned whatever it saw."""
    last: dict[str, Any] = {}

    def watch(m: int) -> dict[str, Any]:
        seen = last["seen"] = watched(m)
        unjudged = seen["steps"] >= 0 and not (seen["stale"] or seen["reset"])
        if unjudged and (not seen["steps"] or seen.get("first_step_call", m) >= m):
            raise NoStepToSaveAfter(f"no backward after an update in {m} calls")
        return seen

    try:
        length, seen = past_accumulation(watch, n)
    except NoStepToSaveAfter:
        return last["seen"]
    if length > n:
        seen["lengthened"] = (
            f"T9.micro_steps={n} calls held no backward after an update: the watch was lengthened to {length} calls "
            f"(doubled, as C1's runs are, up to {ACCUMULATION_LIMIT})"
        )
    return seen


CROSSINGS = 2  # optimizer steps judged before the watch stops (a reset skipped every other step shows at the
# second); a stale gradient ends it at once


class _Judged(Exception):
    """Raised between two calls of the user's step once the verdict is in."""


@check(
    "T9",
    domain="train",
    title="gradients are never zeroed between optimizer steps",
    roles=(),
    optional_roles=("trainer", "lightning_module", "make_training", "train_step", "dataloader"),
    settings=(
        Setting(
            "micro_steps",
            8,
            "calls of your step watched at most: the watch stops once the backward after two optimizer steps "
            "has been seen (three calls without gradient accumulation); 8 see two under accumulation of up to "
            "3 micro-batches, one under up to 7; doubled on fresh objects (as C1's runs are, up to 64 calls) while "
            "no call followed the first update and nothing was judged (a longer accumulation)",
        ),
    ),
)
def check_zero_grad(dlcheck):
    """After an optimizer step, the gradients are reset before the next backward adds to them.

    What it does
        Builds fresh objects with ``dlcheck_make_training`` and calls your ``dlcheck_train_step`` on a few
        batches, watching every optimizer of the training dict (a GAN's two, an actor's and a critic's) on a
        few of the parameters it updates. At every optimizer step it keeps a copy of their gradients; when
        a backward arrives at a parameter, it looks at what ``.grad`` holds then: ``None`` or zeros
        (reset: ``zero_grad``), or exactly the previous step's gradient. A gradient that reaches the same
        optimizer's next step without a reset in between is stale; another network's loss that passes
        through the parameters first (dcgan's generator loss through the discriminator, reset by the
        discriminator's zero_grad before its own next step) is not. It stops calling your step at the first
        stale gradient or once two steps of each optimizer have been judged (at most ``micro_steps``). When no
        backward came after an update in them (no optimizer step yet, or one at the last call: a gradient
        accumulation longer than the watch), the watch is run again on fresh objects, doubled as C1's runs are, up
        to 64 calls, and the evidence says so; an accumulation longer than that is not judged (skip).
        Deliberate gradient accumulation adds to ``.grad`` between optimizer steps and is not judged — only
        what crosses an optimizer step is. A step with no optimizer object, which updates the weights itself
        (a hand-written ``p.data.add_(p.grad, alpha=-lr)``), is watched the same way on the model's first
        parameters, an update being a call of the step after which the weights changed: the gradient it left is
        kept, and a gradient already None or zeros when that call returns was reset inside it.
    Why it is bad
        Without ``optimizer.zero_grad()`` every backward adds to the gradients of all earlier batches: each
        update is the running sum of every gradient since the start, the steps grow, the loss goes in
        circles or diverges, and nothing raises.
    Example
        def step(state, batch):
            loss = loss_fn(state["model"](x), y)
            loss.backward()
            state["optimizer"].step()              # no zero_grad anywhere
    Use instead
        optimizer.zero_grad(set_to_none=True) right after optimizer.step() (inside the accumulation
        branch when you accumulate), or at the top of the step before the backward.
    Known problems
        Watches the first parameters the optimizer updates (a handful): a loop that resets only some
        parameters is judged on those; parameters outside the optimizer are T3's. A Trainer, Lightning's automatic optimization and Accelerate's
        prepared optimizer zero gradients themselves.
    Not applicable
        Trainer and Lightning users under automatic optimization (the framework zeroes the gradients; a
        LightningModule with automatic_optimization=False is said not judged), and plain loops without their
        own ``dlcheck_train_step`` (the default step zeroes them).
    """
    setup = get_setup(dlcheck)
    if setup.kind == "lightning" and getattr(setup.module, "automatic_optimization", True) is False:
        dlcheck.skip(
            f"not judged: {setup.name} uses manual optimization (automatic_optimization=False), so its "
            "training_step zeroes the gradients itself; T9 does not watch a Lightning manual step"
        )
    if setup.kind not in ("loop", "accelerate"):
        dlcheck.not_applicable(f"{setup.describe()} zeroes the gradients itself (the framework's own step)")
    if getattr(setup, "train_step", MISSING) is MISSING:
        dlcheck.not_applicable("no dlcheck_train_step: the default step zeroes the gradients itself")
    n = int(dlcheck.setting("micro_steps"))

    def watched(n: int) -> dict[str, Any]:
        state = setup.state()
        traj = Trajectory()
        called = None
        if state.get("optimizer") is not None:
            seen, undo = _watch(state, 4)
        elif not _optimizers(state) and isinstance(state.get("model"), torch.nn.Module):
            # no optimizer object: the step updates the weights itself (a hand-written SGD)
            seen, called, undo = _watch_own(state, 4)
        else:
            others = ", ".join(k for k, v in state.items() if isinstance(unwrap_prepared(v), torch.optim.Optimizer))
            return {
                "steps": -1,
                "why": f"dlcheck_make_training returned no 'optimizer' but other optimizers ({others}): T9 watches "
                "state['optimizer'], or the updates of a step that has no optimizer object"
                if others
                else "dlcheck_make_training returned no 'optimizer' and its 'model' is no torch module: no update "
                "to watch",
            }

        def after(i: int) -> None:
            if called is not None:
                called(traj.steps[-1] if traj.steps and traj.steps[-1].step == i + 1 else None)
            seen["calls"] = i + 1
            if seen["steps"] and "first_step_call" not in seen:
                seen["first_step_call"] = i + 1
            if seen["stale"] or seen["crossed"] >= CROSSINGS * seen["optimizers"]:
                raise _Judged  # the verdict is in: no further step of the user's model is spent

        try:
            with preserved_rng():
                setup.run(state, setup.batches(n), 0, traj, after=after)
        except _Judged:
            pass
        finally:
            undo()
        seen["tried"] = n
        return seen

    seen = run_or_skip(dlcheck, lambda: _watch_past_accumulation(watched, n))
    if seen["steps"] < 0:
        dlcheck.skip(seen["why"])
    own = bool(seen.get("own"))  # no optimizer object: the step's own updates (calls that changed the weights)
    made = (
        f"{seen['steps']} update(s) of the weights by the step itself (no optimizer object: an update is a call "
        "after which the weights changed)"
        if own
        else f"{seen['steps']} optimizer step(s)"
    )
    calls = seen.get("calls", seen["tried"])
    lengthened = seen.get("lengthened", "")
    if not seen["steps"] or not (seen["stale"] or seen["reset"]):
        doubled = (
            f"T9.micro_steps={n} doubled to {seen['tried']} calls, no longer run tried past {ACCUMULATION_LIMIT}; "
            if seen["tried"] > n
            else ""
        )
        dlcheck.skip(
            f"{calls} calls of dlcheck_train_step made {made} and no backward after one reached the watched "
            f"parameters: an update and the next backward are needed to see what crosses it ({doubled}raise "
            "T9.micro_steps)"
        )
    stale = seen["stale"]
    if stale:
        names = sorted({name for _, name in stale})
        step = "update" if own else "step"
        dlcheck.fail(
            [
                f"{calls} calls of dlcheck_train_step made {made}; after {step} {stale[0][0]}, the next backward found "
                f".grad of {', '.join(repr(x) for x in names[:3])} still holding exactly the gradient that {step} "
                + ("left (the one it applied)" if own else "used")
                + ", and nothing reset it before "
                + ("the next update" if own else "that optimizer's next step"),
                f"{len(stale)} such carried-over gradient(s) in the run, {seen['reset']} reset",
                *([lengthened] if lengthened else []),
            ],
            cause=f"the gradients are never zeroed between {'updates' if own else 'optimizer steps'}: every backward "
            "adds to the sum of all earlier gradients, so each update applies the whole history again",
            fix="call model.zero_grad(set_to_none=True) at the top of your step, before the backward (or set each "
            "p.grad = None after your update)"
            if own
            else "call optimizer.zero_grad(set_to_none=True) right after optimizer.step() (inside the "
            "gradient-accumulation branch when you accumulate), or at the top of your step before the backward",
        )
    dlcheck.measured(
        f"{calls} calls of dlcheck_train_step made {made}"
        + (f" of {seen['optimizers']} optimizers" if seen["optimizers"] > 1 else "")
        + "; the backward after "
        + (f"each of the first {seen['crossed']}" if seen["crossed"] > 1 else "the first")
        + f" found the watched gradients reset ({seen['reset']} parameter checks)",
        *([lengthened] if lengthened else []),
        optimizer_steps=seen["steps"],
        reset=seen["reset"],
    )
