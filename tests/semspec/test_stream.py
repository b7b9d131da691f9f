"""A stream's bookkeeping over its runner slot: incremental passes, rollbacks that restore
logits without a pass, taps, reduced vocabularies, re-feeding."""

from __future__ import annotations

import pytest
import torch

from semspec.runner import ModelRunner
from semspec.stream import Stream
from semspec.testing import run_alone

TOL = dict(atol=1e-4, rtol=1e-4)


def _fresh_logits(m, ids):
    with torch.no_grad():
        return m.model(torch.tensor([ids])).logits[0].float()


def _stream(lm, ids, tap=None):
    runner = ModelRunner(lm, slots=1, tap_layer=tap)
    s = Stream(runner, ids)
    s.slot = runner.alloc()
    return s


def test_incremental_verification_matches_fresh_forward(tiny_target):
    m = tiny_target
    prompt = list(range(5, 25))
    s = _stream(m, prompt)
    run_alone(s.forward())
    run_alone(s.forward(extra=[30, 31]))
    step = [40, 41, 42, 43, 44]
    out = run_alone(s.forward(extra=step))
    full = _fresh_logits(m, prompt + [30, 31] + step)
    torch.testing.assert_close(out.logits, full[-len(step):], **TOL)
    assert s.forward_passes == 3 and s.cached == len(s.ids) == s.runner.lengths[s.slot]


def test_rejection_rolls_back_and_restores_logits(tiny_target):
    m = tiny_target
    prompt = list(range(5, 25))
    s = _stream(m, prompt)
    run_alone(s.forward())
    s.append([50])  # a pending token (e.g. a bonus) fed with the verification pass
    run_alone(s.forward(extra=[60, 61, 62]))
    s.truncate(len(prompt) + 1)  # reject the step, keep the bonus
    assert s.cached == len(prompt) + 1 == s.runner.lengths[s.slot]
    passes = s.forward_passes
    torch.testing.assert_close(run_alone(s.logits()), _fresh_logits(m, prompt + [50])[-1], **TOL)
    assert s.forward_passes == passes  # restored from the verification pass, no extra pass
    s.truncate(len(prompt))  # before the bonus: the state before the last pass
    torch.testing.assert_close(run_alone(s.logits()), _fresh_logits(m, prompt)[-1], **TOL)
    out = run_alone(s.forward(extra=[70, 71]))
    torch.testing.assert_close(out.logits, _fresh_logits(m, prompt + [70, 71])[-2:], **TOL)


def test_hidden_states_of_the_tap_layer(tiny_target):
    m = tiny_target
    s = _stream(m, [5, 6, 7], tap=1)
    out = run_alone(s.forward(hidden=True))
    with torch.no_grad():
        ref = m.model(torch.tensor([[5, 6, 7]]), output_hidden_states=True).hidden_states[1][0]
    torch.testing.assert_close(out.hidden, ref, atol=1e-5, rtol=1e-5)
    assert run_alone(s.forward(extra=[8])).hidden is None  # only when asked


def test_keep_for_computes_only_the_rows_needed_and_still_rolls_back(tiny_target):
    m = tiny_target
    prompt = list(range(5, 25))
    s = _stream(m, prompt)
    run_alone(s.forward(keep_for=[]))
    s.append([50])  # pending bonus token
    pre = len(s.ids)
    out = run_alone(s.forward(extra=[60, 61, 62], keep_for=[pre]))
    assert out.rows == [0, 3] and out.logits.shape[0] == 2
    full = _fresh_logits(m, prompt + [50, 60, 61, 62])
    torch.testing.assert_close(s.next_logits, full[-1], **TOL)
    passes = s.forward_passes
    s.truncate(pre)  # reject the step, keep the bonus: its logits came from the same pass
    torch.testing.assert_close(run_alone(s.logits()), full[-4], **TOL)
    assert s.forward_passes == passes


def test_next_token_draws_in_the_pass_or_from_kept_logits(tiny_target):
    from semspec.stream import Sample

    m = tiny_target
    prompt = list(range(5, 25))
    s = _stream(m, prompt)
    greedy = Sample(0.0, 1.0, None)
    tok = run_alone(s.next_token(greedy))
    assert tok == int(_fresh_logits(m, prompt)[-1].argmax()) and s.forward_passes == 1
    assert run_alone(s.next_token(greedy)) == tok and s.forward_passes == 1  # logits at hand


def test_refeed_from_recomputes_states_and_logits(tiny_target):
    m = tiny_target
    prompt = list(range(5, 25))
    s = _stream(m, prompt, tap=1)
    first = run_alone(s.forward(extra=[30, 31], hidden=True))
    s.refeed_from(len(prompt))  # the last two tokens run again on the next pass
    assert s.next_logits is None and s.pending == [30, 31] and s.ids == prompt + [30, 31]
    again = run_alone(s.forward(hidden=True))
    assert again.start == len(prompt)
    torch.testing.assert_close(again.hidden, first.hidden[-2:], atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(s.next_logits, first.logits[-1], atol=1e-5, rtol=1e-5)
    with pytest.raises(ValueError):
        s.refeed_from(len(s.ids) + 1)
