"""worker.engine: which engine serves a request, and that one a chunk decodes with is never
dropped under it."""

from __future__ import annotations

import pytest

from semjobs.settings import settings
from worker import engine as engines

from tests.fake_engine import InstantEngine

# doors to the instant double, one per factory (nothing here needs real decoding)
load_as_vllm = load_as_vllm_steps = load_as_embedded = InstantEngine.load


@pytest.fixture
def vllm_double(monkeypatch):
    monkeypatch.setattr(engines, "FACTORIES", {"vllm": f"{__name__}:load_as_vllm",
                                               "embedded": f"{__name__}:load_as_embedded"})
    monkeypatch.setattr(settings, "engine", "vllm")
    monkeypatch.setattr(settings, "engine_factory", None)
    monkeypatch.setattr(engines, "_cache", {})
    monkeypatch.setattr(engines, "_users", {})


def test_a_vllm_engine_for_token_sd_drafts_the_jobs_count(vllm_double):
    _, extra = engines.factory_for("token_sd", 6)
    assert extra["speculative_tokens"] == 6
    assert "speculative_tokens" not in engines.factory_for("ar", 6)[1]


def test_an_engine_in_use_is_not_swapped_away(vllm_double):
    with engines.in_use("ar") as ar:
        with pytest.raises(engines.EngineBusy):
            engines.get_engine("token_sd", 4)
        assert engines.get_engine("ar") is ar  # the same request is served meanwhile
    speculating = engines.get_engine("token_sd", 4)
    assert speculating is not ar and list(engines._cache) == [engines.engine_key(*engines.factory_for("token_sd", 4))]


def test_a_worker_holds_one_vllm_engine_and_one_embedded(vllm_double, monkeypatch):
    ar = engines.get_engine("ar")
    monkeypatch.setattr(settings, "engine", "embedded")
    embedded = engines.get_engine("semspec")
    monkeypatch.setattr(settings, "engine", "vllm")
    assert engines.get_engine("ar") is ar and embedded is not ar and len(engines._cache) == 2


def test_auto_keeps_sampled_token_sd_off_vllms_cpu_build(monkeypatch):
    """vLLM's CPU build keeps almost no drafted token when it samples: auto runs sampled
    token_sd with the head on the embedded engine there, greedy on vLLM; ngram, which only
    vLLM drafts with, stays on vLLM."""
    from semspec import vllm_speculation

    monkeypatch.setattr(settings, "engine", "auto")
    monkeypatch.setattr(settings, "target_model", None)
    monkeypatch.setattr(settings, "draft_model", None)  # the embedded head
    monkeypatch.setattr(vllm_speculation, "sampled_verification_works", lambda device: False)
    monkeypatch.setattr("semspec.vllm_engine.vllm_installed", lambda: True)
    assert engines.backend("token_sd", sampled=False) == "vllm"
    assert engines.backend("token_sd", sampled=True) == "embedded"
    assert engines.backend("ar", sampled=True) == "vllm"
    monkeypatch.setattr(settings, "draft_model", "ngram")
    assert engines.backend("token_sd", sampled=True) == "vllm"
    monkeypatch.setattr(settings, "draft_model", "embedded:smollm2-135m-draft")
    assert engines.backend("token_sd", sampled=False) == "embedded"


def test_the_step_level_methods_load_vllms_target_and_draft_pair_beside_ar(vllm_double, monkeypatch):
    """semspec and step_judge run on semspec.vllm_steps (a target and a draft engine); a
    worker keeps that pair beside its ar engine instead of swapping one for the other."""
    monkeypatch.setattr(engines, "VLLM_STEPS_FACTORY", f"{__name__}:load_as_vllm_steps")
    for method in ("semspec", "step_judge"):
        factory, extra = engines.factory_for(method)
        assert factory == engines.VLLM_STEPS_FACTORY and "speculative_tokens" not in extra
    ar = engines.get_engine("ar")
    steps = engines.get_engine("semspec")
    assert engines.get_engine("step_judge") is steps and engines.get_engine("ar") is ar and steps is not ar
    monkeypatch.setattr(settings, "engine", "auto")
    monkeypatch.setattr("semspec.vllm_engine.vllm_installed", lambda: True)
    assert engines.backend("semspec") == engines.backend("step_judge") == "vllm"
    monkeypatch.setattr(settings, "draft_model", "embedded:smollm2-135m-head")  # drafts from the target's states
    assert engines.backend("semspec") == engines.backend("step_judge") == "embedded"
    monkeypatch.setattr(settings, "draft_model", None)
    monkeypatch.setattr("semspec.vllm_engine.vllm_installed", lambda: False)
    assert engines.backend("semspec") == "embedded"
