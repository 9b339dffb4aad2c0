"""Clean training set-ups of the three kinds of users pass every check of train, ckpt and smoke that concerns
them (a check that does not apply says "not applicable", why); none fails, none skips undecided but the known
gaps listed."""

import json
import re

import pytest
import tiny_lightning as tl
import tiny_train as tt

SFT = """
    import pytest, tiny
    from datasets import Dataset
    from trl import SFTConfig, SFTTrainer

    @pytest.fixture(scope="session")
    def dlcheck_trainer(tmp_path_factory):
        tok = tiny.tokenizer()
        train = Dataset.from_dict({"prompt": tiny.PROMPTS[:4] * 3, "completion": tiny.COMPLETIONS[:4] * 3})
        held_out = Dataset.from_dict({"prompt": tiny.PROMPTS[4:], "completion": tiny.COMPLETIONS[4:]})
        args = tiny.trainer_args(tmp_path_factory.mktemp("sft"), SFTConfig, learning_rate=1e-3, warmup_steps=1)
        return SFTTrainer(model=tiny.llama(tok), args=args, processing_class=tok, train_dataset=train,
                          eval_dataset=held_out)
"""

DPO = """
    import copy, pytest, tiny
    from datasets import Dataset
    from trl import DPOConfig, DPOTrainer

    @pytest.fixture(scope="session")
    def dlcheck_trainer(tmp_path_factory):
        tok = tiny.tokenizer()
        model = tiny.llama(tok)
        data = Dataset.from_dict({"prompt": tiny.PROMPTS, "chosen": tiny.COMPLETIONS,
                                  "rejected": tiny.COMPLETIONS[1:] + tiny.COMPLETIONS[:1]})
        args = tiny.trainer_args(tmp_path_factory.mktemp("dpo"), DPOConfig, max_length=64, learning_rate=1e-3)
        return DPOTrainer(model=model, ref_model=copy.deepcopy(model), args=args, processing_class=tok, train_dataset=data)
"""

GRPO = """
    import pytest, tiny
    from datasets import Dataset
    from trl import GRPOConfig, GRPOTrainer

    def reward(completions, **kw):
        return [float(len(c)) for c in completions]

    @pytest.fixture(scope="session")
    def dlcheck_trainer(tmp_path_factory):
        tok = tiny.tokenizer()
        args = tiny.trainer_args(tmp_path_factory.mktemp("grpo"), GRPOConfig, num_generations=2, max_completion_length=8,
                                 beta=0.0, per_device_train_batch_size=4)
        return GRPOTrainer(model=tiny.llama(tok), reward_funcs=reward, args=args, processing_class=tok,
                           train_dataset=Dataset.from_dict({"prompt": tiny.PROMPTS}))
"""

SFT_PACKED = """
    import pytest, tiny
    from datasets import Dataset
    from trl import SFTConfig, SFTTrainer

    @pytest.fixture(scope="session")
    def dlcheck_trainer(tmp_path_factory):
        tok = tiny.tokenizer()
        args = tiny.trainer_args(tmp_path_factory.mktemp("packed"), SFTConfig, packing=True, max_length=64)
        return SFTTrainer(model=tiny.llama(tok), args=args, processing_class=tok,
                          train_dataset=Dataset.from_dict({"text": tiny.texts(12)}))
"""

LOOP = tt.loop_project(
    loader="tt.loader(shuffle=True)",
    extra="""
    @pytest.fixture(scope="session")
    def dlcheck_save_checkpoint():
        return tt.save_atomic

    @pytest.fixture(scope="session")
    def dlcheck_load_checkpoint():
        return tt.load_all
""",
)

#: packing makes TRL's SFTTrainer padding-free: it refuses a collator passed in, so its clones get none
PROJECTS = {
    "sft-trainer": SFT,
    "sft-packed-trainer": SFT_PACKED,
    "dpo-trainer": DPO,
    "grpo-trainer": GRPO,
    "lightning": tl.project(data="epoch_seed=0"),  # shuffled anew each epoch by a sampler seeded with it (T7, C3)
    "plain-loop": LOOP,
}
#: GRPO generates inside every step: T3 and T5 judge its loss on a batch of its own train dataloader (completions
#: generated from it), the runs are real
RAN = {"grpo-trainer": {"T3", "T5", "C1", "C18", "S1", "S3"}}


#: the checks that need held-out data, which the trainer projects here do not give (a missing role, named)
NEED_EVAL_DATA = {"T8", "S5"}
#: checks that concern a clean project yet cannot judge it, with the start of their reason: known gaps, kept
#: visible (one that starts to pass, or skips for another reason, fails the test: then update this list)
UNDECIDED = {
    # its batches are lists of prompt rows (tokenized inside the step): no input to differentiate
    "grpo-trainer": {"T4": "cannot differentiate the model's inputs: the batch's first element ({prompt: str})"},
    "sft-packed-trainer": {"T4": "no sampled batch holds 2 examples or more"},
}


@pytest.mark.parametrize("kind", sorted(PROJECTS))
def test_clean_project_fails_no_check(project, kind, tmp_path):
    project.conftest(PROJECTS[kind])
    out = tmp_path / "report.json"
    run = project.run(
        "--dlcheck=train,ckpt,smoke,L9,L10",
        f"--dlcheck-json={out}",
        *(["--dlcheck-set=S1.steps=6"] if kind == "grpo-trainer" else []),
    )
    failed = {cid for cid, outs in run.outcomes.items() if set(outs) & {"failed", "error"}}
    assert not failed, run.text
    # every check that concerns the project passes (not a few among skips): only "not applicable", the eval
    # data some projects do not hand over, and the known gaps below are left out
    results = json.loads(out.read_text())["results"]
    known = UNDECIDED.get(kind, {})
    unexpected = [
        f"{r['id']}: {r['outcome']}: {r.get('reason', '')}"
        for r in results
        if r["outcome"] not in ("passed", "not_applicable")
        and not (r["outcome"] == "missing_role" and r["id"] in NEED_EVAL_DATA)
        and not (r["id"] in known and r.get("reason", "").startswith(known[r["id"]]))
    ]
    assert not unexpected, f"{kind}: checks that concern the project did not pass:\n" + "\n".join(unexpected)
    stale = [r["id"] for r in results if r["id"] in known and r["outcome"] != "skipped"]
    assert not stale, f"{kind}: {stale} no longer skip: take them out of UNDECIDED"
    ran = {cid for cid, outs in run.outcomes.items() if "passed" in outs}
    assert RAN.get(kind, {"T3", "T5", "C1", "C18", "S1"}) <= ran, run.text
    # every pass says what it measured (-v shows it beside PASSED)
    passes = [line for line in run.text.splitlines() if re.search(r"::[A-Z]+\d+_\w+ PASSED", line)]
    assert passes and all(" PASSED (" in line for line in passes), run.text
    if kind == "grpo-trainer":  # no classes, no fixed batch, no DPO loss: said as such
        for cid in ("T1", "T2", "S4"):
            run.assert_outcome(cid, "skipped")
        assert "not applicable: GRPOTrainer's loss is computed on completions it generates inside each step" in run.text
