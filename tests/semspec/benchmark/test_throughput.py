"""semjobs bench --batch-size on vLLM, with both peers, on a tiny random model."""

from __future__ import annotations

import pytest

from semspec.benchmark.throughput import SweepSettings, goals, run_sweep
from tests.conftest import require_vllm

PROMPTS = [{"prompt": p, "reference": "4"} for p in ("What is 2+2?", "Name a colour.", "Count to three.")]


@pytest.mark.slow
def test_one_sweep_runs_every_method_on_vllm_beside_plain_vllm_and_transformers(tiny_vllm_dir, tiny_cache, tmp_path):
    require_vllm()
    from semspec.models.loaded import load_model
    from semspec.probes import ProbePair
    from semspec.engine.token_engine import VLLMEngine
    from semspec.engine.step_engine import VLLMStepEngine

    model = str(tiny_vllm_dir)
    probes = str(ProbePair.always_accept(256, 256).save(tmp_path / "probes"))
    loaded = []

    def load(dtype, kind):
        loaded.append(kind)
        common = dict(device="cpu", cache_dir=tiny_cache, dtype=dtype, batch_size=32, kv_cache_gb=0.25)
        if kind == "transformers":
            return load_model(model, device="cpu", cache_dir=tiny_cache, dtype=dtype)
        if kind == "steps":  # the model is its own draft
            return VLLMStepEngine.load(model, draft=model, probes=probes, **common)
        return VLLMEngine.load(model, draft="ngram", speculative_tokens=3 if kind == "token_sd" else None, **common)

    s = SweepSettings(batch_sizes=(1, 32), methods=("ar", "token_sd", "vllm_generate", "hf_generate", "semspec"),
                      max_new_tokens=12, dtype="float32", device="cpu", draft_tokens=3,
                      draft_max_batch=0)  # semspec drafts at 32 in flight too (a CPU's default pauses it)
    result = run_sweep(load, PROMPTS, s, loglik=lambda prompt, text: -float(len(text)))
    assert sorted(loaded) == ["ar", "steps", "token_sd", "transformers"]  # each loaded once, for both sizes
    for bs in ("1", "32"):
        row = result["by_batch_size"][bs]
        # in the order asked for; token_sd drafts with ngram, semspec with the model itself
        assert list(row) == ["ar", "token_sd", "vllm_generate", "hf_generate", "semspec"]
        assert row["hf_generate"]["engine"] == "transformers"
        assert {row[m]["engine"] for m in ("ar", "token_sd", "vllm_generate", "semspec")} == {"vllm"}
        assert row["token_sd"]["same_as_ar"] == 1.0
        assert row["semspec"]["step_acceptance"] == 1.0 and "verify" in row["semspec"]["phase_seconds"]
        # the same text as ar's (the draft is the target): no log-likelihood gap
        assert row["semspec"]["loglik_gap_vs_ar"] == 0.0 and row["ar"]["target_mean_loglik"] < 0
        # float32 greedy from the same weights: the same tokens whoever decodes them
        assert len({f["generated_tokens"] for f in row.values()}) == 1
        assert all(f["same_as_batch_1"] == 1.0 and f["tokens_per_s"] > 0 for f in row.values())
    g = result["goals"]
    assert g["ar_vllm_b32_over_vllm_generate_b32"] > 0 and g["ar_b32_over_hf_generate_b32"] > 0
    assert g["token_sd_vllm_over_ar_vllm_b1"] > 0 and g["semspec_over_ar_b32"] > 0


def test_goals_are_ratios_where_both_sides_ran():
    by_batch = {"1": {"ar": {"tokens_per_s": 10.0}, "semspec": {"tokens_per_s": 15.0}},
                "32": {"ar": {"tokens_per_s": 80.0}, "vllm_generate": {"tokens_per_s": 100.0}}}
    g = goals(by_batch)
    assert g["semspec_over_ar_b1"] == 1.5 and g["ar_vllm_b32_over_vllm_generate_b32"] == 0.8
    assert g["ar_b32_over_hf_generate_b32"] is None and g["token_sd_vllm_over_ar_vllm_b32"] is None
    assert not any("embedded" in k for k in g)
