from __future__ import annotations

import copy

import pytest
import torch
import torch.nn.functional as F

from semspec import cpu_linear
from semspec.cpu_linear import SmallRowsLinear, use_small_rows_linears
from semspec.testing import tiny_model, tiny_tokenizer


def _linear(out_features=48, in_features=32, bias=True, seed=0):
    torch.manual_seed(seed)
    lin = torch.nn.Linear(in_features, out_features, bias=bias)
    lin.__class__ = SmallRowsLinear
    return lin


@pytest.mark.parametrize("bias", [True, False])
def test_few_rows_read_the_transposed_copy_and_match_linear(bias):
    lin = _linear(bias=bias)
    with torch.no_grad():
        for rows in range(1, cpu_linear.SMALL_ROWS + 1):
            x = torch.randn(rows, 32)
            torch.testing.assert_close(lin(x), F.linear(x, lin.weight, lin.bias), rtol=1e-5, atol=1e-6)
            # transformers' shape: [batch, positions, features]
            torch.testing.assert_close(lin(x[None]), F.linear(x[None], lin.weight, lin.bias), rtol=1e-5, atol=1e-6)
    assert lin._weight_t is not None and lin._weight_t.is_contiguous()
    torch.testing.assert_close(lin._weight_t, lin.weight.t())


def test_more_rows_use_linears_own_kernel_and_make_no_copy():
    lin = _linear()
    x = torch.randn(cpu_linear.SMALL_ROWS + 1, 32)
    with torch.no_grad():
        assert torch.equal(lin(x), F.linear(x, lin.weight, lin.bias))
    assert lin._weight_t is None


def test_the_copy_follows_the_weight():
    lin = _linear()
    x = torch.randn(1, 32)
    with torch.no_grad():
        lin(x)
        lin.weight.mul_(2.0)  # an optimizer step between two evaluations
        torch.testing.assert_close(lin(x), F.linear(x, lin.weight, lin.bias), rtol=1e-5, atol=1e-6)
        lin.weight = torch.nn.Parameter(torch.randn(48, 32))  # the weight replaced
        torch.testing.assert_close(lin(x), F.linear(x, lin.weight, lin.bias), rtol=1e-5, atol=1e-6)
        twin = copy.deepcopy(lin)  # its weight restarts at version 0: one step brings it to 1
        twin.weight.add_(1.0)
        torch.testing.assert_close(twin(x), F.linear(x, twin.weight, twin.bias), rtol=1e-5, atol=1e-6)
        lin.bfloat16().float()  # cast and back: other values, version 0 again
        assert lin._weight_t is None
        torch.testing.assert_close(lin(x), F.linear(x, lin.weight, lin.bias), rtol=1e-5, atol=1e-6)


def test_a_copy_made_in_inference_mode_serves_autograd_later():
    lin = _linear()
    lin.weight.requires_grad_(False)  # a frozen layer that a trained one reads through
    x = torch.randn(1, 32)
    with torch.inference_mode():
        lin(x)
    x.requires_grad_(True)
    lin(x).sum().backward()
    torch.testing.assert_close(x.grad, lin.weight.sum(0, keepdim=True))


def test_training_keeps_gradients():
    lin = _linear()
    y = lin(torch.randn(1, 32)).sum()
    y.backward()
    assert lin.weight.grad is not None and lin._weight_t is None


def test_bfloat16_uses_linear():
    lin = _linear().to(torch.bfloat16)
    x = torch.randn(1, 32, dtype=torch.bfloat16)
    with torch.no_grad():
        assert torch.equal(lin(x), F.linear(x, lin.weight, lin.bias))
    assert lin._weight_t is None


def test_model_swap_keeps_tied_weights_and_outputs():
    tok = tiny_tokenizer()
    model = tiny_model(tok)
    model.lm_head.weight = model.model.embed_tokens.weight  # tie, as SmolLM2 does
    ids = torch.tensor([[5, 6, 7, 8, 9]])
    with torch.no_grad():
        before = model(ids).logits
        n = use_small_rows_linears(model)
        # 7 linear layers per decoder layer (q, k, v, o, gate, up, down) and the LM head
        assert n == 7 * model.config.num_hidden_layers + 1
        assert all(type(m) is SmallRowsLinear for m in model.modules() if isinstance(m, torch.nn.Linear))
        assert model.lm_head.weight is model.model.embed_tokens.weight
        torch.testing.assert_close(model(ids).logits, before, rtol=1e-5, atol=1e-5)
        torch.testing.assert_close(model(ids[:, :1]).logits, before[:, :1], rtol=1e-5, atol=1e-5)
    assert model.lm_head._weight_t is not None  # the one-token pass read the copies
    assert use_small_rows_linears(tiny_model(tok).to(torch.bfloat16)) == 0


def test_loaded_models_swap(tiny_target):
    assert all(type(m) is SmallRowsLinear for m in tiny_target.model.modules() if isinstance(m, torch.nn.Linear))
