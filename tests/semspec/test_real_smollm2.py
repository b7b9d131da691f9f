"""Integration with the real embedded target (SmolLM2-135M-Instruct); short generations."""

from __future__ import annotations

import pytest
import torch

from semspec.engine import Engine
from semspec.models import encode_prompt, truncated_copy
from semspec.probes import ProbePair
from semspec.types import GenerationConfig

pytestmark = [pytest.mark.slow, pytest.mark.real_model]

QUESTION = (
    "Janet's ducks lay 16 eggs per day. She eats three for breakfast every morning and bakes "
    "muffins for her friends every day with four. She sells the remainder at the farmers' market "
    "daily for $2 per fresh duck egg. How much in dollars does she make every day?"
)
N = 24


@pytest.fixture(scope="module")
def pair(smollm2):
    return smollm2, truncated_copy(smollm2, 6)


def test_real_target_methods(pair):
    target, draft = pair
    ar = Engine(target).generate(QUESTION, GenerationConfig(method="ar", max_new_tokens=N))
    assert ar.counters.generated_tokens == N and ar.text.strip()
    assert ar.models["target"].endswith(target.identity.sha256)

    # same tokens as transformers' own greedy generate
    ids = torch.tensor([encode_prompt(target.tokenizer, QUESTION)])
    with torch.no_grad():
        hf = target.model.generate(ids, max_new_tokens=N, do_sample=False)
    assert target.tokenizer.decode(hf[0, ids.shape[1]:], skip_special_tokens=True) == ar.text

    sd = Engine(target, draft).generate(QUESTION, GenerationConfig(method="token_sd", max_new_tokens=N))
    assert sd.text == ar.text and sd.counters.accepted_tokens > 0

    rej = Engine(target, draft, ProbePair.always_reject(576, 576))
    r = rej.generate(QUESTION, GenerationConfig(method="semspec", max_new_tokens=N, max_step_tokens=12))
    assert r.text == ar.text

    acc = Engine(target, draft, ProbePair.always_accept(576, 576))
    a = acc.generate(QUESTION, GenerationConfig(method="semspec", max_new_tokens=N, max_step_tokens=12))
    assert a.counters.steps_accepted > 0 and a.counters.generated_tokens <= N

    j = acc.generate(QUESTION, GenerationConfig(method="step_judge", max_new_tokens=N, max_step_tokens=12))
    assert j.counters.steps_drafted > 0
    assert all(s.judge_score is not None for s in j.steps if s.decision in ("accepted", "rejected"))


def test_embedded_defaults_load_and_decode():
    from semspec.components import embedded_draft_available
    from semspec.probes import embedded_probes_available

    if not embedded_draft_available():
        pytest.skip("no embedded draft shipped")
    e = Engine.load()
    assert e.draft is not None and e.same_tokenizer
    assert (e.probes is not None) == embedded_probes_available()
    if e.probes is None:
        return
    assert set(e.identities) == {"target", "draft", "target_probe", "draft_probe", "dtype", "engine"}
    r = e.generate(QUESTION, GenerationConfig(method="semspec", max_new_tokens=16, step_delimiter="\n",
                                              max_step_tokens=8))
    assert r.counters.generated_tokens == 16 and r.counters.steps_drafted > 0
    assert all(0 <= s.p_target <= 1 and 0 <= s.p_draft <= 1 for s in r.steps if s.p_target is not None)
