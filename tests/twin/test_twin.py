"""--dlcheck-twin: the checks that run or train the model use a tiny twin built from its config (same class,
vocabulary, special tokens, positions, heads' divisibility; two narrow layers); the checks that need the
real weights are "not applicable with --dlcheck-twin"; a 7B-class model with empty (meta) weights is checked
on this CPU in seconds."""

import json
import shutil
from pathlib import Path

import pytest
import torch

from pytest_dlcheck import twin

EXAMPLES = Path(__file__).parent.parent.parent / "examples"


@pytest.fixture
def active(monkeypatch):
    monkeypatch.setattr(twin, "ACTIVE", True)
    twin.reset()
    yield
    twin.reset()


def _params(model) -> int:
    return sum(p.numel() for p in model.parameters())


@pytest.mark.parametrize(
    "arch",
    [
        dict(
            cls="LlamaForCausalLM",
            config="LlamaConfig",
            kw=dict(
                vocab_size=32000,
                hidden_size=4096,
                intermediate_size=11008,
                num_hidden_layers=32,
                num_attention_heads=32,
                num_key_value_heads=8,
                max_position_embeddings=4096,
                pad_token_id=0,
                bos_token_id=1,
                eos_token_id=2,
                rope_theta=500000.0,
            ),
        ),
        dict(
            cls="Qwen2ForCausalLM",
            config="Qwen2Config",
            kw=dict(
                vocab_size=151936,
                hidden_size=3584,
                intermediate_size=18944,
                num_hidden_layers=28,
                num_attention_heads=28,
                num_key_value_heads=4,
                max_position_embeddings=32768,
                eos_token_id=151645,
            ),
        ),
        dict(
            cls="GPT2LMHeadModel",
            config="GPT2Config",
            kw=dict(n_embd=1600, n_layer=48, n_head=25, n_positions=1024, eos_token_id=50256),
        ),
    ],
    ids=lambda a: a["cls"],
)
def test_twin_of_a_7b_class_model_keeps_what_the_data_depend_on(active, arch):
    import transformers

    cfg = getattr(transformers, arch["config"])(**arch["kw"])
    with torch.device("meta"):
        big = getattr(transformers, arch["cls"])(cfg)
    small = twin.twin_of(big)
    assert type(small) is type(big) and small is not big and twin.is_twin(small)
    assert twin.twin_of(big) is small  # built once per model
    c = small.config
    for key in ("vocab_size", "max_position_embeddings", "n_positions", "pad_token_id", "bos_token_id", "eos_token_id"):
        if hasattr(cfg, key):
            assert getattr(c, key) == getattr(cfg, key), key
    layers = getattr(c, "num_hidden_layers", None) or c.n_layer
    heads = getattr(c, "num_attention_heads", None) or c.n_head
    hidden = getattr(c, "hidden_size", None) or c.n_embd
    assert layers == 2 and hidden % heads == 0 and (hidden // heads) % 2 == 0
    kv = getattr(c, "num_key_value_heads", None)
    if kv:
        assert heads % kv == 0
    assert _params(small) < 0.01 * _params(big)
    assert next(small.parameters()).device.type == "cpu"  # real weights for the twin of an empty model
    ids = torch.tensor([[1, 2, 3, 4]])
    loss = small(input_ids=ids, labels=ids).loss
    assert torch.isfinite(loss)


def test_twin_of_a_llava_and_a_unet(active):
    from diffusers import UNet2DConditionModel
    from transformers import CLIPVisionConfig, LlamaConfig, LlavaConfig, LlavaForConditionalGeneration

    text = LlamaConfig(
        vocab_size=320,
        hidden_size=256,
        intermediate_size=512,
        num_hidden_layers=6,
        num_attention_heads=8,
        num_key_value_heads=8,
    )
    vision = CLIPVisionConfig(
        hidden_size=128, intermediate_size=256, num_hidden_layers=6, num_attention_heads=4, image_size=32, patch_size=8
    )
    llava = LlavaForConditionalGeneration(
        LlavaConfig(text_config=text, vision_config=vision, image_token_id=300, vision_feature_layer=-2)
    )
    small = twin.twin_of(llava)
    assert small.config.text_config.num_hidden_layers == 2 and small.config.vision_config.num_hidden_layers == 2
    assert small.config.image_token_id == 300 and small.config.text_config.vocab_size == 320
    assert small.config.vision_config.image_size == 32 and small.config.vision_config.patch_size == 8
    assert _params(small) < _params(llava)
    unet = UNet2DConditionModel(
        sample_size=16,
        in_channels=4,
        out_channels=4,
        layers_per_block=2,
        block_out_channels=(64, 128, 128),
        down_block_types=("CrossAttnDownBlock2D", "CrossAttnDownBlock2D", "DownBlock2D"),
        up_block_types=("UpBlock2D", "CrossAttnUpBlock2D", "CrossAttnUpBlock2D"),
        cross_attention_dim=48,
        norm_num_groups=32,
    )
    tiny = twin.twin_of(unet)
    assert type(tiny) is UNet2DConditionModel and tiny.config.cross_attention_dim == 48
    assert tiny.config.in_channels == 4 and _params(tiny) < _params(unet)
    out = tiny(torch.randn(1, 4, 16, 16), torch.tensor([10]), torch.randn(1, 5, 48)).sample
    assert out.shape == (1, 4, 16, 16)


def test_no_twin_when_off_or_not_buildable(monkeypatch):
    monkeypatch.setattr(twin, "ACTIVE", False)
    model = torch.nn.Linear(2, 2)
    assert twin.twin_of(model) is model
    monkeypatch.setattr(twin, "ACTIVE", True)
    assert twin.twin_of(model) is model  # a plain module has no config: the user gives dlcheck_twin_model


def _verdicts(run, doc_path):
    doc = json.loads(Path(doc_path).read_text())
    return {(r["nodeid"].split("/")[0], r["id"]): r["outcome"] for r in doc["results"]}


def test_llm_verdicts_are_the_same_with_the_twin(project, tmp_path):
    """The llm example's broken and clean projects: every llm check's outcome is the same with the twin."""
    shutil.copytree(EXAMPLES / "llm", project.pytester.path, dirs_exist_ok=True)
    plain, twinned = tmp_path / "plain.json", tmp_path / "twin.json"
    project.run("--dlcheck=llm", f"--dlcheck-json={plain}")
    run = project.run("--dlcheck=llm", "--dlcheck-twin", f"--dlcheck-json={twinned}")
    a, b = _verdicts(None, plain), _verdicts(None, twinned)
    assert a.keys() == b.keys()
    changed = {k: (a[k], b[k]) for k in a if a[k] != b[k]}
    # L6 needs the real logits: not applicable with the twin; every other verdict is the same
    assert set(changed) <= {("broken", "L6"), ("clean", "L6")}, changed
    assert all(v[1] == "not_applicable" for v in changed.values()), changed
    assert {v for k, v in b.items() if k[1] in ("L2", "L11")} >= {"failed"}, run.text


@pytest.mark.parametrize("domain", ["vlm", "diffusion"])
def test_other_data_domains_verdicts_are_the_same_with_the_twin(project, tmp_path, domain):
    """The vlm example (a LLaVA: its twin shrinks every sub-config) and the diffusion example (whose checks run
    the user's own routines on the real objects): the same verdicts with the twin, but X2, which judges the
    projector against the real towers' feature scale and is "not applicable with --dlcheck-twin"."""
    shutil.copytree(EXAMPLES / domain, project.pytester.path, dirs_exist_ok=True)
    plain, twinned = tmp_path / "plain.json", tmp_path / "twin.json"
    project.run(f"--dlcheck={domain}", f"--dlcheck-json={plain}")
    run = project.run(f"--dlcheck={domain}", "--dlcheck-twin", f"--dlcheck-json={twinned}")
    a, b = _verdicts(None, plain), _verdicts(None, twinned)
    assert a.keys() == b.keys() and "failed" in a.values(), run.text
    changed = {k: (a[k], b[k]) for k in a if a[k] != b[k]}
    expected = {("broken", "X2"), ("clean", "X2")} if domain == "vlm" else set()
    assert set(changed) == expected and all(v[1] == "not_applicable" for v in changed.values()), changed
    if domain == "vlm":  # the checks that run the model ran its twin
        assert "LlavaForConditionalGeneration (twin)" in twinned.read_text()


SEVEN_B = """
    import pytest, tiny, torch
    from transformers import DataCollatorForSeq2Seq, LlamaConfig, LlamaForCausalLM

    @pytest.fixture(scope="session")
    def dlcheck_tokenizer():
        return tiny.tokenizer()

    @pytest.fixture(scope="session")
    def dlcheck_model(dlcheck_tokenizer):
        tok = dlcheck_tokenizer
        cfg = LlamaConfig(vocab_size=len(tok), hidden_size=4096, intermediate_size=11008, num_hidden_layers=32,
                          num_attention_heads=32, num_key_value_heads=8, max_position_embeddings=4096,
                          bos_token_id=tok.bos_token_id, eos_token_id=tok.eos_token_id, pad_token_id=tok.pad_token_id)
        with torch.device("meta"):  # a 7B model's structure, weights never materialised (nor downloaded)
            return LlamaForCausalLM(cfg)

    @pytest.fixture(scope="session")
    def dlcheck_dataset(dlcheck_tokenizer):
        rows = tiny.tokenized(dlcheck_tokenizer)
        for r in rows:
            r["labels"] = list(r["input_ids"])
        return rows

    @pytest.fixture(scope="session")
    def dlcheck_collator(dlcheck_tokenizer):
        return DataCollatorForSeq2Seq(dlcheck_tokenizer, padding=True)
"""


def test_a_7b_model_with_empty_weights_is_checked_on_its_twin(project, tmp_path):
    project.conftest(SEVEN_B)
    out = tmp_path / "r.json"
    run = project.run("--dlcheck=llm,train,ckpt,smoke", "--dlcheck-twin", f"--dlcheck-json={out}", "-rA")
    doc = json.loads(out.read_text())
    by = {r["id"]: r for r in doc["results"]}
    assert doc["summary"]["error"] == 0, run.text
    # the checks that run the model ran on the twin (a forward pass each), with their evidence
    ran = {r["id"]: r for r in doc["results"] if r["outcome"] == "passed" and r["cost"].get("forward")}
    assert set(ran) >= {"L1", "T3", "T4"}, {r["id"]: r["outcome"] for r in doc["results"]}
    assert all(set(r["cost"]["models"]) == {"LlamaForCausalLM (twin)"} for r in ran.values())
    assert "get a gradient" in ran["T3"]["evidence"][0] and ran["T3"]["cost"]["backward"] == 1
    assert by["L3"]["outcome"] == "passed" and by["L5"]["outcome"] == "passed"  # vocabulary, positions kept
    for cid in ("T1", "T5", "L6"):
        assert by[cid]["outcome"] == "not_applicable" and "--dlcheck-twin" in by[cid]["reason"], by[cid]
    # the user's model is still the empty 7B one
    assert doc["duration"] < 120


SFT_TWIN = """
    import pytest, tiny
    from datasets import Dataset
    from transformers import LlamaConfig, LlamaForCausalLM
    from trl import SFTConfig, SFTTrainer

    @pytest.fixture(scope="session")
    def dlcheck_trainer(tmp_path_factory):
        tok = tiny.tokenizer()
        data = Dataset.from_dict({"prompt": tiny.PROMPTS, "completion": tiny.COMPLETIONS})
        args = tiny.trainer_args(tmp_path_factory.mktemp("o"), SFTConfig, learning_rate=1e-3)
        cfg = LlamaConfig(vocab_size=len(tok), hidden_size=256, intermediate_size=512, num_hidden_layers=4,
                          num_attention_heads=8, num_key_value_heads=4, max_position_embeddings=256,
                          bos_token_id=tok.bos_token_id, eos_token_id=tok.eos_token_id, pad_token_id=tok.pad_token_id)
        model = LlamaForCausalLM(cfg)
        return SFTTrainer(model=model, args=args, processing_class=tok, train_dataset=data)
"""


def test_a_trainer_trains_and_resumes_its_twin(project, tmp_path):
    """A Trainer's clones are built around copies of the twin: T2 and C1 train it, the user's model is
    wider and deeper and untouched."""
    project.conftest(SFT_TWIN)
    out = tmp_path / "r.json"
    run = project.run("--dlcheck=T2,C1", "--dlcheck-twin", f"--dlcheck-json={out}")
    doc = json.loads(out.read_text())
    by = {r["id"]: r for r in doc["results"]}
    assert by["T2"]["outcome"] == "passed" and by["C1"]["outcome"] == "passed", run.text
    assert by["T2"]["cost"]["optimizer_steps"] >= 1
    assert set(by["T2"]["cost"]["models"]) == {"LlamaForCausalLM (twin)"}, by["T2"]["cost"]
