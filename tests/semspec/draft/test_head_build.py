"""Building a draft head (`semjobs draft train --kind eagle`) on a tiny model vLLM runs: the
traces are the target's own answers decoded by vLLM (as are a layer draft's answers)
and leave the benchmark slice out, the
build is reproducible bit for bit, an interrupted training resumes to the same weights, and
the artifact serves token_sd in vLLM with the target's exact greedy text.

vLLM runs one engine per process and each start takes seconds: the module's tests share one
(``engines``), the plain engine first, then the one drafting with a built head; the CLI test
starts its own, as the command does."""

from __future__ import annotations

import dataclasses
import gc
import hashlib
import json

import pytest
import torch
from click.testing import CliRunner

from semspec.draft import head_build
from semspec.draft.config import DraftTrainConfig, HeadTrainConfig
from semspec.draft.head_build import build_head
from semspec.draft.head_data import Trace, build_traces, generate_traces, split_traces
from semspec.draft.head_train import resolve_train_dtype, train_head
from semspec.draft.train import target_answers
from semspec.head import HEAD_META, HEAD_WEIGHTS, HeadModel
from semspec.types import GenerationConfig
from semspec.engine.token_engine import DEFAULT_KV_CACHE_GB, VLLMEngine, engine_arguments
from tests.conftest import require_vllm

KV_CACHE_GB = 0.25  # ample for the tiny model's few short answers


class Engines:
    """The module's vLLM engine, one at a time: asking for another kind stops the last one."""

    def __init__(self, target_dir):
        self.target_dir = str(target_dir)
        self.kind, self.engine = None, None

    def plain(self) -> VLLMEngine:
        """float32, so greedy answers are transformers' own; batches of 4 as the builds' config."""
        return self._get("plain", lambda: VLLMEngine.load(self.target_dir, device="cpu", dtype="float32",
                                                          batch_size=4, kv_cache_gb=KV_CACHE_GB))

    def drafting(self, head_dir, tokens: int = 4) -> VLLMEngine:
        return self._get(f"{head_dir}/{tokens}", lambda: VLLMEngine.load(
            self.target_dir, draft=str(head_dir), device="cpu", dtype="float32", batch_size=2,
            kv_cache_gb=KV_CACHE_GB, speculative_tokens=tokens))

    def _get(self, kind: str, start) -> VLLMEngine:
        if self.kind != kind:
            self.close()
            self.engine, self.kind = start(), kind
        return self.engine

    def close(self) -> None:
        self.engine = self.kind = None
        gc.collect()


@pytest.fixture(scope="module")
def engines(tiny_vllm_dir):
    require_vllm()
    held = Engines(tiny_vllm_dir)
    yield held
    held.close()


@pytest.fixture(scope="module")
def questions(tmp_path_factory):
    path = tmp_path_factory.mktemp("q") / "q.jsonl"
    rows = [{"question": f"What is {i} plus {i + 1}?", "answer": f"#### {2 * i + 1}"} for i in range(30)]
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def _cfg(questions, **kw):
    base = dict(data=str(questions), holdout=4, greedy_prompts=8, sampled_prompts=8, reference_prompts=4,
                max_new_tokens=16, select_every=4, unroll=2,
                gen_batch_size=4, steps=12, batch_size=4, threads=1, eval_fraction=0.25, eval_depths=(1, 2, 4))
    base.update(kw)
    return HeadTrainConfig(**base)


def _sha(path):
    return hashlib.sha256(path.read_bytes()).hexdigest()


def test_traces_leave_out_the_benchmark_slice_and_greedy_ones_are_the_targets_own(engines, questions,
                                                                                 tiny_vllm_greedy):
    engine = engines.plain()
    traces = build_traces(engine, _cfg(questions), log=None)
    tok = engine.tokenizer
    prompts = [tok.decode(t.ids[: t.prompt_len]) for t in traces]
    assert len(traces) == 20 and [t.kind for t in traces] == ["greedy"] * 8 + ["sampled"] * 8 + ["reference"] * 4
    for i in range(4):  # the first `holdout` questions never appear
        assert not any(f"What is {i} plus {i + 1}?" in p for p in prompts)
    assert any("What is 4 plus 5?" in p for p in prompts)
    # the greedy questions are the first 8 of the sampled ones: each has two answers
    assert [t.question for t in traces] == [*range(8), *range(8), *range(8, 12)]
    assert prompts[3] == prompts[8 + 3]
    assert "#### 25" in tok.decode(traces[16].ids[traces[16].prompt_len:])  # the 9th question after the holdout: i = 12
    for t in traces[:2]:  # a greedy answer is what transformers' greedy decoding writes, EOS included
        text, finish, n = tiny_vllm_greedy(f"What is {t.question + 4} plus {t.question + 5}?", 16)
        answer = t.ids[t.prompt_len:]
        assert tok.decode(answer, skip_special_tokens=True) == text
        assert (answer[-1] == tok.eos_token_id) == (finish == "eos")
    assert sum(a.ids != b.ids for a, b in zip(traces[:8], traces[8:16])) >= 4  # sampled: other answers


def test_more_sampled_answers_keep_the_first_ones_and_draw_new_ones(engines, questions, tmp_path):
    engine = engines.plain()
    one = build_traces(engine, _cfg(questions), cache_dir=str(tmp_path), log=None)
    two = build_traces(engine, _cfg(questions, sampled_answers=2), cache_dir=str(tmp_path), log=None)
    assert [t.kind for t in two] == ["greedy"] * 8 + ["sampled"] * 16 + ["reference"] * 4
    assert [t.question for t in two] == [*range(8), *range(8), *range(8), *range(8, 12)]
    assert [t.ids for t in two[:16]] == [t.ids for t in one[:16]]  # round 1 as a one-answer build drew it
    second = two[16:24]
    assert all(a.ids[: a.prompt_len] == b.ids[: b.prompt_len] for a, b in zip(two[8:16], second))
    assert sum(a.ids != b.ids for a, b in zip(two[8:16], second)) >= 4  # other seeds, other answers
    uncached = build_traces(engine, _cfg(questions, sampled_answers=2), log=None)
    assert [t.ids for t in uncached] == [t.ids for t in two]


def test_a_layer_drafts_answers_are_the_targets_greedy_and_seeded_samples(engines, questions, tmp_path,
                                                                         tiny_vllm_greedy):
    """``semjobs draft train`` (the layer draft) decodes its answers with the same trace code:
    greedy ones, then sampled ones, each with a seed of its own, question by question."""
    engine = engines.plain()
    cfg = DraftTrainConfig(data=str(questions), holdout=4, gen_prompts=4, sampled_prompts=6, sampled_answers=2,
                           max_new_tokens=16, gen_batch_size=4)
    seqs = target_answers(engine, cfg, cache_dir=str(tmp_path))
    assert [s.source for s in seqs] == ["gen"] * 4 + ["sampled"] * 12
    assert [s.question for s in seqs] == [*range(4), *range(6), *range(6)]
    tok = engine.tokenizer
    assert "What is 4 plus 5?" in tok.decode(seqs[0].ids[: seqs[0].prompt_len])  # the holdout left out
    text, _, _ = tiny_vllm_greedy("What is 4 plus 5?", 16)
    assert tok.decode(seqs[0].ids[seqs[0].prompt_len:], skip_special_tokens=True) == text
    first, second = seqs[4:10], seqs[10:]
    assert all(a.ids[: a.prompt_len] == b.ids[: b.prompt_len] for a, b in zip(first, second))
    assert sum(a.ids != b.ids for a, b in zip(first, second)) >= 3  # round 2: other seeds, other answers
    assert [s.ids for s in target_answers(engine, cfg)] == [s.ids for s in seqs]  # uncached: the same samples


def test_trace_cache_serves_any_subset_and_resumes(engines, tmp_path):
    engine = engines.plain()
    qs = [f"What is {i} plus 1?" for i in range(6)]
    cfg = GenerationConfig(method="ar", temperature=0.6, top_p=0.95, max_new_tokens=8)
    first = generate_traces(engine, qs[:4], cfg, "sampled", 2, seed=7, cache_dir=str(tmp_path))
    (cache,) = tmp_path.glob("traces-*.jsonl")
    more = generate_traces(engine, qs, cfg, "sampled", 2, seed=7, cache_dir=str(tmp_path))
    assert [t.ids for t in more[:4]] == [t.ids for t in first]
    assert len(cache.read_text().splitlines()) == 6  # only the two new questions were decoded
    cache.write_text(cache.read_text() + '{"question": "cut sho')  # a line cut short by a kill
    again = generate_traces(engine, qs[:5], cfg, "sampled", 2, seed=7, cache_dir=str(tmp_path))
    assert [t.ids for t in again] == [t.ids for t in more[:5]]
    fresh = generate_traces(engine, qs, cfg, "sampled", 2, seed=7)  # no cache: the same samples
    assert [t.ids for t in fresh] == [t.ids for t in more]


def test_build_is_reproducible_and_serves_token_sd(engines, questions, tmp_path, tiny_vllm_dir, tiny_vllm_greedy):
    cfg = _cfg(questions)
    meta = build_head(cfg, tmp_path / "a", str(tiny_vllm_dir), cache_dir=str(tmp_path / "cache-a"),
                      engine=engines.plain())
    build_head(cfg, tmp_path / "b", str(tiny_vllm_dir), cache_dir=str(tmp_path / "cache-b"),  # from nothing again
               engine=engines.plain())
    assert _sha(tmp_path / "a" / HEAD_WEIGHTS) == _sha(tmp_path / "b" / HEAD_WEIGHTS)
    ev = meta["eval"]
    assert set(ev["top1_by_depth"]) == {"1", "2", "4"}
    assert all(0.0 <= v <= 1.0 for v in ev["top1_by_depth"].values() if v is not None)
    assert ev["positions_by_depth"]["1"] > 0 and ev["mean_accepted"] is not None
    assert meta["training"]["traces"] == {**meta["training"]["traces"], "train": 16, "selection": 1, "eval": 3,
                                          "dtype": "float32"}
    assert [h["step"] for h in meta["training"]["selection_history"]] == [4, 8, 12]
    written = json.loads((tmp_path / "a" / HEAD_META).read_text())
    assert written["target"]["signature"]["num_hidden_layers"] == 2 and written["format"] == "semspec-head/1"

    engine = engines.drafting(tmp_path / "a")
    assert engine.speculation.method == "eagle"
    for q in ("What is 2 plus 3?", "Hi"):
        sd = engine.generate(q, GenerationConfig(method="token_sd", max_new_tokens=24, temperature=0.0,
                                                 draft_tokens=4))
        text, finish, _ = tiny_vllm_greedy(q, 24)
        assert (sd.text, sd.finish_reason) == (text, finish) and sd.counters.drafted_tokens > 0


def test_cli_trains_a_head(engines, tiny_vllm_dir, questions, tmp_path, monkeypatch):
    """The command starts vLLM itself, for the traces only."""
    from semjobs.cli.main import main

    engines.close()
    started = []
    start = head_build.trace_engine

    def small_trace_engine(target_spec, cfg):
        started.append((target_spec, cfg.gen_batch_size, cfg.seed))
        return start(target_spec, cfg, kv_cache_gb=KV_CACHE_GB)

    monkeypatch.setattr(head_build, "trace_engine", small_trace_engine)
    out = tmp_path / "head"
    res = CliRunner().invoke(main, [
        "draft", "train", "--kind", "eagle", "--out", str(out), "--target", str(tiny_vllm_dir), "--data", str(questions),
        "--holdout", "4", "--greedy-prompts", "4", "--sampled-prompts", "4", "--reference-prompts", "2",
        "--max-new-tokens", "8",
        "--steps", "6", "--stop-after", "4", "--batch-size", "2", "--threads", "1", "--seed", "3",
        "--cache-dir", str(tmp_path / "cache"),
    ])
    assert res.exit_code == 0, res.output
    assert started == [(str(tiny_vllm_dir), HeadTrainConfig().gen_batch_size, 3)]
    assert (out / HEAD_WEIGHTS).is_file() and "held-out top-1 agreement by depth" in res.output
    meta = json.loads((out / HEAD_META).read_text())
    assert (meta["config"]["steps"], meta["config"]["stop_after"]) == (6, 4)
    assert meta["config"]["train_dtype"] in ("bfloat16", "float32")  # "auto" made concrete
    assert meta["training"]["traces"]["dtype"] in ("bfloat16", "float32")


def test_cli_trains_a_layer_draft_on_sampled_answers_too(engines, tiny_vllm_dir, questions, tmp_path, monkeypatch):
    """``--sampled-prompts`` for the layer draft: vLLM decodes the answers; the artifact says
    what it trained and scored on, and how its answers were decoded."""
    from semjobs.cli.main import main

    engines.close()
    started = []
    start = head_build.trace_engine

    def small_trace_engine(target_spec, cfg):
        started.append(target_spec)
        return start(target_spec, cfg, kv_cache_gb=KV_CACHE_GB)

    monkeypatch.setattr(head_build, "trace_engine", small_trace_engine)
    out = tmp_path / "draft"
    res = CliRunner().invoke(main, [
        "draft", "train", "--out", str(out), "--target", str(tiny_vllm_dir), "--data", str(questions),
        "--holdout", "4", "--gen-prompts", "8", "--sampled-prompts", "8", "--sampled-answers", "2",
        "--ref-prompts", "2", "--max-new-tokens", "8", "--layers", "1", "--steps", "3", "--batch-size", "2",
        "--threads", "1", "--cache-dir", str(tmp_path / "cache"),
    ])
    assert res.exit_code == 0, res.output
    assert started == [str(tiny_vllm_dir)]
    meta = json.loads((out / "draft.json").read_text())
    assert (meta["config"]["sampled_prompts"], meta["config"]["sampled_answers"]) == (8, 2)
    tr = meta["training"]  # held out: question 7 (the last eighth of the greedy ones) and its two sampled answers
    assert (tr["train_sequences"], tr["eval_sequences"], tr["eval_sampled_sequences"]) == (7 + 2 + 14, 1, 2)
    assert tr["eval_after_sampled"]["tokens"] > 0
    assert tr["answers"]["dtype"] in ("bfloat16", "float32") and tr["answers"]["engine"].startswith("vllm ")
    assert "held-out top-1 agreement" in res.output and "sampled answers" in res.output


def test_held_out_questions_keep_all_their_answers_out_of_training():
    def t(kind, q):
        return Trace([1, 2, 3], 1, kind, q)

    # questions 0-7 answered greedily and sampled, 8-11 sampled only, 12-13 references
    traces = [t("greedy", q) for q in range(8)] + [t("sampled", q) for q in range(12)] + [t("reference", 12), t("reference", 13)]
    train, held = split_traces(traces, 0.25)
    assert sorted(train + held) == list(range(len(traces)))
    held_q = {traces[i].question for i in held}
    assert held_q == {6, 7, 11}  # the last quarter of each group (at least one)
    assert {traces[i].question for i in train}.isdisjoint(held_q)
    assert sorted(traces[i].kind for i in held) == ["greedy", "greedy", "sampled", "sampled", "sampled"]


def test_unrolled_levels_are_weighted_as_configured(tiny_target):
    """Level m weighs unroll_decay ** (m - 1): with a decay of 0 the unrolled loss is level 1's
    alone, and with a decay above 0 the later levels change it."""
    from semspec.draft.head_train import head_loss

    torch.manual_seed(0)
    traces = [Trace(torch.randint(5, 300, (14,)).tolist(), 4, "greedy") for _ in range(3)]
    states = [torch.randn(14, tiny_target.hidden_size).half() for _ in traces]
    w_sub = tiny_target.model.get_output_embeddings().weight[:200].detach().float()
    torch.manual_seed(2)
    head = HeadModel(tiny_target.model, layers=1)

    def loss(**kw):
        cfg = HeadTrainConfig(input_noise=0.0, threads=1, train_dtype="float32", **kw)
        with torch.no_grad():
            value, info = head_loss(head, w_sub, traces, states, cfg, None)
        return value, info

    one, info1 = loss(unroll=1)
    only_first, info3 = loss(unroll=3, unroll_decay=0.0)
    torch.testing.assert_close(only_first, one)
    assert len(info3["top1_by_level"]) == 3 and info3["top1_by_level"][0] == info1["top1"]
    assert not torch.isclose(loss(unroll=3, unroll_decay=0.8)[0], one)


def test_interrupted_training_resumes_to_the_same_weights(tiny_target, tmp_path):
    torch.manual_seed(0)
    traces = [Trace(torch.randint(5, 300, (20,)).tolist(), 6, "greedy") for _ in range(6)]
    states = [torch.randn(20, tiny_target.hidden_size).half() for _ in traces]
    w_sub = tiny_target.model.get_output_embeddings().weight[:200].detach().float()
    cfg = HeadTrainConfig(steps=10, batch_size=2, warmup_steps=2, threads=1, unroll=3)

    def fresh():
        torch.manual_seed(1)
        return HeadModel(tiny_target.model, layers=1)

    whole = fresh()
    train_head(whole, w_sub, traces, states, cfg)

    class Stop(Exception):
        pass

    def stop_at_7(step, _info):
        if step == 7:
            raise Stop

    ckpt = tmp_path / "ckpt.safetensors"
    cut = fresh()
    with pytest.raises(Stop):
        train_head(cut, w_sub, traces, states, cfg, progress=stop_at_7, checkpoint=ckpt, checkpoint_every=5)
    resumed = fresh()
    summary = train_head(resumed, w_sub, traces, states, cfg, checkpoint=ckpt, checkpoint_every=5)
    assert summary["resumed_at_step"] == 5
    for (k, a), b in zip(whole.trained_state().items(), resumed.trained_state().values()):
        torch.testing.assert_close(a, b, rtol=0, atol=0, msg=k)


def test_a_run_stopped_early_holds_the_whole_schedules_weights_at_that_step(tiny_target, tmp_path):
    torch.manual_seed(0)
    traces = [Trace(torch.randint(5, 300, (20,)).tolist(), 6, "greedy") for _ in range(6)]
    states = [torch.randn(20, tiny_target.hidden_size).half() for _ in traces]
    w_sub = tiny_target.model.get_output_embeddings().weight[:200].detach().float()
    cfg = HeadTrainConfig(steps=10, stop_after=None, batch_size=2, warmup_steps=2, threads=1, unroll=2,
                          select_every=3)
    stop7 = dataclasses.replace(cfg, stop_after=7)

    class Stop(Exception):
        pass

    def run(cfg, kill_at=None, **kw):
        torch.manual_seed(1)
        head = HeadModel(tiny_target.model, layers=1)
        at, weights, scored = [0], {}, []

        def progress(step, _info):
            at[0] = step
            weights[step] = {k: v.clone() for k, v in head.trained_state().items()}
            if step == kill_at:
                raise Stop

        def select(_h):  # the score peaks at step 6
            scored.append(at[0])
            return -abs(at[0] - 6)

        summary = train_head(head, w_sub, traces, states, cfg, progress=progress, select=select, **kw)
        return head, weights, scored, summary

    _, whole_w, whole_scored, whole = run(cfg)
    stopped, stopped_w, stopped_scored, summary = run(stop7)
    assert (cfg.last_step, stop7.last_step) == (10, 7)
    assert whole_scored == [3, 6, 9, 10] and stopped_scored == [3, 6, 7]  # and at the last step
    assert sorted(stopped_w) == list(range(1, 8))
    for step, state in stopped_w.items():  # every step's weights, the last one's included
        for k, a in state.items():
            torch.testing.assert_close(a, whole_w[step][k], rtol=0, atol=0, msg=f"{k} at step {step}")
    assert whole["selected_step"] == summary["selected_step"] == 6
    for k, a in whole_w[6].items():
        torch.testing.assert_close(stopped.trained_state()[k], a, rtol=0, atol=0, msg=k)

    # killed after its checkpoint at step 5, the stopped run resumes to the same end
    ckpt = tmp_path / "ckpt.safetensors"
    with pytest.raises(Stop):
        run(stop7, kill_at=6, checkpoint=ckpt, checkpoint_every=5)
    resumed, _, resumed_scored, again = run(stop7, checkpoint=ckpt, checkpoint_every=5)
    assert again["resumed_at_step"] == 5 and resumed_scored == [6, 7]
    assert again["selection_history"] == summary["selection_history"] and again["selected_step"] == 6
    for k, a in stopped.trained_state().items():
        torch.testing.assert_close(resumed.trained_state()[k], a, rtol=0, atol=0, msg=k)

    assert dataclasses.replace(cfg, stop_after=50).last_step == 10  # never past the schedule
    with pytest.raises(ValueError, match="stop_after"):
        HeadTrainConfig(stop_after=0)


def test_train_dtype_auto_is_bfloat16_only_where_the_cpu_has_bfloat16_instructions(monkeypatch):
    import semspec.models.dtypes

    for fast, want in ((True, "bfloat16"), (False, "float32")):
        monkeypatch.setattr(semspec.models.dtypes, "cpu_has_fast_bf16", lambda fast=fast: fast)
        assert resolve_train_dtype(HeadTrainConfig()).train_dtype == want
        assert resolve_train_dtype(HeadTrainConfig(train_dtype="float32")).train_dtype == "float32"
        assert resolve_train_dtype(HeadTrainConfig(train_dtype="bfloat16")).train_dtype == "bfloat16"


@pytest.mark.parametrize("device, kv_cache_bytes", [("cpu", int(DEFAULT_KV_CACHE_GB * 2**30)), ("cuda", None)])
def test_the_trace_engine_leaves_the_kv_cache_to_the_device(monkeypatch, device, kv_cache_bytes):
    """The traces' engine sizes its KV cache as any engine on its device (kv_budget_gb): on a
    GPU from what vLLM's memory share leaves, not the CPU's budget; on a CPU that budget."""
    asked = {}
    monkeypatch.setattr(VLLMEngine, "load", classmethod(lambda cls, target, **kw: asked.update(kw, target=target)))
    head_build.trace_engine("some/target", HeadTrainConfig(seed=3))
    args = engine_arguments("some/model", device=device, batch_size=asked["batch_size"],
                            kv_cache_gb=asked["kv_cache_gb"], seed=asked["seed"])
    assert args["kv_cache_memory_bytes"] == kv_cache_bytes
    assert (asked["target"], args["max_num_seqs"], args["seed"]) == ("some/target", HeadTrainConfig().gen_batch_size, 3)
