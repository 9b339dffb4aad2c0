"""Unit tests of the shared training machinery: independent copies of TRL-patched models, wrapper-prefix
detection that does not confuse a submodule named ``module`` with a DDP wrapper."""

import torch
from torch import nn

from pytest_dlcheck.training import fresh_modules, strip_wrapper_prefix, unwrapped_keys


def test_a_copy_of_a_trl_patched_model_trains_itself_not_the_original():
    import tiny
    from trl.trainer.utils import add_fused_lm_head

    tok = tiny.tokenizer()
    model = tiny.llama(tok)
    add_fused_lm_head(model)  # as DPOTrainer does: model.forward becomes a closure over the original's forward
    assert "forward" in vars(model)
    (copy,) = fresh_modules([model])
    assert "forward" not in vars(copy)
    before = [p.detach().clone() for p in model.parameters()]
    ids = torch.tensor([tok("hello world").input_ids])
    loss = copy(input_ids=ids, labels=ids).loss
    loss.backward()
    with torch.no_grad():
        for p in copy.parameters():
            if p.grad is not None:
                p -= 0.1 * p.grad
    assert all(torch.equal(a, b) for a, b in zip(before, model.parameters()))
    assert not all(torch.equal(a, b) for a, b in zip(before, copy.parameters()))


def test_parameters_shared_between_models_stay_shared_in_their_copies():
    policy = nn.Linear(4, 4)
    reference = nn.Sequential(policy)  # the reference *is* the policy's layer
    fresh_policy, fresh_reference = fresh_modules([policy, reference])
    assert fresh_reference[0].weight is fresh_policy.weight
    assert fresh_policy.weight.data_ptr() != policy.weight.data_ptr()


class Holder(nn.Module):
    def __init__(self):
        super().__init__()
        self.module = nn.Linear(2, 2)  # a submodule that happens to be called "module"


def test_a_submodule_named_module_is_not_a_wrapper_prefix():
    model = Holder()
    clean = unwrapped_keys(model)
    assert clean == {"module.weight", "module.bias"}
    assert all(strip_wrapper_prefix(k, clean) is None for k in model.state_dict() if k not in clean)


def test_compiled_keys_map_to_the_unwrapped_ones():
    model = torch.compile(Holder())
    clean = unwrapped_keys(model)
    assert clean == {"module.weight", "module.bias"}
    assert strip_wrapper_prefix("_orig_mod.module.weight", clean) == "module.weight"
