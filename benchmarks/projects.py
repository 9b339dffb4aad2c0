"""The projects the benchmark runs pytest on, written into a scratch directory: a plain test suite, a copy
of an example project with its floor test, an SFT project whose dataset is produced lazily at any size,
and the same project with a ~100M-parameter model."""

from __future__ import annotations

import re
import shutil
import sys
import textwrap
from dataclasses import dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
EXAMPLES = REPO / "examples"
#: modules put on the benchmarked runs' PYTHONPATH: the probe plugin and the floor step
INJECT = Path(__file__).resolve().parent / "inject"
if str(INJECT) not in sys.path:
    sys.path.insert(0, str(INJECT))

import dlbench_floor

FLOOR_TEST = "test_dlbench_floor.py"

PYTEST_INI = "[pytest]\npythonpath = .\naddopts = -p no:cacheprovider\n"


@dataclass
class Project:
    """A directory to run pytest in (``root``), the directory of the checks' conftest.py (``target``,
    relative to root) and, when it has one, its floor test."""

    root: Path
    target: str
    domain: str
    floor_test: str | None = None

    def active_args(self) -> list[str]:
        args = [f"--dlcheck={self.domain}", self.target]
        if self.floor_test:
            args.append(f"--ignore={self.floor_test}")
        return args

    def floor_args(self) -> list[str]:
        assert self.floor_test, "this project has no floor test"
        return ["-p", "no:dlcheck", self.floor_test]


# ---- 1. a plain suite ---------------------------------------------------------------------------------


def plain_suite(dest: Path, n_tests: int = 300, per_file: int = 30) -> Path:
    """A suite of exactly ``n_tests`` ordinary tests that know nothing of pytest-dlcheck: plain functions,
    fixtures, parametrized tests and test classes, ``per_file`` to a module."""
    dest.mkdir(parents=True, exist_ok=True)
    (dest / "pytest.ini").write_text(PYTEST_INI)
    (dest / "conftest.py").write_text(
        textwrap.dedent("""\
        import pytest


        @pytest.fixture
        def numbers():
            return list(range(20))


        @pytest.fixture(scope="session")
        def table():
            return {i: str(i) for i in range(100)}
        """)
    )
    left, module = n_tests, 0
    while left > 0:
        count = min(per_file, left)
        (dest / f"test_plain_{module:03d}.py").write_text(_plain_module(module, count))
        left -= count
        module += 1
    return dest


def _plain_module(module: int, count: int) -> str:
    """``count`` tests: groups of a plain test, a fixture test, a 3-way parametrized test and a class of
    two (7 tests), then plain tests for the rest."""
    lines = ["import pytest", ""]
    n = g = 0
    while count - n >= 7:
        lines += [
            f"def test_sum_{g}():",
            f"    assert sum(range({g + 10})) == {sum(range(g + 10))}",
            "",
            f"def test_fixture_{g}(numbers, table):",
            f"    assert numbers[{g % 20}] == {g % 20} and table[{g % 100}] == '{g % 100}'",
            "",
            "@pytest.mark.parametrize('x', [1, 2, 3])",
            f"def test_param_{g}(x):",
            f"    assert (x * {g + 1}) % (x) == 0",
            "",
            f"class TestGroup{g}:",
            "    def test_upper(self):",
            f"        assert 'module{module}'.upper() == 'MODULE{module}'",
            "",
            "    def test_sorted(self):",
            f"        assert sorted([{g + 2}, {g}, {g + 1}]) == [{g}, {g + 1}, {g + 2}]",
            "",
        ]
        n += 7
        g += 1
    while n < count:
        lines += [f"def test_extra_{n}():", f"    assert {n} + 1 == {n + 1}", ""]
        n += 1
    return "\n".join(lines)


# ---- 2. an example project and its floor --------------------------------------------------------------


def example_domains() -> list[str]:
    """Domains with an example project of a clean configuration (examples/<domain>/clean/conftest.py)."""
    return sorted(p.parent.parent.name for p in EXAMPLES.glob("*/clean/conftest.py"))


def fixture_names(conftest: Path) -> list[str]:
    """The dlcheck_* fixtures a conftest.py defines with ``def`` (the floor test finds the others itself)."""
    return sorted(set(re.findall(r"^def (dlcheck_\w+)\s*\(", conftest.read_text(), flags=re.MULTILINE)))


def floor_test_source(domain: str, fixtures: list[str]) -> str:
    """The floor test: every dlcheck_* fixture the conftest.py beside it defines, however it defines them
    (``def`` or generated into its globals, as examples/diffusion's ``role_fixtures`` does), found at run
    time from the loaded conftest module, so a change to how an example writes its fixtures cannot break it."""
    return textwrap.dedent(f'''\
        """The floor of the benchmark: the project's own fixtures, one batch, one forward and backward pass."""
        import sys
        from pathlib import Path

        import dlbench_floor

        FIXTURES = {fixtures!r}


        def _defined():
            here = str(Path(__file__).with_name("conftest.py"))
            conftest = next(m for m in list(sys.modules.values()) if getattr(m, "__file__", None) == here)
            return sorted(set(FIXTURES) | {{n for n in vars(conftest) if n.startswith("dlcheck_")}})


        def test_dlbench_floor(request):
            dlbench_floor.run({domain!r}, {{name: request.getfixturevalue(name) for name in _defined()}})
        ''')


def example_project(domain: str, dest: Path) -> Project:
    """A copy of examples/<domain> with the floor test beside its clean conftest.py."""
    if domain not in dlbench_floor.STEPS:
        raise KeyError(f"no floor step for domain {domain!r} (benchmarks/inject/dlbench_floor.py STEPS)")
    root = dest / domain
    shutil.copytree(
        EXAMPLES / domain, root, ignore=shutil.ignore_patterns("__pycache__", ".pytest_cache"), dirs_exist_ok=True
    )
    names = fixture_names(root / "clean" / "conftest.py")
    (root / "clean" / FLOOR_TEST).write_text(floor_test_source(domain, names))
    return Project(root, "clean", domain, f"clean/{FLOOR_TEST}")


# ---- 3. an SFT project whose dataset is produced lazily -------------------------------------------------

SCALE_VARIANTS = ("trainer+iterable", "collator+map-style")

_COMMON = '''\
import os

import pytest
import tinyllm

N = int(os.environ.get("DLBENCH_N", "1000"))
DEVICE = os.environ.get("DLBENCH_DEVICE", "cpu")


def pairs(n):
    """n prompt/completion examples, produced one at a time on demand."""
    for i in range(n):
        yield example(i)


def example(i):
    prompt, completion = tinyllm.PAIRS[i % len(tinyllm.PAIRS)]
    return {"prompt": prompt, "completion": completion}


def watched(model):
    import dlbench_guard
    import dlbench_probe

    model = model.to(DEVICE)
    dlbench_probe.watch(model)
    return dlbench_guard.watch(model)
'''

_TRAINER_ITERABLE = (
    _COMMON
    + '''

@pytest.fixture(scope="session")
def dlcheck_trainer(tmp_path_factory):
    """TRL's SFTTrainer on a streaming dataset of N examples (tokenized lazily by the trainer's map)."""
    from datasets import IterableDataset
    from trl import SFTConfig, SFTTrainer

    tok = tinyllm.build_tokenizer()
    data = IterableDataset.from_generator(pairs, gen_kwargs={"n": N})
    args = SFTConfig(**{**tinyllm.common_args(tmp_path_factory.mktemp("sft")), "use_cpu": DEVICE == "cpu"},
                     activation_checkpointing=False)
    return SFTTrainer(model=watched(tinyllm.build_model(tok)), args=args, processing_class=tok, train_dataset=data)
'''
)

_COLLATOR_MAP = (
    _COMMON
    + '''

class LazyExamples:
    """A map-style dataset of N tokenized examples, each made when it is indexed (nothing is stored):
    input_ids, attention_mask, and labels with the prompt masked."""

    def __init__(self, tok, n):
        self.tok, self.n = tok, n

    def __len__(self):
        return self.n

    def __getitem__(self, i):
        if not -self.n <= i < self.n:
            raise IndexError(i)
        ex = example(i % self.n)
        prompt = self.tok(ex["prompt"])["input_ids"]
        completion = self.tok(ex["completion"])["input_ids"] + [self.tok.eos_token_id]
        ids = prompt + completion
        return {"input_ids": ids, "attention_mask": [1] * len(ids), "labels": [-100] * len(prompt) + completion}


@pytest.fixture(scope="session")
def tok():
    return tinyllm.build_tokenizer()


@pytest.fixture(scope="session")
def dlcheck_tokenizer(tok):
    return tok


@pytest.fixture(scope="session")
def dlcheck_model(tok):
    return watched(tinyllm.build_model(tok))


@pytest.fixture(scope="session")
def dlcheck_collator(tok):
    from transformers import DataCollatorForSeq2Seq

    return DataCollatorForSeq2Seq(tok, label_pad_token_id=-100)


@pytest.fixture(scope="session")
def dlcheck_dataset(tok):
    return LazyExamples(tok, N)
'''
)


def _llm_base(root: Path) -> None:
    root.mkdir(parents=True, exist_ok=True)
    (root / "pytest.ini").write_text(PYTEST_INI)
    shutil.copy(EXAMPLES / "llm" / "tinyllm.py", root / "tinyllm.py")
    (root / "clean").mkdir(exist_ok=True)


def scale_project(dest: Path, variant: str) -> Project:
    """An SFT project on the example's tokenizer and model whose dataset has ``$DLBENCH_N`` examples made
    on demand: ``trainer+iterable`` (SFTTrainer on a datasets.IterableDataset) or ``collator+map-style``
    (a collator and a map-style dataset that makes each example when indexed). With a floor test."""
    if variant not in SCALE_VARIANTS:
        raise KeyError(f"unknown scale variant {variant!r}; one of {SCALE_VARIANTS}")
    root = dest / ("scale-" + variant.replace("+", "-"))
    _llm_base(root)
    source = _TRAINER_ITERABLE if variant == "trainer+iterable" else _COLLATOR_MAP
    (root / "clean" / "conftest.py").write_text(source)
    (root / "clean" / FLOOR_TEST).write_text(floor_test_source("llm", fixture_names(root / "clean" / "conftest.py")))
    return Project(root, "clean", "llm", f"clean/{FLOOR_TEST}")


# ---- 4. the same SFT project with a ~100M-parameter model ----------------------------------------------

#: a Llama of 104M parameters: 11 layers of width 768 (4·768² attention + 3·768·3072 MLP each)
BIG = {
    "hidden_size": 768,
    "intermediate_size": 3072,
    "num_hidden_layers": 11,
    "num_attention_heads": 12,
    "num_key_value_heads": 12,
}

_MEMORY = '''\
import os

import pytest
import tinyllm

DEVICE = os.environ.get("DLBENCH_DEVICE", "cpu")
SIZE = {size!r}


def build_model(tok):
    import torch
    from transformers import AutoModelForCausalLM, LlamaConfig

    torch.manual_seed(0)
    config = LlamaConfig(vocab_size=len(tok), max_position_embeddings=128, eos_token_id=tok.eos_token_id,
                         pad_token_id=tok.pad_token_id, **SIZE)
    return AutoModelForCausalLM.from_config(config)


@pytest.fixture(scope="session")
def dlcheck_trainer(tmp_path_factory):
    """The example's clean SFTTrainer, with a model built from a config of {size_name} parameters."""
    import dlbench_probe
    from trl import SFTConfig, SFTTrainer

    tok = tinyllm.build_tokenizer()
    import dlbench_guard

    model = build_model(tok).to(DEVICE)
    dlbench_probe.watch(model)
    dlbench_guard.watch(model)
    args = SFTConfig(**{{**tinyllm.common_args(tmp_path_factory.mktemp("sft")), "use_cpu": DEVICE == "cpu"}},
                     activation_checkpointing=False)
    return SFTTrainer(model=model, args=args, processing_class=tok, train_dataset=tinyllm.prompt_completion_dataset())
'''


def llama_parameters(
    vocab: int,
    hidden_size: int,
    intermediate_size: int,
    num_hidden_layers: int,
    num_attention_heads: int,
    num_key_value_heads: int,
) -> int:
    """Parameters of a LlamaForCausalLM (untied embeddings) of this size."""
    head = hidden_size // num_attention_heads
    attn = hidden_size * hidden_size * 2 + hidden_size * head * num_key_value_heads * 2
    mlp = 3 * hidden_size * intermediate_size
    return num_hidden_layers * (attn + mlp + 2 * hidden_size) + 2 * vocab * hidden_size + hidden_size


def memory_project(dest: Path, size: dict | None = None) -> Project:
    """examples/llm's clean SFT project with a model of ``size`` (default :data:`BIG`, ~100M parameters)."""
    size = dict(BIG if size is None else size)
    root = dest / "memory"
    _llm_base(root)
    n = llama_parameters(320, **size)
    (root / "clean" / "conftest.py").write_text(_MEMORY.format(size=size, size_name=f"{n / 1e6:.0f}M"))
    (root / "clean" / FLOOR_TEST).write_text(floor_test_source("llm", ["dlcheck_trainer"]))
    return Project(root, "clean", "llm", f"clean/{FLOOR_TEST}")


# ---- 5. realistic projects: a plain loop on the same Llama, and a ResNet-50 vision project ---------------

_LOOP = '''\
"""A hand-written training loop of a {size_name}-parameter Llama built from a config (the same model as the
SFTTrainer project): a factory of fresh objects, the tokenized data, the step, the checkpoint functions."""

import os

import pytest
import tinyllm
import torch
from torch.utils.data import DataLoader

SIZE = {size!r}
TOK = tinyllm.build_tokenizer()
DEVICE = os.environ.get("DLBENCH_DEVICE", "cpu")


def build_model():
    import dlbench_guard
    from transformers import AutoModelForCausalLM, LlamaConfig

    config = LlamaConfig(vocab_size=len(TOK), max_position_embeddings=128, eos_token_id=TOK.eos_token_id,
                         pad_token_id=TOK.pad_token_id, **SIZE)
    return dlbench_guard.watch(AutoModelForCausalLM.from_config(config).to(DEVICE))


def examples(pairs):
    """Prompt/completion rows, tokenized, the prompt masked out of the labels."""
    rows = []
    for prompt, completion in pairs:
        p = TOK(prompt)["input_ids"]
        c = TOK(completion)["input_ids"] + [TOK.eos_token_id]
        rows.append({{"input_ids": p + c, "labels": [-100] * len(p) + c}})
    return rows


def collate(rows):
    """Right-padded batches: pad tokens masked in the attention and the labels."""
    width = max(len(r["input_ids"]) for r in rows)
    pad = lambda xs, v: xs + [v] * (width - len(xs))
    return {{
        "input_ids": torch.tensor([pad(r["input_ids"], TOK.pad_token_id) for r in rows]),
        "attention_mask": torch.tensor([pad([1] * len(r["input_ids"]), 0) for r in rows]),
        "labels": torch.tensor([pad(r["labels"], -100) for r in rows]),
    }}


def make_training():
    model = build_model()
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4, weight_decay=0.01)
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda step: min(1.0, (step + 1) / 5))
    return {{"model": model, "optimizer": optimizer, "lr_scheduler": scheduler}}


def train_step(state, batch, index):
    model, optimizer = state["model"], state["optimizer"]
    model.train()
    batch = {{k: v.to(model.device) for k, v in batch.items()}}
    loss = model(**batch).loss
    loss.backward()
    torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
    optimizer.step()
    state["lr_scheduler"].step()
    optimizer.zero_grad(set_to_none=True)
    return loss


def save_checkpoint(state, path):
    """Everything a resume needs, written to a temporary file and renamed (atomic)."""
    torch.save({{k: state[k].state_dict() for k in ("model", "optimizer", "lr_scheduler")}}
               | {{"rng": torch.random.get_rng_state()}}, f"{{path}}.tmp")
    os.replace(f"{{path}}.tmp", path)


def load_checkpoint(state, path):
    saved = torch.load(path, weights_only=False)
    for k in ("model", "optimizer", "lr_scheduler"):
        state[k].load_state_dict(saved[k])
    torch.random.set_rng_state(saved["rng"])


@pytest.fixture(scope="session")
def dlcheck_make_training():
    return make_training


@pytest.fixture(scope="session")
def dlcheck_dataloader():
    return DataLoader(examples(tinyllm.PAIRS * 4), batch_size=4, shuffle=True, collate_fn=collate,
                      generator=torch.Generator().manual_seed(0))

@pytest.fixture(scope="session")
def dlcheck_train_step():
    return train_step


@pytest.fixture(scope="session")
def dlcheck_save_checkpoint():
    return save_checkpoint


@pytest.fixture(scope="session")
def dlcheck_load_checkpoint():
    return load_checkpoint
'''


def loop_project(dest: Path, size: dict | None = None) -> Project:
    """The SFT data and the Llama of ``size`` (default :data:`BIG`) trained by a hand loop: the plain-loop
        roles (``dlcheck_make_training``, ``dlcheck_dataloader``, ``dlcheck_train_step``, the checkpoint
        functions); no evaluation data, as the SFTTrainer project has none (eight prompt/completion pairs are
    memorised within the smoke run: S5 would rightly say so). Its floor: the fixtures, fresh objects from the
    factory and one call of the project's step."""
    size = dict(BIG if size is None else size)
    root = dest / "loop"
    _llm_base(root)
    n = llama_parameters(320, **size)
    (root / "clean" / "conftest.py").write_text(_LOOP.format(size=size, size_name=f"{n / 1e6:.0f}M"))
    (root / "clean" / FLOOR_TEST).write_text(floor_test_source("loop", fixture_names(root / "clean" / "conftest.py")))
    return Project(root, "clean", "train", f"clean/{FLOOR_TEST}")


#: the memory row's MLP: 64 inputs, ``depth`` hidden layers of ``width`` (2500 x 3: 18.9M parameters, a
#: 289 MiB training state under AdamW), 4 classes; quick mode's is 256 x 2
MLP_BIG = {"width": 2500, "depth": 3}
MLP_SMALL = {"width": 256, "depth": 2}

_MLP = '''\
"""A plain training loop of a {size_name}-parameter MLP (64 -> {width} x {depth} -> 4) with AdamW: a factory of
fresh objects, (inputs, targets) batches, the loss, an atomic checkpoint save and its load."""

import os

import pytest
import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

WIDTH, DEPTH = {width}, {depth}
DEVICE = os.environ.get("DLBENCH_DEVICE", "cpu")


def build_model():
    import dlbench_guard

    layers, width_in = [], 64
    for _ in range(DEPTH + 1):
        layers += [nn.Linear(width_in, WIDTH), nn.ReLU()]
        width_in = WIDTH
    return dlbench_guard.watch(nn.Sequential(*layers, nn.Linear(WIDTH, 4)).to(DEVICE))


def make_training():
    model = build_model()
    return {{"model": model, "optimizer": torch.optim.AdamW(model.parameters(), lr=1e-4)}}


def save_checkpoint(state, path):
    """Model and optimizer, written to a temporary file and renamed (atomic)."""
    torch.save({{"model": state["model"].state_dict(), "optimizer": state["optimizer"].state_dict()}}, f"{{path}}.tmp")
    os.replace(f"{{path}}.tmp", path)


def load_checkpoint(state, path):
    saved = torch.load(path)
    state["model"].load_state_dict(saved["model"])
    state["optimizer"].load_state_dict(saved["optimizer"])


@pytest.fixture(scope="session")
def dlcheck_make_training():
    return make_training


@pytest.fixture(scope="session")
def dlcheck_dataloader():
    g = torch.Generator().manual_seed(0)
    data = TensorDataset(torch.randn(64, 64, generator=g), torch.randint(0, 4, (64,), generator=g))
    return DataLoader(data, batch_size=8, shuffle=True, generator=torch.Generator().manual_seed(0))


@pytest.fixture(scope="session")
def dlcheck_loss_fn():
    return nn.CrossEntropyLoss()


@pytest.fixture(scope="session")
def dlcheck_save_checkpoint():
    return save_checkpoint


@pytest.fixture(scope="session")
def dlcheck_load_checkpoint():
    return load_checkpoint
'''


def mlp_parameters(width: int, depth: int) -> int:
    """Parameters of the memory row's MLP: 64 -> width, ``depth`` width -> width layers, width -> 4."""
    return (64 * width + width) + depth * (width * width + width) + (width * 4 + 4)


def mlp_project(dest: Path, size: dict | None = None) -> Project:
    """A plain loop of the MLP of ``size`` (default :data:`MLP_BIG`): ``dlcheck_make_training`` (model and
    AdamW), ``dlcheck_dataloader``, ``dlcheck_loss_fn``, an atomic save and its load; no evaluation data.
    Its floor: the fixtures, fresh objects from the factory and one whole training step."""
    size = dict(MLP_BIG if size is None else size)
    root = dest / "mlp"
    (root / "clean").mkdir(parents=True, exist_ok=True)
    (root / "pytest.ini").write_text(PYTEST_INI)
    n = mlp_parameters(**size)
    (root / "clean" / "conftest.py").write_text(_MLP.format(size_name=f"{n / 1e6:.1f}M", **size))
    (root / "clean" / FLOOR_TEST).write_text(floor_test_source("loop", fixture_names(root / "clean" / "conftest.py")))
    return Project(root, "clean", "train", f"clean/{FLOOR_TEST}")


#: a torchvision ResNet-50 (resnet50(weights=None): Bottleneck blocks [3, 4, 6, 3], 23.5M parameters with
#: 3 classes) on 64×64 images; quick mode's is a one-block-per-stage, narrow ResNet of 3.5M on 32×32
RESNET50 = {"layers": [3, 4, 6, 3], "width_per_group": 64, "image": 64, "batch": 16}
RESNET_SMALL = {"layers": [1, 1, 1, 1], "width_per_group": 16, "image": 32, "batch": 8}

_VISION = '''\
"""A ResNet of {size_name} parameters (torchvision's Bottleneck ResNet, {layers}) on the shapes dataset at
{image}×{image}: the model and data for the vision checks, and a plain training loop (a factory of fresh
objects, SGD with momentum and a warmup, the loss, checkpoint functions) for train, ckpt and smoke."""

import os

import pytest
import shapes
import torch
from torch.utils.data import DataLoader
from torchvision.models.resnet import Bottleneck, ResNet
from torchvision.transforms import v2 as T

LAYERS, WIDTH, IMAGE, BATCH = {layers!r}, {width}, {image}, {batch}
DEVICE = os.environ.get("DLBENCH_DEVICE", "cpu")

train_tf = T.Compose([T.ToImage(), T.RandomResizedCrop(IMAGE, scale=(0.6, 1.0)), T.RandomHorizontalFlip(),
                      T.ToDtype(torch.float32, scale=True), T.Normalize(shapes.MEAN, shapes.STD)])
eval_tf = T.Compose([T.ToImage(), T.Resize(IMAGE + IMAGE // 8), T.CenterCrop(IMAGE),
                     T.ToDtype(torch.float32, scale=True), T.Normalize(shapes.MEAN, shapes.STD)])


def build_model():
    """resnet50(weights=None, num_classes=3) at the full size: the same constructor torchvision calls; on
    ``$DLBENCH_DEVICE`` (the benchmark's --device), registered with the GPU run's device guard."""
    import dlbench_guard

    model = ResNet(Bottleneck, LAYERS, num_classes=len(shapes.CLASSES), width_per_group=WIDTH)
    return dlbench_guard.watch(model.to(DEVICE))


def make_training():
    model = build_model()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.005, momentum=0.9, weight_decay=5e-4)
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda step: min(1.0, (step + 1) / 5))
    return {{"model": model, "optimizer": optimizer, "lr_scheduler": scheduler}}


def save_checkpoint(state, path):
    """Everything a resume needs, written to a temporary file and renamed (atomic)."""
    torch.save({{k: state[k].state_dict() for k in ("model", "optimizer", "lr_scheduler")}}
               | {{"rng": torch.random.get_rng_state()}}, f"{{path}}.tmp")
    os.replace(f"{{path}}.tmp", path)


def load_checkpoint(state, path):
    saved = torch.load(path, weights_only=False)
    for k in ("model", "optimizer", "lr_scheduler"):
        state[k].load_state_dict(saved[k])
    torch.random.set_rng_state(saved["rng"])


@pytest.fixture(scope="session")
def dlcheck_model():
    return build_model()


@pytest.fixture(scope="session")
def dlcheck_make_training():
    return make_training


@pytest.fixture(scope="session")
def dlcheck_dataloader():
    return DataLoader(shapes.Shapes("train", size=48, transform=train_tf), batch_size=BATCH, shuffle=True,
                      generator=torch.Generator().manual_seed(0))


@pytest.fixture(scope="session")
def dlcheck_eval_dataloader():
    return DataLoader(shapes.Shapes("val", size=24, transform=eval_tf), batch_size=BATCH)


@pytest.fixture(scope="session")
def dlcheck_loss_fn():
    return torch.nn.CrossEntropyLoss()


def accuracy(model, loader):
    """shapes.accuracy, the batches moved to the model's device as the project's evaluation loop does."""
    device = next(model.parameters()).device
    model.eval()
    correct = total = 0
    with torch.no_grad():
        for images, labels in loader:
            correct += (model(images.to(device)).argmax(1) == labels.to(device)).sum().item()
            total += len(labels)
    model.train()
    return correct / max(total, 1)


@pytest.fixture(scope="session")
def dlcheck_eval_fn():
    return accuracy


@pytest.fixture(scope="session")
def dlcheck_save_checkpoint():
    return save_checkpoint


@pytest.fixture(scope="session")
def dlcheck_load_checkpoint():
    return load_checkpoint
'''


def resnet_parameters(layers: list[int], width_per_group: int = 64, classes: int = 3, **_: object) -> int:
    """Parameters of torchvision's Bottleneck ResNet of this shape (built on the meta device: no memory)."""
    import torch
    from torchvision.models.resnet import Bottleneck, ResNet

    with torch.device("meta"):
        model = ResNet(Bottleneck, layers, num_classes=classes, width_per_group=width_per_group)
    return sum(p.numel() for p in model.parameters())


def vision_project(dest: Path, size: dict | None = None) -> Project:
    """examples/vision's shapes data with a ResNet of ``size`` (default :data:`RESNET50`) for
    ``--dlcheck=vision,train,ckpt,smoke``: ``dlcheck_model`` for the vision checks and a plain loop's
    factory for the training ones. Its floor: the fixtures, fresh objects and one training step."""
    size = dict(RESNET50 if size is None else size)
    root = dest / "vision50"
    (root / "clean").mkdir(parents=True, exist_ok=True)
    (root / "pytest.ini").write_text(PYTEST_INI)
    shutil.copy(EXAMPLES / "vision" / "shapes.py", root / "shapes.py")
    n = resnet_parameters(**size)
    source = _VISION.format(
        size_name=f"{n / 1e6:.1f}M",
        layers=size["layers"],
        width=size["width_per_group"],
        image=size["image"],
        batch=size["batch"],
    )
    (root / "clean" / "conftest.py").write_text(source)
    (root / "clean" / FLOOR_TEST).write_text(floor_test_source("loop", fixture_names(root / "clean" / "conftest.py")))
    return Project(root, "clean", "vision", f"clean/{FLOOR_TEST}")
