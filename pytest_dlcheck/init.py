"""``pytest --dlcheck-init``: a starter conftest.py for the kind of training the project's source shows.

The source is scanned, never imported: a LightningModule subclass is a Lightning project, a transformers /
TRL ``Trainer(`` one a Trainer project, ``Accelerator(`` an Accelerate loop, a ``.backward(`` a plain loop.
A top-level function that builds the object (its body constructs it) fills the role; a role the scan could
not fill is written commented out, marked TODO, so that the checks needing it say "missing role" until it
is filled. An existing conftest.py is never overwritten."""

from __future__ import annotations

import ast
import re
from dataclasses import dataclass, field
from pathlib import Path

import pytest

SKIP_DIRS = {"node_modules", "site-packages", "build", "dist", "__pycache__", "venv", "env", "htmlcov"}
MAX_FILES = 2000
MAX_BYTES = 1_000_000

HF_TRAINER = re.compile(r"\b(?:SFT|DPO|GRPO|PPO|ORPO|KTO|Reward|Seq2Seq)?Trainer\(")
LIGHTNING = re.compile(r"\bLightningModule\b")
ACCELERATE = re.compile(r"\bAccelerator\(")
PLAIN = re.compile(r"\.backward\(")
DATALOADER = re.compile(r"\bDataLoader\(")

DOMAINS = {"trainer": "llm,train,ckpt,smoke", "lightning": "train,ckpt,smoke", "accelerate": "train,ckpt,smoke"}
KIND_WORDS = {
    "trainer": "a transformers / TRL Trainer",
    "lightning": "a Lightning module",
    "accelerate": "an Accelerate training loop",
    "plain": "a plain PyTorch training loop",
}


@dataclass
class Source:
    path: Path
    module: str
    text: str
    tree: ast.Module | None

    @property
    def is_test(self) -> bool:
        return self.path.name.startswith("test_") or self.path.name.endswith("_test.py") or "tests" in self.path.parts


@dataclass
class Found:
    kind: str
    where: list[Path] = field(default_factory=list)
    roles: dict[str, str] = field(default_factory=dict)  # role -> the fixture's source
    todo: dict[str, str] = field(default_factory=dict)  # role -> what to hand over (written commented out)


def _module_name(root: Path, path: Path) -> str:
    parts = list(path.relative_to(root).with_suffix("").parts)
    if parts and parts[0] == "src":
        parts = parts[1:]
    if parts and parts[-1] == "__init__":
        parts = parts[:-1]
    return ".".join(parts)


def _sources(root: Path) -> list[Source]:
    out: list[Source] = []
    stack = [root]
    while stack and len(out) < MAX_FILES:
        here = stack.pop()
        try:
            entries = sorted(here.iterdir())
        except OSError:
            continue
        for entry in entries:
            if entry.is_dir():
                if not entry.name.startswith(".") and entry.name not in SKIP_DIRS and not entry.is_symlink():
                    stack.append(entry)
            elif entry.suffix == ".py" and entry.name != "conftest.py":
                try:
                    if entry.stat().st_size > MAX_BYTES:
                        continue
                    text = entry.read_text(encoding="utf-8", errors="replace")
                except OSError:
                    continue
                try:
                    tree = ast.parse(text)
                except SyntaxError:
                    tree = None
                out.append(Source(entry, _module_name(root, entry), text, tree))
    out.sort(key=lambda s: (s.is_test, str(s.path)))
    return out


def _builders(sources: list[Source], pattern: re.Pattern) -> list[tuple[Source, ast.FunctionDef]]:
    """Top-level functions whose body matches ``pattern`` (e.g. constructs a Trainer)."""
    out = []
    for src in sources:
        for node in src.tree.body if src.tree else []:
            if isinstance(node, ast.FunctionDef) and pattern.search(ast.get_source_segment(src.text, node) or ""):
                out.append((src, node))
    return out


def _required(node: ast.FunctionDef) -> list[str]:
    args = node.args
    positional = args.posonlyargs + args.args
    required = [a.arg for a in positional[: len(positional) - len(args.defaults)]]
    required += [a.arg for a, d in zip(args.kwonlyargs, args.kw_defaults) if d is None]
    return required


def _call_fixture(role: str, src: Source, name: str, required: list[str]) -> str:
    """A session fixture importing ``name`` from the module and calling it."""
    wants_tmp = "tmp_path_factory" in required
    others = [a for a in required if a != "tmp_path_factory"]
    call = f"{name}(tmp_path_factory)" if wants_tmp and not others else f"{name}()"
    note = f"  # TODO: {name} takes ({', '.join(required)}): pass your run's values" if others else ""
    param = "tmp_path_factory" if wants_tmp else ""
    return (
        f'@pytest.fixture(scope="session")\n'
        f"def dlcheck_{role}({param}):\n"
        f"    from {src.module} import {name}\n\n"
        f"    return {call}{note}\n"
    )


def _classes(sources: list[Source], base: str) -> list[tuple[Source, ast.ClassDef]]:
    out = []
    for src in sources:
        for node in src.tree.body if src.tree else []:
            if isinstance(node, ast.ClassDef):
                names = [ast.unparse(b).rpartition(".")[2] for b in node.bases]
                if base in names:
                    out.append((src, node))
    return out


def _init_required(node: ast.ClassDef) -> list[str] | None:
    for item in node.body:
        if isinstance(item, ast.FunctionDef) and item.name == "__init__":
            return [a for a in _required(item) if a != "self"]
    return None  # inherited: unknown


def detect(root: Path) -> Found:
    sources = _sources(root)

    def where(pattern: re.Pattern) -> list[Path]:
        return [s.path for s in sources if pattern.search(s.text)]

    if where(LIGHTNING):
        found = Found("lightning", where(LIGHTNING))
        modules = _classes(sources, "LightningModule")
        datamodules = _classes(sources, "LightningDataModule")
        names = "|".join(re.escape(c.name) for _, c in modules)
        made = _builders(sources, re.compile(rf"\b(?:{names})\(")) if modules else []
        if made:
            src, fn = made[0]
            found.roles["lightning_module"] = _call_fixture("lightning_module", src, fn.name, _required(fn))
        elif modules:
            src, cls = modules[0]
            found.roles["lightning_module"] = _call_fixture(
                "lightning_module", src, cls.name, _init_required(cls) or []
            )
        else:
            found.todo["lightning_module"] = "your LightningModule, built as your training script builds it"
        if datamodules:
            src, cls = datamodules[0]
            found.roles["datamodule"] = _call_fixture("datamodule", src, cls.name, _init_required(cls) or [])
        else:
            found.todo["datamodule"] = "your LightningDataModule (or dlcheck_dataloader: the training DataLoader)"
        return found
    if where(HF_TRAINER):
        found = Found("trainer", where(HF_TRAINER))
        made = _builders(sources, HF_TRAINER)
        if made:
            src, fn = made[0]
            found.roles["trainer"] = _call_fixture("trainer", src, fn.name, _required(fn))
        else:
            found.todo["trainer"] = (
                "the Trainer your script builds (model, args, processing_class, datasets), e.g. moved into a "
                "function build_trainer(tmp_path_factory) returning it"
            )
        return found
    kind = "accelerate" if where(ACCELERATE) else "plain"
    found = Found(kind, where(ACCELERATE if kind == "accelerate" else PLAIN))
    loaders = _builders(sources, DATALOADER)
    factories = [
        (s, f)
        for s, f in _builders(sources, re.compile(r"[\"']model[\"']"))
        if re.search(r"[\"']optimizer[\"']", ast.get_source_segment(s.text, f) or "")
    ]
    if factories:
        src, fn = factories[0]
        found.roles["make_training"] = (
            f'@pytest.fixture(scope="session")\n'
            f"def dlcheck_make_training():\n"
            f"    from {src.module} import {fn.name}\n\n"
            f"    return {fn.name}  # called by the checks for fresh objects: a dict with 'model' and 'optimizer'\n"
        )
    else:
        found.todo["make_training"] = (
            "a function returning fresh {'model': ..., 'optimizer': ...} (and 'lr_scheduler', 'loss_fn' if any) "
            "built as your training script builds them"
        )
    if loaders:
        src, fn = loaders[0]
        found.roles["dataloader"] = _call_fixture("dataloader", src, fn.name, _required(fn))
    else:
        found.todo["dataloader"] = "the training DataLoader"
    found.todo["train_step"] = "optional: your step (batch, state) -> loss, if the checks should run your own step"
    return found


def render(root: Path, found: Found) -> str:
    where = ", ".join(str(p.relative_to(root)) for p in found.where[:3])
    where = f"found in {where}" if where else "no training found in the source: a template"
    domains = DOMAINS.get(found.kind, "train,ckpt,smoke")
    src = (
        "The modules are imported from src/: install the package (pip install -e .) or set pythonpath = src "
        "in the pytest ini.\n"
        if any(p.relative_to(root).parts[0] == "src" for p in found.where)
        else ""
    )
    parts = [
        f'"""Written by pytest --dlcheck-init for {KIND_WORDS[found.kind]} ({where}).\n'
        f"Run the checks with: pytest --dlcheck={domains}\n{src}"
        "Roles marked TODO could not be filled from the source: fill them in (the checks needing them skip, "
        'naming the role, until then)."""\n\nimport pytest',
    ]
    for body in found.roles.values():
        parts.append(body.rstrip("\n"))
    for role, what in found.todo.items():
        parts.append(
            f"# TODO dlcheck_{role}: {what}\n"
            f'# @pytest.fixture(scope="session")\n'
            f"# def dlcheck_{role}():\n"
            f"#     return ..."
        )
    return "\n\n\n".join(parts) + "\n"


def write_conftest(config: pytest.Config) -> int:
    root = Path(config.rootpath)
    target = root / "conftest.py"
    found = detect(root)
    text = render(root, found)
    if target.exists():
        print(f"dlcheck-init: {target} exists: not overwritten. The fixtures it would have written:\n")
        print(text)
        return pytest.ExitCode.USAGE_ERROR
    target.write_text(text, encoding="utf-8")
    filled = ", ".join(f"dlcheck_{r}" for r in found.roles) or "none"
    todo = ", ".join(f"dlcheck_{r}" for r in found.todo) or "none"
    print(f"dlcheck-init: wrote {target} for {KIND_WORDS[found.kind]}: filled {filled}; TODO {todo}\n")
    print(text)
    return pytest.ExitCode.OK
