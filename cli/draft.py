"""`semjobs draft ...`: build the embedded draft model (see semspec.draft)."""

from __future__ import annotations

import time
from pathlib import Path

import click

from semspec.draft.config import DraftTrainConfig

_D = DraftTrainConfig()


@click.group()
def draft() -> None:
    """Build and inspect draft models for speculative decoding."""


@draft.command()
@click.option("--out", "out_dir", required=True, type=click.Path(file_okay=False), help="Artifact directory to write.")
@click.option("--seed", default=_D.seed, show_default=True, type=int)
@click.option("--layers", "frozen_layers", default=_D.frozen_layers, show_default=True, type=int,
              help="Target layers the draft shares (its first K layers).")
@click.option("--adapter-layers", default=_D.adapter_layers, show_default=True, type=int,
              help="Trained layers on top of the shared ones.")
@click.option("--adapter-init", default=None, help="Comma-separated target layer indices to initialise the adapter layers from (default: the last ones).")
@click.option("--target", "target_spec", default="embedded:smollm2-135m", show_default=True, help="Target model spec.")
@click.option("--data", default=_D.data, show_default=True, type=click.Path(exists=True, dir_okay=False),
              help="GSM8K-style JSONL with question/answer.")
@click.option("--holdout", default=_D.holdout, show_default=True, type=int, help="Leading lines never trained on (benchmark slice).")
@click.option("--gen-prompts", default=_D.gen_prompts, show_default=True, type=int, help="Questions answered greedily by the target.")
@click.option("--ref-prompts", default=_D.ref_prompts, show_default=True, type=int, help="Questions used with their reference solutions.")
@click.option("--max-new-tokens", default=_D.max_new_tokens, show_default=True, type=int)
@click.option("--draft-vocab", default=_D.draft_vocab, show_default=True, type=int,
              help="Tokens the draft predicts (the target's most used); 0 = the full vocabulary.")
@click.option("--steps", default=_D.steps, show_default=True, type=int)
@click.option("--batch-size", default=_D.batch_size, show_default=True, type=int)
@click.option("--lr", default=_D.lr, show_default=True, type=float)
@click.option("--threads", default=_D.threads, show_default=True, type=int, help="torch threads (results depend on it).")
@click.option("--cache-dir", default=str(Path.home() / ".cache" / "semjobs" / "draft-train"), show_default=True,
              help="Where the target's generated answers are cached ('' disables).")
@click.option("--data-only", is_flag=True, help="Only generate (and cache) the training answers.")
def train(out_dir, seed, frozen_layers, adapter_layers, adapter_init, target_spec, data, holdout, gen_prompts,
          ref_prompts, max_new_tokens, draft_vocab, steps, batch_size, lr, threads, cache_dir, data_only) -> None:
    """Distil a draft (the target's first K layers + trained adapter layers) and write its artifact."""
    import torch

    from semspec.draft.artifact import save_artifact
    from semspec.draft.train import build_training_data, train_draft
    from semspec.models import load_model

    torch.set_num_threads(threads)
    cfg = DraftTrainConfig(
        seed=seed, frozen_layers=frozen_layers, adapter_layers=adapter_layers,
        adapter_init=[int(x) for x in adapter_init.split(",")] if adapter_init else None,
        data=data, holdout=holdout, gen_prompts=gen_prompts, ref_prompts=ref_prompts,
        max_new_tokens=max_new_tokens, draft_vocab=draft_vocab, steps=steps, batch_size=batch_size, lr=lr,
        threads=threads,
    )
    t0 = time.perf_counter()

    def log(msg: str) -> None:
        click.echo(f"[{time.perf_counter() - t0:7.1f}s] {msg}", err=True)

    target = load_model(target_spec, device="cpu", dtype=torch.float32)
    log(f"target {target.identity}")
    if data_only:
        gen, ref = build_training_data(target.model, target.tokenizer, cfg, cache_dir=cache_dir or None, log=log)
        log(f"{len(gen)} generated + {len(ref)} reference sequences")
        return
    art = train_draft(target.model, target.tokenizer, cfg, cache_dir=cache_dir or None, log=log,
                      target_name=f"{target_spec} ({target.identity})")
    path = save_artifact(art, out_dir)
    tr = art.meta["training"]
    size = sum(f.stat().st_size for f in path.iterdir())
    click.echo(
        f"wrote {path} ({size / 1e6:.1f} MB): {art.frozen_layers} shared + {art.adapter_layers} trained layers; "
        f"eval top-1 agreement {tr['eval_before']['top1_agreement']:.3f} -> {tr['eval_after']['top1_agreement']:.3f}; "
        f"{tr['total_seconds'] / 60:.1f} min"
    )
