from __future__ import annotations

import os

import pytest
import torch

from semspec.engine import Engine
from semspec.prompts import MethodUnavailable, PromptError
from semspec.models import load_model
from semspec.probes import ProbePair
from semspec.types import GenerationConfig

PROMPT = "Natalia sold 48 clips in April and half as many in May. How many clips in total?"


def cfg(method, **kw):
    # draft_max_batch=0: sequences draft in a batch too (the scheduler's machinery is tested);
    # draft_cost: the tiny draft is half its target, a pass that speculation could never pay
    # for, so the tests price it as the embedded layer draft is priced
    base = dict(method=method, max_new_tokens=40, max_step_tokens=8, temperature=0.0, seed=0, draft_max_batch=0,
                draft_cost=0.16)
    base.update(kw)
    return GenerationConfig(**base)


@pytest.fixture(scope="module")
def accept_engine(tiny_target, tiny_draft):
    return Engine(tiny_target, tiny_draft, ProbePair.always_accept(64, 64))


@pytest.fixture(scope="module")
def reject_engine(tiny_target, tiny_draft):
    return Engine(tiny_target, tiny_draft, ProbePair.always_reject(64, 64))


@pytest.fixture(scope="module")
def ar_result(tiny_target):
    return Engine(tiny_target).generate(PROMPT, cfg("ar"))


def drive(engine, prompt, config):
    """Run one sequence's program pass by pass (no scheduler), yielding the sequence after
    each pass, so a test can watch its state between passes."""
    from semspec.scheduler import Scheduler
    from semspec.testing import serve_alone

    runners = Scheduler(engine, 1).runners
    seq = engine.new_sequence(prompt, config, runners)
    for stream in seq.streams:
        stream.slot = stream.runner.alloc()
    program, result = seq.program(), None
    while True:
        try:
            req = program.send(result)
        except StopIteration:
            return
        result = serve_alone(req)
        yield seq


def _gen_ids(engine, result):
    return engine.target.tokenizer(result.text, add_special_tokens=False)["input_ids"]


def test_ar_basics(tiny_target, ar_result):
    r = ar_result
    c = r.counters
    assert r.finish_reason == "length" and c.generated_tokens == 40
    assert c.target_forward_passes == 40  # prefill + one per token after the first
    assert c.draft_forward_passes == 0 and c.drafted_tokens == 0
    assert all(s.author == "target" and s.decision == "target_only" for s in r.steps)
    assert sum(s.target_tokens for s in r.steps) == 40
    assert all(s.target_tokens <= 8 for s in r.steps)
    assert "".join(s.text for s in r.steps).startswith(r.text[:10])
    assert r.models["target"] == str(tiny_target.identity)
    assert set(c.phase_seconds) >= {"prefill", "target_write"}


def test_result_answer_fields_come_from_semspec_answers(ar_result):
    from semspec.answers import final_answer, split_reasoning

    r = ar_result
    assert r.final_answer == final_answer(r.text)  # the bench's function: service and bench agree
    assert (r.reasoning, r.content) == split_reasoning(r.text)
    assert r.content and r.content in r.text


def test_greedy_token_sd_equals_ar(tiny_target, tiny_draft, ar_result):
    r = Engine(tiny_target, tiny_draft).generate(PROMPT, cfg("token_sd", draft_tokens=3))
    assert r.text == ar_result.text
    assert r.counters.generated_tokens == 40
    assert r.counters.drafted_tokens > 0
    # the target as its own draft: every drafted token is accepted
    self_draft = Engine(tiny_target, tiny_target).generate(PROMPT, cfg("token_sd", draft_tokens=4))
    assert self_draft.text == ar_result.text
    c = self_draft.counters
    assert c.accepted_tokens == c.drafted_tokens > 0
    assert c.target_forward_passes <= 1 + 40 // 5 + 1


def test_token_sd_stops_drafting_after_an_unsure_token_and_stays_lossless(tiny_target, tiny_draft, ar_result):
    e = Engine(tiny_target, tiny_draft)
    full = e.generate(PROMPT, cfg("token_sd", draft_tokens=6))
    short = e.generate(PROMPT, cfg("token_sd", draft_tokens=6, draft_stop_prob=0.5))
    assert short.text == full.text == ar_result.text
    # a random tiny draft is unsure of most tokens: it drafts fewer per verification
    per_pass = [r.counters.drafted_tokens / max(1, r.counters.target_forward_passes - 1) for r in (full, short)]
    assert per_pass[1] < per_pass[0]
    sampled = [e.generate(PROMPT, cfg("token_sd", draft_tokens=6, temperature=0.8, seed=3, draft_stop_prob=p))
               for p in (0.0, 0.5)]
    assert sampled[1].counters.drafted_tokens < sampled[0].counters.drafted_tokens


def test_semspec_forced_reject_greedy_equals_ar(reject_engine, ar_result):
    r = reject_engine.generate(PROMPT, cfg("semspec"))
    assert r.text == ar_result.text
    assert r.counters.steps_accepted == 0 and r.counters.steps_drafted > 0
    assert all(s.author == "target" for s in r.steps)
    assert any(s.decision == "rejected" and s.draft_text for s in r.steps)
    assert all(s.p_target == 0.0 and s.p_draft == 1.0 for s in r.steps if s.decision == "rejected")


@pytest.mark.parametrize("method,probes", [("semspec", ProbePair.always_reject(64, 64)),
                                           ("step_judge", ProbePair.always_accept(64, 64))])
@pytest.mark.parametrize("temperature", [0.0, 0.05, 0.9])
def test_a_rejected_step_keeps_the_targets_own_draws_from_the_verification(tiny_target, method, probes, temperature):
    from semspec.sequence import FOLLOW_ROWS

    # the target as its own draft, every step rejected: the verification pass already holds
    # the logits of the target's first draws along the drafted step
    kw = dict(temperature=temperature, seed=5, judge_threshold=10, adaptive=False)
    ar = Engine(tiny_target).generate(PROMPT, cfg("ar", **kw))
    r = Engine(tiny_target, tiny_target, probes).generate(PROMPT, cfg(method, **kw))
    assert r.text == ar.text  # the same draws from the same generator: the target's text
    rejected = [s for s in r.steps if s.decision == "rejected"]
    assert rejected and r.counters.steps_accepted == 0
    kept = [s.accepted_tokens for s in rejected]
    assert r.counters.accepted_tokens == sum(kept)
    assert all(0 <= k <= min(FOLLOW_ROWS + 1, s.drafted_tokens - 1) for k, s in zip(kept, rejected))
    # passes: the prefill, then per step its verification and a pass per token not drawn
    # from it (the kept ones, and the first draw that differs when there is one)
    assert len(rejected) == len(r.steps)
    fewest = 1 + sum(s.target_tokens - s.accepted_tokens for s in rejected)
    assert fewest <= r.counters.target_forward_passes <= fewest + len(rejected)
    assert ar.counters.target_forward_passes == ar.counters.generated_tokens
    if temperature < 0.1:  # the draft draws what the target draws
        assert sum(kept) > len(rejected)


def test_step_judge_never_accepting_equals_ar(accept_engine, ar_result):
    r = accept_engine.generate(PROMPT, cfg("step_judge", judge_threshold=10))
    assert r.text == ar_result.text
    assert r.counters.steps_accepted == 0
    assert all(s.judge_score is not None for s in r.steps if s.decision == "rejected")


def test_semspec_forced_accept_returns_the_drafts_steps(accept_engine, tiny_draft):
    r = accept_engine.generate(PROMPT, cfg("semspec"))
    c = r.counters
    assert c.steps_accepted == c.steps_drafted == len([s for s in r.steps if s.author == "draft"]) > 0
    assert c.accepted_tokens == c.drafted_tokens
    assert all(s.author == "draft" for s in r.steps)
    # each accepted step is the target's bonus token (step 0: none) + the draft's greedy
    # continuation of everything before it
    *_, seq = drive(accept_engine, PROMPT, cfg("semspec"))
    start = seq.prompt_len
    for n_steps, step in enumerate(seq.steps):
        body_start = start if n_steps == 0 else start + 1  # a bonus token opens later steps
        end = start + step.target_tokens
        assert end > body_start
        expect = list(seq.T.ids[:body_start])
        with torch.no_grad():
            for _ in range(end - body_start):
                expect.append(int(tiny_draft.model(torch.tensor([expect])).logits[0, -1].argmax()))
        assert expect[body_start:end] == seq.T.ids[body_start:end]
        start = end
    assert seq.result().text == r.text


def test_same_seed_same_output(accept_engine, tiny_target, tiny_draft):
    half = Engine(tiny_target, tiny_draft, ProbePair.constant(0.5, 0.8, 64, 64))  # p_T/p_D 0.625
    for engine, method in [(accept_engine, "ar"), (accept_engine, "token_sd"), (half, "semspec"),
                           (accept_engine, "step_judge")]:
        a = engine.generate(PROMPT, cfg(method, temperature=0.9, seed=3, max_new_tokens=24))
        b = engine.generate(PROMPT, cfg(method, temperature=0.9, seed=3, max_new_tokens=24))
        assert a.text == b.text and [s.decision for s in a.steps] == [s.decision for s in b.steps], method
        c = engine.generate(PROMPT, cfg(method, temperature=0.9, seed=4, max_new_tokens=24))
        assert c.text != a.text, method
    r = half.generate(PROMPT, cfg("semspec", temperature=0.9, seed=3))
    assert {s.decision for s in r.steps} == {"accepted", "rejected"}  # p = 0.625 mixes both


def test_semspec_draft_attempts_retry_rejected_steps(tiny_target, tiny_draft, reject_engine, ar_result):
    half = Engine(tiny_target, tiny_draft, ProbePair.constant(0.5, 1.0, 64, 64))  # p_T/p_D = 0.5
    shares = {}
    for attempts in (1, 4):
        kept = total = drafted = 0
        for seed in range(3):
            r = half.generate(PROMPT, cfg("semspec", temperature=0.9, seed=seed, max_new_tokens=60,
                                          draft_attempts=attempts, ratio_floor=0.0))  # a p = 0.5 coin
            spec = [s for s in r.steps if s.decision in ("accepted", "rejected")]
            kept += sum(s.decision == "accepted" for s in spec)
            total += len(spec)
            drafted += r.counters.steps_drafted
            # the step log counts every attempt's drafted tokens, the counters every attempt
            assert sum(s.drafted_tokens for s in r.steps) == r.counters.drafted_tokens
        shares[attempts] = kept / total
        if attempts == 4:
            assert drafted > total  # some steps took more than one draft
    # P(a step ends up drafted) is 1 - 0.5^K: about 0.5 with one attempt, 0.94 with four
    assert shares[4] > shares[1] + 0.2, shares
    # every attempt rejected: the target still writes each step, as without retries
    r = reject_engine.generate(PROMPT, cfg("semspec", temperature=0.9, seed=1, draft_attempts=3))
    assert r.counters.steps_accepted == 0 and all(s.author == "target" for s in r.steps)
    assert r.counters.steps_drafted > len([s for s in r.steps if s.decision == "rejected"])
    # greedy: another attempt would draft the same step, so there is one
    g = reject_engine.generate(PROMPT, cfg("semspec", draft_attempts=3))
    assert g.text == ar_result.text
    assert g.counters.steps_drafted == len([s for s in g.steps if s.decision == "rejected"])
    with pytest.raises(ValueError, match="draft_attempts"):
        half.generate(PROMPT, cfg("semspec", draft_attempts=0))


def test_max_new_tokens_and_step_cap(accept_engine, reject_engine):
    for engine in (accept_engine, reject_engine):
        for method in ("ar", "token_sd", "step_judge", "semspec"):
            r = engine.generate(PROMPT, cfg(method, max_new_tokens=13, max_step_tokens=4, temperature=0.7))
            assert r.counters.generated_tokens == 13 and r.finish_reason == "length", method
            assert sum(s.target_tokens for s in r.steps) == 13, method
            assert all(s.target_tokens <= 4 for s in r.steps), method
            if method != "token_sd":  # token_sd drafts in rounds that straddle steps
                assert all(s.drafted_tokens <= 4 for s in r.steps), method


def test_eos_stops_every_method(tiny_dirs, tiny_cache, ar_result):
    tgt = load_model(str(tiny_dirs["target"]), device="cpu", cache_dir=tiny_cache)
    drf = load_model(str(tiny_dirs["draft"]), device="cpu", cache_dir=tiny_cache)
    *_, ar_seq = drive(Engine(tgt), PROMPT, cfg("ar"))
    gen = ar_seq.T.ids[ar_seq.prompt_len:]
    stop = gen[9]  # make the 10th greedy token the EOS token
    n_before = gen.index(stop)
    tgt.model.generation_config.eos_token_id = stop
    for probes in (ProbePair.always_accept(64, 64), ProbePair.always_reject(64, 64)):
        engine = Engine(tgt, drf, probes)
        for method in ("ar", "token_sd", "step_judge", "semspec"):
            r = engine.generate(PROMPT, cfg(method, judge_threshold=10))
            if method == "semspec" and probes.target.constant == 1.0:
                # accepting every drafted step, the target only speaks in bonus tokens
                assert r.finish_reason in ("eos", "length")
                continue
            assert r.finish_reason == "eos", method
            assert r.counters.generated_tokens == n_before, method
            assert len(r.text) < len(ar_result.text)


def test_prompt_errors(accept_engine, tiny_target):
    for bad in ("", "   ", [], [{"role": "user", "content": ""}]):
        with pytest.raises(PromptError):
            accept_engine.generate(bad, cfg("ar"))
    long_prompt = " ".join(["Natalia sold clips"] * 400)
    with pytest.raises(PromptError, match="context"):
        accept_engine.generate(long_prompt, cfg("ar"))
    with pytest.raises(ValueError, match="unknown method"):
        accept_engine.generate(PROMPT, cfg("beam"))


def test_missing_parts_are_clear_errors(tiny_target, tiny_draft, tiny_other):
    with pytest.raises(MethodUnavailable, match="draft"):
        Engine(tiny_target).generate(PROMPT, cfg("semspec"))
    with pytest.raises(MethodUnavailable, match="draft"):
        Engine(tiny_target).generate(PROMPT, cfg("token_sd"))
    with pytest.raises(MethodUnavailable, match="probes"):
        Engine(tiny_target, tiny_draft).generate(PROMPT, cfg("semspec"))
    with pytest.raises(MethodUnavailable, match="tokenizer"):
        Engine(tiny_target, tiny_other).generate(PROMPT, cfg("token_sd"))


def test_different_tokenizer_draft(tiny_target, tiny_other, ar_result):
    assert not Engine(tiny_target, tiny_other).same_tokenizer
    rej = Engine(tiny_target, tiny_other, ProbePair.always_reject(64, 64))
    assert rej.generate(PROMPT, cfg("semspec")).text == ar_result.text
    acc = Engine(tiny_target, tiny_other, ProbePair.always_accept(64, 64))
    for method in ("semspec", "step_judge"):
        r = acc.generate(PROMPT, cfg(method, temperature=0.8, judge_threshold=0))
        assert r.counters.generated_tokens <= 40
        assert r.counters.steps_accepted > 0 and r.counters.draft_forward_passes > 0, method
        assert "draft" in r.models
    # retries mirror the text again: half the attempts rejected, every step still written once
    half = Engine(tiny_target, tiny_other, ProbePair.constant(0.5, 1.0, 64, 64))
    r = half.generate(PROMPT, cfg("semspec", temperature=0.9, seed=2, draft_attempts=3, ratio_floor=0.0))
    assert r.counters.generated_tokens == 40 and r.counters.steps_drafted > len(r.steps) / 2
    assert "".join(s.text for s in r.steps) == half.target.tokenizer.decode(
        half.target.tokenizer(r.text, add_special_tokens=False)["input_ids"])


def test_delimiter_ends_steps(tiny_target):
    r = Engine(tiny_target).generate(PROMPT, cfg("ar", step_delimiter=" ", max_step_tokens=30))
    ended = [s for s in r.steps[:-1]]
    assert ended and all(" " in s.text.strip(" ") or s.text.endswith(" ") or s.target_tokens == 30 for s in ended)
    assert any(s.target_tokens < 30 for s in ended)


def test_ar_matches_transformers_generate(tiny_target, ar_result):
    from semspec.models import encode_prompt

    ids = torch.tensor([encode_prompt(tiny_target.tokenizer, PROMPT)])
    with torch.no_grad():
        out = tiny_target.model.generate(ids, max_new_tokens=40, do_sample=False, min_new_tokens=40)
    gen = out[0, ids.shape[1]:]
    assert tiny_target.tokenizer.decode(gen, skip_special_tokens=True) == ar_result.text


def test_engine_load_from_specs(tiny_dirs, tmp_path):
    from semspec.probes import Probe

    pair = ProbePair(Probe(64, hidden_dims=(8,), layer=-1), Probe(64, hidden_dims=(8,), layer=1, role="draft"))
    pair.save(tmp_path / "probes")
    e = Engine.load(str(tiny_dirs["target"]), str(tiny_dirs["draft"]), str(tmp_path / "probes"),
                    device="cpu", cache_dir=tmp_path / "cache")
    ids = e.identities
    assert set(ids) == {"target", "draft", "target_probe", "draft_probe", "dtype", "engine"} and ids["dtype"] == "float32"
    assert ids["target_probe"].startswith(str((tmp_path / "probes" / "target.safetensors").resolve()) + "@sha256:")
    r = e.generate(PROMPT, cfg("semspec", max_new_tokens=12))
    assert r.counters.generated_tokens == 12 and r.models == ids
    assert all(0 < s.p_target < 1 for s in r.steps if s.p_target is not None)
    plain = Engine.load(str(tiny_dirs["target"]), device="cpu", cache_dir=tmp_path / "cache")
    assert plain.draft is None and set(plain.identities) == {"target", "dtype", "engine"}


def test_probes_that_cannot_load_fail_only_the_methods_that_need_them(tiny_dirs, tmp_path):
    from semspec.preflight import method_problem
    from semspec.probes import Probe

    target, draft = str(tiny_dirs["target"]), str(tiny_dirs["draft"])
    ProbePair(Probe(64, layer=-1), Probe(64, layer=1, role="draft")).save(tmp_path / "broken")
    (tmp_path / "broken" / "draft.safetensors").write_bytes(b"not a probe file")
    e = Engine.load(target, draft, str(tmp_path / "broken"), device="cpu", cache_dir=tmp_path / "cache")
    assert e.probes is None and "could not load" in e.unavailable["probes"]
    assert e.generate(PROMPT, cfg("ar", max_new_tokens=4)).counters.generated_tokens == 4
    assert e.generate(PROMPT, cfg("token_sd", max_new_tokens=4)).counters.generated_tokens == 4
    with pytest.raises(MethodUnavailable, match="probes 'broken'|could not load"):
        e.generate(PROMPT, cfg("semspec"))
    assert e.method_problem("ar") is None and "could not load" in e.method_problem("semspec")
    assert "cannot run" in method_problem("semspec", target, draft, str(tmp_path / "broken"), tmp_path / "cache")
    assert method_problem("ar", target, draft, str(tmp_path / "broken"), tmp_path / "cache") is None

    # probes calibrated for other models: refused before any weights load, and by the engine
    other = ProbePair(Probe(64, layer=-1, model_sha256="0" * 64), Probe(64, layer=1, role="draft"))
    other.save(tmp_path / "other")
    problem = method_problem("semspec", target, draft, str(tmp_path / "other"), tmp_path / "cache")
    assert "calibrated for another target model" in problem and "semjobs probe" in problem
    e = Engine.load(target, draft, str(tmp_path / "other"), device="cpu", cache_dir=tmp_path / "cache")
    assert "calibrated for another target model" in e.method_problem("semspec")
    assert method_problem("semspec", target, "none", None) is not None  # no draft at all


def test_a_draft_that_cannot_load_leaves_ar_running(tiny_dirs, tmp_path):
    (tmp_path / "empty").mkdir()
    e = Engine.load(str(tiny_dirs["target"]), str(tmp_path / "empty"), device="cpu", cache_dir=tmp_path / "cache")
    assert e.draft is None and "could not load" in e.unavailable["draft"]
    assert e.generate(PROMPT, cfg("ar", max_new_tokens=3)).counters.generated_tokens == 3
    with pytest.raises(MethodUnavailable, match="could not load"):
        e.generate(PROMPT, cfg("step_judge"))


def test_tau_floor_rejects(tiny_target, tiny_draft, ar_result):
    even = Engine(tiny_target, tiny_draft, ProbePair.constant(0.5, 0.5, 64, 64))
    r = even.generate(PROMPT, cfg("semspec", tau=0.6))
    assert r.text == ar_result.text and r.counters.steps_accepted == 0
    r = even.generate(PROMPT, cfg("semspec", tau=0.4))
    assert r.counters.steps_accepted == r.counters.steps_drafted > 0


def test_ratio_floor_is_the_papers_rule_and_tau_floors_p_target_alone(tiny_target, tiny_draft, ar_result):
    e = Engine(tiny_target, tiny_draft, ProbePair.constant(0.5, 0.4, 64, 64))  # p_T/p_D = 1.25
    for kw, accepted in (({"ratio_floor": 1.2}, True), ({"ratio_floor": 1.3}, False),
                         ({"tau": 0.6, "ratio_floor": 0.0}, False), ({"tau": 0.4}, True)):
        r = e.generate(PROMPT, cfg("semspec", **kw))
        assert r.counters.steps_drafted > 0, kw
        assert r.counters.steps_accepted == (r.counters.steps_drafted if accepted else 0), kw
        if not accepted:
            assert r.text == ar_result.text and all(s.accept_prob == 0.0 for s in r.steps if s.p_target)


def test_the_draft_writes_the_answer_with_answer_by_draft(accept_engine):
    free = accept_engine.generate(PROMPT, cfg("semspec", think_end=None))
    marker = free.steps[1].text[-2:]
    by = {who: accept_engine.generate(PROMPT, cfg("semspec", think_end=marker, answer_by=who))
          for who in ("target", "draft")}
    r = by["draft"]
    idx = next(i for i, s in enumerate(r.steps) if marker in s.text)
    after = r.steps[idx + 1:]
    assert after and all(s.author == "draft" and s.decision == "draft_only" for s in after)
    # no target pass after the marker, and the unverified steps count in no acceptance figure
    assert r.counters.target_forward_passes < by["target"].counters.target_forward_passes
    assert r.counters.steps_drafted == sum(s.decision in ("accepted", "rejected") for s in r.steps)
    upto = r.text.index(marker) + len(marker)
    assert r.text[:upto] == by["target"].text[:upto] and r.text != by["target"].text
    with pytest.raises(ValueError, match="answer_by"):
        accept_engine.generate(PROMPT, cfg("semspec", answer_by="judge"))


def test_end_of_thinking_marker_hands_over_to_the_target(accept_engine):
    free = accept_engine.generate(PROMPT, cfg("semspec", think_end=None))
    marker = free.steps[1].text[-2:]  # something the draft writes in its second step
    assert marker.strip()
    r = accept_engine.generate(PROMPT, cfg("semspec", think_end=marker))
    idx = next(i for i, s in enumerate(r.steps) if marker in s.text)
    assert r.steps[idx].text.endswith(marker) or marker in r.steps[idx].text
    after = r.steps[idx + 1:]
    assert after and all(s.author == "target" and s.decision == "target_only" for s in after)


def test_token_sd_matches_transformers_assisted_generation(tiny_target, tiny_draft):
    from semspec.models import encode_prompt

    ids = torch.tensor([encode_prompt(tiny_target.tokenizer, PROMPT)])
    with torch.no_grad():
        out = tiny_target.model.generate(ids, assistant_model=tiny_draft.model, max_new_tokens=30,
                                         min_new_tokens=30, do_sample=False)
    hf = tiny_target.tokenizer.decode(out[0, ids.shape[1]:], skip_special_tokens=True)
    ours = Engine(tiny_target, tiny_draft).generate(PROMPT, cfg("token_sd", max_new_tokens=30))
    assert ours.text == hf


def test_methods_mix_in_one_batch(accept_engine):
    from semspec.engine import Request

    prompts = [PROMPT, "What is 7 times 6?", "Hi", PROMPT]
    configs = [cfg("semspec", temperature=0.8, seed=1), cfg("token_sd", seed=2), cfg("ar", max_new_tokens=7),
               cfg("step_judge", judge_threshold=3)]
    alone = [accept_engine.generate(p, c).text for p, c in zip(prompts, configs)]
    done = list(accept_engine.generate_many(
        [Request(p, c, key=f"k{i}") for i, (p, c) in enumerate(zip(prompts, configs))], batch_size=3))
    assert sorted(d.key for d in done) == ["k0", "k1", "k2", "k3"]
    assert done[0].key == "k2"  # the shortest finishes first
    assert {d.key: d.result.text for d in done} == {f"k{i}": t for i, t in enumerate(alone)}


def test_near_the_context_end_the_target_writes(tiny_dirs, tiny_cache, tiny_target):
    # a draft with a short context: once drafting could overflow it, the target takes over
    from semspec.models import load_model

    short = load_model(str(tiny_dirs["draft"]), device="cpu", cache_dir=tiny_cache)
    short.model.config.max_position_embeddings = 60
    e = Engine(tiny_target, short, ProbePair.always_accept(64, 64))
    for method in ("semspec", "step_judge"):
        r = e.generate("Hi", cfg(method, max_new_tokens=60, judge_threshold=0))
        assert r.counters.generated_tokens == 60, method
        assert r.steps[0].author == "draft" and r.steps[-1].decision == "target_only", method


@pytest.mark.parametrize("draft_name", ["same", "other"])
def test_invariants_over_random_settings(draft_name, tiny_target, tiny_draft, tiny_other):
    import random

    draft = tiny_draft if draft_name == "same" else tiny_other
    rnd = random.Random(draft_name)
    methods = ["ar", "step_judge", "semspec"] + (["token_sd"] if draft_name == "same" else [])
    for i in range(int(os.environ.get("SEMSPEC_FUZZ_N", "10"))):
        pt, pd = rnd.random(), rnd.random()
        engine = Engine(tiny_target, draft, ProbePair.constant(pt, pd, 64, 64))
        c = GenerationConfig(
            method=rnd.choice(methods), max_new_tokens=rnd.randint(1, 30), temperature=rnd.choice([0.0, 0.7, 1.2]),
            top_p=rnd.choice([1.0, 0.9]), seed=i, step_delimiter=rnd.choice(["\n\n", " ", "e"]),
            max_step_tokens=rnd.randint(1, 9), draft_tokens=rnd.randint(1, 5), judge_threshold=rnd.randint(0, 9),
            tau=rnd.choice([0.0, 0.3]),
        )
        r = engine.generate(rnd.choice([PROMPT, "Hi", [{"role": "user", "content": "2+2?"}]]), c)
        n = r.counters.generated_tokens
        assert 0 <= n <= c.max_new_tokens, c
        assert r.finish_reason in ("eos", "length"), c
        assert r.finish_reason == "eos" or n == c.max_new_tokens, c
        assert sum(s.target_tokens for s in r.steps) == n, c
        assert [s.index for s in r.steps] == list(range(len(r.steps))), c
        assert r.counters.accepted_tokens <= r.counters.drafted_tokens, c
        assert r.counters.steps_accepted <= r.counters.steps_drafted, c


def test_step_rule_comes_from_the_probes_unless_the_caller_sets_it(tiny_target, tiny_draft):
    from semspec.types import DEFAULT_MAX_STEP_TOKENS, DEFAULT_STEP_DELIMITER

    plain = Engine(tiny_target).resolve(GenerationConfig(method="ar"))
    assert (plain.step_delimiter, plain.max_step_tokens) == (DEFAULT_STEP_DELIMITER, DEFAULT_MAX_STEP_TOKENS)
    probes = ProbePair.always_accept(64, 64)
    probes.target.training_summary = {"collect": {"step_delimiter": "\n", "max_step_tokens": 5}}
    engine = Engine(tiny_target, tiny_draft, probes)
    got = engine.resolve(GenerationConfig(method="ar"))
    assert (got.step_delimiter, got.max_step_tokens) == ("\n", 5)
    assert engine.resolve(GenerationConfig(step_delimiter=" ")).step_delimiter == " "
    result = engine.generate("Natalia sold clips.", GenerationConfig(method="semspec", max_new_tokens=30))
    assert all(s.target_tokens <= 6 for s in result.steps)  # the cap of 5 (+ a bonus token)
