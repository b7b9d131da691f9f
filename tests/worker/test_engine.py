"""semjobs.worker.engine: which engine serves a request, and that one a chunk decodes with is never
dropped under it."""

from __future__ import annotations

import pytest

from semjobs.settings import settings
from semjobs.worker import engine as engines


def test_a_vllm_engine_for_token_sd_drafts_the_jobs_count(vllm_double):
    _, extra = engines.factory_for("token_sd", 6)
    assert extra["speculative_tokens"] == 6
    assert "speculative_tokens" not in engines.factory_for("ar", 6)[1]


def test_the_draft_max_batch_setting_reaches_token_sds_engine(vllm_double, monkeypatch):
    """SEMJOBS_DRAFT_MAX_BATCH limits token_sd's drafting as the step methods' (unset: the
    engine's own choice, two requests on a CPU)."""
    assert "draft_max_batch" not in engines.factory_for("token_sd", 4)[1]
    monkeypatch.setattr(settings, "draft_max_batch", 0)
    assert engines.factory_for("token_sd", 4)[1]["draft_max_batch"] == 0
    assert "draft_max_batch" not in engines.factory_for("ar", 4)[1]


def test_an_engine_in_use_is_not_swapped_away(vllm_double):
    with engines.in_use("ar") as ar:
        with pytest.raises(engines.EngineBusy):
            engines.get_engine("token_sd", 4)
        assert engines.get_engine("ar") is ar  # the same request is served meanwhile
    speculating = engines.get_engine("token_sd", 4)
    assert speculating is not ar and list(engines._cache) == [engines.engine_key(*engines.factory_for("token_sd", 4))]


def test_the_step_level_methods_load_vllms_target_and_draft_pair_beside_ar(vllm_double):
    """semspec and step_judge run on semspec.engine.step_engine (a target and a draft engine); a
    worker keeps that pair beside its ar engine instead of swapping one for the other."""
    for method in ("semspec", "step_judge"):
        factory, extra = engines.factory_for(method)
        assert factory == engines.VLLM_STEPS_FACTORY and "speculative_tokens" not in extra
    ar = engines.get_engine("ar")
    steps = engines.get_engine("semspec")
    assert engines.get_engine("step_judge") is steps and engines.get_engine("ar") is ar and steps is not ar
