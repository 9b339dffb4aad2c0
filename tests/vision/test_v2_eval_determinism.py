"""V2: deterministic eval transform; the eval function puts the model in eval mode."""

import pytest
import tiny_vision  # noqa: F401  (torchvision, timm and the plugin's roles imported once, outside the runs)
from tiny_vision import section

EVAL_DATA = """
    import pytest, torch, tiny_vision as tv
    from torchvision.transforms import v2 as T

    @pytest.fixture(scope="session")
    def dlcheck_eval_dataset():
        return tv.Shapes([i % 4 for i in range(8)], transform=T.Compose([
            T.ToImage(), {crop}, T.ToDtype(torch.float32, scale=True), T.Normalize(list(tv.IMAGENET_MEAN), list(tv.IMAGENET_STD))]))
"""


@pytest.mark.parametrize(
    "crop, outcome", [("T.RandomResizedCrop(32)", "failed"), ("T.Resize(36), T.CenterCrop(32)", "passed")]
)
def test_random_resized_crop_in_the_eval_transform(project, crop, outcome):
    project.conftest(EVAL_DATA.format(crop=crop))
    run = project.run("--dlcheck=V2", "-rA")
    run.assert_outcome("V2", outcome)
    if outcome == "passed":
        run.fnmatch(["*::V2_eval_determinism PASSED (3 eval examples (dlcheck_eval_dataset*"])
        run.fnmatch(["*dlcheck evidence*", "model.eval() was not checked: define dlcheck_model and dlcheck_eval_fn"])
        assert (
            "3 eval examples (dlcheck_eval_dataset[0], dlcheck_eval_dataset[4], dlcheck_eval_dataset[7]) read "
            "twice under different seeds: identical (max |Δ| 0 ≤ 1e-06)\n" in run.text
        )
    if outcome == "failed":
        text = section(run, "V2")
        assert "dlcheck_eval_dataset[0] read twice: max |Δ|" in text
        assert "% of pixel values differ" in text
        assert "random transforms in the eval transform: RandomResizedCrop(size=(32, 32)" in text
        assert "the eval transform applies RandomResizedCrop" in text  # cause
        assert "T.Resize(size) + T.CenterCrop(crop) instead of RandomResizedCrop" in text  # fix


def test_random_split_shares_the_train_augmentation(project):
    project.conftest("""
        import pytest, torch, tiny_vision as tv
        from torch.utils.data import random_split

        @pytest.fixture(scope="session")
        def splits():
            full = tv.Shapes([i % 4 for i in range(24)], transform=tv.classification_tf(train=True))
            return random_split(full, [16, 8], generator=torch.Generator().manual_seed(0))

        @pytest.fixture(scope="session")
        def dlcheck_dataset(splits):
            return splits[0]

        @pytest.fixture(scope="session")
        def dlcheck_eval_dataset(splits):
            return splits[1]
    """)
    run = project.run("--dlcheck=V2")
    run.assert_outcome("V2", "failed")
    text = section(run, "V2")
    assert "Subsets of one dataset object, so they share its transform" in text
    assert "inherits its random augmentation" in text


EVAL_FN = """
    import pytest, torch, tiny_vision as tv

    @pytest.fixture(scope="session")
    def dlcheck_model():
        return tv.resnet18(4)

    @pytest.fixture(scope="session")
    def dlcheck_eval_dataset():
        return tv.Shapes([i % 4 for i in range(8)], transform=tv.classification_tf(train=False))

    @pytest.fixture(scope="session")
    def dlcheck_eval_fn():
        def evaluate(model, loader):
            {set_mode}
            correct = 0
            with torch.no_grad():
                for images, labels in loader:
                    correct += (model(images).argmax(1) == labels).sum().item()
            return correct
        return evaluate
"""


@pytest.mark.parametrize("set_mode, outcome", [("pass", "failed"), ("model.eval()", "passed")])
def test_eval_function_without_model_eval(project, set_mode, outcome):
    project.conftest(EVAL_FN.format(set_mode=set_mode))
    run = project.run("--dlcheck=V2", "-rA")
    run.assert_outcome("V2", outcome)
    if outcome == "passed":
        run.fnmatch(
            [
                "*dlcheck evidence*",
                "3 eval examples (*) read twice under different seeds: identical (max |Δ| 0 ≤ 1e-06)",
                "dlcheck_eval_fn called twice right after model.train(): 0 of 20 modules whose forward depends on "
                "the mode (20 BatchNorm2d (running statistics, e.g. bn1)) ran in training mode, no BatchNorm running "
                "mean moved (20 tracked), two evals give identical results",
            ]
        )
    if outcome == "failed":
        text = section(run, "V2")
        assert (
            "dlcheck_eval_fn ran 20 of 20 modules whose forward depends on the mode in training mode: 20 BatchNorm2d "
            "(running statistics, e.g. bn1)" in text
        )
        assert "it moved the BatchNorm running_mean of 20 of 20 layers" in text
        assert "runs the model in training mode" in text  # cause
        assert "call model.eval() at the start of the eval function" in text  # fix


def test_detection_eval_without_model_eval_raises_in_training_mode(project):
    project.conftest("""
        import pytest, torch, tiny_vision as tv

        @pytest.fixture(scope="session")
        def dlcheck_model():
            return tv.fasterrcnn(3)

        @pytest.fixture(scope="session")
        def dlcheck_eval_dataloader():
            ds = tv.ShapesDetection(4, transforms=tv.detection_tf(train=False))
            return torch.utils.data.DataLoader(ds, batch_size=2, collate_fn=tv.detection_collate)

        @pytest.fixture(scope="session")
        def dlcheck_eval_fn():
            def evaluate(model, loader):
                with torch.no_grad():
                    return [model(list(images)) for images, _ in loader]
            return evaluate
    """)
    run = project.run("--dlcheck=V2")
    run.assert_outcome("V2", "failed")
    text = section(run, "V2")
    assert "dlcheck_eval_fn raised AssertionError: targets should not be none when in training mode" in text


def test_nothing_to_judge_skips(project):
    project.conftest("""
        import pytest, tiny_vision as tv

        @pytest.fixture(scope="session")
        def dlcheck_model():
            return tv.resnet18(4)
    """)
    run = project.run("--dlcheck=V2")
    run.assert_outcome("V2", "skipped")
    assert "dlcheck_eval_dataloader or dlcheck_eval_dataset" in run.text


def test_language_model_data_is_not_applicable(project):
    """A causal LM's token batches hold no image: no vision check concerns them, none asks for a fixture
    (V2 no eval data, V4 and V7 no model)."""
    project.conftest("""
        import pytest, tiny
        from transformers import DataCollatorForLanguageModeling

        @pytest.fixture(scope="session")
        def dlcheck_tokenizer():
            return tiny.tokenizer()

        @pytest.fixture(scope="session")
        def dlcheck_collator(dlcheck_tokenizer):
            return DataCollatorForLanguageModeling(dlcheck_tokenizer, mlm=False)

        @pytest.fixture(scope="session")
        def dlcheck_dataset(dlcheck_tokenizer):
            return tiny.tokenized(dlcheck_tokenizer)
    """)
    run = project.run("--dlcheck=vision")
    for cid in ("V1", "V2", "V3", "V4", "V5", "V6", "V7", "V8"):
        run.assert_outcome(cid, "skipped")
    run.fnmatch(
        [
            "n/a:*not applicable: batch 0 of dlcheck_dataloader has no image field (keys: input_ids, attention_mask, "
            "labels): the data holds no images, so no vision check concerns it (8 checks)"
        ]
    )
    assert "missing role" not in run.text


PAIRS = """
    import random, pytest, torch

    class Pairs(torch.utils.data.Dataset):  # pytorch/examples siamese_network's APP_MATCHER: no transform
        def __init__(self, fixed):
            g = torch.Generator().manual_seed(0)
            self.images = torch.rand(8, 1, 8, 8, generator=g)
            rng = random.Random(0)
            self.pairs = [(rng.randrange(8), rng.randrange(8)) for _ in range(8)] if fixed else None

        def __len__(self):
            return 8

        def __getitem__(self, i):
            # a new pair of images on every read (the pair drawn once, in __init__, in the correct twin)
            a, b = self.pairs[i] if self.pairs is not None else (random.randrange(8), random.randrange(8))
            return self.images[a], self.images[b], torch.tensor(float(a % 2 == b % 2))

    @pytest.fixture(scope="session")
    def dlcheck_eval_dataset():
        return Pairs(fixed={fixed})
"""


@pytest.mark.parametrize("fixed, outcome", [(False, "failed"), (True, "passed")])
def test_an_eval_dataset_drawing_in_its_own_getitem(project, fixed, outcome):
    project.conftest(PAIRS.format(fixed=fixed))
    run = project.run("--dlcheck=V2", "-rA")
    run.assert_outcome("V2", outcome)
    if outcome == "failed":
        text = section(run, "V2")
        assert "the eval dataset (Pairs) has no transform: the draw is in the dataset itself" in text, text
        assert "the eval dataset draws at random on every read of an index" in text, text
        assert "RandomResizedCrop" not in text, text


MAE_EVAL = """
    import pytest, torch, tiny_vision as tv
    from torchvision import transforms as T1

    @pytest.fixture(scope="session")
    def dlcheck_eval_dataset():
        tf = T1.Compose([T1.{crop}, T1.ToTensor(), T1.Normalize([0.5] * 3, [0.5] * 3)])

        def preprocess(examples):  # run_mae's: the raw image column is kept beside pixel_values
            examples["pixel_values"] = [tf(image.convert("RGB")) for image in examples["image"]]
            return examples

        ds = tv.hf_images([i % 4 for i in range(8)], size=40)
        ds.set_transform(preprocess)
        return ds
"""


@pytest.mark.parametrize(
    "crop, outcome", [("RandomResizedCrop(32, scale=(0.2, 1.0))", "failed"), ("CenterCrop(32)", "passed")]
)
def test_the_transformed_pixel_values_are_judged_not_the_raw_image_column_beside_them(project, crop, outcome):
    """transformers' run_mae, found blind: its validation split gets the training crops through set_transform, which
    keeps the raw 'image' column beside 'pixel_values'; V2 compared the raw column (identical) and passed."""
    project.conftest(MAE_EVAL.format(crop=crop))
    run = project.run("--dlcheck=V2", "-rA")
    run.assert_outcome("V2", outcome)
    if outcome == "failed":
        assert "% of pixel values differ" in section(run, "V2")


def test_a_given_eval_loader_of_token_batches_is_not_a_missing_role(project):
    """llm.c and llama2.c, found blind: V2 asked for dlcheck_eval_dataloader, which was given (a list of (x, y) token
    batches): data without images is not V2's, said so."""
    project.conftest("""
        import pytest, torch
        from torch.utils.data import DataLoader, TensorDataset

        @pytest.fixture(scope="session")
        def dlcheck_eval_dataloader():
            g = torch.Generator().manual_seed(0)
            ids = torch.randint(0, 50, (16, 9), generator=g)
            return list(DataLoader(TensorDataset(ids[:, :-1], ids[:, 1:]), batch_size=4))
    """)
    run = project.run("--dlcheck=V2", "-rs")
    run.assert_outcome("V2", "skipped")
    assert "missing role" not in run.text
    assert "not applicable" in run.text and "holds no images" in run.text


GPT2_EVAL = """
    import pytest, torch, tiny
    from torch.utils.data import DataLoader
    from transformers import DataCollatorForLanguageModeling

    @pytest.fixture(scope="session")
    def dlcheck_tokenizer():
        return tiny.tokenizer()

    @pytest.fixture(scope="session")
    def dlcheck_model(dlcheck_tokenizer):
        return tiny.gpt2(dlcheck_tokenizer)  # GPT2Config's dropouts: resid, embd and attn_pdrop 0.1

    @pytest.fixture(scope="session")
    def dlcheck_eval_dataloader(dlcheck_tokenizer):
        collate = DataCollatorForLanguageModeling(dlcheck_tokenizer, mlm=False)
        return DataLoader(tiny.tokenized(dlcheck_tokenizer), batch_size=4, collate_fn=collate)

    @pytest.fixture(scope="session")
    def dlcheck_eval_fn():
        def evaluate(model, loader):  # a hand-written eval loop
            {set_mode}
            losses = []
            with torch.no_grad():
                for batch in loader:
                    losses.append(model(**batch).loss.item())
            {restore}
            return sum(losses) / len(losses)
        return evaluate
"""


@pytest.mark.parametrize(
    "set_mode, restore, outcome", [("pass", "pass", "failed"), ("model.eval()", "model.train()", "passed")]
)
def test_a_token_model_evaluated_without_model_eval(project, set_mode, restore, outcome):
    """pytorch/examples minGPT-ddp, found blind: its test epoch runs the GPT without model.eval() (dropout 0.1 active),
    and V2 said "holds no image" although dlcheck_eval_fn was given. The model.eval() half judges any model, and runs
    under --dlcheck=all on a token pipeline."""
    project.conftest(GPT2_EVAL.format(set_mode=set_mode, restore=restore))
    run = project.run("--dlcheck=all", "-k", "V2", "-rA")
    run.assert_outcome("V2", outcome)
    if outcome == "failed":
        text = section(run, "V2")
        assert (
            "dlcheck_eval_fn ran 5 of 7 modules whose forward depends on the mode in training mode: 5 Dropout" in text
        ), text
        assert "Dropout (p=0.1, e.g. transformer.drop)" in text, text
        assert "two evals of the same weights on the same 2 examples give different results: dlcheck_eval_fn " in text
        assert "dropout stays active" in text and "never calls model.eval()" in text  # cause
        assert "call model.eval() at the start of the eval function" in text  # fix
        assert "and model.train() again after it" in text
    if outcome == "passed":
        run.fnmatch(
            [
                "*dlcheck evidence*",
                "dlcheck_eval_fn called twice right after model.train(): 0 of 7 modules whose forward depends on the "
                "mode (*Dropout (p=0.1, e.g. transformer.drop)*) ran in training mode, two evals give identical results",
            ]
        )
        assert (
            "the eval transform half does not concern this pipeline: dlcheck_eval_dataloader.dataset[0] holds no image"
            in run.text
        )


NANO_EVAL = """
    import pytest, torch
    import torch.nn.functional as F
    from torch.utils.data import DataLoader, TensorDataset

    class TinyLM(torch.nn.Module):
        # nanoGPT's CausalSelfAttention: no nn.Dropout here, the rate is handed to SDPA only while self.training
        def __init__(self, dropout):
            super().__init__()
            torch.manual_seed(0)
            self.emb = torch.nn.Embedding(50, 16)
            self.qkv = torch.nn.Linear(16, 48)
            self.head = torch.nn.Linear(16, 50)
            self.dropout = dropout

        def forward(self, idx, targets):
            x = self.emb(idx)
            q, k, v = self.qkv(x).split(16, dim=2)
            y = F.scaled_dot_product_attention(q, k, v, is_causal=True, dropout_p=self.dropout if self.training else 0)
            logits = self.head(x + y)
            return logits, F.cross_entropy(logits.flatten(0, 1), targets.flatten())

    @pytest.fixture(scope="session")
    def dlcheck_model():
        return TinyLM(dropout={dropout})

    @pytest.fixture(scope="session")
    def dlcheck_eval_dataloader():
        ids = torch.randint(0, 50, (16, 9), generator=torch.Generator().manual_seed(0))
        return DataLoader(TensorDataset(ids[:, :-1], ids[:, 1:]), batch_size=4)

    @pytest.fixture(scope="session")
    def dlcheck_eval_fn():
        def estimate_loss(model, loader):
            {set_mode}
            with torch.no_grad():
                out = [model(x, y)[1].item() for x, y in loader]
            {restore}
            return out
        return estimate_loss
"""


@pytest.mark.parametrize(
    "set_mode, restore, outcome", [("pass", "pass", "failed"), ("model.eval()", "model.train()", "passed")]
)
def test_a_functional_dropout_rate_at_eval(project, set_mode, restore, outcome):
    """A dropout rate held as a number and applied only while self.training (nanoGPT's attention) is judged too: it
    fails when two evals in train mode differ while the same two in eval mode agree."""
    project.conftest(NANO_EVAL.format(dropout=0.5, set_mode=set_mode, restore=restore))
    run = project.run("--dlcheck=V2", "-rA")
    run.assert_outcome("V2", outcome)
    if outcome == "failed":
        text = section(run, "V2")
        assert (
            "1 of 1 modules whose forward depends on the mode in training mode: 1 TinyLM (dropout=0.5, e.g. (the "
            in text
        )
        assert "dlcheck_eval_fn returned " in text and "in eval mode the same two evals agree" in text, text
        assert "dropout stays active" in text
    if outcome == "passed":
        assert "0 of 1 modules whose forward depends on the mode (1 TinyLM (dropout=0.5" in run.text


def test_a_model_without_mode_dependent_modules_is_not_applicable(project):
    """Dropout 0 and no BatchNorm: the model computes the same in train and eval mode, so whether the eval calls
    model.eval() changes nothing; with token data there is no eval transform either."""
    project.conftest(NANO_EVAL.format(dropout=0.0, set_mode="pass", restore="pass"))
    run = project.run("--dlcheck=V2", "-rs")
    run.assert_outcome("V2", "skipped")
    assert "not applicable" in run.text
    assert "dlcheck_model (TinyLM) has no module whose forward depends on train/eval mode" in run.text
    assert "missing role" not in run.text
