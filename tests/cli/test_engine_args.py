"""vLLM's engine arguments on the command line (--engine-arg, --draft-engine-arg of `run`,
`worker` and `bench`) and in the settings: refused before anything is stored or loaded, merged,
recorded in the job's manifest (in-process, on SQLite, with the instant test-double engine)."""

from __future__ import annotations

import json

import pytest
from click.testing import CliRunner

from semjobs.cli.main import main
from semjobs.settings import settings
from tests.conftest import ROOT, require_vllm

PROMPTS = ROOT / "examples" / "prompts.jsonl"


def invoke(*args):
    return CliRunner().invoke(main, [str(a) for a in args], catch_exceptions=False)


@pytest.fixture
def engine_settings(monkeypatch):
    """The settings' engine arguments, put back after the test (commands write into them)."""
    monkeypatch.setattr(settings, "target_engine_args", {})
    monkeypatch.setattr(settings, "draft_engine_args", {})
    return monkeypatch


def test_run_refuses_an_unknown_engine_argument_and_stores_nothing(tmp_path, fake_engine, engine_settings,
                                                                    last_run_file):
    require_vllm()
    db = tmp_path / "new.sqlite"
    res = invoke("run", PROMPTS, "-o", tmp_path / "o.jsonl", "--db", f"sqlite:///{db}", "--engine-arg", "nope=1",
                 "--engine-arg", "max_model_length=4096")
    assert res.exit_code == 2, res.output
    assert "--engine-arg: unknown engine argument 'nope'" in res.output
    assert "'max_model_length' (did you mean 'max_model_len'?)" in res.output
    assert not db.exists() and not last_run_file.exists() and not (tmp_path / "o.jsonl").exists()


@pytest.mark.parametrize("args, problem", [
    (["--engine-arg", "max_model_len"], "expected KEY=VALUE"),
    (["--draft-engine-arg", "load_format=pt"], "--draft-engine-arg: 'load_format' is set by semjobs"),
])
def test_run_refuses_a_malformed_or_owned_engine_argument(tmp_path, sqlite_db, fake_engine, engine_settings, args,
                                                          problem):
    res = invoke("run", PROMPTS, "-o", tmp_path / "o.jsonl", "--db", sqlite_db, *args)
    assert res.exit_code == 2 and problem in res.output, res.output


def test_run_refuses_a_bad_engine_argument_from_the_settings(tmp_path, sqlite_db, fake_engine, engine_settings):
    engine_settings.setattr(settings, "target_engine_args", {"seed": 7})
    res = invoke("run", PROMPTS, "-o", tmp_path / "o.jsonl", "--db", sqlite_db)
    assert res.exit_code == 2
    assert "SEMJOBS_TARGET_ENGINE_ARGS: 'seed' is set by semjobs: SEMJOBS_SEED" in res.output


def test_the_manifest_names_the_engine_arguments_the_command_line_over_the_settings(tmp_path, sqlite_db,
                                                                                   fake_engine, engine_settings):
    require_vllm()
    engine_settings.setattr(settings, "target_engine_args", {"max_num_batched_tokens": 512, "max_model_len": 128})
    out = tmp_path / "o.jsonl"
    res = invoke("run", PROMPTS, "-o", out, "--db", sqlite_db, "--engine-arg", "max_model_len=4096",
                 "--engine-arg", "quantization=fp8", "--draft-engine-arg", "enforce_eager=true")
    assert res.exit_code == 0, res.output
    manifest = json.loads((tmp_path / "o.jsonl.manifest.json").read_text())
    assert manifest["identities"]["engine_args"] == {
        "target": {"max_num_batched_tokens": 512, "max_model_len": 4096, "quantization": "fp8"},
        "draft": {"enforce_eager": True}}


def test_where_vllm_is_missing_run_says_the_arguments_were_not_checked(tmp_path, sqlite_db, fake_engine,
                                                                        engine_settings):
    from semspec.engine import engine_args

    engine_settings.setattr(engine_args, "vllm_installed", lambda: False)
    res = invoke("run", PROMPTS, "-o", tmp_path / "o.jsonl", "--db", sqlite_db, "--engine-arg", "max_model_len=64")
    assert res.exit_code == 0, res.output
    assert "engine arguments not checked against vLLM's (vLLM is not installed here)" in res.output


def test_a_job_without_engine_arguments_records_none(tmp_path, sqlite_db, fake_engine, engine_settings):
    res = invoke("run", PROMPTS, "-o", tmp_path / "o.jsonl", "--db", sqlite_db)
    assert res.exit_code == 0, res.output
    assert "engine_args" not in json.loads((tmp_path / "o.jsonl.manifest.json").read_text())["identities"]


def test_worker_and_bench_refuse_a_bad_engine_argument_before_starting(tmp_path, engine_settings):
    require_vllm()
    res = invoke("worker", "--engine-arg", "tensor_parallel_size=two")
    assert res.exit_code == 2 and 'tensor_parallel_size="two": Input should be a valid integer' in res.output
    res = invoke("bench", "--out", tmp_path / "bench", "--draft-engine-arg", "max_model_lenn=4096")
    assert res.exit_code == 2 and "did you mean 'max_model_len'?" in res.output
    assert not (tmp_path / "bench").exists()


def test_a_supervised_worker_hands_its_engine_arguments_to_each_process(engine_settings, monkeypatch):
    """The children are `semjobs worker` command lines: they get the arguments checked here,
    the settings' and the command line's, and read back the same values."""
    from semjobs.cli import worker as worker_cli
    from semjobs.cli.jobs import assignments
    from semjobs.worker import supervisor

    argvs = []

    class Recorder:
        def __init__(self, argv_for):
            argvs.extend(argv_for)

        def run(self) -> int:
            return 0

    monkeypatch.setattr(supervisor, "Supervisor", Recorder)
    engine_settings.setattr(settings, "target_engine_args", {"quantization": "fp8", "max_model_len": 4096})
    engine_settings.setattr(settings, "draft_engine_args", {"compilation_config": {"mode": 3}})
    assert worker_cli._supervise(2, 1, (), None, "INFO", None) == 0
    for argv in argvs:
        given = {option: [argv[i + 1] for i, word in enumerate(argv) if word == option]
                 for option in ("--engine-arg", "--draft-engine-arg")}
        assert assignments(None, None, tuple(given["--engine-arg"])) == settings.target_engine_args
        assert assignments(None, None, tuple(given["--draft-engine-arg"])) == settings.draft_engine_args
