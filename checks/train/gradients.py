from __future__ import annotations

import contextlib
import functools
import re
import warnings
from collections.abc import Callable, Iterator
from typing import Any

import torch

from ...errors import MISSING
from ...guard import preserved_rng, seed_everything
from ...registry import Setting, check
from ...session import made_up
from ...training import modes, probe, run_or_skip
from ...training.backward import own_backward
from ...training.loop import trained_modules
from ...training.runs import NotTheBatch, Trajectory, model_call, unwrap_prepared, with_field
from ..shared.targets import optimizer_held, state_weight_copies, weight_copies


@contextlib.contextmanager
def kept_buffers(model: torch.nn.Module) -> Iterator[None]:
    """Put the model's buffers back afterwards: a train-mode forward moves BatchNorm's running statistics (the user's
    own ``dlcheck_model``, or the probe other checks share)."""
    saved = [(b, b.detach().clone()) for b in model.buffers()]
    try:
        yield
    finally:
        with torch.no_grad():
            for b, old in saved:
                b.copy_(old)


def shape(t: torch.Tensor) -> str:
    return "x".join(str(d) for d in t.shape) or "scalar"


#: what torch.utils.checkpoint (use_reentrant=True) warns when no input of a checkpointed segment requires grad
CUT_WARNING = "None of the inputs have requires_grad=True"


def checkpointing(model: torch.nn.Module) -> tuple[list[str], bool | None]:
    """(names of the modules with gradient checkpointing switched on, whether their checkpoint function is the
    reentrant one: True / False, or None when it does not say) — transformers' ``gradient_checkpointing`` flag and
    the ``functools.partial(checkpoint, use_reentrant=...)`` it stores beside it."""
    names, reentrant = [], None
    for name, module in model.named_modules():
        if getattr(module, "gradient_checkpointing", False) is True:
            names.append(name or type(module).__name__)
            func = getattr(module, "_gradient_checkpointing_func", None)
            while isinstance(func, functools.partial):
                if "use_reentrant" in func.keywords:
                    reentrant = bool(func.keywords["use_reentrant"])
                    break
                func = func.func
    return names, reentrant


def backward_grads(
    loss_of: Callable[[], torch.Tensor], params: list[torch.Tensor]
) -> tuple[torch.Tensor, list[torch.Tensor | None]]:
    """The gradients ``loss.backward()`` leaves on ``params``, each parameter's own ``.grad`` put back afterwards.
    Reentrant gradient checkpointing (``use_reentrant=True``) rebuilds a layer's graph only inside ``.backward()``:
    ``torch.autograd.grad`` sees no path to the parameters inside it, even when training does."""
    saved = [p.grad for p in params]
    try:
        for p in params:
            p.grad = None
        loss = loss_of()
        if loss.requires_grad:
            with own_backward():
                loss.backward()
        return loss, [None if p.grad is None else p.grad.detach().clone() for p in params]
    finally:
        for p, g in zip(params, saved):
            p.grad = g


def recorded(fn: Callable[[], Any]) -> tuple[Any, int]:
    """``fn()`` and how many times reentrant checkpointing warned that none of its inputs requires grad."""
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        value = fn()
    return value, sum(CUT_WARNING in str(w.message) for w in caught)


def checkpoint_cause(model: torch.nn.Module, cut_warnings: int) -> tuple[list[str], str, str] | None:
    """(evidence, cause, fix) when reentrant gradient checkpointing cut the graph: torch warned that no input of a
    checkpointed segment requires grad (frozen embeddings, as under LoRA, and no input-require-grads hook)."""
    if not cut_warnings:
        return None
    names, reentrant = checkpointing(model)
    where = (
        f"gradient checkpointing is on in {len(names)} modules (e.g. {', '.join(names[:2])})"
        + (" with use_reentrant=True" if reentrant else "")
        if names
        else "the forward calls torch.utils.checkpoint.checkpoint(..., use_reentrant=True)"
    )
    embeddings = getattr(model, "get_input_embeddings", None)
    emb = None
    try:
        emb = embeddings() if callable(embeddings) else None
    except Exception:  # noqa: BLE001 - a model that does not expose its embeddings
        emb = None
    frozen = isinstance(emb, torch.nn.Module) and not any(p.requires_grad for p in emb.parameters())
    evidence = [
        f"{where}; torch warned {cut_warnings} time(s) on batch 0: 'None of the inputs have requires_grad=True. "
        "Gradients will be None'",
        (
            f"the input embeddings ({type(emb).__name__}) are frozen and no hook makes their output require grad"
            if frozen
            else "no input of the checkpointed segments requires grad"
        ),
    ]
    cause = (
        "reentrant gradient checkpointing runs each checkpointed layer under torch.no_grad() and rebuilds its graph "
        "only when one of the layer's inputs requires grad; the embeddings are frozen (as under LoRA), so none does, "
        "and the trainable adapters inside the layers get no gradient at all"
    )
    fix = (
        "model.enable_input_require_grads() after enabling checkpointing (what PEFT's prepare_model_for_kbit_training "
        "and transformers' gradient_checkpointing_enable do), or gradient_checkpointing_kwargs={'use_reentrant': False} "
        "(torch.utils.checkpoint.checkpoint(..., use_reentrant=False) in your own forward)"
    )
    return evidence, cause, fix


LAYER = re.compile(r"\.layers\.(\d+)\.")


def unused_by_design(model: torch.nn.Module):
    """A predicate over parameter names: the vision tower's layers above the feature layer of a LLaVA-style
    model (``config.vision_feature_layer``: the image features are the hidden states of an earlier
    layer) and its final norm/pooling head, which run but feed nothing the loss sees. The tower is the
    one the vlm checks find (vlm.find_towers)."""
    from ..shared import multimodal as vlm

    config = getattr(model, "config", None)
    layer = getattr(config, "vision_feature_layer", None)
    n_layers = getattr(getattr(config, "vision_config", None), "num_hidden_layers", None)
    wanted = (
        [layer]
        if isinstance(layer, int)
        else [x for x in layer if isinstance(x, int)]
        if isinstance(layer, (list, tuple))
        else []
    )
    found = vlm.find_towers(model) if wanted and isinstance(n_layers, int) else None
    if found is None:
        return lambda name: False
    used = max(i % (n_layers + 1) for i in wanted)  # hidden_states[k] is the output of layer k - 1
    towers = [f"{path}." for path in found.paths["vision"]]

    def exempt(name: str) -> bool:
        tower = next((t for t in towers if name.startswith(t)), None)
        if tower is None:
            return False
        rest = name[len(tower) :]
        m = LAYER.search("." + rest)
        if m is not None:
            return int(m.group(1)) >= used
        return "post_layernorm" in rest or rest.startswith("head.") or ".head." in rest

    return exempt


@check(
    "T3",
    domain="train",
    title="trainable parameters get no gradient, or the optimizer never updates them",
    roles=(),
    optional_roles=("trainer", "lightning_module", "make_training", "model", "dataloader"),
    settings=(
        Setting(
            "ignore",
            r"(^|\.)experts?\.",
            "regular expression of parameter names exempt from the 'no gradient' "
            "rule: mixture-of-experts experts that no token was routed to in the batch legitimately get none",
        ),
    ),
)
def check_gradients(dlcheck):
    """Every trainable parameter gets a gradient from the loss, and the optimizer holds every one of them.

    What it does
        Computes the loss of the first sampled batch as your training does (train mode) on fresh objects
        (or on ``dlcheck_model`` with ``torch.autograd.grad``, which fills no ``.grad``), and asks autograd
        for the gradient of every parameter with ``requires_grad=True``. A parameter with no gradient at
        all is off the loss's autograd path: its module never ran, or its output was detached. Then,
        when a training set-up gives the optimizer, every parameter that gets a gradient must be in one of
        its param groups, with a non-zero learning rate; tensors the optimizer holds that are no longer
        parameters of the model are reported. A parameter autograd finds no path to is measured again with
        ``loss.backward()`` (each ``.grad`` put back): reentrant gradient checkpointing rebuilds a layer's graph
        only there. When torch warns that no input of a checkpointed segment requires grad, the failure names
        gradient checkpointing as the cause. A plain or Accelerate loop whose loss lives inside its own
        ``dlcheck_train_step`` (no ``dlcheck_compute_loss``, and a model that does not take the batch) is judged
        through that step: fresh objects from ``dlcheck_make_training``, the step called on the training batches
        (up to 8 calls, until every trainable parameter of every module its optimizers train has had a
        gradient: a GAN's generator and discriminator alike), then which of them the dict's optimizers hold.
    Why it is bad
        Those parameters are frozen by accident: the layer trains for nothing, silently, and the model
        behaves like a smaller one. Classic causes: ``.detach()`` / ``torch.no_grad()`` in a forward, a
        head defined but not called, or an optimizer built before a parameter was replaced — a new
        classification head swapped in after ``AdamW(model.parameters())`` leaves the optimizer updating
        the old head, which is no longer in the model.
        Under LoRA with reentrant gradient checkpointing the embeddings are frozen, so no input of a checkpointed
        layer requires grad: the layer runs under no_grad and every adapter inside it gets no gradient.
    Example
        optimizer = AdamW(model.parameters()); model.head = nn.Linear(512, num_classes)
        def forward(self, x): return self.head(self.body(x).detach())
        model = get_peft_model(base, lora)   # embeddings frozen; then, in a forward of your own:
        h = torch.utils.checkpoint.checkpoint(block, h, use_reentrant=True)
        (transformers 4's gradient_checkpointing_enable() on a PeftModel installed no input hook either)
    Use instead
        build the optimizer after every change to the model's parameters; remove the detach (or set
        ``requires_grad_(False)`` on what you mean to freeze, and leave it out of the optimizer).
        With checkpointing and frozen embeddings: ``model.enable_input_require_grads()``, or
        ``gradient_checkpointing_kwargs={"use_reentrant": False}``.
    Known problems
        Exact-zero gradients at step 0 are looked at again: a LoRA A factor whose B is all zeros is explained
        from the weights; any other is judged a step away (the weights that get a gradient moved a little along
        it, then put back): a zero-initialised neighbour (ControlNet's zero convolutions) passes gradient then,
        a path multiplied by 0 still does not and fails; every parameter at zero at once fails (a loss no weight
        moves). A weight whose module is fed an exactly zero input by installed library code, with no module of
        your own on the way (DETR's decoder starts its object queries at zero: its first value projection never
        trains), is allowed and said; a zero fed by your own forward fails. A trainer that generates its completions inside the step (TRL's GRPOTrainer, RLOOTrainer) is
        judged on a batch of its own train dataloader (a generation batch, split as its first step splits it),
        with completions generated once from seeded RNGs; when every advantage of those completions is 0 (equal
        rewards within each group) its policy loss is constant by construction and the check skips, saying so.
        A top-level submodule with the very parameters of another one that trains, getting no gradient and in no
        optimizer, is a target network (DQN, TD3: updated by copying weights) and not judged; in an optimizer,
        it is a tower cut from the graph and fails. Parameters matching ``T3.ignore`` (MoE experts) are exempt.
        A forward that skips modules at random in train mode (LayerDrop, as transformers' Wav2Vec2 and HuBERT do
        with ``config.layerdrop``; stochastic depth that drops whole blocks) gives a skipped module no gradient on
        that draw only: when trainable parameters get none, the same batch's loss is drawn again with other RNG
        states (up to 5 more draws, RNGs and buffers put back), and only the parameters no draw reaches fail; the
        others are said. Likewise a block that stochastic depth drops for the whole batch (torchvision's
        ``StochasticDepth(mode="batch")``) gets exact zeros: a zero still there a step away is drawn again the same
        way before it fails. Through your step, each call is a draw of its own.
        Frozen parameters (``requires_grad=False``) are taken as intended. A LLaVA-style model's vision
        layers above ``config.vision_feature_layer`` (and the tower's final norm / pooling head) run but
        feed nothing by design; they are exempt (freeze them to save their optimizer state, and set
        DDP's ``find_unused_parameters=True`` if they stay trainable).
        A model set up by Lightning Fabric under a precision plugin that wants ``fabric.backward(loss)``
        (``bf16-mixed``, ``16-mixed``) is backpropagated as ``fabric.backward`` runs it on one device (its
        gradients unscaled); a strategy with a backward of its own (DeepSpeed) is not run through.
    Not applicable
        A model with no trainable parameter (everything frozen): nothing is trained. A model given as
        dlcheck_model whose forward needs fields the batches lack (a denoiser that your loss calls): it is
        not called on the batch (give dlcheck_make_training with dlcheck_train_step or dlcheck_compute_loss and
        T3 runs your loss).
    """
    fresh, batches, setup = probe(dlcheck)
    model = fresh.model
    batch = batches[0]
    why = _loss_unavailable(setup, model, batch)
    if why is not None:
        _through_the_step(dlcheck, setup, why)
        return
    trainable = [(n, p) for n, p in model.named_parameters() if p.requires_grad]
    if not trainable:
        dlcheck.not_applicable(f"{type(model).__name__} has no parameter with requires_grad=True: nothing is trained")
    ran: dict[str, int] = {}  # module name -> when its forward finished (first time)
    # keyed by identity: a module's hash may change with its state (a torchmetrics Metric hashes its values)
    names = {id(m): n for n, m in model.named_modules()}
    handles = [
        m.register_forward_hook(
            lambda mod, i, o: None if names[id(mod)] in ran else ran.update({names[id(mod)]: len(ran)})
        )
        for m in model.modules()
    ]
    params = [p for _, p in trainable]
    try:
        with modes(model, train=True), kept_buffers(model):
            loss, cut = recorded(lambda: run_or_skip(dlcheck, lambda: fresh.loss(batch)))
            if not loss.requires_grad:
                grads = [None] * len(trainable)
            else:
                with own_backward():
                    grads = torch.autograd.grad(loss, params, allow_unused=True)
            if loss.requires_grad and any(g is None for g in grads):
                # reentrant checkpointing rebuilds a layer's graph only in .backward(): ask it what training gets
                (loss, grads), cut2 = recorded(
                    lambda: run_or_skip(dlcheck, lambda: backward_grads(lambda: fresh.loss(batch), params))
                )
                cut = max(cut, cut2)
    finally:
        for h in handles:
            h.remove()
    ignore = re.compile(dlcheck.setting("ignore")) if dlcheck.setting("ignore") else None
    gradless = [(n, p) for (n, p), g in zip(trainable, grads) if g is None]
    orphans = [(n, p) for n, p in gradless if not (ignore and ignore.search(n))]
    by_design = unused_by_design(model)
    orphans = [(n, p) for n, p in orphans if not by_design(n)]
    copies = _weight_copies(model, trainable, grads, orphans, lambda: _held_ids(setup, fresh)) if orphans else {}
    copied = sum(1 for n, _ in orphans if n.split(".", 1)[0] in copies)
    orphans = [(n, p) for n, p in orphans if n.split(".", 1)[0] not in copies]
    # a forward that skips modules at random (LayerDrop, stochastic depth) gives a skipped module's parameters no
    # gradient on that draw only: other draws (other RNG states) tell it from a module cut on every draw
    redrawn, draws = (
        _other_draws(dlcheck, fresh, batch, trainable, [n for n, _ in orphans], ran, names)
        if orphans and loss.requires_grad
        else ({}, 0)
    )
    if redrawn:
        grads = [redrawn.get(n, g) for (n, _), g in zip(trainable, grads)]
        orphans = [(n, p) for n, p in orphans if n not in redrawn]
    exempt = len(gradless) - len(orphans) - len(redrawn)
    redrawn_note = (
        f"; {len(redrawn)} of them ({', '.join(list(redrawn)[:2])}{' …' if len(redrawn) > 2 else ''}) got none on "
        f"batch 0's first draw and one on another draw of the same batch (other RNG states, {draws} more draw(s)): "
        "the forward skips modules at random (LayerDrop, stochastic depth), so they train on the draws that keep them"
        if redrawn
        else ""
    )
    copy_note = "".join(
        f"; {copy}.* gets no gradient and is in no optimizer: a copy of {original} (same parameters, which train), "
        "updated from its weights, copied or averaged (a target network), not judged"
        for copy, original in copies.items()
    )
    frozen = sum(1 for p in model.parameters() if not p.requires_grad)
    frozen_note = f"; {frozen} parameter tensors are frozen (requires_grad=False) and not judged" if frozen else ""

    if orphans:

        def owner(name: str) -> str:
            return name.rsplit(".", 1)[0] if "." in name else ""

        never_ran = [n for n, _ in orphans if owner(n) not in ran]
        shown = ", ".join(f"{n} [{shape(p)}]" for n, p in orphans[:6]) + (" …" if len(orphans) > 6 else "")
        evidence = [
            f"{len(orphans)} of {len(trainable)} trainable parameter tensors get no gradient from the loss on "
            f"batch 0 (loss {float(loss.detach()):.4g}){frozen_note}: {shown}"
        ]
        if draws:
            evidence.append(
                f"{draws} more draw(s) of the same batch's loss with other RNG states (a forward that skips modules "
                "at random gives a skipped one a gradient on another draw) reached none of them"
                + (
                    f"; {len(redrawn)} other parameter tensors that got none on the first draw did get one on "
                    f"another (e.g. {next(iter(redrawn))}): a stochastic forward (LayerDrop, stochastic depth), "
                    "not judged as cut"
                    if redrawn
                    else ""
                )
            )
        diagnosis = checkpoint_cause(model, cut)
        if diagnosis is not None:
            more, cause, fix = diagnosis
            evidence.extend(more)
        elif not loss.requires_grad:
            cause = "the loss itself carries no gradient: it was computed under torch.no_grad() or from detached tensors (.detach(), .item(), numpy)"
            fix = "compute the loss from the model's output with autograd enabled"
        elif never_ran and len(never_ran) == len(orphans):
            mods = sorted({owner(n) for n in never_ran})
            evidence.append(f"module(s) never called by the forward: {', '.join(mods[:6])}")
            cause = "these modules are defined (and trainable) but the forward never calls them: they train for nothing"
            fix = "call them in forward(), or delete them / set requires_grad_(False) and leave them out of the optimizer if they are unused on purpose"
        else:
            mods = sorted({owner(n) for n, _ in orphans if owner(n) in ran})
            evidence.append(
                f"module(s) that run but pass no gradient back: {', '.join(mods[:6])}"
                + (f" … ({len(mods)})" if len(mods) > 6 else "")
            )
            last = max(mods, key=lambda m: ran[m])
            evidence.append(
                f"the last of them to run is {last}: the graph is cut at its output (or later, before "
                "the next module that gets a gradient)"
            )
            cause = (
                "their output is cut from the autograd graph (a .detach(), a torch.no_grad() block, or a "
                "round-trip through .item()/numpy in the forward): the layers are frozen by accident"
            )
            fix = "remove the detach / no_grad around those modules; to freeze them on purpose, set requires_grad_(False) and leave them out of the optimizer"
        step = getattr(setup, "train_step", MISSING) if setup is not None else MISSING
        if step is not MISSING and step is not None and not diagnosis and loss.requires_grad:
            # the loop's own step is given beside the loss: a module that loss never reaches may be trained by another
            # loss of the step (PPG's auxiliary phase trains aux_critic: blind set 11's false alarm); the step decides
            _through_the_step(
                dlcheck,
                setup,
                f"dlcheck_compute_loss's loss gives {len(orphans)} of {len(trainable)} parameter tensors no gradient "
                f"({', '.join(n for n, _ in orphans[:3])}), which your step may train with a loss of its own",
            )
            return
        dlcheck.fail(evidence, cause, fix)

    zero = [n for (n, _), g in zip(trainable, grads) if g is not None and not bool(g.any())]
    received = sum(1 for g in grads if g is not None)
    if zero and len(zero) == received:
        # a zero-initialised layer gives its neighbours exact zeros, never itself: every gradient exactly zero
        # means the loss does not move with any weight, unless the loss is constant by construction on this batch
        # (a policy loss whose every advantage is 0): that says nothing of the weights
        constant = fresh.why_constant(batch) if fresh.why_constant is not None else None
        if constant is not None:
            dlcheck.skip(f"cannot judge the gradients on batch 0: {constant}")
        out = _output_width(fresh, batch)
        dlcheck.fail(
            [
                f"every one of the {received} trainable parameter tensors that the loss reaches gets an exactly "
                f"zero gradient on batch 0 (loss {float(loss.detach()):.4g}): no weight moves the loss"
                + (f"; the model's output has {out} column per example" if out == 1 else "")
            ],
            "the loss is constant in the weights"
            + (
                ": cross-entropy over a single output column is always 0 (the log-softmax of one logit is 0), so "
                "nothing ever trains"
                if out == 1
                else " (a loss over one class, a target that makes every term 0, or every path to it saturated): "
                "training steps change nothing"
            ),
            "match the loss to the head: one logit per example takes BCEWithLogitsLoss (binary) or MSELoss "
            "(regression); cross_entropy takes one logit per class",
        )
    # a LoRA A factor whose B is all zeros (PEFT's initialisation) gets exact zeros until B's first update: seen on the
    # weights, no backward needed; any other zero gradient is looked at again a step away
    by_name = dict(trainable)
    lora = [
        n
        for n in zero
        for partner in (n.replace("lora_A", "lora_B").replace("lora_embedding_B", "lora_embedding_A"),)
        if "lora_" in n and partner != n and partner in by_name and not bool(by_name[partner].detach().any())
    ]
    unexplained = [n for n in zero if n not in lora]
    still = _zero_after_a_nudge(fresh, batch, trainable, grads, unexplained, dlcheck) if unexplained else []
    built_in = _zero_input_by_construction(fresh, batch, still, dlcheck) if still else {}
    still = [n for n in still if n not in built_in]
    # a block that stochastic depth drops for the whole batch gets exact zeros on that draw only
    masked, more = _other_draws(dlcheck, fresh, batch, trainable, still, ran, names, nonzero=True) if still else ({}, 0)
    still = [n for n in still if n not in masked]
    if still:
        shown = ", ".join(still[:6]) + (" …" if len(still) > 6 else "")
        dlcheck.fail(
            [
                f"{len(zero)} of the {received} trainable parameter tensors that the loss reaches get an exactly zero "
                f"gradient on batch 0 (loss {float(loss.detach()):.4g}), and {len(still)} of them still do after every "
                f"weight that gets a gradient moved a step along it, and on {more} more draw(s) of the same batch with "
                f"other RNG states: {shown}"
                + (
                    f" ({len(masked)} others got a non-zero one on another draw, e.g. {next(iter(masked))}: masked out "
                    "at random, not judged)"
                    if masked
                    else ""
                )
            ],
            "the loss reaches these parameters but never moves with them: their gradient is zero whatever the other "
            "weights (a zero-initialised neighbour would pass gradient after one step): they never train (a factor "
            "multiplied by a constant 0, a mask that zeroes their path, a saturated gate)",
            "find where their output is multiplied by zero or masked out in the forward; to freeze them on purpose, set "
            "requires_grad_(False) and leave them out of the optimizer",
        )
    built_note = ""
    if built_in:
        first = next(iter(built_in))
        built_note = (
            f"; {len(built_in)} get an exactly zero gradient a step away too, by the model's own construction: their "
            f"module's input is exactly zero on every example, with the batch's float inputs as they are and made "
            f"up at random alike, fed by installed library code ({first}: {built_in[first]}; as in DETR, whose "
            "decoder starts its object queries at zero): not your training's doing, and allowed"
        )
        zero = [n for n in zero if n not in built_in]
    masked_note = ""
    if masked:
        masked_note = (
            f"; {len(masked)} of them get an exactly zero gradient on batch 0's first draw and a step away, and a non-zero one "
            f"on another draw of the same batch (other RNG states; e.g. {next(iter(masked))}): the forward masks them "
            "out at random (stochastic depth dropping a block for the whole batch), so they train on the other draws"
        )
        zero = [n for n in zero if n not in masked]
    zero_note = (
        f"; {len(zero)} of them get an exactly zero gradient"
        + (
            f" ({len(lora)} LoRA factors, e.g. {lora[0]}: the other factor of each adapter (lora_B; lora_embedding_A "
            "for embeddings) is zero at initialisation, so this one's gradient is 0 until the first step — expected)"
            if lora and len(lora) == len(zero)
            else " at step 0, and a gradient once the weights that get one moved a step: a zero-initialised neighbour "
            "(a zero convolution, LoRA's B) passes none before its first update; allowed"
        )
        if zero
        else ""
    )
    graded_line = (
        f"all {len(trainable) - exempt} trainable parameter tensors get a gradient from the loss on batch 0 (loss "
        f"{float(loss.detach()):.4g})"
        + redrawn_note
        + zero_note
        + masked_note
        + built_note
        + (
            f"; {exempt - copied} exempt ({dlcheck.setting('ignore')!r} or unused by design) get none"
            if exempt - copied
            else ""
        )
        + copy_note
        + frozen_note
    )
    numbers = dict(
        trainable=len(trainable),
        with_gradient=len(trainable) - len(gradless) + len(redrawn),
        on_another_draw=len(redrawn),
        zero_gradient=len(zero),
        exempt=exempt,
        frozen=frozen,
    )
    if setup is None:
        dlcheck.not_judged("the optimizer", "no training set-up gives an optimizer")
        dlcheck.measured(
            graded_line, "no training set-up gives an optimizer: whether it holds them is not judged", **numbers
        )
        return
    opt, _ = run_or_skip(dlcheck, fresh.make_optimizer)
    if opt is None:
        dlcheck.not_judged("the optimizer", f"{setup.describe()} gives no optimizer")
        dlcheck.measured(
            graded_line, f"{setup.describe()} gives no optimizer: whether it holds them is not judged", **numbers
        )
        return
    held = {}
    for gi, group in enumerate(opt.param_groups):
        for p in group["params"]:
            held[id(p)] = (gi, group.get("lr", 0.0), p)
    # a loop's training dict may hold an optimizer per network (a GAN's optimizerD and optimizerG): the parameters
    # any of them steps are held (those of the probe's own objects, built by the factory around these modules)
    others = _other_optimizers(fresh.owner, opt)
    for other in others:
        for group in other.param_groups:
            for p in group["params"]:
                if id(p) not in held:
                    held[id(p)] = (-1, group.get("lr", group.get("initial_lr", 0.0)), p)
    graded = [(n, p) for (n, p), g in zip(trainable, grads) if g is not None]
    outside = [(n, p) for n, p in graded if id(p) not in held]
    zero_lr = [
        (n, p, held[id(p)][0])
        for n, p in graded
        if id(p) in held
        and held[id(p)][0] >= 0
        and held[id(p)][1] == 0
        and opt.param_groups[held[id(p)][0]].get("initial_lr", 0) == 0
    ]
    model_ids = {id(p) for p in model.parameters()}
    stale = [p for _, _, p in held.values() if id(p) not in model_ids]
    if not outside and not zero_lr:
        lrs = sorted({float(g.get("initial_lr", g.get("lr", 0.0))) for g in opt.param_groups})
        holders = (
            f"the training dict's {1 + len(others)} optimizers hold" if others else f"the {type(opt).__name__} holds"
        )
        dlcheck.measured(
            graded_line,
            f"{holders} all {len(graded)} of them in {len(opt.param_groups)} param group(s) with "
            f"lr {', '.join(f'{v:.3g}' for v in lrs[:4])}" + (" (and those of the others)" if others else ""),
            optimizer_groups=len(opt.param_groups),
            **numbers,
        )
        return
    evidence = []
    if outside:
        shown = ", ".join(f"{n} [{shape(p)}]" for n, p in outside[:6]) + (" …" if len(outside) > 6 else "")
        evidence.append(
            f"{len(outside)} of {len(graded)} parameter tensors that get a gradient are in no param group of "
            f"the {type(opt).__name__}: {shown}"
        )
    if zero_lr:
        shown = ", ".join(f"{n} (group {gi})" for n, _, gi in zero_lr[:6])
        evidence.append(f"{len(zero_lr)} parameter tensors sit in param groups with lr 0: {shown}")
    if stale:
        evidence.append(
            f"the optimizer holds {len(stale)} tensor(s) that are no longer parameters of the model: "
            + ", ".join(f"[{shape(p)}]" for p in stale[:4])
        )
        cause = (
            "the optimizer was built before these parameters were replaced (a new head, a re-assigned Parameter or "
            "submodule): it keeps updating the old tensors, and the model's own ones stay frozen"
        )
        fix = "build the optimizer after every change to the model's parameters (head replacement, re-assigned modules or Parameters)"
    elif outside:
        cause = "the optimizer was built over a subset of the trainable parameters: the others get gradients but are never updated"
        fix = "pass every trainable parameter to the optimizer (model.parameters(), or every param group you intend), or freeze the rest with requires_grad_(False)"
    else:
        cause = "a param group with learning rate 0 freezes its parameters while they still get gradients"
        fix = "give the group a non-zero lr, or freeze its parameters with requires_grad_(False)"
    dlcheck.fail(evidence, cause, fix)


#: further draws of batch 0's loss (other RNG states) T3 makes at most when trainable parameters got no gradient:
#: a module LayerDrop skips with probability 0.1 is skipped on all 1 + 5 draws once in a million (at 0.5, once in 64)
OTHER_DRAWS = 5
#: the seed of the first further draw (the next ones count up from it)
DRAW_SEED = 7919


def _other_draws(
    dlcheck: Any,
    fresh: Any,
    batch: Any,
    trainable: list[tuple[str, torch.Tensor]],
    missing: list[str],
    ran: dict[str, int],
    names: dict[int, str],
    nonzero: bool = False,
) -> tuple[dict[str, torch.Tensor], int]:
    """({name: gradient} for the names among ``missing`` (no gradient on batch 0's first draw) that get one on
    another draw of the same batch's loss, the number of further draws made): the global RNGs seeded anew for each
    draw (up to :data:`OTHER_DRAWS`, until every one is reached), so that a forward which skips modules at random
    (LayerDrop, stochastic depth) runs them on some draw. Train mode, ``loss.backward()`` as training does (each
    ``.grad`` put back); the RNG states and the model's buffers (BatchNorm's running statistics) are put back too.
    The modules that run are added to ``ran``. With ``nonzero``, a gradient counts only when it is not exactly zero
    (a block that stochastic depth masks out on the whole batch gets zeros, not None)."""
    model = fresh.model
    params = [p for _, p in trainable]
    index = {n: i for i, (n, _) in enumerate(trainable)}
    found: dict[str, torch.Tensor] = {}
    handles = [
        m.register_forward_hook(
            lambda mod, i, o: None if names.get(id(mod)) in ran else ran.update({names[id(mod)]: len(ran)})
        )
        for m in model.modules()
        if id(m) in names
    ]
    draws = 0
    try:
        with preserved_rng(), modes(model, train=True), kept_buffers(model):
            for k in range(OTHER_DRAWS):
                seed_everything(DRAW_SEED + k)
                draws += 1
                (_, grads), _ = recorded(
                    lambda: run_or_skip(dlcheck, lambda: backward_grads(lambda: fresh.loss(batch), params))
                )
                for n in missing:
                    g = grads[index[n]]
                    if n not in found and g is not None and (not nonzero or bool(g.any())):
                        found[n] = g
                if len(found) == len(missing):
                    break
    finally:
        for h in handles:
            h.remove()
    return found, draws


def _zero_after_a_nudge(
    fresh: Any, batch: Any, trainable: list, grads: list, zero: list[str], dlcheck: Any
) -> list[str]:
    """The names among ``zero`` (tensors with an exactly zero gradient on batch 0) whose gradient is still exactly
    zero after every weight with a non-zero gradient moved a small step along it (a sign step of 1e-2 of its own
    scale: the user's optimizer may start at lr 0 under a warmup). A zero-initialised neighbour (ControlNet's zero
    convolutions, LoRA's B) passes gradient after such a step. The probe's weights are put back. One more backward."""
    moved = [(b, b.detach().clone()) for b in fresh.model.buffers()]  # BatchNorm's running statistics too
    with torch.no_grad():
        for (_n, p), g in zip(trainable, grads):
            if g is not None and bool(g.any()):
                moved.append((p, p.detach().clone()))
                scale = float(p.detach().abs().mean()) or 1.0
                p.sub_(1e-2 * scale * g.sign().to(p.dtype))
    try:
        params = [p for _, p in trainable]
        with modes(fresh.model, train=True):
            _, again = run_or_skip(dlcheck, lambda: backward_grads(lambda: fresh.loss(batch), params))
    finally:
        with torch.no_grad():
            for p, old in moved:
                p.copy_(old)
    wanted = set(zero)
    return [n for (n, _), g in zip(trainable, again) if n in wanted and (g is None or not bool(g.any()))]


def _zero_input_by_construction(fresh: Any, batch: Any, names: list[str], dlcheck: Any) -> dict[str, str]:
    """{parameter name: where its zero input comes from} for the parameters among ``names`` (exactly zero gradients
    a step away) whose module receives an exactly zero input on every example of the batch while every module from
    it up to the model is code of an installed library (its class defined under site-packages): the zero is the
    model's own construction (DETR's decoder feeds its first self-attention zeros as values), not the user's. A
    zero made by a module of the user's own code is not explained. One forward, no grad, train mode."""
    import inspect

    model = fresh.model
    modules = dict(model.named_modules())

    def installed(module: Any) -> bool:
        try:
            path = inspect.getfile(type(module))
        except (TypeError, OSError):
            return False
        return "site-packages" in path or "dist-packages" in path

    owners: dict[str, str] = {}
    for n in names:
        owner = n.rsplit(".", 1)[0] if "." in n else ""
        chain = [owner.rsplit(".", i)[0] for i in range(owner.count(".") + 1)] + [""]
        if owner in modules and owner and all(c in modules and installed(modules[c]) for c in chain):
            owners[n] = owner
    if not owners:
        return {}
    zero_inputs: dict[str, bool] = {}

    def pre(name: str):
        def hook(mod: Any, args: Any, kwargs: Any) -> None:
            given = args[0] if args else next(iter(kwargs.values()), None) if kwargs else None
            ok = isinstance(given, torch.Tensor) and given.numel() > 0 and not bool(given.detach().any())
            zero_inputs[name] = zero_inputs.get(name, True) and ok

        return hook

    # the batch's own float inputs once more, made up (random values of their shapes): a zero that follows the
    # data (all-zero features, black images) is the pipeline's, and it is not explained
    other = _other_float_inputs(batch)
    handles = [modules[o].register_forward_pre_hook(pre(o), with_kwargs=True) for o in set(owners.values())]
    try:
        with modes(model, train=True), torch.no_grad(), preserved_rng(), kept_buffers(model):
            run_or_skip(dlcheck, lambda: fresh.loss(batch))
            if other is None:
                return {}
            with made_up("the batch with its float inputs replaced by random values"):
                run_or_skip(dlcheck, lambda: fresh.loss(other))
    finally:
        for h in handles:
            h.remove()
    return {
        n: f"{o} ({type(modules[o]).__name__} in {type(modules[o.rsplit('.', 1)[0] if '.' in o else '']).__name__})"
        for n, o in owners.items()
        if zero_inputs.get(o)
    }


def _other_float_inputs(batch: Any) -> Any:
    """``batch`` with its float inputs replaced by standard-normal values of their shapes: a mapping's top-level
    float tensors other than its targets (``labels``, ``targets``...), an ``(inputs, targets, ...)`` sequence's
    first element, or a float tensor batch; None when there is no float input."""
    from collections.abc import Mapping

    def noise(x: torch.Tensor) -> torch.Tensor:
        g = torch.Generator().manual_seed(x.numel())
        return torch.randn(x.shape, generator=g, dtype=torch.float32).to(dtype=x.dtype, device=x.device)

    def is_input(x: Any) -> bool:
        return isinstance(x, torch.Tensor) and x.is_floating_point()

    if is_input(batch):
        return noise(batch)
    if isinstance(batch, Mapping):
        out, found = batch, False
        for k, v in batch.items():
            if is_input(v) and not any(w in str(k).lower() for w in ("label", "target")):
                out, found = with_field(out, k, noise(v)), True
        return out if found else None
    if isinstance(batch, (list, tuple)) and batch and is_input(batch[0]) and not hasattr(batch, "_fields"):
        rest = list(batch[1:])
        return [noise(batch[0]), *rest] if isinstance(batch, list) else (noise(batch[0]), *rest)
    return None


#: calls of the user's step T3 makes at most to see every trainable parameter reached (a GAN that updates its
#: generator every few critic steps reaches it within a few calls)
STEP_CALLS = 8


def _loss_unavailable(setup: Any, model: Any, batch: Any) -> str | None:
    """Why the loss of a plain (or Accelerate) loop cannot be computed apart from its step, when the loop gives
    its own ``dlcheck_train_step``: T3 then watches that step. None otherwise (the loss is computed, or a
    missing ``dlcheck_compute_loss`` is the skip)."""
    if setup is None or setup.kind not in ("loop", "accelerate") or getattr(setup, "train_step", MISSING) is MISSING:
        return None
    return setup.loss_unavailable(model, batch)


def _state_modules(state: dict[str, Any]) -> list[tuple[str, torch.nn.Module]]:
    """(prefix, module) of every module the state trains: ``model`` with no prefix (its parameters keep their own
    names), another (a GAN's generator, a critic) as ``key.``."""
    keys = {id(unwrap_prepared(v)): k for k, v in state.items()}
    out = []
    for module in trained_modules(state):
        inner = unwrap_prepared(module)
        key = keys.get(id(inner), keys.get(id(module), "model"))
        out.append(("" if key == "model" else f"{key}.", inner))
    return out


def _through_the_step(dlcheck, setup: Any, why: str) -> None:
    """T3 for a loop whose loss lives inside its own step: fresh objects from the factory, the user's
    ``dlcheck_train_step`` called on the training batches (up to :data:`STEP_CALLS` calls, until every trainable
    parameter of the modules it trains has had a gradient), each parameter's gradient seen as backward
    accumulates it; then which of them the state's optimizers hold."""

    def watched() -> dict[str, Any]:
        state = setup.state()
        roots = _state_modules(state)
        params, ids = [], set()
        names: dict[int, str] = {}
        for prefix, root in roots:
            for n, p in root.named_parameters():
                if id(p) not in ids:
                    ids.add(id(p))
                    params.append((prefix + n, p))
            for mn, m in root.named_modules():
                names.setdefault(id(m), prefix + mn)
        trainable = [(n, p) for n, p in params if p.requires_grad]
        # the training dict's other modules (a diffusion training's state['unet'] beside the adapter it trains): in
        # no optimizer, they are judged on one thing only, whether the step computes gradients for them
        others = []
        for key, value in state.items():
            mod = unwrap_prepared(value)
            if isinstance(mod, torch.nn.Module) and all(mod is not r for _, r in roots):
                for n, p in mod.named_parameters():
                    if p.requires_grad and id(p) not in ids:
                        ids.add(id(p))
                        others.append((f"{key}.{n}", p))
        got: set[str] = set()
        ran: set[str] = set()
        handles = [p.register_post_accumulate_grad_hook(lambda _p, n=n: got.add(n)) for n, p in trainable + others]
        handles += [
            m.register_forward_hook(lambda mod, i, o: ran.add(names[id(mod)]))
            for _, root in roots
            for m in root.modules()
        ]
        seen = {"calls": 0}

        def after(i: int) -> None:
            seen["calls"] = i + 1
            if all(n in got for n, _ in trainable):
                raise _Reached

        try:
            with preserved_rng():
                setup.run(state, setup.batches(STEP_CALLS), 0, Trajectory(), after=after)
        except _Reached:
            pass
        finally:
            for h in handles:
                h.remove()
        held: set[int] = set()
        for value in state.values():
            opt = unwrap_prepared(value)
            if isinstance(opt, torch.optim.Optimizer):
                held.update(id(p) for g in opt.param_groups for p in g["params"])
        modules = [type(root).__name__ for _, root in roots]
        copies = _step_weight_copies(roots, held, got)
        # a module of the training dict that no optimizer holds, with the very parameters of one the step trains
        # (SAC's qf1_target beside qf1): a target network, said
        for copy, original in state_weight_copies(state).items():
            pre = "" if original == "model" else f"{original}."
            names_of = [f"{pre}{n}" for n, p in unwrap_prepared(state[original]).named_parameters() if p.requires_grad]
            if copy != "model" and names_of and all(n in got for n in names_of):
                copies.setdefault(copy, original)
        return {
            "copies": copies,
            "calls": seen["calls"],
            "trainable": [n for n, _ in trainable],
            "shapes": {n: shape(p) for n, p in trainable + others},
            "others": [n for n, _ in others],
            "got": got,
            "ran": ran,
            # with no optimizer object the step updates the weights itself (a hand-written SGD): nothing to hold them
            "outside": [n for n, p in trainable + others if n in got and id(p) not in held] if held else [],
            "optimizers": bool(held),
            "modules": modules,
            "frozen": sum(1 for _, p in params if not p.requires_grad),
        }

    seen = run_or_skip(dlcheck, watched)
    trainable, got, calls = seen["trainable"], seen["got"], seen["calls"]
    if not trainable:
        dlcheck.not_applicable("the modules the training trains have no parameter with requires_grad=True")
    ignore = re.compile(dlcheck.setting("ignore")) if dlcheck.setting("ignore") else None
    orphans = [n for n in trainable if n not in got and not (ignore and ignore.search(n))]
    copies = seen["copies"]
    orphans = [n for n in orphans if not any(n.startswith(f"{copy}.") for copy in copies)]
    copy_note = "".join(
        f"; {copy}.* gets no gradient and is in no optimizer: a copy of {original} (same parameters, which train), "
        "updated from its weights, copied or averaged (a target network), not judged"
        for copy, original in copies.items()
    )
    where = (
        f"{calls} call(s) of dlcheck_train_step on fresh objects from dlcheck_make_training "
        f"({', '.join(seen['modules'])}; its loss is computed inside the step: {why})"
    )
    frozen = f"; {seen['frozen']} frozen parameter tensors not judged" if seen["frozen"] else ""
    if orphans:
        shown = ", ".join(f"{n} [{seen['shapes'][n]}]" for n in orphans[:6]) + (" …" if len(orphans) > 6 else "")
        owner = lambda n: n.rsplit(".", 1)[0] if "." in n else ""  # noqa: E731
        never_ran = sorted({owner(n) for n in orphans if owner(n) not in seen["ran"]})
        evidence = [f"{where}: {len(orphans)} of {len(trainable)} trainable parameter tensors got no gradient: {shown}"]
        if never_ran and len(never_ran) == len({owner(n) for n in orphans}):
            evidence.append(f"module(s) never called by a forward: {', '.join(never_ran[:6])}")
            cause = "these modules are defined (and trainable) but the step never calls them: they train for nothing"
            fix = (
                "call them in the forward, or delete them / set requires_grad_(False) and leave them out of the "
                "optimizer if they are unused on purpose"
            )
        else:
            cause = (
                "their output is cut from the autograd graph (a .detach(), a torch.no_grad() block, or a round-trip "
                "through .item()/numpy), or the loss the step backpropagates does not depend on them: the layers are "
                "frozen by accident"
            )
            fix = (
                "remove the detach / no_grad around those modules; to freeze them on purpose, set "
                "requires_grad_(False) and leave them out of the optimizer"
            )
        dlcheck.fail(evidence, cause, fix)
    untrained = [n for n in seen["outside"] if n in set(seen["others"])]
    if untrained:
        modules = sorted({n.split(".", 1)[0] for n in untrained})
        shown = ", ".join(f"{n} [{seen['shapes'][n]}]" for n in untrained[:4]) + (" …" if len(untrained) > 4 else "")
        dlcheck.fail(
            [
                f"{where}: {len(untrained)} parameter tensors of {', '.join(f'state[{m!r}]' for m in modules)}, which no "
                f"optimizer of the training dict holds, require gradients and get one at every step: {shown}"
            ],
            f"{', '.join(modules)} is meant to stay as it is (no optimizer trains it) but was never frozen: the backward "
            "computes and stores a gradient for every one of its parameters, for nothing (time and memory), and "
            "nothing ever applies them",
            f"freeze it before training: {modules[0]}.requires_grad_(False) (gradients still flow through it to what "
            "trains)",
        )
    if seen["outside"]:
        outside = seen["outside"]
        shown = ", ".join(f"{n} [{seen['shapes'][n]}]" for n in outside[:6]) + (" …" if len(outside) > 6 else "")
        dlcheck.fail(
            [
                f"{where}: {len(outside)} of {len(trainable)} parameter tensors that get a gradient are in no param "
                f"group of the training dict's optimizers: {shown}"
            ],
            "the optimizer was built over a subset of the trainable parameters: the others get gradients but are "
            "never updated",
            "pass every trainable parameter to the optimizer (model.parameters(), or every param group you intend), "
            "or freeze the rest with requires_grad_(False)",
        )
    held = (
        "and the training dict's optimizers hold them all"
        if seen["optimizers"]
        else "(the training dict holds no optimizer object: the step updates them itself)"
    )
    copied = sum(1 for n in trainable if any(n.startswith(f"{copy}.") for copy in copies))
    dlcheck.measured(
        f"{where}: all {len(trainable) - copied} trainable parameter tensors"
        + (" outside the target networks" if copied else "")
        + f" got a gradient, {held}{frozen}{copy_note}",
        trainable=len(trainable),
        with_gradient=len(trainable),
        calls=calls,
    )


def _step_weight_copies(roots: list[tuple[str, torch.nn.Module]], held: set[int], got: set[str]) -> dict[str, str]:
    """``{copy: original}`` (by parameter-name prefix) among the modules a step trains: a module of the training
    dict (SAC's ``qf1_target`` beside ``qf1``), or a top-level submodule of one, that is in no optimizer and has the
    very parameters of another that is and whose parameters all got a gradient: a target network, updated by
    copying weights. Empty when the training holds no optimizer object."""
    if not held:
        return {}
    out: dict[str, str] = {}
    by_name = {(prefix[:-1] if prefix else "model"): root for prefix, root in roots}

    def trains_root(name: str) -> bool:
        pre = "" if name == "model" else f"{name}."
        return all(f"{pre}{n}" in got for n, p in by_name[name].named_parameters() if p.requires_grad)

    if len(by_name) > 1:
        # the dict itself, not a ModuleDict of it: a training dict's key may hold a "." ("unet.lora")
        for copy, original in weight_copies(by_name, held, trains_root).items():
            out["" if copy == "model" else copy] = original
    for prefix, root in roots:
        children = dict(root.named_children())

        def trains_child(name: str, prefix: str = prefix, children: dict = children) -> bool:
            return all(f"{prefix}{name}.{n}" in got for n, p in children[name].named_parameters() if p.requires_grad)

        for copy, original in weight_copies(root, held, trains_child).items():
            out[f"{prefix}{copy}"] = f"{prefix}{original}"
    return {c: o for c, o in out.items() if c}


class _Reached(Exception):
    """Raised between two calls of the user's step once every trainable parameter has had a gradient."""


def _held_ids(setup: Any, fresh: Any) -> set[int] | None:
    """The ids of the parameters any optimizer of the training holds (the probe's objects), or None when the
    training gives none."""
    if setup is None:
        return None
    try:
        opt, _ = fresh.make_optimizer()
    except Exception:  # noqa: BLE001 - no optimizer to read: no parameter is called a copy
        return None
    if opt is None:
        return None
    return optimizer_held([opt, *_other_optimizers(fresh.owner, opt)])


def _weight_copies(
    model: Any, trainable: list[tuple[str, Any]], grads: Any, orphans: list[tuple[str, Any]], held: Callable[[], Any]
) -> dict[str, str]:
    """Top-level submodules that get no gradient, are in no optimizer, and have the very parameters (names and
    shapes) of another top-level submodule that gets gradients: a DQN / TD3 target network, updated by copying the
    online network's weights. ``{copy: original}``; empty when the training gives no optimizer to read."""
    graded = {n for (n, _), g in zip(trainable, grads) if g is not None}
    orphan_names = {n for n, _ in orphans}
    children = dict(model.named_children())
    # candidates: top-level submodules every parameter of which gets no gradient
    tops = {
        top
        for top in {n.split(".", 1)[0] for n in orphan_names if "." in n}
        if top in children and all(f"{top}.{n}" in orphan_names for n, _ in children[top].named_parameters())
    }
    if not tops:
        return {}
    ids = held()
    if ids is None:
        return {}

    def trains(name: str) -> bool:
        return all(f"{name}.{n}" in graded for n, _ in children[name].named_parameters())

    # a copy in an optimizer is meant to train (a second tower cut from the graph by accident): not exempt
    return {c: o for c, o in weight_copies(model, ids, trains).items() if c in tops}


def _other_optimizers(owner: Any, opt: Any) -> list[Any]:
    """The optimizers of a loop's training dict (``owner``) other than ``opt``'s own (a GAN's second one)."""
    if not isinstance(owner, dict):
        return []
    inner = unwrap_prepared(opt)
    out = []
    for key, value in owner.items():
        other = unwrap_prepared(value)
        if key != "optimizer" and isinstance(other, torch.optim.Optimizer) and other is not inner:
            out.append(other)
    return out


def _output_width(fresh: Any, batch: Any) -> int | None:
    """The last dimension of the model's output on ``batch`` (a tensor output, or a transformers output's
    logits), or None when it cannot be read without a guess."""
    try:
        with torch.no_grad(), kept_buffers(fresh.model):
            out = model_call(fresh.model, batch)()
    except (NotTheBatch, Exception):  # noqa: BLE001 - only an aid to the cause's wording
        return None
    out = getattr(out, "logits", out)
    return int(out.shape[-1]) if isinstance(out, torch.Tensor) and out.dim() >= 1 else None
