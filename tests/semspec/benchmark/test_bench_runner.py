"""The bench end to end on a tiny random model on vLLM (its own draft): interleaved runs,
reports, plots, the CLI. One set of engines for the module: each vLLM start costs seconds."""

from __future__ import annotations

import dataclasses
import gc
import json

import pytest

from semspec.benchmark.engines import BenchEngines
from semspec.benchmark.report import pareto_front, write_report
from semspec.benchmark.runner import BenchSettings, load_prompts, run_bench
from semspec.probes import ProbePair
from tests.conftest import require_vllm

QUESTIONS = [
    ("Natalia sold 48 clips in April and half as many in May. How many clips in total?", "72"),
    ("What is 7 times 6?", "42"),
]
ALL = ("ar", "token_sd", "hf_assisted", "step_judge", "semspec", "hf_generate")
HIDDEN = 256  # the tiny vLLM model's, target and draft alike


@pytest.fixture(scope="module")
def prompts_file(tmp_path_factory):
    p = tmp_path_factory.mktemp("bench") / "gsm8k.jsonl"
    p.write_text("".join(json.dumps({"question": q, "answer": f"work\n#### {a}"}) + "\n" for q, a in QUESTIONS))
    return p


def settings(prompts_file, **kw):
    base = dict(prompts=str(prompts_file), limit=2, max_new_tokens=24, max_step_tokens=8, temperature=0.0)
    base.update(kw)
    return BenchSettings(**base)


@pytest.fixture(scope="module")
def engines(tiny_vllm_dir, tiny_cache, prompts_file):
    """Every method planned, the model its own draft, probes rejecting every step, and ngram
    as a second draft: a step engine (target and draft), token_sd's engine (the model drafting
    for itself, vLLM's draft_model) and ngram's start."""
    require_vllm()
    from semspec.benchmark.engines import load_engines

    model = str(tiny_vllm_dir)
    loaded = load_engines(settings(prompts_file, methods=ALL, compare_drafts=("ngram",)), model, draft=model,
                          probes="reject", device="cpu", cache_dir=tiny_cache, dtype="float32", kv_cache_gb=0.1)
    yield loaded
    del loaded
    gc.collect()  # gone before the next module's engines start


@pytest.fixture
def probes(engines):
    """Set the step engine's probes for one test (its states are the last layer's, which
    constant probes read); rejecting every step again afterwards."""
    def use(pair: ProbePair) -> None:
        engines.steps.probes = pair

    yield use
    engines.steps.probes = ProbePair.always_reject(HIDDEN, HIDDEN)


def test_load_prompts(prompts_file):
    ps = load_prompts(prompts_file, limit=1, offset=1)
    assert ps == [{"id": "1", "line": 1, "prompt": QUESTIONS[1][0], "reference": "42"}]
    with pytest.raises(ValueError):
        load_prompts(prompts_file, offset=5)


def test_pareto_front():
    assert pareto_front([(0.9, 1.0), (0.8, 2.0), (0.7, 1.5), (1.0, 0.5)]) == [(0.8, 2.0), (0.9, 1.0), (1.0, 0.5)]


@pytest.fixture(scope="module")
def greedy_reject_run(engines, prompts_file):
    return run_bench(engines, settings(prompts_file, methods=ALL, compare_drafts=("ngram",)))


def test_greedy_lossless_methods_reproduce_ar(greedy_reject_run):
    br = greedy_reject_run
    assert "ar_2" not in br.runs and not br.errors
    # ngram drafts no steps
    assert set(br.skipped) == {"step_judge@draft=ngram", "semspec@draft=ngram"}
    ar = [r["text"] for r in br.runs["ar"]]
    # greedy from the same float32 weights: token_sd (vLLM's speculation, drafting with the
    # model itself or with ngram), transformers'
    # generate with and without its assistant, and the steps the draft (the target itself)
    # writes, rejected or judged, are all ar's text
    for label in ("token_sd", "token_sd@draft=ngram", "hf_assisted", "hf_generate", "semspec", "step_judge"):
        assert [r["text"] for r in br.runs[label]] == ar, label
    from semspec.benchmark.metrics import method_figures

    assert method_figures(br.runs["token_sd@draft=ngram"], br.runs["ar"], br.prompts)["identical_to_ar"] == 1.0
    sem = br.runs["semspec"][0]
    assert sem["steps_drafted"] > 0 and sem["steps_accepted"] == 0 and sem["draft_seconds"] > 0
    hf = br.runs["hf_assisted"][0]
    assert hf["target_forward_passes"] > 0 and hf["draft_forward_passes"] > 0
    assert all(r.get("target_mean_loglik") is not None for r in br.runs["ar"])


def test_report_records_the_engines_and_the_skipped_runs(greedy_reject_run, engines, tmp_path):
    res = write_report(greedy_reject_run, tmp_path, engine=engines, command="semjobs bench --test")
    skipped = "semspec@draft=ngram"
    assert res["methods"][skipped]["skipped"] == greedy_reject_run.skipped[skipped]
    env = res["environment"]
    assert env["models"]["engine"].startswith("vllm ") and env["models"]["draft=ngram"].startswith("ngram@")
    assert env["device"] == "cpu" and env["dtype"] == "float32" and set(env["model_specs"]) == {"target", "draft"}
    # the step rule is recorded as run: this test's token cap, the default delimiter
    assert (res["settings"]["step_delimiter"], res["settings"]["max_step_tokens"]) == ("\n\n", 8)


def test_report_records_each_semspec_lanes_floor_from_its_own_probes(greedy_reject_run, engines, tmp_path):
    """A compare_drafts lane decodes with its own draft's probes: the floor recorded for it is
    the one its engine applied, not the main lane's."""
    from semspec.benchmark.runner import MethodRun

    class LaneEngine:  # a compare lane's step engine, as much of it as the report reads
        identities = engines.steps.identities

        def resolve(self, config):
            return dataclasses.replace(engines.steps.resolve(config), tau=0.25)

    lane = "semspec@draft=other"
    br = dataclasses.replace(greedy_reject_run, plan=[*greedy_reject_run.plan, MethodRun(lane, "semspec", draft="other")],
                             runs={**greedy_reject_run.runs, lane: greedy_reject_run.runs["semspec"]})
    with_lane = dataclasses.replace(engines, serving={**engines.serving, ("other", "semspec"): LaneEngine()})
    res = write_report(br, tmp_path, engine=with_lane, command="semjobs bench --test")
    assert res["methods"]["semspec"]["tau"] == 0.0 and res["methods"][lane]["tau"] == 0.25
    assert "tau" not in res["methods"]["semspec@draft=ngram"]  # skipped: it ran with none


def test_hf_assisted_runs_the_drafts_reduced_head_and_stays_exact(engines, prompts_file):
    import torch

    draft = engines.assistant
    reduced = dataclasses.replace(draft, vocab_ids=torch.arange(0, draft.vocab_size, 3))
    head = draft.model.get_output_embeddings()
    seen = []
    hook = draft.model.register_forward_hook(
        lambda mod, args, out: seen.append(int(torch.isfinite(out.logits[0, -1]).sum())))
    only_hf = BenchEngines(serving={(None, "ar"): engines.steps}, target=engines.target, assistant=reduced)
    try:
        br = run_bench(only_hf, settings(prompts_file, methods=("ar", "hf_assisted"), loglik=False))
    finally:
        hook.remove()
    assert [r["text"] for r in br.runs["hf_assisted"]] == [r["text"] for r in br.runs["ar"]]
    assert seen and set(seen) == {len(reduced.vocab_ids)}  # every assistant pass: reduced rows only
    assert draft.model.get_output_embeddings() is head


def test_report_files_and_required_keys(engines, probes, prompts_file, tmp_path):
    probes(ProbePair.constant(0.7, 0.9, HIDDEN, HIDDEN))
    br = run_bench(engines, settings(prompts_file, temperature=0.8, taus=(None, 0.9), loglik=False,
                                     methods=("ar", "hf_assisted", "step_judge", "semspec")))
    res = write_report(br, tmp_path, engine=engines, command="semjobs bench --test")
    for name in ("results.json", "results.md", "pareto.png", "step_acceptance.png"):
        assert (tmp_path / name).stat().st_size > 0, name
    doc = json.loads((tmp_path / "results.json").read_text())
    assert doc["ar_self_agreement"] is not None
    assert set(doc["methods"]) == {"ar", "ar_2", "hf_assisted", "step_judge", "semspec", "semspec@tau=0.9"}
    for label, m in doc["methods"].items():
        assert m["prompts_run"] == 2, label
        assert "speedup_vs_ar" in m and "answer_agreement_vs_ar" in m
    assert doc["methods"]["semspec@tau=0.9"]["step_acceptance_rate"] == 0.0  # p_T 0.7 is under the floor
    assert doc["methods"]["semspec"]["tau"] == 0.0  # the floor it ran with: these probes have none
    env = doc["environment"]
    assert env["torch_threads"] >= 1 and env["versions"]["torch"] and "target" in env["models"]
    assert len(doc["prompts"]) == 2 and set(doc["prompts"][0]["runs"]) == set(res["methods"])
    md = (tmp_path / "results.md").read_text()
    assert "| semspec@tau=0.9 |" in md and "ar_self_agreement" in md


def test_runs_without_an_engine_are_skipped_with_the_reason(engines, prompts_file, tmp_path):
    target_only = BenchEngines(serving={(None, "ar"): engines.steps},
                               unavailable={(None, "semspec"): "method 'semspec' needs probes: none were loaded"})
    br = run_bench(target_only, settings(prompts_file, limit=1, loglik=False,
                                         methods=("ar", "step_judge", "semspec", "hf_generate")))
    assert set(br.runs) == {"ar"} and set(br.skipped) == {"step_judge", "semspec", "hf_generate"}
    res = write_report(br, tmp_path, target_only)
    assert res["methods"]["semspec"]["skipped"] == "method 'semspec' needs probes: none were loaded"
    assert res["methods"]["hf_generate"]["skipped"] == "the transformers target was not loaded"
    assert res["goal"]["evaluated"] is False


def test_interrupted_run_keeps_the_finished_prompts(engines, probes, prompts_file, tmp_path, monkeypatch):
    from semspec.benchmark import runner

    probes(ProbePair.always_accept(HIDDEN, HIDDEN))
    calls = {"n": 0}
    real = runner.run_engine

    def flaky(*a, **kw):
        calls["n"] += 1
        if calls["n"] == 5:  # ar and semspec warm-ups, prompt 1's two runs, then prompt 2
            raise KeyboardInterrupt
        return real(*a, **kw)

    monkeypatch.setattr(runner, "run_engine", flaky)
    br = run_bench(engines, settings(prompts_file, methods=("ar", "semspec"), loglik=False))
    assert br.interrupted and len(br.prompts) == 1 and all(len(v) == 1 for v in br.runs.values())
    res = write_report(br, tmp_path)
    assert res["interrupted"] and res["methods"]["semspec"]["prompts_run"] == 1
    assert "Stopped early" in (tmp_path / "results.md").read_text()


def test_cli_bench(engines, probes, prompts_file, tmp_path, monkeypatch):
    """The CLI on the module's engines (load_engines is the fixture's own loader), with
    probes accepting every step as --probes accept would load them."""
    from click.testing import CliRunner

    from semjobs.cli.main import main
    from semspec.benchmark import engines as bench_engines

    probes(ProbePair.always_accept(HIDDEN, HIDDEN))
    monkeypatch.setattr(bench_engines, "load_engines", lambda *a, **kw: engines)
    out = tmp_path / "out"
    r = CliRunner().invoke(main, [
        "bench", "--prompts", str(prompts_file), "--limit", "1", "--methods", "ar,semspec,step_judge",
        "--probes", "accept", "--max-new-tokens", "12", "--temperature", "0", "--out", str(out),
        "--threads", "1", "--no-loglik", "-q", "--step-delimiter", "\\n", "--max-step-tokens", "6",
        "--attempts", "1,2", "--taus", "probes",
    ])
    assert r.exit_code == 0, r.output
    doc = json.loads((out / "results.json").read_text())
    assert doc["methods"]["semspec"]["step_acceptance_rate"] == 1.0
    assert doc["settings"]["step_delimiter"] == "\n" and doc["settings"]["max_step_tokens"] == 6
    assert doc["methods"]["semspec@attempts=2"]["draft_attempts"] == 2
    assert (out / "runs.jsonl").read_text().count("\n") == 4
    assert "semspec" in r.output


@pytest.mark.parametrize("args, error", [
    (["--methods", "beam"], "unknown method"),
    (["--attempts", "1,x"], "comma-separated ints"),
    (["--taus", "probes,x"], "comma-separated floats"),
    (["--draft", "first:2"], "built in memory"),
    (["--compare-drafts", "first:1"], "built in memory"),
    (["--compare-probes", "a"], "1 probes for 0 --compare-drafts"),
    (["--draft-stop-prob", "0.3"], "No such option"),
    (["--engine", "vllm"], "No such option"),
])
def test_cli_refuses_what_vllm_cannot_serve_before_loading(prompts_file, tmp_path, args, error):
    from click.testing import CliRunner

    from semjobs.cli.main import main

    r = CliRunner().invoke(main, ["bench", "--prompts", str(prompts_file), "--out", str(tmp_path), *args])
    assert r.exit_code == 2 and error in r.output, r.output


def test_forced_probes_are_saved_for_the_step_engine(tiny_vllm_dir, tiny_cache, tmp_path):
    from semspec.benchmark.engines import _probe_spec

    model = str(tiny_vllm_dir)
    saved = _probe_spec("const:0.7,0.2", model, model, tiny_cache, str(tmp_path))
    pair = ProbePair.load(saved)
    assert (pair.target.constant, pair.draft.constant) == (0.7, 0.2)
    assert _probe_spec("embedded:x", model, model, tiny_cache, str(tmp_path)) == "embedded:x"
    with pytest.raises(ValueError, match="const:P_T,P_D"):
        _probe_spec("const:0.7", model, model, tiny_cache, str(tmp_path))


def test_each_compared_draft_gets_the_probes_given_in_its_place_else_its_shipped_ones(prompts_file):
    from semspec.benchmark.engines import compare_lane_probes
    from semspec.components import EMBEDDED_DRAFT, default_probes

    given = settings(prompts_file, compare_drafts=("/m/built", EMBEDDED_DRAFT, "ngram"), compare_probes=("/p/built",))
    assert compare_lane_probes(given) == {"/m/built": "/p/built", EMBEDDED_DRAFT: default_probes(EMBEDDED_DRAFT, None),
                                          "ngram": None}
    assert default_probes(EMBEDDED_DRAFT, None) is not None  # the embedded draft's shipped probes
    with pytest.raises(ValueError, match="2 probes for 1 --compare-drafts"):
        compare_lane_probes(settings(prompts_file, compare_drafts=("ngram",), compare_probes=("a", "b")))
