"""The real-code corpus: faithful small re-creations, written for this project, of the training scripts
people copy (tests/realcode/projects/*, each module docstring names the upstream file and what was shrunk).
Each runs under --dlcheck=all; a failure is either one of the true findings listed here, with the reason it
is real, or a false alarm still open in KNOWN_FALSE_ALARMS (issue 16), which must leave that ledger once
fixed. No project may end in an internal error. FINDINGS-*.md record how each verdict was established."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
from rel_nonet import NoNetwork

PROJECTS = Path(__file__).parents[1] / "realcode" / "projects"

#: (project, check) -> why the failure is real
TRUE_FINDINGS = {
    ("nanogpt", "C2"): "train.py saves with torch.save straight onto out_dir/ckpt.pt, its only checkpoint: a kill "
    "during that save leaves nothing to resume from",
    ("makemore_mlp", "T1"): "Part 2 draws W2/b2 with plain randn: the initial loss is ~27 against ln 27 = 3.3 "
    "(the lecture's Part 3 fixes exactly this with a scaled init)",
    ("tv_classification", "C1"): "train.py saves args (an argparse.Namespace) in the checkpoint and resumes with "
    "torch.load(weights_only=True): under torch >= 2.6 the resume fails",
    ("diffusers_t2i", "DF5"): "train_text_to_image.py never drops captions (no null-condition training), yet its "
    "validation samples with classifier-free guidance",
    ("diffusers_t2i", "C2"): "save_state writes checkpoint-N directories and --resume_from_checkpoint latest picks the "
    "newest by name: a kill during a save leaves a half-written newest directory that the resume then loads",
    ("diffusers_t2i", "D4"): "train_text_to_image.py seeds every process alike (set_seed(args.seed), not "
    "device_specific; without --seed torch's default seed is the same in every process): under accelerate launch "
    "each rank's different images get the same RandomHorizontalFlip draws, from one random stream shared by all ranks",
    ("lightning_compiled", "C3"): "Lightning checkpoints hold no RNG state: with dropout, the resumed run draws other "
    "masks than the uninterrupted one (C1, which puts the RNG states back, passes: nothing else is lost)",
    ("lightning_manual_opt", "C3"): "the guide's module keeps no RNG state in its checkpoint and its DataLoader "
    "shuffles: the resumed epoch draws another order than the uninterrupted one (found once the resume picks the "
    "first epoch's checkpoint under manual accumulation, where global_step counts optimizer steps; C1 passes)",
    ("lightning_compiled", "C18"): "the compiled submodule saves as net._orig_mod.*: the checkpoint does not load "
    "into the uncompiled model (nanoGPT strips the same prefix by hand when it resumes)",
    ("run_clm", "L11"): "run_clm.py tokenizes the texts without an EOS and group_texts concatenates them: the blocks "
    "hold no boundary between the 190 separate texts (dlcheck_documents), so the model never learns where a "
    "document ends (run_clm_eos, the same script with the EOS appended, passes)",
    ("cleanrl_ppo", "R7"): "ppo.py treats a time-limit truncation as a termination (nextnonterminal = 1 - next_done): "
    "it does not bootstrap V(s') at truncated episode ends",
    ("cleanrl_ppo_continuous", "R7"): "the same GAE block as ppo.py: truncation is not bootstrapped",
}

#: (project, check) -> the false alarm still open (issue 16); remove an entry when its fix lands
KNOWN_FALSE_ALARMS = {}

MEDIA = [
    "tv_classification",
    "diffusers_t2i",
    "cleanrl_ppo",
    "cleanrl_ppo_continuous",
    "sb3_ppo_vecnormalize",
    "sb3_sac_replay",
    "lightning_manual_opt",
    "lightning_compiled",
]

LLM = ["nanogpt", "makemore_mlp", "run_clm", "run_clm_eos", "trl_sft_chatml", "trl_sft_chatml_packed", "trl_dpo"]


class Outcomes:
    def __init__(self) -> None:
        self.failed: dict[tuple[str, str], str] = {}
        self.errors: dict[tuple[str, str], str] = {}
        self.ran: set[str] = set()

    def pytest_runtest_logreport(self, report) -> None:
        if "::" not in report.nodeid:
            return
        project, item = report.nodeid.split("/")[0], report.nodeid.rsplit("::", 1)[-1]
        self.ran.add(project)
        key = (project, item.split("_")[0])
        text = str(report.longrepr)
        if report.failed and "pytest-dlcheck internal error" in text:
            self.errors[key] = text
        elif report.failed:
            self.failed[key] = text


def run_corpus(pytester: pytest.Pytester, names: list[str]) -> Outcomes:
    for name in names:
        shutil.copytree(PROJECTS / name, pytester.path / name, ignore=shutil.ignore_patterns("__pycache__"))
        pytester.syspathinsert(pytester.path / name)
    shutil.copy(PROJECTS / "rc_text.py", pytester.path / "rc_text.py")
    pytester.syspathinsert()
    (pytester.path / "pytest.ini").write_text("[pytest]\n")
    outcomes = Outcomes()
    result = pytester.runpytest_inprocess(
        "-p", "no:cacheprovider", "--dlcheck=all", str(pytester.path), plugins=[outcomes, NoNetwork()]
    )
    text = result.stdout.str()
    assert "INTERNALERROR" not in text, text[-5000:]
    assert outcomes.ran == set(names), text[-3000:]
    return outcomes


def judge(outcomes: Outcomes) -> None:
    assert not outcomes.errors, "internal errors:\n\n" + "\n\n".join(
        f"{k}: {v[-1500:]}" for k, v in outcomes.errors.items()
    )
    unexpected = {k: v for k, v in outcomes.failed.items() if k not in TRUE_FINDINGS and k not in KNOWN_FALSE_ALARMS}
    assert not unexpected, "false alarms:\n\n" + "\n\n".join(f"{k}:\n{v[:2000]}" for k, v in unexpected.items())
    ran = {p for p, _ in outcomes.failed} | outcomes.ran
    missed = {k for k in TRUE_FINDINGS if k[0] in ran and k not in outcomes.failed}
    assert not missed, f"true findings no longer caught: {sorted(missed)}"
    fixed = {k for k in KNOWN_FALSE_ALARMS if k[0] in ran and k not in outcomes.failed}
    assert not fixed, f"these false alarms are gone: remove them from KNOWN_FALSE_ALARMS: {sorted(fixed)}"


def test_llm_recipes(pytester):
    judge(run_corpus(pytester, LLM))


def test_vision_diffusion_rl_lightning_recipes(pytester):
    judge(run_corpus(pytester, MEDIA))
