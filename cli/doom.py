"""`semjobs doom ...`: the rule that stops doomed samples early (semspec.doom).

Thin: parse options, call `semjobs.jobs.doom_calibration`, print what the rule spares.
"""

from __future__ import annotations

from pathlib import Path

import click

from semjobs.cli.bench import DEFAULT_PROMPTS, MIXED_PROBLEMS
from semspec.doom import KINDS
from semspec.types import SAMPLING_TEMPERATURE, SAMPLING_TOP_P


@click.group()
def doom() -> None:
    """Stop samples early that will not end right: calibrate the rule for a target (once per target and domain)."""


@doom.command()
@click.option("--prompts", default=DEFAULT_PROMPTS, show_default="the shipped GSM8K test split",
              type=click.Path(exists=True, dir_okay=False),
              help="Problems with references: semjobs input lines or GSM8K lines (use the domain of your jobs).")
@click.option("--offset", default=100, show_default=True,
              help="Skip this many lines of --prompts (the shipped split's first 100 are the benchmarks').")
@click.option("--limit", default=128, show_default=True, help="Problems from --prompts.")
@click.option("--problems", type=MIXED_PROBLEMS, default=None,
              help="COUNT problems of mixed difficulty instead of --prompts: those of `semjobs bench --yield "
                   "--problems` with another seed and GSM8K lines 101-300, so none of the benchmark's.")
@click.option("--n", "samples", default=8, show_default=True, help="Samples per problem.")
@click.option("--recall", default=0.95, show_default=True, type=click.FloatRange(0, 1, min_open=True, max_open=True),
              help="The share of right samples the rule must never stop.")
@click.option("--temperature", default=SAMPLING_TEMPERATURE, show_default=True, help="As the jobs the rule serves.")
@click.option("--top-p", default=SAMPLING_TOP_P, show_default=True)
@click.option("--max-new-tokens", default=512, show_default=True, help="As the jobs the rule serves.")
@click.option("--seed", default=0, show_default=True)
@click.option("--batch-size", default=32, show_default=True, help="Samples decoded at once per engine process.")
@click.option("--kind", type=click.Choice(["any", *KINDS]), default="any", show_default=True,
              help="The kind of rule to choose: length (a cap: the only kind the step methods step_judge and "
                   "semspec apply, and it asks vLLM for no log-probabilities), logprob or confidence (the token "
                   "engine's methods, ar and token_sd, only), or any (the one that spares most).")
@click.option("--out", "out_path", required=True, type=click.Path(dir_okay=False),
              help="The rule's file; a worker reads it from SEMJOBS_DOOM_RULE.")
def calibrate(prompts, offset, limit, problems, samples, recall, temperature, top_p, max_new_tokens, seed,
              batch_size, kind, out_path) -> None:
    """Sample the settings' target on problems with references, and write the rule that stops
    the most tokens of wrong samples while sparing --recall of the right ones (with a margin
    for the calibration's own sampling error).

    Examples: semjobs doom calibrate --prompts my_problems.jsonl --limit 200 --out rule.json;
    semjobs doom calibrate --problems mixed:160 --out rule.json (the yield benchmark's kind of
    problems, none of its own)"""
    from semjobs.jobs import yield_problems
    from semjobs.jobs.doom_calibration import calibrate_rule
    from semspec.benchmark.runner import load_prompts

    try:
        chosen = (yield_problems.calibration_mixed(problems, DEFAULT_PROMPTS) if problems
                  else yield_problems.from_prompts(load_prompts(prompts, limit, offset)))
        rule = calibrate_rule(chosen, samples, recall, temperature, top_p, max_new_tokens, seed, batch_size,
                              KINDS if kind == "any" else (kind,))
    except ValueError as e:
        raise click.UsageError(str(e)) from e
    path = rule.save(out_path)
    c = rule.calibration
    if rule.caps_length:  # right samples of this domain are short: a cap is what spares most
        click.echo(f"rule: stop every sample still running at token {rule.min_tokens}")
    else:
        click.echo(f"rule: stop a sample from token {rule.min_tokens} on once its mean {rule.signal} over "
                   f"{rule.window} tokens is below {rule.threshold:.3f}")
    click.echo(f"on {c['samples']} samples of {c['problems']} problems ({c['right']} right): spares {c['spared_share'] * 100:.1f}% of their "
               f"tokens, stops {100 - c['recall'] * 100:.1f}% of the right ones (promised at most "
               f"{100 - rule.recall * 100:.1f}% on unseen problems)")
    for kind, f in c["candidates"].items():
        how = f"at token {f['min_tokens']}" if kind == "length" else \
            f"window {f['window']}, from token {f['min_tokens']}, below {f['threshold']}"
        click.echo(f"  best {kind} rule ({how}): spares {f['spared_share'] * 100:.1f}%, stops "
                   f"{100 - f['recall'] * 100:.1f}% of the right ones")
    click.echo(f"wrote {Path(path)}; give it to workers and `semjobs run` as SEMJOBS_DOOM_RULE={Path(path).resolve()}")
