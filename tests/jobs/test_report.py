"""`semjobs report`: the PNGs, the Markdown figures and the manifest of a job, from the
database alone (SQLite, the instant test-double engine)."""

import json

from click.testing import CliRunner

from cli.main import main
from tests.conftest import ROOT


def invoke(*args):
    return CliRunner().invoke(main, [str(a) for a in args], catch_exceptions=False)


def test_report_of_the_job_just_run(tmp_path, sqlite_db, fake_engine):
    res = invoke("run", ROOT / "examples" / "prompts.jsonl", "-o", tmp_path / "o.jsonl", "--db", sqlite_db)
    job_id = res.output.strip().splitlines()[-1]
    res = invoke("report", "-o", tmp_path / "report")  # no job, no database named: the run's
    assert res.exit_code == 0, res.output
    out = tmp_path / "report"
    for png in ("step_acceptance.png", "step_lengths.png", "throughput.png"):
        data = (out / png).read_bytes()
        assert data[:8] == b"\x89PNG\r\n\x1a\n" and len(data) > 10_000, png
    md = (out / "report.md").read_text()
    # the test double logs two steps per item: a kept draft, then a rejected one
    assert job_id in md and "accepted 3, rejected 3" in md and "| step acceptance | 0.5 |" in md
    assert json.loads((out / "manifest.json").read_text())["job"]["id"] == job_id


def test_the_figures_count_why_the_target_wrote_undrafted_steps(tmp_path, sqlite_db, fake_engine):
    from jobs.report import markdown
    from jobs.status import job_status

    res = invoke("run", ROOT / "examples" / "prompts.jsonl", "-o", tmp_path / "o.jsonl", "--db", sqlite_db)
    st = job_status(res.output.strip().splitlines()[-1], url=sqlite_db)
    steps = [(0, "target", "target_only", 5, "backoff"), (1, "target", "target_only", 5, "backoff"),
             (2, "target", "target_only", 3, "answer"), (3, "draft", "accepted", 4, None)]
    md = markdown(st, steps)
    assert "| target-only steps by reason | answer 1, backoff 2 |" in md
    assert "| steps by decision | accepted 1, target_only 3 |" in md
