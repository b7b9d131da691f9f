"""token_sd on vLLM's own speculative decoding (semspec.engine.speculation, semspec.engine.head_plugin):
the head exported for vLLM's eagle method, and ngram, on a tiny random model (one engine at
a time: vLLM's state is per process); the shipped head on SmolLM2 (real_model)."""

from __future__ import annotations

import gc
import json

import pytest
import torch

from semspec.components import EMBEDDED_HEAD
from semspec.types import NGRAM_DRAFT, GenerationConfig
from semspec.engine.token_engine import VLLMEngine
from semspec.engine.speculation import draft_problem
from tests.conftest import require_vllm

PROMPTS = ["What is 2+2?", "Name three colours.", [{"role": "user", "content": "Count to five."}],
           "Tell me a story about a cat.", "Why is the sky blue?"]
GREEDY = GenerationConfig(method="token_sd", max_new_tokens=40, draft_tokens=3, step_delimiter=" ", max_step_tokens=8)


@pytest.mark.slow
@pytest.mark.real_model
def test_the_shipped_head_drafts_smollm2_in_vllm(tmp_path_factory):
    """The shipped head, exported, keeps drafted tokens in vLLM as it does in the embedded
    engine (about 1.5 of 4 per verification there; a wrongly ported head keeps ~0). First in
    the module: no other engine may live beside it (vLLM's state is per process)."""
    require_vllm()
    eng = VLLMEngine.load(None, draft=EMBEDDED_HEAD, device="cpu", dtype="float32", batch_size=2, kv_cache_gb=0.5,
                          speculative_tokens=4)
    try:
        config = GenerationConfig(method="token_sd", max_new_tokens=64, draft_tokens=4)
        done = _results(eng, ["Natalia sold clips to 48 of her friends in April, and then she sold half as many "
                              "clips in May. How many clips did Natalia sell altogether in April and May?",
                              "A robe takes 2 bolts of blue fiber and half that much white fiber. How many "
                              "bolts in total does it take?"], config)
        c = [d.result.counters for d in done.values()]
        verifications = sum(x.target_forward_passes - 1 for x in c)
        assert sum(x.accepted_tokens for x in c) / verifications > 0.8
    finally:
        del eng
        gc.collect()


@pytest.fixture(scope="module")
def tiny_head_dir(tiny_vllm_dir, tmp_path_factory):
    """A head on the tiny target: its last layer, the state passed through, half the
    vocabulary (so the reduced LM head is exercised)."""
    from transformers import AutoModelForCausalLM

    from semspec.head import HeadModel, save_head, target_fingerprint

    target = AutoModelForCausalLM.from_pretrained(tiny_vllm_dir, dtype=torch.float32)
    torch.manual_seed(0)
    head = HeadModel(target, layers=1)
    with torch.no_grad():  # not the identity: the export's column order must matter
        head.fc.weight[:, 256:].normal_(0, 0.02)
        head.fc.bias.normal_(0, 0.02)
    vocab = torch.arange(0, target.config.vocab_size, 2)
    return save_head(head, vocab, {"target": target_fingerprint(target)}, tmp_path_factory.mktemp("head"))


@pytest.fixture(scope="module", params=["head", NGRAM_DRAFT])
def engine(request, tiny_vllm_dir, tiny_head_dir, tiny_cache):
    require_vllm()
    draft = str(tiny_head_dir) if request.param == "head" else NGRAM_DRAFT
    eng = VLLMEngine.load(str(tiny_vllm_dir), draft=draft, device="cpu", cache_dir=tiny_cache, dtype="float32",
                          batch_size=8, kv_cache_gb=0.25, speculative_tokens=3)
    yield eng
    del eng
    gc.collect()


def _results(engine, prompts, config, batch_size=8):
    return {d.key: d for d in engine.generate_many(prompts, config, batch_size=batch_size)}


def test_greedy_text_is_the_targets_own(engine, tiny_vllm_greedy):
    """Lossless: float32 greedy token_sd writes what the target alone writes (transformers'
    greedy generate on the same weights), and its counters add up over the step log."""
    got = _results(engine, PROMPTS, GREEDY)
    drafted = 0
    for key, prompt in enumerate(PROMPTS):
        mine = got[key].result
        text, finish, _ = tiny_vllm_greedy(prompt, GREEDY.max_new_tokens)
        assert (mine.text, mine.finish_reason) == (text, finish)
        c = mine.counters
        assert c.accepted_tokens <= c.drafted_tokens <= 3 * c.target_forward_passes
        if engine.speculation.method == "eagle":  # a head drafts at every step: each is placed
            assert c.drafted_tokens == sum(s.drafted_tokens for s in mine.steps)
            assert c.accepted_tokens == sum(s.accepted_tokens for s in mine.steps)
        assert c.target_forward_passes + c.accepted_tokens >= c.generated_tokens
        assert {s.decision for s in mine.steps} == {"token_verified"}
        drafted += c.drafted_tokens
    if engine.speculation.method == "eagle":
        assert drafted > 0 and engine.identities["draft"].startswith(str(engine.speculation.draft.name))


def test_sampled_requests_follow_their_seeds(engine):
    """Seeds select the draws: a rerun of a seeded sample writes the same text (on vLLM's CPU
    build only with semspec.engine.vllm_cpu_fixes: its drafted positions' temperatures were
    read from uninitialised memory), another seed another text."""
    sampled = GenerationConfig(**{**GREEDY.__dict__, "temperature": 1.0, "top_p": 0.95, "seed": 11})
    first = engine.generate(PROMPTS[2], sampled)
    assert engine.generate(PROMPTS[2], sampled).text == first.text
    reseeded = engine.generate(PROMPTS[2], GenerationConfig(**{**sampled.__dict__, "seed": 12}))
    assert first.text != reseeded.text and first.counters.generated_tokens > 0


def test_it_serves_token_sd_only_with_its_own_draft_count(engine):
    assert engine.method_problem("token_sd") is None
    assert "without" in engine.method_problem("ar")
    (done,) = engine.generate_many([PROMPTS[0]], GenerationConfig(**{**GREEDY.__dict__, "draft_tokens": 5}))
    assert done.error is not None and "drafts 3" in str(done.error)


def test_vllm_drafts_with_a_head_or_ngram_only(tiny_head_dir):
    assert draft_problem(None) is None and draft_problem(EMBEDDED_HEAD) is None
    assert draft_problem(NGRAM_DRAFT, "some/model") is None and draft_problem(str(tiny_head_dir), "some/model") is None
    assert "neither" in draft_problem("embedded:smollm2-135m-draft")
    assert "no draft is configured" in draft_problem(None, "some/model")


def test_the_export_reorders_the_fused_input_and_refuses_another_target(tiny_head_dir, tiny_vllm_dir, tmp_path):
    from safetensors.torch import load_file

    from semspec.head import HeadMismatchError
    from semspec.engine.head_plugin import ARCHITECTURE, export_head

    out = export_head(tiny_head_dir, tiny_vllm_dir, tmp_path / "export")
    mine, theirs = load_file(str(out / "model.safetensors")), load_file(str(tiny_head_dir / "head.safetensors"))
    # vLLM feeds (embedding, state); the head was trained on (state, embedding)
    assert torch.equal(mine["fc.weight"], torch.cat([theirs["fc.weight"][:, 256:], theirs["fc.weight"][:, :256]], 1))
    assert torch.equal(mine["vocab_ids"], theirs["vocab_ids"])
    config = json.loads((out / "config.json").read_text())
    assert config["architectures"] == [ARCHITECTURE] and config["num_hidden_layers"] == 1
    other = tmp_path / "other"
    other.mkdir()
    (other / "config.json").write_text(json.dumps({**config, "hidden_size": 512}))
    with pytest.raises(HeadMismatchError, match="hidden_size"):
        export_head(tiny_head_dir, other, tmp_path / "export2")
