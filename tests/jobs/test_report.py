"""`semjobs report`: the PNGs, the Markdown figures and the manifest of a job, from the
database alone (SQLite, the instant test-double engine)."""

import json
from collections import Counter

import pytest
from click.testing import CliRunner

from semjobs.cli.main import main
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


def _add_steps(url, job_id, steps):
    """Log ``steps`` (step index, author, decision, target tokens, reason) on the job's first item."""
    from sqlalchemy import select

    from semjobs.db.models import Item, StepLog
    from semjobs.db.session import session_factory

    with session_factory(url)() as session:
        item = session.scalars(select(Item).where(Item.job_id == job_id).order_by(Item.id)).first()
        for index, author, decision, tokens, reason in steps:
            session.add(StepLog(item_pk=item.id, job_id=job_id, step_index=index, author=author, text="x",
                                drafted_tokens=0, accepted_tokens=0, decision=decision, seconds=0.0,
                                target_tokens=tokens, reason=reason))
        session.commit()


def _run_job(tmp_path, sqlite_db):
    res = invoke("run", ROOT / "examples" / "prompts.jsonl", "-o", tmp_path / "o.jsonl", "--db", sqlite_db)
    return res.output.strip().splitlines()[-1]


def test_the_figures_count_why_the_target_wrote_undrafted_steps(tmp_path, sqlite_db, fake_engine):
    from semjobs.jobs.report import StepFigures, markdown
    from semjobs.jobs.status import job_status

    st = job_status(_run_job(tmp_path, sqlite_db), url=sqlite_db)
    figures = StepFigures(decisions=Counter(accepted=1, target_only=3), reasons=Counter(backoff=2, answer=1))
    md = markdown(st, figures)
    assert "| target-only steps by reason | answer 1, backoff 2 |" in md
    assert "| steps by decision | accepted 1, target_only 3 |" in md


@pytest.mark.parametrize("database", ["sqlite_db", "pg_db"])
def test_the_step_figures_are_counted_in_the_database(tmp_path, database, request, fake_engine):
    from semjobs.db import repo
    from semjobs.db.session import session_factory
    from semjobs.jobs.report import MAX_POSITION, StepFigures

    url = request.getfixturevalue(database)
    job_id = _run_job(tmp_path, url)  # 3 items, each a kept draft at step 0, a rejected one at 1
    _add_steps(url, job_id, [
        (100, "draft", "accepted", 7, None), (101, "draft", "rejected", 9, None),  # beyond the last bar
        (102, "target", "target_only", 5, "backoff"), (103, "target", "target_only", 5, "backoff"),
        (104, "target", "target_only", 3, "answer"), (105, "target", "target_only", None, "answer"),
    ])
    with session_factory(url)() as session:
        counts = repo.step_counts(session, job_id, MAX_POSITION)
    f = StepFigures.of(counts)
    assert max(pos for pos, _ in counts.by_position) == MAX_POSITION
    assert f.drafted == Counter({0: 3, 1: 3, MAX_POSITION: 2})
    assert f.kept == Counter({0: 3, 1: 0, MAX_POSITION: 1})
    assert f.decisions == Counter(accepted=4, rejected=4, target_only=4)
    assert f.reasons == Counter(backoff=2, answer=2)
    # lengths: only steps whose target-token count is known; a rejected draft's is not a kept length
    assert f.kept_lengths[7] == 1 and 9 not in f.kept_lengths
    assert f.written_lengths[5] == 2 and f.written_lengths[3] == 1 and None not in f.written_lengths
    assert sum(f.kept_lengths.values()) == 4


def test_the_throughput_bars_are_tokens_per_second_over_each_items_wall_time():
    from datetime import datetime, timedelta, timezone

    from semjobs.jobs.report import throughput_series

    t0 = datetime(2025, 1, 1, tzinfo=timezone.utc)
    at = lambda s: t0 + timedelta(seconds=s)  # noqa: E731
    # two items decoded side by side for 10 s, 100 tokens each: 20 tokens/s all along, not
    # 200 tokens in the second they finished
    width, rates = throughput_series([(at(10), 100, 10.0), (at(10), 100, 10.0)], t0)
    assert width == 1.0 and rates == pytest.approx([20.0] * 10)
    # a long job: 30 bars; one item per minute, each decoded in its minute at 1 token/s
    width, rates = throughput_series([(at(60 * (i + 1)), 60, 60.0) for i in range(60)], t0)
    assert width == 120.0 and rates == pytest.approx([1.0] * 30)
    # every token is in a bar: an item without wall time counts where it finished, and one whose
    # wall time reaches back before the job's start (another clock) within the job
    width, rates = throughput_series([(at(1.5), 7, 0.0), (at(4), 30, 9.0)], t0)
    assert sum(rates) * width == pytest.approx(37) and rates == pytest.approx([7.5, 7.5 + 7, 7.5, 7.5])


def test_an_existing_report_is_replaced_only_with_force_and_never_through_a_link(tmp_path, sqlite_db, fake_engine):
    job_id = _run_job(tmp_path, sqlite_db)
    out = tmp_path / "report"
    out.mkdir()
    precious = tmp_path / "precious.md"
    precious.write_text("keep me\n")
    (out / "report.md").symlink_to(precious)
    res = invoke("report", job_id, "-o", out, "--db", sqlite_db)
    assert res.exit_code == 1 and "report.md exists" in res.output and "--force" in res.output
    assert not (out / "throughput.png").exists()  # refused before anything was written
    res = invoke("report", job_id, "-o", out, "--db", sqlite_db, "--force")
    assert res.exit_code == 0, res.output
    assert not (out / "report.md").is_symlink() and job_id in (out / "report.md").read_text()
    assert precious.read_text() == "keep me\n"
    assert sorted(p.name for p in out.iterdir()) == sorted(
        ["report.md", "step_acceptance.png", "step_lengths.png", "throughput.png", "manifest.json"])
