"""L6 (information): the mean log Z of the logits, at initialisation and after the shared smoke run. It
never fails; the numbers it reports are real measurements — a run with a strong z-loss pulls log Z
down, a plain run at a high learning rate lets it rise."""

import json
import re

import tiny  # noqa: F401
from helpers import work_of

LOOP = """
    import pytest, tiny, torch
    from torch.utils.data import DataLoader
    from transformers import DataCollatorForLanguageModeling

    @pytest.fixture(scope="session")
    def dlcheck_tokenizer():
        return tiny.tokenizer()

    @pytest.fixture(scope="session")
    def dlcheck_make_training(dlcheck_tokenizer):
        def make():
            model = tiny.llama(dlcheck_tokenizer)
            return {{"model": model, "optimizer": torch.optim.AdamW(model.parameters(), lr=1e-2)}}
        return make

    @pytest.fixture(scope="session")
    def dlcheck_dataloader(dlcheck_tokenizer):
        return DataLoader(tiny.tokenized(dlcheck_tokenizer), batch_size=4, shuffle=True,
                          collate_fn=DataCollatorForLanguageModeling(dlcheck_tokenizer, mlm=False))

    @pytest.fixture(scope="session")
    def dlcheck_train_step():
        def step(state, batch, index):
            out = state["model"](**batch)
            z = torch.logsumexp(out.logits.float(), dim=-1)
            loss = out.loss + {z_loss} * (z[batch["labels"] != -100] ** 2).mean()
            loss.backward()
            state["optimizer"].step()
            state["optimizer"].zero_grad()
            return out.loss
        return step
"""

DRIFT = re.compile(
    r"mean log Z ([\d.]+) \(range .*?\) at initialisation, ([\d.]+) \(range .*?\) after 20 smoke steps "
    r"of fresh objects from dlcheck_make_training, trained by dlcheck_train_step: ([-+][\d.]+)"
)


def _drift(project, z_loss: float) -> tuple[float, float, float]:
    project.conftest(LOOP.format(z_loss=z_loss))
    run = project.run("--dlcheck=L6,S1")
    run.assert_outcome("L6", "skipped")
    m = DRIFT.search(" ".join(run.text.split()))
    assert m, run.text
    assert "ln(vocabulary 300) = 5.7" in run.text and "z-loss (1e-4 · log²Z added to the loss)" in run.text
    return float(m.group(1)), float(m.group(2)), float(m.group(3))


def test_a_plain_run_lets_log_z_rise(project):
    before, after, drift = _drift(project, 0.0)
    assert 5.6 < before < 5.9  # small logits at initialisation: log Z near ln(vocabulary)
    assert drift > 0.1 and abs((after - before) - drift) < 0.01


def test_a_strong_z_loss_pulls_log_z_down(project):
    before, after, drift = _drift(project, 0.1)
    assert drift < -1.0 and after < before


def test_a_model_alone_reports_its_current_weights(project):
    project.conftest("""
    import pytest, tiny
    from transformers import DataCollatorForLanguageModeling

    @pytest.fixture(scope="session")
    def dlcheck_tokenizer():
        return tiny.tokenizer()

    @pytest.fixture(scope="session")
    def dlcheck_model(dlcheck_tokenizer):
        return tiny.llama(dlcheck_tokenizer)

    @pytest.fixture(scope="session")
    def dlcheck_collator(dlcheck_tokenizer):
        return DataCollatorForLanguageModeling(dlcheck_tokenizer, mlm=False)

    @pytest.fixture(scope="session")
    def dlcheck_dataset(dlcheck_tokenizer):
        return tiny.tokenized(dlcheck_tokenizer)
    """)
    run = project.run("--dlcheck=L6")
    run.assert_outcome("L6", "skipped")
    text = " ".join(run.text.split())
    assert re.search(
        r"info: mean log Z 5\.\d+ \(range [\d.]+ to [\d.]+, \d+ positions\) on dlcheck_collator on 8 "
        r"examples of dlcheck_dataset with the current weights",
        text,
    ), text
    assert (
        "after a short run: not measured: give a training (dlcheck_trainer, dlcheck_make_training or a Lightning "
        "module) and select the smoke checks to measure how the shared smoke run moves log Z"
    ) in text
    run.fnmatch(["*dlcheck summary*", "info:      L6 mean log Z 5.* with the current weights; ln(vocabulary 300)*"])


SHARED = """
    import pytest, tiny, torch
    from transformers import DataCollatorForLanguageModeling

    @pytest.fixture(scope="session")
    def dlcheck_tokenizer():
        return tiny.tokenizer()

    @pytest.fixture(scope="session")
    def dlcheck_model(dlcheck_tokenizer):
        model = tiny.llama(dlcheck_tokenizer)
        with torch.no_grad():
            for _ in range(3):  # the user's own work while building the fixture: not the checks'
                model(input_ids=torch.tensor([[1, 2, 3]]))
        return model

    @pytest.fixture(scope="session")
    def dlcheck_collator(dlcheck_tokenizer):
        return DataCollatorForLanguageModeling(dlcheck_tokenizer, mlm=False)

    @pytest.fixture(scope="session")
    def dlcheck_dataset(dlcheck_tokenizer):
        return tiny.tokenized(dlcheck_tokenizer)
"""


def _costs_and_log_z(project, tmp_path, selection: str) -> tuple[dict, str]:
    out = tmp_path / f"{selection.replace(',', '_')}.json"
    run = project.run(f"--dlcheck={selection}", f"--dlcheck-json={out}")
    run.assert_outcome("L6", "skipped")
    doc = json.loads(out.read_text())
    results = {r["id"]: r for r in doc["results"]}
    z = re.search(r"mean log Z ([\d.]+ \(range [\d.]+ to [\d.]+, \d+ positions\))", results["L6"]["reason"])
    assert z, results["L6"]["reason"]
    return {k: work_of(doc, k) for k in results}, z.group(1)


def test_log_z_comes_from_the_batch_forward_l1_shares(project, tmp_path):
    """One forward per sampled batch serves L1's in-batch losses and L6's log Z: after L1, L6 runs no pass
    of its own, and alone it runs one (its 4 rows lie in the first batch), not one per row; the passes the
    user's fixture makes while it is built are not counted."""
    project.conftest(SHARED)
    alone, z_alone = _costs_and_log_z(project, tmp_path, "L6")
    assert alone["L6"]["forward"] == 1, alone
    both, z_both = _costs_and_log_z(project, tmp_path, "L1,L6")
    assert both["L6"]["forward"] == 0 and both["L1"]["forward"] >= 2, both
    assert z_both == z_alone


def test_without_the_smoke_checks_nothing_is_trained(project):
    """--dlcheck=llm alone must not pay for a training run: L6 reads the model the factory builds as it is."""
    project.conftest(LOOP.format(z_loss=0.0))
    run = project.run("--dlcheck=L6")
    run.assert_outcome("L6", "skipped")
    text = " ".join(run.text.split())
    assert "after 20 smoke steps" not in text
    assert "on 2 batches of dlcheck_dataloader with the current weights" in text
    assert "after a short run: not measured: select the smoke checks (--dlcheck=llm,smoke)" in text


SFT_TRAINER = """
    import pytest, tiny
    from datasets import Dataset
    from trl import SFTConfig, SFTTrainer

    @pytest.fixture(scope="session")
    def dlcheck_trainer(tmp_path_factory):
        tok = tiny.tokenizer(padding_side="right")
        ds = Dataset.from_dict({"text": tiny.texts(8)})
        args = tiny.trainer_args(tmp_path_factory.mktemp("sft"), SFTConfig, max_length=64)
        return SFTTrainer(model=tiny.llama(tok), args=args, train_dataset=ds, processing_class=tok)
"""


def test_information_never_starts_the_smoke_run_on_a_trainer(project, tmp_path):
    """An information item reports what is measured anyway: alone, or beside a smoke check that does not
    read the shared smoke run (S4 concerns DPO only), L6 on a Trainer makes no optimizer step (the cost
    counters of the JSON report) and says the drift was not measured; it skips, never fails."""
    project.conftest(SFT_TRAINER)
    for selection in ("L6", "L6,S4"):
        out = tmp_path / f"{selection.replace(',', '_')}.json"
        run = project.run(f"--dlcheck={selection}", f"--dlcheck-json={out}")
        run.assert_outcome("L6", "skipped")
        doc = json.loads(out.read_text())
        results = {r["id"]: r for r in doc["results"]}
        assert work_of(doc, "L6")["optimizer_steps"] == 0, (selection, doc["shared"])
        assert doc["cost"]["optimizer_steps"] == 0, selection  # the checks' and the shared runs' together
        reason = " ".join(results["L6"]["reason"].split())
        assert reason.startswith("info: mean log Z ") and "with the current weights" in reason, reason
        assert "after a short run: not measured: select the smoke checks (--dlcheck=llm,smoke)" in reason


def test_the_drift_rides_on_the_smoke_run_a_selected_smoke_check_makes(project, tmp_path):
    """With S1 selected the shared smoke run is made anyway: L6 reads it (the run counted once, for the
    first check that asked) and reports the drift; S1 trains nothing more."""
    project.conftest(SFT_TRAINER)
    out = tmp_path / "r.json"
    run = project.run("--dlcheck=L6,S1", f"--dlcheck-json={out}")
    run.assert_outcome("L6", "skipped")
    doc = json.loads(out.read_text())
    results = {r["id"]: r for r in doc["results"]}
    assert re.search(
        r"at initialisation, .* after \d+ smoke steps of a clone of your SFTTrainer", results["L6"]["reason"]
    )
    # the smoke run's steps are the run's (made while L6 waited for it), not L6's own work nor S1's
    assert doc["shared"]["smoke run"]["cost"]["optimizer_steps"] > 0 and doc["shared"]["smoke run"]["made_by"] == "L6"
    assert results["L6"]["cost"]["optimizer_steps"] == 0 and work_of(doc, "S1")["optimizer_steps"] == 0
    # log Z of the first batch's rows on the fresh model and on the trained one: one forward of that batch each,
    # not one per row of two batches (8 passes before: the llm domain's 10-pass budget on the corpus's SFT recipe)
    assert results["L6"]["cost"]["forward"] == 2, results["L6"]["cost"]


UNET_WITH_TEXT = """
    import pytest, tiny
    from diffusers import UNet2DConditionModel
    from transformers import DataCollatorForLanguageModeling

    @pytest.fixture(scope="session")
    def dlcheck_tokenizer():
        return tiny.tokenizer()

    @pytest.fixture(scope="session")
    def dlcheck_model():  # a text-to-image UNet: the captions are tokenized, the model is not called on them
        return UNet2DConditionModel(sample_size=8, in_channels=4, out_channels=4, layers_per_block=1,
                                    block_out_channels=(16, 32), norm_num_groups=8, cross_attention_dim=16,
                                    down_block_types=("CrossAttnDownBlock2D", "DownBlock2D"),
                                    up_block_types=("UpBlock2D", "CrossAttnUpBlock2D"), attention_head_dim=4)

    @pytest.fixture(scope="session")
    def dlcheck_dataset(dlcheck_tokenizer):
        return tiny.tokenized(dlcheck_tokenizer)

    @pytest.fixture(scope="session")
    def dlcheck_collator(dlcheck_tokenizer):
        return DataCollatorForLanguageModeling(dlcheck_tokenizer, mlm=False)
"""


def test_a_unet_is_not_called_on_token_batches(project):
    """A UNet's forward takes noisy latents, timesteps and text states, not the caption batch: the llm domain's
    kind rule (a diffusers denoiser is no language model) makes L6 not applicable before anything calls the
    model, instead of blaming dlcheck_model for raising."""
    project.conftest(UNET_WITH_TEXT)
    run = project.run("--dlcheck=L6", "-rs")
    run.assert_outcome("L6", "skipped")
    run.fnmatch(
        [
            "*not applicable: dlcheck_model is a diffusers UNet2DConditionModel, a denoiser: *is no language model's input*"
        ]
    )
    assert "raised" not in run.text
