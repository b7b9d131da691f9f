"""token_sd decoding on vLLM's CPU build with the drafts users publish
(semspec.engine.speculation): a model of the target's tokenizer (``draft_model``: here the tiny
target drafting for itself, as it is and with its embedding padded to more rows, which vLLM
drafts through its mapping of the draft's ids onto the target's) and an EAGLE-3 head, plain
(its kind read from ``architectures``) and in the speculators format (vLLM reads that layout
itself), each through ``VLLMEngine.load`` and lossless against the target's own greedy text
(what ar writes). One engine at a time, module-scoped: vLLM keeps per-process state, and each
start takes seconds.

Not decoded here: ``mtp`` (the families with MTP layers -- DeepSeek-V3, Qwen3-Next, GLM-4.5 --
are large mixture-of-experts models; no tiny one was tried on this CPU build) and ``suffix``
(its package, arctic_inference, is not installed); test_speculation.py builds and refuses
their configs.
"""

from __future__ import annotations

import dataclasses
import gc
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from semspec.engine.token_engine import VLLMEngine
from semspec.repetition import find_loop, line_break_ids, loop_end
from tests.tiny_models import write_eagle3_head
from tests.conftest import ROOT, require_vllm
from tests.semspec.engine.test_speculation import drafts  # noqa: F401 -- a fixture used here
from tests.semspec.engine.test_speculation import GREEDY, PROMPTS
from tests.semspec.engine.test_token_engine import record_ids


def padded_copy(model_dir: Path, dest: Path, rows: int) -> Path:
    """The model in ``model_dir`` with its embedding and LM head padded to ``rows`` (as
    Qwen2.5-32B's are against 1.5B's, one tokenizer for both)."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
    model.resize_token_embeddings(rows)
    model.save_pretrained(dest)
    AutoTokenizer.from_pretrained(model_dir).save_pretrained(dest)
    return dest


@pytest.fixture(scope="module", params=["draft_model", "padded", "plain", "speculators"])
def drafting(request, tiny_vllm_dir, tiny_cache, tmp_path_factory):
    """(an engine for token_sd, the draft spec it was loaded with, the vLLM method it names)."""
    require_vllm()
    if request.param == "draft_model":
        draft = f"draft_model:{tiny_vllm_dir}"
    elif request.param == "padded":
        draft = str(padded_copy(tiny_vllm_dir, tmp_path_factory.mktemp("padded") / "model", 384))
    else:  # an EAGLE-3 head in either layout
        draft = str(write_eagle3_head(tmp_path_factory.mktemp(request.param) / "head", tiny_vllm_dir,
                                      layout=request.param))
    eng = VLLMEngine.load(str(tiny_vllm_dir), draft=draft, device="cpu", cache_dir=tiny_cache, dtype="float32",
                          batch_size=8, kv_cache_gb=0.25, speculative_tokens=3)
    yield eng, draft, "eagle3" if request.param in ("plain", "speculators") else "draft_model"
    del eng
    gc.collect()


def test_greedy_text_is_the_targets_own(drafting, tiny_vllm_greedy):
    """Lossless: float32 greedy token_sd writes what the target alone writes, every drafted
    token costing a draft pass; the target drafting for itself keeps nearly all it drafts (a
    drafter fed wrong positions, cache or ids would keep few), the random head all but none."""
    engine, draft, method = drafting
    done = {d.key: d for d in engine.generate_many(PROMPTS, GREEDY, batch_size=1)}  # alone: a CPU drafts
    drafted = accepted = 0
    for key, prompt in enumerate(PROMPTS):
        mine = done[key].result
        text, finish, _ = tiny_vllm_greedy(prompt, GREEDY.max_new_tokens)
        assert (mine.text, mine.finish_reason) == (text, finish)
        c = mine.counters
        assert 0 < c.drafted_tokens == c.draft_forward_passes and c.accepted_tokens <= c.drafted_tokens
        drafted, accepted = drafted + c.drafted_tokens, accepted + c.accepted_tokens
        assert mine.models["draft"] == str(engine.speculation.draft)
    assert (engine.speculation.method, engine.speculation.draft.name) == (method, draft)
    if method == "draft_model":
        assert accepted / drafted > 0.9


def test_a_loop_ends_at_the_token_the_rule_fires_on_drafted_or_not(drafting, monkeypatch):
    """stop_loops with drafts: vLLM checks each token a verification keeps, so the request ends
    at the token the rule fires on (drafted tokens after it dropped), cut as ar's is; the step
    log places only the verifications before the cut."""
    engine, _, _ = drafting
    config = dataclasses.replace(GREEDY, max_new_tokens=200)
    record_ids(engine, monkeypatch)
    off = {d.key: d.result for d in engine.generate_many(PROMPTS, config, batch_size=1)}
    on = {d.key: d.result for d in engine.generate_many(PROMPTS, dataclasses.replace(config, stop_loops=True),
                                                         batch_size=1)}
    looped = 0
    for key in range(len(PROMPTS)):
        ids = off[key].ids[:-1] if off[key].finish_reason == "eos" else off[key].ids
        end = loop_end(ids)
        if end is None:
            assert (on[key].text, on[key].finish_reason) == (off[key].text, off[key].finish_reason)
            continue
        looped += 1
        cut, c = find_loop(ids, line_breaks=line_break_ids(engine.tokenizer)), on[key].counters
        assert on[key].finish_reason == "repetition" and on[key].ids == ids[:end]
        assert (c.generated_tokens, c.cut_tokens) == (cut, end - cut)
        assert on[key].text == engine.tokenizer.decode(ids[:cut], skip_special_tokens=True)
        assert sum(s.drafted_tokens for s in on[key].steps) <= c.drafted_tokens
    assert looped >= 2


def test_vllm_takes_every_model_drafts_config_for_cuda(drafts, tiny_vllm_dir, tiny_cache):  # noqa: F811
    """vLLM's own configuration classes, for a CUDA engine (tests/semspec/engine/vllm_cuda_config.py,
    no GPU), take the speculative config of every kind that names a model, those not decoded
    above among them (an EAGLE-1 head, an EAGLE-3 one named LlamaForCausalLMEagle3), and read
    the method this module names."""
    from semspec.engine.speculation import speculative_config
    from semspec.engine.token_engine import engine_arguments

    require_vllm()
    cases = {"small": "draft_model", "padded": "draft_model", "head1": "eagle", "head3": "eagle3",
             "head3_suffixed": "eagle3", "speculators": "eagle3"}
    args = [engine_arguments(tiny_vllm_dir, device="cuda", dtype="bfloat16", speculative_config=speculative_config(
        str(drafts[name]), str(tiny_vllm_dir), 3, tiny_vllm_dir, "0" * 64, tiny_cache)[0]) for name in cases]
    done = subprocess.run([sys.executable, "-m", "tests.semspec.engine.vllm_cuda_config"], cwd=ROOT,
                          env={**os.environ, "VLLM_LOGGING_LEVEL": "ERROR", "PYTHONPATH": str(ROOT)},
                          input=json.dumps(args), capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    configs = json.loads(done.stdout.strip().splitlines()[-1])
    assert [(c["device_type"], c["speculative_method"], c["num_speculative_tokens"]) for c in configs] == \
        [("cuda", method, 3) for method in cases.values()]
