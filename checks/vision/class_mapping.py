from __future__ import annotations

from typing import Any

from ...errors import MISSING
from ...registry import check
from . import measure as V


def _unwrap(data: Any) -> Any:
    """The dataset under Subset / ConcatDataset-free wrappers, and under a DataLoader."""
    seen = 0
    while data is not None and seen < 8:
        seen += 1
        if hasattr(data, "class_to_idx") or hasattr(data, "features") or hasattr(data, "classes"):
            return data
        inner = getattr(data, "dataset", None)
        if inner is None or inner is data:
            return data
        data = inner
    return data


def class_mapping(data: Any) -> tuple[dict[str, int], str] | None:
    """(class name -> index, where it was read) for a torchvision ImageFolder-style dataset (class_to_idx, or
    classes), or a Hugging Face dataset whose label column is a ClassLabel; None when it names no classes."""
    data = _unwrap(data)
    if data is None:
        return None
    mapping = getattr(data, "class_to_idx", None)
    if isinstance(mapping, dict) and mapping:
        return {str(k): int(v) for k, v in mapping.items()}, f"{type(data).__name__}.class_to_idx"
    features = getattr(data, "features", None)
    if features is not None and hasattr(features, "items"):
        for name, feature in features.items():
            names = getattr(feature, "names", None)
            if isinstance(names, list) and names and type(feature).__name__ == "ClassLabel":
                return {str(n): i for i, n in enumerate(names)}, f"the '{name}' ClassLabel's names"
    classes = getattr(data, "classes", None)
    if isinstance(classes, (list, tuple)) and classes and all(isinstance(c, str) for c in classes):
        return {c: i for i, c in enumerate(classes)}, f"{type(data).__name__}.classes"
    return None


def _source(dlcheck, *names: str) -> tuple[Any, str] | None:
    for name in names:
        value = dlcheck.role(name)
        if value is not MISSING:
            return value, f"dlcheck_{name}"
    return None


@check(
    "V9",
    domain="vision",
    title="the train and eval data number their classes differently",
    optional_roles=("dataset", "dataloader", "eval_dataset", "eval_dataloader"),
)
def check_class_mapping(dlcheck):
    """The class index of every class name is the same in the training and the evaluation data.

    What it does
        Reads the class-name → index mapping of the training and the evaluation data — torchvision's
        ``class_to_idx`` (ImageFolder, DatasetFolder, through Subsets and DataLoaders), a ``classes``
        list, or a Hugging Face dataset's ``ClassLabel`` names — and fails when a class name has another
        index in one than in the other, or a class exists in one only.
    Why it is bad
        ImageFolder numbers classes by sorting the folder names of each split on its own. A class folder
        missing from the validation split (no images of it yet, a typo, a hidden ``.ipynb_checkpoints``
        folder that sorts first) shifts the index of every class after it: the model is evaluated
        against the wrong labels, accuracy looks like chance or a few classes look broken, and nothing
        raises.
    Example
        train = ImageFolder("data/train")   # cat dog fox      -> cat 0, dog 1, fox 2
        val = ImageFolder("data/val")       # dog fox (no cat) -> dog 0, fox 1
    Use instead
        Build the evaluation dataset with the training mapping: subclass ImageFolder and override
        ``find_classes`` to return the training ``classes, class_to_idx`` (or pass
        ``allow_empty=True`` with every class folder present, even empty), and remove stray folders.
    Known problems
        Datasets that name no classes (tensors, custom datasets without ``class_to_idx``/``classes``) are
        not judged; neither is a mapping applied inside a transform.
    Not applicable
        Pipelines whose training or evaluation data name no classes (detection and segmentation sets
        usually, token data, rollouts) — the check skips as not applicable.
    """
    rl_marker = V.rl_marker(dlcheck)
    if rl_marker:
        dlcheck.not_applicable(f"an RL training ({rl_marker}): no image dataset whose classes could be numbered")
    train = _source(dlcheck, "dataset", "dataloader")
    if train is None:
        dlcheck.skip("missing role: define fixture dlcheck_dataset (or dlcheck_dataloader) in conftest.py")
    a = class_mapping(train[0])
    if a is None:
        dlcheck.not_applicable(
            f"{train[1]} names no classes (no class_to_idx, classes or ClassLabel): no class numbering to compare"
        )
    held = _source(dlcheck, "eval_dataset", "eval_dataloader")
    if held is None:
        dlcheck.skip("missing role: define fixture dlcheck_eval_dataset (or dlcheck_eval_dataloader) in conftest.py")
    b = class_mapping(held[0])
    if b is None:
        dlcheck.skip(f"{held[1]} names no classes while {train[1]} does: the numbering cannot be compared")
    (ta, wa), (tb, wb) = a, b
    only_train = sorted(set(ta) - set(tb))
    only_eval = sorted(set(tb) - set(ta))
    moved = [(c, ta[c], tb[c]) for c in sorted(ta, key=ta.get) if c in tb and ta[c] != tb[c]]
    if moved or only_train or only_eval:
        evidence = [f"training data: {len(ta)} classes ({train[1]}, {wa}); evaluation data: {len(tb)} classes "
                    f"({held[1]}, {wb})"]  # fmt: skip
        if only_train:
            evidence.append(f"only in the training data: {', '.join(only_train[:8])}")
        if only_eval:
            evidence.append(f"only in the evaluation data: {', '.join(only_eval[:8])}")
        if moved:
            evidence.append(
                f"{len(moved)} classes have another index: "
                + ", ".join(f"{c!r} train {i} / eval {j}" for c, i, j in moved[:6])
            )
        dlcheck.fail(
            evidence,
            cause="the two splits number their classes independently (ImageFolder sorts each split's own folder "
            "names): a class folder missing or extra in one split shifts every index after it, so the evaluation "
            "labels do not mean what the model was trained on",
            fix="give the evaluation dataset the training mapping: class ValFolder(ImageFolder): def "
            "find_classes(self, directory): return train.classes, train.class_to_idx — and make both splits hold "
            "the same class folders (no stray or hidden ones)",
        )
    dlcheck.measured(
        f"{len(ta)} classes numbered alike in the training ({train[1]}, {wa}) and evaluation data ({held[1]}, {wb})",
        classes=len(ta),
    )
