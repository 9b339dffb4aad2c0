from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from ...errors import MISSING
from ...registry import Setting, check
from ..shared.class_scores import not_class_scores
from ..shared.class_scores import untold as scores_untold
from . import measure as V

CANDIDATES = [(f, n) for n in (False, True) for f in V.BOX_FORMATS]


def _fmt_label(fmt: str, normalized: bool) -> str:
    return fmt + (" normalized to [0, 1]" if normalized else "")


def _validity(
    items: list[V.Item], fmt: str, normalized: bool, tol: float
) -> tuple[int, int, list[tuple[V.Item, Any, str]]]:
    ok = total = 0
    bad = []
    for it in items:
        size = it.size
        xyxy = V.to_xyxy(it.boxes, fmt, size, normalized)
        for raw, why in zip(it.boxes, V.box_problems(xyxy, size, tol)):
            total += 1
            if why:
                bad.append((it, raw, why))
            else:
                ok += 1
    return ok, total, bad


def _label_problem(values: list[int], n: int, where: str, background: bool) -> tuple[list[str], str, str] | None:
    lo = 1 if background else 0
    found = sorted(set(values))
    out = [v for v in found if v < lo or v >= n]
    if not out:
        return None
    shown = ", ".join(map(str, found[:20])) + (" …" if len(found) > 20 else "")
    ev = [f"labels found: {shown}; num_classes {n} ({where})"]
    if background:
        ev[0] += " — torchvision detectors reserve 0 for background, so object labels must be 1.." + str(n - 1)
        if 0 in out:
            cause = "object labels start at 0, which a torchvision detector reads as background: those boxes train as non-objects"
            fix = (
                "shift the labels by one (label + 1, as torchvision's COCO wrapper maps category ids) and build the "
                "model with num_classes = number of object classes + 1"
            )
        else:
            cause = (
                "labels reach num_classes: the category ids are not contiguous or num_classes forgot the "
                "background class"
            )
            fix = f"build the model with num_classes={max(found) + 1} (object classes + background), or remap the category ids to 1..num_classes-1"
        return ev, cause, fix
    n_out = sum(1 for v in values if v < lo or v >= n)
    ev.append(f"{n_out} of {len(values)} sampled labels are outside 0..{n - 1}")
    binary = "one logit" in where  # a one-logit head (BCEWithLogitsLoss): no index into logits, no error raised
    if min(found) >= 1 and max(found) == n:
        ev[0] += " — label 0 never occurs and label " + str(n) + " is past the head"
        cause = (
            "the labels are 1-based but the one-logit head takes 0/1 targets (BCEWithLogitsLoss): label 1 is read as "
            f"the positive class and label {n} is no probability, so the loss trains toward the wrong targets without "
            "an error"
            if binary
            else "the labels are 1-based but the model's head is 0-based: the last class indexes past the logits "
            "(an error on CPU, a device-side assert on CUDA) and logit 0 is never trained"
        )
        fix = (
            "subtract 1 from every label (target_transform=lambda y: y - 1), or map class ids through a dict to 0..C-1"
        )
    elif binary:
        cause = (
            "labels other than 0 and 1 reach a one-logit (binary) head: BCEWithLogitsLoss takes them without an "
            "error and trains toward targets that are no probabilities"
        )
        fix = (
            f"remap the labels to 0/1, or, for {max(found) + 1} classes, build the head with "
            f"num_classes={max(found) + 1} and train it with a cross-entropy"
        )
    else:
        cause = "some labels are outside the head's range: num_classes is too small or the class ids are not remapped"
        fix = f"build the head with num_classes={max(found) + 1} or remap the class ids to 0..{n - 1}"
    return ev, cause, fix


@dataclass
class BoxVerdict:
    """V3's judgement of the sampled detection boxes: the failure (evidence, cause, fix) when they are invalid
    for the model, else what was measured; V4 reads it to stay quiet when V3 names the root cause."""

    failure: tuple[list[str], str, str] | None = None
    passed: list[str] = field(default_factory=list)
    judged: bool = False
    unknown: list[V.Item] = field(default_factory=list)


def box_verdict(det: list[V.Item], model: Any, box_format: Any, tol: float, max_invalid: float) -> BoxVerdict:
    """Judge the boxes of ``det`` (sampled detection items with boxes) in their declared format: a format a
    torchvision detector cannot read, boxes invalid in that format, normalised boxes read as pixels."""
    tv_det = model is not MISSING and V.is_tv_detection(model)
    given = V.parse_box_format(box_format)
    verdict = BoxVerdict()
    # 1. a format that the model cannot read
    if tv_det:
        other = sorted({i.box_format for i in det if i.box_format and i.box_format != "xyxy"})
        declared_other = given is not None and not any(i.box_format for i in det) and given[0] != "xyxy"
        if other or declared_other:
            fmt = other[0] if other else given[0]
            src = "tv_tensors.BoundingBoxes(format=" + fmt.upper() + ")" if other else f"dlcheck_box_format={fmt!r}"
            it = next((i for i in det if i.box_format == fmt), det[0])
            return BoxVerdict(
                failure=(
                    [
                        f"{len(det)} sampled targets carry boxes as {src}; {type(model).__name__} reads target['boxes'] "
                        f"as absolute xyxy",
                        f"{it.where}: box {V.fmt_box(it.boxes[0])} on a {it.size[1]}×{it.size[0]} image",
                    ],
                    f"torchvision detection models take target['boxes'] as [x1, y1, x2, y2] pixels whatever the data's "
                    f"format, so {fmt} boxes are misread",
                    "end the transform with T.ConvertBoundingBoxFormat('XYXY') (or torchvision.ops.box_convert(boxes, "
                    f"'{fmt}', 'xyxy'))",
                )
            )
    # 2. the data against its declared format
    groups: dict[tuple[str, bool], list[V.Item]] = {}
    for it in det:
        if it.box_format:
            groups.setdefault((it.box_format, False), []).append(it)  # BoundingBoxes/COCO: pixels
        elif given is not None:
            groups.setdefault(given, []).append(it)
        elif tv_det:
            groups.setdefault(("xyxy", False), []).append(it)
        else:
            verdict.unknown.append(it)
    for (fmt, normalized), items in groups.items():
        ok, total, bad = _validity(items, fmt, normalized, tol)
        src = items[0].format_source or (
            f"dlcheck_box_format={box_format!r}"
            if given is not None
            else f"{type(model).__name__}, which reads target['boxes'] as xyxy"
        )
        label = _fmt_label(fmt, normalized)
        if (total - ok) / max(total, 1) > max_invalid:
            fits = []
            for cf, cn in CANDIDATES:
                if (cf, cn) == (fmt, normalized):
                    continue
                c_ok, c_total, _ = _validity(items, cf, cn, tol)
                fits.append((c_ok / max(c_total, 1), cf, cn))
            fits.sort(key=lambda x: (-x[0], x[2] != normalized, V.BOX_FORMATS.index(x[1])))
            full = [f for f in fits if f[0] == 1.0]
            ev = [f"{total - ok} of {total} sampled boxes are invalid read as {label} (declared by {src}):"]
            for it, raw, why in bad[:3]:
                h, w = it.size or ("?", "?")
                ev.append(f"  {it.where}: box {V.fmt_box(raw)} on a {w}×{h} image: {why}")
            if full:
                best = full[0]
                ev.append(
                    f"these look like {_fmt_label(best[1], best[2])}: all {total} boxes are valid read that way"
                    + (f" (also as {', '.join(_fmt_label(f[1], f[2]) for f in full[1:])})" if len(full) > 1 else "")
                )
                real = best[1]
                cause = (
                    f"the boxes are [{'x, y, w, h' if real == 'xywh' else 'cx, cy, w, h' if real == 'cxcywh' else 'x1, y1, x2, y2'}]"
                    f"{' in [0, 1]' if best[2] else ''} but are read as {label}"
                )
                if best[2] and not normalized:
                    fix = (
                        "scale them to pixels (boxes * [W, H, W, H]) and convert with torchvision.ops.box_convert(boxes, "
                        f"'{real}', '{fmt}')"
                        if real != fmt
                        else "scale them to pixels: boxes * torch.tensor([W, H, W, H])"
                    )
                else:
                    fix = (
                        f"convert them: torchvision.ops.box_convert(boxes, '{real}', '{fmt}'), or wrap them as "
                        f"tv_tensors.BoundingBoxes(boxes, format='{real.upper()}', canvas_size=(H, W)) and add "
                        f"T.ConvertBoundingBoxFormat('{fmt.upper()}')"
                    )
                    if given is not None and not tv_det:
                        fix += f"; or declare dlcheck_box_format = {real!r}"
            else:
                ev.append(
                    "no single format fits every box: "
                    + ", ".join(f"{_fmt_label(f[1], f[2])} {100 * f[0]:.0f}%" for f in fits[:3])
                )
                cause = "some boxes are degenerate or outside their image: corrupt annotations, or boxes not moved with a resize/crop"
                fix = (
                    "drop degenerate boxes (T.SanitizeBoundingBoxes()), clamp them to the image "
                    "(T.ClampBoundingBoxes()), and transform boxes together with the image (tv_tensors.BoundingBoxes)"
                )
            return BoxVerdict(failure=(ev, cause, fix))
        verdict.judged = True
        verdict.passed.append(
            f"{total} boxes of {len(items)} sampled images are valid read as {label} (declared by {src}): "
            f"x2 > x1, y2 > y1, inside the image ± {tol:g}"
        )
        if not normalized:
            coords = [float(i.boxes.abs().max()) for i in items]
            sizes = [min(i.size) for i in items if i.size]
            if coords and max(coords) <= 1.0 + 1e-6 and sizes and min(sizes) >= 16:
                it = items[0]
                return BoxVerdict(
                    failure=(
                        [
                            f"every coordinate of the {total} sampled boxes is <= 1.0 while the images are "
                            f"{it.size[1]}×{it.size[0]} or larger",
                            f"  {it.where}: box {V.fmt_box(it.boxes[0])}",
                        ],
                        f"the boxes are normalised to [0, 1] but read as {fmt} in pixels: every box is a speck in the "
                        "image's top-left corner",
                        "scale them to pixels: boxes * torch.tensor([W, H, W, H]) (or declare a '-normalized' "
                        "dlcheck_box_format for a model that takes normalised boxes)",
                    )
                )
    return verdict


@check(
    "V3",
    domain="vision",
    title="box format, box scale or class ids do not match the model",
    optional_roles=("dataset", "dataloader", "model", "box_format", "num_classes"),
    settings=(
        Setting(
            "edge_tolerance",
            0.02,
            "boxes may exceed the image by this share of its side (+1 px) before they "
            "count as outside; annotation tools round and jitter box edges by a pixel or so",
        ),
        Setting(
            "max_invalid_share",
            0.0,
            "share of sampled boxes allowed to be invalid in the declared format; 0 "
            "because torchvision detectors reject degenerate boxes and one inverted box is already a format bug",
        ),
    ),
)
def check_boxes_labels(dlcheck):
    """Boxes obey the declared format and lie in the image; class ids fit the model's head.

    What it does
        On the sampled detection targets, reads each box in its declared format — the format of a
        ``tv_tensors.BoundingBoxes``, else ``dlcheck_box_format``, else absolute xyxy when the model is a
        torchvision detector — and checks x2 > x1, y2 > y1 and that it lies in its image (± 2 %). When
        the declared format is contradicted, every format (xyxy, xywh, cxcywh, absolute or normalised)
        is tried and the ones the data fits are named. Also fails when boxes of another format reach a
        torchvision detector, when all coordinates are <= 1 (normalised) for an absolute format, and
        when labels fall outside the head: 0..C-1 for classification, 1..C-1 for torchvision detectors
        whose class 0 is background (C from dlcheck_num_classes or the model's head).
    Why it is bad
        COCO boxes are [x, y, w, h]; read as [x1, y1, x2, y2] they are inverted or shrunk, and the
        detector learns the wrong regions (or raises on degenerate boxes after the first hours of data
        loading). 1-based labels with a 0-based head index past the logits; 0-based labels given to a
        torchvision detector train the first class as background.
    Example
        boxes = torch.tensor([a["bbox"] for a in anns])        # COCO xywh, fed to FasterRCNN as xyxy
        target_transform=lambda y: y + 1                       # 1..C labels for resnet18(num_classes=C)
    Use instead
        torchvision.ops.box_convert(boxes, "xywh", "xyxy"), or tv_tensors.BoundingBoxes(boxes,
        format="XYWH", canvas_size=(H, W)) + T.ConvertBoundingBoxFormat("XYXY"); labels 0..C-1 for
        classifiers, 1..C-1 with num_classes = classes + 1 for torchvision detectors.
    Known problems
        Plain-tensor boxes with no dlcheck_box_format and a model that is not a torchvision detector
        cannot be judged (skip). A Lightning module's number of classes is read from its forward's output
        inside its own training_step (its forward may take what the step makes of the images, never the
        images themselves; a training_step that calls a child, ``self.model(images)``, is read from it). Without a
        training whose loss shows whether the model's output is class scores (no dlcheck_make_training /
        LightningModule / Trainer, or a loss that cannot be replayed), the output is taken for them and the pass says
        so. A dataset whose sampled boxes are all valid in the wrong format too
        (x2 > x1 by chance on every box) passes; the sample size (--dlcheck-samples) helps.
    Not applicable
        Segmentation (V5 judges mask values), data without targets (a diffusion or self-supervised
        training), self-supervised multi-view examples (a list of augmented crops of each image, collated into one (B, C, H, W) batch per view: SimCLR, BYOL, DINO, SwAV), whose labels, when the dataset yields any, train no class output, vision-language batches (token targets), and data without images; a training whose loss does
        not read the labels the batches carry (an autoencoder, a VAE: its loss is the same, to the bit, with them
        shuffled among the batch's examples, both computed from the same random state); a model whose output your
        loss does not read as class scores (an embedding under a triplet or contrastive loss: replayed on outputs put
        in place of the model's, the loss is no cross-entropy of them), unless dlcheck_num_classes declares classes.
        Class labels, without dlcheck_num_classes, when the training's own loss or step calls the model on
        something other than the batch (a GAN's generator on the noise its step draws, learnt from one call of
        the step): the model predicts nothing about the images, there is no head to read, and V3 never hands it
        an image. A loss that mixes the batch's images among themselves before calling the model (Mixup/CutMix
        inside the loss, timm's ``Mixup``: each row of the model's input lies, element by element, between two of
        the batch's images) calls it on the batch's images: their class ids are judged.
    """
    sample = V.get_vision_sample(dlcheck, "train")
    V.require_task(dlcheck, sample, ("detection", "classification"), "boxes and class ids")
    unused = V.labels_not_trained(dlcheck)
    if unused:
        dlcheck.not_applicable(f"V3 judges class ids against the model's head; {unused}")
    model = dlcheck.role("model")
    elsewhere = None if sample.of_kind("detection") or dlcheck.has("num_classes") else V.model_elsewhere(dlcheck)
    if elsewhere is not None:
        # a GAN's generator, called on the noise its step draws: no head over the images' classes to read
        dlcheck.not_applicable(
            f"V3 judges class ids against the model's head, and {elsewhere}: its output is no prediction about the "
            "batch's images, so there is no head over their classes to read (dlcheck_num_classes would give the "
            "number of classes to judge the labels against)"
        )
    tv_det = model is not MISSING and V.is_tv_detection(model)
    n_classes, where = V.num_classes(dlcheck, sample)
    tol = dlcheck.setting("edge_tolerance")
    judged = False
    passed: list[str] = []  # what a pass measured

    det = [i for i in sample.of_kind("detection") if i.boxes is not None and len(i.boxes)]
    if det:
        verdict = box_verdict(det, model, dlcheck.role("box_format"), tol, dlcheck.setting("max_invalid_share"))
        if verdict.failure is not None:
            dlcheck.fail(*verdict.failure)
        judged = verdict.judged
        passed += verdict.passed
        unknown = verdict.unknown
        # 3. labels of detection targets
        values = [int(v) for i in det if i.labels is not None for v in i.labels.tolist()]
        if values and n_classes is not None:
            judged = True
            problem = _label_problem(values, n_classes, where, background=tv_det)
            if problem:
                dlcheck.fail(*problem)
            lo = 1 if tv_det else 0
            passed.append(
                f"{len(values)} box labels ({min(values)}–{max(values)}) lie in {lo}..{n_classes - 1} "
                f"(num_classes {n_classes} from {where}"
                + ("; 0 is a torchvision detector's background" if tv_det else "")
                + ")"
            )
        elif values:
            passed.append(
                f"{len(values)} box labels not judged: the number of classes is unknown (define dlcheck_num_classes)"
            )
            dlcheck.not_judged("box labels", "the number of classes is unknown (define dlcheck_num_classes)")
        if not judged and unknown:
            dlcheck.skip(
                "missing role: define fixture dlcheck_box_format ('xyxy', 'xywh' or 'cxcywh') in conftest.py: the "
                "boxes are plain tensors and nothing declares their format"
            )
        if unknown:
            passed.append(f"{len(unknown)} images with plain-tensor boxes of undeclared format not judged")
            dlcheck.not_judged(
                "boxes",
                f"{len(unknown)} images hold plain-tensor boxes of undeclared format (define dlcheck_box_format)",
            )
        boxes = sum(len(i.boxes) for i in det)
        dlcheck.measured(*passed, images=len(det), boxes=boxes, labels=len(values), num_classes=n_classes)
        return

    cls = [i for i in sample.of_kind("classification") if i.label is not None]
    if cls:
        declared = where == "dlcheck_num_classes"
        # an embedding (a 128-d output under a triplet loss) is no row of 128 class scores: the user's loss, replayed
        # on outputs put in place of the model's, tells when it can
        other = None if declared else not_class_scores(dlcheck)
        if other:
            dlcheck.not_applicable(f"V3 judges class ids against the classes of the model's output; {other}")
        if n_classes is None:
            dlcheck.skip(
                "missing role: the number of classes is unknown: define fixture dlcheck_num_classes"
                + (
                    " (or dlcheck_model)"
                    if not dlcheck.has("model")
                    else " (your model's output is no row of class scores per image to read them from)"
                )
                + " in conftest.py"
            )
        labels, source, _ = V.label_population(dlcheck, sample, V.LABEL_SAMPLES)
        values = list(labels) or [i.label for i in cls]
        problem = _label_problem(values, n_classes, where, background=False)
        if problem:
            ev, cause, fix = problem
            ev[-1] = ev[-1].replace("sampled labels", f"labels ({source or sample.source})")
            bad = next((i for i in cls if i.label < 0 or i.label >= n_classes), None)
            if bad is not None:
                ev.append(f"e.g. {bad.where}: label {bad.label}")
            dlcheck.fail(ev, cause, fix)
        found = sorted(set(values))
        untold = None if declared else scores_untold(dlcheck)
        dlcheck.measured(
            f"{len(values)} labels ({source or sample.source}) take {len(found)} values {min(found)}–{max(found)}, "
            f"all in 0..{n_classes - 1} (num_classes {n_classes} from {where})",
            *(
                [f"the model's output is taken for class scores; whether the loss reads it so was not told: {untold}"]
                if untold
                else []
            ),
            labels=len(values),
            min_label=min(found),
            max_label=max(found),
            num_classes=n_classes,
        )
        return
    dlcheck.skip(
        f"the sampled {sample.task} targets carry no boxes or class labels ({sample.source}: target "
        f"{V.type_name(sample.items[0].target)})"
    )
