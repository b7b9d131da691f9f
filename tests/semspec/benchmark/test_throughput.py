"""semjobs bench --batch-size on both engines, with both peers, on a tiny random model."""

from __future__ import annotations

import pytest

from semspec.benchmark.throughput import SweepSettings, run_sweep
from tests.conftest import require_vllm

PROMPTS = [{"prompt": p, "reference": "4"} for p in ("What is 2+2?", "Name a colour.", "Count to three.")]


@pytest.mark.slow
def test_one_sweep_runs_semjobs_on_vllm_plain_vllm_and_the_embedded_engine(tiny_vllm_dir, tiny_cache, tmp_path):
    require_vllm()
    from semspec.engine import Engine
    from semspec.probes import ProbePair
    from semspec.vllm_engine import VLLMEngine
    from semspec.vllm_steps import VLLMStepEngine

    model = str(tiny_vllm_dir)
    probes = str(ProbePair.always_accept(256, 256).save(tmp_path / "probes"))

    def load(engine, dtype, kind):
        if engine == "vllm" and kind == "steps":  # the model is its own draft
            return VLLMStepEngine.load(model, draft=model, probes=probes, device="cpu", cache_dir=tiny_cache,
                                       dtype=dtype, batch_size=32, kv_cache_gb=0.25)
        if engine == "vllm":
            return VLLMEngine.load(model, draft="ngram", device="cpu", cache_dir=tiny_cache, dtype=dtype,
                                   batch_size=32, kv_cache_gb=0.25, speculative_tokens=3 if kind else None)
        return Engine.load(model, draft="none", device="cpu", cache_dir=tiny_cache, dtype="float32")

    s = SweepSettings(batch_sizes=(1, 32), methods=("ar", "token_sd", "vllm_generate", "hf_generate", "semspec"),
                      max_new_tokens=12, dtype="float32", device="cpu", engines=("vllm", "embedded"), draft_tokens=3,
                      draft_max_batch=0)  # semspec drafts at 32 in flight too (a CPU's default pauses it)
    result = run_sweep(load, PROMPTS, s, loglik=lambda prompt, text: -float(len(text)))
    for bs in ("1", "32"):
        row = result["by_batch_size"][bs]
        # this embedded engine has no draft (no token_sd, no semspec); on vLLM token_sd drafts
        # with ngram, semspec with the model itself, each on engines of their own
        assert set(row) == {"ar@vllm", "token_sd@vllm", "semspec@vllm", "vllm_generate", "ar@embedded", "hf_generate"}
        assert {row[m]["engine"] for m in ("ar@vllm", "vllm_generate", "token_sd@vllm", "semspec@vllm")} == {"vllm"}
        assert row["token_sd@vllm"]["same_as_ar"] == 1.0
        assert row["semspec@vllm"]["step_acceptance"] == 1.0 and "verify" in row["semspec@vllm"]["phase_seconds"]
        # the same text as ar's (the draft is the target): no log-likelihood gap
        assert row["semspec@vllm"]["loglik_gap_vs_ar"] == 0.0 and row["ar@vllm"]["target_mean_loglik"] < 0
        # float32 greedy from the same weights: the same tokens whoever decodes them
        assert len({f["generated_tokens"] for f in row.values()}) == 1
        assert all(f["same_as_batch_1"] == 1.0 and f["tokens_per_s"] > 0 for f in row.values())
    goals = result["goals"]
    assert goals["ar_vllm_b32_over_vllm_generate_b32"] > 0 and goals["ar_vllm_b32_over_ar_embedded_b32"] > 0
    assert goals["token_sd_vllm_over_ar_vllm_b1"] > 0
