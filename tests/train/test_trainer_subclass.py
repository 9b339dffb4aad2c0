"""A Trainer subclass whose constructor passes ``*args, **kwargs`` on to ``Trainer.__init__`` and adds its own
keywords — transformers' examples/pytorch/question-answering/trainer_qa.py::QuestionAnsweringTrainer
(``__init__(self, *args, eval_examples=None, post_process_function=None, **kwargs)``). The checks clone it with
its model and args passed by name (read through the class hierarchy) and its own keywords kept; before, the
clone was built from the subclass's signature alone, got no model, and 21 checks raised "`Trainer` requires
either a `model` or `model_init` argument" — blamed on the user's dlcheck_trainer (found blind on run_qa)."""

CONFTEST = """
    import pytest, tiny
    from datasets import Dataset
    from transformers import DataCollatorForLanguageModeling, Trainer

    class QuestionAnsweringTrainer(Trainer):
        def __init__(self, *args, eval_examples=None, post_process_function=None, **kwargs):
            super().__init__(*args, **kwargs)
            self.eval_examples = eval_examples
            self.post_process_function = post_process_function

    @pytest.fixture(scope="session")
    def dlcheck_trainer(tmp_path_factory):
        tok = tiny.tokenizer()
        data = Dataset.from_list(tiny.tokenized(tok, 12))
        args = tiny.trainer_args(tmp_path_factory.mktemp("o"), learning_rate=1e-3)
        return QuestionAnsweringTrainer(
            model=tiny.llama(tok),
            args=args,
            train_dataset=data,
            data_collator=DataCollatorForLanguageModeling(tok, mlm=False),
            processing_class=tok,
            eval_examples=["kept"],
            post_process_function=len,
        )
"""


def test_a_trainer_subclass_taking_args_and_kwargs_is_cloned_with_its_model(project):
    project.conftest(CONFTEST)
    run = project.run("--dlcheck=T1,T3,C1", "-rA")
    assert "requires either a `model`" not in run.text, run.text[-3000:]
    for cid in ("T1", "T3", "C1"):
        run.assert_outcome(cid, "passed")


#: a subclass whose constructor takes a keyword it does not keep: the copy cannot be rebuilt from the attributes
UNKEPT = """
    import pytest, tiny
    from datasets import Dataset
    from transformers import DataCollatorForLanguageModeling, Trainer

    class TaggedTrainer(Trainer):
        def __init__(self, tag, **kwargs):
            super().__init__(**kwargs)
            self._label = tag.upper()

    @pytest.fixture(scope="session")
    def dlcheck_trainer(tmp_path_factory):
        tok = tiny.tokenizer()
        data = Dataset.from_list(tiny.tokenized(tok, 12))
        args = tiny.trainer_args(tmp_path_factory.mktemp("o"), learning_rate=1e-3)
        return TaggedTrainer(
            "run",
            model=tiny.llama(tok),
            args=args,
            train_dataset=data,
            data_collator=DataCollatorForLanguageModeling(tok, mlm=False),
        )
"""


def test_a_copy_the_plugin_cannot_rebuild_is_its_internal_error_not_the_users(project):
    project.conftest(UNKEPT)
    run = project.run("--dlcheck=T1", "-rA")
    text = run.text
    assert "internal error" in text, text[-3000:]
    assert "TaggedTrainer.__init__() missing 1 required positional argument: 'tag'" in text, text[-3000:]
    assert "your role raised" not in text, text[-3000:]
