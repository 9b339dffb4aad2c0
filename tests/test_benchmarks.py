"""The benchmark's own logic (benchmarks/): measurement, interleaving, the generated projects, the floor
steps on real tiny objects, the probe, the table, and one end-to-end run at a reduced size so the script
cannot rot. The budgets themselves are checked by the benchmark, not here."""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys
from pathlib import Path

import pytest
import tiny
import torch

REPO = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(REPO), str(REPO / "benchmarks" / "inject")]

import dlbench_floor
import dlbench_guard
import dlbench_probe

from benchmarks import measure, projects, rows, run
from benchmarks.measure import Measurement, Summary

PY = sys.executable


# ---- the modules import one way -------------------------------------------------------------------------

#: run.py (the command) above the figures' modules, above the rows and their formatting, above measurement
#: and the generated projects; a module imports only from the layers below its own
LAYERS = ({"run"}, {"realistic", "watch", "corpus"}, {"rows"}, {"measure", "projects"})


def _benchmark_imports(name: str) -> set[str]:
    """The benchmarks modules that ``benchmarks/<name>.py`` imports, at its top or inside a function."""
    import ast

    found = set()
    for node in ast.walk(ast.parse((REPO / "benchmarks" / f"{name}.py").read_text())):
        if isinstance(node, ast.ImportFrom) and node.module and node.module.split(".")[0] == "benchmarks":
            parts = node.module.split(".")
            found |= {parts[1]} if len(parts) > 1 else {alias.name for alias in node.names}
        elif isinstance(node, ast.Import):
            found |= {a.name.split(".")[1] for a in node.names if a.name.startswith("benchmarks.")}
    return found


def test_the_benchmark_modules_import_in_one_direction():
    modules = {p.stem for p in (REPO / "benchmarks").glob("*.py")} - {"__init__"}
    assert modules == set().union(*LAYERS), "a new benchmarks module belongs to one of the layers"
    for level, layer in enumerate(LAYERS):
        below = set().union(*LAYERS[level + 1 :])
        for name in layer:
            upward = _benchmark_imports(name) - below
            assert not upward, f"benchmarks/{name}.py imports {sorted(upward)}, which is not below it"
    # and each imports by itself, in a fresh interpreter, in any order (no circle to rely on)
    for name in sorted(modules):
        code = f"import sys; sys.path[:0] = [{str(REPO)!r}]; import benchmarks.{name}"
        done = subprocess.run([PY, "-c", code], capture_output=True, text=True, timeout=120)
        assert done.returncode == 0, done.stderr[-2000:]


# ---- measurement -------------------------------------------------------------------------------------


def test_abba_alternates_the_order_of_the_variants():
    assert measure.abba(["a", "b"], 4) == ["a", "b", "b", "a", "a", "b", "b", "a"]
    assert measure.abba(["a", "b", "c"], 2) == ["a", "b", "c", "c", "b", "a"]


def test_interleaved_discards_the_warmup_and_keeps_the_order():
    calls = []

    def variant(name, wall):
        def go():
            calls.append(name)
            return Measurement(wall, wall / 2, 10.0, 0)

        return go

    runs = measure.interleaved({"a": variant("a", 1.0), "b": variant("b", 3.0)}, repeats=3, warmup=1)
    assert calls == ["a", "b", "a", "b", "b", "a", "a", "b"]
    assert [len(runs["a"]), len(runs["b"])] == [3, 3]
    s = Summary.of(runs["b"])
    assert (s.n, s.wall, s.cpu, s.wall_spread) == (3, 3.0, 1.5, 0.0)


def test_paired_ratio_compares_runs_taken_side_by_side():
    # the load doubles between the repeats: each pair still says 1.1, the ratio of the medians would not
    a = [Measurement(1.1, 1.1, 0, 0), Measurement(2.2, 2.2, 0, 0), Measurement(2.2, 2.2, 0, 0)]
    b = [Measurement(1.0, 1.0, 0, 0), Measurement(2.0, 2.0, 0, 0), Measurement(2.0, 2.0, 0, 0)]
    assert measure.paired_ratio(a, b, "cpu") == pytest.approx(1.1)
    assert measure.paired_ratio(a, b, "wall") == pytest.approx(1.1)


def test_median_spread_ratio():
    assert measure.median([3, 1, 2]) == 2 and measure.median([1, 2, 3, 10]) == 2.5
    assert measure.spread([10, 10, 11, 9, 10]) == 0.0
    assert measure.spread([1.0, 1.1, 0.9]) == pytest.approx(0.1)
    assert measure.ratio(3.0, 2.0) == 1.5 and measure.ratio(1.0, 0.0) == float("inf")


def test_run_command_measures_cpu_and_peak_memory_of_the_child():
    code = (
        "import time\nt = time.process_time()\nwhile time.process_time() - t < 0.3: pass\n"
        "x = bytearray(200 * 2**20)\nfor i in range(0, len(x), 4096): x[i] = 1\nprint('done')"
    )
    m = measure.run_command([PY, "-c", code])
    assert m.rc == 0 and "done" in m.output
    assert m.cpu >= 0.25 and m.wall >= m.cpu * 0.5
    assert m.max_rss_mb >= 200
    assert m.started_at > 0


def test_run_command_reports_a_failure_with_its_output():
    with pytest.raises(measure.CommandFailed, match=r"exit 3[\s\S]*boom"):
        measure.run_command([PY, "-c", "import sys; print('boom'); sys.exit(3)"])
    assert measure.run_command([PY, "-c", "import sys; sys.exit(1)"], ok_codes=(0, 1)).rc == 1


def test_machine_description_names_cores_and_libraries():
    m = measure.Machine.here(PY)
    assert m.cores >= 1 and "torch" in m.versions and "pytest" in m.versions
    assert f"{m.cores} cores" in m.describe()


# ---- the generated projects --------------------------------------------------------------------------


def test_plain_suite_has_exactly_the_requested_tests(tmp_path):
    suite = projects.plain_suite(tmp_path / "plain", n_tests=37, per_file=15)
    assert sorted(p.name for p in suite.glob("test_*.py")) == [f"test_plain_00{i}.py" for i in range(3)]
    out = subprocess.run(
        [PY, "-m", "pytest", "--collect-only", "-q", "-p", "no:dlcheck", "."],
        cwd=suite,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert "37 tests collected" in out.stdout, out.stdout + out.stderr


def test_example_project_copies_the_example_and_writes_its_floor_test(tmp_path):
    assert {"llm", "vision"} <= set(projects.example_domains())
    p = projects.example_project("llm", tmp_path)
    assert (p.root / "tinyllm.py").exists() and (p.root / "clean" / "conftest.py").exists()
    assert projects.fixture_names(p.root / "clean" / "conftest.py") == ["dlcheck_trainer"]
    floor = (p.root / p.floor_test).read_text()
    assert "dlbench_floor.run('llm'" in floor and "['dlcheck_trainer']" in floor
    assert p.active_args() == ["--dlcheck=llm", "clean", "--ignore=clean/test_dlbench_floor.py"]
    assert p.floor_args() == ["-p", "no:dlcheck", "clean/test_dlbench_floor.py"]
    v = projects.example_project("vision", tmp_path)
    assert projects.fixture_names(v.root / "clean" / "conftest.py") == [
        "dlcheck_dataloader",
        "dlcheck_eval_dataloader",
        "dlcheck_eval_fn",
        "dlcheck_loss_fn",
        "dlcheck_model",
    ]
    with pytest.raises(KeyError, match="no floor step"):
        projects.example_project("smoke", tmp_path)


def _load(path: Path, name: str):
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_scale_projects_produce_their_examples_lazily(tmp_path, monkeypatch):
    for variant in projects.SCALE_VARIANTS:
        p = projects.scale_project(tmp_path, variant)
        compile((p.root / "clean" / "conftest.py").read_text(), "conftest.py", "exec")
        assert (p.root / p.floor_test).exists()
    monkeypatch.syspath_prepend(str(p.root))
    monkeypatch.setenv("DLBENCH_N", "1000000")
    try:
        conf = _load(p.root / "clean" / "conftest.py", "dlbench_scale_conftest")
        data = conf.LazyExamples(tiny.tokenizer(), conf.N)
        assert len(data) == 1_000_000
        last = data[999_999]
        assert len(last["input_ids"]) == len(last["labels"]) and last["labels"][0] == -100
        assert last["labels"][-1] == tiny.tokenizer().eos_token_id
        with pytest.raises(IndexError):
            data[1_000_000]
        gen = conf.pairs(10**12)  # a generator: nothing is made before it is read
        assert next(gen) == conf.example(0)
    finally:
        sys.modules.pop("tinyllm", None)


def test_parameter_count_matches_a_real_llama():
    from transformers import LlamaConfig, LlamaForCausalLM

    model = LlamaForCausalLM(LlamaConfig(vocab_size=320, max_position_embeddings=128, **run.SMALL))
    assert projects.llama_parameters(320, **run.SMALL) == sum(p.numel() for p in model.parameters())
    assert 95e6 <= projects.llama_parameters(320, **projects.BIG) <= 110e6


def test_memory_project_builds_the_example_with_the_big_config(tmp_path):
    p = projects.memory_project(tmp_path)
    source = (p.root / "clean" / "conftest.py").read_text()
    compile(source, "conftest.py", "exec")
    assert "'num_hidden_layers': 11" in source and "104M" in source
    assert p.active_args()[0] == "--dlcheck=llm"


def test_realistic_projects_write_the_plain_loop_and_vision_roles(tmp_path):
    loop = projects.loop_project(tmp_path, run.SMALL)
    source = (loop.root / "clean" / "conftest.py").read_text()
    compile(source, "conftest.py", "exec")
    assert projects.fixture_names(loop.root / "clean" / "conftest.py") == [
        "dlcheck_dataloader",
        "dlcheck_load_checkpoint",
        "dlcheck_make_training",
        "dlcheck_save_checkpoint",
        "dlcheck_train_step",
    ]
    assert (
        "'num_hidden_layers': 4" in source and "dlbench_floor.run('loop'" in (loop.root / loop.floor_test).read_text()
    )
    vision = projects.vision_project(tmp_path, projects.RESNET_SMALL)
    compile((vision.root / "clean" / "conftest.py").read_text(), "conftest.py", "exec")
    assert (vision.root / "shapes.py").exists() and vision.domain == "vision"
    assert {"dlcheck_model", "dlcheck_make_training", "dlcheck_loss_fn"} <= set(
        projects.fixture_names(vision.root / "clean" / "conftest.py")
    )
    # the full size is torchvision's resnet50(weights=None), parameter for parameter
    from torchvision.models import resnet50

    full = sum(p.numel() for p in resnet50(weights=None, num_classes=3).parameters())
    assert projects.resnet_parameters(**projects.RESNET50) == full
    assert projects.resnet_parameters(**projects.RESNET_SMALL) < full / 5


def test_memory_row_project_is_a_plain_loop_of_the_19m_mlp(tmp_path):
    mlp = projects.mlp_project(tmp_path, projects.MLP_SMALL)
    source = (mlp.root / "clean" / "conftest.py").read_text()
    compile(source, "conftest.py", "exec")
    assert projects.fixture_names(mlp.root / "clean" / "conftest.py") == [
        "dlcheck_dataloader",
        "dlcheck_load_checkpoint",
        "dlcheck_loss_fn",
        "dlcheck_make_training",
        "dlcheck_save_checkpoint",
    ]
    assert "os.replace" in source and "dlbench_floor.run('loop'" in (mlp.root / mlp.floor_test).read_text()
    # the parameter count is the model's, and the full size is the 18.9M-parameter MLP
    spec = importlib.util.spec_from_file_location("mlp_conftest", mlp.root / "clean" / "conftest.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    model = module.make_training()["model"]
    assert sum(p.numel() for p in model.parameters()) == projects.mlp_parameters(**projects.MLP_SMALL)
    assert 18.5e6 <= projects.mlp_parameters(**projects.MLP_BIG) <= 19.5e6
    assert "18.9M" in (projects.mlp_project(tmp_path / "big").root / "clean" / "conftest.py").read_text()


# ---- the floor steps, on real tiny objects -----------------------------------------------------------


def _grads(model) -> bool:
    return all(p.grad is not None for p in model.parameters() if p.requires_grad)


def test_llm_floor_step_with_a_trainer(tmp_path):
    from datasets import Dataset
    from trl import SFTConfig, SFTTrainer

    tok = tiny.tokenizer()
    model = tiny.llama(tok)
    data = Dataset.from_dict({"prompt": tiny.PROMPTS, "completion": tiny.COMPLETIONS})
    trainer = SFTTrainer(
        model=model, args=tiny.trainer_args(tmp_path, SFTConfig), processing_class=tok, train_dataset=data
    )
    info = dlbench_floor.llm_step({"dlcheck_trainer": trainer})
    assert info["loss"] > 0 and info["batch"][0] == trainer.args.per_device_train_batch_size
    assert info["trainable_bytes"] == 4 * sum(p.numel() for p in model.parameters())
    assert _grads(model)


def test_llm_floor_step_with_a_collator_and_dataset():
    from transformers import DataCollatorForLanguageModeling

    tok = tiny.tokenizer()
    model = tiny.llama(tok)
    info = dlbench_floor.llm_step(
        {
            "dlcheck_model": model,
            "dlcheck_collator": DataCollatorForLanguageModeling(tok, mlm=False),
            "dlcheck_dataset": tiny.tokenized(tok),
        },
        batch_size=3,
    )
    assert info["batch"][0] == 3 and _grads(model)


def test_vision_floor_step_and_floor_output(tmp_path, monkeypatch):
    from torch.utils.data import DataLoader, TensorDataset

    model = torch.nn.Sequential(torch.nn.Conv2d(3, 4, 3), torch.nn.Flatten(), torch.nn.LazyLinear(3))
    data = TensorDataset(torch.randn(8, 3, 8, 8), torch.tensor([0, 1, 2, 0, 1, 2, 0, 1]))
    out = tmp_path / "floor.json"
    monkeypatch.setenv("DLBENCH_FLOOR_OUT", str(out))
    info = dlbench_floor.run(
        "vision",
        {
            "dlcheck_model": model,
            "dlcheck_dataloader": DataLoader(data, batch_size=4),
            "dlcheck_loss_fn": torch.nn.CrossEntropyLoss(),
        },
    )
    assert info["batch"] == [4, 3, 8, 8] and _grads(model)
    assert json.loads(out.read_text())["trainable_bytes"] == info["trainable_bytes"] > 0


def test_train_floor_step_uses_a_fresh_model_from_the_factory():
    from torch.utils.data import DataLoader, TensorDataset

    made = []

    def make():
        made.append(torch.nn.Linear(4, 3))
        return {"model": made[-1], "optimizer": torch.optim.SGD(made[-1].parameters(), lr=0.1)}

    data = TensorDataset(torch.randn(8, 4), torch.tensor([0, 1, 2, 0, 1, 2, 0, 1]))
    info = dlbench_floor.train_step(
        {"dlcheck_make_training": make, "dlcheck_dataloader": DataLoader(data, batch_size=4)}
    )
    assert len(made) == 1 and _grads(made[0]) and info["trainable_bytes"] == 4 * 15


def test_loop_floor_step_runs_the_projects_own_step_with_its_optimizer():
    from torch.utils.data import DataLoader, TensorDataset

    made, calls = [], []

    def make():
        made.append(torch.nn.Linear(4, 3))
        return {"model": made[-1], "optimizer": torch.optim.SGD(made[-1].parameters(), lr=0.1)}

    def step(state, batch, index):
        calls.append(index)
        loss = torch.nn.functional.cross_entropy(state["model"](batch[0]), batch[1])
        loss.backward()
        state["optimizer"].step()
        return loss

    data = TensorDataset(torch.randn(8, 4), torch.tensor([0, 1, 2, 0, 1, 2, 0, 1]))
    loader = DataLoader(data, batch_size=4)
    info = dlbench_floor.loop_step(
        {"dlcheck_make_training": make, "dlcheck_dataloader": loader, "dlcheck_train_step": step}
    )
    assert calls == [0] and len(made) == 1 and info["optimizer_step"] and info["batch"] == [4, 4]
    # without a step: the loss function, backward and the factory's optimizer's step
    initial = []

    def make_recorded():
        objects = make()
        initial.append(objects["model"].weight.detach().clone())
        return objects

    info = dlbench_floor.loop_step({"dlcheck_make_training": make_recorded, "dlcheck_dataloader": loader})
    assert _grads(made[-1]) and not torch.equal(made[-1].weight, initial[-1])
    assert info["trainable_bytes"] == 4 * 15 and info["optimizer_step"]
    # one training state: the weights and their gradients (plain SGD keeps nothing per parameter) ...
    assert info["training_state_bytes"] == 2 * 4 * 15
    # ... and AdamW's two moments (and its step counters) beside them: four times the weights
    model = torch.nn.Linear(4, 3)
    adamw = torch.optim.AdamW(model.parameters())
    torch.nn.functional.cross_entropy(model(data.tensors[0]), data.tensors[1]).backward()
    adamw.step()
    assert dlbench_floor.training_state_bytes(model, adamw) == 4 * 4 * 15 + 2 * 4


# ---- the probe ---------------------------------------------------------------------------------------


def test_probe_watch_records_a_move_to_the_cpu():
    model = torch.nn.Linear(2, 2, device="meta")  # "elsewhere" than the CPU, on a machine without a GPU
    original_to, original_cpu = torch.nn.Module.to, torch.nn.Module.cpu
    try:
        dlbench_probe.watch(model)
        torch.nn.Linear(2, 2).to("cpu")  # not a watched model: not recorded
        with pytest.raises(NotImplementedError):
            model.to("cpu")  # a meta tensor cannot be copied, but the attempt is recorded first
        with pytest.raises(NotImplementedError):
            model.cpu()
        assert dlbench_probe.MOVED == ["Linear.to('cpu')", "Linear.cpu()"]
        assert dlbench_probe._devices() == {"0:Linear": {"meta": 2}}
    finally:
        torch.nn.Module.to, torch.nn.Module.cpu = original_to, original_cpu
        del torch.nn.Module._dlbench_patched
        dlbench_probe.MODELS.clear()
        dlbench_probe.MOVED.clear()


# ---- the GPU run: the device guard, the bound, no CUDA ---------------------------------------------------

#: check-like code, as pytest-dlcheck's would be: the guard attributes a call to the first frame outside torch
PLUGIN_CODE = """\
def clean_check(model, batch):
    out = model(batch)
    per_row = out.detach().sum(1).cpu()  # a value the check computed and reads: listed, not a violation
    return out.sum().item(), per_row


def copies_the_weights(model):
    return {k: v.detach().cpu() for k, v in model.state_dict().items()}


def moves_the_model(model):
    model.to("cpu")


def leaves_the_model_elsewhere(model):
    model.to("meta")
"""


def _plugin_code(tmp_path):
    (tmp_path / "plug").mkdir()
    (tmp_path / "plug" / "checkish.py").write_text(PLUGIN_CODE)
    return _load(tmp_path / "plug" / "checkish.py", "dlbench_checkish"), (str(tmp_path / "plug") + "/",)


def test_device_guard_catches_plugin_code_moving_or_copying_the_model_and_passes_a_clean_check(tmp_path):
    # no GPU here: the guard watches the CPU (a test-only device filter), so every .cpu()/.to("cpu") of a
    # tensor on it counts, and only the frame attribution and the model's storages decide
    checks, roots = _plugin_code(tmp_path)
    guard = dlbench_guard.Guard(device="cpu", roots=roots)
    model = dlbench_guard.watch(torch.nn.Linear(4, 3))
    batch = torch.randn(2, 4)
    original = torch.Tensor.cpu, torch.Tensor.to, torch.nn.Module.cpu, torch.nn.Module.to
    try:
        with guard.active("clean"):
            checks.clean_check(model, batch)
            model.weight.detach().cpu()  # the test's (the user's) own code: not the plugin's, not recorded
            batch.to("cpu")
        assert guard.violations() == []
        (clean,) = guard.transfers()
        assert clean["site"].startswith("plug/checkish.py:3 clean_check") and clean["calls"] == 1
        assert not clean["model"] and clean["shape"] == [2]
        with guard.active("copies"):
            checks.copies_the_weights(model)
        with guard.active("moves"):
            checks.moves_the_model(model)
        with guard.active("leaves"):
            checks.leaves_the_model_elsewhere(model)
        found = guard.violations()
        assert found[0].startswith("leaves: left Linear.weight on meta, Linear.bias on meta")
        assert any(v.startswith("copies: plug/checkish.py:8 ") and "moved or copied a model" in v for v in found)
        assert any(v.startswith("moves: plug/checkish.py:12 moves_the_model") and "Linear.to(cpu)" in v for v in found)
        assert len(found) == 3
    finally:
        assert (torch.Tensor.cpu, torch.Tensor.to, torch.nn.Module.cpu, torch.nn.Module.to) == original
        dlbench_guard._MODELS.clear()


def test_device_guard_keeps_no_model_alive():
    model = dlbench_guard.watch(torch.nn.Linear(2, 2, device="meta"))
    assert [m for m, _ in dlbench_guard._models()] == [model]
    del model
    assert dlbench_guard._models() == [] and dlbench_guard._MODELS == []


def test_generated_projects_put_the_model_on_the_benchmarks_device(tmp_path, monkeypatch):
    mlp = projects.mlp_project(tmp_path, projects.MLP_SMALL)
    monkeypatch.setenv("DLBENCH_DEVICE", "meta")  # as --device cuda sets it to cuda
    try:
        conf = _load(mlp.root / "clean" / "conftest.py", "dlbench_mlp_meta")
        model = conf.make_training()["model"]
        assert {p.device.type for p in model.parameters()} == {"meta"}
        assert [(m, d) for m, d in dlbench_guard._models()] == [(model, "meta")]
    finally:
        dlbench_guard._MODELS.clear()
    for source in (
        (projects.loop_project(tmp_path, run.SMALL).root / "clean" / "conftest.py").read_text(),
        (projects.vision_project(tmp_path, projects.RESNET_SMALL).root / "clean" / "conftest.py").read_text(),
        (projects.memory_project(tmp_path, run.SMALL).root / "clean" / "conftest.py").read_text(),
    ):
        assert 'os.environ.get("DLBENCH_DEVICE", "cpu")' in source and "dlbench_guard.watch(" in source


def test_device_cuda_without_cuda_says_so_in_one_line_and_exits_non_zero(tmp_path):
    if torch.cuda.is_available():
        pytest.skip("this machine has CUDA")
    proc = subprocess.run(
        [PY, str(REPO / "benchmarks" / "run.py"), "--device", "cuda", "--workdir", str(tmp_path)],
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert proc.returncode == 2
    assert proc.stdout == run.NO_CUDA + "\n" and proc.stderr == ""
    assert list(tmp_path.iterdir()) == []  # nothing was built


def test_device_cuda_documents_its_bound_and_runs_the_realistic_rows(capsys):
    with pytest.raises(SystemExit):
        run.parse_args(["--help"])
    text = " ".join(capsys.readouterr().out.split())
    assert "--device {cpu,cuda}" in text and "8 minutes (480 s" in text and "exit 2" in text
    args = run.parse_args(["--device", "cuda"])
    assert args.only.split(",") == list(run.CUDA_SECTIONS) and (args.repeats, args.warmup) == (1, 0)
    assert {"gpu", "realistic", "realistic-loop", "realistic-vision", "inactive", "scale"} == set(run.CUDA_SECTIONS)
    assert run.CUDA_BOUND_S == 480 and "480 s" in (REPO / "benchmarks" / "README.md").read_text()


def test_the_gpu_figure_fills_its_readme_section_and_the_guard_row_fails_on_a_violation(tmp_path):
    readme = tmp_path / "README.md"
    readme.write_text(f"before\n{run.FIGURE_START}\nnot taken\n{run.FIGURE_END}\nafter\n")
    assert run.write_figure(readme, "| a | b |")
    assert readme.read_text() == f"before\n{run.FIGURE_START}\n| a | b |\n{run.FIGURE_END}\nafter\n"
    assert not run.write_figure(tmp_path / "missing.md", "x")
    ctx = run.Context(PY, tmp_path, 1, 0, 1, "cpu", False, device="cuda")
    assert run.guard_row(ctx).ok is None  # nothing guarded: not judged
    ctx.guard.append({"where": "llm: --dlcheck=llm", "violations": [], "transfers": [_transfer(False)]})
    assert run.guard_row(ctx).ok is True and "1 calls" in run.guard_row(ctx).note
    ctx.guard.append({"where": "loop: --dlcheck=ckpt", "violations": ["C2: left x on cpu"], "transfers": []})
    row = run.guard_row(ctx)
    assert row.ok is False and row.data["violations"] == ["loop: --dlcheck=ckpt: C2: left x on cpu"]


def test_the_bound_stops_a_run_past_it_and_keeps_the_rows_taken(tmp_path):
    import time

    (tmp_path / "test_slow.py").write_text("import time\n\ndef test_slow():\n    time.sleep(60)\n")
    ctx = run.Context(PY, tmp_path, 1, 0, 1, "cpu", False, device="cuda", deadline=time.time() + 3)
    ctx.rows.append(rows.Row("inactive", "taken before", "-", "-", "-", "-", True, ""))
    stopped = []
    started = time.time()
    with run._stop_on_bound(stopped):
        ctx.pytest(tmp_path, ["-p", "no:dlcheck", "test_slow.py"], ctx.env())()
    assert time.time() - started < 30 and len(stopped) == 1 and str(stopped[0]).startswith("during ")
    with pytest.raises(run.BoundExceeded, match="^before "):  # past the bound, nothing more starts
        ctx.pytest(tmp_path, ["test_slow.py"], ctx.env())()
    assert [r.figure for r in ctx.rows] == ["taken before"]


def _transfer(model):
    return {"item": "L1", "site": "checks/shared/lm.py:231 nll", "calls": 1, "bytes": 2**20, "model": model}


# ---- the report ----------------------------------------------------------------------------------------


def _measured(wall, cpu, probe=None):
    return Measurement(wall, cpu, 100.0, 0, "", started_at=1000.0, info={"probe": probe} if probe else {})


def test_phases_and_outcomes_from_the_probe():
    probe = {
        "configured_at": 1002.0,
        "collected_at": 1002.5,
        "finished_at": 1009.0,
        "items": {
            "c/conftest.py::L1_x": {"setup": 4.0, "call": 1.0, "teardown": 0.0, "outcome": "passed"},
            "c/conftest.py::L2_y": {"setup": 0.0, "call": 0.5, "teardown": 0.1, "outcome": "skipped"},
        },
    }
    m = _measured(10.0, 8.0, probe)
    assert rows.phases(m) == pytest.approx({"startup": 2.0, "collection": 0.5, "items": 5.6, "exit": 1.0})
    assert rows.outcomes(m) == {"passed": 1, "skipped": 1}
    assert rows.slowest(m, 1) == [("L1_x", 4.0, 1.0)]
    assert rows.median_run([_measured(3, 3), _measured(1, 1), _measured(2, 2)], "cpu").cpu == 2


def test_the_check_at_the_peak_is_the_first_that_reached_it():
    items = {
        f"c/conftest.py::{name}": {"setup": 0, "call": 0, "teardown": 0, "outcome": "passed", "memory": memory}
        for name, memory in (
            ("T1_a", {"vmrss": 700.0, "vmhwm": 800.0}),
            ("C1_b", {"vmrss": 900.0, "vmhwm": 1300.0}),
            ("C2_c", {"vmrss": 950.0, "vmhwm": 1300.0}),
        )
    }
    assert rows.peak_item(_measured(1, 1, {"items": items})) == ("C1", 1300.0)
    assert rows.peak_item(_measured(1, 1, {"items": {}})) is None


def test_a_clean_project_that_fails_or_errors_is_named():
    ok = _measured(1, 1, {"items": {"c::L1": {"setup": 0, "call": 0, "teardown": 0, "outcome": "passed"}}})
    assert rows.broken(ok) == ""
    bad = _measured(1, 1, {"items": {"c::L1": {"setup": 0, "call": 0, "teardown": 0, "outcome": "error"}}})
    bad.output = "...\nERROR clean/conftest.py::L1_padding_side - ImportError: boom\n1 error"
    assert rows.broken(bad) == (
        "1 check(s) failed or errored on a clean project: ERROR clean/conftest.py::L1_padding_side - ImportError: boom"
    )
    assert rows.broken(_measured(1, 1, {"items": {}})).startswith("no check ran")


def test_device_findings_name_moves_and_tensors_left_off_the_gpu():
    def probe(moved, devices, peak):
        return {"moved_to_cpu": moved, "devices": devices, "cuda_peak_mb": peak, "items": {}}

    clean = [_measured(1, 1, probe([], {"0:LlamaForCausalLM": {"cuda": 30}}, 900.0))]
    floor = [_measured(1, 1, probe([], {"0:LlamaForCausalLM": {"cuda": 30}}, 1300.0))]
    assert run.device_findings(clean, floor) == {
        "moved": [],
        "off_device": {},
        "peak_active": 900.0,
        "peak_floor": 1300.0,
    }
    moved = [
        _measured(1, 1, probe(["LlamaForCausalLM.to('cpu')"], {"0:LlamaForCausalLM": {"cuda": 29, "cpu": 1}}, 950.0))
    ]
    found = run.device_findings(moved + clean, floor)
    assert found["moved"] == ["LlamaForCausalLM.to('cpu')"]
    assert found["off_device"] == {"0:LlamaForCausalLM": {"cuda": 29, "cpu": 1}}


def test_table_and_verdicts():
    ra, rb = [_measured(2.0, 1.1)], [_measured(1.0, 1.0)]
    a, b = Summary.of(ra), Summary.of(rb)
    text, chosen = rows.fmt_ratios(ra, rb, "cpu")
    assert text == "1.100 CPU, 2.000 wall" and chosen == pytest.approx(1.1)
    assert rows.fmt_ratios(ra, rb, "wall")[1] == 2.0
    table = [
        rows.Row("scale", "x", rows.fmt_time(a), rows.fmt_time(b), text, "≤ 1.10", chosen <= run.SCALE_MAX, "a note"),
        rows.Row("gpu", "y", "-", "-", "-", "-", None, "not taken"),
    ]
    out = rows.table(table)
    lines = out.splitlines()
    assert lines[0].startswith("| figure") and "verdict" in lines[0]
    assert "1.10 s CPU, 2.00 s wall" in lines[2] and lines[2].rstrip(" |").endswith("ok")
    assert lines[3].rstrip(" |").endswith("-")
    assert "- x: a note" in out and "- y: not taken" in out
    assert len({len(line) for line in lines[:4]}) == 1  # aligned columns


def test_work_by_check_and_domain_and_the_data_domain_budget():
    from benchmarks import realistic

    def item(check, domain, fwd, bwd=0, steps=0, routine=0):
        cost = {"forward": fwd, "backward": bwd, "optimizer_steps": steps}
        if routine:
            cost["in_user_routines"] = {"dlcheck_sample_images": routine}
        return {
            "setup": 0,
            "call": 0,
            "teardown": 0,
            "outcome": "passed",
            "check": check,
            "domain": domain,
            "cost": cost,
        }

    m = _measured(
        1,
        1,
        {
            "items": {
                "c::T2_overfit_batch": item("T2", "train", 62, 60, 60),
                "c::S1_nonfinite": item("S1", "smoke", 20, 20, 20),
                "c::V2_eval_mode": item("V2", "vision", 2),
                "c::V3_x": item("V3", "vision", 9),
                "c::DF2_ema": item("DF2", "diffusion", 6, routine=6),
                "c::DF3_x": item("DF3", "diffusion", 6),
                "c::old_style": {"setup": 0, "call": 0, "teardown": 0, "outcome": "passed", "cost": {"forward": 1}},
            }
        },
    )
    by_check = rows.work_by_check(m)
    assert by_check["T2"] == {
        "domain": "train",
        "forward": 62,
        "backward": 60,
        "optimizer_steps": 60,
        "in_user_routines": 0,
    }
    assert by_check["old"]["domain"] is None  # no ID recorded: the test name's prefix
    assert rows.work_by_domain(m) == {
        "train": {"forward": 62, "backward": 60, "optimizer_steps": 60, "in_user_routines": 0},
        "smoke": {"forward": 20, "backward": 20, "optimizer_steps": 20, "in_user_routines": 0},
        "vision": {"forward": 11, "backward": 0, "optimizer_steps": 0, "in_user_routines": 0},
        "diffusion": {"forward": 12, "backward": 0, "optimizer_steps": 0, "in_user_routines": 6},
    }
    assert rows.fmt_by_check(by_check).startswith("T2 62 fwd/60 bwd/60 steps, S1 20 fwd/20 bwd/20 steps, V3")
    active = [
        rows.Row(
            "active", "a", "", "", "", "", True, "", {"domain": "llm", "forward_by_domain": {"llm": 7, "train": 40}}
        ),
        rows.Row(
            "active",
            "v",
            "",
            "",
            "",
            "",
            True,
            "",
            {"domain": "vision", "forward_by_domain": {"vision": 11}, "work_by_check": by_check},
        ),
        rows.Row("active", "t", "", "", "", "", True, "", {"domain": "train", "forward_by_domain": {"train": 90}}),
    ]
    row = realistic.domain_budget_row(active)
    assert row.section == "domains" and row.ok is False and row.measured == "llm 7, vision 11"
    assert row.data["over"] == {"vision": 11} and "OVER BUDGET: vision 11" in row.note
    assert "vision by check: V3 9, V2 2" in row.note  # which checks spend the passes
    assert realistic.domain_budget_row(active[:1]).ok is True
    assert realistic.domain_budget_row(active[2:]) is None  # train is no data domain
    # the passes inside one call of the user's own sampling routine are shown apart, not judged
    diffusion = rows.Row(
        "active",
        "d",
        "",
        "",
        "",
        "",
        True,
        "",
        {"domain": "diffusion", "forward_by_domain": {"diffusion": 15}, "routine_by_domain": {"diffusion": 6}},
    )
    row = realistic.domain_budget_row([diffusion])
    assert row.ok is True and row.measured == "diffusion 9 (+6 in one call of your sampling routine)"


def test_quick_mode_reduces_every_size():
    args = run.parse_args(["--quick"])
    assert (args.tests, args.repeats, args.warmup, args.domains, args.sizes, args.small_model) == (
        20,
        1,
        0,
        "llm",
        "10,10000",
        True,
    )
    assert run.parse_args([]).tests == 300 and run.parse_args([]).sizes == "1000,1000000"


# ---- end to end, reduced -------------------------------------------------------------------------------


def test_benchmark_runs_end_to_end_at_a_reduced_size(tmp_path):
    out = tmp_path / "bench.json"
    proc = subprocess.run(
        [
            PY,
            str(REPO / "benchmarks" / "run.py"),
            "--quick",
            "--only",
            "inactive,scale,gpu,realistic,realistic-loop,realistic-vision,realistic-memory",
            "--no-check",
            "--quiet",
            "--json",
            str(out),
        ],
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "| figure" in proc.stdout and "load average" in proc.stdout and "machine:" in proc.stdout
    rows = {r["section"]: r for r in json.loads(out.read_text())["rows"]}
    inactive = rows["inactive"]["data"]
    assert "torch" not in inactive["heavy_installed"] and inactive["imported_alone"] == []
    assert inactive["installed"]["n"] == inactive["no:dlcheck"]["n"] == 1 and inactive["ratio"] > 0
    scale = rows["scale"]["data"]
    assert scale["outcomes_large"] == scale["outcomes_small"] and scale["outcomes_small"].get("passed", 0) >= 3
    assert "failed" not in scale["outcomes_small"]
    if not torch.cuda.is_available():
        assert rows["gpu"]["ok"] is None and "not taken" in rows["gpu"]["note"]
    # the training checks on a model, counted in work: passes and optimizer steps per check beside the ratio
    realistic = rows["realistic"]["data"]
    assert realistic["passes"]["optimizer_steps"] >= 20 and realistic["passes"]["forward"] > 0
    assert realistic["steps_by_check"].get("T2", 0) >= 1 and realistic["ratio"] > 0
    assert realistic["floor_step"]["optimizer_step"] is True  # the floor: the objects and one whole training step
    assert realistic["training_state_mib"] > 0
    # the same model in a hand loop, and a ResNet with vision checks too: every row's floor and measured side ran
    for section, domains in (("realistic-loop", {"train", "ckpt", "smoke"}), ("realistic-vision", {"vision"})):
        row = rows[section]
        data = row["data"]
        assert "NOT CLEAN" not in row["note"] and "could not measure" not in row["note"], row["note"]
        assert data["floor_step"]["optimizer_step"] is True and data["floor_step"]["loss"] > 0
        assert data["training_state_mib"] > 0  # the budget's unit: weights, gradients and optimizer moments
        assert domains <= set(data["work_by_domain"]) and data["outcomes"].get("passed", 0) >= 10
        assert data["training_steps"] >= 20 and data["ratio"] > 0  # at least the 20-step smoke run
        assert data["training_steps"] == sum(
            w["optimizer_steps"] for w in data["work_by_check"].values() if w["domain"] in ("train", "ckpt", "smoke")
        )
        assert row["ok"] is (
            data["copies"] <= 1
            and data["training_steps"] <= 60
            and all(n <= 10 for n in data["forward_by_data_domain"].values())
        )
    assert set(rows["realistic-vision"]["data"]["forward_by_data_domain"]) == {"vision"}
    assert "ResNet" in rows["realistic-vision"]["figure"] and "plain-loop" in rows["realistic-loop"]["figure"]
    # peak RSS counted in training states over the floor (quick mode: a small MLP, so the count is not judged)
    memory = rows["realistic-memory"]
    data = memory["data"]
    assert "NOT CLEAN" not in memory["note"] and "could not measure" not in memory["note"], memory["note"]
    assert data["outcomes"].get("passed", 0) >= 10 and data["floor_step"]["optimizer_step"] is True
    assert data["training_state_mib"] == pytest.approx(4 * data["trainable_mib"], rel=0.01)  # AdamW
    assert data["states"] == pytest.approx(data["extra_rss_mib"] / data["training_state_mib"])
    assert data["peak_check"] and memory["ok"] is (data["states"] <= 1)
    assert "training states" in memory["note"] and "MLP" in memory["figure"]


def test_every_example_rows_floor_runs(tmp_path):
    """The benchmark cannot rot: the floor side of every example's row (its own fixtures, one batch, one
    forward and backward pass) runs as the benchmark runs it, whatever way the example defines its fixtures
    (examples/diffusion generates them into its conftest's globals); the measured side of each row is the
    examples' --dlcheck=all run of tests/reliability."""
    ctx = run.Context(python=PY, workdir=tmp_path, repeats=1, warmup=0, threads=1, metric="cpu", verbose=False)
    procs = {}
    for domain in projects.example_domains():
        if domain not in dlbench_floor.STEPS:
            continue
        project = projects.example_project(domain, tmp_path / "examples")
        out = tmp_path / f"floor-{domain}.json"
        procs[domain] = (
            subprocess.Popen(
                [PY, "-m", "pytest", "-q", "-p", "no:cacheprovider", *project.floor_args()],
                cwd=project.root,
                env=ctx.env(DLBENCH_FLOOR_OUT=str(out)),
                stdout=subprocess.PIPE,
                stderr=subprocess.STDOUT,
                text=True,
            ),
            out,
        )
    assert {"llm", "vision", "diffusion", "train", "rl"} <= set(procs)
    for domain, (proc, out) in procs.items():
        text, _ = proc.communicate(timeout=300)
        assert proc.returncode == 0, f"{domain} floor:\n{text[-3000:]}"
        info = json.loads(out.read_text())
        assert info["trainable_bytes"] > 0 or "loss" in info, (domain, info)


def test_corpus_rows_judge_the_work_and_wall_budgets_of_each_project(tmp_path):
    """benchmarks/corpus.py reads a corpus project's --dlcheck=all JSON report: the data domains' forward passes
    (a check's own and the no-training shared runs it read; a shared training run is not a data domain's), the
    step time from the smoke run's user seconds per step, the wall budget (70 steps + 15 s) and the plugin's share."""
    from benchmarks import corpus

    def result(cid, domain, forward, made=(), waited=(), steps=0):
        return {
            "id": cid,
            "domain": domain,
            "cost": {"forward": forward, "backward": 0, "optimizer_steps": steps},
            "time": {"user": 0.0, "user_by": {}, "shared_made": list(made), "shared_waited": list(waited)},
        }

    def shared(forward, steps, user=0.0):
        return {
            "seconds": user,
            "user": user,
            "plugin": 0.0,
            "made_by": "L1",
            "cost": {"forward": forward, "optimizer_steps": steps},
        }

    cheap = {
        "results": [result("L1", "llm", 3, made=["lm:batch_forward"]), result("L6", "llm", 2, made=["smoke run"])],
        "shared": {"lm:batch_forward": shared(2, 0), "smoke run": shared(20, 20, user=0.2)},
        "cost": {"forward": 27, "backward": 20, "optimizer_steps": 20},
        "time": {"checks": 10.0, "user": 8.0, "plugin": 2.0, "plugin_share": 0.2},
    }
    costly = {
        "results": [result("L1", "llm", 9, waited=["lm:batch_forward"]), result("T2", "train", 30, steps=30)],
        "shared": {"lm:batch_forward": shared(4, 0), "smoke run": shared(20, 20, user=20.0)},
        "cost": {"forward": 63, "backward": 50, "optimizer_steps": 50},
        "time": {"checks": 100.0, "user": 50.0, "plugin": 50.0, "plugin_share": 0.5},
    }
    assert corpus.domain_forward(cheap) == {"llm": {"L1": 3, "shared: lm:batch_forward": 2, "L6": 2}}
    for name, doc in (("costly", costly), ("cheap", cheap)):
        (tmp_path / f"{name}.json").write_text(json.dumps(doc))
    rows = corpus.corpus_rows(tmp_path)
    assert [r.figure for r in rows] == ["--dlcheck=all on cheap", "--dlcheck=all on costly"]  # by step time
    assert rows[0].ok and rows[0].reference == "step 10 ms" and "≤ 15.7 s" in rows[0].budget
    assert not rows[1].ok and "llm 13 forward passes" in rows[1].note and "plugin 50%" in rows[1].note
    assert rows[1].data["wall"]["budget"] == pytest.approx(70 * 1.0 + 15)
