"""A trainer that generates its completions inside its step and whose loss is a divergence from a teacher model (TRL's
DistillationTrainer, on-policy distillation): the checks say what they judged and what they could not, in the right
category. Its token batches are built inside the step: the checks of those batches concern the pipeline (a skip,
"not judged"), they are not "not applicable"; its loss is said for what it is (a divergence from the teacher), not a
policy gradient; it has a teacher, not "no reference model"."""

import re

# imported here, before pytester snapshots sys.modules, so the in-process runs share them
import trl.trainer.distillation_trainer  # noqa: F401
from helpers import flat

DISTILL = """
import pytest, tiny
from datasets import Dataset
from trl import DistillationConfig, DistillationTrainer

@pytest.fixture(scope="session")
def dlcheck_trainer(tmp_path_factory):
    tok = tiny.tokenizer(padding_side="left")
    prompts = [[{"role": "user", "content": p}] for p in tiny.PROMPTS]
    args = tiny.trainer_args(tmp_path_factory.mktemp("distill"), DistillationConfig, max_completion_length=8,
                             per_device_train_batch_size=4)
    return DistillationTrainer(model=tiny.llama(tok), teacher_model=tiny.llama(tok, seed=1), args=args,
                               train_dataset=Dataset.from_dict({"prompt": prompts * 2}), processing_class=tok)
"""

TOKEN_BATCH_CHECKS = ("L2", "L11", "L12", "L13", "L14")


def _skip_line(run, cid: str) -> str:
    m = re.search(rf"^SKIPPED \[\d+\] \S+::{cid}_\w+: (.*)$", run.text, re.M)
    assert m, f"no skip line for {cid}:\n{run.text}"
    return m.group(1)


def test_distillation_trainer_texts(project):
    project.conftest(DISTILL)
    run = project.run("--dlcheck=" + ",".join((*TOKEN_BATCH_CHECKS, "L4", "L7", "L8", "T1", "R2")), "-rA")
    for cid in TOKEN_BATCH_CHECKS:
        run.assert_outcome(cid, "skipped")
        line = _skip_line(run, cid)
        # the batches are the pipeline's, built where the plugin does not see them: not judged, not "not applicable"
        assert not line.startswith("not applicable"), line
        assert "not judged" in line and "inside its training step" in line, line
    # packing does not concern it: TRL's online trainers concatenate each prompt with its completion, one per row
    assert _skip_line(run, "L4").startswith(
        "not applicable: DistillationTrainer builds its training batches inside the trainer, from generations"
    )
    # the loss is a divergence from the teacher model: not a policy gradient, not a preference loss
    t1, l7 = _skip_line(run, "T1"), _skip_line(run, "L7")
    for line in (t1, l7):
        assert line.startswith("not applicable"), line
        assert "divergence between its model's and its teacher model's (LlamaForCausalLM) token distributions" in line
        assert "policy" not in line and "preference" not in line, line
    # L8 was handed a trainer: it says which, and that its schema is not known
    l8 = _skip_line(run, "L8")
    assert "no trainer kind" not in l8 and "DistillationTrainer is a TRL trainer whose dataset schema" in l8, l8
    # R2: a teacher, not "no reference model"; its question concerns the teacher, which it does not judge
    r2 = flat(_skip_line(run, "R2"))
    assert not r2.startswith("not applicable"), r2
    assert "teacher model (LlamaForCausalLM, trainer.teacher_model)" in r2 and "not judged" in r2, r2


def test_distillation_teacher_judged_as_reference(project):
    # R2's hint holds: the teacher given as dlcheck_ref_model is judged (separate tensors, not in the optimizer),
    # and its KL coefficient is not read from the trainer's beta (a divergence interpolation, not a KL weight)
    project.conftest(
        DISTILL
        + """
@pytest.fixture(scope="session")
def dlcheck_ref_model(dlcheck_trainer):
    return dlcheck_trainer.teacher_model
"""
    )
    run = project.run("--dlcheck=R2", "-rA")
    run.assert_outcome("R2", "passed")
    run.fnmatch(["*no dlcheck_kl_coef*"])


def test_distillation_l1_training_half_not_judged_and_t5_batches_said(project):
    project.conftest(DISTILL)
    run = project.run("--dlcheck=L1,T5", "-rA")
    run.assert_outcome("L1", "passed")
    run.assert_outcome("T5", "passed")
    text = flat(run.text)
    # the training half concerns the pipeline and was not judged: a partly judged pass
    assert re.search(r"PASSED \(generation: .*partly judged: training not judged", text), text
    # the batches are lists of prompt dicts, not token ids
    assert "no float field (the batches are lists of 4 uncollated examples with prompt" in text, text
    assert "(token ids)" not in text
