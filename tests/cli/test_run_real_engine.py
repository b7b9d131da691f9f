"""`semjobs run` end to end with the REAL engine (vLLM) and the real embedded SmolLM2 target,
on SQLite, in a subprocess: a few GSM8K questions, a small max-new-tokens."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
from sqlalchemy import create_engine, func, select, pool

from semjobs.db.models import Item, ItemStats, Job, Output, StepLog
from semspec.assets import GSM8K_TEST
from tests.conftest import ROOT, require_vllm, run_cli

pytestmark = [pytest.mark.slow, pytest.mark.real_model]

GSM8K = Path(os.environ.get("SEMJOBS_GSM8K", GSM8K_TEST))

def test_semjobs_run_with_real_smollm2(tmp_path):
    require_vllm()
    if not GSM8K.exists():
        pytest.skip(f"{GSM8K} not found (set SEMJOBS_GSM8K)")
    src = tmp_path / "gsm8k3.jsonl"
    with open(GSM8K) as f, open(src, "w") as out:
        for i, line in enumerate(f):
            if i == 3:
                break
            q = json.loads(line)
            out.write(json.dumps({"id": f"gsm8k-{i}", "prompt": q["question"],
                                  "answer": q["answer"].split("####")[-1].strip()}) + "\n")
    db = tmp_path / "run.sqlite"
    out_path = tmp_path / "out.jsonl"
    env = dict(os.environ)
    for key in [k for k in env if k.startswith("SEMJOBS_") and k not in ("SEMJOBS_CACHE_DIR",)]:
        del env[key]  # the real defaults: vLLM, the embedded models
    env["PYTHONPATH"] = str(ROOT)
    proc = run_cli(["run", str(src), "-o", str(out_path), "--db", f"sqlite:///{db}",
                    "--method", "ar", "--max-new-tokens", "12"], env, timeout=900)
    job_id = proc.stdout.strip().splitlines()[-1]

    lines = [json.loads(line) for line in open(out_path)]
    assert [line["id"] for line in lines] == ["gsm8k-0", "gsm8k-1", "gsm8k-2"]
    for line in lines:
        assert line["output"].strip()
        assert 0 < line["usage"]["completion_tokens"] <= 12
        assert line["usage"]["prompt_tokens"] > 0
        assert line["finish_reason"] in ("eos", "length")
        assert line["stats"]["target_forward_passes"] > 0
        assert line["models"]["target"] and line["models"]["engine"].startswith("vllm ")
        assert line["meta"]["answer"]  # extra input fields travel to the export
    assert not (tmp_path / "out.jsonl.errors.jsonl").exists()

    engine = create_engine(f"sqlite:///{db}", poolclass=pool.NullPool)
    with engine.connect() as conn:
        job = conn.execute(select(Job).where(Job.id == job_id)).one()
        assert job.status == "completed" and job.method == "ar"
        assert "sha256" in job.manifest["identities"]["target"]
        assert conn.scalar(select(func.count()).select_from(Output)) == 3
        assert conn.scalar(select(func.count()).select_from(ItemStats)) == 3
        assert conn.scalar(select(func.count()).select_from(Item).where(Item.status == "done")) == 3
        gen = conn.scalar(select(func.sum(ItemStats.generated_tokens)))
        assert gen == sum(line["usage"]["completion_tokens"] for line in lines)
        assert conn.scalar(select(func.count()).select_from(StepLog)) >= 3
    engine.dispose()

    # status reads the same SQLite file
    st = json.loads(run_cli(["status", job_id, "--json", "--db", f"sqlite:///{db}"], env).stdout)
    assert st["status"] == "completed" and st["counts"]["done"] == 3
