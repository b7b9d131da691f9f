"""The bench end to end on tiny random models: interleaved runs, reports, plots, the CLI."""

from __future__ import annotations

import json

import pytest

from semspec.benchmark.report import pareto_front, write_report
from semspec.benchmark.runner import BenchSettings, load_prompts, run_bench
from semspec.engine import Engine
from semspec.probes import ProbePair

QUESTIONS = [
    ("Natalia sold 48 clips in April and half as many in May. How many clips in total?", "72"),
    ("What is 7 times 6?", "42"),
]


@pytest.fixture(scope="module")
def prompts_file(tmp_path_factory):
    p = tmp_path_factory.mktemp("bench") / "gsm8k.jsonl"
    p.write_text("".join(json.dumps({"question": q, "answer": f"work\n#### {a}"}) + "\n" for q, a in QUESTIONS))
    return p


def settings(prompts_file, **kw):
    base = dict(prompts=str(prompts_file), limit=2, max_new_tokens=24, max_step_tokens=8, temperature=0.0)
    base.update(kw)
    return BenchSettings(**base)


def test_load_prompts(prompts_file):
    ps = load_prompts(prompts_file, limit=1, offset=1)
    assert ps == [{"id": "1", "line": 1, "prompt": QUESTIONS[1][0], "reference": "42"}]
    with pytest.raises(ValueError):
        load_prompts(prompts_file, offset=5)


@pytest.fixture(scope="module")
def greedy_reject_run(tiny_target, tiny_draft, prompts_file):
    engine = Engine(tiny_target, tiny_draft, ProbePair.always_reject(64, 64))
    methods = ("ar", "token_sd", "hf_assisted", "step_judge", "semspec", "hf_generate")
    return run_bench(engine, settings(prompts_file, methods=methods))


def test_greedy_lossless_methods_reproduce_ar(greedy_reject_run):
    br = greedy_reject_run
    assert "ar_2" not in br.runs and not br.skipped and not br.errors
    ar = [r["text"] for r in br.runs["ar"]]
    # greedy token_sd and transformers' assisted decoding are exact; semspec rejecting every
    # step is the target alone
    for label in ("token_sd", "hf_assisted", "hf_generate", "semspec"):
        assert [r["text"] for r in br.runs[label]] == ar, label
    from semspec.benchmark.metrics import method_figures

    assert method_figures(br.runs["token_sd"], br.runs["ar"], br.prompts)["identical_to_ar"] == 1.0
    sem = br.runs["semspec"][0]
    assert sem["steps_drafted"] > 0 and sem["steps_accepted"] == 0
    hf = br.runs["hf_assisted"][0]
    assert hf["target_forward_passes"] > 0 and hf["draft_forward_passes"] > 0
    assert all(r.get("target_mean_loglik") is not None for r in br.runs["ar"])


def test_hf_assisted_runs_the_drafts_reduced_head_and_stays_exact(tiny_target, tiny_draft, prompts_file):
    import dataclasses

    import torch

    reduced = dataclasses.replace(tiny_draft, vocab_ids=torch.arange(0, tiny_draft.vocab_size, 3))
    head = tiny_draft.model.get_output_embeddings()
    seen = []
    hook = tiny_draft.model.register_forward_hook(
        lambda mod, args, out: seen.append(int(torch.isfinite(out.logits[0, -1]).sum())))
    try:
        br = run_bench(Engine(tiny_target, reduced), settings(prompts_file, methods=("ar", "hf_assisted")))
    finally:
        hook.remove()
    assert [r["text"] for r in br.runs["hf_assisted"]] == [r["text"] for r in br.runs["ar"]]
    assert seen and set(seen) == {len(reduced.vocab_ids)}  # every assistant pass: reduced rows only
    assert tiny_draft.model.get_output_embeddings() is head


def test_report_files_and_required_keys(tiny_target, tiny_draft, prompts_file, tmp_path):
    engine = Engine(tiny_target, tiny_draft, ProbePair.constant(0.7, 0.9, 64, 64))
    br = run_bench(engine, settings(prompts_file, temperature=0.8, taus=(0.0, 0.9), loglik=False))
    res = write_report(br, tmp_path, engine=engine, command="semjobs bench --test")
    for name in ("results.json", "results.md", "pareto.png", "step_acceptance.png"):
        assert (tmp_path / name).stat().st_size > 0, name
    doc = json.loads((tmp_path / "results.json").read_text())
    assert doc["ar_self_agreement"] is not None
    assert set(doc["methods"]) == {"ar", "ar_2", "token_sd", "hf_assisted", "step_judge", "semspec", "semspec@tau=0.9"}
    for label, m in doc["methods"].items():
        assert m["prompts_run"] == 2, label
        assert "speedup_vs_ar" in m and "answer_agreement_vs_ar" in m
    assert doc["methods"]["semspec@tau=0.9"]["step_acceptance_rate"] == 0.0  # p_T 0.7 is under the floor
    env = doc["environment"]
    assert env["torch_threads"] >= 1 and env["versions"]["torch"] and "target" in env["models"]
    assert len(doc["prompts"]) == 2 and set(doc["prompts"][0]["runs"]) == set(res["methods"])
    md = (tmp_path / "results.md").read_text()
    assert "| semspec@tau=0.9 |" in md and "ar_self_agreement" in md


def test_methods_without_their_models_are_skipped(tiny_target, prompts_file, tmp_path):
    engine = Engine(tiny_target)
    br = run_bench(engine, settings(prompts_file, limit=1, methods=("ar", "token_sd", "semspec"), max_step_tokens=None))
    assert set(br.runs) == {"ar"} and set(br.skipped) == {"token_sd", "semspec"}
    res = write_report(br, tmp_path, engine)
    assert res["methods"]["semspec"]["skipped"] == "no draft model loaded"
    assert res["goal"]["evaluated"] is False
    # the step rule is recorded as run: the engine's default here, no probes to take it from
    assert (res["settings"]["step_delimiter"], res["settings"]["max_step_tokens"]) == ("\n\n", 64)


def test_pareto_front():
    assert pareto_front([(0.9, 1.0), (0.8, 2.0), (0.7, 1.5), (1.0, 0.5)]) == [(0.8, 2.0), (0.9, 1.0), (1.0, 0.5)]


def test_cli_bench(tiny_dirs, prompts_file, tmp_path):
    from click.testing import CliRunner

    from cli.main import main

    out = tmp_path / "out"
    r = CliRunner().invoke(main, [
        "bench", "--prompts", str(prompts_file), "--limit", "1", "--methods", "ar,semspec,step_judge",
        "--target", str(tiny_dirs["target"]), "--draft", str(tiny_dirs["draft"]), "--probes", "accept",
        "--max-new-tokens", "12", "--temperature", "0", "--out", str(out), "--cache-dir", str(tmp_path / "c"),
        "--threads", "1", "--no-loglik", "-q", "--step-delimiter", "\\n", "--max-step-tokens", "6",
        "--attempts", "1,2",
    ])
    assert r.exit_code == 0, r.output
    doc = json.loads((out / "results.json").read_text())
    assert doc["methods"]["semspec"]["step_acceptance_rate"] == 1.0
    assert doc["settings"]["step_delimiter"] == "\n" and doc["settings"]["max_step_tokens"] == 6
    assert doc["methods"]["semspec@attempts=2"]["draft_attempts"] == 2
    assert (out / "runs.jsonl").read_text().count("\n") == 4
    assert "semspec" in r.output
    bad = CliRunner().invoke(main, ["bench", "--prompts", str(prompts_file), "--methods", "beam", "--out", str(out)])
    assert bad.exit_code != 0 and "unknown method" in bad.output
    bad = CliRunner().invoke(main, ["bench", "--prompts", str(prompts_file), "--attempts", "1,x", "--out", str(out)])
    assert bad.exit_code != 0 and "comma-separated ints" in bad.output


def test_interrupted_run_keeps_the_finished_prompts(tiny_target, tiny_draft, prompts_file, tmp_path, monkeypatch):
    from semspec.benchmark import runner

    engine = Engine(tiny_target, tiny_draft, ProbePair.always_accept(64, 64))
    calls = {"n": 0}
    real = runner.run_engine

    def flaky(*a, **kw):
        calls["n"] += 1
        if calls["n"] == 5:  # ar and semspec warm-ups, prompt 1's two runs, then prompt 2
            raise KeyboardInterrupt
        return real(*a, **kw)

    monkeypatch.setattr(runner, "run_engine", flaky)
    br = run_bench(engine, settings(prompts_file, methods=("ar", "semspec"), loglik=False))
    assert br.interrupted and len(br.prompts) == 1 and all(len(v) == 1 for v in br.runs.values())
    res = write_report(br, tmp_path)
    assert res["interrupted"] and res["methods"]["semspec"]["prompts_run"] == 1
    assert "Stopped early" in (tmp_path / "results.md").read_text()


def test_a_compared_draft_runs_beside_the_main_one(tiny_target, tiny_draft, prompts_file, tmp_path):
    """--compare-drafts: a draft head saved on disk runs token_sd on the same prompts in the
    same run, labelled by its name, and stays exact (greedy)."""
    from semspec.head import HeadModel, save_head, target_fingerprint

    save_head(HeadModel(tiny_target.model), None, {"target": target_fingerprint(tiny_target.model)},
              tmp_path / "myhead")
    engine = Engine(tiny_target, tiny_draft)
    br = run_bench(engine, settings(prompts_file, methods=("ar", "token_sd", "hf_assisted", "semspec"), loglik=False,
                                    compare_drafts=(str(tmp_path / "myhead"),)))
    assert {"token_sd", "token_sd@draft=myhead"} <= set(br.runs)
    assert "semspec@draft=myhead" in br.skipped and "semspec" in br.skipped  # no probes for either
    assert "hf_assisted@draft=myhead" not in br.runs
    for a, b in zip(br.runs["ar"], br.runs["token_sd@draft=myhead"]):
        assert a["text"] == b["text"]
    assert all(r["drafted_tokens"] > 0 for r in br.runs["token_sd@draft=myhead"])
