"""C1 when the resume's own loading raises on the checkpoint the pipeline's own save wrote (torchvision's
references save ``args``, an argparse.Namespace, and resume with a plain ``torch.load``: weights_only=True by
default since torch 2.6 refuses it). That is C1's finding, a failure with the exception as evidence, not an
error; C3 skips naming C1. The same for Lightning's own fit(ckpt_path=...) on a .ckpt whose hyperparameters
hold a Namespace."""

import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "train"))
import tiny_lightning as tl  # noqa: E402
import tiny_train as tt  # noqa: E402


def _results(out: Path) -> dict:
    return {r["id"]: r for r in json.loads(out.read_text())["results"]}


#: torchvision's references/classification/train.py: checkpoint["args"] = args; resume with torch.load(path)
NAMESPACE_CKPT = """
    import argparse

    @pytest.fixture(scope="session")
    def dlcheck_save_checkpoint():
        def save(state, path):
            torch.save({{"model": state["model"].state_dict(), "optimizer": state["optimizer"].state_dict(),
                        "lr_scheduler": state["lr_scheduler"].state_dict(), "args": {args}}}, path)
        return save

    @pytest.fixture(scope="session")
    def dlcheck_load_checkpoint():
        def load(state, path):
            ckpt = torch.load(path, map_location="cpu"{load})
            state["model"].load_state_dict(ckpt["model"])
            state["optimizer"].load_state_dict(ckpt["optimizer"])
            state["lr_scheduler"].load_state_dict(ckpt["lr_scheduler"])
        return load
"""


def _loop(args: str, load: str = "") -> str:
    return tt.loop_project(extra=NAMESPACE_CKPT.format(args=args, load=load))


def test_a_checkpoint_holding_a_namespace_that_torch_load_refuses_fails_c1_with_the_exception(project, tmp_path):
    project.conftest(_loop("argparse.Namespace(lr=0.01, epochs=2)"))
    out = tmp_path / "r.json"
    run = project.run("--dlcheck=C1,C3", f"--dlcheck-json={out}")
    results = _results(out)
    c1 = results["C1"]
    assert c1["outcome"] == "failed", c1
    text = tt.section(run, "C1")
    assert "your dlcheck_load_checkpoint on fresh objects raised on it, before any step was resumed" in text
    assert "UnpicklingError" in text and "argparse.Namespace" in text
    assert "checkpoint['args'] is an argparse.Namespace, pickled: torch.load(weights_only=True) refuses it" in text
    assert "weights_only=True (its default since torch 2.6) refuses the argparse.Namespace" in c1["cause"]
    assert "weights_only=False" in c1["fix"] and "vars(args)" in c1["fix"]
    assert "add_safe_globals([argparse.Namespace])" in c1["fix"]
    c3 = results["C3"]
    assert c3["outcome"] == "skipped" and "C1 reports it" in c3["reason"], c3


def test_a_refused_checkpoint_saved_past_the_planned_steps_says_no_contradiction(project, tmp_path):
    # a loop that checkpoints every 12 steps: the run is lengthened to save where it saves (blind set 12's Fabric
    # trainer read "4 steps, saved after step 10")
    project.conftest(
        _loop("argparse.Namespace(lr=0.01, epochs=2)")
        + "\n    @pytest.fixture(scope='session')\n    def dlcheck_checkpoint_every():\n        return 12\n"
    )
    run = project.run("--dlcheck=C1", "--dlcheck-set", "C1.steps=4")
    run.assert_outcome("C1", "failed")
    text = " ".join(tt.section(run, "C1").split())
    assert "the run, saved after step 12 by your dlcheck_save_checkpoint" in text, text


def test_the_same_checkpoint_with_plain_args_resumes(project, tmp_path):
    project.conftest(_loop("vars(argparse.Namespace(lr=0.01, epochs=2))"))
    out = tmp_path / "r.json"
    project.run("--dlcheck=C1", f"--dlcheck-json={out}")
    assert _results(out)["C1"]["outcome"] == "passed"


def test_the_namespace_loaded_with_weights_only_false_resumes(project, tmp_path):
    project.conftest(_loop("argparse.Namespace(lr=0.01, epochs=2)", load=", weights_only=False"))
    out = tmp_path / "r.json"
    project.run("--dlcheck=C1", f"--dlcheck-json={out}")
    assert _results(out)["C1"]["outcome"] == "passed"


def test_a_load_raising_for_another_reason_fails_c1_with_its_exception(project, tmp_path):
    """No refused global: the exception itself is the evidence, the cause says the load cannot read the save."""
    broken = """
    @pytest.fixture(scope="session")
    def dlcheck_save_checkpoint():
        return tt.save_all

    @pytest.fixture(scope="session")
    def dlcheck_load_checkpoint():
        def load(state, path):
            state["lr_scheduler"].load_state_dict(torch.load(path, weights_only=False)["scheduler"])
        return load
"""
    project.conftest(tt.loop_project(extra=broken))
    out = tmp_path / "r.json"
    run = project.run("--dlcheck=C1", f"--dlcheck-json={out}")
    c1 = _results(out)["C1"]
    assert c1["outcome"] == "failed", c1
    assert "KeyError" in tt.section(run, "C1")
    assert "raises on the checkpoint the pipeline's own save writes" in c1["cause"]


LIGHTNING_NAMESPACE = """

    import argparse

    class WithArgs(tl.Classifier):
        def __init__(self, cfg=None, **kw):
            super().__init__(**kw)
            self.save_hyperparameters()

    @pytest.fixture(scope="session")
    def dlcheck_lightning_module():
        torch.manual_seed(0)
        return WithArgs(cfg={cfg})
"""


def test_lightning_fit_refusing_its_own_ckpt_fails_c1_not_a_traceback(project, tmp_path):
    project.conftest(tl.project() + LIGHTNING_NAMESPACE.format(cfg="argparse.Namespace(width=16)"))
    out = tmp_path / "r.json"
    run = project.run("--dlcheck=C1,C3", f"--dlcheck-json={out}")
    results = _results(out)
    c1 = results["C1"]
    assert c1["outcome"] == "failed", c1
    text = tt.section(run, "C1")
    assert "fit(ckpt_path=...) on fresh objects raised on it" in text and "UnpicklingError" in text
    assert "['hyper_parameters']['cfg'] is an argparse.Namespace" in text
    assert "weights_only=False" in c1["fix"] and "add_safe_globals([argparse.Namespace])" in c1["fix"]
    assert results["C3"]["outcome"] == "skipped" and "C1 reports it" in results["C3"]["reason"]


def test_lightning_with_plain_hyperparameters_resumes(project, tmp_path):
    project.conftest(tl.project() + LIGHTNING_NAMESPACE.format(cfg="dict(width=16)"))
    out = tmp_path / "r.json"
    project.run("--dlcheck=C1", f"--dlcheck-json={out}")
    assert _results(out)["C1"]["outcome"] == "passed"


#: a Trainer subclass whose LR scheduler keeps its config (an argparse.Namespace) as an attribute: LambdaLR's
#: state_dict holds every attribute, so scheduler.pt pickles the Namespace, and the Trainer's own resume loads
#: scheduler.pt with torch.load(weights_only=True)
SFT_SCHEDULER = """
    import argparse, pytest, tiny, torch
    from datasets import Dataset
    from trl import SFTConfig, SFTTrainer

    class Warmup(torch.optim.lr_scheduler.LambdaLR):
        def __init__(self, optimizer, cfg):
            self.cfg = cfg
            super().__init__(optimizer, lambda step: min(1.0, (step + 1) / 3))

    class MyTrainer(SFTTrainer):
        def create_scheduler(self, num_training_steps, optimizer=None):
            if self.lr_scheduler is None:
                self.lr_scheduler = Warmup(optimizer or self.optimizer, {cfg})
            return self.lr_scheduler

    @pytest.fixture(scope="session")
    def dlcheck_trainer(tmp_path_factory):
        tok = tiny.tokenizer()
        data = Dataset.from_dict({{"prompt": tiny.PROMPTS * 2, "completion": tiny.COMPLETIONS * 2}})
        args = tiny.trainer_args(tmp_path_factory.mktemp("o"), SFTConfig, learning_rate=1e-3)
        return MyTrainer(model=tiny.llama(tok), args=args, processing_class=tok, train_dataset=data)
"""


def test_a_trainer_whose_resume_refuses_its_own_scheduler_pt_fails_c1(project, tmp_path):
    project.conftest(SFT_SCHEDULER.format(cfg="argparse.Namespace(warmup=3)"))
    out = tmp_path / "r.json"
    run = project.run("--dlcheck=C1", f"--dlcheck-json={out}")
    c1 = _results(out)["C1"]
    assert c1["outcome"] == "failed", c1
    text = tt.section(run, "C1")
    assert "train(resume_from_checkpoint=...) on fresh objects raised on it" in text and "UnpicklingError" in text
    assert "scheduler.pt['cfg'] is an argparse.Namespace" in text
    assert "add_safe_globals([argparse.Namespace])" in c1["fix"]


def test_the_same_trainer_with_a_plain_config_resumes(project, tmp_path):
    project.conftest(SFT_SCHEDULER.format(cfg="dict(warmup=3)"))
    out = tmp_path / "r.json"
    project.run("--dlcheck=C1", f"--dlcheck-json={out}")
    assert _results(out)["C1"]["outcome"] == "passed"


#: the same checkpoint written through a temporary file and os.replace: the previous file is never touched
NAMESPACE_CKPT_ATOMIC = NAMESPACE_CKPT.replace(
    """"args": {args}}}, path)""",
    """"args": {args}}}, path + ".tmp")
            os.replace(path + ".tmp", path)""",
).replace("import argparse", "import argparse, os")


def test_c2_judges_a_save_onto_the_only_checkpoint_when_the_load_always_fails(project, tmp_path):
    """facebookresearch/deit (found blind, set 15): torch.save(checkpoint, 'checkpoint.pth') onto the only checkpoint,
    and a resume whose weights_only load refuses the Namespace on every checkpoint. C2 had skipped ('cannot judge'):
    the save that cut the previous checkpoint's own file is judged on the file's bytes; the load's own failure is
    said (C1 reports it)."""
    project.conftest(_loop("argparse.Namespace(lr=0.01, epochs=2)"))
    run = project.run("--dlcheck=C2")
    run.assert_outcome("C2", "failed")
    text = tt.section(run, "C2")
    assert "file sizes before and after the interrupted save: checkpoint: " in text
    assert (
        "(not loaded: dlcheck_load_checkpoint fails on the checkpoint dlcheck_save_checkpoint has just written" in text
    )
    assert "the file of the previous checkpoint now holds the first half of the new save's bytes" in text
    assert "writes straight onto the previous checkpoint's path" in text


def test_c2_does_not_judge_a_save_beside_the_checkpoint_when_the_load_always_fails(project, tmp_path):
    """Its twin: the save goes through a temporary file and os.replace, so the previous checkpoint is intact; with a
    load that fails on any checkpoint nothing more can be judged: C2 skips, saying why."""
    project.conftest(tt.loop_project(extra=NAMESPACE_CKPT_ATOMIC.format(args="argparse.Namespace(lr=0.01)", load="")))
    run = project.run("--dlcheck=C2", "-rA")
    run.assert_outcome("C2", "skipped")
    assert "cannot judge an interrupted save: dlcheck_load_checkpoint fails on the checkpoint" in " ".join(
        run.text.split()
    )
