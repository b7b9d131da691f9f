"""`semjobs submit` / `semjobs run` on bad input: clear errors, non-zero exit, zero rows."""

import json

import pytest
from click.testing import CliRunner
from sqlalchemy import func, select

from semjobs.cli.main import main
from semjobs.db.models import Item, Job
from semjobs.db.session import session_factory
from semjobs.jobs.submit import job_config, missing_model_files, store_job
from semjobs.settings import settings


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
    # issue 46: each of these passed validation and failed the insert or the decode
    "id_of_600_digits": ['{"id": 1, "prompt": "ok"}', '{"id": %s, "prompt": "x"}' % ("9" * 600)],
    "nul_in_id": ['{"id": 1, "prompt": "ok"}', json.dumps({"id": "a\u0000", "prompt": "x"})],
    "nul_in_prompt": ['{"id": 1, "prompt": "ok"}', json.dumps({"id": 2, "prompt": "x\u0000"})],
    "surrogate_in_meta": ['{"id": 1, "prompt": "ok"}', '{"id": 2, "prompt": "x", "note": "\\ud800"}'],
    "nan_in_meta": ['{"id": 1, "prompt": "ok"}', '{"id": 2, "prompt": "x", "score": NaN}'],
    "seed_of_2_64": ['{"id": 1, "prompt": "ok"}', json.dumps({"id": 2, "prompt": "x", "seed": 2**64})],
    "template_tokenize": ['{"id": 1, "prompt": "ok"}',
                          json.dumps({"id": 2, "prompt": "x", "chat_template_kwargs": {"tokenize": True}})],
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


def test_a_floor_left_unset_is_not_stored_so_the_workers_engine_decides():
    """Left out, not stored as None: a worker of any release reads the job's config alike."""
    from semjobs.jobs.submit import item_config

    unset = job_config("semspec", 8)
    assert "tau" not in unset and item_config(unset, {"id": "q1", "prompt": "x"}).tau is None
    assert job_config("semspec", 8, tau=0.1)["tau"] == 0.1


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
def test_the_real_template_renders_every_allowed_kwargs_set_and_tokenize_never_reaches_it(tmp_path):
    from semjobs.jobs.context import ContextCheck
    from semjobs.jobs.schema import validate_file

    p = tmp_path / "kw.jsonl"
    lines = [{"id": "a", "prompt": "q", "chat_template_kwargs": {"enable_thinking": False}},
             {"id": "b", "prompt": "q", "chat_template_kwargs": {"reasoning_effort": "high", "thinking": None}},
             {"id": "c", "prompt": " ".join(["apple"] * 300), "chat_template_kwargs": {"tokenize": True}}]
    p.write_text("".join(json.dumps(line) + "\n" for line in lines))
    check = ContextCheck(None, None)
    v = validate_file(p, 1_000_000, fits=check)
    assert v.n_items == 2 and [(e.line, e.field) for e in v.errors] == [(3, "chat_template_kwargs.tokenize")]
    assert check.unavailable is None and check.max_context == 8192  # the two sets were rendered


class RefusingTemplate:
    """A target tokenizer whose chat template refuses a reasoning_effort it does not know and
    any prompt holding "BAD"; counts its renders."""

    chat_template = "..."

    def __init__(self):
        self.renders = 0

    def apply_chat_template(self, messages, tokenize, add_generation_prompt, **kwargs):
        self.renders += 1
        text = " ".join(m["content"] for m in messages)
        if kwargs.get("reasoning_effort") not in (None, "low", "high") or "BAD" in text:
            raise ValueError("the template raised")  # as a Jinja raise_exception does
        return text

    def __call__(self, text, add_special_tokens=True):
        return {"input_ids": text.split()}


@pytest.fixture
def refusing_target(monkeypatch):
    """ContextCheck's target: RefusingTemplate, context 1000 tokens; counts tokenizer loads."""
    from semspec.models import specs

    tok, loads = RefusingTemplate(), []
    monkeypatch.setattr(specs, "load_tokenizer", lambda spec, cache: loads.append(spec) or (tok, 1000))
    return tok, loads


def test_every_distinct_kwargs_set_is_rendered_at_submit_once(refusing_target, tmp_path):
    from semjobs.jobs.context import ContextCheck
    from semjobs.jobs.schema import validate_file
    from tests.jobs.test_schema import batch_line, write

    tok, loads = refusing_target
    p = write(tmp_path, [{"id": 1, "prompt": "short, no kwargs: never rendered"},
                         {"id": 2, "prompt": "q", "chat_template_kwargs": {"reasoning_effort": "low"}},
                         {"id": 3, "prompt": "q", "chat_template_kwargs": {"reasoning_effort": "low"}},
                         {"id": 4, "prompt": "q", "chat_template_kwargs": {"reasoning_effort": "maximal"}},
                         {"id": 5, "prompt": "BAD", "chat_template_kwargs": {"reasoning_effort": "high"}}])
    v = validate_file(p, 10_000, fits=ContextCheck("target", None))
    assert [(e.line, e.field) for e in v.errors] == [(4, "chat_template_kwargs"), (5, "prompt")]
    assert "cannot render the prompt with it: ValueError: the template raised" in v.errors[0].message
    assert loads == ["target"] and tok.renders == 1 + 2 + 2  # "low" once; each refusal tried again bare
    p = write(tmp_path, [batch_line("a", chat_template_kwargs={"reasoning_effort": "maximal"})], "batch.jsonl")
    v = validate_file(p, 10_000, fits=ContextCheck("target", None))
    assert [(e.line, e.field) for e in v.errors] == [(1, "body.chat_template_kwargs")]


def test_a_file_of_short_prompts_without_kwargs_loads_no_tokenizer(refusing_target, tmp_path):
    from semjobs.jobs.context import ContextCheck
    from semjobs.jobs.schema import validate_file
    from tests.jobs.test_schema import write

    tok, loads = refusing_target
    p = write(tmp_path, [{"id": i, "prompt": "BAD but short", "chat_template_kwargs": {}} for i in range(3)])
    assert validate_file(p, 10_000, fits=ContextCheck("target", None)).ok
    assert loads == [] and tok.renders == 0


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
    (["--seed", "-1"], "--seed"),
    (["--seed", str(2**64)], "--seed"),
    (["--name", "n" * 201], "--name"),
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
    for word in ("suffix", "mtp"):  # vLLM's drafts without files of their own
        monkeypatch.setattr(settings, "draft_model", word)
        assert missing_model_files() == []
    monkeypatch.setattr(settings, "draft_model", "eagle3:/no/such/head")  # the model a kind names is looked for
    assert missing_model_files() == ["SEMJOBS_DRAFT_MODEL=eagle3:/no/such/head: no such file or directory here"]


def test_a_hub_name_is_looked_up_in_the_hub_cache(tmp_path, monkeypatch):
    """Qwen/Qwen3-0.6B names no local file: the hub cache resolves it (semspec.models.hub), and
    a revision it lacks offline is missing."""
    from semjobs.settings import settings
    from tests.tiny_models import lay_out_hub_cache, tiny_model_dir, use_hub_cache

    lay_out_hub_cache(tmp_path / "hf", "Qwen/Qwen3-0.6B", tiny_model_dir(tmp_path / "model"))
    use_hub_cache(monkeypatch, tmp_path / "hf")
    monkeypatch.setattr(settings, "check_prompt_lengths", True)
    monkeypatch.setattr(settings, "draft_model", "Qwen/Qwen3-0.6B@main")
    assert missing_model_files() == []
    monkeypatch.setattr(settings, "draft_model", "Qwen/Qwen3-0.6B@nosuchrev")
    [missing] = missing_model_files()
    assert missing.startswith("SEMJOBS_DRAFT_MODEL=Qwen/Qwen3-0.6B@nosuchrev: hub model Qwen/Qwen3-0.6B at "
                              "revision 'nosuchrev' is not in the Hugging Face cache"), missing


@pytest.mark.parametrize("env, words", [
    ({"SEMJOBS_MAX_NEW_TOKENS": "0"}, "bad setting SEMJOBS_MAX_NEW_TOKENS='0': input should be greater than 0"),
    ({"SEMJOBS_HEARTBEAT_INTERVAL_S": "soon"}, "bad setting SEMJOBS_HEARTBEAT_INTERVAL_S='soon'"),
    ({"SEMJOBS_WORKER_DEAD_AFTER_S": "1"}, "worker_dead_after_s must be at least 2 x heartbeat_interval_s"),
    ({"SEMJOBS_SEED": "-1"}, "bad setting SEMJOBS_SEED='-1': input should be greater than or equal to 0"),
    ({"SEMJOBS_MAX_JOB_ITEMS": "0"}, "bad setting SEMJOBS_MAX_JOB_ITEMS='0'"),
])
def test_a_bad_setting_is_one_line_not_a_traceback(env, words, tmp_path):
    import os

    from tests.conftest import ROOT, run_cli

    p = tmp_path / "in.jsonl"
    p.write_text('{"id": 1, "prompt": "ok"}\n')
    res = run_cli(["submit", str(p)], {**os.environ, "PYTHONPATH": str(ROOT), **env}, check=False)
    assert res.returncode == 1 and words in res.stderr and "Traceback" not in res.stderr, res.stderr


def _insert_unchecked(url, item_id, request):
    """Store one item the way store_job does, without the validator in front."""
    from semjobs.db import repo

    with session_factory(url)() as s:
        repo.create_job(s, job_id="unchecked", name="unchecked", method="ar", input_format="plain", queue="q",
                        config={}, manifest={}, items=[{"seq": 0, "line": 1, "item_id": item_id, "sample": 0,
                                                        "request": request}])
        s.commit()


@pytest.mark.parametrize("line, field", [
    ('{"id": %s, "prompt": "x"}' % ("9" * 600), "id"),
    ('{"id": "a\\u0000b", "prompt": "x"}', "id"),
    ('{"id": "a\\ud800", "prompt": "x"}', "id"),
    ('{"id": "a", "prompt": "x", "score": NaN}', "score"),
], ids=["id_of_600_digits", "nul_in_id", "surrogate_in_id", "nan_in_meta"])
def test_postgres_refuses_at_insert_what_the_validator_now_refuses(line, field, pg_db, tmp_path):
    """Before issue 46 these passed validation and failed the job's insert on Postgres."""
    import psycopg

    from semjobs.jobs.schema import validate_file

    obj = json.loads(line)
    with pytest.raises((psycopg.DataError, UnicodeEncodeError)):  # a lone surrogate fails to encode
        _insert_unchecked(pg_db, str(obj["id"]), obj)
    assert rows(pg_db) == (0, 0)
    p = tmp_path / "in.jsonl"
    p.write_text(line + "\n")
    assert [(err.line, err.field) for err in validate_file(p, 10_000).errors] == [(1, field)]


def test_a_seed_of_2_64_was_stored_and_failed_at_decode_now_it_is_refused(pg_db, tmp_path):
    """Postgres' JSON takes any integer; torch's generator, which vLLM seeds a request's
    sampling with, takes 0 to 2^64 - 1 (and vLLM reads -1 as "no seed")."""
    torch = pytest.importorskip("torch")
    from semjobs.jobs.schema import MAX_SEED, validate_file

    _insert_unchecked(pg_db, "a", {"id": "a", "prompt": "x", "params": {"seed": 2**64}})
    assert rows(pg_db) == (1, 1)
    with pytest.raises((RuntimeError, ValueError), match="Overflow"):
        torch.Generator().manual_seed(2**64)
    torch.Generator().manual_seed(MAX_SEED)
    p = tmp_path / "in.jsonl"
    p.write_text(json.dumps({"id": 1, "prompt": "x", "seed": 2**64}) + "\n")
    assert [(e.line, e.field) for e in validate_file(p, 10_000).errors] == [(1, "seed")]


def test_odd_but_valid_lines_are_stored_as_given(db_url, tmp_path, monkeypatch):
    from semjobs.settings import settings
    from tests.jobs.test_schema import ODD_BUT_VALID, write

    monkeypatch.setattr(settings, "check_prompt_lengths", False)  # the rendering has tests of its own
    p = write(tmp_path, ODD_BUT_VALID)
    job_id, n = store_job(p, job_config("ar", 8), queue="q", url=db_url)
    assert n == len(ODD_BUT_VALID) + 63  # one line asks for 64 samples
    with session_factory(db_url)() as s:
        items = s.scalars(select(Item).where(Item.job_id == job_id, Item.sample == 0).order_by(Item.seq)).all()
    assert [i.item_id for i in items] == [str(line["id"]) for line in ODD_BUT_VALID]
    assert [i.request["id"] for i in items] == [line["id"] for line in ODD_BUT_VALID]
    assert items[0].request["prompt"] == ODD_BUT_VALID[0]["prompt"]
    assert items[5].request["prompt"] == ODD_BUT_VALID[5]["prompt"]
    assert items[9].request["params"]["seed"] == 2**63 - 1


def test_a_job_name_is_checked_against_its_column(db_url, tmp_path, monkeypatch):
    from semjobs.settings import settings

    monkeypatch.setattr(settings, "check_prompt_lengths", False)
    p = tmp_path / ("f" * 210 + ".jsonl")  # a file name longer than the column: the default name is cut
    p.write_text('{"id": 1, "prompt": "ok"}\n')
    with pytest.raises(ValueError, match="job name longer than 200 characters"):
        store_job(p, job_config("ar", 8), queue="q", url=db_url, name="n" * 201)
    assert rows(db_url) == (0, 0)
    named, _ = store_job(p, job_config("ar", 8), queue="q", url=db_url, name="名" * 200)
    default, _ = store_job(p, job_config("ar", 8), queue="q", url=db_url)
    with session_factory(db_url)() as s:
        assert s.get(Job, named).name == "名" * 200 and s.get(Job, default).name == "f" * 200


@pytest.mark.parametrize("setting, value, words", [
    ("max_job_items", 3, "more than 3 items (inputs x samples; SEMJOBS_MAX_JOB_ITEMS raises the limit)"),
    ("max_job_bytes", 40, "more than the limit of 40 bytes per job (SEMJOBS_MAX_JOB_BYTES raises it)"),
    ("max_line_bytes", 30, "line longer than 30 bytes (SEMJOBS_MAX_LINE_BYTES raises the limit)"),
])
def test_submit_over_a_limit_stores_nothing(setting, value, words, pg_db, tmp_path, monkeypatch):
    from semjobs.settings import settings

    monkeypatch.setattr(settings, "database_url", pg_db)
    monkeypatch.setattr(settings, "redis_url", "redis://127.0.0.1:1/0")  # never reached
    monkeypatch.setattr(settings, setting, value)
    p = tmp_path / "in.jsonl"
    p.write_text('{"id": 1, "prompt": "ok"}\n{"id": 2, "prompt": "a longer one"}\n')
    res = CliRunner().invoke(main, ["submit", str(p), "--n", "2", "--temperature", "0.6"])
    assert res.exit_code == 2 and words in res.output and "nothing was stored" in res.output, res.output
    assert rows(pg_db) == (0, 0)


def test_a_batch_body_may_name_the_target_as_given_by_its_hub_name_or_served_name(monkeypatch):
    from semjobs.jobs.submit import target_names

    monkeypatch.setattr(settings, "target_model", None)
    monkeypatch.setattr(settings, "served_model_name", None)
    assert target_names() == {"embedded:smollm2-135m", "HuggingFaceTB/SmolLM2-135M-Instruct"}
    monkeypatch.setattr(settings, "target_model", "Qwen/Qwen3-0.6B@main")
    monkeypatch.setattr(settings, "served_model_name", "teacher")
    assert target_names() == {"Qwen/Qwen3-0.6B@main", "Qwen/Qwen3-0.6B", "teacher"}


@pytest.mark.parametrize("config, samples, want, option", [
    ({"method": "ar", "temperature": 0.0}, 4, None, "n"),
    ({"method": "ar", "temperature": 0.6, "tau": 0.3}, 1, None, "tau"),
    ({"method": "ar", "temperature": 0.6}, 2, 3, "want"),
])
def test_the_python_api_obeys_the_cli_s_job_rules(tmp_path, config, samples, want, option):
    from semjobs.jobs.submit import JobRuleError

    src = tmp_path / "in.jsonl"
    src.write_text('{"id": 1, "prompt": "x"}\n')
    with pytest.raises(JobRuleError) as e:
        store_job(src, config, queue="q", url=f"sqlite:///{tmp_path / 'db.sqlite'}", samples=samples, want=want)
    assert e.value.option == option and not (tmp_path / "db.sqlite").exists()
