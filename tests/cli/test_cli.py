"""CLI commands in-process on SQLite with the instant test-double engine (no servers)."""

import json

import pyarrow.parquet as pq
import pytest
from click.testing import CliRunner

from semjobs.cli.main import main
from tests.conftest import ROOT, require_vllm


def invoke(*args):
    res = CliRunner().invoke(main, [str(a) for a in args], catch_exceptions=False)
    return res


@pytest.fixture
def ran(tmp_path, sqlite_db, fake_engine):
    src = ROOT / "examples" / "prompts.jsonl"
    out = tmp_path / "out.jsonl"
    res = invoke("run", src, "-o", out, "--db", sqlite_db, "--max-new-tokens", 8)
    assert res.exit_code == 0, res.output
    return res.output.strip().splitlines()[-1], out, sqlite_db


def test_run_exports_every_id_and_status_reports(ran, tmp_path):
    job_id, out, db = ran
    ids = [json.loads(line)["id"] for line in open(out)]
    assert ids == ["gsm8k-0", "gsm8k-1", "gsm8k-2"]
    st = json.loads(invoke("status", job_id, "--json", "--db", db).output)
    assert st["status"] == "completed" and st["counts"]["done"] == 3
    assert st["config"]["max_new_tokens"] == 8 and st["manifest"]["input"]["items"] == 3
    text = invoke("status", job_id, "--db", db).output
    assert "3 done" in text and "acceptance" in text
    watch = invoke("status", job_id, "--watch", "--db", db).output
    assert "[" + "#" * 30 + "] 3/3" in watch
    table = invoke("jobs", "--db", db).output
    assert job_id in table and "completed" in table and "TOK/S" in table
    manifest = json.loads((tmp_path / "out.jsonl.manifest.json").read_text())
    assert manifest["job"]["id"] == job_id and manifest["counts"]["done"] == 3
    assert manifest["identities"]["target"].startswith("fake-instant")
    assert len(manifest["input"]["sha256"]) == 64 and manifest["config"]["max_new_tokens"] == 8


def test_commands_find_the_job_just_run_without_flags(ran, tmp_path, monkeypatch):
    from semjobs.settings import settings

    job_id, out, db = ran
    monkeypatch.chdir(tmp_path)  # the recorded SQLite path is absolute
    st = json.loads(invoke("status", "--json").output)
    assert st["id"] == job_id and st["status"] == "completed"
    assert json.loads(invoke("jobs", "--json").output)[0]["id"] == job_id
    res = invoke("export", "-o", tmp_path / "again.jsonl")
    assert res.exit_code == 0 and (tmp_path / "again.jsonl").read_text() == out.read_text()
    # SEMJOBS_DATABASE_URL, when set, wins: the full stack's Postgres
    monkeypatch.setattr(settings, "database_url", f"sqlite:///{tmp_path / 'empty.sqlite'}")
    from semjobs.db import migrate

    migrate.upgrade(settings.database_url)
    res = invoke("status")
    assert res.exit_code == 1 and "no job in sqlite:///" in res.output
    res = invoke("status", "nope", "--db", "postgresql+psycopg://u:secret@127.0.0.1:1/x")
    assert res.exit_code == 1 and "secret" not in res.output
    gone = tmp_path / "gone.sqlite"
    res = invoke("status", "--db", f"sqlite:///{gone}")
    assert res.exit_code == 1 and f"no database at {gone}" in res.output and not gone.exists()


def test_retry_of_a_cancelled_job_is_refused_and_says_why(tmp_path, sqlite_db):
    from semjobs.db import repo
    from semjobs.db.session import session_factory
    from tests.worker.test_process import make_job

    job_id = make_job(sqlite_db, tmp_path, n=2)
    with session_factory(sqlite_db)() as s:
        claim = repo.claim_item(s, job_id, 0, "w1")
        assert repo.fail_item(s, claim.pk, "boom", "w1")
        repo.cancel_job(s, job_id)
    res = invoke("retry", job_id, "--pending", "--db", sqlite_db)
    assert res.exit_code == 1 and f"job {job_id} is cancelled: nothing to retry" in res.output


def test_a_path_that_cannot_be_written_is_one_line_not_a_traceback(ran, tmp_path):
    job_id, _, db = ran
    res = invoke("export", job_id, "--db", db, "-o", tmp_path / "new" / "dir" / "o.jsonl")
    assert res.exit_code == 0 and (tmp_path / "new" / "dir" / "o.jsonl").exists()  # directories made
    (tmp_path / "a_file").write_text("x")
    res = CliRunner().invoke(main, ["export", job_id, "--db", db, "-o", str(tmp_path / "a_file" / "o.jsonl")])
    assert res.exit_code == 1 and "a_file: File exists" in res.output and "Traceback" not in res.output


def test_cancel_of_a_finished_job_says_nothing_was_cancelled(ran):
    job_id, _, db = ran
    res = invoke("cancel", job_id, "--db", db)
    assert res.exit_code == 0 and "already completed: nothing was cancelled" in res.output
    st = json.loads(invoke("status", job_id, "--json", "--db", db).output)
    assert st["status"] == "completed"


def test_export_parquet_with_steps(ran, tmp_path):
    job_id, _, db = ran
    pq_path = tmp_path / "steps.parquet"
    res = invoke("export", job_id, "-o", pq_path, "--db", db, "--steps")
    assert res.exit_code == 0, res.output
    table = pq.read_table(pq_path)
    assert table.num_rows == 3
    assert table.column("id").to_pylist() == ["gsm8k-0", "gsm8k-1", "gsm8k-2"]
    steps = json.loads(table.column("steps").to_pylist()[0])
    assert steps[0]["author"] == "draft" and steps[1]["decision"] == "rejected"
    assert steps[1]["draft_text"] == "The answer is unknown." and steps[1]["judge_score"] == 3
    assert steps[0]["target_tokens"] > 0 and steps[0]["draft_text"] is None


def test_batch_input_run_and_errors_file(tmp_path, sqlite_db, fake_engine):
    src = tmp_path / "b.jsonl"
    lines = [json.loads(x) for x in open(ROOT / "examples" / "openai_batch.jsonl")]
    lines.append({**lines[0], "custom_id": "req-fail"})
    lines[-1]["body"] = {**lines[0]["body"], "messages": [{"role": "user", "content": "FAIL"}]}
    src.write_text("".join(json.dumps(x) + "\n" for x in lines))
    out = tmp_path / "o.jsonl"
    res = invoke("run", src, "-o", out, "--db", sqlite_db)
    assert res.exit_code == 3, res.output  # some items failed
    got = [json.loads(x) for x in open(out)]
    assert [g["custom_id"] for g in got] == ["req-0", "req-1"]
    assert got[0]["response"]["body"]["choices"][0]["message"]["content"]
    errs = [json.loads(x) for x in open(tmp_path / "o.jsonl.errors.jsonl")]
    assert errs[0]["custom_id"] == "req-fail" and errs[0]["response"] is None
    assert "fake engine asked to fail" in errs[0]["error"]["message"]


def test_a_batch_file_for_another_model_is_refused_unless_served_under_its_name(tmp_path, sqlite_db, fake_engine,
                                                                                monkeypatch):
    src = tmp_path / "b.jsonl"
    line = json.loads(open(ROOT / "examples" / "openai_batch.jsonl").readline())
    src.write_text(json.dumps({**line, "body": {**line["body"], "model": "NonExistModel"}}) + "\n")
    res = invoke("run", src, "-o", tmp_path / "o.jsonl", "--db", sqlite_db)
    assert res.exit_code == 2 and "line 1, field 'body.model': 'NonExistModel' is not this job's target" in res.output
    assert not (tmp_path / "o.jsonl").exists()
    from semjobs.settings import settings

    monkeypatch.setattr(settings, "served_model_name", "NonExistModel")
    res = invoke("run", src, "-o", tmp_path / "o.jsonl", "--db", sqlite_db)
    assert res.exit_code == 0, res.output


def test_unknown_job_and_bad_method(sqlite_db, tmp_path):
    res = invoke("status", "nope", "--db", sqlite_db)
    assert res.exit_code != 0 and "no job 'nope'" in res.output
    res = invoke("run", ROOT / "examples" / "prompts.jsonl", "-o", tmp_path / "o.jsonl",
                 "--db", sqlite_db, "--method", "magic")
    assert res.exit_code == 2 and "unknown method" in res.output


def test_engine_load_failure_is_reported(tmp_path, sqlite_db, monkeypatch):
    from semjobs.settings import settings
    from semjobs.worker import engine as engines

    monkeypatch.setattr(settings, "engine_factory", "no_such_module:Engine.load")
    engines._cache.clear()
    res = invoke("run", ROOT / "examples" / "prompts.jsonl", "-o", tmp_path / "o.jsonl",
                 "--db", sqlite_db)
    assert res.exit_code == 1 and "could not load the engine" in res.output


@pytest.mark.parametrize("refusal", ["bad input", "engine that cannot load", "model path missing"])
def test_a_refused_run_creates_no_database_and_leaves_an_old_one_as_it_was(refusal, tmp_path, sqlite_db,
                                                                          fake_engine, monkeypatch):
    import sqlite3
    from contextlib import closing

    from semjobs.settings import settings
    from semjobs.worker import engine as engines

    src = ROOT / "examples" / "prompts.jsonl"
    if refusal == "bad input":
        src = tmp_path / "bad.jsonl"
        src.write_text('{"id": 1, "prompt": "ok"}\n{"id": 1, "prompt": "dup"}\n')
    elif refusal == "engine that cannot load":
        monkeypatch.setattr(settings, "engine_factory", "no_such_module:Engine.load")
        engines._cache.clear()
    else:
        monkeypatch.setattr(settings, "target_model", str(tmp_path / "typo"))
    old, new = tmp_path / "semjobs.sqlite", tmp_path / "new.sqlite"  # old: sqlite_db's file

    def dump():
        with closing(sqlite3.connect(old)) as con:
            return list(con.iterdump())

    before = dump()
    for db in (new, old):
        res = invoke("run", src, "-o", tmp_path / "o.jsonl", "--db", f"sqlite:///{db}")
        assert res.exit_code in (1, 2) and "nothing was stored" in res.output, res.output
    assert not new.exists() and dump() == before


def test_run_resumes_an_interrupted_job_without_redoing_items(tmp_path, sqlite_db, fake_engine):
    from sqlalchemy import select

    from semjobs.db import repo
    from semjobs.db.models import Item
    from semjobs.db.session import session_factory
    from semjobs.jobs.schema import validate_file
    from semjobs.jobs.submit import job_config, store_job
    from semjobs.worker.process import run_items

    src = ROOT / "examples" / "prompts.jsonl"
    config = job_config(None, 8)
    job_id, _ = store_job(src, config, queue="embedded", url=sqlite_db, status="queued",
                          validation=validate_file(src, 10**6))
    run_items(job_id, [0], url=sqlite_db)  # item 0 finished before the "crash"
    with session_factory(sqlite_db)() as s:
        repo.claim_item(s, job_id, 1, "crashed")  # item 1 was in flight
    out = tmp_path / "o.jsonl"
    res = invoke("run", src, "-o", out, "--db", sqlite_db, "--max-new-tokens", 8)
    assert res.exit_code == 0, res.output
    assert f"resuming job {job_id}: 2 of 3 items left" in res.output
    assert res.output.strip().splitlines()[-1] == job_id
    assert len(open(out).readlines()) == 3
    with session_factory(sqlite_db)() as s:
        attempts = dict(s.execute(select(Item.seq, Item.attempts)).all())
    assert attempts == {0: 1, 1: 2, 2: 1}
    # a finished job is not resumed: the next run is a new job
    res = invoke("run", src, "-o", out, "--db", sqlite_db, "--max-new-tokens", 8, "--force")
    assert res.exit_code == 0 and res.output.strip().splitlines()[-1] != job_id


def test_worker_holds_enough_chunks_to_fill_its_batch(monkeypatch):
    from semjobs.settings import settings
    from semjobs.worker.celery import app

    seen = []
    monkeypatch.setattr(app, "worker_main", seen.append)
    monkeypatch.setattr(settings, "chunk_size", 4)
    monkeypatch.setattr(settings, "batch_size", settings.batch_size)  # restored afterwards
    monkeypatch.setattr(settings, "threads", settings.threads)
    monkeypatch.setattr(settings, "processes", settings.processes)
    invoke("worker", "--batch-size", 16, "--processes", 1)  # one node (test_supervisor.py: more)
    argv = seen[-1]
    # one process, the threads pool, 16 / 4 chunks to fill the batch + 1 waiting to refill it
    assert argv[argv.index("--pool") + 1] == "threads" and argv[argv.index("--concurrency") + 1] == "5"
    assert settings.batch_size == 16
    invoke("worker", "-c", 2)
    argv = seen[-1]
    assert argv[argv.index("--pool") + 1] == "prefork" and argv[argv.index("--concurrency") + 1] == "2"


def test_every_command_help_has_an_example():
    import click

    from semjobs.cli.main import main

    def commands(group, prefix=()):
        for name, cmd in group.commands.items():
            if isinstance(cmd, click.Group):
                yield from commands(cmd, (*prefix, name))
            else:
                yield (*prefix, name)

    for path in commands(main):
        res = invoke(*path, "--help")
        assert res.exit_code == 0 and "Example" in res.output, path


def test_a_method_whose_probes_do_not_fit_is_refused_up_front_and_ar_still_runs(tmp_path, monkeypatch):
    """Probes calibrated for other models: `submit` and `run` refuse semspec before anything
    is stored, naming the cause and the fix; `ar` with the same settings runs."""
    from semjobs.settings import settings
    from semspec.probes import Probe, ProbePair
    from tests.tiny_models import tiny_model_dir
    from semjobs.worker import engine as engines

    require_vllm()
    # 64-wide heads, which vLLM's CPU attention runs
    target = tiny_model_dir(tmp_path / "target", num_layers=2, hidden_size=256, seed=0)
    draft = tiny_model_dir(tmp_path / "draft", num_layers=1, hidden_size=256, seed=1)
    ProbePair(Probe(256, layer=-1, model_sha256="0" * 64), Probe(256, layer=1, role="draft")).save(tmp_path / "p")
    for key, value in {"target_model": str(target), "draft_model": str(draft), "probes_dir": str(tmp_path / "p"),
                       "cache_dir": tmp_path / "cache", "processes": 1, "device": "cpu", "kv_cache_gb": 0.25}.items():
        monkeypatch.setattr(settings, key, value)
    engines._cache.clear()
    src = ROOT / "examples" / "prompts.jsonl"
    res = invoke("submit", src, "--method", "semspec")
    assert res.exit_code == 2 and "calibrated for another target model" in res.output, res.output
    assert "nothing was stored" in res.output and "semjobs probe" in res.output
    db = tmp_path / "run.sqlite"
    res = invoke("run", src, "-o", tmp_path / "o.jsonl", "--db", f"sqlite:///{db}", "--method", "semspec")
    assert res.exit_code == 1 and "calibrated for another target model" in res.output, res.output
    assert not db.exists()
    res = invoke("run", src, "-o", tmp_path / "o.jsonl", "--db", f"sqlite:///{db}", "--max-new-tokens", 4)
    assert res.exit_code == 0, res.output
    assert len((tmp_path / "o.jsonl").read_text().splitlines()) == 3
    engines._cache.clear()


# --- `semjobs run`'s exit status, its outputs refused up front, no password in last_run.json (issue 46) ---


@pytest.mark.parametrize("failing, status", [(set(), 0), ({1}, 3), ({0, 1, 2}, 4)])
def test_run_exit_status_says_all_some_or_none_done(tmp_path, sqlite_db, fake_engine, failing, status):
    src = tmp_path / "in.jsonl"
    src.write_text("".join(json.dumps({"id": f"q{i}", "prompt": "FAIL" if i in failing else "one two"}) + "\n"
                           for i in range(3)))
    res = invoke("run", src, "-o", tmp_path / "o.jsonl", "--db", sqlite_db)
    assert res.exit_code == status, res.output
    assert f"wrote {3 - len(failing)} results" in res.output
    newest = json.loads(invoke("jobs", "--json", "--db", sqlite_db).output)[0]["id"]
    assert res.output.strip().splitlines()[-1] == newest  # the job id still printed last


def test_run_with_want_decodes_no_sample_an_input_no_longer_needs(tmp_path, sqlite_db, fake_engine):
    """--want 1 of --n 4: each input's first sample is right (the fake engine's sample 0
    answers the prompt's word count), so its other three end unneeded; the run succeeds,
    exports only what was decoded and says what was kept."""
    src = tmp_path / "in.jsonl"
    src.write_text("".join(json.dumps({"id": f"q{i}", "prompt": "one two", "answer": "2"}) + "\n" for i in range(3)))
    out = tmp_path / "o.jsonl"
    res = invoke("run", src, "-o", out, "--db", sqlite_db, "--n", 4, "--want", 1, "--temperature", 0.6,
                 "--batch-size", 1)
    assert res.exit_code == 0, res.output
    rows = [json.loads(line) for line in open(out)]
    assert [(r["id"], r["sample"], r["kept"]) for r in rows] == [("q0", 0, True), ("q1", 0, True), ("q2", 0, True)]
    assert "kept: 3 samples kept, 3 useful; 3 of 3 inputs with one, 3 with all 1 wanted" in res.output
    st = json.loads(invoke("status", "--json", "--db", sqlite_db).output)
    assert st["counts"]["unneeded"] == 9 and st["yield"]["useful"] == 3


def test_want_more_than_n_is_refused_before_anything_is_stored(tmp_path, sqlite_db, fake_engine):
    src = tmp_path / "in.jsonl"
    src.write_text(json.dumps({"id": "q", "prompt": "one two"}) + "\n")
    res = invoke("run", src, "-o", tmp_path / "o.jsonl", "--db", sqlite_db, "--n", 2, "--want", 3,
                 "--temperature", 0.6)
    assert res.exit_code == 2 and "--want" in res.output
    assert not (tmp_path / "o.jsonl").exists()


def test_run_help_documents_its_exit_status():
    text = invoke("run", "--help").output
    assert "3 some failed" in text and "4 none done" in text


def test_run_refuses_an_existing_output_before_storing_anything(tmp_path, sqlite_db, fake_engine):
    out = tmp_path / "o.jsonl"
    out.write_text("the user's own file\n")
    res = invoke("run", ROOT / "examples" / "prompts.jsonl", "-o", out, "--db", sqlite_db)
    assert res.exit_code == 1 and f"{out} exists" in res.output and "--force" in res.output
    assert out.read_text() == "the user's own file\n" and "loading the engine" not in res.output
    assert json.loads(invoke("jobs", "--json", "--db", sqlite_db).output) == []


def test_last_run_record_holds_no_password(last_run_file, monkeypatch):
    from semjobs.jobs.locate import PasswordNotStored, database_url, remember
    from semjobs.settings import settings

    monkeypatch.delenv("SEMJOBS_DATABASE_URL", raising=False)
    remember("job1", "postgresql+psycopg://semjobs@db.example:5432/jobs")  # no password: used as recorded
    assert database_url() == "postgresql+psycopg://semjobs@db.example:5432/jobs"
    with_password = "postgresql+psycopg://semjobs:s3cret-pw@db.example:5432/jobs"
    remember("job2", with_password)
    assert "s3cret-pw" not in last_run_file.read_text()
    with pytest.raises(PasswordNotStored):
        database_url()
    res = invoke("status")
    assert res.exit_code == 1 and "needs a password" in res.output and "--db" in res.output
    assert "semjobs@db.example:5432/jobs" in res.output and "s3cret" not in res.output
    # the configured database carries its own password and wins over the record
    monkeypatch.setattr(settings, "database_url", with_password)
    assert database_url() == with_password


# --- reproducible or fastest sampling (issue 45) -------------------------------------------------

def test_a_job_sampled_without_seeds_says_so_and_refuses_a_seed(tmp_path, sqlite_db, fake_engine):
    src = ROOT / "examples" / "prompts.jsonl"
    res = invoke("run", src, "-o", tmp_path / "o.jsonl", "--db", sqlite_db, "--temperature", 0.6, "--fastest")
    assert res.exit_code == 0, res.output
    st = json.loads(invoke("status", res.output.strip().splitlines()[-1], "--json", "--db", sqlite_db).output)
    assert st["config"]["reproducible"] is False
    refused = invoke("run", src, "-o", tmp_path / "p.jsonl", "--db", sqlite_db, "--fastest", "--seed", 3)
    assert refused.exit_code == 2 and "a seed means nothing to a job sampled without seeds" in refused.output


# --- semspec's floor on p_T per job (issue 44) ---------------------------------------------------

def test_a_semspec_job_takes_its_floor_on_p_t_and_other_methods_refuse_it(tmp_path, sqlite_db, fake_engine):
    src = ROOT / "examples" / "prompts.jsonl"
    res = invoke("run", src, "-o", tmp_path / "o.jsonl", "--db", sqlite_db, "--method", "semspec", "--tau", 0.1)
    assert res.exit_code == 0, res.output
    st = json.loads(invoke("status", res.output.strip().splitlines()[-1], "--json", "--db", sqlite_db).output)
    assert st["config"]["tau"] == 0.1 and st["config"]["method"] == "semspec"
    unset = invoke("run", src, "-o", tmp_path / "u.jsonl", "--db", sqlite_db, "--method", "semspec")
    st = json.loads(invoke("status", unset.output.strip().splitlines()[-1], "--json", "--db", sqlite_db).output)
    assert "tau" not in st["config"]  # greedy, the floor the worker's probes were calibrated with
    refused = invoke("run", src, "-o", tmp_path / "p.jsonl", "--db", sqlite_db, "--method", "ar", "--tau", 0.1)
    assert refused.exit_code == 2 and "--tau" in refused.output and "'ar' has no probes" in refused.output
    assert not (tmp_path / "p.jsonl").exists()
    out_of_range = invoke("run", src, "-o", tmp_path / "q.jsonl", "--db", sqlite_db, "--method", "semspec", "--tau", 1.5)
    assert out_of_range.exit_code == 2 and "--tau" in out_of_range.output


def test_the_program_with_vllm_loaded_exits_with_its_code_after_its_handlers_without_the_teardown(tmp_path):
    """`semjobs` (``run``) ends as ``main`` would, its exit code and its output kept and its exit
    handlers run, but where vLLM was loaded without the interpreter's teardown (seconds of
    collecting the heap); otherwise as any program does."""
    import subprocess
    import sys

    handler, teardown = tmp_path / "handler", tmp_path / "teardown"
    code = f"""
import atexit, sys, types

class TornDown:
    def __del__(self, open=open):  # (builtins may be gone by then)
        open({str(teardown)!r}, "w").write("ran")

kept = TornDown()  # collected in the interpreter's teardown only
atexit.register(lambda: open({str(handler)!r}, "w").write("ran"))
if sys.argv[1] == "vllm":
    sys.modules["vllm"] = types.ModuleType("vllm")
sys.argv[1:] = sys.argv[2:]
from semjobs.cli.main import run
run()
"""
    for loaded in ("vllm", "none"):
        for args, exit_code, shown in ((["--help"], 0, "Usage: semjobs"), (["no-such-command"], 2, "No such command")):
            out = subprocess.run([sys.executable, "-c", code, loaded, *args], capture_output=True, text=True,
                                 timeout=120, cwd=ROOT)
            assert out.returncode == exit_code and shown in out.stdout + out.stderr, out.stderr
            assert handler.read_text() == "ran"
            assert teardown.exists() is (loaded == "none"), (loaded, args)
            handler.unlink()
            teardown.unlink(missing_ok=True)


# --- doomed samples stopped early (issue 61) ------------------------------------------------------

def test_a_job_stops_doomed_samples_unless_told_to_keep_them(tmp_path, sqlite_db, fake_engine):
    """--stop-doomed is a job's setting, on by default (the rule acts only where a worker has
    one: SEMJOBS_DOOM_RULE); --keep-doomed stores it off."""
    src = ROOT / "examples" / "prompts.jsonl"
    for flag, stored in (((), True), (("--keep-doomed",), False)):
        res = invoke("run", src, "-o", tmp_path / f"{stored}.jsonl", "--db", sqlite_db, "--temperature", 0.6, *flag)
        assert res.exit_code == 0, res.output
        st = json.loads(invoke("status", res.output.strip().splitlines()[-1], "--json", "--db", sqlite_db).output)
        assert st["config"]["stop_doomed"] is stored


@pytest.mark.parametrize("problems", ["mixed", "easy:4", "mixed:0"])
def test_doom_calibrate_names_a_wrong_problem_set(tmp_path, problems):
    res = invoke("doom", "calibrate", "--problems", problems, "--out", tmp_path / "rule.json")
    assert res.exit_code == 2 and "expected mixed:COUNT" in res.output and not (tmp_path / "rule.json").exists()
