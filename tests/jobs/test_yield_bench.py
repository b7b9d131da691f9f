"""The yield benchmark's figures from hand-made samples, its `semjobs run` arms with the run
and the job's status stubbed, results.json's shape, and `semjobs bench --yield`'s wiring."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest
from click.testing import CliRunner

from semjobs.jobs import yield_bench as yb
from semjobs.jobs.yield_bench import Sample, YieldSettings

CONTRACT = ("useful_per_hour", "useful_per_mtok", "covered_inputs", "generated_tokens", "wall_seconds")


def _right(i: str) -> Sample:
    return Sample(i, True, "4", "eos")


def _wrong(i: str, finish: str = "eos") -> Sample:
    return Sample(i, False, "5", finish)


def test_useful_counts_at_most_want_per_input():
    samples = [_right("a"), _right("a"), _right("a"), _wrong("a"),  # 3 kept, 2 useful at want 2
               _right("b"), _wrong("b"),  # 1 kept
               _wrong("c"), _wrong("c", "length")]  # none
    f = yb.figures(samples, ["a", "b", "c", "d"], want=2, wall_seconds=1800.0, generated_tokens=250_000)
    assert f["useful"] == 3 and f["kept_samples"] == 4 and f["decoded_samples"] == 8
    assert f["covered_inputs"] == 2 and f["full_inputs"] == 1 and f["inputs"] == 4
    assert f["useful_per_hour"] == 6.0  # 3 in half an hour
    assert f["useful_per_mtok"] == 12.0  # 3 in a quarter of a million tokens
    assert f["generated_tokens"] == 250_000 and f["wall_seconds"] == 1800.0
    assert yb.figures(samples, ["a", "b", "c", "d"], want=1, wall_seconds=1.0, generated_tokens=1)["useful"] == 2


def test_the_keep_rule_without_a_reference():
    samples = [Sample("a", None, "4", "eos"),  # kept: ended by itself with an answer
               Sample("a", None, None, "eos"),  # no answer
               Sample("b", None, "4", "length"),  # cut at the cap
               Sample("c", None, "4", "repetition")]  # a loop stopped
    assert [s.kept for s in samples] == [True, False, False, False]
    f = yb.figures(samples, ["a", "b", "c"], want=1, wall_seconds=10.0, generated_tokens=100)
    assert f["useful"] == 1 and f["covered_inputs"] == 1
    assert f["kept_correct_share"] is None and f["eos_answer_correct_share"] is None  # nothing to check against


def test_quality_figures():
    samples = [_right("a"), _wrong("a"), _wrong("a", "length"), Sample("a", True, "4", "repetition")]
    f = yb.figures(samples, ["a"], want=1, wall_seconds=1.0, generated_tokens=10)
    assert f["kept_correct_share"] == 1.0  # with a reference, kept means correct
    # the no-reference rule (EOS and an answer) would keep the first two: one right
    assert f["eos_answer_correct_share"] == 0.5


def test_no_time_or_tokens_gives_no_rate():
    f = yb.figures([], ["a"], want=1, wall_seconds=0.0, generated_tokens=0)
    assert f["useful"] == 0 and f["useful_per_hour"] is None and f["useful_per_mtok"] is None
    assert f["covered_inputs"] == 0 and f["full_inputs"] == 0


def test_samples_from_an_export(tmp_path):
    out = tmp_path / "x.jsonl"
    rows = [{"id": 7, "sample": 0, "correct": True, "final_answer": "4", "finish_reason": "eos",
             "usage": {"completion_tokens": 9}},
            {"id": 7, "sample": 1, "correct": None, "final_answer": None, "finish_reason": "length",
             "usage": {"completion_tokens": 30}}]
    out.write_text("".join(json.dumps(r) + "\n" for r in rows))
    assert yb.samples_from_export(yb.export_rows(out)) == [Sample("7", True, "4", "eos"),
                                                           Sample("7", None, None, "length")]


def _settings(**kw) -> YieldSettings:
    return YieldSettings(**{"n": 4, "want": 2, "methods": ("ar",), "batch_size": 8, "seed": 3, **kw})


def test_the_semjobs_commands():
    s = _settings(engine_args={"max_model_len": 4096}, draft_engine_args={"enforce_eager": True})
    fixed = yb.semjobs_command("fixed_n", "ar", s, Path("p.jsonl"), Path("o.jsonl"), "sqlite:///x")
    want = yb.semjobs_command("want_k", "semspec", s, Path("p.jsonl"), Path("o.jsonl"), "sqlite:///x")
    assert fixed[2:6] == ["semjobs.cli", "run", "p.jsonl", "-o"]
    assert "--keep-loops" in fixed and "--want" not in fixed
    assert want[want.index("--want") + 1] == "2" and "--keep-loops" not in want
    for cmd, method in ((fixed, "ar"), (want, "semspec")):
        opts = dict(zip(cmd[6:], cmd[7:]))
        assert opts["--n"] == "4" and opts["--method"] == method and opts["--seed"] == "3"
        assert opts["--batch-size"] == "8" and opts["--db"] == "sqlite:///x" and opts["--max-new-tokens"] == "256"
        assert opts["--temperature"] == "0.6" and opts["--top-p"] == "0.95"
        assert opts["--engine-arg"] == "max_model_len=4096" and opts["--draft-engine-arg"] == "enforce_eager=true"
        assert "--no-resume" in cmd and "--force" in cmd


def _fake_run(monkeypatch, status: dict, rows: list[dict], code: int = 0) -> list:
    """`semjobs run` stubbed: writes ``rows`` as its export, prints a job id; job_status gives ``status``."""
    calls = []

    def run(cmd, stdout, stderr, text, env):
        calls.append((cmd, env))
        Path(cmd[cmd.index("-o") + 1]).write_text("".join(json.dumps(r) + "\n" for r in rows))
        return subprocess.CompletedProcess(cmd, code, stdout="job abc: 4 items\nabc\n")

    monkeypatch.setattr(yb.subprocess, "run", run)
    monkeypatch.setattr("semjobs.jobs.status.job_status", lambda job_id, url: status if job_id == "abc" else None)
    return calls


ROWS = [{"id": "a", "correct": True, "final_answer": "4", "finish_reason": "eos"},
        {"id": "a", "correct": True, "final_answer": "4", "finish_reason": "repetition"},
        {"id": "b", "correct": False, "final_answer": "3", "finish_reason": "length"}]


def _status(**kw) -> dict:
    return {"elapsed_s": 90.0, "generated_tokens": 1000, "counts": {"failed": 0, "unneeded": 2},
            "manifest": {"identities": {"dtype": "float32"}},
            "yield": {"want": 2, "kept": 2, "useful": 2, "inputs": 2, "covered_inputs": 1, "full_inputs": 1,
                      "spent_tokens": 1500}, **kw}


def test_a_semjobs_arm_counts_the_spent_tokens(monkeypatch, tmp_path):
    status = _status()
    calls = _fake_run(monkeypatch, status, ROWS)
    (tmp_path / "ar_want_k.sqlite-wal").write_text("an earlier bench's")
    f = yb.semjobs_arm("want_k", "ar", _settings(env={"SEMJOBS_DTYPE": "float32"}), tmp_path / "p.jsonl",
                       ["a", "b"], tmp_path)
    assert f["generated_tokens"] == 1500  # cut and aborted samples' tokens too, not only the 1000 finished
    assert f["wall_seconds"] == 90.0 and f["useful"] == 2 and f["useful_per_hour"] == 80.0
    assert f["covered_inputs"] == 1 and f["unneeded_samples"] == 2 and f["job_id"] == "abc"
    assert f["job_yield"] == status["yield"] and f["dtype"] == "float32"
    # the job's own count and the export's agree
    assert (f["kept_samples"], f["useful"]) == (status["yield"]["kept"], status["yield"]["useful"])
    cmd, env = calls[0]
    assert env["SEMJOBS_DTYPE"] == "float32"
    assert cmd[cmd.index("--db") + 1] == f"sqlite:///{(tmp_path / 'ar_want_k.sqlite').resolve()}"
    assert f["command"].startswith("semjobs run ")
    assert not (tmp_path / "ar_want_k.sqlite-wal").exists()
    assert f["loops"] == {"repetition_samples": 1}


def test_a_fixed_n_arm_caps_useful_at_want(monkeypatch, tmp_path):
    # the job wants nothing, so its own `useful` is every kept sample; the bench's counts K per input
    status = _status(counts={"failed": 1, "unneeded": 0})
    status["yield"].update(want=None, full_inputs=None)
    _fake_run(monkeypatch, status, ROWS, code=3)  # 3: some samples failed, the rest count
    monkeypatch.setattr(yb, "loops", lambda arm, rows: {"audited": len(rows)})  # semjobs.jobs.loop_audit's test
    f = yb.semjobs_arm("fixed_n", "ar", _settings(want=1), tmp_path / "p.jsonl", ["a", "b"], tmp_path)
    assert f["useful"] == 1 and f["kept_samples"] == 2 and f["full_inputs"] == 1 and f["failed_samples"] == 1


def test_a_failed_semjobs_run_fails_the_bench(monkeypatch, tmp_path):
    _fake_run(monkeypatch, {}, ROWS, code=2)
    with pytest.raises(RuntimeError, match="exited 2; see .*ar_fixed_n.log"):
        yb.semjobs_arm("fixed_n", "ar", _settings(), tmp_path / "p.jsonl", ["a"], tmp_path)


def _arm(useful: int) -> dict:
    return yb.figures([_right("a")] * useful, ["a", "b"], want=4, wall_seconds=3600.0, generated_tokens=1_000_000)


def test_results_json_holds_every_arm_of_every_method(monkeypatch, tmp_path):
    plain_runs, semjobs_runs = [], []
    monkeypatch.setattr(yb, "vllm_arm", lambda problems, ids, s: plain_runs.append(ids) or _arm(1))
    monkeypatch.setattr(yb, "semjobs_arm", lambda arm, method, s, path, ids, out: semjobs_runs.append(
        (method, arm, path.name)) or _arm(2 if arm == "fixed_n" else 3))
    problems = [{"id": "a", "prompt": "1+1?", "answer": "2", "source": "generated:add_tiny"},
                {"id": "b", "prompt": "2+2?", "answer": "4", "source": "gsm8k-test:301"}]
    s = _settings(methods=("ar", "semspec"), env={"SEMJOBS_DTYPE": "float32"})
    res = yb.run_yield(s, problems, "mixed:2", tmp_path, lambda msg: None, command="semjobs bench --yield")
    assert plain_runs == [["a", "b"]]  # once, for every method
    assert semjobs_runs == [("ar", "fixed_n", "problems.jsonl"), ("ar", "want_k", "problems.jsonl"),
                            ("semspec", "fixed_n", "problems.jsonl"), ("semspec", "want_k", "problems.jsonl")]
    written = json.loads((tmp_path / "results.json").read_text())
    assert written == json.loads(json.dumps(res))
    for method in ("ar", "semspec"):
        assert list(written["yield"][method]) == ["fixed_n", "vllm_fixed_n", "want_k"]
        for arm in yb.ARMS:
            assert all(key in written["yield"][method][arm] for key in CONTRACT)
        assert written["yield"][method]["vllm_fixed_n"]["useful"] == 1
    st = written["settings"]
    assert (st["n"], st["want"], st["batch_size"], st["seed"], st["temperature"], st["top_p"],
            st["max_new_tokens"]) == (4, 2, 8, 3, 0.6, 0.95, 256)
    assert st["problems"] == "mixed:2" and st["overrides"] == {"SEMJOBS_DTYPE": "float32"}
    assert isinstance(st["cpu_flags"], list) and "env" not in st
    assert written["problems"] == {"generated:add_tiny": 1, "gsm8k-test": 1}
    assert [json.loads(line) for line in (tmp_path / "problems.jsonl").read_text().splitlines()] == problems
    table = yb.table(res).splitlines()
    assert len(table) == 1 + 6 and table[0].split()[:3] == ["method", "arm", "useful"]
    assert table[2].split()[:5] == ["ar", "vllm_fixed_n", "1", "1.0", "1.0"]


def test_overrides_reach_the_settings_and_the_runs(monkeypatch):
    from semjobs.settings import settings

    for name in ("dtype", "kv_cache_gb", "target_model"):
        monkeypatch.setattr(settings, name, getattr(settings, name))
    env = yb.apply_overrides(target="embedded:x", draft=None, dtype="float32", kv_cache_gb=1.5, device="auto")
    assert env == {"SEMJOBS_TARGET_MODEL": "embedded:x", "SEMJOBS_DTYPE": "float32", "SEMJOBS_KV_CACHE_GB": "1.5"}
    assert (settings.target_model, settings.dtype, settings.kv_cache_gb) == ("embedded:x", "float32", 1.5)


def test_cpu_flags_are_known_ones():
    assert set(yb.cpu_flags()) <= set(yb.CPU_FLAGS)


# ------------------------------------------------------------------------- the command


def _bench(args: list[str]):
    from semjobs.cli.bench import bench

    return CliRunner().invoke(bench, ["--yield", "--out", "unused", *args])


@pytest.mark.parametrize("args, problem", [
    (["--n", "2", "--want", "3"], "3 kept samples of at most 2"),
    (["--problems", "mixed"], "expected mixed:COUNT"),
    (["--problems", "easy:4"], "expected mixed:COUNT"),
    (["--methods", "ar,hf_generate"], "hf_generate: --yield runs semjobs' methods"),
    (["--batch-size", "4,8"], "--yield runs one batch size"),
])
def test_bench_yield_refuses(args, problem):
    result = _bench(args)
    assert result.exit_code == 2 and problem in result.output


def test_bench_yield_wiring(monkeypatch, tmp_path):
    from semjobs.settings import settings

    monkeypatch.setattr(settings, "dtype", settings.dtype)
    seen = {}

    def fake(s, problems, spec, out, say, command=None, environment=None):
        seen.update(s=s, problems=problems, spec=spec, out=out, environment=environment)
        return {"yield": {"ar": {arm: _arm(1) for arm in yb.ARMS}}}

    monkeypatch.setattr(yb, "run_yield", fake)
    result = _bench(["--problems", "mixed:16", "--n", "3", "--want", "2", "--dtype", "float32", "-q"])
    assert result.exit_code == 0, result.output
    s = seen["s"]
    assert s.methods == ("ar", "semspec") and (s.n, s.want) == (3, 2)  # --methods' default is not --yield's
    assert s.batch_size == settings.batch_size and s.env == {"SEMJOBS_DTYPE": "float32"}
    assert len(seen["problems"]) == 16 and seen["spec"] == "mixed:16" and seen["environment"]["cpu_count"] >= 1
    assert "vllm_fixed_n" in result.output

    result = _bench(["--limit", "3", "--offset", "200", "--methods", "token_sd", "--batch-size", "4", "-q"])
    assert result.exit_code == 0, result.output
    assert seen["s"].methods == ("token_sd",) and seen["s"].batch_size == 4
    assert [p["source"] for p in seen["problems"]] == ["prompts:201", "prompts:202", "prompts:203"]


@pytest.mark.slow
@pytest.mark.real_model
def test_the_plain_vllm_arm_with_real_smollm2(monkeypatch):
    from semjobs.jobs import yield_vllm
    from semjobs.settings import settings
    from tests.conftest import require_vllm

    require_vllm()
    monkeypatch.setattr(settings, "processes", None)
    problems = [{"id": "a", "prompt": "What is 2 + 2? Answer with just the number.", "answer": "4"}]
    samples, wall, args = yield_vllm.run(problems, 3, 0.6, 0.95, 8, 0, 4)
    assert sorted(s.sample for s in samples) == [0, 1, 2] and {s.input_id for s in samples} == {"a"}
    assert all(0 < s.tokens <= 8 and s.finish_reason in ("eos", "length") for s in samples)
    assert wall > 0 and args["max_num_seqs"] == 4
    again, _, _ = yield_vllm.run(problems, 3, 0.6, 0.95, 8, 0, 4)
    assert again == samples  # seeded: a rerun draws the same samples


def _row(input_id: str, sample: int, correct: bool, finish: str = "eos", tokens: int = 10) -> dict:
    return {"id": input_id, "sample": sample, "correct": correct, "final_answer": None, "finish_reason": finish,
            "usage": {"completion_tokens": tokens}}


def test_the_doomed_figures_say_which_right_samples_the_rule_cost():
    """A stopped sample whose twin in fixed_n (same input, same index: the same seed) ended
    right is a right sample lost; recall is over the right twins want_k decoded."""
    fixed = [_row("a", 0, True), _row("a", 1, False), _row("b", 0, True), _row("b", 1, True), _row("c", 0, False)]
    want = [_row("a", 0, False, "doomed", 96), _row("a", 1, False, "doomed", 120), _row("b", 0, True),
            _row("c", 0, False, "length", 512)]  # b's sample 1: never decoded (b had what it wanted)
    got = yb.doomed(want, fixed)
    assert got == {"samples": 2, "tokens": 216, "right_stopped": 1, "right_decoded": 2, "recall": 0.5}
    assert yb.doomed([], fixed)["recall"] is None


def test_only_the_want_k_arm_gets_the_doom_rule(monkeypatch, tmp_path):
    calls = _fake_run(monkeypatch, _status(), ROWS)
    monkeypatch.setattr(yb, "loops", lambda arm, rows: {})
    monkeypatch.setenv("SEMJOBS_DOOM_RULE", "/elsewhere/rule.json")
    s = _settings(doom_rule="rule.json")
    for arm in ("fixed_n", "want_k"):
        yb.semjobs_arm(arm, "ar", s, tmp_path / "p.jsonl", ["a", "b"], tmp_path)
    (fixed_cmd, fixed_env), (_, want_env) = calls
    assert "SEMJOBS_DOOM_RULE" not in fixed_env and "--keep-doomed" in fixed_cmd
    assert want_env["SEMJOBS_DOOM_RULE"] == str(Path("rule.json").resolve())
