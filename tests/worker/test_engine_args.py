"""semjobs.worker.engine and vLLM's engine arguments per role: which engine gets which, an
engine loaded again when they change, and the identities a job's manifest records."""

from __future__ import annotations

from semjobs.settings import settings
from semjobs.worker import engine as engines

TARGET = {"tensor_parallel_size": 2, "max_model_len": 32768}
DRAFT = {"gpu_memory_utilization": 0.1}


def test_without_engine_arguments_an_engine_keeps_its_key(vllm_double):
    """Nothing new reaches the factories, and an engine's key is what it was before engine
    arguments existed."""
    for method in ("ar", "semspec"):
        factory, extra = engines.factory_for(method)
        assert extra == {"kv_cache_gb": settings.kv_cache_gb, "compile": bool(settings.vllm_compile)}
        assert engines.engine_key(factory, extra)[0] == (factory, tuple(sorted(extra.items())))


def test_each_engine_gets_its_roles_arguments(vllm_double, monkeypatch):
    monkeypatch.setattr(settings, "target_engine_args", TARGET)
    monkeypatch.setattr(settings, "draft_engine_args", DRAFT)
    for method in ("ar", "token_sd"):  # the target's one engine
        extra = engines.factory_for(method, 4)[1]
        assert extra["engine_args"] == TARGET and "draft_engine_args" not in extra
    steps = engines.factory_for("semspec")[1]  # target, writer and draft
    assert steps["engine_args"] == TARGET and steps["draft_engine_args"] == DRAFT
    monkeypatch.setattr(settings, "engine_factory", "tests.fake_engine:InstantEngine.load")
    assert engines.factory_for("ar")[1] == {"engine_args": TARGET, "draft_engine_args": DRAFT}


def test_every_vllm_engine_gets_the_doom_rule_when_one_is_given(vllm_double, monkeypatch, tmp_path):
    """SEMJOBS_DOOM_RULE reaches the token engine and the step engines alike (each applies
    what it can: semspec.doom); an engine with another rule is another engine."""
    for method in ("ar", "token_sd", "semspec"):
        assert "doom_rule" not in engines.factory_for(method)[1]
    monkeypatch.setattr(settings, "doom_rule", tmp_path / "rule.json")
    for method in ("ar", "token_sd", "semspec"):
        factory, extra = engines.factory_for(method)
        assert extra["doom_rule"] == str(tmp_path / "rule.json")
        other = {**extra, "doom_rule": str(tmp_path / "other.json")}
        assert engines.engine_key(factory, extra) != engines.engine_key(factory, other)


def test_an_engine_loads_again_for_other_engine_arguments(vllm_double, monkeypatch):
    plain = engines.get_engine("ar")
    monkeypatch.setattr(settings, "target_engine_args", TARGET)
    given = engines.get_engine("ar")
    assert given is not plain and engines.get_engine("ar") is given


def test_identities_name_the_engine_arguments_an_engine_started_with(vllm_double, monkeypatch):
    plain = engines.get_engine("semspec")
    assert "engine_args" not in engines.identities(plain)
    monkeypatch.setattr(settings, "target_engine_args", TARGET)
    monkeypatch.setattr(settings, "draft_engine_args", DRAFT)
    ar, steps = engines.get_engine("ar"), engines.get_engine("semspec")
    assert engines.identities(ar)["engine_args"] == {"target": TARGET}
    assert engines.identities(steps) == {**steps.identities, "engine_args": {"target": TARGET, "draft": DRAFT}}
