from __future__ import annotations

import functools
import itertools
import math
from typing import Any, NamedTuple

import torch

from ...errors import MISSING
from ...guard import preserved_dataloader
from ...registry import Setting, check
from ...sampling import spread_positions
from . import measure as V


def _drop_rate(value: Any) -> float | None:
    """A dropout probability held as a plain number (a module's ``dropout``/``attention_dropout``/``drop_prob``)."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    return float(value) if 0 < value <= 1 else None


def _mode_dependent(module: Any) -> str | None:
    """What makes ``module``'s own forward differ between train and eval mode, or None: dropout with p > 0 (the
    Dropout family, or a functional dropout rate held as a number: nn.MultiheadAttention's ``dropout``, nanoGPT's and
    transformers' attention ``dropout``/``attention_dropout`` handed to scaled_dot_product_attention only while
    ``self.training``, a layerdrop, timm's DropPath ``drop_prob``, torchvision's StochasticDepth ``p``), and batch or
    instance norm that keeps running statistics (without them the forward is the same in both modes)."""
    nn = torch.nn
    if isinstance(module, nn.modules.dropout._DropoutNd):
        return f"p={module.p:g}" if _drop_rate(module.p) else None
    if isinstance(module, (nn.modules.batchnorm._BatchNorm, nn.modules.instancenorm._InstanceNorm)):
        return "running statistics" if module.track_running_stats and module.running_mean is not None else None
    name = type(module).__name__
    held = False
    for attr, value in vars(module).items():
        if attr.startswith("_") or isinstance(value, bool) or not isinstance(value, (int, float)):
            continue
        if "drop" in attr.lower() or (attr == "p" and ("Drop" in name or "StochasticDepth" in name)):
            rate = _drop_rate(value)
            if rate is not None:
                return f"{attr}={rate:g}"
            held = True
    # a dropout rate of 0 held: the forward's own `self.training` test is that dropout's, which is off
    return None if held else _reads_training(type(module))


@functools.cache
def _reads_training(cls: type) -> str | None:
    """'its forward reads self.training' when the class's forward source tests the mode (a torchvision detector returns
    losses in training mode and detections in eval mode), else None."""
    import inspect

    try:
        source = inspect.getsource(cls.forward)
    except (OSError, TypeError):
        return None
    return READS_TRAINING if "self.training" in source else None


READS_TRAINING = "its forward reads self.training"


def _named(found: dict[str, tuple[str, str]]) -> dict[str, tuple[str, str]]:
    """The modules to name: those with a dropout or running statistics, when any; else those whose forward reads
    self.training (a transformers model's own test, for gradient checkpointing, is no evidence beside its dropouts)."""
    strong = {n: k for n, k in found.items() if k[1] != READS_TRAINING}
    return strong or found


def _image_of(out: Any) -> Any:
    """The image (C, H, W) or video clip (C, T, H, W) of an example, or None."""
    if isinstance(out, (tuple, list)) and out:
        out = out[0]
    elif isinstance(out, dict):
        out = next((out[k] for k in V.IMAGE_KEYS if k in out), None)
    if getattr(out, "ndim", 3) < 3 and str(getattr(out, "dtype", "")) in ("torch.int64", "torch.int32"):
        return None  # token ids (B, T): no image (a grayscale image is uint8 or float)
    img, _, _ = V.as_pixels(out)
    return img


class Undecided(str):
    """Why the eval transform half was not judged (the reads differ, and what made them differ is not told)."""


def _transform_reads(dlcheck: Any, tol: float) -> tuple[list[str], str] | str | None:
    """Read the eval data twice at the same positions (or run the eval transform twice on one synthetic
    image): evidence lines of the differences, and what was compared (for a pass). None when there is no
    eval data or transform; a sentence saying so when the eval examples hold no image (the half of V2 that
    does not concern them); :class:`Undecided` when an eval dataset read by iterating it gave other examples the
    second time (a random transform, or an order drawn anew: it has no index to read one example twice)."""
    ds = V.map_dataset(dlcheck, "eval")
    stream = V.stream_dataset(dlcheck, "eval") if ds is None else None
    tf = dlcheck.role("eval_transform")
    role = "eval_dataset" if dlcheck.has("eval_dataset") else "eval_dataloader"
    reads: list[tuple[str, Any, Any]] = []
    if stream is not None:
        # an IterableDataset (with or without a length) is never indexed: its first examples, iterated twice
        name = "dlcheck_eval_dataset" if role == "eval_dataset" else "dlcheck_eval_dataloader.dataset"
        firsts = []
        for seed in (1, 2):
            with V.seeded(seed):
                firsts.append(dlcheck.call(role, lambda: list(itertools.islice(iter(stream), min(3, dlcheck.samples)))))
        reads = [
            (f"example {i} of {name} (iterated)", _image_of(a), _image_of(b)) for i, (a, b) in enumerate(zip(*firsts))
        ]
        if tf is not MISSING and not any(a is not None and b is not None for _, a, b in reads):
            reads, stream = [], None  # no image among its examples: the eval transform handed over is run instead
    if reads:
        pass
    elif ds is not None and len(ds) > 0:
        for pos in spread_positions(len(ds), min(3, dlcheck.samples)):
            pair = []
            for seed in (1, 2):
                with V.seeded(seed):
                    pair.append(dlcheck.call(role, lambda p=pos: ds[p]))
            reads.append(
                (
                    f"dlcheck_{role}[{pos}]" if role == "eval_dataset" else f"dlcheck_eval_dataloader.dataset[{pos}]",
                    _image_of(pair[0]),
                    _image_of(pair[1]),
                )
            )
    elif tf is not MISSING:
        img = V.synthetic_pil()
        pair = []
        for seed in (1, 2):
            with V.seeded(seed):
                pair.append(dlcheck.call("eval_transform", lambda: V.apply_image_transform(tf, img)))
        reads.append(("dlcheck_eval_transform on one synthetic image", _image_of(pair[0]), _image_of(pair[1])))
    else:
        return None
    judged = [(w, a, b) for w, a, b in reads if a is not None and b is not None]
    if not judged:
        return f"{reads[0][0]} holds no image: V2 judges an image pipeline's eval transform"
    lines = []
    worst = 0.0
    for where, a, b in judged:
        if a.shape != b.shape:
            lines.append(f"{where} read twice: shapes {tuple(a.shape)} and {tuple(b.shape)}")
            continue
        diff = (a.double() - b.double()).abs()
        worst = max(worst, float(diff.max()))
        if float(diff.max()) > tol:
            lines.append(
                f"{where} read twice: max |Δ| {float(diff.max()):.3g}, "
                f"{100 * float((diff > tol).double().mean()):.0f}% of pixel values differ"
            )
    if lines and stream is not None:
        return Undecided(
            f"the first {len(judged)} examples of {type(stream).__name__} (an IterableDataset) differ between two "
            "iterations under different seeds: a random eval transform or an order drawn anew at every iteration, not "
            "told apart (it has no index to read one example twice)"
        )
    what = judged[0][0] if len(judged) == 1 else f"{len(judged)} eval examples ({', '.join(w for w, _, _ in judged)})"
    compared = f"{what} read twice under different seeds: identical (max |Δ| {worst:.3g} ≤ {tol:g})"
    return lines, compared


def _zip_collate(batch: list) -> tuple:
    return tuple(zip(*batch))


def _inner_loader(loader: Any) -> tuple[str, Any] | None:
    """(attribute, DataLoader) when ``loader`` is not a torch DataLoader but wraps one (timm's ``PrefetchLoader``
    keeps it as ``.loader``; a custom class that moves or normalises batches in its ``__iter__``), else None."""
    from torch.utils.data import DataLoader

    if isinstance(loader, DataLoader) or not hasattr(loader, "__iter__") or not hasattr(loader, "__dict__"):
        return None
    for name, value in vars(loader).items():
        if isinstance(value, DataLoader):
            return name, value
    return None


def _rewrapped(wrapper: Any, name: str, bounded: Any) -> Any:
    """A shallow copy of the user's loader wrapper reading ``bounded`` in place of its own DataLoader (the wrapper
    itself is left as it was)."""
    import copy

    again = copy.copy(wrapper)
    setattr(again, name, bounded)
    return again


def _bounded_settings(source: Any, examples: int) -> dict[str, Any]:
    """The user's DataLoader settings a loader over ``examples`` examples keeps: its workers (at most one per
    example), their init function and context, pinned memory, timeout and prefetch; not persistent (the bounded loader
    is read twice and let go), never dropping the last batch."""
    if source is None:
        return {}
    workers = min(int(getattr(source, "num_workers", 0) or 0), examples)
    kept: dict[str, Any] = {"num_workers": workers, "pin_memory": bool(getattr(source, "pin_memory", False))}
    if workers:
        kept["timeout"] = getattr(source, "timeout", 0) or 0
        kept["worker_init_fn"] = getattr(source, "worker_init_fn", None)
        kept["multiprocessing_context"] = getattr(source, "multiprocessing_context", None)
        if getattr(source, "prefetch_factor", None):
            kept["prefetch_factor"] = source.prefetch_factor
    return kept


class Examples:
    """A few examples of the user's dataset that read as that dataset: indexed 0..n-1 over the chosen positions, its
    length theirs, and every other attribute the user's object's own (an evaluate that reads ``loader.dataset.samples``
    or ``.classes``, torchvision's video reference, works; one that compares ``len(loader.dataset)`` with the examples
    it counted, torchvision's classification reference, finds them equal, as on its own loader)."""

    def __init__(self, dataset: Any, positions: list[int]):
        self.__dict__["_dlcheck_dataset"] = dataset
        self.__dict__["_dlcheck_positions"] = list(positions)

    def __len__(self) -> int:
        return len(self._dlcheck_positions)

    def __getitem__(self, index: int) -> Any:
        return self._dlcheck_dataset[self._dlcheck_positions[index]]

    def __getattr__(self, name: str) -> Any:
        dataset = self.__dict__.get("_dlcheck_dataset")
        if dataset is None or name.startswith("__"):
            raise AttributeError(name)
        return getattr(dataset, name)


def _eval_loader(dlcheck: Any) -> tuple[Any, str] | None:
    """What the eval function is handed, and what it is in words (an input V2 made up: the user's code raising on it
    is pytest-dlcheck's error). A DataLoader over 2 examples of the eval dataset, its ``.dataset`` reading as the
    user's dataset object (:class:`Examples`), with the user's loader's collate_fn, batch size (up to 2) and workers
    settings, inside the user's own wrapper when the eval loader is one; or the first batch of a loader that cannot be
    indexed; None when there is no eval (or train) data."""
    from torch.utils.data import DataLoader

    split = "eval" if V.map_dataset(dlcheck, "eval") is not None or dlcheck.has("eval_dataloader") else "train"
    ds = V.map_dataset(dlcheck, split)
    loader_role = "eval_dataloader" if split == "eval" else "dataloader"
    user_loader = dlcheck.role(loader_role)
    inner = _inner_loader(user_loader) if user_loader is not MISSING else None
    if ds is not None and len(ds) > 0:
        source = inner[1] if inner is not None else user_loader
        collate = getattr(source, "collate_fn", None) if source is not MISSING else None
        source = source if isinstance(source, DataLoader) else None  # the settings below are a DataLoader's
        positions = spread_positions(len(ds), 2)
        if collate is None and _image_of(ds[positions[0]]) is not None:
            sample = V.get_vision_sample(dlcheck, split, required=False)
            if sample is not None and sample.task == "detection":
                collate = _zip_collate  # torchvision's detection convention: (images, targets) tuples
        size = min(V.loader_batch_size(source) or 2, 2) if source is not None else 2
        loader = DataLoader(
            Examples(ds, positions),
            batch_size=size,
            shuffle=False,
            collate_fn=collate,
            **_bounded_settings(source, len(positions)),
        )
        if inner is not None:
            # the eval function gets the user's own loader: a wrapper (timm's PrefetchLoader) moves, converts and
            # normalises each batch in its __iter__; a copy of it reads the bounded loader in place of its own
            loader = _rewrapped(user_loader, inner[0], loader)
        ds_role = V.split_roles(split)[0]
        where = f"dlcheck_{ds_role}" if dlcheck.has(ds_role) else f"dlcheck_{loader_role}.dataset"
        what = (
            f"the DataLoader V2 made over {len(positions)} examples of {where} (positions "
            f"{', '.join(map(str, positions))}; its .dataset reads as {type(ds).__name__}, {len(positions)} long)"
            + (f" inside a copy of your {type(user_loader).__name__}" if inner else "")
        )
        return loader, what
    if user_loader is not MISSING:
        with preserved_dataloader(user_loader):
            batch = next(iter(user_loader), None)
        what = f"a list holding the first batch of dlcheck_{loader_role} (V2's bounded stand-in for the loader)"
        return None if batch is None else ([batch], what)
    return None


def _kinds(found: dict[str, tuple[str, str]], limit: int = 3) -> str:
    """'3 Dropout (p=0.1, e.g. blocks.0.attn.resid_drop), 1 MultiheadAttention (dropout=0.1, e.g. ...)'."""
    by_type: dict[str, list[tuple[str, str]]] = {}
    for name, (kind, why) in found.items():
        by_type.setdefault(kind, []).append((name, why))
    parts = []
    for kind, items in sorted(by_type.items(), key=lambda kv: -len(kv[1]))[:limit]:
        whys = sorted({w for _, w in items})
        parts.append(f"{len(items)} {kind} ({', '.join(whys[:2])}, e.g. {items[0][0] or '(the model itself)'})")
    if len(by_type) > limit:
        parts.append(f"{sum(len(v) for k, v in by_type.items()) - sum(int(p.split()[0]) for p in parts)} more")
    return ", ".join(parts)


def _shown(values: list[Any]) -> str:
    if len(values) == 1 and values[0].numel() == 1:
        return f"{float(values[0]):.6g}"
    flat = [float(v) for t in values for v in t.flatten()[:4]]
    return "[" + ", ".join(f"{v:.4g}" for v in flat[:4]) + (", …]" if sum(t.numel() for t in values) > 4 else "]")


class ModeResult(NamedTuple):
    lines: list[str]  # evidence of a failure
    measured: str  # what a pass measured
    dependent: int  # modules whose forward depends on the mode
    dropout: bool  # a dropout-like module ran in training mode
    norm: bool  # a BatchNorm/InstanceNorm ran in training mode, or its running statistics moved
    undecided: str | None = None  # why the mode's effect could not be told apart from the eval's own randomness


def _mode_problems(dlcheck: Any, model: Any, eval_fn: Any) -> ModeResult | None:
    """Run the user's eval function twice on the same eval examples and the same weights, with the model in train mode
    as it is when called from a training loop; report the modules whose forward depends on the mode (dropout,
    BatchNorm with running statistics, a functional dropout rate) that ran in training mode, BatchNorm statistics it
    moved, and results that differ between the two runs. Weights, buffers and modes are restored afterwards.

    Returns (evidence lines, what was measured for a pass, number of mode-dependent modules, whether dropout-like and
    whether normalisation modules ran in training mode); (…, 0, …) without running anything when no module's forward
    depends on the mode; None when there is no eval batch."""
    dependent = {n: (type(m).__name__, why) for n, m in model.named_modules() if (why := _mode_dependent(m))}
    if not dependent:
        return ModeResult([], "", 0, False, False)
    made = _eval_loader(dlcheck)
    if made is None:
        return None
    loader, what = made

    modes = [(m, m.training) for m in model.modules()]
    state = {k: v.detach().clone() for k, v in model.state_dict().items()}
    bn = {
        n: m
        for n, m in model.named_modules()
        if isinstance(m, torch.nn.modules.batchnorm._BatchNorm) and m.track_running_stats and m.running_mean is not None
    }
    seen_training: dict[str, tuple[str, str]] = {}
    outputs: list[list[Any]] = [[], [], [], []]  # two evals in train mode, then (when asked) two in eval mode
    returned: list[list[Any]] = [[], [], [], []]
    run_index = [0]

    def pre_hook(name: str):
        def hook(mod: Any, args: Any) -> None:
            if mod.training:
                seen_training.setdefault(name, dependent[name])

        return hook

    def out_hook(mod: Any, args: Any, out: Any) -> None:
        outputs[run_index[0]].extend(V.tensors_in(out))

    modules = dict(model.named_modules())
    handles = [modules[n].register_forward_pre_hook(pre_hook(n)) for n in dependent]
    handles.append(model.register_forward_hook(out_hook))
    moved: list[tuple[str, float]] = []
    error = None
    raised_training = [False]
    try:
        for i, seed in enumerate((3, 4)):
            run_index[0] = i
            model.load_state_dict(state)  # the same weights and statistics for both evals
            model.train()
            before = {n: m.running_mean.detach().clone() for n, m in bn.items()}
            with V.seeded(seed):
                try:
                    returned[i] = V.tensors_in(dlcheck.call("eval_fn", lambda: eval_fn(model, loader), synthetic=what))
                except Exception as exc:  # noqa: BLE001 - reported below, as pytest-dlcheck's error or as evidence
                    error = exc
                    raised_training[0] = model.training and "train" in str(exc).lower()
            if i == 0:
                for n, m in bn.items():
                    delta = (
                        float((m.running_mean.detach() - before[n]).abs().max()) if m.running_mean is not None else 0.0
                    )
                    if delta > 0:
                        moved.append((n, delta))
            if error is not None:
                break
    finally:
        for h in handles:
            h.remove()
        model.load_state_dict(state)
        for m, training in modes:
            m.training = training
    if error is not None and not seen_training and not raised_training[0]:
        # raised on the loader V2 made (marked so by dlcheck.call): an internal error of pytest-dlcheck naming that
        # input, never the role's (the pipeline's own eval loader may never meet that condition)
        raise error
    d_out = V.max_abs_diff(outputs[0], outputs[1]) if error is None else None
    d_ret = V.max_abs_diff(returned[0], returned[1]) if error is None else None
    differ = any(d is not None and d > 0 for d in (d_out, d_ret))
    # a numeric dropout attribute alone is read from the module, not seen acting: it counts when the evals differ
    typed = (
        torch.nn.modules.dropout._DropoutNd,
        torch.nn.modules.batchnorm._BatchNorm,
        torch.nn.modules.instancenorm._InstanceNorm,
    )
    conclusive = [n for n in seen_training if isinstance(modules[n], typed)]
    confirmed = None
    if seen_training and differ and not conclusive and not moved:
        # only a dropout rate held as a number, or a forward reading self.training, ran in training mode: the two
        # evals differ because of the mode only if the same two evals in eval mode agree (an eval that samples
        # draws differently under the two seeds whatever the mode)
        again = model.register_forward_hook(out_hook)
        try:
            for i, seed in ((2, 3), (3, 4)):
                run_index[0] = i
                model.load_state_dict(state)
                model.eval()
                with V.seeded(seed):
                    returned[i] = V.tensors_in(
                        dlcheck.call("eval_fn", lambda: eval_fn(model, loader), synthetic=f"{what}, in eval mode")
                    )
        finally:
            again.remove()
            model.load_state_dict(state)
            for m, training in modes:
                m.training = training
        e_out, e_ret = V.max_abs_diff(outputs[2], outputs[3]), V.max_abs_diff(returned[2], returned[3])
        confirmed = not any(d is not None and d > 0 for d in (e_out, e_ret))
    if not conclusive and not moved and error is None and not confirmed:
        same = (
            "two evals give identical results"
            if d_out == 0 and d_ret in (0, None)
            else "its model outputs were not captured"
            if d_out is None and d_ret is None
            else f"two evals differ by {'shape' if math.isinf(max(d_out or 0, d_ret or 0)) else f'{max(d_out or 0, d_ret or 0):.3g}'}"
        )
        ran = (
            f"0 of {len(_named(dependent))} modules whose forward depends on the mode ({_kinds(_named(dependent))}) ran in "
            "training mode"
            if not seen_training
            else f"{len(seen_training)} of {len(dependent)} modules holding a dropout rate or reading self.training "
            f"ran in training mode ({_kinds(_named(seen_training))}) "
            + (
                "without changing the results"
                if not differ
                else "and two evals differed, but differed in eval mode too (the eval draws at random itself)"
            )
        )
        if seen_training and differ:
            return ModeResult(
                [],
                "",
                len(dependent),
                False,
                False,
                f"dlcheck_eval_fn called twice right after model.train(): {ran}, so the mode's effect cannot be told "
                "apart from the eval's own randomness",
            )
        return ModeResult(
            [],
            f"dlcheck_eval_fn called twice right after model.train(): {ran}, "
            + (f"no BatchNorm running mean moved ({len(bn)} tracked), " if bn else "")
            + same,
            len(dependent),
            False,
            False,
        )
    lines = []
    if seen_training:
        lines.append(
            f"dlcheck_eval_fn ran {len(_named(seen_training))} of {len(_named(dependent))} modules whose forward "
            f"depends on the mode in training mode: {_kinds(_named(seen_training))}; called right after model.train(), "
            "as in a training loop"
        )
    if moved:
        worst = max(moved, key=lambda x: x[1])
        lines.append(
            f"it moved the BatchNorm running_mean of {len(moved)} of {len(bn)} layers (max |Δ| {worst[1]:.3g} "
            f"in {worst[0]})"
        )
    if error is not None:
        lines.append(
            f"dlcheck_eval_fn raised {type(error).__name__}: {str(error)[:160]} — with the model still in "
            "training mode (called after model.train(), as in a training loop)"
        )
    elif differ:
        parts = []
        if d_ret is not None and d_ret > 0:
            parts.append(
                f"dlcheck_eval_fn returned {_shown(returned[0])} then {_shown(returned[1])}"
                if not math.isinf(d_ret)
                else "dlcheck_eval_fn's results differ in shape"
            )
        if d_out is not None and d_out > 0:
            parts.append(f"the model's outputs differ by max |Δ| {'(shape)' if math.isinf(d_out) else f'{d_out:.3g}'}")
        lines.append(
            "two evals of the same weights on the same "
            + ("2 examples" if not isinstance(loader, list) else "first batch of your eval loader")
            + " give different results: "
            + "; ".join(parts)
            + ("; in eval mode the same two evals agree" if confirmed else "")
        )
    norms = (torch.nn.modules.batchnorm._BatchNorm, torch.nn.modules.instancenorm._InstanceNorm)
    norm_seen = bool(moved) or any(isinstance(modules[n], norms) for n in seen_training)
    drop_seen = any(not isinstance(modules[n], norms) for n in seen_training)
    return ModeResult(lines, "", len(dependent), drop_seen, norm_seen)


@check(
    "V2",
    domain="vision",
    title="random augmentation at eval, or eval without model.eval()",
    optional_roles=("eval_dataset", "eval_dataloader", "eval_transform", "model", "eval_fn"),
    settings=(
        Setting(
            "atol",
            1e-6,
            "largest pixel difference between two reads of one eval example that still counts "
            "as identical (deterministic transforms reproduce exactly)",
        ),
    ),
)
def check_eval_determinism(dlcheck):
    """Evaluation is deterministic: the eval transform has no randomness and the model runs in eval mode.

    What it does
        Two halves. The eval transform (image or video data only): reads up to 3 evaluation examples twice each
        under different seeds (dlcheck_eval_dataset, or the eval dataloader's dataset; else runs
        dlcheck_eval_transform twice on one synthetic image) and fails when the two reads differ, naming
        the random transforms found in the eval transform. An eval dataset that can only be iterated (an
        IterableDataset, also one that defines ``__len__`` as torchtext's datapipes do) is never indexed: its first 3
        examples are iterated twice, and a difference between the two passes is said not judged (a random transform
        and an order drawn anew at every iteration are not told apart). The model's mode during your eval (any model: an
        image model, a token model such as a GPT, anything): with dlcheck_model and dlcheck_eval_fn, calls
        eval_fn(model, loader) twice on the same 2 eval examples and the same weights, each time right after
        model.train() (as a training loop would; ``loader`` is a DataLoader over those 2 examples whose
        ``.dataset`` reads as your eval dataset object, 2 examples long, its other attributes yours (an
        evaluate that reads ``loader.dataset.samples`` or ``.classes``, as torchvision's video reference does,
        works), with your loader's collate_fn, batch size (up to 2) and workers settings, inside your own
        loader wrapper when the eval loader is one, such as timm's PrefetchLoader that converts and normalises
        the batches; a list holding the first batch of your eval loader when its dataset cannot be indexed), with
        forward pre-hooks on every module whose
        forward depends on the mode: the Dropout family with p > 0, a dropout rate held as a number and
        applied only while ``self.training`` (nn.MultiheadAttention's ``dropout``, nanoGPT's and
        transformers' attention dropout handed to scaled_dot_product_attention, a layerdrop, DropPath,
        StochasticDepth), BatchNorm/InstanceNorm with running statistics, and a module whose forward reads
        ``self.training`` otherwise (a torchvision detector returns losses in training mode). Fails when a
        Dropout or BatchNorm ran in training mode during the eval, a BatchNorm running mean moved, the eval
        raised in training mode, or another of those modules ran in training mode and the two evals gave
        different results while the same two evals in eval mode agree; the evidence names the modules and
        the two evals' results. The model's weights, buffers and modes are restored.
        V2 is a check of the vision domain: it runs under --dlcheck=vision, --dlcheck=all or --dlcheck=V2,
        not under --dlcheck=llm, although its model.eval() half judges a language model's eval as well.
    Why it is bad
        A random crop or flip at eval makes the metric noisy and biased (objects cropped away), and a
        model evaluated in training mode uses batch statistics and active dropout: every evaluation scores a
        randomly thinned model (two evaluations of the same weights disagree, the eval loss is too high), and
        BatchNorm updates its running statistics with eval data, corrupting the model it is measuring. A
        train/eval split made with random_split of one dataset shares the train transform silently.
    Example
        eval_tf = T.Compose([T.ToImage(), T.RandomResizedCrop(224), T.ToDtype(torch.float32, scale=True)])
        def evaluate(model, loader):          # no model.eval(): pytorch/examples minGPT-ddp's test epoch
            with torch.no_grad(): return [model(x, y)[1].item() for x, y in loader]
    Use instead
        eval_tf = T.Compose([T.ToImage(), T.Resize(256), T.CenterCrop(224), T.ToDtype(torch.float32, scale=True), T.Normalize(...)])
        (timm: create_transform(**cfg, is_training=False)); give the eval split its own dataset object;
        call model.eval() (with torch.no_grad() or torch.inference_mode()) at the start of evaluate, and
        model.train() after it (nanoGPT's estimate_loss does both).
    Known problems
        Test-time augmentation on purpose should ignore V2. Without dlcheck_eval_fn the eval-mode half is
        not checked: the model's mode during your eval loop cannot be seen otherwise (a Trainer's or
        Lightning's own evaluation sets eval mode itself; a distributed dlcheck_dist_eval is not called by
        V2). An eval that draws at random itself (sampled generations) while only a module holding a dropout
        rate ran in training mode is not judged: the mode's effect cannot be told apart from its own draws.
        Dropout kept active at eval on purpose (Monte Carlo dropout) should ignore V2. The loader V2 hands
        your eval function is its own (2 examples; ``isinstance(loader.dataset, YourDataset)`` is false): an
        exception your eval function raises on it is reported as an internal error of pytest-dlcheck naming
        that loader, never as your dlcheck_eval_fn's error. The eval transform half reads images (C, H, W) and
        video clips (C, T, H, W).
    Not applicable
        Data without images (a language model's token batches, tabular rows) when no dlcheck_eval_fn is
        given, or when dlcheck_model has no module whose forward depends on the mode (no dropout with p > 0,
        no BatchNorm with running statistics); and a diffusion training without eval data: it evaluates by
        sampling, with no eval split or eval transform.
    """
    tol = dlcheck.setting("atol")
    model, eval_fn = dlcheck.role("model"), dlcheck.role("eval_fn")
    has_eval = any(dlcheck.has(r) for r in ("eval_dataset", "eval_dataloader", "eval_transform"))
    if not has_eval and not (model is not MISSING and eval_fn is not MISSING):
        marker = V.diffusion_marker(dlcheck)
        if marker is not None:
            dlcheck.not_applicable(
                f"a diffusion training ({marker}) without eval data: it evaluates by sampling, with no eval "
                "split or eval transform"
            )
        V.get_vision_sample(dlcheck, "train", required=False)  # not applicable when the data holds no image
    reads = _transform_reads(dlcheck, tol)
    transform_undecided = reads if isinstance(reads, Undecided) else None
    if transform_undecided is not None:
        dlcheck.not_judged("the eval transform", transform_undecided)
        reads = None
    no_image = reads if isinstance(reads, str) else None
    if no_image is not None:
        reads = None
        if model is MISSING or eval_fn is MISSING:
            dlcheck.not_applicable(no_image)
    mode = _mode_problems(dlcheck, model, eval_fn) if model is not MISSING and eval_fn is not MISSING else None
    if mode is not None and mode[2] == 0:
        # no module of the model behaves differently in train and eval mode: whether the eval sets eval mode
        # changes nothing it computes
        constant = (
            f"dlcheck_model ({type(model).__name__}) has no module whose forward depends on train/eval mode (no "
            "dropout with p > 0, no BatchNorm with running statistics): whether dlcheck_eval_fn calls model.eval() "
            "changes nothing"
        )
        if reads is None:
            dlcheck.not_applicable(f"{no_image}; and {constant}" if no_image else constant)
        mode = ModeResult([], constant, 0, False, False)
    if mode is not None and mode.undecided:
        if reads is None:
            dlcheck.skip(f"{mode.undecided}; V2 could not decide" + (f" ({no_image})" if no_image else ""))
        dlcheck.not_judged("the model's mode during dlcheck_eval_fn", mode.undecided)
        mode = None
        eval_mode_undecided = True
    else:
        eval_mode_undecided = False
    if reads is None and mode is None:
        if transform_undecided is not None:
            dlcheck.skip(
                f"{transform_undecided}; "
                + (
                    f"{_define_mode_roles(model, eval_fn)} would let V2 check model.eval()"
                    if model is MISSING or eval_fn is MISSING
                    else "your eval function's model mode was not measured"
                )
            )
        if no_image is not None:
            dlcheck.skip(
                f"{no_image}, and V2 found no eval batch to call dlcheck_eval_fn on: your eval function's model mode "
                "was not measured"
            )
        if has_eval:
            # the eval data is given: data without images is not V2's (said so), never a missing role
            V.get_vision_sample(dlcheck, "eval", required=False)
            V.get_vision_sample(dlcheck, "train", required=False)
            dlcheck.skip(
                "V2 could not read the eval examples twice (nor an eval transform to run on an image); "
                + (
                    f"{_define_mode_roles(model, eval_fn)} would let it check model.eval()"
                    if model is MISSING or eval_fn is MISSING
                    else "your eval function's model mode was not measured"
                )
            )
        dlcheck.skip(
            "missing role: define fixture dlcheck_eval_dataloader or dlcheck_eval_dataset (or "
            "dlcheck_eval_transform)"
            + (
                f"; {_define_mode_roles(model, eval_fn)} to check model.eval()"
                if model is MISSING or eval_fn is MISSING
                else ""
            )
        )
    evidence: list[str] = []
    cause = fix = ""
    if reads is not None and reads[0]:
        evidence += reads[0]
        tf = dlcheck.role("eval_transform")
        randoms = V.random_transforms(tf) if tf is not MISSING else []
        if randoms:
            evidence.append("random transforms in the eval transform: " + "; ".join(V.short(r, 70) for r in randoms))
        train_ds, eval_ds = V.map_dataset(dlcheck, "train"), V.map_dataset(dlcheck, "eval")
        shared = (
            train_ds is not None
            and eval_ds is not None
            and train_ds is not eval_ds
            and V.base_dataset(train_ds) is V.base_dataset(eval_ds)
        )
        if shared:
            evidence.append("the eval and train splits are Subsets of one dataset object, so they share its transform")
            cause = (
                "the eval split is a Subset of the training dataset (random_split) and inherits its random augmentation"
            )
            fix = (
                "build the eval dataset separately with a deterministic transform (e.g. two dataset objects with "
                "transform=train_tf / eval_tf, then Subset each with the same indices)"
            )
        elif (
            tf is MISSING
            and eval_ds is not None
            and all(getattr(V.base_dataset(eval_ds), a, None) is None for a in ("transform", "transforms"))
        ):
            # no transform to blame: the dataset's own __getitem__ draws (a siamese pair, a sampled crop)
            evidence.append(
                f"the eval dataset ({type(V.base_dataset(eval_ds)).__name__}) has no transform: the draw is in the "
                "dataset itself"
            )
            cause = (
                "the eval dataset draws at random on every read of an index (its __getitem__ picks a pair, an offset "
                "or a sample from a random generator), so each evaluation scores other examples"
            )
            fix = (
                "draw the eval examples once, with a seeded generator, when the eval dataset is built (e.g. the pairs "
                "in __init__ from random.Random(seed)), so that index i is the same example on every pass"
            )
        else:
            what = ", ".join(sorted({type(r).__name__ for r in randoms})) or "a random transform"
            cause = f"the eval transform applies {what}, so the same image gives a different input on every pass"
            fix = (
                "use a deterministic eval transform: T.Resize(size) + T.CenterCrop(crop) instead of "
                "RandomResizedCrop, no flips/jitter (timm: create_transform(**data_cfg, is_training=False))"
            )
    if mode is not None and mode[0]:
        evidence += mode[0]
        m_cause = (
            "the eval function runs the model in training mode (it never calls model.eval()): "
            + ", ".join(
                x
                for x in (
                    "dropout stays active, so every evaluation scores a randomly thinned model and two evaluations "
                    "of the same weights disagree"
                    if mode[3]
                    else "",
                    "BatchNorm normalises with the eval batch's own statistics and updates its running statistics "
                    "with eval data, corrupting the model it measures"
                    if mode[4]
                    else "",
                )
                if x
            )
            if mode[3] or mode[4]
            else "the eval function runs the model in training mode (it never calls model.eval()), where it computes "
            "otherwise than in eval mode"
        )
        m_fix = (
            "call model.eval() at the start of the eval function (with torch.no_grad() or torch.inference_mode()), "
            "and model.train() again after it, before training resumes"
        )
        cause = f"{cause}; and {m_cause}" if cause else m_cause
        fix = f"{fix}; and {m_fix}" if fix else m_fix
    if evidence:
        dlcheck.fail(evidence, cause, fix)
    lines = [x for x in (reads[1] if reads else "", mode[1] if mode else "") if x]
    if no_image is not None:
        lines.append(f"the eval transform half does not concern this pipeline: {no_image}")
    elif reads is None and transform_undecided is None:
        lines.append("the eval transform was not checked: define dlcheck_eval_dataset or dlcheck_eval_transform")
    if mode is None and not eval_mode_undecided:
        lines.append(
            "model.eval() was not checked: "
            + (
                "no eval batch to call dlcheck_eval_fn on"
                if model is not MISSING and eval_fn is not MISSING
                else _define_mode_roles(model, eval_fn)
            )
        )
    dlcheck.measured(
        *lines,
        eval_reads_identical=reads is not None,
        eval_fn_in_eval_mode=mode is not None,
    )


def _define_mode_roles(model: Any, eval_fn: Any) -> str:
    """The roles the eval-mode half still needs, named as they are missing (dlcheck_model was given: only
    dlcheck_eval_fn)."""
    missing = [name for name, value in (("dlcheck_model", model), ("dlcheck_eval_fn", eval_fn)) if value is MISSING]
    return "define " + " and ".join(missing)
