"""`semjobs submit` / `semjobs run` on bad input: clear errors, non-zero exit, zero rows."""

import json

import pytest
from click.testing import CliRunner
from sqlalchemy import func, select

from cli.main import main
from db.models import Item, Job
from db.session import session_factory
from jobs.submit import store_job, job_config


def rows(url):
    with session_factory(url)() as s:
        return s.scalar(select(func.count()).select_from(Job)), s.scalar(
            select(func.count()).select_from(Item)
        )


BAD_FILES = {
    "malformed": ['{"id": 1, "prompt": "ok"}', '{"id": 2, "prompt": '],
    "missing_id": ['{"id": 1, "prompt": "ok"}', '{"prompt": "no id"}'],
    "duplicate_id": ['{"id": "a", "prompt": "ok"}', '{"id": "a", "prompt": "again"}'],
    "wrong_type": ['{"id": 1, "prompt": ["not", "a", "string"]}'],
    "empty_prompt": ['{"id": 1, "prompt": "ok"}', '{"id": 2, "prompt": ""}'],
    "over_long": ['{"id": 1, "prompt": "ok"}', json.dumps({"id": 2, "prompt": "x" * 3000})],
    # about 9,000 tokens for SmolLM2, whose context is 8,192 (the embedded target's tokenizer tells)
    "beyond_context": ['{"id": 1, "prompt": "ok"}', json.dumps({"id": 2, "prompt": " ".join(["apple"] * 9000)})],
}


@pytest.fixture(params=["postgres", "sqlite"])
def db_url(request):
    return request.getfixturevalue("pg_db" if request.param == "postgres" else "sqlite_db")


@pytest.mark.parametrize("case", sorted(BAD_FILES))
def test_submit_bad_input_writes_nothing(case, pg_db, tmp_path, monkeypatch):
    from semjobs.settings import settings

    monkeypatch.setattr(settings, "database_url", pg_db)
    monkeypatch.setattr(settings, "max_line_bytes", 60_000 if case == "beyond_context" else 2000)
    monkeypatch.setattr(settings, "redis_url", "redis://127.0.0.1:1/0")  # never reached
    p = tmp_path / f"{case}.jsonl"
    p.write_text("\n".join(BAD_FILES[case]) + "\n")
    res = CliRunner().invoke(main, ["submit", str(p)])
    assert res.exit_code == 2, res.output
    assert "line 2" in res.output or "line 1" in res.output
    assert "nothing was stored" in res.output
    assert rows(pg_db) == (0, 0)


def test_run_bad_input_writes_nothing(sqlite_db, tmp_path):
    p = tmp_path / "bad.jsonl"
    p.write_text('{"id": 1, "prompt": "ok"}\n{"id": 1, "prompt": "dup"}\n')
    res = CliRunner().invoke(main, ["run", str(p), "-o", str(tmp_path / "o.jsonl"),
                                    "--db", sqlite_db])
    assert res.exit_code == 2
    assert "line 2, field 'id': duplicate id '1' (first on line 1)" in res.output
    assert rows(sqlite_db) == (0, 0)
    assert not (tmp_path / "o.jsonl").exists()


def test_store_job_streams_items_in_batches(db_url, tmp_path, monkeypatch):
    from semjobs.settings import settings

    monkeypatch.setattr(settings, "insert_batch_size", 7)
    p = tmp_path / "in.jsonl"
    with open(p, "w") as f:
        for i in range(50):
            f.write(json.dumps({"id": f"q{i}", "prompt": f"question {i}", "answer": i}) + "\n")
    job_id, n = store_job(p, job_config("ar", 8), queue="q", url=db_url)
    assert n == 50
    with session_factory(db_url)() as s:
        job = s.get(Job, job_id)
        assert (job.status, job.n_items, job.method) == ("pending", 50, "ar")
        assert job.config["max_new_tokens"] == 8
        assert len(job.manifest["input"]["sha256"]) == 64
        items = s.scalars(select(Item).where(Item.job_id == job_id).order_by(Item.seq)).all()
        assert [i.item_id for i in items] == [f"q{i}" for i in range(50)]
        assert items[3].request == {"id": "q3", "prompt": "question 3", "reference": "3", "meta": {"answer": 3}}
        assert items[3].line == 4 and items[3].status == "pending" and items[3].attempts == 0


def test_each_sample_gets_its_own_reproducible_seed_and_the_template_kwargs():
    from jobs.submit import item_config, sample_seed

    job = job_config("ar", 8, temperature=0.6, seed=5)
    req = {"id": "q1", "prompt": "x", "chat_template_kwargs": {"enable_thinking": True}}
    seeds = [item_config(job, req, s).seed for s in range(4)]
    assert seeds[0] == 5 and len(set(seeds)) == 4  # sample 0 keeps the job's seed
    assert seeds == [item_config(job, req, s).seed for s in range(4)]  # a rerun draws the same
    assert sample_seed(5, "q2", 1) != seeds[1]  # another input, other seeds
    assert item_config(job, {**req, "params": {"seed": 9}}, 0).seed == 9  # a line's own seed wins
    assert item_config(job, req, 1).chat_template_kwargs == {"enable_thinking": True}
    assert item_config(job, {"id": "q1", "prompt": "x"}).chat_template_kwargs is None


def test_a_prompt_beyond_the_context_is_named_and_a_long_one_that_fits_passes(tmp_path):
    from jobs.context import ContextCheck
    from jobs.schema import validate_file

    check = ContextCheck(None, None)  # the embedded target
    p = tmp_path / "long.jsonl"
    fits = {"id": "fits", "messages": [{"role": "user", "content": " ".join(["apple"] * 2000)}]}
    too_long = {"id": "long", "messages": [{"role": "user", "content": " ".join(["apple"] * 9000)}]}
    p.write_text(json.dumps(fits) + "\n" + json.dumps(too_long) + "\n")
    v = validate_file(p, 1_000_000, fits=check)
    assert v.n_items == 1 and [(e.line, e.field) for e in v.errors] == [(2, "messages")]
    assert "does not fit the target's context of 8192 tokens" in v.errors[0].message
    missing = ContextCheck("/no/such/model", None)
    assert validate_file(p, 1_000_000, fits=missing).ok and "does not exist" in missing.unavailable


def test_a_template_that_cannot_render_a_long_prompt_is_a_bad_line_not_a_crash(tmp_path):
    from jobs.context import ContextCheck
    from jobs.schema import validate_file

    p = tmp_path / "kw.jsonl"
    line = {"id": "a", "prompt": " ".join(["apple"] * 300), "chat_template_kwargs": {"tokenize": True}}
    p.write_text(json.dumps(line) + "\n")
    v = validate_file(p, 1_000_000, fits=ContextCheck(None, None))
    assert not v.ok and v.errors[0].field == "prompt" and "chat template cannot render" in v.errors[0].message
