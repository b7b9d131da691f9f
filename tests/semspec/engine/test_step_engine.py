"""Step-level methods on two vLLM engines (semspec.engine.step_engine): a tiny random target that is
also its own draft, with probes that accept or reject every step."""

from __future__ import annotations

import dataclasses
import gc

import pytest

from semspec.probes import ProbePair
from semspec.types import Cancelled, GenerationConfig, Request
from tests.conftest import require_vllm

PROMPTS = ["What is 2+2?", "Name a colour.", "Count to three.", "Say hi."]


def config(method: str, **kw) -> GenerationConfig:
    """Greedy, short capped steps, drafting at any batch size (a CPU's default pauses it)."""
    kw = {"draft_max_batch": 0, "adaptive": False, "max_new_tokens": 30, "max_step_tokens": 7, "temperature": 0.0,
          **kw}
    return GenerationConfig(method=method, **kw)


@pytest.fixture(scope="module")
def engine(tiny_vllm_dir, tmp_path_factory, tiny_cache):
    require_vllm()
    from semspec.engine.step_engine import VLLMStepEngine

    probes = ProbePair.always_accept(256, 256).save(tmp_path_factory.mktemp("probes"))
    eng = VLLMStepEngine.load(str(tiny_vllm_dir), draft=str(tiny_vllm_dir), probes=str(probes), device="cpu",
                              cache_dir=tiny_cache, dtype="float32", batch_size=4, kv_cache_gb=0.1)
    yield eng
    del eng
    gc.collect()  # gone before the next module's engine starts


def run_all(engine, cfg, batch_size=4):
    done = {d.key: d for d in engine.generate_many(PROMPTS, cfg, batch_size=batch_size)}
    assert all(d.error is None for d in done.values()), [d.error for d in done.values()]
    return [done[i].result for i in range(len(PROMPTS))]


def test_ar_writes_capped_steps_up_to_the_budget(engine):
    results = run_all(engine, config("ar"))
    for r in results:
        assert r.counters.generated_tokens == 30 or r.finish_reason == "eos"
        assert all(s.target_tokens <= 7 and s.decision == "target_only" for s in r.steps)
        assert sum(s.target_tokens for s in r.steps) == r.counters.generated_tokens
        assert r.models["engine"].startswith("vllm")
    # continuous batching changes no token (float32, greedy)
    assert [r.text for r in run_all(engine, config("ar"), batch_size=1)] == [r.text for r in results]


def test_semspec_keeps_every_step_its_probes_accept_and_writes_the_targets_text(engine):
    """The draft is the target: greedy, each drafted step is the target's own, so the text
    is ar's whatever the probes decide; what changes is who wrote it."""
    ar = run_all(engine, config("ar"))
    engine.probes = ProbePair.always_accept(256, 256)
    kept = run_all(engine, config("semspec"))
    assert [r.text for r in kept] == [r.text for r in ar]
    for r in kept:
        drafted = [s for s in r.steps if s.author == "draft"]
        assert drafted and all(s.decision == "accepted" for s in drafted)
        assert r.counters.steps_accepted == r.counters.steps_drafted == len(drafted)
        assert r.counters.accepted_tokens == r.counters.drafted_tokens
        assert r.counters.draft_forward_passes > 0 and set(r.counters.phase_seconds) >= {"draft", "verify"}


def test_semspec_rejecting_every_step_lets_the_target_write_it(engine):
    ar = run_all(engine, config("ar"))
    engine.probes = ProbePair.always_reject(256, 256)
    try:
        rejected = run_all(engine, config("semspec"))
    finally:
        engine.probes = ProbePair.always_accept(256, 256)
    assert [r.text for r in rejected] == [r.text for r in ar]
    for r in rejected:
        assert r.counters.steps_accepted == 0 and r.counters.steps_drafted > 0
        assert {s.decision for s in r.steps} <= {"rejected", "target_only"}
        # the target wrote what the draft (itself) had drafted: all but each step's last token count as kept
        for s in r.steps:
            if s.decision == "rejected":
                assert s.accepted_tokens == s.drafted_tokens - 1 and s.draft_text == s.text


def test_a_rejected_step_counts_the_drafted_tokens_the_target_wrote_alike_after_kept_steps_too(engine):
    """Probes keeping 70% of steps at random: rejected steps follow kept ones, which open
    them with the target's bonus token; the draft (the target itself) drafted what the target
    then wrote, so all but a rejected step's last drafted token count as kept."""
    engine.probes = ProbePair.constant(0.7, 1.0, 256, 256)
    try:
        mixed = run_all(engine, config("semspec", ratio_floor=0.0, max_new_tokens=60))
    finally:
        engine.probes = ProbePair.always_accept(256, 256)
    decisions = [s.decision for r in mixed for s in r.steps]
    assert "accepted" in decisions and "rejected" in decisions
    for r in mixed:
        assert r.counters.accepted_tokens == sum(s.accepted_tokens for s in r.steps)
        for s in r.steps:
            if s.decision == "rejected":
                assert s.accepted_tokens == s.drafted_tokens - 1


def test_greedy_jobs_take_the_floor_the_probes_were_calibrated_with_unless_they_set_tau(engine):
    """p_T 0.3 on every step: greedy, under the probes' floor 0.5 every drafted step is
    rejected; a job that sets tau 0 (the paper's rule alone) keeps them all, and so does a
    sampled job, whose default is no floor; probes without a floor set none."""
    floored = ProbePair.constant(0.3, 0.3, 256, 256)
    floored.target.training_summary = {"floor": {"tau": 0.5, "quantile": 0.2, "n_target_steps": 10}}
    engine.probes = floored
    sampled = dict(temperature=0.8, top_p=0.95, seed=5)
    try:
        assert engine.resolve(GenerationConfig(method="semspec")).tau == 0.5
        assert engine.identities["greedy_floor"] == "0.5"  # in the job's manifest
        assert engine.resolve(config("semspec", tau=0.0)).tau == 0.0
        assert engine.resolve(config("semspec", **sampled)).tau == 0.0
        assert engine.resolve(config("semspec", tau=0.4, **sampled)).tau == 0.4
        below = run_all(engine, config("semspec"))
        unset = run_all(engine, config("semspec", tau=0.0))
        kept_sampled = run_all(engine, config("semspec", **sampled), batch_size=1)
    finally:
        engine.probes = ProbePair.always_accept(256, 256)
    assert all(r.counters.steps_drafted > 0 and r.counters.steps_accepted == 0 for r in below)
    for results in (unset, kept_sampled):
        assert all(r.counters.steps_accepted == r.counters.steps_drafted > 0 for r in results)
    assert engine.resolve(GenerationConfig(method="semspec")).tau == 0.0 and "greedy_floor" not in engine.identities


def test_candidates_drafted_side_by_side_and_the_first_accepted_kept(engine):
    """Sampling, three candidates per step: drafted in one batch of draft requests (about the
    draft passes of one), each step's drafted tokens count all three, the first the probes
    accept is kept, and a seeded rerun writes the same."""
    sampled = dict(temperature=0.8, top_p=0.95, seed=5, max_new_tokens=28)
    # one prompt at a time: the engine was loaded for 4 sequences, and 4 prompts' candidates would queue
    one = run_all(engine, config("semspec", **sampled), batch_size=1)
    three = run_all(engine, config("semspec", draft_candidates=3, **sampled), batch_size=1)
    assert [r.text for r in run_all(engine, config("semspec", draft_candidates=3, **sampled))] == \
        [r.text for r in three]
    for r in three:
        drafted = [s for s in r.steps if s.author == "draft"]
        assert drafted and all(s.decision == "accepted" for s in drafted)
        assert r.counters.drafted_tokens == sum(s.drafted_tokens for s in r.steps)
        assert all(s.drafted_tokens > s.accepted_tokens for s in drafted)  # two candidates thrown
    passes = lambda results: sum(r.counters.draft_forward_passes for r in results)  # noqa: E731
    drafted = lambda results: sum(r.counters.drafted_tokens for r in results)  # noqa: E731
    assert drafted(three) > 2 * drafted(one) and passes(three) < 1.5 * passes(one)


def test_greedy_drafts_one_candidate(engine):
    greedy = run_all(engine, config("semspec", draft_candidates=3))
    assert all(r.counters.drafted_tokens == r.counters.accepted_tokens for r in greedy)


def test_a_config_the_method_cannot_take_fails_its_item_alone(engine):
    bad = Request("Say hi.", config("semspec", temperature=0.6, draft_attempts=0), key="bad")
    done = {d.key: d for d in engine.generate_many([bad, Request("Say hi.", config("semspec"), key="ok")],
                                                    batch_size=2)}
    assert "draft_attempts" in str(done["bad"].error) and done["ok"].error is None


def test_paused_for_the_batch_the_target_writes_ahead_and_the_steps_are_cut_after(engine):
    ar = run_all(engine, config("ar"))
    paused = run_all(engine, config("semspec", draft_max_batch=1))
    assert [r.text for r in paused] == [r.text for r in ar]
    for r, a in zip(paused, ar):
        assert [s.text for s in r.steps] == [s.text for s in a.steps]  # the same step rule
        # paused while another prompt is in flight; the last one left drafts again
        assert r.steps[0].reason == "batch" and r.steps[0].decision == "target_only"
    # the last prompt in flight drafts again
    assert run_all(engine, config("semspec", draft_max_batch=1), batch_size=1)[0].counters.steps_drafted > 0
    assert engine.resolve(GenerationConfig(method="semspec")).draft_max_batch == 1  # a CPU's default


def test_backing_off_the_target_writes_ahead_and_the_steps_are_the_same(engine):
    ar = run_all(engine, config("ar"))
    engine.probes = ProbePair.always_reject(256, 256)
    try:
        adaptive = run_all(engine, config("semspec", adaptive=True, draft_cost=0.16))
    finally:
        engine.probes = ProbePair.always_accept(256, 256)
    assert [r.text for r in adaptive] == [r.text for r in ar]
    for r, a in zip(adaptive, ar):
        assert any(s.reason == "backoff" for s in r.steps)
        assert [s.text for s in r.steps] == [s.text for s in a.steps]  # cut by the same step rule


def test_a_useless_draft_is_tried_less_and_less(engine):
    engine.probes = ProbePair.always_reject(256, 256)
    try:
        fixed, adaptive = (run_all(engine, config("semspec", adaptive=on, draft_cost=0.16, max_new_tokens=120))
                           for on in (False, True))
    finally:
        engine.probes = ProbePair.always_accept(256, 256)
    assert [r.text for r in adaptive] == [r.text for r in fixed]
    assert not any(s.reason == "backoff" for r in fixed for s in r.steps)
    assert all(s.decision == "target_only" and s.author == "target"
               for r in adaptive for s in r.steps if s.reason == "backoff")
    drafted = [sum(r.counters.steps_drafted for r in rs) for rs in (fixed, adaptive)]
    assert drafted[0] >= 2 * drafted[1] > 0  # every step drafted without it; a few probes with it


def test_a_rejection_that_backs_off_writes_the_step_and_the_back_off_in_one_request(engine, monkeypatch):
    """Rejected, a sequence whose rule backs off has the target write the step and the
    back-off's steps in one request: no request of its own per rejected step."""
    from semspec.stepwise import WRITE_PHASE

    calls = []
    request = engine._request
    monkeypatch.setattr(engine, "_request", lambda item, call: calls.append(call) or request(item, call))
    engine.probes = ProbePair.always_reject(256, 256)
    try:
        results = run_all(engine, config("semspec", adaptive=True, draft_cost=0.16, max_new_tokens=120))
    finally:
        engine.probes = ProbePair.always_accept(256, 256)
    rejected = [s for r in results for s in r.steps if s.decision == "rejected"]
    assert rejected and all(s.accepted_tokens == s.drafted_tokens - 1 and s.draft_text == s.text for s in rejected)
    assert all(r.counters.accepted_tokens == sum(s.accepted_tokens for s in r.steps) for r in results)
    step_writes = [c for c in calls if c.phase == WRITE_PHASE and c.stop_at_step_end]
    assert len(step_writes) < len(rejected)  # (one each before: the step, then the back-off's)
    assert [r.text for r in results] == [r.text for r in run_all(engine, config("ar", max_new_tokens=120))]


def test_a_job_that_measures_its_costs_learns_from_its_earlier_sequences(engine):
    """Live costs (no draft_cost): the engine keeps what a kind of job's drafts did; once
    they were all rejected, new sequences start backed off and write on alone, but for one
    that drafts its first step to look (the job's steps since the last look are a back-off's
    worth); another kind of job (sampled) starts afresh."""
    engine.reset_meters()
    engine.probes = ProbePair.always_reject(256, 256)
    try:
        first, again = (run_all(engine, config("semspec", adaptive=True, max_new_tokens=120)) for _ in range(2))
        sampled = config("semspec", adaptive=True, max_new_tokens=120, temperature=0.6, seed=1)
        fresh = engine.live_costs(engine.resolve(sampled)).experience
        learned = engine.live_costs(engine.resolve(config("semspec", adaptive=True, temperature=0)))
    finally:
        engine.probes = ProbePair.always_accept(256, 256)
        engine.reset_meters()  # no later test starts from what this one taught the engine
    assert [r.text for r in again] == [r.text for r in first]
    learned = learned.experience  # the same kind of job, its temperature given as an int
    assert learned.acceptance == 0.0 and learned.verified == sum(r.counters.steps_drafted for r in first + again)
    assert fresh.acceptance is None and fresh is not learned
    assert all(r.counters.steps_drafted <= 1 for r in again)
    assert 1 <= sum(r.counters.steps_drafted for r in again) < len(again)
    assert sum(r.counters.steps_drafted for r in first) > len(first)


def test_probe_decisions_follow_the_seed_and_the_draft_cost_is_checked(engine):
    engine.probes = ProbePair.constant(0.3, 1.0, 256, 256)  # each step kept with probability 0.3
    try:
        runs = [run_all(engine, config("semspec", seed=5, ratio_floor=0, max_new_tokens=60)) for _ in range(2)]
        with pytest.raises(ValueError, match="draft_cost"):
            engine.generate(PROMPTS[0], config("semspec", adaptive=True, draft_cost=-1))
    finally:
        engine.probes = ProbePair.always_accept(256, 256)
    decisions = [[(s.decision, s.reason) for r in rs for s in r.steps] for rs in runs]
    assert decisions[0] == decisions[1]
    assert {"accepted", "rejected"} <= {d for d, _ in decisions[0]}


def test_the_draft_cost_is_the_drafts_own_unless_the_job_sets_it(engine):
    assert engine.resolve(GenerationConfig(method="semspec")).draft_cost == pytest.approx(1.0)  # its own target
    assert engine.resolve(config("semspec", draft_cost=0.5)).draft_cost == 0.5


def test_a_bad_prompt_fails_alone(engine):
    done = list(engine.generate_many(["", "Say hi."], config("semspec"), batch_size=2))
    errors = {d.key: d.error for d in done}
    assert errors[0] is not None and errors[1] is None


def test_a_request_that_raises_anything_fails_alone_beside_other_jobs(engine, monkeypatch):
    """Not only a bad prompt's ValueError: a template that throws a TypeError on one line fails
    that item; another job's items in the same batch finish as if alone."""
    from semspec.engine import step_engine

    real = step_engine.prompt_ids

    def prompt_ids(tokenizer, messages, *args):
        if messages == "poison":
            raise TypeError("the template choked")
        return real(tokenizer, messages, *args)

    monkeypatch.setattr(step_engine, "prompt_ids", prompt_ids)
    poisoned = Request("poison", config("ar"), key="bad")
    others = [Request("Say hi.", config("semspec"), key="a"), Request("Count to three.", config("ar"), key="b")]
    done = {d.key: d for d in engine.generate_many([others[0], poisoned, others[1]], batch_size=3)}
    assert isinstance(done["bad"].error, TypeError)
    alone = {d.key: d for d in engine.generate_many(others, batch_size=1)}
    assert {k: done[k].result.text for k in "ab"} == {k: alone[k].result.text for k in "ab"}


def test_an_abort_ends_its_prompt_and_the_others_go_on(engine):
    from tests.tiny_models import aborting_source

    reqs = [Request(p, config("semspec"), key=i) for i, p in enumerate(PROMPTS[:3])]
    done = list(engine.generate_many(aborting_source(reqs), batch_size=2))
    assert done[0].key == 0 and isinstance(done[0].error, Cancelled)
    assert {d.key for d in done[1:]} == {1, 2} and all(d.error is None for d in done[1:])
    assert not any(s.llm.has_unfinished_requests() for s in (engine.target, engine.draft))


@pytest.mark.parametrize("method,kw", [("ar", {}), ("semspec", {}), ("semspec", {"draft_max_batch": 1}),
                                       ("step_judge", {"judge_threshold": 10})])
def test_a_sequence_that_loops_ends_cut_after_its_first_copy(engine, monkeypatch, method, kw):
    """stop_loops: after each step (a drafted one, one the target wrote, a write-ahead's run of
    them) the generated ids are looked at with semspec.repetition's rule; a sequence that loops
    (the tiny random model does, greedy) ends ("repetition") with the ids the rule keeps, as
    the token engine cuts them: steps before the cut as they were, the one it falls in cut
    short; what was generated past the cut, up to the end of the step the loop was found in,
    counts as cut_tokens. Without stop_loops, and a sequence that does not loop, unchanged."""
    from semspec.repetition import find_loop, line_break_ids, loop_end
    from semspec.stepwise import StepProgram

    real = StepProgram.result

    def result(program):
        res = real(program)
        res.ids = program.ids[program.prompt_len:]
        return res

    monkeypatch.setattr(StepProgram, "result", result)
    tok = engine.target.facts.tokenizer
    off = run_all(engine, config(method, max_new_tokens=150, **kw))
    on = run_all(engine, config(method, max_new_tokens=150, stop_loops=True, **kw))
    looped = 0
    for full, cut_short in zip(off, on):
        assert full.finish_reason in ("eos", "length") and full.counters.cut_tokens == 0
        end = loop_end(full.ids)
        if end is None:
            assert (cut_short.text, cut_short.finish_reason) == (full.text, full.finish_reason)
            continue
        looped += 1
        cut = find_loop(full.ids, line_breaks=line_break_ids(tok))
        assert (cut_short.finish_reason, cut_short.ids) == ("repetition", full.ids[:cut])
        assert cut_short.text == tok.decode(full.ids[:cut], skip_special_tokens=True)
        c = cut_short.counters
        assert c.generated_tokens == cut and end - cut <= c.cut_tokens <= end - cut + 8
        assert sum(s.target_tokens for s in cut_short.steps) == cut
        assert [s.index for s in cut_short.steps] == list(range(len(cut_short.steps)))
        *before, last = cut_short.steps
        assert [(s.text, s.decision) for s in before] == [(s.text, s.decision) for s in full.steps[:len(before)]]
        assert full.steps[len(before)].text.startswith(last.text) and last.decision == full.steps[len(before)].decision
    assert looped >= 2


@pytest.mark.parametrize("method", ["ar", "semspec"])
def test_a_doom_rule_of_the_length_kind_stops_sampled_sequences_at_its_token(engine, monkeypatch, method):
    """A doom rule that stops every sample at min_tokens (the kind calibration picks where right
    answers are short): a sampled job that asks ends each longer sequence there ("doomed", the
    text its first min_tokens tokens); a greedy job, or one with stop_doomed off, is untouched."""
    import math

    from semspec.doom import DoomRule

    monkeypatch.setattr(engine, "doom", DoomRule("logprob", 8, 12, math.inf, 0.95, "t"))
    sampled = config(method, max_new_tokens=40, temperature=0.8, top_p=0.95, seed=3)
    free = run_all(engine, sampled)
    cut = run_all(engine, dataclasses.replace(sampled, stop_doomed=True))
    stopped = 0
    for full, short in zip(free, cut):
        if full.counters.generated_tokens <= 12:
            assert (short.text, short.finish_reason) == (full.text, full.finish_reason)
            continue
        stopped += 1
        assert short.finish_reason == "doomed" and short.counters.generated_tokens == 12
        assert sum(s.target_tokens for s in short.steps) == 12
    assert stopped >= 2
    greedy = run_all(engine, config(method, max_new_tokens=40, stop_doomed=True))
    assert all(r.finish_reason != "doomed" for r in greedy)
    assert "doom_rule" in engine.identities


def test_methods_it_does_not_serve_are_refused_by_name(engine):
    assert "token_sd" in engine.method_problem("token_sd")
    (done,) = engine.generate_many(["hi"], GenerationConfig(method="token_sd"), batch_size=1)
    assert done.error is not None and "token_sd" in str(done.error)


def test_step_judge_scores_every_drafted_step_and_keeps_those_at_the_threshold(engine):
    ar = run_all(engine, config("ar"))
    for threshold, decision in ((0, "accepted"), (10, "rejected")):
        judged = run_all(engine, config("step_judge", judge_threshold=threshold))
        assert [r.text for r in judged] == [r.text for r in ar]
        drafted = [s for r in judged for s in r.steps if s.judge_score is not None]
        assert drafted and all(s.decision == decision and 0 <= s.judge_score <= 9 and 0 <= s.p_target <= 1
                               for s in drafted)
        assert all("judge" in r.counters.phase_seconds for r in judged)


def test_a_plain_engine_decodes_beside_the_step_engines(engine, tiny_vllm_dir, tiny_cache):
    """A worker holds ar's engine beside the step methods' pair: vLLM keeps one KV connector
    per process, which the states engines set up; an engine started after them still steps."""
    from semspec.engine.token_engine import VLLMEngine

    plain = VLLMEngine.load(str(tiny_vllm_dir), device="cpu", cache_dir=tiny_cache, dtype="float32", batch_size=2,
                            kv_cache_gb=0.1)
    try:
        ar = plain.generate(PROMPTS[0], config("ar"))
        assert ar.text == engine.generate(PROMPTS[0], config("ar")).text
        assert engine.generate(PROMPTS[0], config("semspec")).counters.steps_accepted > 0
    finally:
        del plain
        gc.collect()
