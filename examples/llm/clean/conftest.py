"""A clean SFT set-up: TRL's SFTTrainer on prompt/completion data, the tokenizer with its own pad
token. One fixture is all pytest-dlcheck needs: the rest is derived from the trainer."""

import pytest
import tinyllm


@pytest.fixture(scope="session")
def dlcheck_trainer(tmp_path_factory):
    from trl import SFTConfig, SFTTrainer

    tok = tinyllm.build_tokenizer()
    args = SFTConfig(**tinyllm.common_args(tmp_path_factory.mktemp("sft")), activation_checkpointing=False)
    return SFTTrainer(
        model=tinyllm.build_model(tok),
        args=args,
        processing_class=tok,
        train_dataset=tinyllm.prompt_completion_dataset(),
    )
