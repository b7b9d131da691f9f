"""`semjobs probe ...`: calibration of the semantic probes (collect -> label -> train).

Thin: parse options, call `semspec.calibration`, print a summary.
"""

from __future__ import annotations

import json

import click

from semjobs.cli.jobs import assignments, engine_arg_options, use_engine_args
from semspec.calibration import DEFAULT_FLOOR_QUANTILE
from semspec.prompts import TEMPLATE_KWARGS


@click.group()
def probe() -> None:
    """Calibrate SemanticSpec probes for a target/draft pair (once per pair and domain)."""


def _template_kwargs(ctx, param, values: tuple[str, ...]) -> dict | None:
    """--chat-template-kwarg as a dict, refused where a job's chat_template_kwargs would be."""
    from semspec.prompts import TemplateKwargsError, check_template_kwargs

    kwargs = assignments(ctx, param, values)
    try:
        check_template_kwargs(kwargs)
    except TemplateKwargsError as e:
        raise click.BadParameter(str(e)) from None
    return kwargs or None


@probe.command()
@click.option("--target", default="embedded:smollm2-135m", show_default=True,
              help="Target model: embedded:NAME, a local HF directory or a .gguf file.")
@click.option("--draft", default=None,
              help="Draft model spec (same forms as --target; a draft head drafts no steps). Without it, "
                   "only the target's traces "
                   "and samples are made and memoised in OUT, for a later run with the draft.")
@click.option("--prompts", "prompts_file", required=True, type=click.Path(exists=True, dir_okay=False),
              help="JSONL prompts: {id, prompt}, GSM8K {question, ...} or OpenAI Batch lines.")
@click.option("--out", "out_dir", default=None, type=click.Path(file_okay=False),
              help="Calibration directory (created, or resumed when it exists); not with --submit.")
@click.option("--samples", "-n", default=10, show_default=True, help="Next steps sampled per prefix and model.")
@click.option("--skip-lines", default=0, show_default=True, help="Skip the first lines of the prompts file.")
@click.option("--limit-prompts", type=int, default=None, help="Use at most this many prompts.")
@click.option("--max-prefixes", type=int, default=None, help="Stop once this many prefixes are stored.")
@click.option("--max-trace-steps", default=12, show_default=True, help="Prefixes per question at most.")
@click.option("--prefixes", type=click.Choice(["spread", "first"]), default="spread", show_default=True,
              help="Past --max-trace-steps: prefixes spread over the whole trace, or its first steps only.")
@click.option("--max-trace-tokens", default=320, show_default=True, help="Token cap of each target trace.")
@click.option("--max-step-tokens", default=64, show_default=True,
              help="Token cap of one step (use the engine's setting for these probes).")
@click.option("--step-delimiter", default="\n\n", show_default=repr("\n\n"),
              help="Step delimiter (use the engine's setting for these probes).")
@click.option("--temperature", default=0.6, show_default=True)
@click.option("--top-p", default=0.95, show_default=True)
@click.option("--trace-temperature", default=0.6, show_default=True,
              help="Sampled target traces, as decoding samples (0: greedy).")
@click.option("--layer", default=-1, show_default=True,
              help="hidden_states index pooled for the probes (negative: from the end).")
@click.option("--draft-layer", type=int, default=None, help="Layer for the draft, if different.")
@click.option("--seed", default=0, show_default=True)
@click.option("--chat-template-kwarg", "chat_template_kwargs", multiple=True, metavar="KEY=VALUE",
              callback=_template_kwargs,
              help=f"Passed to the chat template as a job's chat_template_kwargs are ({', '.join(TEMPLATE_KWARGS)}), "
                   "repeatable; VALUE is JSON where it parses, else text. Give the jobs' own, e.g. "
                   "--chat-template-kwarg enable_thinking=false, so the probes learn on prompts rendered alike.")
@engine_arg_options
@click.option("--device", default="auto", show_default=True)
@click.option("--threads", type=int, default=None,
              help="torch CPU threads (default: torch's choice; 1 is much faster on a busy CPU).")
@click.option("--submit", is_flag=True,
              help="Put the questions on the job queue instead: the workers of the deployment's pair "
                   "(SEMJOBS_TARGET_MODEL / SEMJOBS_DRAFT_MODEL) collect them into the database; "
                   "`semjobs probe merge OUT --calibration ID` writes them out. Prints the calibration id.")
@click.pass_context
def collect(ctx, target, draft, prompts_file, out_dir, samples, skip_lines, limit_prompts, max_prefixes,
            max_trace_steps, prefixes, max_trace_tokens, max_step_tokens, step_delimiter, temperature, top_p,
            trace_temperature, layer, draft_layer, seed, chat_template_kwargs, engine_args, draft_engine_args, device,
            threads, submit):
    """Generate target traces, cut them into prefixes, sample next steps from both models and
    store texts and pooled hidden states in OUT (resumable), or, with --submit, have the
    workers do it.

    Example: semjobs probe collect --draft embedded:smollm2-135m-draft --skip-lines 100
    --limit-prompts 48 --samples 8 --out cal/smollm2"""
    from semspec.calibration.collect import CollectConfig, collect as run_collect, read_prompts

    prompts = read_prompts(prompts_file, skip=skip_lines, limit=limit_prompts)
    if not prompts:
        raise click.UsageError(f"no prompts in {prompts_file} after skipping {skip_lines} lines")
    cfg = CollectConfig(
        samples=samples, temperature=temperature, top_p=top_p, layer=layer, draft_layer=draft_layer,
        step_delimiter=step_delimiter, max_step_tokens=max_step_tokens, max_trace_tokens=max_trace_tokens,
        max_trace_steps=max_trace_steps, max_prefixes=max_prefixes, trace_temperature=trace_temperature,
        prefixes=prefixes, seed=seed, chat_template_kwargs=chat_template_kwargs,
    )
    if submit:
        return _submit(ctx, prompts, cfg)
    if out_dir is None:
        raise click.UsageError("give --out DIR (or --submit)")
    use_engine_args(engine_args, draft_engine_args)  # a bad one is refused before anything loads
    import torch

    from semjobs.settings import settings
    from semspec.calibration.backends import load_models

    if threads:
        torch.set_num_threads(threads)
    click.echo(f"loading target {target} and draft {draft} ...", err=True)
    # vLLM's engines as a worker of the deployment loads them (the same states, numbers, batch)
    try:
        models = load_models(target, draft, cfg, device=device, dtype=settings.dtype, batch_size=settings.batch_size,
                             kv_cache_gb=settings.kv_cache_gb, compile=bool(settings.vllm_compile),
                             cache_dir=settings.cache_dir, engine_args=settings.target_engine_args,
                             draft_engine_args=settings.draft_engine_args)
    except ValueError as e:  # a pair that cannot calibrate (a draft head)
        raise click.UsageError(str(e)) from e
    click.echo(f"sampling and reading states with {models.engine}", err=True)
    stats = run_collect(models, prompts, out_dir, cfg, progress=True)
    click.echo(json.dumps(stats, indent=1))


def _submit(ctx, prompts, cfg) -> None:
    """`collect --submit`: store the calibration's questions and enqueue one task each."""
    from click.core import ParameterSource

    from semjobs.jobs.calibration import create, pending_questions
    from semjobs.worker.publish import calibration_publisher
    from semjobs.worker.queues import CALIBRATION, queue_name

    options = {"target": "--target", "draft": "--draft", "out_dir": "--out", "device": "--device",
               "threads": "--threads", "max_prefixes": "--max-prefixes", "engine_args": "--engine-arg",
               "draft_engine_args": "--draft-engine-arg"}  # the workers' or per-run
    given = [flag for name, flag in options.items()
             if ctx.get_parameter_source(name) not in (ParameterSource.DEFAULT, None)]
    if given:
        raise click.UsageError(f"{', '.join(given)} cannot go with --submit: the workers of the deployment's "
                               "pair collect (SEMJOBS_TARGET_MODEL / SEMJOBS_DRAFT_MODEL pick it, "
                               "SEMJOBS_TARGET_ENGINE_ARGS / SEMJOBS_DRAFT_ENGINE_ARGS its engines)")
    from semjobs.settings import settings
    from semspec.components import step_draft_problem

    problem = step_draft_problem("semspec", settings.draft_model)  # refused here, not by every worker
    if problem is not None:
        raise click.UsageError(problem)
    seen: set[str] = set()
    for qid, _ in prompts:
        if qid in seen:
            raise click.UsageError(f"question id {qid!r} appears twice in the prompts; ids must be unique")
        seen.add(qid)
    queue = queue_name(kind=CALIBRATION)
    cal_id = create(prompts, cfg, queue)
    with calibration_publisher(queue) as send:
        for qid in pending_questions(cal_id):
            send(cal_id, qid)
    click.echo(f"submitted {len(prompts)} questions to queue {queue}; follow with "
               f"`semjobs probe status {cal_id}`, then `semjobs probe merge OUT --calibration {cal_id}`", err=True)
    click.echo(cal_id)


@probe.command()
@click.argument("calibration_id")
def status(calibration_id):
    """Questions of a submitted calibration by state, and the prefixes stored so far.

    Example: semjobs probe status 3f2a9c1b7d4e"""
    from semjobs.jobs.calibration import CalibrationError, counts

    try:
        click.echo(json.dumps(counts(calibration_id), indent=1))
    except CalibrationError as e:
        raise click.ClickException(str(e))


@probe.command()
@click.argument("out_dir", type=click.Path(file_okay=False))
@click.argument("sources", nargs=-1, type=click.Path(exists=True, file_okay=False))
@click.option("--calibration", "calibration_id", default=None,
              help="Also take what the workers stored for this submitted calibration (`collect --submit`).")
def merge(out_dir, sources, calibration_id):
    """Merge calibration directories collected in parallel (same settings, e.g. one per
    machine on its own --skip-lines/--limit-prompts slice), and what workers stored for a
    submitted calibration, into OUT_DIR; label it afterwards.

    Example: semjobs probe merge cal/all cal/part1 cal/part2; semjobs probe merge cal/all --calibration ID"""
    import tempfile

    from semjobs.jobs.calibration import CalibrationError, export
    from semspec.calibration.store import merge_stores

    if not sources and calibration_id is None:
        raise click.UsageError("give calibration directories to merge, or --calibration ID")
    try:
        with tempfile.TemporaryDirectory(prefix="semjobs-cal-") as scratch:
            if calibration_id is not None:
                exported = export(calibration_id, scratch)
                click.echo(f"calibration {calibration_id}: {exported['questions_done']} of "
                           f"{exported['questions']} questions done, {exported['prefixes']} prefixes", err=True)
                sources = (*sources, scratch)
            stats = merge_stores(out_dir, list(sources))
    except (ValueError, FileNotFoundError, CalibrationError) as e:
        raise click.ClickException(str(e))
    click.echo(json.dumps(stats, indent=1))


@probe.command()
@click.argument("data_dir", type=click.Path(exists=True, file_okay=False))
@click.option("--judge", "judge_kind", type=click.Choice(["embed", "nli"]), default="embed", show_default=True,
              help="embed: all-MiniLM-L6-v2 cosine + numeric rule; nli: bidirectional entailment.")
@click.option("--judge-model", default=None,
              help="Judge model: a directory or a hub name, org/name[@revision] (required for nli; "
              "default for embed: the embedded MiniLM).")
@click.option("--threshold", type=float, default=None,
              help="Cosine threshold (embed) or entailment probability threshold (nli).")
@click.option("--numbers/--no-numbers", default=None,
              help="Apply the numeric-consistency rule (default: on for embed, off for nli).")
@click.option("--device", default="cpu", show_default=True)
def label(data_dir, judge_kind, judge_model, threshold, numbers, device):
    """Cluster each prefix's samples by meaning and label each with its cluster frequency.

    Example: semjobs probe label cal/smollm2"""
    from semspec.calibration.judge import make_judge
    from semspec.calibration.labels import label_directory

    try:
        judge = make_judge(judge_kind, judge_model, threshold, numbers, device)
    except ValueError as e:
        raise click.UsageError(str(e)) from e
    summary = label_directory(data_dir, judge, progress=True)
    click.echo(json.dumps({"judge": judge.describe(), **summary}, indent=1))


@probe.command()
@click.argument("data_dir", type=click.Path(exists=True, file_okay=False))
@click.option("--out", "out_dir", required=True, type=click.Path(file_okay=False),
              help="Probe directory: target.safetensors, draft.safetensors, report.json, calibration.png.")
@click.option("--holdout", default=0.2, show_default=True, help="Fraction of questions held out.")
@click.option("--seed", default=0, show_default=True)
@click.option("--lr", default=1e-3, show_default=True)
@click.option("--floor-quantile", type=click.FloatRange(0, 1, max_open=True), default=DEFAULT_FLOOR_QUANTILE,
              show_default=True,
              help="The floor on p_T stored with the probes (greedy semspec jobs apply it unless they set "
                   "--tau): this quantile of the target probe's p_T on the target's own held-out steps; 0: none.")
def train(data_dir, out_dir, holdout, seed, lr, floor_quantile):
    """Train one probe per model (split by question) and report held-out metrics.

    Example: semjobs probe train cal/smollm2 --out probes/smollm2"""
    from semspec.calibration.train import train_probes

    report = train_probes(data_dir, out_dir, holdout=holdout, seed=seed, lr=lr, floor_quantile=floor_quantile)
    fmt = lambda v: "n/a" if v is None else f"{v:.3f}"  # noqa: E731

    def line(name, m):
        return (f"{name} held-out n={m['n']}: MSE {fmt(m['mse'])} (constant {fmt(m['constant_mse'])}), "
                f"R² {fmt(m['r2'])}, Spearman {fmt(m['spearman'])}, AUROC(label≥0.5) {fmt(m['auroc_label_ge_0.5'])}")

    for role, s in report["probes"].items():
        click.echo(line(f"{role} probe, all steps", s["held_out"]))
        for sampler, m in s.get("held_out_by_sampler", {}).items():
            click.echo("  " + line(f"steps sampled by {sampler}:", m))
    ov = report["meaning_overlap"]
    click.echo(f"meaning overlap over {ov['prefixes']} prefixes, {ov['half_sample_size']} samples a side: draft-target "
               f"{fmt(ov['draft_target'])}, target-target {fmt(ov['target_self'])} (relative {fmt(ov['relative'])})")
    rule = report.get("acceptance_rule_held_out")
    if rule:
        click.echo(f"acceptance rule on {rule['n_draft_steps']} held-out draft steps (target-meaning frequency: "
                   f"all draft steps {fmt(rule['draft_target_frequency'])}, "
                   f"target's own steps {fmt(rule['target_own_frequency'])}):")
        for row in [*rule["by_tau"], *rule.get("by_ratio_floor", [])]:
            p, o = row["probes"], row["oracle"]
            floor = f"tau {row['tau']:g}" if "tau" in row else f"ratio floor {row['ratio_floor']:g}"
            click.echo(f"  {floor}: probes accept {fmt(p['acceptance'])}, kept frequency "
                       f"{fmt(p['kept_target_frequency'])}; labels (oracle) accept {fmt(o['acceptance'])}, "
                       f"kept frequency {fmt(o['kept_target_frequency'])}")
    floor = report["probes"].get("target", {}).get("floor")
    if floor:
        click.echo(f"floor on p_T stored with the probes: tau {floor['tau']:.3f} (the {floor['quantile']:g} quantile "
                   f"of p_T on the target's {floor['n_target_steps']} own held-out steps)")
    click.echo(f"probes, report.json and calibration.png in {out_dir}")


@probe.command("judge-eval")
@click.argument("pairs_file", type=click.Path(exists=True, dir_okay=False))
@click.option("--judge", "judge_kind", type=click.Choice(["embed", "nli"]), default="embed", show_default=True)
@click.option("--judge-model", default=None, help="A directory or a hub name, org/name[@revision].")
@click.option("--threshold", type=float, default=None)
@click.option("--numbers/--no-numbers", default=None)
@click.option("--show-errors", is_flag=True, help="Print the misjudged pairs.")
def judge_eval(pairs_file, judge_kind, judge_model, threshold, numbers, show_errors):
    """Accuracy, precision and recall of a judge on labelled pairs ({"a","b","equivalent"} JSONL).

    Example: semjobs probe judge-eval pairs.jsonl --judge embed"""
    from semspec.calibration.judge import evaluate_pairs, make_judge

    pairs = [json.loads(x) for x in open(pairs_file, encoding="utf-8") if x.strip()]
    try:
        judge = make_judge(judge_kind, judge_model, threshold, numbers)
    except ValueError as e:
        raise click.UsageError(str(e)) from e
    result = evaluate_pairs(judge, pairs)
    errors = result.pop("errors")
    click.echo(json.dumps({"judge": judge.describe(), **result}, indent=1))
    if show_errors:
        for e in errors:
            click.echo(f"gold={e['equivalent']} predicted={e['predicted']}: {e['a']!r} | {e['b']!r}")
