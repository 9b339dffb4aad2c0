from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import torch

from ...registry import Setting, check
from ...training import (
    ModuleSnapshot,
    batch_len,
    describe_batch,
    device_of,
    find_setup,
    modes,
    output_tensor,
    pipeline_call,
    probe,
    run_or_skip,
    to_device,
    with_field,
)
from ...training.backward import own_backward
from ...training.runs import NotTheBatch, inputs_guessed, model_call
from ..shared.lm import input_embeddings

ATTENTION = (
    torch.nn.MultiheadAttention,
    torch.nn.TransformerEncoderLayer,
    torch.nn.TransformerDecoderLayer,
    torch.nn.Transformer,
)
MAX_MODULES = 400
#: the fields of a mapping batch T4 differentiates against, by name (the first float one present)
INPUT_KEYS = ("pixel_values", "inputs_embeds", "input_values", "x", "inputs", "image", "images")


def _inputs(model: Any, batch: Any) -> tuple[Any, Any, Any]:
    """(batch to run, the input tensor to differentiate against or None, hook handle). Token batches are
    differentiated at the input embeddings' output; float inputs directly."""
    emb = input_embeddings(model) if isinstance(batch, Mapping) and "input_ids" in batch else None
    if emb is not None:
        holder: dict[str, torch.Tensor] = {}
        given_ids = batch["input_ids"]

        def hook(mod, args, out):
            if "x" in holder:
                return None
            leaf, fed = _batch_first_leaf(args[0] if args else None, given_ids, out)
            holder["x"] = leaf
            return fed

        return batch, holder, emb.register_forward_hook(hook)
    if (
        isinstance(batch, (list, tuple))
        and batch
        and isinstance(batch[0], torch.Tensor)
        and batch[0].is_floating_point()
    ):
        x = batch[0].detach().clone().requires_grad_(True)
        return type(batch)([x, *batch[1:]]) if isinstance(batch, list) else (x, *batch[1:]), {"x": x}, None
    if isinstance(batch, torch.Tensor) and batch.is_floating_point():
        x = batch.detach().clone().requires_grad_(True)
        return x, {"x": x}, None
    if isinstance(batch, Mapping):
        key = next(
            (k for k in INPUT_KEYS if isinstance(batch.get(k), torch.Tensor) and batch[k].is_floating_point()),
            None,
        )
        if key is not None:
            x = batch[key].detach().clone().requires_grad_(True)
            return with_field(batch, key, x), {"x": x}, None
    ids = _token_ids(batch)
    embeddings = [m for m in model.modules() if isinstance(m, torch.nn.Embedding)] if ids is not None else []
    if embeddings:
        # a model without get_input_embeddings (nanoGPT's wte, llama2.c's tok_embeddings): the embedding that
        # receives the batch's token ids is differentiated at its output
        found: dict[str, Any] = {"_embedding": True}

        def on_ids(mod, args, out):
            given = args[0] if args else None
            if "x" not in found and isinstance(given, torch.Tensor) and given.shape in (ids.shape, ids.shape[::-1]):
                if torch.equal(given, ids) or (given.dim() == 2 and torch.equal(given, ids.t())):
                    found["x"], fed = _batch_first_leaf(given, ids, out)
                    return fed
            return None

        return batch, found, _Handles([m.register_forward_hook(on_ids) for m in embeddings])
    return batch, None, None


def _batch_first_leaf(given: Any, ids: Any, out: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(the leaf T4 differentiates against, batch first; what the embedding hands the model). A model that embeds
    its token ids sequence-first (XLNet transposes input_ids to (seq, batch) before its word embedding) gets its
    (seq, batch, dim) embeddings as before, from a batch-first leaf: example i of the leaf is example i of the batch,
    not position i."""
    seq_first = (
        isinstance(given, torch.Tensor)
        and isinstance(ids, torch.Tensor)
        and given.dim() == 2
        and ids.dim() == 2
        and given.shape == ids.shape[::-1]
        and not (given.shape == ids.shape and torch.equal(given, ids))
        and torch.equal(given, ids.t())
    )
    if not seq_first:
        leaf = out.detach().requires_grad_(True)
        return leaf, leaf
    leaf = out.detach().transpose(0, 1).contiguous().requires_grad_(True)
    return leaf, leaf.transpose(0, 1)


def _no_input(model: Any, batch: Any) -> str:
    """Why T4 found no input of the model to differentiate against, in words true of this model and batch."""
    name = type(model).__name__
    shown = describe_batch(batch)
    if isinstance(model, torch.nn.Module) and type(model).forward is torch.nn.Module.forward:
        methods = sorted(n for n, v in vars(type(model)).items() if callable(v) and not n.startswith("_"))
        defines = f" (it defines {', '.join(methods)})" if methods else ""
        return (
            f"{name} has no forward of its own{defines}: the training calls its methods or its members, never the "
            f"model itself, and T4 differentiates the model's forward, so nothing was differentiated (batch: {shown})"
        )
    ids = _token_ids(batch)
    if ids is not None:
        return (
            f"the batch's token ids ({describe_batch(ids)}) reach no input embedding: {name} has no "
            f"get_input_embeddings and no nn.Embedding (batch: {shown})"
        )
    if isinstance(batch, Mapping):
        floats = [str(k) for k, v in batch.items() if isinstance(v, torch.Tensor) and v.is_floating_point()]
        if floats:
            try:
                takes = f" ({name}.forward takes {', '.join(_params(model))})"
            except (TypeError, ValueError):  # a forward without a signature: the fields alone are said
                takes = ""
            return (
                f"none of the batch's float fields ({', '.join(floats)}) is an input T4 knows by name "
                f"({', '.join(INPUT_KEYS)}) and it holds no input_ids: T4 does not guess which field the model's "
                f"input is{takes} (batch: {shown})"
            )
        return f"the batch holds no float field and no token ids (batch: {shown})"
    if isinstance(batch, (list, tuple)) and batch:
        return (
            f"the batch's first element ({describe_batch(batch[0])}) is neither a float input nor token ids "
            f"(batch: {shown})"
        )
    return f"the batch is neither a float tensor nor token ids (batch: {shown})"


def _params(model: Any) -> list[str]:
    import inspect

    return [p for p in inspect.signature(model.forward).parameters if p not in ("args", "kwargs")]


def _token_ids(batch: Any) -> torch.Tensor | None:
    """The integer token ids of a batch: its ``input_ids``, the first tensor of an ``(x, y)`` pair, or the batch
    itself; None when the batch carries none."""
    if isinstance(batch, Mapping):
        ids = batch.get("input_ids")
    elif isinstance(batch, (list, tuple)) and batch:
        ids = batch[0]
    else:
        ids = batch
    if isinstance(ids, torch.Tensor) and ids.dim() >= 2 and not ids.is_floating_point() and ids.dtype != torch.bool:
        return ids
    return None


def _step_token_call(mod: Any, args: tuple, kwargs: dict, size: int) -> tuple[Any, dict, Any] | None:
    """A module a training step calls on token ids (Lightning's demo Transformer: ``self.model(input, target)``):
    (the call, with every nn.Embedding of the module hooked so that the one receiving the first batch-first id tensor
    is differentiated at its output, the holder the leaf lands in, the ids). None without such ids or embeddings."""
    ids = next(
        (
            a
            for a in (*args, *kwargs.values())
            if isinstance(a, torch.Tensor)
            and not a.is_floating_point()
            and a.dtype != torch.bool
            and a.dim() >= 2
            and a.shape[0] == size
        ),
        None,
    )
    embeddings = [m for m in mod.modules() if isinstance(m, torch.nn.Embedding)]
    if ids is None or not embeddings:
        return None
    found: dict[str, Any] = {"_embedding": True}

    def on_ids(m, a, out):
        given = a[0] if a else None
        if (
            "x" not in found
            and isinstance(given, torch.Tensor)
            and given.shape == ids.shape
            and torch.equal(given, ids)
        ):
            leaf = out.detach().requires_grad_(True)
            found["x"] = leaf
            return leaf
        return None

    def call() -> Any:
        handles = [m.register_forward_hook(on_ids) for m in embeddings]
        try:
            return mod(*args, **kwargs)
        finally:
            for h in handles:
                h.remove()

    return call, found, ids


class _Handles:
    """Several hook handles removed as one."""

    def __init__(self, handles: list[Any]) -> None:
        self.handles = handles

    def remove(self) -> None:
        for h in self.handles:
            h.remove()


def _influence(out: torch.Tensor, x: torch.Tensor, i: int) -> tuple[int, float, float] | None:
    """(j, |d out_i / d x_j|max, |d out_i / d x_i|max) for the most influential other example j; None when
    example i's output does not depend on the inputs at all."""
    gen = torch.Generator(device="cpu").manual_seed(i)
    weights = torch.randn(out[i].shape, generator=gen).to(out.device, out.dtype)
    with own_backward():  # a Fabric-wrapped model's output wants fabric.backward: run as it runs it
        (grad,) = torch.autograd.grad((out[i] * weights).sum(), x, retain_graph=True, allow_unused=True)
    if grad is None:
        return None
    per = grad.detach().abs().flatten(1).amax(1)
    if per.shape[0] != out.shape[0] and out.shape[0] and per.shape[0] % out.shape[0] == 0:
        # inputs flattened example-major before the embeddings (a multiple-choice model embeds its (batch, choices,
        # positions) ids as batch x choices rows): example i owns rows i*k .. i*k + k - 1
        per = per.view(out.shape[0], -1).amax(1)
    own = float(per[i])
    others = per.clone()
    others[i] = 0
    j = int(others.argmax())
    return j, float(others[j]), own


def _mixing(out: torch.Tensor, x: torch.Tensor, i: int, rtol: float) -> tuple[int, float, float] | None:
    """The influence of the most influential other example j on example i, if it is beyond ``rtol`` of
    example i's own input's."""
    found = _influence(out, x, i)
    if found is not None and found[1] > rtol * max(found[2], 1e-12) and found[1] > 0:
        return found
    return None


def _step_forward_call(dlcheck: Any, fresh: Any, batch: Any) -> tuple[Any, tuple, dict] | None:
    """(module, args, kwargs) of the first module a Lightning module's own ``training_step`` calls on ``batch``:
    the module itself when the step calls its forward (``self(x)``), else the outermost submodule it calls
    first (``self.model(x)``); in train mode, no grad, its state restored. None when the step calls no module."""
    model = fresh.model
    seen: list[tuple[Any, tuple, dict]] = []

    def pre(mod, args, kwargs):
        if not seen:
            seen.append((mod, args, kwargs))

    start = ModuleSnapshot.take(model)
    handles = [m.register_forward_pre_hook(pre, with_kwargs=True) for m in model.modules()]
    try:
        with modes(model, train=True), torch.no_grad():
            run_or_skip(dlcheck, lambda: fresh.loss(batch))
    finally:
        for h in handles:
            h.remove()
        start.restore(model)
    return seen[0] if seen else None


def _pipeline_inputs(dlcheck: Any, fresh: Any, batch: Any, size: int) -> tuple[Any, dict, str]:
    """For a Lightning module: (a call of the module its training_step calls first, on the inputs the step gives
    it, with the first float input a leaf to differentiate against, {"x": that leaf}, what those inputs are).
    Skips, saying so, when the step calls no module, or not on a batch-first float input: T4 cannot reproduce
    it. A submodule judged alone (the step calls others after it) is said with ``not_judged``."""
    model = fresh.model
    name = type(model).__name__
    call = _step_forward_call(dlcheck, fresh, batch)
    if call is None:
        dlcheck.skip(
            f"{name}.training_step calls none of its modules on the batch: T4 cannot reproduce the input your "
            "pipeline gives a forward, so it does not judge"
        )
    mod, args, kwargs = call
    label = "forward" if mod is model else next((n for n, m in model.named_modules() if m is mod), "?")
    if mod is not model:
        rest = (
            f"{name}.training_step does not call the module's own forward: T4 judged {label}, the module it calls "
            "first on the batch, not what the step computes from its output"
        )
    else:
        rest = None
    whose = "forward's input" if mod is model else f"the input of {label} ({type(mod).__name__})"
    return _called_inputs(dlcheck, mod, args, kwargs, size, f"{name}.training_step", label, whose, rest)


def _called_inputs(
    dlcheck: Any,
    mod: Any,
    args: tuple,
    kwargs: dict,
    size: int,
    by: str,
    label: str,
    whose: str,
    rest: str | None = None,
) -> tuple[Any, dict, str]:
    """(a call of ``mod`` on the inputs the pipeline (``by``) gives it, with its first float input a leaf to
    differentiate against, {"x": that leaf}, what those inputs are); token ids are differentiated at the
    nn.Embedding that receives them. Skips, saying so, when no input is a batch-first float tensor or token ids of
    the batch's ``size`` examples. ``rest``: what the step computes beyond this call, said as not judged."""
    place = next(
        (i for i, a in enumerate(args) if isinstance(a, torch.Tensor) and a.is_floating_point()),
        next((k for k, v in kwargs.items() if isinstance(v, torch.Tensor) and v.is_floating_point()), None),
    )
    given = None if place is None else args[place] if isinstance(place, int) else kwargs[place]
    if given is None:
        tokens = _step_token_call(mod, args, kwargs, size)
        if tokens is not None:
            call, found, ids = tokens
            if rest is not None:
                dlcheck.not_judged("the rest of the step", rest)
            return (
                call,
                found,
                f"the token ids {label} is given by {by} ({describe_batch(ids)}), differentiated at the nn.Embedding "
                "that receives them",
            )
        shown = describe_batch(args[0] if len(args) == 1 else args) if args else ", ".join(map(str, kwargs))
        dlcheck.skip(
            f"{by} hands {label} no float tensor ({shown}): T4 differentiates the output against a "
            "float input, so it does not judge this call"
        )
    if given.dim() < 1 or given.shape[0] != size:
        dlcheck.skip(
            f"{by} hands {label} a float tensor of shape {tuple(given.shape)}, not the {size} "
            f"examples of the batch one by one: T4 cannot reproduce the input your pipeline gives {label} per "
            "example, so it does not judge"
        )
    x = given.detach().clone().requires_grad_(True)
    if isinstance(place, int):
        args = (*args[:place], x, *args[place + 1 :])
    else:
        kwargs = {**kwargs, place: x}
    if rest is not None:
        dlcheck.not_judged("the rest of the step", rest)
    return (lambda: mod(*args, **kwargs)), {"x": x}, f"{whose} as {by} gives it: {describe_batch(given)}"


def _not_reproduced(model: Any, batch: Any, call: Any) -> str | None:
    """Why T4 does not judge (a skip's reason), or None: the model does not take the batch as it comes (its
    forward wants inputs the batch does not hold: a seq2seq model's masks) while the plain loop's own loss or step
    calls it on the batch's tensors and builds the rest (``call.on_batch``): it is called on the batch, and T4
    cannot reproduce what is added."""
    if call is None or not call.called or not call.on_batch:
        return None
    try:
        model_call(model, batch)
    except NotTheBatch as exc:
        said = str(exc).removeprefix("not applicable: ").split(": the model is called by your loss")[0]
        name = type(model).__name__
        return (
            f"not judged: {said}: {call.by} calls {name} on the batch's tensors together with inputs it builds "
            f"({call.inputs()}), which T4 does not reproduce, so whether one example's output depends on another "
            "example is not measured"
        )
    return None


def _loop_inputs(dlcheck: Any, model: Any, call: Any, size: int) -> tuple[Any, dict, str] | None:
    """For a plain loop whose own loss or step calls the model on something other than the batch (a GAN's
    generator on the noise the step draws; ``call``, the :func:`pipeline_call`): the model called on those inputs,
    as :func:`_called_inputs`. None when the pipeline calls the model on the batch (or T4 is told nothing of how it
    calls it): the batch is used."""
    if call is None or call.on_batch:
        return None
    name = type(model).__name__
    if not call.called:
        if type(model).forward is torch.nn.Module.forward:
            return None  # no forward of its own (a container of networks): the skip below says so, with its methods
        dlcheck.skip(
            f"{call.elsewhere()}: T4 cannot reproduce the input your pipeline gives {name}.forward, so it does not "
            "judge (it never calls the model on the batch)"
        )
    found = _called_inputs(dlcheck, model, call.args, call.kwargs, size, call.by, name, f"{name}'s input")
    per_example = [
        (str(k), v)
        for k, v in [*enumerate(call.args), *call.kwargs.items()]
        if isinstance(v, torch.Tensor) and v.dim() >= 1 and v.shape[0] == size
    ]
    if len(per_example) > 1:
        # a denoiser's (sample, timestep): the timesteps of other examples are no float input to differentiate
        dlcheck.not_judged(
            "the other inputs",
            f"{call.by} hands {name} {len(per_example)} inputs of {size} examples "
            f"({', '.join(describe_batch(v) for _, v in per_example)}); T4 differentiates against the first float one only",
        )
    return found


@check(
    "T4",
    domain="train",
    title="examples leak into each other across the batch",
    roles=(),
    optional_roles=("trainer", "lightning_module", "make_training", "model", "dataloader"),
    settings=(
        Setting(
            "rtol",
            1e-6,
            "influence of another example's input on an example's output, relative to its own "
            "input's, above which the batch is mixed; independent examples give exactly 0",
        ),
    ),
)
def check_batch_independence(dlcheck):
    """With the model in eval mode, an example's output does not depend on the other examples' inputs.

    What it does
        Runs the model in eval mode on a sampled batch and asks autograd for the gradient of example i's
        output (a fixed random projection of it) with respect to every example's input — the float inputs
        themselves, or the input embeddings for token ids — for the first and the last example. Any
        influence from another example fails. The module where the mixing starts is found the same way
        on every module's output, in execution order.
    Why it is bad
        Each example must be computed on its own: a reshape or view across the batch dimension, attention
        over the wrong axis (``nn.TransformerEncoderLayer`` defaults to ``batch_first=False`` and reads your
        batch as the sequence), or a mean over dim 0 lets examples see each other. The model then learns
        from its neighbours — at evaluation and at batch size 1 it behaves differently, and it can cheat by
        copying a target from another example.
    Example
        layer = nn.TransformerEncoderLayer(d_model=16, nhead=2)   # batch_first=False, fed (batch, seq, dim)
        h = h.view(h.size(1), h.size(0), -1)                       # a transpose written as a view
    Use instead
        nn.TransformerEncoderLayer(..., batch_first=True) (or feed (seq, batch, dim)); permute/transpose
        instead of view/reshape to move axes; reduce over the sequence, never over dim 0.
    Known problems
        Batch statistics in train mode (BatchNorm) are by design and are not judged: the model runs in eval
        mode (V7 owns BatchNorm). Needs a batch of at least 2 examples whose inputs are float tensors or
        token ids with input embeddings (``get_input_embeddings``, or the ``nn.Embedding`` that receives the
        batch's token ids: an ``(x, y)`` pair's ``x`` in a nanoGPT-style loop); others skip, saying why: a
        mapping's float fields not named as an input (a graph's ``features``), a model without a forward of its
        own (a CleanRL agent whose loop calls ``get_value``). A ``torch.compile``
        model is judged through its module (``_orig_mod``), not compiled again. A Lightning module's forward is called on what its own
        training_step hands it (captured from one step on the batch, no grad: an autoencoder's flattened
        images), never on the loader's batch; a step that calls a submodule instead (``self.model(x)``) is
        judged on the first module it calls, the rest of the step said as not judged; a step that calls no
        module on a batch-first float input is not judged (skip: T4 cannot reproduce the forward's input).
        Likewise a plain loop's (or Accelerate loop's) model is called on what its own dlcheck_compute_loss —
        without it, its dlcheck_train_step, once on fresh objects — hands it when that is not the batch (a GAN's
        generator on the noise the step draws, a denoiser on the noisy samples and timesteps its loss makes):
        learnt from the first call of the model in one call of the loss or step, shared per session; the other
        inputs of the examples (a denoiser's timesteps) are said as not judged. A step that never calls the
        model itself is not judged. A loss that calls the model on the batch's own tensors (an RNN language
        model's ``model(data, hidden)``) keeps the batch, and a forward of n inputs on a batch of n elements
        whose call on them raises is not judged (T4 would guess its inputs: time steps are never read as
        examples). A model whose forward returns one value for the whole batch (a 0-d tensor: a diffusion
        wrapper that draws its own timesteps and noise and returns the loss) is not judged (skip, saying so):
        its output is not per example; the denoiser inside it is not judged on its own either. A model whose
        forward takes more than the batch holds, called by the loop's own loss or step on the batch's tensors with
        inputs it builds (a seq2seq Transformer's masks), is not judged (skip, naming the inputs the loss gives it).
    Not applicable
        A model that is not called on the batch (its forward requires fields the batch lacks, the user's
        loss builds them) and no dlcheck_compute_loss or dlcheck_train_step to learn its inputs from, said by
        the training machinery.
    """
    # how a plain loop's own loss or step calls the model, learnt first: a step it runs builds a training state,
    # and the probe is let go meanwhile (never two models alive beside a training run)
    given = find_setup(dlcheck)
    call = pipeline_call(dlcheck, given) if given is not None else None
    fresh, batches, setup = probe(dlcheck)
    model = fresh.model
    compiled = getattr(model, "_orig_mod", None)
    if isinstance(compiled, torch.nn.Module):  # torch.compile's wrapper: its module is judged, not compiled again
        model = compiled
    batch = next((b for b in batches if (batch_len(b) or 0) >= 2), None)
    if batch is None:
        dlcheck.skip("no sampled batch holds 2 examples or more")
    batch = to_device(batch, device_of(model))
    rtol = dlcheck.setting("rtol")
    names = {id(m): n for n, m in model.named_modules()}  # by identity: a Metric hashes its state
    outputs: list[tuple[str, Any, torch.Tensor]] = []
    size = batch_len(batch)

    def record(mod, args, out):
        t = output_tensor(out)
        if (
            isinstance(t, torch.Tensor)
            and t.requires_grad
            and t.dim() >= 1
            and t.shape[0] == size
            and len(outputs) < MAX_MODULES
        ):
            outputs.append((names.get(id(mod), "?"), mod, t))

    # a Lightning module's forward takes what its training_step makes of the batch (an autoencoder flattens the
    # images first): the forward is called on those inputs, never on the loader's batch
    lightning = setup is not None and setup.kind == "lightning"
    pipeline = _pipeline_inputs(dlcheck, fresh, batch, size) if lightning else None
    if pipeline is None and setup is not None:
        # a plain loop's own loss or step may call the model on something it makes (a GAN's generator on noise):
        # the model is called on what the pipeline gives it, learnt from one call of the step, never on the batch
        pipeline = _loop_inputs(dlcheck, model, call, size)
    shown = f"batch: {describe_batch(batch)}" + (f"; {pipeline[2]}" if pipeline else "")
    with modes(model, train=False), torch.enable_grad():
        if pipeline is not None:
            forward, holder, handle = pipeline[0], pipeline[1], None
        else:
            run_batch, holder, handle = _inputs(model, batch)
            forward = (  # noqa: E731
                (lambda: model_call(model, run_batch)())
                if model is not fresh.model
                else (lambda: fresh.forward(run_batch))
            )
        if holder is None:
            dlcheck.skip(f"cannot differentiate the model's inputs: {_no_input(model, batch)}")
        unreproduced = _not_reproduced(model, run_batch, call) if pipeline is None else None
        if unreproduced is not None:
            if handle is not None:
                handle.remove()  # the input hook _inputs put on the model: no trace left
            dlcheck.skip(unreproduced)
        hooks = [m.register_forward_hook(record) for m in model.modules() if m is not model]
        guessed = pipeline is None and inputs_guessed(model, batch)
        try:
            try:
                out = output_tensor(run_or_skip(dlcheck, forward))
            except Exception as exc:
                if not guessed:
                    raise
                # T4 made the call up: the error is not the pipeline's, and T4 cannot reproduce its forward
                dlcheck.skip(
                    f"T4 cannot reproduce the inputs your pipeline gives {type(model).__name__}.forward: it takes "
                    f"{', '.join(_params(model))} and the batch holds {len(batch)} elements (none left as targets), "
                    f"so T4 called it on the batch's elements as its inputs, which raised {type(exc).__name__}: "
                    f"{str(exc).splitlines()[0] if str(exc) else ''} (batch: {describe_batch(batch)}); not judged"
                )
        finally:
            for h in hooks:
                h.remove()
            if handle is not None:
                handle.remove()
        x = holder.get("x")
        if x is None and holder.get("_embedding"):
            dlcheck.skip(
                f"no nn.Embedding of the model received the batch's token ids ({describe_batch(batch)}): T4 found no "
                "input to differentiate against"
            )
        if out is not None and out.dim() == 0:
            dlcheck.skip(
                f"the model's output is a 0-d tensor (a scalar: {type(model).__name__}.forward returns one value for "
                f"the whole batch, such as its loss), not per example: which example's output depends on which input "
                f"cannot be told, so batch independence is not judged ({describe_batch(batch)})"
            )
        if out is None or x is None or out.shape[0] != size:
            dlcheck.skip(
                f"the model's output is not batch-first ({None if out is None else tuple(out.shape)} for {size} examples)"
            )
        found = None
        measured = []  # (i, other, own) of the examples judged
        for i in sorted({0, size - 1}):
            influence = _influence(out, x, i)
            if influence is not None:
                measured.append((i, influence[1], influence[2]))
            found = _mixing(out, x, i, rtol)
            if found:
                found = (i, *found)
                break
        if not found:
            if not measured or all(own == 0 for _, _, own in measured):
                dlcheck.skip(
                    f"the model's output does not depend on its inputs (no gradient to them): batch independence "
                    f"cannot be measured ({describe_batch(batch)})"
                )
            dlcheck.measured(
                f"in eval mode, the outputs of examples {' and '.join(str(i) for i, _, _ in measured)} of a batch of "
                f"{size} depend on no other example's input: max |d out[i] / d in[j]| "
                f"{max(o for _, o, _ in measured):.3g} for j != i, against "
                f"{min(own for _, _, own in measured):.3g} or more for their own input (rtol {rtol:g})",
                shown,
                batch_size=size,
                max_cross_influence=max(o for _, o, _ in measured),
                min_own_influence=min(own for _, _, own in measured),
            )
            return
        culprit = None
        for name, mod, t in outputs:
            if _mixing(t, x, found[0], rtol):
                culprit = (name, mod)
                break

    i, j, other, own = found
    evidence = [
        f"in eval mode, the output of example {i} depends on the input of example {j} of the same batch: max "
        f"|d out[{i}] / d in[{j}]| = {other:.3g}, against {own:.3g} for its own input (independent examples give 0)",
        shown,
    ]
    if culprit is not None:
        name, mod = culprit
        detail = f", batch_first={mod.batch_first}" if hasattr(mod, "batch_first") else ""
        evidence.append(f"the first module whose output mixes the examples: {name} ({type(mod).__name__}{detail})")
    attention = None
    if culprit is not None:
        owners = [culprit[1]] + [
            m for n, m in model.named_modules() if culprit[0].startswith(n + ".") or n == culprit[0]
        ]
        attention = next((m for m in owners if isinstance(m, ATTENTION) and not getattr(m, "batch_first", True)), None)
    if attention is None:
        attention = next(
            (m for m in model.modules() if isinstance(m, ATTENTION) and not getattr(m, "batch_first", True)), None
        )
    if attention is not None:
        cause = (
            f"{type(attention).__name__} has batch_first=False: it reads dim 0 of your (batch, seq, dim) input as "
            "the sequence, so every example attends to the other examples"
        )
        fix = f"build it with batch_first=True (nn.{type(attention).__name__}(..., batch_first=True)), or feed it (seq, batch, dim)"
    else:
        where = f" at {culprit[0]}" if culprit else ""
        cause = (
            f"an operation mixes the batch dimension{where}: a view/reshape that moves data across dim 0 (a "
            "transpose written as a view), a reduction over dim 0, or attention/normalisation over the wrong axis"
        )
        fix = (
            "move axes with permute/transpose (then .contiguous()), never with view/reshape; reduce over the "
            "sequence or feature dimensions only; keep dim 0 the batch in every tensor"
        )
    dlcheck.fail(evidence, cause, fix)
