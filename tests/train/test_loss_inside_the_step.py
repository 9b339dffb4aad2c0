"""A transformers model whose output carries no loss (no labels in the batches: a text encoder trained by textual
inversion, a base model under a hand-written head) and a loss computed inside ``dlcheck_train_step``: T3 and T5
judge through the step; T2 and T10, which need the loss apart from the step, ask for dlcheck_compute_loss by name
(they said "the loss is a BaseModelOutputWithPooling, not a scalar tensor")."""

PROJECT = """
    import pytest, torch, tiny
    from torch.utils.data import DataLoader
    from transformers import DataCollatorWithPadding, LlamaConfig, LlamaModel

    TOK = tiny.tokenizer()

    @pytest.fixture(scope="session")
    def dlcheck_make_training():
        def make():
            cfg = LlamaConfig(vocab_size=len(TOK), hidden_size=32, intermediate_size=64, num_hidden_layers=1,
                              num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64,
                              pad_token_id=TOK.pad_token_id)
            model = LlamaModel(cfg)
            params = [p for p in model.parameters() if p.requires_grad]
            return {"model": model, "optimizer": torch.optim.AdamW(params, lr=1e-3)}
        return make

    @pytest.fixture(scope="session")
    def dlcheck_dataloader():
        rows = [{"input_ids": r["input_ids"]} for r in tiny.tokenized(TOK, n=16)]
        return DataLoader(rows, batch_size=4, collate_fn=DataCollatorWithPadding(TOK))

    @pytest.fixture(scope="session")
    def dlcheck_train_step():
        def step(state, batch, i):
            model, opt = state["model"], state["optimizer"]
            hidden = model(input_ids=batch["input_ids"]).last_hidden_state
            loss = hidden.pow(2).mean()  # the step's own objective on the hidden states
            loss.backward()
            opt.step()
            opt.zero_grad()
            return loss.detach()
        return step
"""


def test_a_model_whose_output_carries_no_loss_is_judged_through_the_step(project):
    project.conftest(PROJECT)
    run = project.run("--dlcheck=T2,T3,T5,T10", "-rA")
    run.assert_outcome("T3", "passed")
    run.assert_outcome("T5", "passed")
    text = " ".join(run.text.split())
    assert "LlamaModel is given no labels by the batches (fields: input_ids, attention_mask)" in text, text
    assert "not a scalar tensor" not in text, text
    assert "T2_overfit_batch: missing role: define fixture dlcheck_compute_loss (model, batch) -> loss" in text, text


def test_a_model_cut_from_the_graph_inside_such_a_step_still_fails_t3(project):
    # the buggy twin: the step's objective reads the hidden states detached; only the embeddings feed the loss
    project.conftest(
        PROJECT.replace(
            ".last_hidden_state",
            ".last_hidden_state.detach() + 0 * model.embed_tokens(batch['input_ids'])",
        )
    )
    run = project.run("--dlcheck=T3")
    run.assert_outcome("T3", "failed")
