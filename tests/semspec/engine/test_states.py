"""The probe layer's hidden states out of vLLM (semspec.engine.states), against transformers'."""

from __future__ import annotations

import gc

import pytest
import torch

from tests.conftest import require_vllm

LAYER = 1  # of the tiny model's 2: a middle layer, returned as is
PROMPT = list(range(5, 75))  # 70 tokens: two 32-token blocks and a part


@pytest.fixture(scope="module")
def states_engine(tiny_vllm_dir):
    require_vllm()
    from vllm import EngineArgs

    from semspec.engine.token_engine import configure_process, engine_arguments, start_engine

    configure_process()
    llm = start_engine(EngineArgs(**engine_arguments(tiny_vllm_dir, "cpu", "float32", 4, 0.1, states_layer=LAYER)))
    yield llm
    del llm
    gc.collect()  # gone before the next module's engine starts


def finished(llm, ids, states_from=None, max_tokens=1, request_id="0"):
    from vllm import SamplingParams

    from semspec.engine.states import STATES_FROM

    extra = {"kv_transfer_params": {STATES_FROM: states_from}} if states_from is not None else None
    llm.add_request(request_id, llm.renderer.render_cmpl([{"prompt_token_ids": ids}])[0],
                    SamplingParams(temperature=0, max_tokens=max_tokens, detokenize=False, extra_args=extra))
    while True:
        for out in llm.step():
            if out.finished:
                return out


def reference(model_dir, ids):
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
    with torch.no_grad():
        return model(torch.tensor([ids]), output_hidden_states=True).hidden_states


def test_a_request_gets_the_states_of_the_positions_it_asks_for_and_cached_ones_too(states_engine, tiny_vllm_dir):
    from semspec.engine.states import STATES

    out = finished(states_engine, PROMPT, states_from=10, request_id="a")
    rows = out.kv_transfer_params[STATES]
    ref = reference(tiny_vllm_dir, PROMPT)[LAYER][0]
    assert rows.shape == (len(PROMPT) - 10, ref.shape[1])
    torch.testing.assert_close(rows, ref[10:], atol=1e-4, rtol=1e-4)
    # the same prefix again, one token longer: its first two blocks come from the prefix cache,
    # and their states with them
    longer = PROMPT + [7]
    out = finished(states_engine, longer, states_from=3, request_id="b")
    assert out.num_cached_tokens >= 64
    torch.testing.assert_close(out.kv_transfer_params[STATES], reference(tiny_vllm_dir, longer)[LAYER][0][3:],
                               atol=1e-4, rtol=1e-4)


def test_generated_tokens_have_states_but_the_last_one_never_fed(states_engine, tiny_vllm_dir):
    from semspec.engine.states import STATES

    out = finished(states_engine, PROMPT[:20], states_from=15, max_tokens=6, request_id="c")
    full = PROMPT[:20] + list(out.outputs[0].token_ids)
    rows = out.kv_transfer_params[STATES]
    assert rows.shape[0] == len(full) - 1 - 15
    torch.testing.assert_close(rows, reference(tiny_vllm_dir, full)[LAYER][0][15:-1], atol=1e-4, rtol=1e-4)


def test_requests_that_do_not_ask_get_no_states(states_engine):
    out = finished(states_engine, PROMPT[:12], request_id="d")
    assert not (out.kv_transfer_params or {}).get("states")


def test_final_norm_is_the_models_own(tiny_vllm_dir):
    from transformers import AutoModelForCausalLM

    from semspec.engine.states import final_norm

    model = AutoModelForCausalLM.from_pretrained(tiny_vllm_dir, dtype=torch.float32)
    x = torch.randn(5, model.config.hidden_size)
    with torch.no_grad():
        want = model.model.norm(x)
    torch.testing.assert_close(final_norm(x, model.model.norm.weight, model.config.rms_norm_eps), want)
