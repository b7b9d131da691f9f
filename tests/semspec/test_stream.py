from __future__ import annotations

import pytest
import torch

from semspec.stream import Stream


def _fresh_logits(m, ids):
    with torch.no_grad():
        return m.model(torch.tensor([ids])).logits[0].float()


def test_incremental_verification_matches_fresh_forward(tiny_target):
    m = tiny_target
    prompt = list(range(5, 25))
    s = Stream(m, prompt)
    s.forward()
    s.forward(extra=[30, 31])
    step = [40, 41, 42, 43, 44]
    out = s.forward(extra=step)
    full = _fresh_logits(m, prompt + [30, 31] + step)
    torch.testing.assert_close(out.logits, full[-len(step):], atol=1e-4, rtol=1e-4)
    assert s.forward_passes == 3 and s.cached == len(s.ids)


def test_rejection_crops_and_restores_logits(tiny_target):
    m = tiny_target
    prompt = list(range(5, 25))
    s = Stream(m, prompt)
    s.forward()
    s.append([50])  # a pending token (e.g. a bonus) fed with the verification pass
    s.forward(extra=[60, 61, 62])
    s.truncate(len(prompt) + 1)  # reject the step, keep the bonus
    assert s.cached == len(prompt) + 1 and s.cache.get_seq_length() == len(prompt) + 1
    passes = s.forward_passes
    torch.testing.assert_close(s.logits(), _fresh_logits(m, prompt + [50])[-1], atol=1e-4, rtol=1e-4)
    assert s.forward_passes == passes  # restored from the verification pass, no extra pass
    s.truncate(len(prompt))  # before the bonus: the state before the last pass
    torch.testing.assert_close(s.logits(), _fresh_logits(m, prompt)[-1], atol=1e-4, rtol=1e-4)
    out = s.forward(extra=[70, 71])
    torch.testing.assert_close(out.logits, _fresh_logits(m, prompt + [70, 71])[-2:], atol=1e-4, rtol=1e-4)


def test_hidden_states_of_a_layer(tiny_target):
    m = tiny_target
    s = Stream(m, [5, 6, 7])
    out = s.forward(hidden_layer=1)
    with torch.no_grad():
        ref = m.model(torch.tensor([[5, 6, 7]]), output_hidden_states=True).hidden_states[1][0]
    torch.testing.assert_close(out.hidden, ref, atol=1e-5, rtol=1e-5)


def test_keep_for_computes_only_the_rows_needed_and_still_rolls_back(tiny_target):
    m = tiny_target
    prompt = list(range(5, 25))
    s = Stream(m, prompt)
    s.forward(keep_for=[])
    s.append([50])  # pending bonus token
    pre = len(s.ids)
    out = s.forward(extra=[60, 61, 62], keep_for=[pre])
    assert out.rows == [0, 3] and out.logits.shape[0] == 2
    full = _fresh_logits(m, prompt + [50, 60, 61, 62])
    torch.testing.assert_close(s.next_logits, full[-1], atol=1e-4, rtol=1e-4)
    passes = s.forward_passes
    s.truncate(pre)  # reject the step, keep the bonus: its logits came from the same pass
    torch.testing.assert_close(s.logits(), full[-4], atol=1e-4, rtol=1e-4)
    assert s.forward_passes == passes


def test_reduced_vocabulary_restricts_predictions_to_its_tokens(tiny_target):
    import dataclasses

    allowed = torch.tensor([3, 7, 11, 40, 41])
    sub = dataclasses.replace(tiny_target, vocab_ids=allowed)
    prompt = list(range(5, 25))
    out = Stream(sub, prompt).forward(extra=[30, 31], keep_for=[])
    full = _fresh_logits(tiny_target, prompt + [30, 31])[-1]
    assert torch.isinf(out.logits[-1]).sum() == full.shape[0] - len(allowed)
    torch.testing.assert_close(out.logits[-1][allowed], full[allowed], atol=1e-4, rtol=1e-4)


def test_refeed_from_recomputes_states_and_logits(tiny_target):
    m = tiny_target
    prompt = list(range(5, 25))
    s = Stream(m, prompt)
    first = s.forward(extra=[30, 31], hidden_layer=1)
    s.refeed_from(len(prompt))  # the last two tokens run again on the next pass
    assert s.next_logits is None and s.pending == [30, 31] and s.ids == prompt + [30, 31]
    again = s.forward(hidden_layer=1)
    assert again.start == len(prompt)
    torch.testing.assert_close(again.hidden, first.hidden[-2:], atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(s.next_logits, first.logits[-1], atol=1e-5, rtol=1e-5)
    with pytest.raises(ValueError):
        s.refeed_from(len(s.ids) + 1)
