"""--dlcheck-property: real collators whose bug only generated inputs reveal fail in property mode with
a shrunk counter-example while sampled mode misses them; their correct twins pass both."""

import re

import pytest

COLLATORS = '''
    import pytest, tiny, torch

    def pad_batch(tok, seqs, labels):
        width = max(map(len, seqs))
        pad = tok.pad_token_id
        ids = torch.tensor([s + [pad] * (width - len(s)) for s in seqs])
        mask = torch.tensor([[1] * len(s) + [0] * (width - len(s)) for s in seqs])
        lab = torch.tensor([l + [-100] * (width - len(l)) for l in labels])
        return {"input_ids": ids, "attention_mask": mask, "labels": lab}

    class EosThenTruncate:
        """Appends EOS, then truncates: an example of exactly max_length tokens loses its EOS."""
        def __init__(self, tok, max_length=16):
            self.tok, self.max_length = tok, max_length
        def __call__(self, rows):
            seqs = [(list(r["input_ids"]) + [self.tok.eos_token_id])[: self.max_length] for r in rows]
            return pad_batch(self.tok, seqs, seqs)

    class TruncateThenEos(EosThenTruncate):
        def __call__(self, rows):
            seqs = [list(r["input_ids"])[: self.max_length - 1] + [self.tok.eos_token_id] for r in rows]
            return pad_batch(self.tok, seqs, seqs)

    class CompletionOnly:
        """Masks everything up to the response template; {search_from} is where it starts looking."""
        template = " Answer:"
        def __init__(self, tok):
            self.tok = tok
            self.template_ids = tok(self.template)["input_ids"]
        def __call__(self, rows):
            seqs, labels = [], []
            for r in rows:
                ids = self.tok(r["prompt"] + self.template + r["completion"] + self.tok.eos_token)["input_ids"]
                n = len(self.template_ids)
                starts = [i for i in range({search_from}, len(ids) - n + 1) if ids[i:i + n] == self.template_ids]
                # like the old completion-only collators: no template found -> the whole example is ignored
                cut = starts[0] + n if starts else len(ids)
                seqs.append(ids)
                labels.append([-100] * cut + ids[cut:])
            return pad_batch(self.tok, seqs, labels)

    class TextWithEos:
        """Tokenizes text + EOS with labels = input_ids: an empty text collates to a lone EOS."""
        def __init__(self, tok):
            self.tok = tok
        def __call__(self, rows):
            seqs = [self.tok(r["text"])["input_ids"] + [self.tok.eos_token_id] for r in rows]
            return pad_batch(self.tok, seqs, seqs)

    @pytest.fixture(scope="session")
    def dlcheck_tokenizer():
        return tiny.tokenizer()
'''

TOKENIZED = """
    @pytest.fixture(scope="session")
    def dlcheck_dataset(dlcheck_tokenizer):
        return [dlcheck_tokenizer(t) for t in ["hello world", "what is 2+2?", "a b c d", "Name a colour."]]

    @pytest.fixture(scope="session")
    def dlcheck_collator(dlcheck_tokenizer):
        return {collator}(dlcheck_tokenizer)
"""

PAIRS = """
    @pytest.fixture(scope="session")
    def dlcheck_dataset():
        return [{{"prompt": p, "completion": c}} for p, c in zip(tiny.PROMPTS, tiny.COMPLETIONS)]

    @pytest.fixture(scope="session")
    def dlcheck_collator(dlcheck_tokenizer):
        return CompletionOnly(dlcheck_tokenizer)
"""


def conftest(search_from=0, data=TOKENIZED, collator="TruncateThenEos"):
    return COLLATORS.replace("{search_from}", str(search_from)) + data.format(collator=collator)


def test_eos_appended_after_truncation_is_lost_at_exactly_max_length(project):
    project.conftest(conftest(collator="EosThenTruncate"))
    run = project.run("--dlcheck=L13", "--dlcheck-property", "--dlcheck-property-examples=30")
    run.assert_outcome("L13", "passed")  # the sampled examples are all shorter than max_length
    run.assert_outcome("L13[property]", "failed")
    text = run.section("L13")
    assert "property mode: Hypothesis generated" in text and "shrank the failure" in text
    assert "max_length 16" in text and "generated examples: [{'input_ids'" in text


def test_truncating_before_appending_eos_passes(project):
    project.conftest(conftest(collator="TruncateThenEos"))
    run = project.run("--dlcheck=L2,L11,L13,L14", "--dlcheck-property", "--dlcheck-property-examples=30")
    assert run.result.ret == 0, run.text
    assert run.outcome("L13[property]") == "passed"


def test_no_empty_prompt_is_generated_from_data_that_holds_none(project):
    # searching from 1 skips a response template that starts the sequence, which only an empty prompt makes: the
    # data never holds one, so property mode generates none (a prompt never blank in the sample is never blank)
    project.conftest(conftest(search_from=1, data=PAIRS))
    run = project.run("--dlcheck=L13", "--dlcheck-property", "--dlcheck-property-examples=40")
    run.assert_outcome("L13", "passed")
    run.assert_outcome("L13[property]", "passed")


def test_completion_masker_that_misses_a_template_at_position_zero(project):
    # the data holds an empty prompt: the sampled examples show the bug, and the generated ones may be empty too
    project.conftest(conftest(search_from=1, data=PAIRS.replace("tiny.COMPLETIONS)]", "tiny.COMPLETIONS)][:5] + "
                                                                "[{{'prompt': '', 'completion': ' 4'}}]")))  # fmt: skip
    run = project.run("--dlcheck=L13", "--dlcheck-property", "--dlcheck-property-examples=40")
    run.assert_outcome("L13", "failed")
    run.assert_outcome("L13[property]", "failed")
    text = run.text[run.text.index("property mode: Hypothesis generated") :]
    assert "no supervised token" in text or "every label -100" in text or "zero" in text
    assert "'prompt': ''" in text


def test_completion_masker_searching_from_zero_passes(project):
    project.conftest(conftest(search_from=0, data=PAIRS))
    run = project.run("--dlcheck=L2,L13", "--dlcheck-property", "--dlcheck-property-examples=40")
    assert run.result.ret == 0, run.text
    run.assert_outcome("L13[property]", "passed")


def test_property_mode_is_off_by_default_and_deterministic(project):
    project.conftest(conftest(collator="EosThenTruncate"))
    run = project.run("--dlcheck=L13")
    assert "L13[property]" not in run.outcomes
    first = project.run("--dlcheck=L13", "--dlcheck-property", "--dlcheck-property-examples=30").section("L13")
    second = project.run("--dlcheck=L13", "--dlcheck-property", "--dlcheck-property-examples=30").section("L13")
    assert first == second
    assert not (project.pytester.path / ".hypothesis").exists()  # no example database in the user's repo


PACKER = '''
    import pytest, tiny, torch

    class Packer:
        """Packs a batch of tokenized documents into one row, position_ids restarting per document and
        the first label of each document set to -100 ({guard})."""
        def __call__(self, rows):
            ids, pos, labels = [], [], []
            for r in rows:
                doc = list(r["input_ids"])
                ids += doc
                pos += list(range(len(doc)))
                lab = list(doc)
                if {guard}:
                    lab[0] = -100
                labels += lab
            return {"input_ids": torch.tensor([ids]), "position_ids": torch.tensor([pos]), "labels": torch.tensor([labels])}

    @pytest.fixture(scope="session")
    def dlcheck_tokenizer():
        return tiny.tokenizer()

    @pytest.fixture(scope="session")
    def dlcheck_model(dlcheck_tokenizer):
        model = tiny.llama(dlcheck_tokenizer)
        model.config.use_cache = False
        return model

    @pytest.fixture(scope="session")
    def dlcheck_dataset(dlcheck_tokenizer):
        return tiny.tokenized(dlcheck_tokenizer, 8)

    @pytest.fixture(scope="session")
    def dlcheck_collator():
        return Packer()
'''


def test_packer_that_drops_the_boundary_of_one_token_documents(project):
    # "lab[0] = -100 only for documents longer than one token": the previous document's EOS is then
    # trained to predict a one-token document's token across the boundary
    project.conftest(PACKER.replace("{guard}", "len(doc) > 1"))
    run = project.run("--dlcheck=L4", "--dlcheck-property", "--dlcheck-property-examples=30")
    run.assert_outcome("L4", "passed")
    run.assert_outcome("L4[property]", "failed")
    text = run.section("L4")
    assert "property mode: Hypothesis generated" in text
    assert "generated examples: [{'input_ids': [0]" in text or "'input_ids': [0]" in text


def test_packer_masking_every_document_start_passes(project):
    project.conftest(PACKER.replace("{guard}", "True"))
    run = project.run("--dlcheck=L4", "--dlcheck-property", "--dlcheck-property-examples=30")
    assert run.result.ret == 0, run.text
    run.assert_outcome("L4[property]", "passed")


TEXTS = """
    @pytest.fixture(scope="session")
    def dlcheck_dataset():
        return [{{"text": t}} for t in tiny.CORPUS[:6]]

    @pytest.fixture(scope="session")
    def dlcheck_collator(dlcheck_tokenizer):
        return TextWithEos(dlcheck_tokenizer)
"""


def test_lone_eos_example_is_reported_as_what_it_supervises(project):
    """An empty text collates to [EOS] with label EOS: the label is there, but at position 0, which a
    causal LM never predicts. L13's evidence says so instead of "every label is -100". (The data holds an
    empty text: property mode generates empty texts only from data that holds one.)"""
    project.conftest(conftest(data=TEXTS.replace("tiny.CORPUS[:6]]", 'tiny.CORPUS[:5]] + [{{"text": ""}}]')))
    run = project.run("--dlcheck=L13", "--dlcheck-property", "--dlcheck-property-examples=30")
    run.assert_outcome("L13", "failed")
    run.assert_outcome("L13[property]", "failed")
    text = " ".join(run.section("L13").split())
    assert "every label is -100" not in text
    assert (
        "have no supervised token the loss can use: 1 supervise only their first token (example 1.1 (dataset row 5): "
        "'<|endoftext|>'(0)→0), which a causal LM never predicts"
    ) in text
    assert "these examples supervise only their first token, which the loss never uses" in text
    assert "generated examples: [{'text': ''}]" in " ".join(run.text.split())


def test_no_empty_text_is_generated_from_data_that_holds_none(project):
    project.conftest(conftest(data=TEXTS))
    run = project.run("--dlcheck=L13", "--dlcheck-property", "--dlcheck-property-examples=30")
    run.assert_outcome("L13", "passed")
    run.assert_outcome("L13[property]", "passed")


# ---- the prompt/completion boundary a tokenizer merges across ----------------------------------------

BOUNDARY = '''
    import pytest, tiny, torch

    def pad_batch(tok, seqs, labels):
        width = max(map(len, seqs))
        ids = torch.tensor([s + [tok.pad_token_id] * (width - len(s)) for s in seqs])
        mask = torch.tensor([[1] * len(s) + [0] * (width - len(s)) for s in seqs])
        lab = torch.tensor([l + [-100] * (width - len(l)) for l in labels])
        return {"input_ids": ids, "attention_mask": mask, "labels": lab}

    class CountFromTheEnd:
        """Supervises the last len(tokenizer(completion)) tokens: counted apart, a completion whose first
        word the tokenizer merges with the prompt's trailing space may take more tokens than in context."""
        def __init__(self, tok):
            self.tok = tok
        def __call__(self, rows):
            seqs, labels = [], []
            for r in rows:
                eos = self.tok.eos_token
                ids = self.tok(r["prompt"] + r["completion"] + eos)["input_ids"]
                n = min(len(self.tok(r["completion"] + eos, add_special_tokens=False)["input_ids"]), len(ids))
                seqs.append(ids)
                labels.append([-100] * (len(ids) - n) + ids[len(ids) - n :])
            return pad_batch(self.tok, seqs, labels)

    class CommonPrefix(CountFromTheEnd):
        """TRL's boundary: the prompt is the common prefix of tokenizer(prompt) and the whole example."""
        def __call__(self, rows):
            seqs, labels = [], []
            for r in rows:
                ids = self.tok(r["prompt"] + r["completion"] + self.tok.eos_token)["input_ids"]
                p = self.tok(r["prompt"])["input_ids"]
                n = next((i for i, (a, b) in enumerate(zip(p, ids)) if a != b), min(len(p), len(ids)))
                seqs.append(ids)
                labels.append([-100] * n + ids[n:])
            return pad_batch(self.tok, seqs, labels)

    @pytest.fixture(scope="session")
    def dlcheck_tokenizer():
        return tiny.tokenizer()

    @pytest.fixture(scope="session")
    def dlcheck_dataset():
        return [{"prompt": p, "completion": c} for p, c in zip(tiny.PROMPTS, tiny.COMPLETIONS)]

    @pytest.fixture(scope="session")
    def dlcheck_collator(dlcheck_tokenizer):
        return {collator}(dlcheck_tokenizer)
'''


def test_completion_counted_apart_leaves_the_last_prompt_token_supervised(project):
    """The data's completions start with a space: counting them apart is right there. Property mode moves the
    space onto the prompt ("once upon a time " + "there was…"): the tokenizer merges it into 'Ġthe', the
    completion alone ('there…') takes one token more, and the prompt's last token is trained."""
    project.conftest(BOUNDARY.replace("{collator}", "CountFromTheEnd"))
    run = project.run("--dlcheck=L2", "--dlcheck-property", "--dlcheck-property-examples=30")
    run.assert_outcome("L2", "passed")
    run.assert_outcome("L2[property]", "failed")
    text = " ".join(run.section("L2").split())
    assert "property mode: Hypothesis generated" in text
    # (the shrunk batch holds one or two examples: how far Hypothesis shrinks it is not this check's guarantee)
    assert re.search(r"1 of [12] sampled prompt/completion examples supervise prompt tokens", text)
    assert "labels on the prompt: 'me'(275)→275" in text  # the last token of 'once upon a time '
    assert "merges the prompt's trailing whitespace into the completion's first word ('Ġthe'" in text
    assert "n_prompt = the common prefix of tokenizer(prompt)['input_ids'] and tokenizer(prompt + completion)" in text
    # the shrunk counter-example: a prompt ending in the space, a completion starting with the word
    assert "{'prompt': 'once upon a time ', 'completion': 'there was a tiny model'}" in text


def test_common_prefix_boundary_passes_at_the_merge(project):
    # L13 too: the data holds no empty prompt or completion, so none is generated (an emptied pair would collate to
    # a lone EOS, which L13 would fail on data the user never has)
    project.conftest(BOUNDARY.replace("{collator}", "CommonPrefix"))
    run = project.run("--dlcheck=L2,L13", "--dlcheck-property", "--dlcheck-property-examples=30")
    assert run.result.ret == 0, run.text
    run.assert_outcome("L2[property]", "passed")
    run.assert_outcome("L13[property]", "passed")


# ---- conversations of several turns made from single-turn data -------------------------------------

TURNS = '''
    import pytest, tiny, torch

    def pad_batch(tok, seqs, labels):
        width = max(map(len, seqs))
        ids = torch.tensor([s + [tok.pad_token_id] * (width - len(s)) for s in seqs])
        mask = torch.tensor([[1] * len(s) + [0] * (width - len(s)) for s in seqs])
        lab = torch.tensor([l + [-100] * (width - len(l)) for l in labels])
        return {"input_ids": ids, "attention_mask": mask, "labels": lab}

    class Masker:
        def __init__(self, tok):
            self.tok = tok
            self.assistant, self.end = tok.convert_tokens_to_ids(["<|assistant|>", "<|end|>"])
        def __call__(self, rows):
            seqs, labels = [], []
            for r in rows:
                ids = self.tok.apply_chat_template(r["messages"], tokenize=True, return_dict=True)["input_ids"]
                seqs.append(list(ids))
                labels.append(self.labels(r["messages"], list(ids)))
            return pad_batch(self.tok, seqs, labels)

    class FirstTurnOnly(Masker):
        """Written for single-turn data: supervises from the first <|assistant|> to the first <|end|> after it."""
        def labels(self, messages, ids):
            a = ids.index(self.assistant) + 1
            e = ids.index(self.end, a) + 1
            return [-100] * a + ids[a:e] + [-100] * (len(ids) - e)

    class LastTurnOnly(Masker):
        """The prompt is everything before the last answer."""
        def labels(self, messages, ids):
            n = len(self.tok.apply_chat_template(messages[:-1], tokenize=True, add_generation_prompt=True,
                                                 return_dict=True)["input_ids"])
            return [-100] * n + ids[n:]

    class AfterFirstHeader(Masker):
        """A response template alone: everything after the first <|assistant|> is supervised."""
        def labels(self, messages, ids):
            a = ids.index(self.assistant) + 1
            return [-100] * a + ids[a:]

    class AssistantMasks(Masker):
        """transformers' assistant mask from the {% generation %} template."""
        def labels(self, messages, ids):
            mask = self.tok.apply_chat_template(messages, tokenize=True, return_dict=True,
                                                return_assistant_tokens_mask=True)["assistant_masks"]
            return [t if m else -100 for t, m in zip(ids, mask)]

    @pytest.fixture(scope="session")
    def dlcheck_tokenizer():
        return tiny.tokenizer()

    @pytest.fixture(scope="session")
    def dlcheck_dataset():
        return [
            {"messages": [{"role": "user", "content": p}, {"role": "assistant", "content": c.strip()}]}
            for p, c in zip(tiny.PROMPTS, tiny.COMPLETIONS)
        ]

    @pytest.fixture(scope="session")
    def dlcheck_collator(dlcheck_tokenizer):
        return {collator}(dlcheck_tokenizer)
'''


def test_masker_training_only_the_first_assistant_turn(project):
    project.conftest(TURNS.replace("{collator}", "FirstTurnOnly"))
    run = project.run("--dlcheck=L2", "--dlcheck-property", "--dlcheck-property-examples=30")
    run.assert_outcome("L2", "passed")  # single-turn data: the first turn is the only one
    run.assert_outcome("L2[property]", "failed")
    text = " ".join(run.section("L2").split())
    assert "leave whole assistant turns unsupervised" in text
    assert "turn 1 " in text and "turn 2 " in text and "all -100" in text
    assert "supervises only the first assistant turn" in text
    assert "return_assistant_tokens_mask=True" in text and "L2.every_assistant_turn=false" in text
    assert "generated examples: [{'messages': [{'role': 'user'" in text


def test_masker_training_only_the_last_assistant_turn(project):
    project.conftest(TURNS.replace("{collator}", "LastTurnOnly"))
    run = project.run("--dlcheck=L2", "--dlcheck-property", "--dlcheck-property-examples=30")
    run.assert_outcome("L2", "passed")
    run.assert_outcome("L2[property]", "failed")
    text = " ".join(run.section("L2").split())
    assert "supervises only the last assistant turn" in text and "all -100" in text
    # training on the last turn only, said to be intended, passes
    run = project.run(
        "--dlcheck=L2", "--dlcheck-property", "--dlcheck-property-examples=30",
        "--dlcheck-set", "L2.every_assistant_turn=false",
    )  # fmt: skip
    assert run.result.ret == 0, run.text


def test_response_template_alone_trains_the_later_user_turns(project):
    project.conftest(TURNS.replace("{collator}", "AfterFirstHeader"))
    run = project.run("--dlcheck=L2", "--dlcheck-property", "--dlcheck-property-examples=30")
    run.assert_outcome("L2", "passed")
    run.assert_outcome("L2[property]", "failed")
    text = " ".join(run.section("L2").split())
    assert "messages examples supervise user/system-turn tokens" in text


def test_assistant_masks_pass_on_every_turn(project):
    project.conftest(TURNS.replace("{collator}", "AssistantMasks"))
    run = project.run("--dlcheck=L2,L13", "--dlcheck-property", "--dlcheck-property-examples=30", "-rA")
    assert run.result.ret == 0, run.text
    run.assert_outcome("L2[property]", "passed")


@pytest.mark.parametrize("seed", [0, 1, 3, 4, 5, 7])
def test_the_merge_at_the_boundary_is_reached_on_every_seed(project, monkeypatch, seed):
    # the boundary a tokenizer merges across is built into the generated examples, not left to the draw: the
    # counting-apart collator fails whatever the seed of the generated examples
    monkeypatch.setattr("pytest_dlcheck.property.PROPERTY_SEED", seed)
    project.conftest(BOUNDARY.replace("{collator}", "CountFromTheEnd"))
    run = project.run("--dlcheck=L2", "--dlcheck-property", "--dlcheck-property-examples=30")
    run.assert_outcome("L2[property]", "failed")
    text = " ".join(run.section("L2").split())
    assert "merges the prompt's trailing whitespace into the completion's first word" in text
