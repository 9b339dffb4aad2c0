"""C1 proves before it gives up: when no piece put back makes the resumed run identical, the uninterrupted run
is run a second time; if the two agree, the resume is broken (a failure that says where the runs part), and
only if they differ is the run "not reproducible". What the load's load_state_dict (and PEFT) reported is
evidence."""

import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "train"))
import tiny_train as tt  # noqa: E402


def _c1(out: Path) -> dict:
    return next(r for r in json.loads(out.read_text())["results"] if r["id"] == "C1")


#: a loop whose warmup is computed from its own step counter, a plain dict the checkpoint does not hold
#: (``counter`` True: it does): the resumed run restarts the warmup, and no torch object put back repairs it
COUNTER_LOOP = """
    import pytest, torch, tiny_train as tt
    from torch import nn

    @pytest.fixture(scope="session")
    def dlcheck_make_training():
        def make():
            model = tt.MLP()
            return {{"model": model, "optimizer": torch.optim.AdamW(model.parameters(), lr=1e-2),
                     "progress": {{"step": 0}}}}
        return make

    @pytest.fixture(scope="session")
    def dlcheck_dataloader():
        return tt.loader()

    @pytest.fixture(scope="session")
    def dlcheck_train_step():
        def step(state, batch):
            model, opt, progress = state["model"], state["optimizer"], state["progress"]
            for group in opt.param_groups:
                group["lr"] = 1e-2 * tt.warmup(3)(progress["step"])
            x, y = batch
            loss = nn.functional.cross_entropy(model(x), y)
            loss.backward()
            opt.step()
            opt.zero_grad(set_to_none=True)
            progress["step"] += 1
            return loss.detach()
        return step

    @pytest.fixture(scope="session")
    def dlcheck_save_checkpoint():
        def save(state, path):
            ckpt = {{"model": state["model"].state_dict(), "optimizer": state["optimizer"].state_dict()}}
            if {counter}:
                ckpt["step"] = state["progress"]["step"]
            torch.save(ckpt, path)
        return save

    @pytest.fixture(scope="session")
    def dlcheck_load_checkpoint():
        def load(state, path):
            ckpt = torch.load(path, weights_only=False)
            state["model"].load_state_dict(ckpt["model"])
            state["optimizer"].load_state_dict(ckpt["optimizer"])
            if {counter}:
                state["progress"]["step"] = ckpt["step"]
        return load
"""


def test_a_warmup_restarted_from_the_loops_own_counter_fails_c1(project, tmp_path):
    project.conftest(COUNTER_LOOP.format(counter=False))
    out = tmp_path / "r.json"
    run = project.run("--dlcheck=C1", f"--dlcheck-json={out}")
    run.assert_outcome("C1", "failed")
    c1 = _c1(out)
    text = " ".join(c1["evidence"])
    # where the runs part: the resumed step 3 trains at warmup step 0's rate (1/3 of it), not step 2's
    assert "at step 3 learning rate 0.00333333 resumed vs 0.01 uninterrupted" in text, text
    assert "learning rates resumed vs uninterrupted: step 3: 0.00333333 vs 0.01, step 4: 0.00666667 vs 0.01" in text
    assert "run a second time the same way, equals the first bitwise" in text, text
    assert "putting back every piece of the state from the uninterrupted run after the load (optimizer, model" in text
    assert "does not make the resumed run identical: it still parts at step 3 (learning rate" in text, text
    assert "step or epoch counter" in c1["cause"], c1["cause"]
    assert "save your step counter" in c1["fix"], c1["fix"]
    assert "not reproducible" not in run.text


def test_a_loop_that_saves_its_counter_resumes_exactly(project):
    project.conftest(COUNTER_LOOP.format(counter=True))
    run = project.run("--dlcheck=C1")
    run.assert_outcome("C1", "passed")


def test_a_run_that_does_not_reproduce_itself_is_not_judged(project, tmp_path):
    """The step adds noise drawn from a generator created once when the conftest is imported and never seeded
    again: every run, the uninterrupted one run twice included, trains on other noise. Not a broken resume: a
    run that cannot be compared with itself, said as such."""
    noisy = """
    GEN = torch.Generator().manual_seed(0)

    @pytest.fixture(scope="session")
    def dlcheck_train_step():
        def step(state, batch):
            x, y = batch
            x = x + 0.1 * torch.randn(x.shape, generator=GEN)
            loss = nn.functional.cross_entropy(state["model"](x), y)
            loss.backward()
            state["optimizer"].step()
            state["lr_scheduler"].step()
            state["optimizer"].zero_grad(set_to_none=True)
            return loss.detach()
        return step

    @pytest.fixture(scope="session")
    def dlcheck_save_checkpoint():
        return tt.save_all

    @pytest.fixture(scope="session")
    def dlcheck_load_checkpoint():
        return tt.load_all
"""
    project.conftest(tt.loop_project(extra=noisy))
    out = tmp_path / "r.json"
    project.run("--dlcheck=C1", f"--dlcheck-json={out}")
    c1 = _c1(out)
    assert c1["outcome"] == "skipped", c1
    assert "run a second time the same way, differs from the first at step 3" in c1["reason"], c1
    assert "not reproducible" in c1["reason"]


#: the model trained inside a DataParallel wrapper; the checkpoint holds the unwrapped module's weights and the
#: load puts them into the wrapper with strict=False: every key is "module."-less, nothing loads
WRAPPED = """
    @pytest.fixture(scope="session")
    def dlcheck_make_training():
        def make():
            model = nn.DataParallel(tt.MLP())
            optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2)
            return {{"model": model, "optimizer": optimizer,
                     "lr_scheduler": torch.optim.lr_scheduler.LambdaLR(optimizer, tt.warmup(3))}}
        return make

    @pytest.fixture(scope="session")
    def dlcheck_save_checkpoint():
        def save(state, path):
            torch.save({{"model": state["model"].module.state_dict(), "optimizer": state["optimizer"].state_dict(),
                        "lr_scheduler": state["lr_scheduler"].state_dict()}}, path)
        return save

    @pytest.fixture(scope="session")
    def dlcheck_load_checkpoint():
        def load(state, path):
            ckpt = torch.load(path, weights_only=False)
            state["model"].load_state_dict(ckpt["model"], strict=False)
            state["optimizer"].load_state_dict(ckpt["optimizer"])
            state["lr_scheduler"].load_state_dict(ckpt["lr_scheduler"])
        return load
"""


def test_weights_whose_keys_do_not_match_the_model_fail_c1_with_the_keys(project, tmp_path):
    project.conftest(tt.loop_project(extra=WRAPPED.format()))
    out = tmp_path / "r.json"
    run = project.run("--dlcheck=C1", f"--dlcheck-json={out}")
    run.assert_outcome("C1", "failed")
    c1 = _c1(out)
    text = " ".join(c1["evidence"])
    assert "putting back model from the uninterrupted run after the load makes the resumed run identical" in text
    assert "your load reported: DataParallel.load_state_dict(strict=False): 4 of the model's keys missing" in text
    assert "'module.body.0.weight'" in text and "4 unexpected keys in what was loaded ('body.0.weight'" in text, text
    assert "strict=True" in c1["fix"] and "'module.'" in c1["fix"], c1["fix"]


def test_weights_loaded_into_the_wrapped_module_resume_exactly(project):
    extra = WRAPPED.format().replace('state["model"].load_state_dict', 'state["model"].module.load_state_dict')
    project.conftest(tt.loop_project(extra=extra))
    run = project.run("--dlcheck=C1")
    run.assert_outcome("C1", "passed")


#: a LoRA model trained in a plain loop; the resume loads the adapter checkpoint ``how``
LORA_LOOP = """
    import pytest, tiny, torch
    import tiny_train as tt
    from peft import LoraConfig, PeftModel, get_peft_model, set_peft_model_state_dict
    from safetensors.torch import load_file

    @pytest.fixture(scope="session")
    def dlcheck_tokenizer():
        return tiny.tokenizer()

    @pytest.fixture(scope="session")
    def dlcheck_dataloader(dlcheck_tokenizer):
        return tt.llm_loader(dlcheck_tokenizer)

    @pytest.fixture(scope="session")
    def dlcheck_make_training(dlcheck_tokenizer):
        def make():
            torch.manual_seed(0)
            lora = LoraConfig(r=4, lora_alpha=8, target_modules=["q_proj", "v_proj"])
            model = get_peft_model(tiny.llama(dlcheck_tokenizer), lora)
            return {{"model": model, "optimizer": torch.optim.AdamW(model.parameters(), lr=1e-2)}}
        return make

    @pytest.fixture(scope="session")
    def dlcheck_compute_loss():
        return lambda model, batch: model(**batch).loss

    @pytest.fixture(scope="session")
    def dlcheck_save_checkpoint():
        def save(state, path):
            state["model"].save_pretrained(path)  # the adapter only
            torch.save(state["optimizer"].state_dict(), f"{{path}}/optimizer.pt")
        return save

    @pytest.fixture(scope="session")
    def dlcheck_load_checkpoint():
        def load(state, path):
            {how}
            state["optimizer"].load_state_dict(torch.load(f"{{path}}/optimizer.pt"))
        return load
"""


def test_an_adapter_loaded_onto_the_already_wrapped_model_fails_c1_with_the_missing_adapter_keys(project, tmp_path):
    """PeftModel.from_pretrained(model, path) on the model get_peft_model already wrapped wraps it a second time:
    the saved adapter keys match nothing, PEFT warns of missing adapter keys, and the model trains on from its
    fresh adapter. No piece put back repairs a model whose structure the load changed; the uninterrupted run,
    run twice, is identical: the resume is broken, and the keys say why."""
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
    how = 'PeftModel.from_pretrained(state["model"], path, is_trainable=True)'
    project.conftest(LORA_LOOP.format(how=how))
    out = tmp_path / "r.json"
    run = project.run("--dlcheck=C1", f"--dlcheck-json={out}")
    c1 = _c1(out)
    assert c1["outcome"] == "failed", run.text[-3000:]
    text = " ".join(c1["evidence"])
    assert "run a second time the same way, equals the first bitwise" in text, text
    assert "your load reported: PEFT: Found missing adapter keys while loading the checkpoint" in text, text
    assert "unexpected keys in what was loaded" in text, text
    assert "set_peft_model_state_dict" in c1["fix"] and "a second time" in c1["fix"], c1["fix"]
    assert "not reproducible" not in run.text


def test_an_adapter_loaded_into_the_trained_model_resumes_exactly(project):
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
    how = 'set_peft_model_state_dict(state["model"], load_file(f"{path}/adapter_model.safetensors"))'
    project.conftest(LORA_LOOP.format(how=how))
    run = project.run("--dlcheck=C1")
    run.assert_outcome("C1", "passed")


COUNTED_MODULE = """
    import pytest, torch, tiny_lightning as tl

    class Counted(tl.Classifier):
        \"\"\"A warmup computed from the module's own count of batches seen (``saved``: kept in the checkpoint
        through on_save_checkpoint / on_load_checkpoint).\"\"\"

        def __init__(self, saved, **kw):
            super().__init__(**kw)
            self.saved, self.seen = saved, 0

        def training_step(self, batch, batch_idx):
            for group in self.trainer.optimizers[0].param_groups:
                group["lr"] = 1e-2 * min(1.0, (self.seen + 1) / 3)
            self.seen += 1
            return super().training_step(batch, batch_idx)

        def configure_optimizers(self):
            return torch.optim.AdamW(self.parameters(), lr=1e-2)

        def on_save_checkpoint(self, checkpoint):
            if self.saved:
                checkpoint["seen"] = self.seen

        def on_load_checkpoint(self, checkpoint):
            if self.saved:
                self.seen = checkpoint["seen"]

    @pytest.fixture(scope="session")
    def dlcheck_lightning_module():
        torch.manual_seed(0)
        return Counted({saved})

    @pytest.fixture(scope="session")
    def dlcheck_datamodule():
        return tl.Blobs()
"""


def test_a_lightning_warmup_restarted_from_the_modules_own_counter_fails_c1(project, tmp_path):
    project.conftest(COUNTED_MODULE.format(saved=False))
    out = tmp_path / "r.json"
    run = project.run("--dlcheck=C1", f"--dlcheck-json={out}")
    run.assert_outcome("C1", "failed")
    c1 = _c1(out)
    text = " ".join(c1["evidence"])
    assert "at step 3 learning rate 0.00333333 resumed vs 0.01 uninterrupted" in text, text
    # the module's own counter, outside its state_dict, is the piece that putting back makes the runs identical
    assert "putting back module attributes from the uninterrupted run after the load makes the resumed run" in text
    assert c1["cause"].startswith(
        "the checkpoint does not restore the LightningModule's own attributes self.seen, which training changed"
    ), c1["cause"]
    assert "save self.seen in the module's on_save_checkpoint(checkpoint)" in c1["fix"], c1["fix"]
    assert "not reproducible" not in run.text


def test_a_lightning_counter_kept_in_the_checkpoint_resumes_exactly(project):
    project.conftest(COUNTED_MODULE.format(saved=True))
    run = project.run("--dlcheck=C1")
    run.assert_outcome("C1", "passed")
