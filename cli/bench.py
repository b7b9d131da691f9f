"""`semjobs bench`: every decoding method side by side on the same prompts (see semspec.benchmark)."""

from __future__ import annotations

import shlex
import sys
import time
from pathlib import Path

import click

from semjobs.cli.jobs import engine_arg_options
from semspec.assets import GSM8K_TEST
from semspec.types import SAMPLING_TEMPERATURE, SAMPLING_TOP_P

DEFAULT_PROMPTS = str(GSM8K_TEST)  # the GSM8K test split shipped with the engine


class MixedProblems(click.ParamType):
    """``mixed:COUNT`` (problems of mixed difficulty, semjobs.jobs.yield_problems): the COUNT."""

    name = "mixed:COUNT"

    def convert(self, value, param, ctx) -> int:
        if isinstance(value, int):
            return value
        kind, _, count = str(value).partition(":")
        if kind != "mixed" or not count.isdigit() or int(count) < 1:
            self.fail(f"expected mixed:COUNT, got {value!r}", param, ctx)
        return int(count)


MIXED_PROBLEMS = MixedProblems()


def _numbers(value: str | None, kind=float) -> tuple | None:
    if value is None or not value.strip():
        return None
    try:
        return tuple(kind(x) for x in value.split(",") if x.strip())
    except ValueError as e:
        raise click.BadParameter(f"expected comma-separated {kind.__name__}s, got {value!r}") from e


def _floats(value: str | None) -> tuple[float, ...] | None:
    return _numbers(value, float)


def _taus(value: str | None) -> tuple[float | None, ...] | None:
    """'probes,0,0.1' -> (None, 0.0, 0.1): "probes" is the floor the loaded probes were
    calibrated with (the engine's default)."""
    if value is None or not value.strip():
        return None
    words = [w.strip() for w in value.split(",") if w.strip()]
    return tuple(None if w == "probes" else _floats(w)[0] for w in words)


def _ints(value: str | None) -> tuple[int, ...] | None:
    return _numbers(value, int)


def _switches(value: str | None) -> tuple[bool, ...] | None:
    """'on,off' -> (True, False)."""
    words = {"on": True, "off": False}
    if value is None or not value.strip():
        return None
    parts = [x.strip().lower() for x in value.split(",") if x.strip()]
    if any(p not in words for p in parts):
        raise click.BadParameter(f"expected comma-separated on/off, got {value!r}")
    return tuple(words[p] for p in parts)


def _unescape(value: str | None) -> str | None:
    if value is None:
        return None
    out = value.encode("utf-8").decode("unicode_escape") if "\\" in value else value
    if not out:
        raise click.BadParameter("the step delimiter must not be empty", param_hint="--step-delimiter")
    return out


@click.command()
@click.option("--prompts", default=DEFAULT_PROMPTS, show_default="the shipped GSM8K test split",
              type=click.Path(exists=True, dir_okay=False),
              help="JSONL prompts: GSM8K lines (question + answer with '#### N') or {id, prompt or messages[, reference]}.")
@click.option("--limit", default=10, show_default=True, type=int, help="Prompts to run (the first ones after --offset).")
@click.option("--offset", default=0, show_default=True, type=int, help="Lines to skip first.")
@click.option("--methods", default="ar,token_sd,hf_assisted,step_judge,semspec", show_default=True,
              help="Comma-separated: ar, token_sd, hf_assisted, step_judge, semspec, and the opt-in hf_generate "
                   "(transformers' plain generate); ar always runs.")
@click.option("--out", "out_dir", required=True, type=click.Path(file_okay=False),
              help="Directory for results.json, results.md, runs.jsonl and the plots.")
@click.option("--temperature", default=SAMPLING_TEMPERATURE, show_default=True, type=float, help="0 for greedy.")
@click.option("--top-p", default=SAMPLING_TOP_P, show_default=True, type=float)
@click.option("--max-new-tokens", default=256, show_default=True, type=int)
@click.option("--seed", default=0, show_default=True, type=int, help="Prompt i uses seed+i, for every method.")
@click.option("--taus", default=None,
              help="semspec's floor on p_T: reject a step below it, e.g. probes,0,0.3 (probes, the default: "
                   "greedy the floor the loaded probes were calibrated with, sampled none; 0: the paper's rule alone).")
@click.option("--attempts", default=None,
              help="semspec drafts tried per step before the target writes it, e.g. 1,3; crossed with --taus "
                   "(default: the engine's, 1).")
@click.option("--candidates", default=None,
              help="semspec candidate steps drafted side by side per step when sampling, verified in one batch, "
                   "the first accepted kept, e.g. 1,3; crossed with the others (default: the engine's, 1).")
@click.option("--ratio-floors", default=None,
              help="semspec's floor on p_T/p_D, the paper's rule (reject below it, else accept with "
                   "probability min(1, p_T/p_D)), e.g. 0,0.6; crossed with --taus and --attempts "
                   "(default: the engine's, 0).")
@click.option("--adaptive", default=None,
              help="semspec's adaptive speculation (draft only while it pays), e.g. on,off; crossed with "
                   "--taus, --ratio-floors and --attempts (default: the engine's, on).")
@click.option("--token-speculation", default=None,
              help="semspec's own writing (rewritten steps, paused batches, answers) speculating tokens with "
                   "the target's token draft, e.g. on,off; crossed with the others (default: on where the "
                   "engine has a token draft, as the embedded target's head).")
@click.option("--target", default=None, help="Target model spec (default: the embedded SmolLM2).")
@click.option("--draft", default=None,
              help="Draft spec (default: the embedded draft for step_judge and semspec, the embedded head for "
                   "token_sd): a draft model drafts steps (step_judge, semspec, hf_assisted), a draft head or "
                   "'ngram' tokens (token_sd); the methods a draft cannot serve are skipped.")
@click.option("--compare-drafts", default=None,
              help="Further draft specs run beside --draft on the same prompts, e.g. embedded:smollm2-135m-head: "
                   "token_sd, step_judge and semspec once more per draft (with its shipped probes, if any), "
                   "labelled METHOD@draft=NAME, each draft on vLLM engines of its own.")
@click.option("--compare-probes", default=None,
              help="Probes for the --compare-drafts, in their order (e.g. a draft you built and its probes: "
                   "--compare-drafts M --compare-probes P); a draft without keeps its shipped ones.")
@click.option("--probes", default=None,
              help="Probe dir or embedded:<name> (default: the embedded probes when shipped); accept, reject, const:P_T,P_D.")
@click.option("--step-delimiter", default=None,
              help="Text that ends a reasoning step; backslash escapes allowed, e.g. '\\n' "
                   "(default: the engine's, a blank line).")
@click.option("--max-step-tokens", default=None, type=int, help="Per-step token cap (default: the engine's).")
@click.option("--draft-tokens", default=None, type=int, help="token_sd: tokens drafted per verification.")
@click.option("--judge-threshold", default=None, type=int, help="step_judge: accept at this 0-9 score or above.")
@click.option("--threads", default=None, type=int, help="torch threads (default: torch's choice).")
@click.option("--device", default="auto", show_default=True)
@click.option("--cache-dir", default=None, help="Service cache root (converted models under <dir>/models).")
@click.option("--no-warmup", is_flag=True, help="Skip the untimed warm-up call per method.")
@click.option("--no-loglik", is_flag=True, help="Skip the target log-likelihood pass over the outputs.")
@click.option("-q", "--quiet", is_flag=True, help="No per-run progress lines.")
@click.option("--batch-size", "batch_sizes", default=None,
              help="Throughput by batch size instead, e.g. 1,4,8,16,32: every method of --methods "
                   "but hf_assisted (list hf_generate and vllm_generate for the peers: transformers' and "
                   "plain vLLM's generate) over all prompts at each size (results.json by_batch_size).")
@click.option("--draft-max-batch", type=click.IntRange(min=0), default=None,
              help="With --batch-size: semspec/step_judge draft only while at most this many sequences are "
                   "in flight (0: always; default: the engine's, 1 on a CPU).")
@click.option("--dtype", type=click.Choice(["auto", "float32", "bfloat16"]), default="auto", show_default=True,
              help="The models' number type (auto: vLLM's choice for the device; with --batch-size "
                   "hf_generate's is the fastest for each size).")
@click.option("--kv-cache-gb", type=click.FloatRange(min=0, min_open=True), default=None,
              help="vLLM's KV cache budget in GiB, per engine (default: SEMJOBS_KV_CACHE_GB).")
@click.option("--yield", "yield_bench", is_flag=True,
              help="The yield benchmark instead: useful samples (kept: correct, or without a reference ended with an "
                   "answer; at most --want per input) per hour and per million tokens, of `semjobs run --n N "
                   "--keep-loops`, plain vLLM with n=N and `semjobs run --n N --want K`, each method of --methods "
                   "(default ar,semspec) as `semjobs run` on --batch-size; results.json's `yield`.")
@click.option("--n", "samples", type=click.IntRange(min=1), default=4, show_default=True,
              help="With --yield: samples per input at most.")
@click.option("--want", type=click.IntRange(min=1), default=1, show_default=True,
              help="With --yield: kept samples wanted per input.")
@click.option("--problems", type=MIXED_PROBLEMS, default=None,
              help="With --yield: COUNT problems of mixed difficulty (generated arithmetic word problems, graded, "
                   "and GSM8K test questions from line 301 on; semjobs.jobs.yield_problems) instead of --prompts.")
@click.option("--doom-rule", type=click.Path(exists=True, dir_okay=False), default=None,
              help="With --yield: the doom rule (`semjobs doom calibrate`) the want_k arm stops doomed samples with; "
                   "results.json's want_k `doomed` says what it stopped and the right samples it cost.")
@engine_arg_options
def bench(prompts, limit, offset, methods, out_dir, temperature, top_p, max_new_tokens, seed, taus, attempts,
          candidates, ratio_floors, adaptive, token_speculation, target, draft, compare_drafts, compare_probes, probes,
          step_delimiter, max_step_tokens, draft_tokens,
          judge_threshold, threads, device, cache_dir, no_warmup, no_loglik, quiet, batch_sizes,
          draft_max_batch, dtype, kv_cache_gb, yield_bench, samples, want, problems, doom_rule, engine_args,
          draft_engine_args) -> None:
    """Run the decoding methods on the same prompts, interleaved, and report speed beside quality.

    The methods decode on vLLM; hf_assisted and hf_generate are transformers' generate.
    Ctrl-C or SIGTERM during the runs stops them and still writes the report, over the
    prompts that every method finished.

    Examples: semjobs bench --limit 10 --out out/bench;
    semjobs bench --batch-size 1,8,32 --methods ar,semspec,hf_generate --temperature 0 --limit 32
    --threads 1 --out out/batch;
    semjobs bench --batch-size 32 --methods ar,vllm_generate --dtype bfloat16
    --temperature 0 --offset 100 --limit 64 --threads 1 --out out/vllm"""
    import torch

    from semjobs.cli.jobs import use_engine_args
    from semjobs.settings import settings as service_settings
    from semspec.benchmark.report import write_report
    from semspec.benchmark.runner import BenchSettings, load_prompts

    use_engine_args(engine_args, draft_engine_args)  # refused before anything loads
    if threads:
        torch.set_num_threads(threads)
    if yield_bench:
        from semjobs.jobs.yield_bench import apply_overrides

        env = apply_overrides(target=target, draft=draft, probes=probes, device=device, dtype=dtype,
                              kv_cache_gb=kv_cache_gb, cache_dir=cache_dir)
        return _yield(prompts, limit, offset, problems, methods, samples, want, temperature, top_p, max_new_tokens,
                      seed, batch_sizes, engine_args, draft_engine_args, env, out_dir, quiet, doom_rule)
    settings = BenchSettings(
        prompts=prompts, limit=limit, offset=offset,
        methods=tuple(m.strip() for m in methods.split(",") if m.strip()),
        taus=_taus(taus), attempts=_ints(attempts), candidates=_ints(candidates),
        ratio_floors=_floats(ratio_floors),
        adaptive=_switches(adaptive), token_speculation=_switches(token_speculation),
        temperature=temperature, top_p=top_p, max_new_tokens=max_new_tokens, seed=seed,
        step_delimiter=_unescape(step_delimiter), max_step_tokens=max_step_tokens, draft_tokens=draft_tokens,
        judge_threshold=judge_threshold,
        warmup=not no_warmup, loglik=not no_loglik,
        compare_drafts=tuple(d.strip() for d in (compare_drafts or "").split(",") if d.strip()),
        compare_probes=tuple(p.strip() for p in (compare_probes or "").split(",") if p.strip()),
        engine_args=service_settings.target_engine_args, draft_engine_args=service_settings.draft_engine_args,
    )
    t0 = time.perf_counter()

    def say(msg: str) -> None:
        if not quiet:
            click.echo(f"[{time.perf_counter() - t0:7.1f}s] {msg}", err=True)

    if batch_sizes:
        return _sweep(settings, _ints(batch_sizes), dtype, device, target, draft, probes, cache_dir, out_dir, say,
                      draft_max_batch, kv_cache_gb)
    from semspec.benchmark.engines import load_engines
    from semspec.benchmark.runner import plan_runs, run_bench

    try:
        plan_runs(settings.methods, settings.taus, settings.temperature, attempts=settings.attempts,
                  candidates=settings.candidates, ratio_floors=settings.ratio_floors, adaptive=settings.adaptive,
                  token_speculation=settings.token_speculation, compare_drafts=settings.compare_drafts)
        prompt_list = load_prompts(prompts, limit, offset)
        # refused before anything loads: a draft vLLM cannot load, probes that do not parse
        engines = load_engines(settings, target, draft, probes, device=device, cache_dir=cache_dir, dtype=dtype,
                               kv_cache_gb=kv_cache_gb or service_settings.kv_cache_gb)
    except ValueError as e:
        raise click.UsageError(str(e)) from e
    say("models: " + ", ".join(f"{k}={v}" for k, v in engines.identities.items()))
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    raw = out / "runs.jsonl"
    raw.write_text("")
    import signal

    def _stop(signum, frame):  # SIGTERM stops like Ctrl-C: report the prompts finished so far
        raise KeyboardInterrupt

    signal.signal(signal.SIGTERM, _stop)
    br = run_bench(engines, settings, prompt_list, progress=say, raw_log=raw)
    command = "semjobs bench " + " ".join(shlex.quote(a) for a in sys.argv[2:]) if len(sys.argv) > 1 \
        and sys.argv[1] == "bench" else None
    res = write_report(br, out, engine=engines, command=command)
    for label, why in br.skipped.items():
        click.echo(f"skipped {label}: {why}", err=True)
    click.echo(f"{'method':<20} {'speed-up':>9} {'agree':>6} {'acc':>5} {'tok/s':>6}")
    for label, m in res["methods"].items():
        if m.get("skipped"):
            continue
        sp, ag, ac, ts = (m.get(k) for k in ("speedup_vs_ar", "answer_agreement_vs_ar", "accuracy", "tokens_per_second"))
        click.echo(f"{label:<20} {sp if sp is None else f'{sp:.2f}x':>9} {'-' if ag is None else f'{ag:.2f}':>6} "
                   f"{'-' if ac is None else f'{ac:.2f}':>5} {'-' if ts is None else f'{ts:.1f}':>6}")
    sa = res["ar_self_agreement"]
    click.echo(f"ar_self_agreement: {'-' if sa is None else f'{sa:.2f}'}")
    click.echo(f"wrote {out / 'results.json'}, {out / 'results.md'} and plots")


def _yield(prompts, limit, offset, problems, methods, samples, want, temperature, top_p, max_new_tokens, seed,
           batch_sizes, engine_args, draft_engine_args, env, out_dir, quiet, doom_rule=None) -> None:
    """`semjobs bench --yield` (semjobs.jobs.yield_bench)."""
    from semjobs.jobs import yield_bench, yield_problems
    from semjobs.settings import settings as service_settings
    from semspec.benchmark.report import environment
    from semspec.benchmark.runner import load_prompts
    from semspec.types import METHODS

    given = click.get_current_context().get_parameter_source("methods") != click.core.ParameterSource.DEFAULT
    chosen = tuple(m.strip() for m in methods.split(",") if m.strip()) if given else ("ar", "semspec")
    unknown = [m for m in chosen if m not in METHODS]
    if unknown:
        raise click.BadParameter(f"{', '.join(unknown)}: --yield runs semjobs' methods ({', '.join(METHODS)})",
                                 param_hint="--methods")
    sizes = _ints(batch_sizes) or (service_settings.batch_size,)
    if len(sizes) != 1:
        raise click.BadParameter("--yield runs one batch size", param_hint="--batch-size")
    if want > samples:
        raise click.BadParameter(f"{want} kept samples of at most {samples}", param_hint="--want")
    try:
        chosen_problems = (yield_problems.mixed(problems, DEFAULT_PROMPTS) if problems
                           else yield_problems.from_prompts(load_prompts(prompts, limit, offset)))
    except ValueError as e:
        raise click.UsageError(str(e)) from e
    s = yield_bench.YieldSettings(n=samples, want=want, methods=chosen, temperature=temperature, top_p=top_p,
                                  max_new_tokens=max_new_tokens, batch_size=sizes[0], seed=seed,
                                  engine_args=engine_args, draft_engine_args=draft_engine_args, env=env,
                                  doom_rule=doom_rule)
    t0 = time.perf_counter()

    def say(msg: str) -> None:
        if not quiet:
            click.echo(f"[{time.perf_counter() - t0:7.1f}s] {msg}", err=True)

    command = "semjobs bench " + " ".join(shlex.quote(a) for a in sys.argv[2:]) if len(sys.argv) > 1 \
        and sys.argv[1] == "bench" else None
    res = yield_bench.run_yield(s, chosen_problems, f"mixed:{problems}" if problems else f"{prompts} (offset {offset}, limit {limit})",
                                Path(out_dir), say, command, environment())
    click.echo(yield_bench.table(res))
    click.echo(f"wrote {Path(out_dir) / 'results.json'}")


def _sweep(settings, batch_sizes, dtype, device, target, draft, probes, cache_dir, out_dir, say,
           draft_max_batch=None, kv_cache_gb=None) -> None:
    import json

    import torch

    from semjobs.settings import settings as service_settings
    from semspec.benchmark.engines import draft_refusal
    from semspec.benchmark.runner import load_prompts
    from semspec.benchmark.throughput import BATCH_METHODS, SweepSettings, markdown, run_sweep

    methods = [m for m in settings.methods if m in BATCH_METHODS]
    sweep = SweepSettings(batch_sizes=tuple(batch_sizes), methods=tuple(methods),
                          temperature=settings.temperature, top_p=settings.top_p,
                          max_new_tokens=settings.max_new_tokens, seed=settings.seed, dtype=dtype, device=device,
                          draft_max_batch=draft_max_batch, engine_args=settings.engine_args,
                          draft_engine_args=settings.draft_engine_args,
                          **({"draft_tokens": settings.draft_tokens} if settings.draft_tokens else {}))
    try:
        prompt_list = load_prompts(settings.prompts, settings.limit, settings.offset)
        if draft_refusal(draft):
            raise ValueError(draft_refusal(draft))
    except ValueError as e:
        raise click.UsageError(str(e)) from e

    def load(dt, kind):
        say(f"loading {'transformers' if kind == 'transformers' else 'vLLM'} in {str(dt).removeprefix('torch.')}"
            + (f", drafting {sweep.draft_tokens} tokens per verification" if kind == "token_sd" else "")
            + (", target and draft at step level" if kind == "steps" else ""))
        if kind == "transformers":
            from semspec.models.identity import models_cache
            from semspec.models.loaded import load_model

            return load_model(target, device=device, cache_dir=models_cache(cache_dir), dtype=dt)
        from semspec.engine.token_engine import VLLMEngine
        from semspec.engine.step_engine import VLLMStepEngine

        t0 = time.perf_counter()
        common = dict(device=device, cache_dir=cache_dir, dtype=str(dt), batch_size=max(batch_sizes),
                      seed=settings.seed, kv_cache_gb=kv_cache_gb or service_settings.kv_cache_gb,
                      engine_args=sweep.engine_args, compile=bool(service_settings.vllm_compile))
        if kind == "steps":
            loaded = VLLMStepEngine.load(target, draft=draft, probes=probes, **common,
                                         draft_engine_args=sweep.draft_engine_args)
        else:
            loaded = VLLMEngine.load(target, draft=draft, **common, draft_max_batch=sweep.draft_max_batch,
                                     speculative_tokens=sweep.draft_tokens if kind == "token_sd" else None)
        say(f"vLLM started in {time.perf_counter() - t0:.1f}s")
        return loaded

    scorer = []  # the target in float32, loaded once the runs are done

    def loglik(prompt, text):
        from semspec.quality import load_scorer, target_mean_loglik

        if not scorer:
            scorer.append(load_scorer(target, cache_dir))
        return target_mean_loglik(scorer[0], prompt, text)

    result = run_sweep(load, prompt_list, sweep, progress=say, loglik=loglik if settings.loglik else None)
    command = "semjobs bench " + " ".join(shlex.quote(a) for a in sys.argv[2:]) if len(sys.argv) > 1 \
        and sys.argv[1] == "bench" else None
    result = {"command": command, "settings": {**sweep.__dict__, "prompts": settings.prompts, "limit": settings.limit,
                                               "offset": settings.offset, "torch_threads": torch.get_num_threads()},
              **result}
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    (out / "results.json").write_text(json.dumps(result, indent=1))
    (out / "results.md").write_text((f"`{command}`\n\n" if command else "") + markdown(result))
    click.echo(markdown(result))
    click.echo(f"wrote {out / 'results.json'} and {out / 'results.md'}")
