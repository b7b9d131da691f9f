"""`semjobs compare`: two jobs of one input side by side (jobs/compare.py), on SQLite with the
instant test double, the outputs scored by a tiny random target."""

from __future__ import annotations

import json

import pytest
from click.testing import CliRunner

from semjobs.cli.main import main
from tests.conftest import ROOT

SRC = ROOT / "examples" / "prompts.jsonl"


def invoke(*args):
    return CliRunner().invoke(main, [str(a) for a in args], catch_exceptions=False)


@pytest.fixture
def scored(tmp_path, fake_engine, monkeypatch):
    """The test double decodes; the jobs name a tiny random target, which scores the outputs."""
    from semjobs.settings import settings
    from tests.tiny_models import tiny_model_dir

    target = tiny_model_dir(tmp_path / "target", seed=0)
    monkeypatch.setattr(settings, "target_model", str(target))
    monkeypatch.setattr(settings, "check_prompt_lengths", False)  # the double serves any method
    return target


def run_job(db, out, *args, src=SRC):
    res = invoke("run", src, "-o", out, "--db", db, "--max-new-tokens", 8, *args)
    assert res.exit_code == 0, res.output
    return res.output.strip().splitlines()[-1]


def test_a_method_against_ar_on_one_input(scored, sqlite_db, tmp_path):
    from semjobs.jobs.compare import compare_jobs
    from semspec.models.loaded import load_model
    from semspec.quality import target_mean_loglik

    ar = run_job(sqlite_db, tmp_path / "ar.jsonl")
    semspec = run_job(sqlite_db, tmp_path / "semspec.jsonl", "--method", "semspec")
    res = invoke("compare", ar, semspec, "--db", sqlite_db)
    assert res.exit_code == 0, res.output
    line = res.stdout.strip()  # the target's loading bar goes to stderr
    assert line.startswith("semspec vs ar on the same 3 sample(s):") and "50% of drafted steps kept" in line

    got = compare_jobs(ar, semspec, url=sqlite_db)
    target = load_model(str(scored), device="cpu")
    rows = [json.loads(x) for x in open(tmp_path / "ar.jsonl")]
    prompts = {json.loads(x)["id"]: json.loads(x)["prompt"] for x in open(SRC)}
    want = sum(target_mean_loglik(target, prompts[r["id"]], r["output"]) for r in rows) / len(rows)
    assert got.a.mean_loglik == pytest.approx(want, abs=1e-6) and got.a.mean_loglik < 0
    assert got.loglik_gap == pytest.approx(0.0, abs=1e-9)  # the double writes the same text for both
    assert f"gap {got.loglik_gap:.3f}" in line
    assert got.speedup == pytest.approx(got.b.tokens_per_s / got.a.tokens_per_s)
    kept = sum(r["kept"] for r in rows)  # the double writes the same text for both: as many kept
    assert (got.a.kept, got.a.done, got.b.kept) == (kept, 3, kept) and f"samples kept {kept}/3 vs {kept}/3," in line


def test_jobs_of_other_inputs_are_refused_and_the_score_can_be_skipped(scored, sqlite_db, tmp_path):
    first = run_job(sqlite_db, tmp_path / "a.jsonl")
    other = tmp_path / "other.jsonl"
    other.write_text(json.dumps({"id": "x", "prompt": "What is one plus one?"}) + "\n")
    second = run_job(sqlite_db, tmp_path / "b.jsonl", src=other)
    res = CliRunner().invoke(main, ["compare", first, second, "--db", sqlite_db])
    assert res.exit_code == 1 and "different inputs" in res.output
    res = CliRunner().invoke(main, ["compare", first, "no-such-job", "--db", sqlite_db])
    assert res.exit_code == 1 and "no job 'no-such-job'" in res.output
    again = run_job(sqlite_db, tmp_path / "c.jsonl", "--method", "step_judge")
    res = invoke("compare", first, again, "--db", sqlite_db, "--no-loglik")
    assert res.exit_code == 0 and "target log-likelihood not measured" in res.output


def test_several_jobs_each_against_the_first(scored, sqlite_db, tmp_path):
    ar = run_job(sqlite_db, tmp_path / "ar.jsonl")
    token_sd = run_job(sqlite_db, tmp_path / "token_sd.jsonl", "--method", "token_sd")
    semspec = run_job(sqlite_db, tmp_path / "semspec.jsonl", "--method", "semspec")
    res = invoke("compare", ar, token_sd, semspec, "--db", sqlite_db)
    assert res.exit_code == 0, res.output
    lines = res.stdout.strip().splitlines()
    assert [line.split(" on ")[0] for line in lines] == ["token_sd vs ar", "semspec vs ar"]
