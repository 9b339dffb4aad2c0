"""T10 on a loop whose loss exists only inside dlcheck_train_step (no dlcheck_compute_loss, a model given no labels
or batches no dlcheck_loss_fn takes): judged from the step itself. Each backward's contribution to .grad is read
over the accumulation window; the step is run again on the union of the window's micro-batches (collated by the
user's own collator, the step's random draws replayed row by row) as one micro-batch, and the two are compared."""

import tiny_train as tt
import torch

# ---------------------------------------------------------------------------------------------------------------
# (inputs, targets) batches, no dlcheck_loss_fn: the step's cross-entropy is the only loss there is

MLP_STEP = """
    @pytest.fixture(scope="session")
    def dlcheck_train_step():
        def step(state, batch, i):
            model, opt = state["model"], state["optimizer"]
            model.train()
            x, y = batch
            loss = nn.functional.cross_entropy(model(x), y){divide}
            loss.backward()
            if (i + 1) % 4 == 0:
                opt.step()
                opt.zero_grad(set_to_none=True)
            return loss.detach()
        return step
"""


def mlp_project(divide: bool) -> str:
    source = tt.loop_project(extra=MLP_STEP.format(divide=" / 4" if divide else ""))
    cut = source.replace(
        """
    @pytest.fixture(scope="session")
    def dlcheck_loss_fn():
        return nn.CrossEntropyLoss()
""",
        "",
    )
    assert "dlcheck_loss_fn" not in cut
    return cut


def test_a_step_whose_per_example_loss_is_not_divided_by_k_fails(project):
    project.conftest(mlp_project(divide=False))
    run = project.run("--dlcheck=T10")
    run.assert_outcome("T10", "failed")
    text = tt.section(run, "T10")
    assert "closes an accumulation of k=4 micro-batches" in text, text
    assert "no factor in the graph of the loss it backwards" in text, text
    assert "the union of the 4 micro-batches" in text, text
    assert "4x the full-batch gradient" in text, text
    assert "the loss is not divided by the accumulation factor" in text, text


def test_a_step_whose_per_example_loss_is_divided_by_k_passes(project):
    project.conftest(mlp_project(divide=True))
    run = project.run("--dlcheck=T10", "-rA")
    run.assert_outcome("T10", "passed")
    text = " ".join(run.text.split())
    assert "judged from dlcheck_train_step itself" in text, text
    assert "matches the full-batch gradient" in text, text
    assert "each backward scales its loss by 1/4" in text, text


# ---------------------------------------------------------------------------------------------------------------
# a causal LM given no labels (DataCollatorWithPadding: input_ids, attention_mask); the step masks tokens at random
# and computes the masked-token loss itself, as a masked-token image model's training does (micro-batches of two
# short texts, then of two long ones: very different numbers of masked tokens)

LM = """
    import pytest, torch, tiny
    from accelerate import Accelerator
    from torch.utils.data import DataLoader
    from transformers import DataCollatorWithPadding

    TOK = tiny.tokenizer()
    TEXTS = ["hello", "a b", tiny.CORPUS[4], tiny.CORPUS[5]] * 4
    ACCUM = 2

    @pytest.fixture(scope="session")
    def dlcheck_make_training():
        def make():
            model = tiny.llama(TOK)
{make}
        return make

    @pytest.fixture(scope="session")
    def dlcheck_dataloader():
        rows = [TOK(t + TOK.eos_token) for t in TEXTS]
        return DataLoader(rows, batch_size=2, collate_fn=DataCollatorWithPadding(TOK))

    def masked(model, batch):
        ids, att = batch["input_ids"], batch["attention_mask"]
        ratio = torch.cos(torch.rand(ids.shape[0]) * torch.pi / 2)  # a masking ratio per example
        mask = (torch.rand(ids.shape) < ratio[:, None]) & att.bool()
        mask[:, 0] = True
        logits = model(input_ids=ids.masked_fill(mask, TOK.bos_token_id), attention_mask=att).logits
        labels = ids.masked_fill(~mask, -100)
        return logits, labels

    @pytest.fixture(scope="session")
    def dlcheck_train_step():
{step}
        return step
"""

# each micro-batch's own mean over its masked tokens, through accelerator.backward (which divides by k)
MASKED_MEAN = """
        def step(state, batch):
            acc, model, opt = state["accelerator"], state["model"], state["optimizer"]
            model.train()
            with acc.accumulate(model):
                logits, labels = masked(model, batch)
                loss = torch.nn.functional.cross_entropy(logits.flatten(0, 1), labels.flatten(), ignore_index=-100)
                acc.backward(loss)
                opt.step()
                opt.zero_grad()
            return loss.detach()
"""

# the k micro-batches kept; the sum of the masked-token losses over the masked tokens of all of them
MASKED_SUM = """
        def step(state, batch, i):
            model, opt = state["model"], state["optimizer"]
            micro = state.setdefault("micro", [])
            micro.append(batch)
            if (i + 1) % ACCUM:
                return None
            model.train()
            drawn = [masked(model, b) for b in micro]
            num_items = sum(int((labels != -100).sum()) for _, labels in drawn)
            for logits, labels in drawn:
                token_loss_sum = torch.nn.functional.cross_entropy(
                    logits.flatten(0, 1), labels.flatten(), ignore_index=-100, reduction="sum")
                (token_loss_sum / num_items).backward()
            opt.step()
            opt.zero_grad(set_to_none=True)
            micro.clear()
"""


PREPARED = """            acc = Accelerator(cpu=True, gradient_accumulation_steps=ACCUM)
            model, opt = acc.prepare(model, torch.optim.AdamW(model.parameters(), lr=1e-3))
            return {"accelerator": acc, "model": model, "optimizer": opt}"""
PLAIN = """            return {"model": model, "optimizer": torch.optim.AdamW(model.parameters(), lr=1e-3)}"""


def lm_project(step: str) -> str:
    return LM.replace("{step}", step).replace("{make}", PREPARED if "acc.backward" in step else PLAIN)


def test_a_per_micro_batch_masked_token_mean_fails(project):
    project.conftest(lm_project(MASKED_MEAN))
    run = project.run("--dlcheck=T10")
    run.assert_outcome("T10", "failed")
    text = tt.section(run, "T10")
    assert "closes an accumulation of k=2 micro-batches" in text, text
    assert "the union of the 2 micro-batches" in text, text
    assert "random draws of the step replayed" in text, text
    assert "micro-batch 1 weighs 1/2 of the step" in text, text
    assert "each micro-batch's loss is normalized by its own count" in text, text


def test_a_masked_token_sum_over_the_whole_accumulated_batch_passes(project):
    project.conftest(lm_project(MASKED_SUM))
    run = project.run("--dlcheck=T10", "-rA")
    run.assert_outcome("T10", "passed")
    text = " ".join(run.text.split())
    assert "judged from dlcheck_train_step itself" in text, text
    assert "matches the full-batch gradient" in text, text
    assert "random draws of the step replayed" in text, text


def test_a_step_drawing_from_a_source_that_cannot_be_replayed_is_not_judged(project):
    # python's random module decides the masking ratio: the union's draws cannot be matched to the micro-batches'
    source = lm_project(MASKED_MEAN).replace(
        "ratio = torch.cos(torch.rand(ids.shape[0]) * torch.pi / 2)",
        "import random\n        ratio = torch.tensor([random.random() for _ in range(ids.shape[0])])",
    )
    project.conftest(source)
    run = project.run("--dlcheck=T10", "-rs")
    run.assert_outcome("T10", "skipped")
    assert "random numbers dlcheck cannot replay" in " ".join(run.text.split())


def test_a_grad_scaler_is_no_factor_of_the_loss(project):
    """scaler.scale(loss) multiplies the loss by 65536 before its backward: the factor the step's own scaling is judged
    on leaves it out, so an undivided loss still fails (and the step's steps are unscaled by scaler.step)."""
    source = mlp_project(divide=False)
    source = source.replace(
        '"lr_scheduler": torch.optim.lr_scheduler.LambdaLR(optimizer, tt.warmup(3))',
        '"lr_scheduler": torch.optim.lr_scheduler.LambdaLR(optimizer, tt.warmup(3)), '
        '"scaler": torch.amp.GradScaler("cpu")',
    )
    source = source.replace("loss.backward()", 'state["scaler"].scale(loss).backward()')
    source = source.replace("opt.step()\n", 'state["scaler"].step(opt)\n                state["scaler"].update()\n')
    assert "GradScaler" in source and 'scaler"].step(opt)' in source
    project.conftest(source)
    before = (torch.rand, torch.randn, torch.autograd.backward)
    run = project.run("--dlcheck=T10")
    assert (torch.rand, torch.randn, torch.autograd.backward) == before  # put back
    run.assert_outcome("T10", "failed")
    text = tt.section(run, "T10")
    assert "no factor in the graph of the loss it backwards" in text, text
    assert "4x the full-batch gradient" in text, text


def test_the_window_after_a_first_step_at_the_first_call_is_judged_from_the_step(project):
    """`if i % k == 0: step` steps at calls 1, 5, 9: the union is run after call 1 is replayed (its optimizer step
    included), at call 2. A first step on `loss / k` of its one micro-batch is the off-by-one window (fails); a first
    step on the whole loss passes; a loss never divided fails on the later windows."""
    project.conftest(mlp_project(divide=True).replace("if (i + 1) % 4 == 0:", "if i % 4 == 0:"))
    run = project.run("--dlcheck=T10")
    run.assert_outcome("T10", "failed")
    text = tt.section(run, "T10")
    assert "the backward of call 1 scales its loss by 1/4, as each backward of the window of 4 does" in text, text
    assert "the window of calls 2-5 is right" in text, text
    assert "the first accumulation window is off by one" in text, text
    project.conftest(
        mlp_project(divide=False)
        .replace("if (i + 1) % 4 == 0:", "if i % 4 == 0:")
        .replace("model(x), y)", "model(x), y) / (1 if i == 0 else 4)")
    )
    run = project.run("--dlcheck=T10", "-rA")
    run.assert_outcome("T10", "passed")
    text = " ".join(run.text.split())
    assert "(calls 2-5, after the optimizer step at call 1)" in text, text
    assert "matches the full-batch gradient" in text, text
    assert "its backward takes the whole loss (no factor), not 1/4 of it" in text, text
    project.conftest(mlp_project(divide=False).replace("if (i + 1) % 4 == 0:", "if i % 4 == 0:"))
    run = project.run("--dlcheck=T10")
    run.assert_outcome("T10", "failed")
    assert "4x the full-batch gradient" in tt.section(run, "T10")
