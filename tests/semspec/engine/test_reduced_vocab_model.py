"""A draft with a reduced vocabulary on vLLM's CPU build (semspec.engine.reduced_vocab_model):
a tiny random model of each family it serves, with a ``semspec_vocab.json`` listing a few of its
tokens, served as the step engines serve their draft (``ModelFiles.serve``, storing a layer's
states as for a probe). Every token it writes, greedy and sampled, lies in the reduced
vocabulary, and its greedy tokens are transformers' argmax over it (``semspec.models.loaded``,
its ``ReducedHead``); the same model without the file runs vLLM's own class and writes tokens
outside it. Each family's engine is module-scoped: a start takes seconds."""

from __future__ import annotations

import gc
import itertools
import json
import shutil

import pytest
import torch

from semspec.models.reduced_vocab import VOCAB_SUBSET_FILE
from tests.conftest import require_vllm, tiny_vllm_model

pytestmark = pytest.mark.slow

TEXTS = ["What is 2+2?", "Name three colours.", "Tell me a story about a cat.", "Why is the sky blue?"]
NEW_TOKENS = 12
# a seventh of the tiny vocabulary (320 ids): the model left to itself leaves it almost every token
SUBSET_SIZE = 48
_request_ids = itertools.count()


def sampling(**kw):
    from vllm import SamplingParams

    return SamplingParams(max_tokens=NEW_TOKENS, ignore_eos=True, **kw)


def subset_of(vocab_size: int) -> list[int]:
    return sorted(torch.randperm(vocab_size, generator=torch.Generator().manual_seed(5))[:SUBSET_SIZE].tolist())


def serve(model_dir, cache):
    from semspec.engine.step_engine import ModelFiles
    from semspec.engine.token_engine import configure_process

    configure_process()  # in this process, as VLLMStepEngine.load starts its engines
    return ModelFiles.read(str(model_dir), cache).serve(-1, 0.1, device="cpu", dtype="float32", batch_size=4,
                                                        compile=False, seed=0)


def prompts(served) -> list[list[int]]:
    return [served.facts.tokenizer(text)["input_ids"] for text in TEXTS]


def decode(served, params) -> list[list[int]]:
    """Each prompt's tokens, all in flight together."""
    llm = served.llm
    order = {}
    for i, prompt in enumerate(prompts(served)):
        request_id = str(next(_request_ids))  # unique over the engine's life
        order[request_id] = i
        llm.add_request(request_id, llm.renderer.render_cmpl([{"prompt_token_ids": prompt}])[0], params)
    written = {}
    while llm.has_unfinished_requests():
        for out in llm.step():
            if out.finished:
                written[order[out.request_id]] = list(out.outputs[0].token_ids)
    return [written[i] for i in range(len(order))]


@pytest.fixture(scope="module", params=["llama", "qwen2", "qwen3"])
def reduced(request, tiny_vllm_dir, tmp_path_factory, tiny_cache):
    """(the model directory with a reduced vocabulary, its token ids, its draft engine)."""
    require_vllm()
    source = tiny_vllm_dir if request.param == "llama" else tiny_vllm_model(tmp_path_factory, request.param)
    model_dir = tmp_path_factory.mktemp(f"reduced-{request.param}") / "model"
    shutil.copytree(source, model_dir)
    ids = subset_of(json.loads((model_dir / "config.json").read_text())["vocab_size"])
    (model_dir / VOCAB_SUBSET_FILE).write_text(json.dumps({"token_ids": ids}))
    served = serve(model_dir, tiny_cache)
    yield model_dir, set(ids), served
    del served
    gc.collect()  # gone before the next engine starts


def test_every_token_the_draft_writes_lies_in_its_vocabulary(reduced):
    _, ids, served = reduced
    assert served.llm.model_config.architectures[0].startswith("SemspecReducedVocab")
    for params in (sampling(temperature=0.0), sampling(temperature=1.0, seed=3),
                   sampling(temperature=0.6, top_p=0.95, seed=4)):
        written = decode(served, params)
        assert all(len(tokens) == NEW_TOKENS for tokens in written)
        assert set(itertools.chain(*written)) <= ids, params


def test_its_greedy_tokens_are_transformers_argmax_over_its_vocabulary(reduced, tiny_cache):
    from semspec.models.loaded import load_model

    model_dir, _, served = reduced
    reference = load_model(str(model_dir), device="cpu", cache_dir=tiny_cache, dtype=torch.float32)
    assert reference.vocab_ids is not None
    expected = []
    for prompt in prompts(served):
        tokens = list(prompt)
        with torch.no_grad():
            for _ in range(NEW_TOKENS):
                tokens.append(int(reference.next_token_logits(torch.tensor([tokens]), None)[0].argmax()))
        expected.append(tokens[len(prompt):])
    assert decode(served, sampling(temperature=0.0)) == expected


def test_a_model_without_the_file_runs_vllms_own_class_over_its_whole_vocabulary(tiny_vllm_dir, tiny_cache):
    require_vllm()
    served = serve(tiny_vllm_dir, tiny_cache)
    try:
        assert served.llm.model_config.architectures == ["LlamaForCausalLM"]
        ids = set(subset_of(served.llm.model_config.get_vocab_size()))
        assert not set(itertools.chain(*decode(served, sampling(temperature=0.0)))) <= ids
    finally:
        del served
        gc.collect()
