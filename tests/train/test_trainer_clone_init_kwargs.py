"""A TRL trainer that loaded a model from a hub id or path with *_init_kwargs holds the instance; the copies the
checks train pass the instance, and TRL refuses the kwargs beside it (GKDTrainer: "your teacher_model is already
instantiated"). The copy leaves those kwargs out (trl's examples/scripts/gkd.py, found blind: 21 checks ended in
an internal error)."""

GKD = """
    import pytest, tiny
    from datasets import Dataset
    from trl.experimental.gkd import GKDConfig, GKDTrainer

    @pytest.fixture(scope="session")
    def dlcheck_trainer(tmp_path_factory):
        tok = tiny.tokenizer()
        teacher = tmp_path_factory.mktemp("teacher")
        tiny.llama(tok, seed=1).save_pretrained(teacher)
        msgs = [[{"role": "user", "content": t}, {"role": "assistant", "content": t[::-1]}] for t in tiny.texts(12)[:6]]
        args = tiny.trainer_args(tmp_path_factory.mktemp("o"), GKDConfig)
        args.teacher_model_init_kwargs = {"dtype": "float32"}  # gkd.py's, for the teacher it names by path
        return GKDTrainer(model=tiny.llama(tok), teacher_model=str(teacher), args=args, processing_class=tok,
                          train_dataset=Dataset.from_dict({"messages": msgs}))
"""


def test_a_gkd_trainer_whose_teacher_was_loaded_with_init_kwargs_is_copied(project):
    project.conftest(GKD)
    run = project.run("--dlcheck=T3,T5", "-rA")
    run.assert_outcome("T3", "passed")
    run.assert_outcome("T5", "passed")
    assert "already instantiated" not in run.text and "internal error" not in run.text
