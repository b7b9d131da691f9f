"""Continuous batching: results do not depend on the batch, slots are reused as sequences
finish, prompts are read lazily, one bad prompt fails alone."""

from __future__ import annotations

import pytest

from semspec.engine import Engine, Request
from semspec.prompts import PromptError
from semspec.models import encode_prompt
from semspec.probes import ProbePair
from semspec.testing import aborting_source
from semspec.types import Cancelled, GenerationConfig
from tests.semspec.test_engine import cfg as engine_cfg

PROMPTS = [
    "Natalia sold 48 clips in April and half as many in May. How many clips in total?",
    "Weng earns $12 an hour for babysitting. How much did she earn?",
    "What is 7 times 6?",
    "Hi",
    "Let's think step by step. First, compute the cost.",
    "How many clips did Natalia sell altogether in April and May?",
    "0 1 2 3 4 5 6 7 8 9",
    "Then add them up.",
]


def cfg(method, **kw):
    return engine_cfg(method, **{"max_new_tokens": 30, "max_step_tokens": 6, **kw})


def _requests(configs):
    # 16 items: each prompt twice, with budgets of their own so sequences end at different ticks
    return [Request(PROMPTS[i % len(PROMPTS)], c, key=i) for i, c in enumerate(configs)]


def _alone(engine, requests):
    return {r.key: engine.generate(r.prompt, r.config) for r in requests}


def _batched(engine, requests, batch_size, **kw):
    done = list(engine.generate_many(requests, batch_size=batch_size, **kw))
    assert all(d.error is None for d in done), [d.error for d in done]
    assert sorted(d.key for d in done) == sorted(r.key for r in requests)
    return {d.key: d.result for d in done}


def _same(a, b):
    assert a.keys() == b.keys()
    for k in a:
        assert a[k].text == b[k].text, k
        assert [(s.decision, s.target_tokens) for s in a[k].steps] == \
            [(s.decision, s.target_tokens) for s in b[k].steps], k
        assert a[k].counters.generated_tokens == b[k].counters.generated_tokens, k
        assert a[k].finish_reason == b[k].finish_reason, k


@pytest.fixture(scope="module")
def engines(tiny_target, tiny_draft):
    return {
        "plain": Engine(tiny_target, tiny_draft),
        "accept": Engine(tiny_target, tiny_draft, ProbePair.always_accept(64, 64)),
        "reject": Engine(tiny_target, tiny_draft, ProbePair.always_reject(64, 64)),
        # p_T/p_D = 0.625: above the default ratio floor, a coin of that weight
        "half": Engine(tiny_target, tiny_draft, ProbePair.constant(0.5, 0.8, 64, 64)),
    }


def test_greedy_ar_in_a_batch_of_16_equals_each_prompt_alone(engines):
    e = engines["plain"]
    reqs = _requests([cfg("ar", max_new_tokens=8 + 3 * i) for i in range(16)])
    alone = _alone(e, reqs)
    _same(_batched(e, reqs, 16), alone)
    _same(_batched(e, reqs, 5), alone)  # fewer slots than items: slots are reused


def test_greedy_token_sd_in_a_batch_equals_greedy_ar(engines):
    e = engines["plain"]
    ar = _batched(e, _requests([cfg("ar", max_new_tokens=10 + 2 * i) for i in range(16)]), 16)
    sd = _batched(e, _requests([cfg("token_sd", draft_tokens=3, max_new_tokens=10 + 2 * i) for i in range(16)]), 16)
    assert {k: r.text for k, r in sd.items()} == {k: r.text for k, r in ar.items()}
    assert sum(r.counters.drafted_tokens for r in sd.values()) > 0


@pytest.mark.parametrize("probes", ["accept", "reject", "half"])
def test_semspec_decisions_in_a_batch_equal_alone(engines, probes):
    e = engines[probes]
    # "half" accepts each step with probability 0.625 from the item's own coin, sampled text
    temperature = 0.9 if probes == "half" else 0.0
    reqs = _requests([cfg("semspec", temperature=temperature, seed=i, max_new_tokens=12 + 2 * i)
                      for i in range(16)])
    alone = _alone(e, reqs)
    batched = _batched(e, reqs, 8)
    _same(batched, alone)
    decisions = {s.decision for r in batched.values() for s in r.steps}
    assert {"accept": {"accepted"}, "reject": {"rejected"}, "half": {"accepted", "rejected"}}[probes] <= decisions


def test_every_method_mixed_in_one_batch_with_sampling(engines):
    e = engines["half"]
    methods = ["ar", "token_sd", "step_judge", "semspec"]
    reqs = _requests([cfg(methods[i % 4], temperature=0.8, top_p=0.9, seed=i, judge_threshold=5)
                      for i in range(12)])
    _same(_batched(e, reqs, 6), _alone(e, reqs))


def test_long_prompts_are_prefilled_in_chunks_with_the_same_result(engines):
    e = engines["plain"]
    long_prompt = " ".join(PROMPTS)  # well over the chunk of 16 tokens
    reqs = [Request(long_prompt, cfg("ar"), key="long"), Request("Hi", cfg("ar"), key="short")]
    chunked = _batched(e, reqs, 2, max_prefill_tokens=16)
    _same(chunked, _alone(e, reqs))
    assert chunked["long"].counters.target_forward_passes > chunked["short"].counters.target_forward_passes


def test_prompts_are_read_lazily_and_a_bad_one_fails_alone(engines):
    e = engines["plain"]
    taken = []

    def prompts():
        for i, p in enumerate(["Hi", "", "What is 7 times 6?", "Then add them up.", "Hi"]):
            taken.append(i)
            yield Request(p, cfg("ar", max_new_tokens=6 if i else 3), key=i)

    stream = e.generate_many(prompts(), batch_size=2)
    first = next(stream)
    # the empty prompt failed at admission, before anything ran, without taking a slot
    assert first.key == 1 and isinstance(first.error, PromptError) and first.result is None
    assert taken == [0, 1]
    rest = list(stream)
    assert [d.key for d in rest][0] == 0  # the shortest budget finishes first
    assert sorted(d.key for d in rest) == [0, 2, 3, 4] and all(d.result is not None for d in rest)


def test_an_abort_frees_its_slot_at_once_and_leaves_the_others_alone(engines):
    """An Abort from the source (a cancelled job) ends that sequence between ticks, even in
    a full batch; the next prompt takes its slot, and the others decode as if alone."""
    e = engines["plain"]
    reqs = [Request(PROMPTS[i], cfg("ar"), key=i) for i in range(3)]

    done = list(e.generate_many(aborting_source(reqs), batch_size=2))
    assert done[0].key == 0 and isinstance(done[0].error, Cancelled) and done[0].result is None
    assert sorted(d.key for d in done[1:]) == [1, 2]
    _same({d.key: d.result for d in done[1:]}, _alone(e, reqs[1:]))


def test_generate_is_the_one_prompt_case(engines):
    e = engines["plain"]
    r = e.generate(PROMPTS[0], cfg("ar"))
    (d,) = e.generate_many([PROMPTS[0]], cfg("ar"), batch_size=4)
    assert d.key == 0 and d.result.text == r.text
    assert set(r.counters.phase_seconds) == {"prefill", "target_write"}
    with pytest.raises(ValueError, match="batch_size"):
        list(e.generate_many([PROMPTS[0]], cfg("ar"), batch_size=0))


def test_verifications_wait_for_drafting_sequences_and_share_a_pass(engines):
    from semspec.scheduler import Scheduler

    e = engines["half"]
    reqs = _requests([cfg("semspec", temperature=0.9, seed=i, max_new_tokens=20) for i in range(8)])
    runs = {}
    for wait in (0, 32):
        sched = Scheduler(e, 8, max_verify_wait=wait)
        runs[wait] = ({d.key: d.result for d in sched.run(reqs, cfg("semspec"))}, sched.runners.target.passes)
    _same(runs[0][0], runs[32][0])  # the same decisions and text either way
    assert runs[32][1] < runs[0][1]  # fewer target passes when verifications wait
    # the pass counts say where the time went
    st = sched.stats
    assert st.target["passes"] == sched.runners.target.passes and st.draft["passes"] == sched.runners.draft.passes
    drafted = sum(r.counters.steps_drafted for r in runs[32][0].values())
    assert st.target["verify_rows"] == drafted and st.target["prefill_rows"] == 8 == st.draft["prefill_rows"]
    assert st.target["rows"] > st.target["passes"]  # passes were shared
    assert st.target["seconds"] > 0 and st.draft["tokens"] >= st.draft["rows"]


LONG = " ".join(PROMPTS[:3])  # well over MIN_SHARED_PREFIX tokens


def _prompt_len(engine, prompt):
    return len(encode_prompt(engine.target.tokenizer, prompt))


@pytest.mark.parametrize("method", ["ar", "token_sd", "semspec"])
def test_samples_of_one_prompt_are_prefilled_once_with_the_same_results(engines, method):
    from semspec.scheduler import Scheduler

    e = engines["half"]
    reqs = [Request(LONG, cfg(method, temperature=0.8, seed=s), key=s) for s in range(4)]
    sched = Scheduler(e, 4)
    shared = {d.key: d.result for d in sched.run(reqs, cfg(method))}
    _same(shared, _alone(e, reqs))  # copied caches decode exactly as prefilled ones
    assert len({r.text for r in shared.values()}) > 1  # four seeds, not four copies
    n = _prompt_len(e, LONG)
    st = sched.stats
    unshared = Scheduler(e, 4, share_prefixes=False)
    _same({d.key: d.result for d in unshared.run(reqs, cfg(method))}, shared)
    assert unshared.stats.target["prefill_tokens"] == 4 * n and "shared_prefix_tokens" not in unshared.stats.target
    # the first sample feeds the prompt, the three others only its last token
    assert st.target["prefill_tokens"] == n + 3 and st.target["shared_prefix_tokens"] == 3 * (n - 1)
    if method != "ar":  # the draft's prompt too
        assert st.draft["shared_prefix_tokens"] == 3 * (n - 1)


def test_a_common_prefix_is_shared_and_the_rest_fed(engines):
    from semspec.scheduler import MIN_SHARED_PREFIX, Scheduler

    e = engines["plain"]
    system = [{"role": "system", "content": LONG}]
    reqs = [Request(system + [{"role": "user", "content": q}], cfg("ar"), key=i)
            for i, q in enumerate(["What is 7 times 6?", "Then add them up."])]
    sched = Scheduler(e, 2)
    shared = {d.key: d.result for d in sched.run(reqs, cfg("ar"))}
    _same(shared, _alone(e, reqs))
    a, b = (encode_prompt(e.target.tokenizer, r.prompt) for r in reqs)
    common = next(i for i, (x, y) in enumerate(zip(a, b)) if x != y)
    assert common >= MIN_SHARED_PREFIX
    assert sched.stats.target["shared_prefix_tokens"] == common
    assert sched.stats.target["prefill_tokens"] == len(a) + len(b) - common


def test_a_prompt_waits_for_its_twin_in_a_chunked_prefill(engines):
    from semspec.scheduler import Scheduler

    e = engines["plain"]
    reqs = [Request(LONG, cfg("ar", temperature=0.8, seed=s), key=s) for s in range(2)]
    sched = Scheduler(e, 2, max_prefill_tokens=8)
    shared = {d.key: d.result for d in sched.run(reqs, cfg("ar"))}
    _same(shared, _alone(e, reqs))
    n = _prompt_len(e, LONG)
    assert sched.stats.target["prefill_tokens"] == n + 1  # not fed twice, chunk by chunk


def test_in_a_full_batch_the_target_writes_and_drafting_resumes_as_it_thins(tiny_target, tiny_draft):
    """draft_max_batch: while more sequences are in flight the target's pass runs for them on
    every tick anyway, so a step is written by the target (reason "batch"); the last
    sequence left drafts again. The engine's default on a CPU is 1."""
    from semspec.engine import Request

    e = Engine(tiny_target, tiny_draft, ProbePair.always_accept(64, 64))
    assert e.resolve(GenerationConfig()).draft_max_batch == 1
    lengths = [60, 12, 12]  # the long one ends alone
    done = {d.key: d.result for d in e.generate_many(
        [Request(PROMPTS[0], cfg("semspec", max_new_tokens=n, draft_max_batch=1), key=i)
         for i, n in enumerate(lengths)], batch_size=3)}
    long = done[0].steps
    assert {s.reason for s in done[1].steps} == {"batch"}  # never alone: never drafted
    assert long[0].reason == "batch" and long[-1].decision == "accepted"
    first_drafted = next(i for i, s in enumerate(long) if s.decision == "accepted")
    assert all(s.reason == "batch" for s in long[:first_drafted])
    assert all(s.decision == "accepted" for s in long[first_drafted:])


def test_token_sd_drafts_only_when_the_batch_thins_and_keeps_the_targets_greedy_text(tiny_target, tiny_draft):
    """token_sd under draft_max_batch: while the batch is full the target decodes token by
    token (no head passes); the sequence left alone drafts again. Greedy text is ar's either way."""
    from semspec.engine import Request

    e = Engine(tiny_target, tiny_draft)
    lengths = [60, 12, 12]
    reqs = [Request(PROMPTS[0], cfg("token_sd", max_new_tokens=n, temperature=0.0, draft_max_batch=1), key=i)
            for i, n in enumerate(lengths)]
    done = {d.key: d.result for d in e.generate_many(reqs, batch_size=3)}
    assert done[1].counters.drafted_tokens == 0 and done[2].counters.drafted_tokens == 0
    assert done[0].counters.drafted_tokens > 0  # alone after the others ended
    for i, n in enumerate(lengths):
        assert done[i].text == e.generate(PROMPTS[0], cfg("ar", max_new_tokens=n, temperature=0.0)).text
