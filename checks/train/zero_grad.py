from __future__ import annotations

from typing import Any

import torch

from ...errors import MISSING
from ...guard import preserved_rng
from ...registry import Setting, check
from ...training import get_setup, run_or_skip
from ...training.runs import Trajectory, unwrap_prepared


def _watch(state: dict[str, Any], limit: int) -> tuple[dict[str, Any], Any]:
    """Hooks on the fresh objects: at every optimizer step, a copy of the gradients of a few parameters;
    at the first backward after a step, whether those gradients were still there (never reset)."""
    model, opt = state["model"], unwrap_prepared(state["optimizer"])
    # only parameters the optimizer updates: one left out of it (T3's finding) is never zeroed by zero_grad either
    in_opt = {id(p) for g in opt.param_groups for p in g["params"]}
    params = [(n, p) for n, p in model.named_parameters() if p.requires_grad and id(p) in in_opt][:limit]
    # crossed: optimizer steps whose watched gradients the next backward has all reached
    seen: dict[str, Any] = {"steps": 0, "stale": [], "reset": 0, "after": {}, "crossed": 0}

    def stepped(optimizer, args, kwargs):
        seen["steps"] += 1
        seen["after"] = {n: p.grad.detach().clone() for n, p in params if p.grad is not None}

    def incoming(name: str, param: torch.Tensor):
        def hook(grad: torch.Tensor) -> None:
            before = seen["after"].pop(name, None)
            if before is None:
                return  # not the first backward after a step, or no gradient at that step
            held = param.grad
            if held is not None and held.shape == before.shape and bool(torch.equal(held, before)) and before.any():
                seen["stale"].append((seen["steps"], name))
            else:
                seen["reset"] += 1
            if not seen["after"]:
                seen["crossed"] += 1

        return hook

    handles = [opt.register_step_post_hook(stepped)]
    handles += [p.register_hook(incoming(n, p)) for n, p in params]
    return seen, lambda: [h.remove() for h in handles]


CROSSINGS = 2  # optimizer steps whose next backward is judged before the watch stops (a reset skipped every
# other step shows at the second)


class _Judged(Exception):
    """Raised between two calls of the user's step once :data:`CROSSINGS` optimizer steps have been judged."""


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
            "3 micro-batches, one under up to 7",
        ),
    ),
)
def check_zero_grad(dlcheck):
    """After an optimizer step, the gradients are reset before the next backward adds to them.

    What it does
        Builds fresh objects with ``dlcheck_make_training`` and calls your ``dlcheck_train_step`` on a few
        batches. At every optimizer step it keeps a copy of the gradients of a few parameters; when the
        next backward arrives at a parameter, it looks at what ``.grad`` holds then: ``None`` or zeros
        (reset: ``zero_grad``), or exactly the previous step's gradient (never reset). It stops calling
        your step once the backward after two optimizer steps has reached the watched parameters (three
        calls without accumulation; at most ``micro_steps``). Deliberate gradient
        accumulation adds to ``.grad`` between optimizer steps and is not judged — only what crosses an
        optimizer step is.
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
        Trainer and Lightning users (the framework zeroes the gradients), and plain loops without their
        own ``dlcheck_train_step`` (the default step zeroes them).
    """
    setup = get_setup(dlcheck)
    if setup.kind not in ("loop", "accelerate"):
        dlcheck.not_applicable(f"{setup.describe()} zeroes the gradients itself (the framework's own step)")
    if getattr(setup, "train_step", MISSING) is MISSING:
        dlcheck.not_applicable("no dlcheck_train_step: the default step zeroes the gradients itself")
    n = int(dlcheck.setting("micro_steps"))

    def watched() -> dict[str, Any]:
        state = setup.state()
        if state.get("optimizer") is None:
            return {"steps": -1}
        seen, undo = _watch(state, 4)

        def after(i: int) -> None:
            seen["calls"] = i + 1
            if seen["crossed"] >= CROSSINGS:
                raise _Judged  # the verdict is in: no further step of the user's model is spent

        try:
            with preserved_rng():
                setup.run(state, setup.batches(n), 0, Trajectory(), after=after)
        except _Judged:
            pass
        finally:
            undo()
        return seen

    seen = run_or_skip(dlcheck, watched)
    if seen["steps"] < 0:
        dlcheck.skip("dlcheck_make_training returned no 'optimizer': no optimizer step to watch")
    calls = seen.get("calls", n)
    if not seen["steps"] or not (seen["stale"] or seen["reset"]):
        dlcheck.skip(
            f"{calls} calls of dlcheck_train_step took {seen['steps']} optimizer step(s) and no backward after one "
            "reached the watched parameters: an optimizer step and the next backward are needed to see what crosses "
            "it (raise T9.micro_steps)"
        )
    stale = seen["stale"]
    if stale:
        names = sorted({name for _, name in stale})
        dlcheck.fail(
            [
                f"{calls} calls of dlcheck_train_step made {seen['steps']} optimizer step(s); after step "
                f"{stale[0][0]}, the next backward found .grad of {', '.join(repr(x) for x in names[:3])} still "
                "holding exactly the gradient that step used",
                f"{len(stale)} such carried-over gradient(s) in the run, {seen['reset']} reset",
            ],
            cause="the gradients are never zeroed between optimizer steps: every backward adds to the sum of all "
            "earlier gradients, so each update applies the whole history again",
            fix="call optimizer.zero_grad(set_to_none=True) right after optimizer.step() (inside the "
            "gradient-accumulation branch when you accumulate), or at the top of your step before the backward",
        )
    dlcheck.measured(
        f"{calls} calls of dlcheck_train_step made {seen['steps']} optimizer step(s); the backward after "
        + (f"each of the first {seen['crossed']}" if seen["crossed"] > 1 else "the first")
        + f" found the watched gradients reset ({seen['reset']} parameter checks)",
        optimizer_steps=seen["steps"],
        reset=seen["reset"],
    )
