"""`semjobs draft ...`: build draft models -- the layer draft (semspec.draft) or a draft head (semspec.head)."""

from __future__ import annotations

import sys
import time
from pathlib import Path

import click

from semspec.draft.config import DraftTrainConfig, HeadTrainConfig

_D = DraftTrainConfig()


@click.group()
def draft() -> None:
    """Build and inspect draft models for speculative decoding."""


_H = HeadTrainConfig()
KINDS = ("layers", "eagle")


def _stop_after(stop_after: int | None, steps: int | None) -> int | None:
    """The head's last step: the recipe's stop on the recipe's schedule, the whole schedule
    of a ``--steps`` given without ``--stop-after``; 0 means the whole schedule."""
    if stop_after is None:
        return _H.stop_after if steps is None else None
    return stop_after or None


def _pick(value, default):
    return default if value is None else value


@draft.command()
@click.option("--kind", type=click.Choice(KINDS), default="layers", show_default=True,
              help="layers: the target's first K layers + trained layers (the embedded draft); "
                   "eagle: a head that drafts from the target's own states (semspec.head).")
@click.option("--out", "out_dir", required=True, type=click.Path(file_okay=False), help="Artifact directory to write.")
@click.option("--seed", default=0, show_default=True, type=int)
@click.option("--target", "target_spec", default="embedded:smollm2-135m", show_default=True, help="Target model spec.")
@click.option("--data", default=_D.data, show_default=True, type=click.Path(exists=True, dir_okay=False),
              help="GSM8K-style JSONL with question/answer.")
@click.option("--holdout", default=_D.holdout, show_default=True, type=int, help="Leading lines never trained on (benchmark slice).")
@click.option("--max-new-tokens", default=None, type=int,
              help=f"Tokens per target answer [layers: {_D.max_new_tokens}, eagle: {_H.max_new_tokens}].")
@click.option("--steps", default=None, type=int,
              help=f"Optimisation steps [layers: {_D.steps}]; eagle: the learning-rate schedule's length [{_H.steps}].")
@click.option("--stop-after", default=None, type=click.IntRange(0),
              help=f"eagle: end the run after this step of the schedule (0: at its end) [{_H.stop_after} with "
                   f"the default --steps, else 0].")
@click.option("--batch-size", default=None, type=int,
              help=f"Sequences per step [layers: {_D.batch_size}, eagle: {_H.batch_size}].")
@click.option("--lr", default=None, type=float, help=f"Peak learning rate [layers: {_D.lr}, eagle: {_H.lr}].")
@click.option("--threads", default=None, type=int,
              help=f"torch threads; results depend on it [layers: {_D.threads}, eagle: {_H.threads}].")
@click.option("--cache-dir", default=str(Path.home() / ".cache" / "semjobs" / "draft-train"), show_default=True,
              help="Where generated answers, teacher outputs and checkpoints are cached ('' disables).")
@click.option("--data-only", is_flag=True, help="Only decode (and cache) the target's answers.")
@click.option("--layers", "frozen_layers", default=_D.frozen_layers, show_default=True, type=int,
              help="layers: target layers the draft shares (its first K layers).")
@click.option("--adapter-layers", default=_D.adapter_layers, show_default=True, type=int,
              help="layers: trained layers on top of the shared ones.")
@click.option("--adapter-init", default=None,
              help="layers: comma-separated target layer indices to initialise the adapter layers from (default: the last ones).")
@click.option("--gen-prompts", default=_D.gen_prompts, show_default=True, type=int,
              help="layers: questions answered greedily by the target.")
@click.option("--ref-prompts", default=_D.ref_prompts, show_default=True, type=int,
              help="layers: questions after the answered ones used with their reference solutions.")
@click.option("--draft-vocab", default=_D.draft_vocab, show_default=True, type=int,
              help="layers: tokens the draft predicts (the target's most used); 0 = the full vocabulary.")
@click.option("--head-layers", default=_H.layers, show_default=True, type=int, help="eagle: decoder layers in the head.")
@click.option("--greedy-prompts", default=_H.greedy_prompts, show_default=True, type=int,
              help="eagle: questions the target answers greedily.")
@click.option("--sampled-prompts", default=None, type=click.IntRange(0),
              help="Questions the target answers at the bench's sampling (vLLM decodes them), --sampled-answers "
                   "times each (from the first: the greedy ones get more than one answer) "
                   f"[layers: {_D.sampled_prompts}, eagle: {_H.sampled_prompts}].")
@click.option("--sampled-answers", default=None, type=click.IntRange(1),
              help="Sampled answers per question (each with its own seed) "
                   f"[layers: {_D.sampled_answers}, eagle: {_H.sampled_answers}].")
@click.option("--reference-prompts", default=_H.reference_prompts, show_default=True, type=int,
              help="eagle: questions after the answered ones whose reference solutions are teacher-forced.")
@click.option("--reg-weight", default=_H.reg_weight, show_default=True, type=float,
              help="eagle: weight of the state regression beside the next-token loss.")
@click.option("--unroll", default=_H.unroll, show_default=True, type=click.IntRange(1, 16),
              help="eagle: passes per training step, each reading the last one's predictions (training-time test).")
def train(kind, out_dir, seed, target_spec, data, holdout, max_new_tokens, steps, stop_after, batch_size, lr, threads,
          cache_dir, data_only, frozen_layers, adapter_layers, adapter_init, gen_prompts, ref_prompts, draft_vocab,
          head_layers, greedy_prompts, sampled_prompts, sampled_answers, reference_prompts, reg_weight, unroll) -> None:
    """Distil a draft model from the target and write its artifact.

    \b
    Examples:
      semjobs draft train --out semspec/assets/draft             # the embedded layer draft
      semjobs draft train --kind eagle --out semspec/assets/head # the embedded draft head
    """
    t0 = time.perf_counter()

    def log(msg: str) -> None:
        click.echo(f"[{time.perf_counter() - t0:7.1f}s] {msg}", err=True)

    if kind == "eagle":
        cfg = HeadTrainConfig(
            seed=seed, data=data, holdout=holdout, greedy_prompts=greedy_prompts,
            sampled_prompts=_pick(sampled_prompts, _H.sampled_prompts),
            sampled_answers=_pick(sampled_answers, _H.sampled_answers), reference_prompts=reference_prompts,
            max_new_tokens=_pick(max_new_tokens, _H.max_new_tokens), layers=head_layers,
            steps=_pick(steps, _H.steps), stop_after=_stop_after(stop_after, steps),
            batch_size=_pick(batch_size, _H.batch_size), lr=_pick(lr, _H.lr), reg_weight=reg_weight, unroll=unroll,
            threads=_pick(threads, _H.threads),
        )
        return _train_head(cfg, out_dir, target_spec, cache_dir, data_only, log)
    if stop_after is not None:
        raise click.UsageError("--stop-after is for --kind eagle")
    cfg = DraftTrainConfig(
        seed=seed, frozen_layers=frozen_layers, adapter_layers=adapter_layers,
        adapter_init=[int(x) for x in adapter_init.split(",")] if adapter_init else None,
        data=data, holdout=holdout, gen_prompts=gen_prompts, ref_prompts=ref_prompts,
        sampled_prompts=_pick(sampled_prompts, _D.sampled_prompts),
        sampled_answers=_pick(sampled_answers, _D.sampled_answers),
        max_new_tokens=_pick(max_new_tokens, _D.max_new_tokens), draft_vocab=draft_vocab,
        steps=_pick(steps, _D.steps), batch_size=_pick(batch_size, _D.batch_size), lr=_pick(lr, _D.lr),
        threads=_pick(threads, _D.threads),
    )
    _train_layers(cfg, out_dir, target_spec, cache_dir, data_only, log)


@draft.command()
@click.argument("artifact", type=click.Path(exists=True, file_okay=False))
@click.option("--target", "target_spec", default="embedded:smollm2-135m", show_default=True,
              help="The target the draft was trained on (checked against the artifact).")
@click.option("--out", "out_dir", required=True, type=click.Path(file_okay=False),
              help="Model directory to write; it must not exist.")
def materialize(artifact, target_spec, out_dir) -> None:
    """Write a layer draft artifact as the model directory a --draft spec names.

    \b
    Example:
      semjobs draft train --out mydraft --sampled-prompts 384
      semjobs draft materialize mydraft --out mydraft-model
      semjobs probe collect ... --draft mydraft-model        # its probes, then: --draft mydraft-model --probes P
    """
    import torch

    from semspec.models.draft_artifact import DraftMismatchError, load_artifact, materialize_draft
    from semspec.models.loaded import load_model

    if Path(out_dir).exists():
        raise click.UsageError(f"{out_dir} exists: name a directory to create")
    try:
        load_artifact(artifact)  # a directory that is no layer draft fails before the target loads
    except (OSError, ValueError) as e:
        raise click.ClickException(f"{artifact} is not a layer draft artifact (semjobs draft train): {e}") from e
    target = load_model(target_spec, device="cpu", dtype=torch.float32)
    try:
        path = materialize_draft(target.model, target.tokenizer, artifact, out_dir)
    except DraftMismatchError as e:
        raise click.ClickException(f"{artifact} was not trained on {target_spec}: {e}") from e
    click.echo(f"wrote {path}: the draft of {artifact} on {target.identity}")


def _target_answers(cfg, target_spec, cache_dir, log) -> tuple[list, dict | None]:
    """The target's answers the layer draft learns from, and how they were decoded: by a vLLM
    engine that is shut down before the target loads for the teacher pass."""
    import gc

    import torch

    from semspec.draft.head_build import trace_engine
    from semspec.draft.train import target_answers

    if not cfg.answered_prompts:
        return [], None
    torch.set_num_threads(cfg.threads)  # vLLM decodes at the count it starts with
    engine = trace_engine(target_spec, cfg)
    try:
        how = {"engine": engine.identities["engine"], "dtype": engine.dtype, "threads": cfg.threads}
        return target_answers(engine, cfg, cache_dir or None, log), how
    finally:
        del engine
        gc.collect()


def _train_layers(cfg, out_dir, target_spec, cache_dir, data_only, log) -> None:
    import torch

    from semspec.models.draft_artifact import save_artifact
    from semspec.draft.train import train_draft
    from semspec.models.loaded import load_model

    answers, decoded = _target_answers(cfg, target_spec, cache_dir, log)
    if data_only:
        log(f"{len(answers)} answers ({sum(a.source == 'sampled' for a in answers)} sampled)")
        return
    torch.set_num_threads(cfg.threads)  # after vLLM, which decodes at its own count
    target = load_model(target_spec, device="cpu", dtype=torch.float32)
    log(f"target {target.identity}")
    art = train_draft(target.model, target.tokenizer, cfg, answers, cache_dir=cache_dir or None, log=log,
                      target_name=f"{target_spec} ({target.identity})", answers_from=decoded)
    path = save_artifact(art, out_dir)
    tr = art.meta["training"]
    size = sum(f.stat().st_size for f in path.iterdir())
    scores = "no held-out answers"
    if tr["eval_after"] is not None:
        scores = (f"held-out top-1 agreement {tr['eval_before']['top1_agreement']:.3f} -> "
                  f"{tr['eval_after']['top1_agreement']:.3f}")
    if "eval_after_sampled" in tr:
        scores += f" (greedy answers), {tr['eval_after_sampled']['top1_agreement']:.3f} (sampled answers)"
    click.echo(f"wrote {path} ({size / 1e6:.1f} MB): {art.frozen_layers} shared + {art.adapter_layers} trained "
               f"layers; {scores}; {tr['total_seconds'] / 60:.1f} min")


def _train_head(cfg, out_dir, target_spec, cache_dir, data_only, log) -> None:
    import torch
    from tqdm import tqdm

    from semspec.draft.head_build import build_head, trace_engine

    if data_only:
        from semspec.draft.head_data import build_traces

        torch.set_num_threads(cfg.threads)
        engine = trace_engine(target_spec, cfg)
        log(f"{len(build_traces(engine, cfg, cache_dir or None, log))} traces")
        return
    bar = tqdm(total=cfg.last_step, desc="training the head", unit="step", disable=None)

    def progress(step: int, info: dict) -> None:
        bar.n = step
        bar.set_postfix(loss=f"{info['cls']:.3f}", top1=f"{info['top1']:.2f}", refresh=False)
        bar.refresh()

    try:
        meta = build_head(cfg, out_dir, target_spec, cache_dir or None, log=lambda m: bar.write(m, file=sys.stderr),
                          progress=progress)
    finally:
        bar.close()
    ev, secs = meta["eval"], meta["training"]["seconds"]
    depth = ", ".join(f"{d}: {v:.3f}" for d, v in ev["top1_by_depth"].items() if v is not None)
    accepted = "n/a" if ev["mean_accepted"] is None else f"{ev['mean_accepted']:.2f}"
    size = sum(f.stat().st_size for f in Path(out_dir).iterdir())
    click.echo(f"wrote {out_dir} ({size / 1e6:.1f} MB): held-out top-1 agreement by depth {depth}; mean accepted "
               f"of {ev['accept_k']} drafted {accepted}; {secs['total'] / 60:.1f} min "
               f"(traces {secs['traces'] / 60:.1f}, states {secs['states'] / 60:.1f}, training {secs['train'] / 60:.1f})")
