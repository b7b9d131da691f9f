"""Samples with the REAL engine through REAL Celery workers: 8 GSM8K questions x `--n 4`
with the embedded SmolLM2 target on vLLM -> 32 samples in Postgres, each with its answer checked
against the question's reference; the filtered and the Batch-shape exports."""

from __future__ import annotations

import json

import pytest

from semspec.assets import GSM8K_TEST
from tests.conftest import require_vllm, run_cli
from tests.worker.test_celery_e2e import read_jsonl, submit, wait_completed

pytestmark = [pytest.mark.slow, pytest.mark.real_model]

QUESTIONS = 8
SAMPLES = 4


def test_n_samples_of_gsm8k_with_smollm2_through_celery(service_env, workers, pg_db, tmp_path):
    src = tmp_path / "gsm8k.jsonl"
    with open(GSM8K_TEST) as f, open(src, "w") as out:
        for i, line in zip(range(QUESTIONS), f):
            q = json.loads(line)  # the GSM8K answer text: its "#### N" is the reference
            out.write(json.dumps({"id": f"gsm8k-{i}", "prompt": q["question"], "answer": q["answer"]}) + "\n")
    job_id = submit(service_env, src, "--method", "ar", "--n", str(SAMPLES), "--temperature", "0.6",
                    "--max-new-tokens", "96")
    require_vllm()
    workers.start("real", env={"SEMJOBS_ENGINE_FACTORY": "", "SEMJOBS_KV_CACHE_GB": "0.5", "SEMJOBS_THREADS": "1",
                               "SEMJOBS_CHUNK_SIZE": str(SAMPLES)})
    wait_completed(pg_db, job_id, workers, timeout=900)

    out = tmp_path / "all.jsonl"
    run_cli(["export", job_id, "-o", str(out)], service_env)
    rows = read_jsonl(out)
    assert [(r["id"], r["sample"]) for r in rows] == [(f"gsm8k-{i}", s) for i in range(QUESTIONS)
                                                      for s in range(SAMPLES)]
    for r in rows:
        assert r["output"].strip() and r["reasoning"] is not None and r["content"].strip()
        # checked against its reference; a sample without an answer (not even a number: the
        # 135M model's 96 sampled tokens, float32 on an AVX2 host, once) is wrong, never unchecked
        assert r["reference"] and isinstance(r["correct"], bool)
        assert r["final_answer"] is not None or r["correct"] is False
    assert sum(r["final_answer"] is not None for r in rows) >= len(rows) * 3 // 4
    for i in range(QUESTIONS):  # each sample drew with its own seed
        assert len({r["output"] for r in rows if r["id"] == f"gsm8k-{i}"}) == SAMPLES
    right = [(r["id"], r["sample"]) for r in rows if r["correct"]]

    run_cli(["export", job_id, "-o", str(tmp_path / "right.jsonl"), "--only", "correct"], service_env)
    assert [(r["id"], r["sample"]) for r in read_jsonl(tmp_path / "right.jsonl")] == right
    run_cli(["export", job_id, "-o", str(tmp_path / "batch.jsonl"), "--format", "batch"], service_env)
    batch = read_jsonl(tmp_path / "batch.jsonl")
    assert len(batch) == QUESTIONS
    assert all([c["index"] for c in b["response"]["body"]["choices"]] == list(range(SAMPLES)) for b in batch)

    st = json.loads(run_cli(["status", job_id, "--json"], service_env).stdout)
    assert st["answers"]["samples_checked"] == QUESTIONS * SAMPLES
    assert st["answers"]["accuracy"] == round(len(right) / (QUESTIONS * SAMPLES), 4)
