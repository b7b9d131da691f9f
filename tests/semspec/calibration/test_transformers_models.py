"""Calibration's sampling with transformers' forward (semspec.calibration.transformers_models):
the engine's step rule, one batch of N sharing the prefix, a reduced vocabulary, trace caps."""

import torch

from semspec.calibration.collect import CollectConfig
from semspec.calibration.transformers_models import generate_trace, sample_steps
from semspec.prompts import encode_prompt


def test_sample_steps_batch_matches_engine_step_rule(pair):
    target, _ = pair
    ids = encode_prompt(target.tokenizer, "How many clips did Natalia sell?")
    g = torch.Generator().manual_seed(0)
    steps = sample_steps(target, ids, 6, 0.6, 0.95, "\n\n", 12, g)
    assert len(steps) == 6
    for s in steps:
        assert len(s.tokens) <= 12
        assert s.end in ("delimiter", "eos", "cap", "think_end", "length")
        assert s.text == target.tokenizer.decode(s.tokens, skip_special_tokens=False)
        if s.end == "delimiter":
            assert s.text.rstrip(" ").endswith("\n\n") or "\n\n" in s.text
    # Greedy rows of one batch are identical and equal a batch of one.
    greedy = sample_steps(target, ids, 3, 0.0, 1.0, "\n\n", 12)
    single = sample_steps(target, ids, 1, 0.0, 1.0, "\n\n", 12)
    assert greedy[0].tokens == greedy[1].tokens == greedy[2].tokens == single[0].tokens


def test_a_reduced_vocabulary_draft_samples_only_its_tokens(pair):
    import dataclasses

    _, draft = pair
    allowed = torch.arange(0, draft.vocab_size, 3)
    reduced = dataclasses.replace(draft, vocab_ids=allowed)
    ids = encode_prompt(draft.tokenizer, "How many clips did Natalia sell?")
    steps = sample_steps(reduced, ids, 4, 1.0, 1.0, "\n\n", 10, torch.Generator().manual_seed(0))
    drawn = {t for s in steps for t in s.tokens}
    assert drawn and drawn <= set(allowed.tolist())


def test_generate_trace_respects_caps(pair):
    target, _ = pair
    cfg = CollectConfig(max_step_tokens=8, max_trace_tokens=60, max_trace_steps=3)
    assert 1 <= len(generate_trace(target, encode_prompt(target.tokenizer, "Weng earns $12 an hour."), cfg)) <= 3
    cfg = CollectConfig(max_step_tokens=8, max_trace_tokens=16, max_trace_steps=10)
    assert 1 <= len(generate_trace(target, encode_prompt(target.tokenizer, "Weng earns $12 an hour."), cfg)) <= 2
