"""Probe calibration as a bulk job, for real: `semjobs probe collect --submit` puts GSM8K
questions on the queue, a REAL Celery worker with the embedded pair loaded (SmolLM2 + the
layer draft, on vLLM as it decodes semspec, storing the calibration's layers) collects each
one into Postgres, `semjobs probe merge --calibration` writes them out, and what comes out
equals `semjobs probe collect` run in process with the same settings: same prefixes, same
sampled steps, the same features."""

from __future__ import annotations

import json

import pytest
import torch
from safetensors.torch import load_file

from semspec.assets import GSM8K_TEST
from semspec.calibration.store import CalibrationStore
from tests.conftest import require_vllm, run_cli, wait_for

pytestmark = [pytest.mark.slow, pytest.mark.real_model]

SETTINGS = ["--prompts", str(GSM8K_TEST), "--skip-lines", "100", "--limit-prompts", "2", "--samples", "2",
            "--max-trace-steps", "2", "--max-trace-tokens", "64", "--max-step-tokens", "24",
            "--step-delimiter", "\n", "--seed", "3"]


def failures(env, cal_id) -> list[str]:
    """Why the calibration's failed questions failed."""
    from sqlalchemy import select

    from semjobs.db.models import CalibrationQuestion as Q
    from semjobs.db.session import session_factory

    with session_factory(env["SEMJOBS_DATABASE_URL"])() as s:
        return list(s.scalars(select(Q.error).where(Q.calibration_id == cal_id, Q.status == "failed")))


def test_workers_collect_what_collect_in_process_collects(service_env, workers, tmp_path):
    require_vllm()
    # the deployment's own engine (no stand-in factory): semspec's on vLLM
    env = {**service_env, "SEMJOBS_ENGINE_FACTORY": "", "SEMJOBS_DTYPE": "float32", "SEMJOBS_THREADS": "1"}
    bad = run_cli(["probe", "collect", *SETTINGS, "--submit", "--out", str(tmp_path / "x")], env, check=False)
    assert bad.returncode == 2 and "--out cannot go with --submit" in bad.stderr
    head = {**env, "SEMJOBS_DRAFT_MODEL": "embedded:smollm2-135m-head"}  # drafts tokens, not steps
    bad = run_cli(["probe", "collect", *SETTINGS, "--submit"], head, check=False)
    assert bad.returncode == 2 and "drafts tokens for token_sd" in bad.stderr
    cal_id = run_cli(["probe", "collect", *SETTINGS, "--submit"], env).stdout.strip().splitlines()[-1]
    workers.env = env
    workers.start("cal")

    def status():
        return json.loads(run_cli(["probe", "status", cal_id], env).stdout)

    st = wait_for(lambda: (s := status())["pending"] == s["running"] == 0 and s, 600, interval=2,
                  what="the calibration")
    assert (st["done"], st["failed"]) == (2, 0) and st["prefixes"] >= 2, failures(service_env, cal_id)

    out = tmp_path / "from_workers"
    run_cli(["probe", "merge", str(out), "--calibration", cal_id], env)
    ref = tmp_path / "in_process"
    run_cli(["probe", "collect", *SETTINGS, "--draft", "embedded:smollm2-135m-draft", "--threads", "1",
             "--out", str(ref)], env)

    got, want = CalibrationStore(out), CalibrationStore(ref)
    assert got.keys() == want.keys() and len(got.keys()) == st["prefixes"]
    assert got.load_traces() == want.load_traces()
    for key in want.keys():
        assert (got.prefix_dir / f"{key}.json").read_bytes() == (want.prefix_dir / f"{key}.json").read_bytes()
        a, b = (load_file(str(s.prefix_dir / f"{key}.safetensors")) for s in (got, want))
        assert a.keys() == b.keys() == {"target", "draft"}
        for role in a:
            torch.testing.assert_close(a[role], b[role], atol=1e-4, rtol=1e-4)
    assert got.meta()["samples"] == 2 and got.meta()["calibration"] == cal_id
    assert got.meta()["engine"] == want.meta()["engine"] and got.meta()["engine"].startswith("vllm ")
