"""L8: the dataset's columns fit the trainer, and conversations go through the chat template."""

import pytest
import tiny

# imported here, before pytester snapshots sys.modules, so the in-process runs share them
import transformers.trainer  # noqa: F401,E402
from datasets import Dataset  # noqa: F401,E402
from helpers import flat
from transformers import DataCollatorForLanguageModeling, Trainer  # noqa: F401,E402
from trl import DPOConfig, DPOTrainer, GRPOConfig, GRPOTrainer, SFTConfig, SFTTrainer  # noqa: F401,E402

import pytest_dlcheck.checks.llm.schema  # noqa: F401,E402

DATA = """
import pytest

import tiny

P, C = tiny.PROMPTS, tiny.COMPLETIONS
MESSAGES = [[{"role": "user", "content": p}, {"role": "assistant", "content": c.strip()}] for p, c in zip(P, C)]
REJECTED = [" I do not know.", " Go away.", " Green is a number.", " nothing happened", " sleeps", " 1 2 3"]


def plain_join(messages):
    return "\\n".join(f"{m['role']}: {m['content']}" for m in messages)
"""

# ---- TRL trainers (built once per run: session-scoped fixtures) -----------------------------------

SFT = """
import pytest, tiny
from datasets import Dataset
from trl import SFTConfig, SFTTrainer
from l8_data import *

@pytest.fixture(scope="session")
def dlcheck_trainer(tmp_path_factory):
    tok = tiny.tokenizer()
    return SFTTrainer(model=tiny.llama(tok), processing_class=tok, train_dataset=Dataset.from_dict({data}),
                      args=tiny.trainer_args(tmp_path_factory.mktemp("out"), SFTConfig, max_length=64))
"""

DPO = """
import copy, pytest, tiny
from datasets import Dataset
from trl import DPOConfig, DPOTrainer
from l8_data import *

@pytest.fixture(scope="session")
def dlcheck_trainer(tmp_path_factory):
    tok = tiny.tokenizer()
    model = tiny.llama(tok)
    return DPOTrainer(model=model, ref_model=copy.deepcopy(model), processing_class=tok,
                      train_dataset=Dataset.from_dict({data}),
                      args=tiny.trainer_args(tmp_path_factory.mktemp("out"), DPOConfig, max_length=64))
"""

GRPO = """
import pytest, tiny
from datasets import Dataset
from trl import GRPOConfig, GRPOTrainer
from l8_data import *

def reward(completions, **kwargs):
    return [float(len(c)) for c in completions]

@pytest.fixture(scope="session")
def dlcheck_trainer(tmp_path_factory):
    tok = tiny.tokenizer(chat_template={template})
    return GRPOTrainer(model=tiny.llama(tok), reward_funcs=reward, processing_class=tok,
                       train_dataset=Dataset.from_dict({data}),
                       args=tiny.trainer_args(tmp_path_factory.mktemp("out"), GRPOConfig, num_generations=2,
                                              max_completion_length=8, beta=0.0, per_device_train_batch_size=4))
"""

# ---- hand pipelines: a plain transformers Trainer, or bare fixtures --------------------------------

HAND_TRAINER = """
import pytest, tiny
from datasets import Dataset
from transformers import DataCollatorForLanguageModeling, Trainer
from l8_data import *

@pytest.fixture(scope="session")
def dlcheck_trainer(tmp_path_factory):
    tok = tiny.tokenizer()
    raw = Dataset.from_dict({data})
    data = raw.map(lambda ex: tok({text} + tok.eos_token))   # keeps the raw columns beside input_ids
    return Trainer(model=tiny.llama(tok), processing_class=tok, train_dataset=data,
                   data_collator=DataCollatorForLanguageModeling(tok, mlm=False),
                   args=tiny.trainer_args(tmp_path_factory.mktemp("out")))
"""

HAND_FIXTURES = """
import pytest, tiny
from transformers import DataCollatorForLanguageModeling
from l8_data import *

@pytest.fixture(scope="session")
def dlcheck_tokenizer():
    return tiny.tokenizer()

@pytest.fixture(scope="session")
def dlcheck_raw_dataset():
    return [{{"messages": m}} for m in MESSAGES]

@pytest.fixture(scope="session")
def dlcheck_dataset(dlcheck_tokenizer, dlcheck_raw_dataset):
    tok = dlcheck_tokenizer
    return [tok({text} + tok.eos_token) for ex in dlcheck_raw_dataset]

@pytest.fixture(scope="session")
def dlcheck_collator(dlcheck_tokenizer):
    return DataCollatorForLanguageModeling(dlcheck_tokenizer, mlm=False)
"""


def _run(project, conftest: str, **kw):
    project.conftest(DATA, "l8_data.py")
    project.conftest(conftest.format(**kw))
    return project.run("--dlcheck=L8", "-rA")


# ---- buggy configurations ---------------------------------------------------------------------------


def test_sft_text_plus_answer_trains_on_text_only(project):
    run = _run(project, SFT, data='{"text": P, "answer": C}')
    run.assert_outcome("L8", "failed")
    text = flat(run.section("L8"))
    assert "column 'answer' never reaches the model" in text
    assert "decoded training input: 'what is 2+2?<|endoftext|>'" in text
    assert "SFTTrainer reads 'text'" in text
    assert "'prompt' + 'completion'" in text and "remove_columns(['answer'])" in text
    assert "Traceback" not in run.text


def test_messages_joined_as_plain_text_by_hand(project):
    run = _run(project, HAND_FIXTURES, text='plain_join(ex["messages"])')
    run.assert_outcome("L8", "failed")
    text = flat(run.section("L8"))
    assert "carry none of the chat template's markers ('<|user|>'" in text
    assert "decoded training input: 'user: what is 2+2?\\nassistant: The answer is 4.<|endoftext|>'" in text
    assert "renders example 0 as: '<|user|>what is 2+2?<|end|><|assistant|>The answer is 4.<|end|>'" in text
    assert "without tokenizer.apply_chat_template" in text
    assert "apply_chat_template(example['messages'], tokenize=False)" in text


def test_messages_joined_as_plain_text_in_a_trainer(project):
    run = _run(project, HAND_TRAINER, data='{"messages": MESSAGES}', text='plain_join(ex["messages"])')
    run.assert_outcome("L8", "failed")
    assert "carry none of the chat template's markers" in flat(run.section("L8"))


def test_preference_rows_in_a_plain_trainer_drop_rejected(project):
    run = _run(
        project,
        HAND_TRAINER,
        data='{"prompt": P, "chosen": C, "rejected": REJECTED}',
        text='ex["prompt"] + ex["chosen"]',
    )
    run.assert_outcome("L8", "failed")
    text = flat(run.section("L8"))
    assert "column 'rejected' never reaches the model" in text
    assert "preference pairs handed to a trainer that is not a preference trainer (Trainer)" in text
    assert "trl.DPOTrainer" in text


def test_dpo_chosen_and_rejected_repeat_the_prompt(project):
    run = _run(
        project,
        DPO,
        data='{"prompt": P, "chosen": [p + c for p, c in zip(P, C)], "rejected": [p + r for p, r in zip(P, REJECTED)]}',
    )
    run.assert_outcome("L8", "failed")
    text = flat(run.section("L8"))
    assert "both start with the 'prompt' DPOTrainer puts in front of them" in text
    assert "decoded training input: 'what is 2+2?what is 2+2? The answer is 4.<|endoftext|>'" in text
    assert "trained on the prompt twice" in text
    assert "trl.extract_prompt" in text


def test_grpo_on_a_text_column_constructs_then_fails_at_step_one(project):
    run = _run(project, GRPO, template="tiny.CHAT_TEMPLATE", data='{"text": P}')
    run.assert_outcome("L8", "failed")
    text = flat(run.section("L8"))
    assert "GRPOTrainer reads 'prompt'" in text and "the dataset's columns are: text" in text
    assert "KeyError: 'prompt'" in text
    assert "dataset.rename_column('text', 'prompt')" in text


def test_grpo_conversational_prompts_without_a_chat_template(project):
    run = _run(project, GRPO, template="None", data='{"prompt": [m[:1] for m in MESSAGES]}')
    run.assert_outcome("L8", "failed")
    text = flat(run.section("L8"))
    assert "gets conversational prompts" in text and "no chat template" in text
    assert "tokenizer.chat_template" in text


# ---- correct twins ------------------------------------------------------------------------------------


SFT_SCHEMA = "schema: SFTTrainer reads 'text' (or SFTConfig.dataset_text_field), 'messages', or 'prompt' + 'completion'"
DPO_SCHEMA = "schema: DPOTrainer reads 'chosen' + 'rejected' (with an optional 'prompt' they do not repeat)"
MARKERS = (
    "chat template: 5 of 6 sampled conversations reach the batches, which carry its markers ('<|user|>', "
    "'<|end|><|assistant|>', '<|end|>')"
)


@pytest.mark.parametrize(
    "data,evidence",
    [
        (
            '{"messages": MESSAGES}',
            [
                f"{SFT_SCHEMA}; the 6 sampled examples have messages, input_ids, labels",
                MARKERS,
                "text columns reach the model: 'messages' in 5 of 5 sampled examples judged",
            ],
        ),
        (
            '{"prompt": P, "completion": C}',
            [
                f"{SFT_SCHEMA}; the 6 sampled examples have prompt, completion, input_ids, labels",
                "text columns reach the model: 'prompt' in 2 of 2, 'completion' in 5 of 5 sampled examples judged",
            ],
        ),
        (
            '{"prompt": [m[:1] for m in MESSAGES], "completion": [m[1:] for m in MESSAGES]}',
            [f"{SFT_SCHEMA}; the 6 sampled examples have prompt, completion, input_ids, labels", MARKERS],
        ),
        (
            '{"text": [p + c for p, c in zip(P, C)]}',
            [
                f"{SFT_SCHEMA}; the 6 sampled examples have text, input_ids, labels",
                "text columns reach the model: 'text' in 5 of 5 sampled examples judged",
            ],
        ),
    ],
    ids=["messages", "prompt-completion", "conversational-prompt-completion", "text"],
)
def test_sft_trainer_schemas_pass(project, data, evidence):
    run = _run(project, SFT, data=data)
    run.assert_outcome("L8", "passed")
    run.fnmatch(evidence)


@pytest.mark.parametrize(
    "data,evidence",
    [
        (
            '{"prompt": P, "chosen": C, "rejected": REJECTED}',
            [
                f"{DPO_SCHEMA}; the 6 sampled examples have prompt, chosen, rejected, prompt_ids, chosen_ids, "
                "rejected_ids",
                "text columns reach the model: 'prompt' in 2 of 2, 'chosen' in 4 of 4, 'rejected' in 3 of 3 sampled "
                "examples judged",
            ],
        ),
        (
            '{"chosen": [p + c for p, c in zip(P, C)], "rejected": [p + r for p, r in zip(P, REJECTED)]}',
            [f"{DPO_SCHEMA}; the 6 sampled examples have chosen, rejected, prompt, *"],
        ),
        (
            '{"prompt": [m[:1] for m in MESSAGES], "chosen": [m[1:] for m in MESSAGES], '
            '"rejected": [[{"role": "assistant", "content": r}] for r in REJECTED]}',
            [f"{DPO_SCHEMA}*", MARKERS],
        ),
    ],
    ids=["explicit-prompt", "implicit-prompt", "conversational"],
)
def test_dpo_trainer_schemas_pass(project, data, evidence):
    run = _run(project, DPO, data=data)
    run.assert_outcome("L8", "passed")
    run.fnmatch(evidence)


def test_grpo_prompt_passes(project):
    run = _run(project, GRPO, template="tiny.CHAT_TEMPLATE", data='{"prompt": P, "answer": C}')
    run.assert_outcome("L8", "passed")
    run.fnmatch(
        [
            "schema: GRPOTrainer reads 'prompt' (a string, or a list of messages; other columns go to the reward "
            "functions); the 6 sampled examples have prompt, answer"
        ]
    )


def test_hand_pipeline_with_apply_chat_template_passes(project):
    run = _run(project, HAND_FIXTURES, text='tok.apply_chat_template(ex["messages"], tokenize=False)')
    run.assert_outcome("L8", "passed")
    run.fnmatch([MARKERS, "text columns reach the model: 'messages' in 5 of 5 sampled examples judged"])


def test_tokenized_only_dataset_skips(project):
    project.conftest(DATA, "l8_data.py")
    project.conftest("""
        import pytest, tiny
        from transformers import DataCollatorForLanguageModeling

        @pytest.fixture(scope="session")
        def dlcheck_tokenizer():
            return tiny.tokenizer()

        @pytest.fixture(scope="session")
        def dlcheck_dataset(dlcheck_tokenizer):
            return tiny.tokenized(dlcheck_tokenizer)

        @pytest.fixture(scope="session")
        def dlcheck_collator(dlcheck_tokenizer):
            return DataCollatorForLanguageModeling(dlcheck_tokenizer, mlm=False)
    """)
    run = project.run("--dlcheck=L8")
    run.assert_outcome("L8", "skipped")
    run.fnmatch(
        [
            "SKIPPED * nothing to judge: no trainer kind (dlcheck_trainer or dlcheck_training_args), and the examples "
            "hold token ids only (columns: input_ids, attention_mask); if they were text or conversations before "
            "tokenization, define dlcheck_raw_dataset with those rows, in the same order"
        ]
    )


# ---- unit tests of the detection logic ---------------------------------------------------------------


def test_template_markers_are_the_text_around_the_contents():
    from pytest_dlcheck.checks.llm.schema import template_markers

    tok = tiny.tokenizer()
    messages = [{"role": "user", "content": "hi there"}, {"role": "assistant", "content": "hello"}]
    markers, rendered = template_markers(tok, messages, tok.chat_template, False)
    assert rendered == "<|user|>hi there<|end|><|assistant|>hello<|end|>"
    assert markers == ["<|user|>", "<|end|><|assistant|>", "<|end|>"]


def test_trainer_kind_from_config_class(tmp_path):
    from pytest_dlcheck.checks.llm.schema import trainer_kind

    assert trainer_kind(None, tiny.trainer_args(tmp_path, DPOConfig))[0] == "preference"
    assert trainer_kind(None, tiny.trainer_args(tmp_path, GRPOConfig, num_generations=2))[0] == "prompt-only"
    assert trainer_kind(None, None) == (None, "")
