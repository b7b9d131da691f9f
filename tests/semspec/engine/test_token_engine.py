"""semspec.engine.token_engine on a tiny random model: one vLLM engine for the module (it starts in
seconds), compared with transformers' own generate on the same weights."""

from __future__ import annotations

import dataclasses
import gc
import math
from concurrent.futures import wait

import pytest

from semspec.answers import final_answer, split_reasoning
from semspec.doom import DoomRule, DoomRuleError, DoomWatch, stop_at
from semspec.repetition import find_loop, line_break_ids, loop_end
from tests.tiny_models import aborting_source
from semspec.types import Cancelled, GenerationConfig, Request
from semspec.engine.token_engine import VLLMEngine
from tests.conftest import require_vllm

PROMPTS = ["What is 2+2?", "Name three colours.", [{"role": "user", "content": "Count to five."}],
           "Tell me a story about a cat.", "Why is the sky blue?"]
GREEDY = GenerationConfig(method="ar", max_new_tokens=40)
SAMPLED = GenerationConfig(method="ar", max_new_tokens=40, temperature=1.0, top_p=0.95, seed=11)


@pytest.fixture(scope="module")
def engine(tiny_vllm_dir, tiny_cache):
    require_vllm()
    eng = VLLMEngine.load(str(tiny_vllm_dir), device="cpu", cache_dir=tiny_cache, dtype="float32", batch_size=8,
                          kv_cache_gb=0.25)
    yield eng
    del eng
    gc.collect()


def _results(engine, prompts, config, batch_size=8):
    return {d.key: d for d in engine.generate_many(prompts, config, batch_size=batch_size)}


def test_greedy_text_is_transformers_own_and_cut_into_steps(engine, tiny_vllm_greedy):
    """float32 greedy: vLLM writes the tokens transformers' generate writes from the same
    weights, and the step log cuts them at the step rule."""
    config = GenerationConfig(method="ar", max_new_tokens=40, step_delimiter=" ", max_step_tokens=8)
    got = _results(engine, PROMPTS, config)
    for key, prompt in enumerate(PROMPTS):
        mine = got[key].result
        text, finish, tokens = tiny_vllm_greedy(prompt, 40)
        assert (mine.text, mine.finish_reason, mine.counters.generated_tokens) == (text, finish, tokens)
        assert "".join(s.text for s in mine.steps) == mine.text and len(mine.steps) > 1
        assert all(s.target_tokens <= 8 for s in mine.steps)
        assert {s.author for s in mine.steps} == {"target"} and {s.decision for s in mine.steps} == {"target_only"}


def test_a_seed_reproduces_a_sample_alone_or_in_a_batch(engine):
    batched = _results(engine, [Request(p, SAMPLED) for p in PROMPTS], None)
    alone = engine.generate(PROMPTS[2], SAMPLED)
    assert alone.text == batched[2].result.text
    reseeded = engine.generate(PROMPTS[2], GenerationConfig(**{**SAMPLED.__dict__, "seed": 12}))
    assert reseeded.text != alone.text
    assert engine.generate(PROMPTS[2], GREEDY).text != alone.text


def test_a_job_that_asks_for_speed_over_reruns_sends_vllm_no_seed(engine, monkeypatch):
    """reproducible=False: sampled requests carry no seed (on CUDA vLLM then keeps FlashInfer's
    sampling kernels); the default carries the sample's."""
    import dataclasses

    seeds = []
    add = engine.llm.add_request
    monkeypatch.setattr(engine.llm, "add_request", lambda rid, prompt, params: (seeds.append(params.seed),
                                                                                 add(rid, prompt, params))[1])
    _results(engine, PROMPTS[:1], SAMPLED)
    _results(engine, PROMPTS[:1], dataclasses.replace(SAMPLED, reproducible=False))
    assert seeds == [SAMPLED.seed, None]


def record_ids(engine, monkeypatch) -> list:
    """Have every result carry the ids vLLM generated for it (``result.ids``, its EOS too) and
    record the repetition detection each request was sent with (the list returned)."""
    real_result, real_add, sent = engine._result, engine.llm.add_request, []

    def result(run, output, doomed=False):
        res = real_result(run, output, doomed)
        res.ids = list(run.ids)
        return res

    monkeypatch.setattr(engine, "_result", result)
    monkeypatch.setattr(engine.llm, "add_request", lambda rid, prompt, params: (
        sent.append(params.repetition_detection), real_add(rid, prompt, params))[1])
    return sent


def test_a_loop_ends_its_request_cut_after_its_first_copy(engine, monkeypatch):
    """stop_loops: vLLM ends a request at the token semspec.repetition's rule fires on (the
    tiny random model falls into loops, greedy), the result cut after the loop's first copy:
    text, steps and answer of the kept ids, the tokens generated past the cut counted as
    cut_tokens. A request that does not loop, and every request without stop_loops (vLLM
    sent no repetition detection), ends as it always did."""
    config = GenerationConfig(method="ar", max_new_tokens=200, step_delimiter=" ", max_step_tokens=8)
    sent = record_ids(engine, monkeypatch)
    off = _results(engine, PROMPTS, config)
    assert sent == [None] * len(PROMPTS)
    on = _results(engine, PROMPTS, dataclasses.replace(config, stop_loops=True))
    assert all(d is not None for d in sent[len(PROMPTS):])
    breaks, looped = line_break_ids(engine.tokenizer), 0
    for key in range(len(PROMPTS)):
        full, cut_short = off[key].result, on[key].result
        assert full.finish_reason in ("eos", "length") and full.counters.cut_tokens == 0
        ids = full.ids[:-1] if full.finish_reason == "eos" else full.ids
        end = loop_end(ids)
        if end is None:
            assert (cut_short.text, cut_short.finish_reason, cut_short.counters.generated_tokens,
                    cut_short.counters.cut_tokens) == (full.text, full.finish_reason, full.counters.generated_tokens, 0)
            continue
        looped += 1
        cut = find_loop(ids, line_breaks=breaks)
        assert cut_short.finish_reason == "repetition" and cut_short.ids == ids[:end]
        assert cut_short.text == engine.tokenizer.decode(ids[:cut], skip_special_tokens=True)
        assert full.text.startswith(cut_short.text) and len(cut_short.text) < len(full.text)
        c = cut_short.counters
        assert (c.generated_tokens, c.cut_tokens, c.target_forward_passes) == (cut, end - cut, end)
        assert sum(s.target_tokens for s in cut_short.steps) == cut
        assert "".join(s.text for s in cut_short.steps) == engine.tokenizer.decode(ids[:cut])
        assert (cut_short.reasoning, cut_short.content) == split_reasoning(cut_short.text, engine.think_end_marker)
        assert cut_short.final_answer == final_answer(cut_short.text, engine.think_end_marker)
    assert looped >= 2


def _doom_runs(engine, monkeypatch, rule, config):
    """``config``'s results on PROMPTS with ``rule`` on the engine, and the per-token signals
    the rule read, by request key (none for a request the rule did not watch)."""
    read: dict[int, list[float]] = {}
    real_add, real_watch = VLLMEngine._add, DoomWatch.add

    def add(self, key, prompt, cfg, running):
        real_add(self, key, prompt, cfg, running)
        watch = next(r.doom for r in running.values() if r.key == key)
        if watch is not None:
            watch.read = read[key] = []

    def watching(watch, value):
        watch.read.append(value)
        return real_watch(watch, value)

    monkeypatch.setattr(engine, "doom", rule)
    monkeypatch.setattr(VLLMEngine, "_add", add)
    monkeypatch.setattr(DoomWatch, "add", watching)
    results = _results(engine, [Request(p, dataclasses.replace(config, seed=config.seed + i))
                                for i, p in enumerate(PROMPTS)], None)
    monkeypatch.undo()
    return results, read


def test_the_doom_rule_stops_a_sampled_request_at_the_token_it_fires_on(engine, monkeypatch):
    """stop_doomed with a rule on the engine: a sampled request asks vLLM for the
    log-probabilities the rule reads (which changes no token: a rule that never fires leaves
    every sample as it was) and ends at the token where the rule, on those signals, fires:
    finish reason "doomed", its text what came before. Greedy requests and requests without
    stop_doomed are not looked at."""
    config = dataclasses.replace(SAMPLED, max_new_tokens=60, stop_doomed=True)
    plain = _results(engine, [Request(p, dataclasses.replace(config, seed=config.seed + i, stop_doomed=False))
                              for i, p in enumerate(PROMPTS)], None)
    never = DoomRule("confidence", window=4, min_tokens=8, threshold=-math.inf, recall=0.95, target="t")
    unchanged, signals = _doom_runs(engine, monkeypatch, never, config)
    assert [unchanged[k].result.text for k in plain] == [plain[k].result.text for k in plain]
    assert sorted(signals) == sorted(plain) and all(len(s) >= 8 for s in signals.values())
    # a threshold that fires on some of these samples and not on others
    means = sorted(min(sum(s[i - 4:i]) / 4 for i in range(8, len(s) + 1)) for s in signals.values())
    rule = DoomRule("confidence", window=4, min_tokens=8, threshold=means[len(means) // 2], recall=0.95, target="t")
    expected = {key: stop_at(rule, s) for key, s in signals.items()}
    assert None in expected.values() and set(expected.values()) != {None}
    stopped, _ = _doom_runs(engine, monkeypatch, rule, config)
    for key in plain:
        full, got = plain[key].result, stopped[key].result
        if expected[key] is None:
            assert (got.text, got.finish_reason) == (full.text, full.finish_reason)
            continue
        assert got.finish_reason == "doomed" and got.counters.generated_tokens == expected[key]
        assert full.text.startswith(got.text) and len(got.text) < len(full.text)
    # a length rule (an infinite threshold) asks vLLM for no log-probabilities: it counts tokens
    cap = DoomRule("logprob", window=4, min_tokens=8, threshold=math.inf, recall=0.95, target="t")
    capped, read = _doom_runs(engine, monkeypatch, cap, config)
    assert set(read) == set(plain) and all(set(v) == {0.0} for v in read.values())
    for key in plain:
        full, got = plain[key].result, capped[key].result
        if full.counters.generated_tokens < 8:
            assert got.text == full.text
        else:
            assert got.finish_reason == "doomed" and got.counters.generated_tokens == 8
    _, read = _doom_runs(engine, monkeypatch, rule, dataclasses.replace(config, temperature=0.0))
    assert read == {}
    _, read = _doom_runs(engine, monkeypatch, rule, dataclasses.replace(config, stop_doomed=False))
    assert read == {}


def test_an_engine_refuses_a_doom_rule_of_another_target_before_vllm_starts(tiny_vllm_dir, tiny_cache, tmp_path):
    require_vllm()
    path = DoomRule("logprob", 8, 32, -1.0, 0.95, "other@sha256:" + "0" * 64).save(tmp_path / "rule.json")
    with pytest.raises(DoomRuleError, match="calibrated on other@sha256"):
        VLLMEngine.load(str(tiny_vllm_dir), device="cpu", cache_dir=tiny_cache, dtype="float32", doom_rule=path)


def test_results_have_the_service_shape(engine):
    r = engine.generate(PROMPTS[0], GenerationConfig(method="ar", max_new_tokens=7))
    c = r.counters
    assert r.finish_reason == "length" and c.generated_tokens == 7 and c.target_forward_passes == 7
    assert c.prompt_tokens > 0 and c.draft_forward_passes == c.drafted_tokens == c.steps_drafted == 0
    assert set(c.phase_seconds) == {"prefill", "target_write"} and r.wall_seconds >= sum(c.phase_seconds.values())
    assert "".join(s.text for s in r.steps).replace(" ", "") == r.text.replace(" ", "")
    assert sum(s.target_tokens for s in r.steps) == 7 and all(s.seconds >= 0 for s in r.steps)
    assert r.models == engine.identities and r.models["engine"].startswith("vllm ")


def test_a_bad_prompt_fails_alone(engine):
    long = "word " * 600  # the tiny model's context is 512 tokens
    got = _results(engine, ["", long, PROMPTS[0]], GREEDY)
    assert "empty prompt" in str(got[0].error)
    assert "does not fit the target's context" in str(got[1].error)
    assert got[2].error is None and got[2].result.counters.generated_tokens > 0


def test_methods_it_does_not_serve_are_refused_with_the_way_out(engine):
    assert engine.method_problem("ar") is None
    problem = engine.method_problem("semspec")
    assert "step-level engines" in problem
    (done,) = engine.generate_many(["hi"], GenerationConfig(method="semspec"))
    assert done.result is None and "step-level engines" in str(done.error)


def test_stopping_early_aborts_what_is_in_flight(engine):
    stream = engine.generate_many(PROMPTS, GenerationConfig(method="ar", max_new_tokens=200), batch_size=4)
    first = next(stream)
    assert first.result is not None
    stream.close()
    assert not engine.llm.has_unfinished_requests()


def test_an_abort_ends_its_request_at_once_and_leaves_the_others_alone(engine):
    """An Abort from the source (a cancelled job) aborts that request in vLLM, even in a full
    batch; the next prompt takes its slot, and the others decode as if alone."""
    config = GenerationConfig(method="ar", max_new_tokens=100)
    reqs = [Request(p, config, key=i) for i, p in enumerate(PROMPTS[:3])]

    done = list(engine.generate_many(aborting_source(reqs), batch_size=2))
    assert done[0].key == 0 and isinstance(done[0].error, Cancelled) and done[0].result is None
    assert done[0].error.generated_tokens >= 1  # one step ran: spent, though nothing keeps it
    assert not engine.llm.has_unfinished_requests()
    alone = _results(engine, reqs[1:], None)
    assert {d.key: d.result.text for d in done[1:]} == {k: d.result.text for k, d in alone.items()}


def test_the_worker_batch_loop_feeds_it_as_slots_free(engine):
    """semjobs.worker.batching hands items over one by one from other threads (a live source that
    says None while nothing is new); every future settles with its own result."""
    from semjobs.worker.batching import BatchLoop

    loop = BatchLoop(engine, batch_size=2)
    futures = []
    for prompt in PROMPTS:
        while not loop.try_reserve():
            loop.wait(loop.version, 0.05)
        futures.append(loop.submit(prompt, GREEDY))
    done, _ = wait(futures, timeout=120)
    assert len(done) == len(PROMPTS)
    alone = _results(engine, PROMPTS, GREEDY)
    assert [f.result().text for f in futures] == [alone[i].result.text for i in range(len(PROMPTS))]


POISON = "a line whose chat template throws"


@pytest.fixture
def poisoned_rendering(monkeypatch):
    """Rendering POISON raises a TypeError (not the ValueError of a bad prompt), as a template
    or tokenizer that chokes on one line's contents would."""
    from semspec.engine import token_engine

    real = token_engine.prompt_ids

    def prompt_ids(tokenizer, messages, *args):
        if messages == POISON:
            raise TypeError("the template choked")
        return real(tokenizer, messages, *args)

    monkeypatch.setattr(token_engine, "prompt_ids", prompt_ids)


def test_a_request_that_raises_anything_fails_alone_in_a_batch_of_other_jobs(engine, poisoned_rendering):
    """A poisoned line fails its own future; the other jobs' items, handed to the same batch
    before and after it, decode as if it were not there."""
    from semjobs.worker.batching import BatchLoop

    jobs = [(PROMPTS[0], GREEDY), (POISON, GREEDY), (PROMPTS[1], SAMPLED), (PROMPTS[3], GREEDY)]
    loop = BatchLoop(engine, batch_size=4)
    futures = []
    for prompt, config in jobs:
        while not loop.try_reserve():
            loop.wait(loop.version, 0.05)
        futures.append(loop.submit(prompt, config))
    done, _ = wait(futures, timeout=120)
    assert len(done) == len(jobs)
    assert isinstance(futures[1].exception(), TypeError)
    for (prompt, config), future in zip(jobs, futures):
        if future is not futures[1]:
            assert future.result().text == _results(engine, [prompt], config)[0].result.text


def test_weights_load_from_safetensors_only(tiny_vllm_dir, tmp_path):
    """A model whose weights are a pickle (pytorch_model.bin: code that runs as it loads) is
    refused, not loaded; in a process of its own, which a failed vLLM start may leave broken."""
    import shutil
    import subprocess
    import sys

    from safetensors.torch import load_file
    import torch

    pickled = tmp_path / "pickled"
    shutil.copytree(tiny_vllm_dir, pickled, ignore=shutil.ignore_patterns("*.safetensors*"))
    torch.save(load_file(tiny_vllm_dir / "model.safetensors"), pickled / "pytorch_model.bin")
    load = ("from semspec.engine.token_engine import VLLMEngine\n"
            f"VLLMEngine.load({str(pickled)!r}, device='cpu', cache_dir={str(tmp_path / 'cache')!r}, "
            "dtype='float32', batch_size=1, kv_cache_gb=0.05)\nprint('LOADED')")
    done = subprocess.run([sys.executable, "-c", f"if __name__ == '__main__':\n    exec({load!r})"],
                          capture_output=True, text=True, timeout=300)
    assert "LOADED" not in done.stdout and done.returncode != 0
    assert "Cannot find any model weights" in done.stderr


@pytest.fixture(scope="module")
def tight_engine(engine, tiny_vllm_dir, tiny_cache):
    """The same model with a KV budget of 768 tokens: less than a third of what the batch
    below needs at once (vLLM wants room for one whole context, 512 tokens, at least)."""
    eng = VLLMEngine.load(str(tiny_vllm_dir), device="cpu", cache_dir=tiny_cache, dtype="float32", batch_size=8,
                          kv_cache_gb=768 * 2048 / 2**30)
    yield eng
    del eng
    gc.collect()


def test_a_kv_budget_smaller_than_the_batch_needs_only_slows_it(engine, tight_engine):
    """Memory is a budget: sequences that do not fit wait (vLLM preempts and recomputes
    them); every one completes, token for token what a roomy cache writes."""
    config = GenerationConfig(method="ar", max_new_tokens=300)
    prompts = [f"Story number {i}:" for i in range(8)]
    cache = tight_engine.llm.vllm_config.cache_config
    assert cache.num_gpu_blocks * cache.block_size < 8 * 300 / 2  # not even half of the batch fits
    roomy, tight = _results(engine, prompts, config), _results(tight_engine, prompts, config)
    assert all(tight[i].result.counters.generated_tokens == 300 for i in range(8))
    assert [tight[i].result.text for i in range(8)] == [roomy[i].result.text for i in range(8)]
