"""`semjobs submit` / `semjobs run` on bad input: clear errors, non-zero exit, zero rows."""

import json

import pytest
from click.testing import CliRunner
from sqlalchemy import func, select

from semjobs.cli.main import main
from semjobs.db.models import Item, Job
from semjobs.db.session import session_factory
from semjobs.jobs.submit import job_config, missing_model_files, store_job


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
    from semjobs.jobs.submit import item_config, sample_seed

    job = job_config("ar", 8, temperature=0.6, seed=5)
    req = {"id": "q1", "prompt": "x", "chat_template_kwargs": {"enable_thinking": True}}
    seeds = [item_config(job, req, s).seed for s in range(4)]
    assert seeds[0] == 5 and len(set(seeds)) == 4  # sample 0 keeps the job's seed
    assert seeds == [item_config(job, req, s).seed for s in range(4)]  # a rerun draws the same
    assert sample_seed(5, "q2", 1) != seeds[1]  # another input, other seeds
    assert item_config(job, {**req, "params": {"seed": 9}}, 0).seed == 9  # a line's own seed wins
    assert item_config(job, req, 1).chat_template_kwargs == {"enable_thinking": True}
    assert item_config(job, {"id": "q1", "prompt": "x"}).chat_template_kwargs is None


@pytest.mark.real_model
def test_a_prompt_beyond_the_context_is_named_and_a_long_one_that_fits_passes(tmp_path):
    from semjobs.jobs.context import ContextCheck
    from semjobs.jobs.schema import validate_file

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


@pytest.mark.real_model
def test_a_template_that_cannot_render_a_long_prompt_is_a_bad_line_not_a_crash(tmp_path):
    from semjobs.jobs.context import ContextCheck
    from semjobs.jobs.schema import validate_file

    p = tmp_path / "kw.jsonl"
    line = {"id": "a", "prompt": " ".join(["apple"] * 300), "chat_template_kwargs": {"tokenize": True}}
    p.write_text(json.dumps(line) + "\n")
    v = validate_file(p, 1_000_000, fits=ContextCheck(None, None))
    assert not v.ok and v.errors[0].field == "prompt" and "chat template cannot render" in v.errors[0].message


def _probes_cut_in_half(dest):
    from semspec.probes import EMBEDDED_PROBES_DIR

    dest.mkdir()
    for f in EMBEDDED_PROBES_DIR.iterdir():
        data = f.read_bytes()
        (dest / f.name).write_bytes(data[: len(data) // 2] if f.name == "target.safetensors" else data)
    return dest


def _probes_of_another_model(dest):
    from safetensors import safe_open
    from safetensors.torch import save_file

    from semspec.probes import EMBEDDED_PROBES_DIR

    dest.mkdir()
    for f in EMBEDDED_PROBES_DIR.iterdir():
        if f.suffix != ".safetensors":
            continue
        with safe_open(str(f), "pt") as sf:
            tensors = {k: sf.get_tensor(k) for k in sf.keys()}
            meta = dict(sf.metadata())
        probe = json.loads(meta["semjobs_probe"])
        meta["semjobs_probe"] = json.dumps({**probe, "model_sha256": "0" * 64})
        save_file(tensors, str(dest / f.name), meta)
    return dest


@pytest.mark.real_model
@pytest.mark.slow
@pytest.mark.parametrize("setting, make, words", [
    ("target_model", lambda tmp: str(tmp / "no-such-model"), "does not exist"),
    ("probes_dir", lambda tmp: str(_probes_cut_in_half(tmp / "cut")), "target.safetensors"),
    ("probes_dir", lambda tmp: str(_probes_of_another_model(tmp / "other")), "model"),
], ids=["unknown_model_path", "truncated_probe_file", "probes_of_another_model"])
def test_run_with_files_that_cannot_load_stores_nothing(setting, make, words, sqlite_db, tmp_path,
                                                        monkeypatch):
    """The engine loads before the job is stored: a model that cannot load, or probes the
    asked method needs that cannot, is one error line naming the file, exit 1, zero rows."""
    from semjobs.settings import settings
    from semjobs.worker import engine as engines

    monkeypatch.setattr(settings, setting, make(tmp_path))
    engines._cache.clear()
    p = tmp_path / "in.jsonl"
    p.write_text('{"id": 1, "prompt": "What is 2+2?"}\n')
    try:
        res = CliRunner().invoke(main, ["run", str(p), "-o", str(tmp_path / "o.jsonl"), "--db", sqlite_db,
                                        "--method", "semspec"])
    finally:
        engines._cache.clear()
    assert res.exit_code == 1, res.output
    reason = res.output.strip().splitlines()[-1]
    assert reason.startswith(("error: could not load the engine", "error: method 'semspec'")), reason
    assert words in reason and reason.endswith("nothing was stored")
    assert "Traceback" not in res.output
    assert rows(sqlite_db) == (0, 0)


@pytest.mark.parametrize("options, words", [
    (["--max-new-tokens", "0"], "--max-new-tokens"),
    (["--max-new-tokens", "-3"], "--max-new-tokens"),
    (["--temperature", "3"], "--temperature"),
    (["--temperature", "-1"], "--temperature"),
    (["--top-p", "0"], "--top-p"),
    (["--top-p", "1.5"], "--top-p"),
    (["--n", "0"], "--n"),
    (["--n", "65"], "--n"),
    (["--n", "4"], "greedy"),
    (["--method", "magic"], "unknown method"),
])
def test_submit_refuses_bad_options_before_storing(options, words, pg_db, tmp_path, monkeypatch):
    from semjobs.settings import settings

    monkeypatch.setattr(settings, "database_url", pg_db)
    monkeypatch.setattr(settings, "redis_url", "redis://127.0.0.1:1/0")  # never reached
    p = tmp_path / "in.jsonl"
    p.write_text('{"id": 1, "prompt": "ok"}\n')
    res = CliRunner().invoke(main, ["submit", str(p), *options])
    assert res.exit_code == 2 and words in res.output, res.output
    assert rows(pg_db) == (0, 0)


def test_submit_refuses_a_model_path_this_machine_lacks(pg_db, tmp_path, monkeypatch):
    from semjobs.settings import settings

    monkeypatch.setattr(settings, "database_url", pg_db)
    monkeypatch.setattr(settings, "redis_url", "redis://127.0.0.1:1/0")
    monkeypatch.setattr(settings, "target_model", str(tmp_path / "typo"))
    p = tmp_path / "in.jsonl"
    p.write_text('{"id": 1, "prompt": "ok"}\n')
    res = CliRunner().invoke(main, ["submit", str(p)])
    assert res.exit_code == 2, res.output
    assert f"SEMJOBS_TARGET_MODEL={tmp_path / 'typo'}: no such file or directory here; nothing was stored" in res.output
    assert rows(pg_db) == (0, 0)
    monkeypatch.setattr(settings, "check_prompt_lengths", False)  # only the workers have the files
    assert missing_model_files() == []


def test_ngram_is_a_draft_without_files(monkeypatch):
    """SEMJOBS_DRAFT_MODEL=ngram (vLLM's prompt lookup) names no file to look for."""
    from semjobs.settings import settings

    monkeypatch.setattr(settings, "check_prompt_lengths", True)
    monkeypatch.setattr(settings, "draft_model", "ngram")
    assert missing_model_files() == []
    monkeypatch.setattr(settings, "draft_model", "ngrams")
    assert missing_model_files() == ["SEMJOBS_DRAFT_MODEL=ngrams: no such file or directory here"]


@pytest.mark.parametrize("env, words", [
    ({"SEMJOBS_MAX_NEW_TOKENS": "0"}, "bad setting SEMJOBS_MAX_NEW_TOKENS='0': input should be greater than 0"),
    ({"SEMJOBS_HEARTBEAT_INTERVAL_S": "soon"}, "bad setting SEMJOBS_HEARTBEAT_INTERVAL_S='soon'"),
    ({"SEMJOBS_WORKER_DEAD_AFTER_S": "1"}, "worker_dead_after_s must be at least 2 x heartbeat_interval_s"),
])
def test_a_bad_setting_is_one_line_not_a_traceback(env, words, tmp_path):
    import os

    from tests.conftest import ROOT, run_cli

    p = tmp_path / "in.jsonl"
    p.write_text('{"id": 1, "prompt": "ok"}\n')
    res = run_cli(["submit", str(p)], {**os.environ, "PYTHONPATH": str(ROOT), **env}, check=False)
    assert res.returncode == 1 and words in res.stderr and "Traceback" not in res.stderr, res.stderr
